"""Tensor parallelism on two GPUs of one host: TP=2 against the single-GPU plan, logits and step time,
beside polymorph/cost/parallel.py's prediction for both, in one run.

    python bench/tp_check.py --model llama-3.2-1b --batch 1 --ctx 1024 --out tp.json

Rank processes are started here (NCCL, one GPU each); rank 0 also runs the single-GPU plan on the same
weights and tokens first. Steps are whole decode steps timed on rank 0's host clock around a
device-wide sync, median of --steps: first launched one by one, then replayed from a CUDA graph (the
TP plan's all-reduces captured inside it); rank 0 writes its results after each phase, so a phase that
hangs leaves the ones before it.

Agreement: TP=2 sums its row-parallel partials in another order than one GPU, and over 16 bf16 layers
of random weights a few of 128k logits drift past the elementwise bf16 bound between any two correct
engines. So a step where TP=2 is not within the bf16 tolerance of the single-GPU plan is run on the
f32 numpy reference too, and agrees when TP=2 is no further from it than STOCK_SLACK times the
single-GPU plan is (`tolerance.no_worse`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK = r"""
import json, statistics, sys, time
import numpy as np
import torch
import torch.distributed as dist
from polymorph.pipeline.backend import registry
from polymorph.hardware.profile import load_profile
from polymorph.models import load_model
from polymorph.passes import bucket_bindings
from polymorph.serving.tensor_parallel import TensorParallel

rank, store, out, model_name, batch, ctx, steps = sys.argv[1:8]
rank, batch, ctx, steps = int(rank), int(batch), int(ctx), int(steps)
torch.cuda.set_device(rank)
from datetime import timedelta
# A collective that waits this long is aborted: a rank that failed must not leave the other hanging.
dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=180), device_id=torch.device("cuda", rank))
def say(*what):
    if rank == 0:
        print(f"[{time.perf_counter() - T0:6.1f} s]", *what, flush=True)
T0 = time.perf_counter()
model = load_model(model_name, dtype="bf16")
weights = model.weights()
bindings = bucket_bindings(model.graph, batch=batch, ctx=ctx)
blocks = int(bindings["cache_blocks"])
table = (1 + np.arange(batch * int(bindings["ctx_blocks"]), dtype=np.int32)).reshape(batch, -1)
rng = np.random.default_rng(0)
tokens = [rng.integers(0, model.config.vocab_size, (batch, 1), dtype=np.int32) for _ in range(steps)]
def inputs(i):
    return {"tokens": tokens[i], "positions": np.full((batch, 1), ctx - 1, np.int32), "block_table": table}
def timed(exe):
    exe.run(inputs(0)); torch.cuda.synchronize()
    times, logits = [], []
    for i in range(steps):
        t0 = time.perf_counter(); out = exe.run(inputs(i)); torch.cuda.synchronize()
        times.append(time.perf_counter() - t0); logits.append(out["logits"])
    return statistics.median(times), logits
