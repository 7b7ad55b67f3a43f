"""The cost model on the cpu backend: llama-tiny's predicted decode step beside its measured one.

    python bench/costmodel_cpu.py --out costmodel-cpu.json

Calibrates the host first (`polymorph microbench --backend cpu` into a temporary directory), predicts
the plan at batch 1, ctx 1024 from that calibration alone, then measures: whole steps in an engine (slow
tier), each group alone (fast tier), and each group inside whole steps of an executable of its own
(CpuExecutable.time_in_step: the per-kernel truth here, since a host-bound kernel timed alone in a loop
runs hotter than where it runs). Two calibration-only predictions are reported: with one host op per
kernel, and with the torch ops each kernel dispatches, counted in one untimed step
(CpuExecutable.host_ops) and charged at the calibration's `op_overhead`. Refinement is fitted on every
group but layer 1's and judged on layer 1, as on the GPU (bench/costmodel_check.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from polymorph import api
from polymorph.backends.cpu.microbench import run_suite, write_calibration
from polymorph.cost.model import predict
from polymorph.engine.controller import Controller
from polymorph.hardware.profile import load_profile
from polymorph.knobs import knobs


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-tiny")
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--out", default="costmodel-cpu.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="polymorph-calib-") as calib:
        write_calibration(Path(calib), run_suite(threads=1))
        profile = load_profile("cpu", Path(calib))
        plan = api.lower(args.model, "cpu", "cpu", batch=1, ctx=args.ctx).plan
        exe, inputs = decode_step(args.model, args.ctx)
        ops = exe.host_ops(inputs())
        plain, base = predict(plan, profile), predict(plan, profile, host_ops=ops)
        in_step, step_s = exe.time_in_step(inputs, args.trials)  # each group where it runs, and whole steps
        with knobs.scope(calibration_dir=calib):
            engine = Controller.start(args.model, "cpu", batch=1, ctx=args.ctx)
            try:
                slow = engine.measure("slow", args.trials)
                fast = engine.measure("fast", args.trials)
            finally:
                engine.close()
    alone = {g: t["median_s"] for g, t in fast["groups"].items()}
    held = [g for g in in_step if g.startswith("layers.1.")]
    refined = base.refine({g: t for g, t in in_step.items() if g not in held})

    def median_error(pred: Any, truth: dict[str, float], groups: list[str] | None = None) -> float:
        return statistics.median(abs(pred.row(g).predicted_s / truth[g] - 1) for g in groups or list(truth))

    result = {
        "model": args.model, "ctx": args.ctx, "basis": base.basis, "trials": args.trials,
        "step_measured_s": step_s, "step_measured_engine_s": slow["median_s"],
        "step_predicted_s": base.step_s, "step_predicted_one_op_per_kernel_s": plain.step_s,
        "groups_in_step_sum_s": sum(in_step.values()), "groups_alone_sum_s": sum(alone.values()),
        "median_abs_kernel_error": median_error(base, in_step),
        "median_abs_kernel_error_one_op_per_kernel": median_error(plain, in_step),
        "median_abs_kernel_error_against_fast_tier": median_error(base, alone),
        "median_abs_kernel_error_refined_held_out": median_error(refined, in_step, held),
        "refined_step_s": refined.step_s,
        "host_ops": ops,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    us = 1e6
    print(f"{args.model} decode step, batch 1, ctx {args.ctx}, cpu ({base.basis})")
    print(f"  measured: whole step {step_s * us:.0f} us (median of {args.trials}; {slow['median_s'] * us:.0f} us in "
          f"the engine's slow tier); groups inside steps sum to {result['groups_in_step_sum_s'] * us:.0f} us, "
          f"alone (fast tier) to {result['groups_alone_sum_s'] * us:.0f} us")  # fmt: skip
    for label, pred, key in (("one host op per kernel", plain, "median_abs_kernel_error_one_op_per_kernel"),
                             (f"{sum(ops.values())} counted host ops", base, "median_abs_kernel_error")):  # fmt: skip
        print(
            f"  predicted from calibration alone, {label}: step {pred.step_s * us:.0f} us "
            f"({pred.step_s / step_s - 1:+.0%}); median |error| per kernel {result[key]:.0%} (in step)"
        )
    print(
        f"  refined on measured passes (fitted on all but layer 1, judged on layer 1): median |error| "
        f"{result['median_abs_kernel_error_refined_held_out']:.0%}; step {refined.step_s * us:.0f} us"
    )
    return 0


def decode_step(model: str, ctx: int) -> tuple[Any, Callable[[], dict[str, np.ndarray]]]:
    """A cpu executable of its own and fresh inputs of one decode step at `ctx` (tokens vary per call)."""
    from polymorph.models import load_model
    from polymorph.pipeline.backend import registry
    from polymorph.serving.kvcache import PagedKVCache

    m = load_model(model)
    exe = registry.get("cpu").load(api.compile(m, "cpu", "cpu", batch=1, ctx=ctx), m.weights())
    cache = PagedKVCache.for_batch(1, ctx, int(m.graph.meta["block_size"]))
    exe.allocate_state(cache.cache_blocks)
    positions, table = cache.decode_step(1, ctx)
    vocab = int(m.graph.params["model.embed_tokens.weight"].shape[0])
    rng = np.random.default_rng()
    return exe, lambda: {"tokens": rng.integers(0, vocab, (1, 1), dtype=np.int32), "positions": positions,
                         "block_table": table}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
