"""Tensor parallelism on two GPUs of one host: TP=2 against the single-GPU plan, logits and step time,
beside polymorph/parallel.py's prediction for both, in one run.

    python bench/tp_check.py --model llama-3.2-1b --batch 1 --ctx 1024 --out tp.json

Rank processes are started here (NCCL, one GPU each); rank 0 also runs the single-GPU plan on the same
weights and tokens first. Steps are whole decode steps without graph capture (the TP plan's all-reduces
are not captured), timed on rank 0's host clock around a device-wide sync, median of --steps.
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
from polymorph.backend import registry
from polymorph.hw import load_profile
from polymorph.models import load_model
from polymorph.passes import bucket_bindings
from polymorph.tensor_parallel import TensorParallel

rank, store, out, model_name, batch, ctx, steps = sys.argv[1:8]
rank, batch, ctx, steps = int(rank), int(batch), int(ctx), int(steps)
torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
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
if rank == 0:
    from polymorph.backends.gpu.runtime import GpuExecutable
    single = GpuExecutable(backend, backend.lower(model.graph, load_profile("h200"), bindings), weights)
    single.capture = False
    single.allocate_state(blocks)
    result["single_s"], want = timed(single)
    del single
    torch.cuda.empty_cache()
dist.barrier()
tp = TensorParallel(backend, model.graph, model.config, weights, load_profile("h200"), bindings)
tp.allocate_state(blocks)
result["tp2_s"], got = timed(tp)
if rank == 0:
    from polymorph.ir.dtypes import DType
    from polymorph.tolerance import compare, model_tolerance
    checks = [compare(g, w, model_tolerance(DType.BF16)) for g, w in zip(got, want)]
    result["agree"] = all(c.ok for c in checks)
    result["max_abs"] = max(c.max_abs for c in checks)
    json.dump(result, open(out, "w"))
dist.destroy_process_group()
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", default="tp.json")
    args = p.parse_args()
    from polymorph.parallel import plan_parallel

    predicted = plan_parallel(args.model, 2, backend="cuda", target="h200", batch=args.batch, ctx=args.ctx)
    options = {o.tp: o.step_s for o in predicted.options if o.ep == 1}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
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
        codes = [p.wait(timeout=540) for p in procs]
        if any(codes):
            print(f"rank processes exited {codes}", file=sys.stderr)
            return 1
        measured = json.loads(out.read_text())
    result = {**measured, "predicted_single_s": options.get(1), "predicted_tp2_s": options.get(2),
              "wall_s": time.perf_counter() - t0, "model": args.model, "batch": args.batch, "ctx": args.ctx}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{args.model} decode, batch {args.batch}, ctx {args.ctx}, no graph capture: single GPU "
          f"{measured['single_s'] * 1e3:.3f} ms (predicted {options.get(1, float('nan')) * 1e3:.3f}), TP=2 "
          f"{measured['tp2_s'] * 1e3:.3f} ms (predicted {options.get(2, float('nan')) * 1e3:.3f}); logits agree: "
          f"{measured['agree']} (max abs {measured['max_abs']:.3g})")  # fmt: skip
    return 0 if measured["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