backend = registry.get("cuda")
result = {}
def dump(phase):
    if rank == 0:  # whole or not at all: a run killed mid-write leaves the last phase's file
        import os
        with open(out + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(out + ".tmp", out)
        say(phase, {k: v for k, v in result.items() if k != "graph"})
if rank == 0:
    from polymorph.backends.gpu.runtime import GpuExecutable
    from polymorph.ir.dtypes import DType
    from polymorph.serving.session import ReferenceExecutable
    from polymorph.verify.tolerance import compare, model_tolerance, no_worse
    from polymorph.verify.numerics import STOCK_SLACK
    tol = model_tolerance(DType.BF16)
    single = GpuExecutable(backend, backend.lower(model.graph, load_profile("h200"), bindings), weights)
    single.allocate_state(blocks)
    single.capture = False
    result["single_s"], want = timed(single)
    say("single GPU, launched one by one:", result["single_s"])
    single.capture = True
    result["single_graph_s"], _ = timed(single)
    say("single GPU, graph replay:", result["single_graph_s"])
    del single
    torch.cuda.empty_cache()
    truth, refs = {}, []
    def reference(i):  # each step writes the same slot of a zeroed cache: steps are independent
        if not refs:  # built at first need, after the timings (rank 1 waits in a collective meanwhile)
            refs.append(ReferenceExecutable(model.graph, weights))
        if i not in truth:
            refs[0].allocate_state(blocks)
            truth[i] = refs[0].run(inputs(i))["logits"]
        return truth[i]
    def agreement(got):
        direct = [compare(g, w, tol) for g, w in zip(got, want)]
        beside = {i: (compare(got[i], reference(i), tol), compare(want[i], reference(i), tol))
                  for i, d in enumerate(direct) if not d.ok}
        return {"agree": all(tp_c.ok or no_worse(tp_c, one_c, STOCK_SLACK) for tp_c, one_c in beside.values()),
                "max_abs": max(d.max_abs for d in direct), "steps": len(direct),
                "steps_out_of_tolerance": len(beside),
                "there_vs_reference": {i: {"tp2": str(a), "single": str(b)} for i, (a, b) in beside.items()}}
dist.barrier()
tp = TensorParallel(backend, model.graph, model.config, weights, load_profile("h200"), bindings)
tp.allocate_state(blocks)
result["tp2_s"], got = timed(tp)
if rank == 0:
    result.update(agreement(got))
dump("TP=2 launched one by one")
tp.exe.capture = True
result["tp2_graph_s"], got = timed(tp)
if rank == 0:
    result["graph"] = agreement(got)
dump("TP=2 graph replay")
dist.destroy_process_group()
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="tp.json")
    p.add_argument("--timeout", type=float, default=400, help="seconds for the whole check, from its start")
    p.add_argument("--calibration", type=Path, default=None,
                   help="calibration directory for the prediction (default: hwprofiles/measured)")  # fmt: skip
    args = p.parse_args()
    t_start = time.perf_counter()
    from polymorph.cost.parallel import plan_parallel

    predicted = plan_parallel(args.model, 2, backend="cuda", target="h200", batch=args.batch, ctx=args.ctx,
                              calibration_dir=args.calibration)  # fmt: skip
    options = {o.tp: o.step_s for o in predicted.options if o.ep == 1}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out).with_suffix(".partial.json")
        out.unlink(missing_ok=True)  # never an earlier run's results
        argv = [
            str(Path(tmp) / "store"),
            str(out),
            args.model,
            str(args.batch),
            str(args.ctx),
            str(args.steps),
        ]
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), *argv], env={**os.environ})
                 for r in range(2)]  # fmt: skip
        t0 = time.perf_counter()
        try:
            codes = [p.wait(timeout=max(1.0, args.timeout - (time.perf_counter() - t_start))) for p in procs]
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
            codes = ["timeout"]
        measured = json.loads(out.read_text()) if out.exists() else {}
    result = {**measured, "predicted_single_s": options.get(1), "predicted_tp2_s": options.get(2),
              "wall_s": time.perf_counter() - t0, "model": args.model, "batch": args.batch, "ctx": args.ctx,
              "rank_exit": codes}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    ms = lambda k: f"{measured[k] * 1e3:.3f} ms" if k in measured else "not measured"  # noqa: E731
    print(
        f"{args.model} decode, batch {args.batch}, ctx {args.ctx}; predicted: single GPU "
        f"{options.get(1, float('nan')) * 1e3:.3f} ms, TP=2 {options.get(2, float('nan')) * 1e3:.3f} ms"
    )
    print(
        f"  launched one by one: single GPU {ms('single_s')}, TP=2 {ms('tp2_s')}; "
        f"agree {measured.get('agree')} (max abs {measured.get('max_abs', float('nan')):.3g}, "
        f"{measured.get('steps_out_of_tolerance')} steps judged beside the reference)"
    )
    graph = measured.get("graph", {})
    print(
        f"  CUDA graph replay: single GPU {ms('single_graph_s')}, TP=2 {ms('tp2_graph_s')}; "
        f"agree {graph.get('agree')} (max abs {graph.get('max_abs', float('nan')):.3g})"
    )
    if any(codes):
        print(f"rank processes exited {codes}", file=sys.stderr)
        return 1
    return 0 if measured.get("agree") and graph.get("agree") else 1


if __name__ == "__main__":
    sys.exit(main())
