"""Conformance entries for attention sinks (gpt-oss: the optional last input `sinks[H]` of attention
and cache_attention, one logit per query head that joins each row's softmax and carries no value) and
chunked attention (Llama 4's `attention_chunk_size`: the attr `chunk`, a query at p sees the keys
t <= p with t // chunk == p // chunk). conftest.py's `_entries()` adds them, passing its own helpers
(OpInfo, one_node, inp, leaf_samples, ids_below, context_positions, BLOCK_SIZE, PAGED_WINDOWED,
BATCH_SEQ), as this file cannot import conftest under --import-mode=importlib.

Sinks are drawn per head from large negative (the sink changes nothing), moderate, and large positive
values (the sink takes nearly all the weight: the output is ~0, which a kernel that drops the sink
misses by O(1)). Chunks cut the 7-token sequences (and the paged contexts of 4-token blocks) mid-block
(3, 6) and at block edges (4, 8), and exceed every context (100). In the chunked cache_attention rows
every cache slot no query of any sequence sees (outside its chunk, past its end, in a block no table
names) holds NaN, as tests/conformance/test_window_nan.py poisons the slots outside a window: a kernel
that lets such a slot into a max, a sum or 0 * NaN shows NaN."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from polymorph.ir.dtypes import DType

I32 = DType.I32
# per-head sink logits: large negative, moderate, large positive (scores here are a few units)
SINK_VALUES = np.array([-40.0, -3.0, -0.5, 0.0, 1.0, 2.5, 6.0, 30.0], dtype=np.float32)


def _sinks(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Sinks from SINK_VALUES, every head a different one where there are enough, in random order, plus
    a little noise so no two samples share them."""
    x = arrays["sinks"]
    picked = rng.permutation(SINK_VALUES)[np.arange(x.size) % SINK_VALUES.size]
    picked = picked + rng.uniform(-0.25, 0.25, x.size).astype(np.float32)
    arrays["sinks"] = picked.reshape(x.shape).astype(x.dtype)


def _poison_outside_chunks(chunk: int):
    """NaN in every k/v cache slot that no query of any sequence sees under `chunk`."""

    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        table, pos = arrays["block_table"], arrays["positions"]
        kc = arrays["k_cache"]
        blocks, bs = kc.shape[:2]
        seen = np.zeros((blocks, bs), dtype=bool)
        for row, ps in zip(table, pos, strict=True):
            for p in ps:
                t = np.arange(int(p) // chunk * chunk, int(p) + 1)
                seen[row[t // bs], t % bs] = True
        for name in ("k_cache", "v_cache"):
            x = arrays[name].copy()
            x[~seen] = np.nan
            arrays[name] = x
        if "sinks" in arrays:
            _sinks(arrays, rng)

    return fix


def entries(ns: Mapping[str, Any]) -> list[Any]:
    OpInfo, one_node, inp, leaf_samples = (ns[k] for k in ("OpInfo", "one_node", "inp", "leaf_samples"))
    ids_below, context_positions = ns["ids_below"], ns["context_positions"]
    block, paged_sizes, batch_seq = ns["BLOCK_SIZE"], ns["PAGED_WINDOWED"], ns["BATCH_SEQ"]
    e: list[Any] = []

    def attention(sinks: bool, **attrs: Any):
        def build(d: DType) -> Any:
            leaves = {
                "q": inp(d, "batch", "seq", 6, 16),
                "k": inp(d, "batch", "seq", 3, 16),
                "v": inp(d, "batch", "seq", 3, 16),
            }
            if sinks:
                leaves["sinks"] = inp(d, 6)
            return one_node("attention", leaves, scale=0.5, **attrs)

        return build

    # scale 0.5 over 16-wide heads: scores of a few units, so the sinks above span "ignored" to "all"
    for name, sinks, attrs in (
        ("sinks", True, {}),
        ("sinks.noncausal", True, {"causal": False}),
        ("window3_sinks", True, {"window": 3}),
        ("softcap_sinks", True, {"softcap": 2.0}),
        ("chunk3", False, {"chunk": 3}),
        ("chunk4", False, {"chunk": 4}),
        ("chunk100", False, {"chunk": 100}),
        ("chunk3_sinks", True, {"chunk": 3}),
        ("chunk4_softcap", False, {"chunk": 4, "softcap": 2.0}),
    ):
        e.append(
            OpInfo(
                f"attention.{name}",
                "attention",
                attention(sinks, **attrs),
                leaf_samples(batch_seq, wide=["v"], large=10.0, fix=_sinks if sinks else None),
            )
        )

    def cache_attention(sinks: bool, **attrs: Any):
        def build(d: DType) -> Any:
            leaves = {
                "q": inp(d, "batch", "seq", 4, 16),
                "k_cache": inp(d, "cache_blocks", block, 2, 16),
                "v_cache": inp(d, "cache_blocks", block, 2, 16),
                "block_table": inp(I32, "batch", "ctx_blocks"),
                "positions": inp(I32, "batch", "seq"),
            }
            if sinks:
                leaves["sinks"] = inp(d, 4)
            return one_node("cache_attention", leaves, scale=0.5, **attrs)

        return build

    ints = {"block_table": ids_below("cache_blocks"), "positions": context_positions}
    for name, sinks, attrs in (
        ("sinks", True, {}),
        ("window3_sinks", True, {"window": 3}),
        ("window6_softcap_sinks", True, {"window": 6, "softcap": 2.0}),
        ("chunk3", False, {"chunk": 3}),
        ("chunk4", False, {"chunk": 4}),
        ("chunk6", False, {"chunk": 6}),
        ("chunk8", False, {"chunk": 8}),
        ("chunk100", False, {"chunk": 100}),
        ("chunk6_softcap", False, {"chunk": 6, "softcap": 2.0}),
        ("chunk4_sinks", True, {"chunk": 4}),
    ):
        chunk = attrs.get("chunk", 0)
        fix = _poison_outside_chunks(chunk) if chunk else _sinks
        e.append(
            OpInfo(
                f"cache_attention.{name}",
                "cache_attention",
                cache_attention(sinks, **attrs),
                leaf_samples(paged_sizes, wide=["v_cache"], large=10.0, ints=ints, fix=fix),
            )
        )
    return e
