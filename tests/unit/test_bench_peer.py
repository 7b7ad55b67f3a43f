"""The benchmark's torch peer (bench/peer_llama.py) computes the same model as polymorph's graph: at
float32 on the CPU, a prefill and two cached decode steps of llama-tiny and moe-tiny (Mixtral) match
the reference engine within the f32 model tolerance, on fresh random tokens, both expert paths of the
MoE peer included (gathered experts at batch 1 decode, masked dense experts otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from polymorph.ir.dtypes import DType
from polymorph.models import load_model
from polymorph.serving.session import ReferenceExecutable
from polymorph.verify.tolerance import compare, model_tolerance

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from peer_llama import PeerLlama


@pytest.mark.parametrize(("name", "batch"), [("llama-tiny", 2), ("moe-tiny", 1), ("moe-tiny", 3)])
def test_peer_matches_the_reference(name: str, batch: int) -> None:
    model = load_model(name, dtype="f32")
    graph, weights = model.graph, model.weights()
    block = int(graph.meta["block_size"])
    rng = np.random.default_rng()
    prompt, steps = 7, 2
    ctx_blocks = -(-(prompt + steps) // block)
    ref = ReferenceExecutable(graph, weights)
    ref.allocate_state(batch * ctx_blocks + 1)
    table = (1 + np.arange(batch * ctx_blocks, dtype=np.int32)).reshape(batch, ctx_blocks)
    peer = PeerLlama(model.config, {k: torch.from_numpy(v) for k, v in weights.items()}, batch=batch,
                     max_ctx=prompt + steps)  # fmt: skip
    peer.last_only = True
    tokens = rng.integers(0, model.config.vocab_size, (batch, prompt), dtype=np.int32)
    start = 0
    for _ in range(1 + steps):
        s = tokens.shape[1]
        positions = np.broadcast_to(np.arange(start, start + s, dtype=np.int32), (batch, s)).copy()
        want = ref.run({"tokens": tokens, "positions": positions, "block_table": table})["logits"]
        with torch.no_grad():
            got = peer(torch.from_numpy(tokens).long(), torch.arange(start, start + s)).numpy()
        check = compare(got, want, model_tolerance(DType.F32))
        assert check.ok, f"{name} batch {batch} at position {start}: {check}"
        start += s
        tokens = rng.integers(0, model.config.vocab_size, (batch, 1), dtype=np.int32)
