"""Predicted decode step times from `polymorph compile`'s report, on chips polymorph has no measurement
of (issue 7's validation report: MI355X, MI300X, B200, trn2 beside the calibrated H200) and for the
zoo's MoE models (issue 13), each beside the measured point BENCHMARKS.md has for it, where it has one.
The cost model runs on each profile with its calibration where one exists (hwprofiles/measured/), else
on vendor figures at efficiency 1 and the profile's launch figure; the roofline floor is beside it.

    python bench/predict_chips.py --batch 1 32 --ctx 1024 --dtype bf16 --out predictions.json
    python bench/predict_chips.py --moe --out moe-predictions.json   # the zoo's MoE models

Needs no device: the GPU plans compile to device code here (Triton AOT), so the prediction reads each
kernel's compiled resources (launches, occupancy); the neuron plan lowers to HLO. A measured point is
a figure of BENCHMARKS.md with its date, not something this script measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from polymorph import api
from polymorph.errors import UserError
from polymorph.hardware.profile import load_profile
from polymorph.knobs import knobs
from polymorph.models import load_model
from polymorph.models.zoo import Model

CHIPS = (("cuda", "h200"), ("cuda", "b200"), ("rocm", "mi300x"), ("rocm", "mi355x"), ("neuron", "trn2"))
BACKEND_OF = {chip: backend for backend, chip in CHIPS}

# (model, layers or None for all, chip, batch, ctx) -> (tokens/s, where BENCHMARKS.md has it). Decode
# steps measured with one CUDA-event pair per step, median of 100, the step captured in a CUDA graph.
MEASURED: dict[tuple[str, int | None, str, int, int], tuple[float, str]] = {
    ("mixtral-8x7b", 4, "h200", 1, 1024): (903, "Mixtral-style MoE, 4 of 32 layers, 2026-11-30 at f9e14b8"),
    ("mixtral-8x7b", 4, "h200", 32, 1024): (8240, "Mixtral-style MoE, 4 of 32 layers, 2026-11-30 at f9e14b8"),
    ("llama-3.2-1b", None, "h200", 1, 1024): (959, "Llama-3.2-1B decode on one H200, 2026-11-30"),
    ("llama-3.2-1b", None, "h200", 8, 1024): (5258, "Llama-3.2-1B decode on one H200, 2026-11-30"),
    ("llama-3.2-1b", None, "h200", 32, 1024): (18979, "Llama-3.2-1B decode on one H200, 2026-11-30"),
    ("llama-3.2-1b", None, "h200", 64, 1024): (31556, "Llama-3.2-1B decode on one H200, 2026-11-30"),
}

# The zoo's full-size MoE models, and the 4-layer Mixtral that BENCHMARKS.md measured.
MOE_MODELS: tuple[tuple[str, int | None], ...] = (
    ("mixtral-8x7b", 4),
    ("mixtral-8x7b", None),
    ("qwen3-30b-a3b", None),
)


def model_with_layers(name: str, dtype: str, layers: int | None) -> Model:
    """The zoo model, or the same model with its first `layers` layers (as bench/decode.py --layers)."""
    model = load_model(name, dtype=dtype)
    if layers is None:
        return model
    assert model.config is not None
    cfg = dataclasses.replace(model.config, num_hidden_layers=layers)
    return Model(name=f"{name}-{layers}l", graph=model.rebuild(num_layers=layers), source=name, config=cfg)


def predict_point(model: Model, backend: str, chip: str, batch: int, ctx: int) -> dict:
    t0 = time.perf_counter()
    report = api.compile(model, backend, chip, batch=batch, ctx=ctx).report
    floor = sum(k.floor_s or 0.0 for k in report.kernels)
    moe = [k for k in report.kernels if "moe.experts" in k.group]
    occupancy = [k.resources["occupancy"] for k in report.kernels if k.resources.get("occupancy") is not None]
    return {
        "predicted_step_s": report.predicted_step_s, "roofline_floor_s": floor,
        "kernels": len(report.kernels), "basis": report.prediction,
        "experts_s": sum(k.predicted_s or 0.0 for k in moe) or None,
        "experts_note": moe[0].note if moe else None,
        "min_occupancy": min(occupancy) if occupancy else None,
        "compile_s": time.perf_counter() - t0,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int, help="the model's first N layers only (as bench/decode.py --layers)")
    p.add_argument(
        "--moe", action="store_true", help="the zoo's MoE models (and the measured 4-layer Mixtral)"
    )
    p.add_argument("--chips", nargs="+", help=f"profile ids (default: {' '.join(c for _, c in CHIPS)})")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    chips = args.chips or [c for _, c in CHIPS]
    unknown = [c for c in chips if c not in BACKEND_OF]
    if unknown:
        p.error(f"unknown chip {', '.join(unknown)}; choose from {', '.join(BACKEND_OF)}")
    models = MOE_MODELS if args.moe else ((args.model, args.layers),)
    rows = []
    for name, layers in models:
        model = model_with_layers(name, args.dtype, layers)
        for chip in chips:
            calibrated = load_profile(chip, knobs.calibration_dir).calibration is not None
            for batch in args.batch:
                row = {"model": name, "layers": layers, "chip": chip, "batch": batch, "ctx": args.ctx,
                       "dtype": args.dtype, "calibrated": calibrated}  # fmt: skip
                try:
                    row.update(predict_point(model, BACKEND_OF[chip], chip, batch, args.ctx))
                except UserError as e:
                    row["error"] = str(e)
                    print(f"{model.name:18} {chip:7} b{batch:<3} no prediction: {e}", flush=True)
                    rows.append(row)
                    continue
                measured = MEASURED.get((name, layers, chip, batch, args.ctx))
                if measured is not None and args.dtype == "bf16":
                    tok_s, where = measured
                    row.update(measured_step_s=batch / tok_s, measured_tok_s=tok_s, measured_where=where)
                    row["error_vs_measured"] = row["predicted_step_s"] / row["measured_step_s"] - 1
                rows.append(row)
                vs = (
                    f", measured {row['measured_step_s'] * 1e3:.3f} ms ({row['error_vs_measured']:+.0%}; "
                    f"BENCHMARKS.md: {row['measured_where']})"
                    if "measured_step_s" in row
                    else ", no measured point"
                )
                experts = (
                    f"; experts {row['experts_s'] * 1e3:.3f} ms ({row['experts_note']})"
                    if row["experts_s"]
                    else ""
                )
                print(f"{model.name:18} {chip:7} b{batch:<3} predicted {row['predicted_step_s'] * 1e3:8.3f} ms, "
                      f"roofline floor {row['roofline_floor_s'] * 1e3:7.3f} ms{vs}, "
                      f"{'calibrated' if calibrated else 'UNCALIBRATED'}{experts}", flush=True)  # fmt: skip
    if rows:
        print(f"\nbasis of the last row: {rows[-1].get('basis', rows[-1].get('error'))}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
