"""The cost model's validation on one GPU: predicted against measured time for every kernel of the
Llama-3.2-1B decode plan and for the whole step, at each batch given.

    python -m polymorph.cli microbench --backend cuda --target h200 --out CALIB   # the suite first
    python bench/costmodel_check.py --calibration CALIB --batch 1 32 --out check.json

Two predictions per kernel: from the microbenchmark calibration alone (the suite never runs the plan's
kernels), and after refinement with measured passes, fitted on layers 0-7 and the groups outside the
layers and judged on layers 8-15 only, so no refined figure is scored against the times it was fitted
on. Per-kernel times come from GpuExecutable.time_groups (graph replay, operands cold in L2); the step
is the captured decode graph replayed, one event pair per step, fresh tokens each step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import PolymorphRunner, random_weights, timed_steps

from polymorph.backends.gpu.backend import launch_counts
from polymorph.cost.model import predict
from polymorph.hardware.profile import load_profile
from polymorph.models import load_model

FIT_LAYERS = range(8)  # refinement is fitted on these layers' groups (and those outside the layers)


def _layer(group: str) -> int | None:
    parts = group.split(".")
    return int(parts[1]) if parts[0] == "layers" and parts[1].isdigit() else None


def check_point(model, weights, batch: int, ctx: int, profile, steps: int) -> dict:
    ours = PolymorphRunner(model, weights, batch, ctx)
    pos = ctx - 1
    vocab = model.config.vocab_size
    inputs = {"tokens": torch.randint(0, vocab, (batch, 1), device="cuda", dtype=torch.int32),
              "positions": torch.full((batch, 1), pos, dtype=torch.int32, device="cuda"),
              "block_table": ours.block_table}  # fmt: skip
    measured = {g.id: s for g, s, _, _ in ours.exe.time_groups(inputs)}
    step_s = timed_steps(
        lambda t: ours.step(t, pos),
        lambda: torch.randint(0, vocab, (batch, 1), device="cuda", dtype=torch.int32),
        steps,
    )
    plan = ours.plan
    base = predict(plan, profile, launches=launch_counts(plan))  # a split attention launches two kernels
    fit = {g: s for g, s in measured.items() if _layer(g) is None or _layer(g) in FIT_LAYERS}
    refined = base.refine(fit)
    rows = []
    for k in base.kernels:
        if k.group not in measured:  # a view (no launch in a step): nothing to compare
            continue
        r = refined.row(k.group)
        held_out = _layer(k.group) is not None and _layer(k.group) not in FIT_LAYERS
        rows.append({"group": k.group, "pattern": k.pattern, "measured_s": measured[k.group],
                     "predicted_s": k.predicted_s, "bound": k.bound,
                     "error": k.predicted_s / measured[k.group] - 1,
                     "refined_s": r.predicted_s if held_out else None,
                     "refined_error": r.predicted_s / measured[k.group] - 1 if held_out else None})  # fmt: skip
    launched = [k.predicted_s for k in base.kernels if k.group in measured]
    return {
        "batch": batch, "ctx": ctx, "basis": base.basis, "kernels": rows,
        "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
        "median_abs_error_refined_held_out": statistics.median(
            abs(r["refined_error"]) for r in rows if r["refined_error"] is not None
        ),
        "step_measured_s": step_s, "step_predicted_s": sum(launched),
        "step_error": sum(launched) / step_s - 1,
        "kernel_sum_measured_s": sum(measured.values()),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--profile", default="h200")
    p.add_argument(
        "--calibration", type=Path, help="calibration directory (microbench output); none: vendor figures"
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default="costmodel-check.json")
    args = p.parse_args()
    profile = load_profile(args.profile, args.calibration)
    model = load_model(args.model, dtype="bf16")
    weights = random_weights(model.graph, seed=0)
    results = [check_point(model, weights, b, args.ctx, profile, args.steps) for b in args.batch]
    Path(args.out).write_text(json.dumps(results, indent=1))
    for r in results:
        print(f"\nbatch {r['batch']}, ctx {r['ctx']} ({r['basis']})")
        print(f"  {'group':<52}{'measured':>10}{'predicted':>11}{'error':>8}{'refined':>10}")
        for k in r["kernels"]:
            refined = f"{k['refined_error']:+.0%}" if k["refined_error"] is not None else "fit"
            print(f"  {k['group'][:50]:<52}{k['measured_s'] * 1e6:8.1f}us{k['predicted_s'] * 1e6:9.1f}us"
                  f"{k['error']:+8.0%}{refined:>10}")  # fmt: skip
        print(f"  median |error| per kernel: {r['median_abs_error']:.1%} from calibration alone, "
              f"{r['median_abs_error_refined_held_out']:.1%} refined (layers 8-15, not fitted on)")  # fmt: skip
        print(f"  step: measured {r['step_measured_s'] * 1e3:.3f} ms, predicted {r['step_predicted_s'] * 1e3:.3f} ms "
              f"({r['step_error']:+.1%}); kernels alone sum to {r['kernel_sum_measured_s'] * 1e3:.3f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
