"""Predicted Llama-3.2-1B decode step times on chips polymorph has no measurement of (issue 7's
validation report: MI355X, MI300X, B200, trn2 beside the calibrated H200), from `polymorph compile`'s
report: the cost model on each profile, uncalibrated where no calibration file exists (vendor
figures at efficiency 1 and an assumed launch overhead), with the roofline floor beside it.

    python bench/predict_chips.py --batch 1 32 --ctx 1024 --dtype bf16 --out predictions.json

Needs no device: the GPU plans compile to device code here (Triton AOT), the neuron plan to HLO.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from polymorph import api
from polymorph.hardware.profile import load_profile
from polymorph.knobs import knobs
from polymorph.models import load_model

CHIPS = (("cuda", "h200"), ("cuda", "b200"), ("rocm", "mi300x"), ("rocm", "mi355x"), ("neuron", "trn2"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = []
    model = load_model(args.model, dtype=args.dtype)
    for backend, chip in CHIPS:
        profile = load_profile(chip, knobs.calibration_dir)
        for batch in args.batch:
            t0 = time.perf_counter()
            report = api.compile(model, backend, chip, batch=batch, ctx=args.ctx).report
            floor = sum(k.floor_s or 0.0 for k in report.kernels)
            rows.append({
                "backend": backend, "chip": chip, "batch": batch, "ctx": args.ctx, "dtype": args.dtype,
                "predicted_step_s": report.predicted_step_s, "roofline_floor_s": floor,
                "kernels": len(report.kernels), "basis": report.prediction,
                "calibrated": profile.calibration is not None, "compile_s": time.perf_counter() - t0,
            })  # fmt: skip
            r = rows[-1]
            print(f"{chip:7} b{batch:<3} predicted {r['predicted_step_s'] * 1e3:7.3f} ms, roofline floor "
                  f"{floor * 1e3:6.3f} ms, {'calibrated' if r['calibrated'] else 'UNCALIBRATED'} "
                  f"({r['kernels']} kernels; {r['basis']})", flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
