"""How long the reference takes to draw one teacher-forced scenario (the engine's quality and KV
gates wait on it): step by step, one pass over the weights per step, against one all-logits prefill
per sequence (`reference_scenario(whole=)`), alternating so drift on a shared machine hits both.

    python bench/reference_draw.py --model llama-3.2-1b --dtype bf16 --rounds 3
"""

from __future__ import annotations

import argparse
import platform
import time

from polymorph.models import load_model
from polymorph.serving.session import ReferenceExecutable
from polymorph.verify.numerics import reference_scenario


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    model = load_model(args.model, dtype=args.dtype)
    weights = model.weights()
    ref = ReferenceExecutable(model.graph, weights)
    whole_graph = model.rebuild(all_logits=True)

    def draw(mode: str) -> float:
        own = ReferenceExecutable(model.graph, weights, wide=ref.wide)
        whole = ReferenceExecutable(whole_graph, weights, wide=ref.wide) if mode == "whole" else None
        t0 = time.perf_counter()
        reference_scenario(own, model.graph, whole=whole)
        return time.perf_counter() - t0

    draw("steps"), draw("whole")  # first touches of the weights and their f32 copies
    times: dict[str, list[float]] = {"steps": [], "whole": []}
    for _ in range(args.rounds):
        for mode in times:
            times[mode].append(draw(mode))
    print(f"{args.model} {args.dtype} on {platform.processor() or platform.machine()}")
    for mode, ts in times.items():
        print(f"  {mode:5}: " + ", ".join(f"{t:.2f}" for t in ts) + " s")


if __name__ == "__main__":
    main()
