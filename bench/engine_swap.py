"""Cold start against hot swap of the persistent engine, in one run, on whatever backend is given.

    python bench/engine_swap.py --model llama-tiny --backend cpu --candidates 10 --out swap.json
    python bench/engine_swap.py --model llama-3.2-1b --backend cuda --target h200 --dtype bf16 \\
        --group layers.0.mlp.down+residual --kernel triton/linear_residual.py --out swap.json

Cold start: a fresh Python process that starts an engine on a local safetensors checkpoint of the
model (written once here, random weights) and times its first whole decode step; run twice and the
second counts, so the compiler caches are warm as the issue defines it. Hot swap: in one engine that
stays up, `--candidates` new kernel files for one group (the library kernel with a distinct comment,
so each is a file the engine has never seen and Triton compiles afresh), each through
Controller.try_candidate: swap, every gate, and the fast-tier timing. Reports medians, the ratio, and
candidates per minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polymorph.engine.controller import Controller
from polymorph.models import load_model
from polymorph.models.checkpoint import save_checkpoint
from polymorph.pipeline.kernel_files import kernels_root

COLD = """
import sys, time
t0 = time.perf_counter()
from polymorph.engine.controller import Controller
e = Controller.start(sys.argv[1], sys.argv[2], sys.argv[3] or None, batch=1, ctx=int(sys.argv[4]),
                     dtype=sys.argv[5], budget_s=600)
m = e.measure("slow", 1)
print(time.perf_counter() - t0, m["median_s"])
e.close()
"""


def checkpoint(model: str, dtype: str, folder: Path) -> Path:
    from importlib import resources

    m = load_model(model, dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    with resources.as_file(resources.files("polymorph.models") / "configs" / f"{model}.json") as config:
        shutil.copy(config, folder / "config.json")
    save_checkpoint(folder, m.weights())
    return folder


def cold_start(model_dir: Path, args: argparse.Namespace) -> float:
    cmd = [
        sys.executable,
        "-c",
        COLD,
        str(model_dir),
        args.backend,
        args.target or "",
        str(args.ctx),
        args.dtype,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    inside, _ = done.stdout.split()
    print(f"  cold start: {wall:.2f} s wall ({float(inside):.2f} s inside the process)", flush=True)
    return wall


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-tiny")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--target")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--group", default="lm_head")
    p.add_argument("--kernel", default="torch/linear.py", help="library kernel the candidates are made from")
    p.add_argument("--candidates", type=int, default=10)
    p.add_argument("--out", default="engine-swap.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="polymorph-swap-") as tmp:
        model_dir = checkpoint(args.model, args.dtype, Path(tmp) / "model")
        print("cold start (a fresh process until its first measured step), twice:", flush=True)
        cold = [cold_start(model_dir, args) for _ in range(2)][-1]
        engine = Controller.start(str(model_dir), args.backend, args.target, batch=1, ctx=args.ctx,
                                  dtype=args.dtype, budget_s=600)  # fmt: skip
        source = (kernels_root() / args.kernel).read_text()
        swaps = []
        try:
            for i in range(args.candidates):
                path = Path(tmp) / f"candidate_{i}.py"
                path.write_text(f"# candidate {i} of bench/engine_swap.py\n{source}")
                engine.wire.clear()
                engine.reference_draws_s.clear()
                engine.reference_wait_s = 0.0
                t0 = time.perf_counter()
                swap, report = engine.try_candidate(args.group, path, None)
                took = time.perf_counter() - t0
                wire = {op: dataclasses.asdict(w) for op, w in engine.wire.items()}
                ok = swap.ok and report is not None and report.ok
                stages = {"swap": swap.round_trip_s, **(report.seconds if report else {})}
                where = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
                print(
                    f"  hot swap {i}: {took:.2f} s ({where}), gates {'passed' if ok else 'FAILED'}",
                    flush=True,
                )
                failed = [g for g in (report.gates if report else []) if g.verdict == "fail"]
                for g in failed:
                    print(f"    {g.name}: {g.cause}", flush=True)
                print("    requests: " + "; ".join(
                    f"{op} x{w['calls']} {w['round_trip_s']:.2f} s ({w['worker_s']:.2f} s in the worker, "
                    f"{w['bytes'] / 1e6:.1f} MB back)" for op, w in wire.items()), flush=True)  # fmt: skip
                draws = list(engine.reference_draws_s)
                reference = {"wait_s": engine.reference_wait_s, "draws_s": draws}
                print(f"    reference scenario: the gates waited {engine.reference_wait_s:.2f} s; draws finished "
                      f"meanwhile took {', '.join(f'{d:.2f}' for d in draws) or 'none'} s", flush=True)  # fmt: skip
                swaps.append({"s": took, "ok": ok, "build_s": swap.build_s, "stages_s": stages, "requests": wire,
                              "reference": reference,
                              "gates": {g.name: [g.verdict, g.cause] for g in (report.gates if report else [])}})  # fmt: skip
                engine.restore(args.group)
        finally:
            engine.close()
    hot = statistics.median(s["s"] for s in swaps)
    result = {"model": args.model, "backend": args.backend, "target": args.target, "cold_start_s": cold,
              "hot_swap_median_s": hot, "hot_swaps": swaps, "cold_over_hot": cold / hot,
              "candidates_per_minute": 60 / hot}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"cold start {cold:.2f} s; hot swap, every gate and the timing included: median {hot:.2f} s over "
          f"{len(swaps)} candidates ({cold / hot:.1f}x faster, {60 / hot:.1f} candidates per minute)")  # fmt: skip
    return 0 if all(s["ok"] for s in swaps) else 1


if __name__ == "__main__":
    sys.exit(main())
