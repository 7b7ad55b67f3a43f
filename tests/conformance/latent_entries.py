"""Conformance entries for DeepSeek-V3.2's sparse attention: `indexer_topk` (the k best positions of
sum_h weights * relu(scale q_h . k_t) over the paged indexer cache) and `index_attention` (attention
over only the positions each query selected). conftest.py's `_entries()` adds them, passing its own
helpers (OpInfo, one_node, inp, leaf_samples, context_positions, BLOCK_SIZE, PAGED_WINDOWED), as this
file cannot import conftest under --import-mode=importlib.

Every block table names distinct blocks (a block named twice would give two positions the same key,
hence equal scores, and which of them a GEMM rounds higher is not defined), and the contexts are
ragged (context_positions). Every cache slot that no query of any sequence uses (past every query's
position, in a block no table names, or, for index_attention, not selected) holds NaN: a kernel that
lets one into a max, a sum or 0 * NaN shows NaN.

indexer_topk must match the reference exactly, so each query's selection is made unambiguous on the
inputs as rounded to the test dtype (`_untie_scores` redraws that query's q and weights until it is):
no dot scale * q_h . k_t within 1e-4 of its magnitude of zero (relu would cut it one way in one
implementation and the other in another), and among the k + 1 best visible scores no two closer than
1e-4 of the row's magnitude (sum_h |w_h| scale sum_d |q_hd k_td|), which is ~40x the few f32 ulps by
which two summation orders differ. Scores that are exactly zero (every head's dot negative) tie
exactly in every implementation, and go to the lower position. The k cover fewer positions than
nearly every query sees (3), about as many (8), and more than any table holds (40).

index_attention runs grouped-query heads (4 query heads over 2 kv heads, v narrower than k) and
DeepSeek's latent cache, where one tensor is both k_cache and v_cache (a graph built directly, as
one_node names each input once). Each selected row lists 1 to k visible positions in random order,
padded with -1, and sometimes a position past the query's own (not seen) or a repeat (seen once).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType

F32, I32 = DType.F32, DType.I32
MARGIN = 1e-4  # relative: the f32 rounding of two summation orders is a few 1e-7 of the magnitude
SCALE = 0.25
SELECTED = 6  # entries per row of `selected`


def distinct_blocks(rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]) -> np.ndarray:
    """block_table[B, C] of B * C distinct blocks of the cache (the rest are in no table)."""
    b, c = shape
    return rng.permutation(sizes["cache_blocks"])[: b * c].reshape(b, c)


def _no_ints(rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]) -> np.ndarray:
    return np.full(shape, -1)  # drawn in a `fix`, which sees the positions


def _poison(arrays: dict[str, np.ndarray], names: tuple[str, ...], seen: np.ndarray) -> None:
    """NaN in the slots of the caches `names` where seen[blocks, bs] is False."""
    for name in names:
        x = arrays[name].copy()
        x[~seen] = np.nan
        arrays[name] = x


def _topk_clear(q: np.ndarray, w: np.ndarray, keys: np.ndarray, k: int) -> bool:
    """Whether the indexer's choice for one query (q[H, D], w[H], keys[T, D] of its visible positions,
    all f64 of the rounded inputs) is unambiguous: see the module docstring."""
    dots = SCALE * keys @ q.T  # [T, H]
    mag = SCALE * np.abs(keys) @ np.abs(q).T
    if np.any(np.abs(dots) <= MARGIN * mag + 1e-30):
        return False
    relu = np.maximum(dots, 0.0)
    scores = relu @ w  # [T]
    zero = ~(dots > 0).any(axis=1)  # exactly zero in every implementation
    row = MARGIN * float((mag @ np.abs(w)).max())
    order = np.argsort(-scores, kind="stable")[: k + 1]
    for a, b in itertools.pairwise(order):
        if not (zero[a] and zero[b]) and not scores[a] - scores[b] > row:
            return False
    return True


def _untie_scores(k: int):
    """leaf_samples' `fix` for indexer_topk: NaN in the unused cache slots, then redraw each query's q
    and weights (normal) until its selection is unambiguous."""

    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        q, w, cache = arrays["q"], arrays["weights"], arrays["cache"]
        table, pos = arrays["block_table"], arrays["positions"]
        bs = cache.shape[1]
        seen = np.zeros(cache.shape[:2], dtype=bool)
        for row, ps in zip(table, pos, strict=True):
            t = np.arange(int(ps.max()) + 1)
            seen[row[t // bs], t % bs] = True
        _poison(arrays, ("cache",), seen)
        q, w = q.copy(), w.copy()
        for b, s in np.ndindex(*pos.shape):
            t = np.arange(int(pos[b, s]) + 1)
            keys = cache[table[b, t // bs], t % bs, 0].astype(np.float64)  # [T, D]
            for _ in range(1000):
                if _topk_clear(q[b, s].astype(np.float64), w[b, s].astype(np.float64), keys, k):
                    break
                q[b, s] = rng.standard_normal(q.shape[2:]).astype(np.float32).astype(q.dtype)
                w[b, s] = rng.standard_normal(w.shape[2:]).astype(np.float32).astype(w.dtype)
            else:
                raise AssertionError(f"no unambiguous indexer selection found for k={k}")
        arrays["q"], arrays["weights"] = q, w

    return fix


def _select(kv: tuple[str, ...]):
    """leaf_samples' `fix` for index_attention: each row of `selected` lists 1 to SELECTED visible
    positions in random order, padded with -1, sometimes with a position past the query's own or a
    repeat; then NaN in every slot of the caches `kv` that no query sees."""

    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        table, pos, sel = arrays["block_table"], arrays["positions"], arrays["selected"].copy()
        bs = arrays[kv[0]].shape[1]
        n_pos = table.shape[1] * bs
        seen = np.zeros(arrays[kv[0]].shape[:2], dtype=bool)
        for b, s in np.ndindex(*pos.shape):
            p = int(pos[b, s])
            m = int(rng.integers(1, min(SELECTED, p + 1) + 1))
            picked = list(rng.choice(p + 1, m, replace=False))
            if len(picked) < SELECTED and p + 1 < n_pos and rng.random() < 0.5:
                picked.append(int(rng.integers(p + 1, n_pos)))  # past the query: not seen
            if len(picked) < SELECTED and rng.random() < 0.5:
                picked.append(picked[0])  # a repeat: seen once
            row = np.array(picked + [-1] * (SELECTED - len(picked)))
            sel[b, s] = rng.permutation(row)
            t = row[(row >= 0) & (row <= p)]
            seen[table[b, t // bs], t % bs] = True
        arrays["selected"] = sel.astype(arrays["selected"].dtype)
        _poison(arrays, kv, seen)

    return fix


def entries(ns: Mapping[str, Any]) -> list[Any]:
    OpInfo, one_node, inp, leaf_samples = (ns[k] for k in ("OpInfo", "one_node", "inp", "leaf_samples"))
    context_positions, block, paged_sizes = ns["context_positions"], ns["BLOCK_SIZE"], ns["PAGED_WINDOWED"]
    e: list[Any] = []

    # q: [B, S, 4, 16] over a one-head indexer cache of 16-wide keys; weights take the wide
    # distributions (they scale the heads' relu terms, negative ones included)
    def indexer(k: int):
        def build(d: DType) -> Any:
            leaves = {
                "q": inp(d, "batch", "seq", 4, 16),
                "cache": inp(d, "cache_blocks", block, 1, 16),
                "weights": inp(d, "batch", "seq", 4),
                "block_table": inp(I32, "batch", "ctx_blocks"),
                "positions": inp(I32, "batch", "seq"),
            }
            return one_node("indexer_topk", leaves, k=k, scale=SCALE)

        return build

    ints = {"block_table": distinct_blocks, "positions": context_positions}
    for k in (3, 8, 40):
        e.append(
            OpInfo(
                f"indexer_topk.k{k}",
                "indexer_topk",
                indexer(k),
                leaf_samples(paged_sizes, wide=["weights"], large=10.0, ints=ints, fix=_untie_scores(k)),
            )
        )

    # grouped-query: 4 query heads over 2 kv heads, k 16 wide, v 12 wide
    def gqa(d: DType) -> Any:
        leaves = {
            "q": inp(d, "batch", "seq", 4, 16),
            "k_cache": inp(d, "cache_blocks", block, 2, 16),
            "v_cache": inp(d, "cache_blocks", block, 2, 12),
            "block_table": inp(I32, "batch", "ctx_blocks"),
            "positions": inp(I32, "batch", "seq"),
            "selected": inp(I32, "batch", "seq", SELECTED),
        }
        return one_node("index_attention", leaves, scale=SCALE)

    # DeepSeek's latent cache: one [blocks, bs, 1, 24] tensor is k_cache and v_cache (MLA absorbed:
    # latent and rope dims together), so the output is [B, S, 4, 24]; `.sliced` takes its latent
    # part, as the model's graph does
    def latent(sliced: bool):
        def build(d: DType) -> Any:
            b = GraphBuilder("conformance.index_attention.latent")
            b.input("q", d, ("batch", "seq", 4, 24))
            b.input("kv_cache", d, ("cache_blocks", block, 1, 24))
            b.input("block_table", I32, ("batch", "ctx_blocks"))
            b.input("positions", I32, ("batch", "seq"))
            b.input("selected", I32, ("batch", "seq", SELECTED))
            y = b.op(
                "index_attention", "attn", "q", "kv_cache", "kv_cache", "block_table", "positions",
                "selected", scale=0.2,
            )  # fmt: skip
            if sliced:
                y = b.op("slice", "latent", y, axis=-1, start=0, end=16)
            b.output("y", y)
            return b.build()

        return build

    attn_ints = {"block_table": distinct_blocks, "positions": context_positions, "selected": _no_ints}
    e.append(
        OpInfo(
            "index_attention",
            "index_attention",
            gqa,
            leaf_samples(
                paged_sizes, wide=["v_cache"], large=10.0, ints=attn_ints, fix=_select(("k_cache", "v_cache"))
            ),
        )
    )
    for name, sliced in (("latent", False), ("latent.sliced", True)):
        e.append(
            OpInfo(
                f"index_attention.{name}",
                "index_attention",
                latent(sliced),
                leaf_samples(paged_sizes, large=3.0, ints=attn_ints, fix=_select(("kv_cache",))),
            )
        )
    return e
