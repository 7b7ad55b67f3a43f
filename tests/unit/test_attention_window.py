"""The `window` and `softcap` attributes of `attention` and `cache_attention`: the reference against a
per-query loop written from the definition (transformers' `sliding_window`: the query at p sees keys
p - window < k <= p; Gemma 2's `attn_logit_softcapping`: cap * tanh(score / cap) after the scale,
before the mask), and the verifier's checks."""

from __future__ import annotations

import numpy as np
import pytest

from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.ops import OpError
from polymorph.ir.spec import GraphError, verify
from polymorph.verify.tolerance import compare, op_tolerance

F32, I32 = DType.F32, DType.I32


def loop_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                   scale: float, window: int, softcap: float) -> np.ndarray:  # fmt: skip
    """q[S, H, Dh] at positions q_pos[S], k/v[T, Hkv, Dh] at k_pos[T]: one query and head at a time."""
    s, h, _ = q.shape
    rep = h // k.shape[1]
    out = np.zeros(q.shape, dtype=np.float64)
    for i in range(s):
        seen = [
            t
            for t in range(len(k_pos))
            if k_pos[t] <= q_pos[i] and (not window or k_pos[t] > q_pos[i] - window)
        ]
        for head in range(h):
            scores = np.array([float(q[i, head] @ k[t, head // rep]) * scale for t in seen])
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            p = np.exp(scores - scores.max())
            out[i, head] = (p / p.sum()) @ v[seen, head // rep]
    return out


@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (1, 0.0), (3, 0.0), (9, 0.0), (0, 1.5), (4, 1.5)])
def test_attention_is_the_per_query_definition(window: int, softcap: float) -> None:
    rng = np.random.default_rng()
    b, s, h, hkv, d = 2, 9, 4, 2, 8
    g = GraphBuilder("attn")
    q, k, v = (g.input(n, F32, (b, s, hh, d)) for n, hh in (("q", h), ("k", hkv), ("v", hkv)))
    g.output("o", g.op("attention", "a", q, k, v, scale=0.7, window=window, softcap=softcap))
    arrays = {
        n: (2 * rng.standard_normal((b, s, hh, d))).astype(np.float32)
        for n, hh in (("q", h), ("k", hkv), ("v", hkv))
    }
    got = reference.run(g.build(), {}, arrays, {})["o"]
    pos = np.arange(s)
    for row in range(b):
        want = loop_attention(*(arrays[n][row] for n in "qkv"), pos, pos, 0.7, window, softcap)
        assert compare(got[row], want.astype(np.float32), op_tolerance(F32)).ok


@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (2, 0.0), (5, 0.0), (40, 0.0), (5, 2.0)])
def test_cache_attention_is_the_per_query_definition(window: int, softcap: float) -> None:
    rng = np.random.default_rng()
    b, s, h, hkv, d, block, ctx_blocks = 3, 3, 4, 1, 8, 4, 5
    cache_blocks = b * ctx_blocks + 1
    g = GraphBuilder("cache_attn")
    q = g.input("q", F32, (b, s, h, d))
    kc = g.input("k_cache", F32, (cache_blocks, block, hkv, d))
    vc = g.input("v_cache", F32, (cache_blocks, block, hkv, d))
    table = g.input("block_table", I32, (b, ctx_blocks))
    positions = g.input("positions", I32, (b, s))
    g.output(
        "o",
        g.op("cache_attention", "a", q, kc, vc, table, positions, scale=0.5, window=window, softcap=softcap),
    )
    lens = np.array([3, 11, 20])  # ragged, the last fills its table
    arrays = {
        "q": (2 * rng.standard_normal((b, s, h, d))).astype(np.float32),
        "k_cache": rng.standard_normal((cache_blocks, block, hkv, d)).astype(np.float32),
        "v_cache": rng.standard_normal((cache_blocks, block, hkv, d)).astype(np.float32),
        "block_table": (rng.permutation(cache_blocks - 1)[: b * ctx_blocks] + 1)
        .reshape(b, ctx_blocks)
        .astype(np.int32),
        "positions": (lens[:, None] - s + np.arange(s)[None]).astype(np.int32),
    }
    got = reference.run(g.build(), {}, {n: a.copy() for n, a in arrays.items()}, {})["o"]
    for row in range(b):
        n = int(lens[row])
        t = np.arange(n)
        blocks = arrays["block_table"][row, t // block]
        k = arrays["k_cache"][blocks, t % block]  # [n, Hkv, Dh] in position order
        v = arrays["v_cache"][blocks, t % block]
        want = loop_attention(arrays["q"][row], k, v, arrays["positions"][row], t, 0.5, window, softcap)
        assert compare(got[row], want.astype(np.float32), op_tolerance(F32)).ok, (window, softcap, row)


def test_the_verifier_checks_window_and_softcap() -> None:
    def graph(**attrs: object) -> GraphBuilder:
        g = GraphBuilder("attn")
        q = g.input("q", F32, (1, 4, 2, 8))
        k = g.input("k", F32, (1, 4, 2, 8))
        g.output("o", g.op("attention", "a", q, k, k, scale=1.0, **attrs))
        return g

    for attrs, message in (
        ({"window": 2, "causal": False}, "needs causal"),
        ({"window": -1}, "window must be >= 0"),
        ({"softcap": -1.0}, "softcap must be >= 0"),
        ({"window": 1.5}, "must be int"),
    ):
        with pytest.raises((OpError, GraphError), match=message):
            verify(graph(**attrs).build())
