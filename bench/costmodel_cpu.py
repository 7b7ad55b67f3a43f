"""The cost model on the cpu backend: llama-tiny's predicted decode step beside its measured one.

    python bench/costmodel_cpu.py --out costmodel-cpu.json

Calibrates the host first (`polymorph microbench --backend cpu` into a temporary directory), predicts
the plan at batch 1, ctx 1024 from that calibration alone, then measures in one engine: whole steps
(slow tier) and each group alone (fast tier). Refinement is fitted on every group but layer 1's and
judged on layer 1, as on the GPU (bench/costmodel_check.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from polymorph import api
from polymorph.backends.cpu.microbench import run_suite, write_calibration
from polymorph.costmodel import predict
from polymorph.engine.controller import Controller
from polymorph.hw import load_profile
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
        base = predict(plan, profile)
        with knobs.scope(calibration_dir=calib):
            engine = Controller.start(args.model, "cpu", batch=1, ctx=args.ctx)
            try:
                slow = engine.measure("slow", args.trials)
                fast = engine.measure("fast", args.trials)
            finally:
                engine.close()
    groups = {g: t["median_s"] for g, t in fast["groups"].items()}
    held = [g for g in groups if g.startswith("layers.1.")]
    refined = base.refine({g: s for g, s in groups.items() if g not in held})
    errors = [base.row(g).predicted_s / s - 1 for g, s in groups.items()]
    held_errors = [refined.row(g).predicted_s / groups[g] - 1 for g in held]
    result = {
        "model": args.model, "ctx": args.ctx, "basis": base.basis,
        "step_predicted_s": base.step_s, "step_measured_s": slow["median_s"],
        "kernels_predicted_s": base.step_s - base.step_overhead_s, "kernels_measured_s": sum(groups.values()),
        "median_abs_kernel_error": statistics.median(abs(e) for e in errors),
        "median_abs_kernel_error_refined_held_out": statistics.median(abs(e) for e in held_errors),
        "refined_step_s": refined.step_s,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{args.model} decode step, batch 1, ctx {args.ctx}, cpu ({base.basis})")
    print(f"  predicted from calibration alone: {base.step_s * 1e6:.0f} us "
          f"(kernels {result['kernels_predicted_s'] * 1e6:.0f} us + step overhead {base.step_overhead_s * 1e6:.0f} us)")  # fmt: skip
    print(f"  measured: whole step {slow['median_s'] * 1e6:.0f} us (median of {args.trials}); "
          f"groups alone sum to {result['kernels_measured_s'] * 1e6:.0f} us")  # fmt: skip
    print(f"  median |error| per kernel: {result['median_abs_kernel_error']:.0%} from calibration alone, "
          f"{result['median_abs_kernel_error_refined_held_out']:.0%} refined (layer 1, not fitted on); "
          f"refined step {refined.step_s * 1e6:.0f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
