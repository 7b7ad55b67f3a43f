"""A tuned cpu plan beside the untuned one and the PyTorch eager peer: whole llama-tiny decode steps.

    polymorph tune llama-tiny --backend cpu --budget 60s --out TUNED
    python bench/cpu_tune_peer.py --tuned TUNED --out tune-peer.json

Three arms in one process on one thread, each at batch 1, position ctx - 1 over a filled cache, timed
in rounds of `--steps` steps, the arms' order rotating every round: polymorph's stock plan, the tuned
plan `polymorph tune` wrote (its kernel copies, as `polymorph run TUNED` loads them), and the
gpt-fast-style torch peer (bench/peer_llama.py) run eagerly on the same weights. The ratios are
polymorph.search.ab's paired bootstrap over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from costmodel_cpu import decode_step
from peer_llama import PeerLlama

from polymorph import api
from polymorph.models import load_model
from polymorph.search.ab import paired_ratio


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tuned", required=True, help="a `polymorph tune` output folder")
    p.add_argument("--ctx", type=int, default=768)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="tune-peer.json")
    args = p.parse_args()
    torch.set_num_threads(1)  # as the cpu executable runs llama-tiny
    stock, inputs = decode_step("llama-tiny", args.ctx)
    model = load_model("llama-tiny")
    tuned = api.load(api.load_compiled(args.tuned), model)
    tuned.allocate_state(next(iter(stock.state.values())).shape[0])
    weights = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.weights().items()}
    peer = PeerLlama(model.config, weights, batch=1, max_ctx=args.ctx + 16)
    for cache in peer.k_cache + peer.v_cache:
        cache.normal_()
    pos = torch.tensor([args.ctx - 1])
    vocab = model.config.vocab_size

    def peer_step() -> None:
        with torch.inference_mode():
            peer(torch.randint(0, vocab, (1, 1)), pos)

    arms = {"stock": lambda: stock.run(inputs()), "tuned": lambda: tuned.run(inputs()), "eager": peer_step}
    times: dict[str, list[float]] = {a: [] for a in arms}
    names = list(arms)
    for name in names * 2:  # warm-up
        arms[name]()
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                arms[name]()
            times[name].append((time.perf_counter() - t0) / args.steps)
    tuned_vs_stock = paired_ratio(times["stock"], times["tuned"])
    tuned_vs_eager = paired_ratio(times["eager"], times["tuned"])
    stock_vs_eager = paired_ratio(times["eager"], times["stock"])
    result = {"ctx": args.ctx, "rounds": args.rounds, "steps": args.steps, "tuned_dir": args.tuned,
              "median_s": {a: statistics.median(t) for a, t in times.items()}, "times_s": times,
              "tuned_over_stock": tuned_vs_stock.to_json(), "tuned_over_eager": tuned_vs_eager.to_json(),
              "stock_over_eager": stock_vs_eager.to_json()}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    us = {a: f"{statistics.median(t) * 1e6:.0f} us" for a, t in times.items()}
    print(f"llama-tiny decode, b1, position {args.ctx - 1}, one thread: stock {us['stock']}, tuned {us['tuned']}, "
          f"torch eager peer {us['eager']} (medians of {args.rounds} rounds of {args.steps} steps)")  # fmt: skip
    for label, r in (("tuned/stock", tuned_vs_stock), ("tuned/eager", tuned_vs_eager),
                     ("stock/eager", stock_vs_eager)):  # fmt: skip
        print(f"  {label} {r.ratio:.3f}x (95% interval {r.low:.3f}-{r.high:.3f}): {r.verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
