"""Random valid graphs over every op of the table, and malformed ones, from hypothesis.

`graphs()` draws a random DAG with GraphBuilder: each step applies one op (drawn from `STEPS`, one
entry per op of `OPS`) either to a value an earlier step made or to fresh leaves, with small concrete
or symbolic dims and the dtypes the op allows; kv_write and cache_attention get a valid paged cache.
The strategy records the value range every integer leaf needs (token ids below the vocab, block ids
below the pool, positions inside the block table) so the reference can run the graph.

max_examples comes from the profile tests/conftest.py loads (HYPOTHESIS_PROFILE).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from polymorph.errors import UserError
from polymorph.ir import OPS, DType, Graph, TensorType, content_hash, format_graph, reference, verify
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.serialize import from_dict, from_json, to_dict, to_json
from polymorph.ir.shapes import Dim, concrete

FLOATS = [DType.F32, DType.BF16, DType.F16]
INTS = [DType.I32, DType.I64]
SYMBOLS = ("batch", "seq", "n")

# The profile's max_examples, never above it; generation is what costs, not the checks.
RANDOM = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PER_OP = settings(RANDOM, max_examples=max(1, settings().max_examples // 5))


@dataclass
class Paged:
    """One paged KV setup: two state caches, the block table and positions that address them."""

    batch: Dim
    seq: Dim
    kv_heads: int
    head_dim: int
    dtype: DType
    states: list[str]  # [k_cache, v_cache] state names
    caches: list[str]  # the latest value of each: the state, or its last kv_write
    table: str
    positions: str


@dataclass
class Recipe:
    """A graph under construction, with what is needed to feed it."""

    draw: Callable[[st.SearchStrategy[Any]], Any]
    builder: GraphBuilder
    sizes: dict[str, int]  # symbol -> the value the run binds it to
    pool: list[tuple[str, TensorType]] = field(default_factory=list)  # float values a step may take
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)  # int leaf -> [lo, hi)
    paged: list[Paged] = field(default_factory=list)
    written: set[str] = field(default_factory=set)  # kv_write results
    produced: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    count: int = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    # --- dims and dtypes

    def dim(self, lo: int = 1, hi: int = 4) -> Dim:
        """A concrete dim in [lo, hi], or a symbol (bound to its value in `sizes` when run)."""
        if self.draw(st.booleans()):
            return self.draw(st.sampled_from(SYMBOLS))
        return self.draw(st.integers(lo, hi))

    def shape(self, min_rank: int = 1, max_rank: int = 3) -> tuple[Dim, ...]:
        return tuple(self.dim() for _ in range(self.draw(st.integers(min_rank, max_rank))))

    def fdtype(self) -> DType:
        return self.draw(st.sampled_from(FLOATS))

    def size(self, d: Dim) -> int:
        return self.sizes[d] if isinstance(d, str) else d

    # --- leaves and values

    def input(self, dtype: DType, shape: tuple[Dim, ...], *, lo: int = 0, hi: int = 8) -> str:
        name = self.builder.input(self.fresh("in"), dtype, shape)
        if dtype.is_float:
            self.pool.append((name, TensorType(dtype, shape)))
        else:
            self.ranges[name] = (lo, hi)
        return name

    def param(self, dtype: DType, shape: tuple[Dim, ...]) -> str:
        return self.builder.param(self.fresh("w"), dtype, shape)

    def take(
        self, pred: Callable[[TensorType], bool], make: Callable[[], tuple[DType, tuple[Dim, ...]]]
    ) -> tuple[str, TensorType]:
        """A float value from the pool that `pred` accepts, or a fresh input `make` describes."""
        fits = [v for v in reversed(self.pool) if pred(v[1])]  # newest first: chains more than forests
        if fits and self.draw(st.integers(0, 3)) > 0:
            return self.draw(st.sampled_from(fits))
        dtype, shape = make()
        name = self.input(dtype, shape)
        return name, TensorType(dtype, shape)

    def any_float(self, min_rank: int = 1) -> tuple[str, TensorType]:
        return self.take(lambda t: t.rank >= min_rank, lambda: (self.fdtype(), self.shape(min_rank)))

    def op(self, op: str, *inputs: str, n_out: int = 1, reusable: bool = True, **attrs: Any) -> Any:
        """Add one node; its float outputs join the pool unless not `reusable`."""
        name = self.fresh(f"{op}.")
        outs = tuple(f"{name}.{i}" for i in range(n_out)) if n_out > 1 else None
        result = self.builder.op(op, name, *inputs, outputs=outs, **attrs)
        values = result if isinstance(result, tuple) else (result,)
        types = self.builder.graph.types()
        for v in values:
            self.produced.append(v)
            if reusable and types[v].dtype.is_float:
                self.pool.append((v, types[v]))
        self.ops.append(op)
        return result

    def setup(self) -> Paged:
        """A paged cache to write or read: reuse one, or declare new state, table and positions."""
        if self.paged and self.draw(st.booleans()):
            return self.draw(st.sampled_from(self.paged))
        batch, seq = self.dim(1, 2), self.dim(1, 3)
        kv_heads, head_dim = self.draw(st.integers(1, 2)), 2 * self.draw(st.integers(1, 2))
        block_size, dtype = self.draw(st.integers(1, 4)), self.fdtype()
        cache_blocks = self.draw(st.sampled_from(["cache_blocks", 3, 5]))
        ctx_blocks = self.draw(st.sampled_from(["ctx_blocks", 1, 3]))
        states = [
            self.builder.state(self.fresh(kind), dtype, (cache_blocks, block_size, kv_heads, head_dim))
            for kind in ("k_cache", "v_cache")
        ]
        table = self.input(DType.I32, (batch, ctx_blocks), hi=self.size(cache_blocks))
        positions = self.input(
            self.draw(st.sampled_from(INTS)), (batch, seq), hi=self.size(ctx_blocks) * block_size
        )
        p = Paged(batch, seq, kv_heads, head_dim, dtype, states, list(states), table, positions)
        self.paged.append(p)
        return p


# --- one step per op ---------------------------------------------------------------------------------


def step_embedding(r: Recipe) -> None:
    vocab = r.draw(st.integers(1, 6))
    table = r.param(r.fdtype(), (vocab, r.dim()))
    ids = r.input(r.draw(st.sampled_from(INTS)), r.shape(0, 2), hi=vocab)
    r.op("embedding", table, ids)


def step_linear(r: Recipe) -> None:
    x, xt = r.any_float()
    n = r.dim()
    w = r.param(xt.dtype, (n, xt.shape[-1]))
    bias = [r.param(xt.dtype, (n,))] if r.draw(st.booleans()) else []
    r.op("linear", x, w, *bias)


def step_matmul(r: Recipe) -> None:
    a, at = r.any_float(min_rank=2)
    batch = list(at.shape[:-2])
    batch = batch[r.draw(st.integers(0, len(batch))) :]  # b may drop leading batch dims ...
    batch = [1 if r.draw(st.booleans()) else d for d in batch]  # ... or broadcast over them
    b = r.input(at.dtype, (*batch, at.shape[-1], r.dim()))
    r.op("matmul", a, b)


def step_rmsnorm(r: Recipe) -> None:
    x, xt = r.any_float()
    r.op("rmsnorm", x, r.param(xt.dtype, (xt.shape[-1],)), eps=r.draw(st.sampled_from([1e-6, 1e-5, 0.1])))


def step_layernorm(r: Recipe) -> None:
    x, xt = r.any_float()
    d = (xt.shape[-1],)
    r.op(
        "layernorm", x, r.param(xt.dtype, d), r.param(xt.dtype, d), eps=r.draw(st.sampled_from([1e-6, 1e-5]))
    )


def rank4(
    r: Recipe, pred: Callable[[TensorType], bool], make: Callable[[], tuple[Dim, ...]]
) -> tuple[str, TensorType]:
    return r.take(lambda t: t.rank == 4 and pred(t), lambda: (r.fdtype(), make()))


def step_rope(r: Recipe) -> None:
    even = lambda t: isinstance(t.shape[3], int) and t.shape[3] % 2 == 0  # noqa: E731
    x, xt = rank4(r, even, lambda: (r.dim(1, 2), r.dim(1, 3), r.dim(1, 2), 2 * r.draw(st.integers(1, 3))))
    positions = r.input(r.draw(st.sampled_from(INTS)), xt.shape[:2], hi=300)
    attrs: dict[str, Any] = {"theta": r.draw(st.sampled_from([10000.0, 500000.0]))}
    if r.draw(st.booleans()):
        attrs.update(
            rope_type="llama3",
            factor=r.draw(st.sampled_from([8.0, 32.0])),
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=r.draw(st.sampled_from([16, 8192])),
        )
    r.op("rope", x, positions, **attrs)


def step_attn_temperature(r: Recipe) -> None:
    x, xt = rank4(r, lambda t: True, lambda: (r.dim(1, 2), r.dim(1, 3), r.dim(1, 2), r.dim()))
    positions = r.input(r.draw(st.sampled_from(INTS)), xt.shape[:2], hi=300)
    floor_scale = r.draw(st.sampled_from([4.0, 64.0, 8192.0]))
    r.op("attn_temperature", x, positions, floor_scale=floor_scale, scale=r.draw(st.sampled_from([0.1, 1.5])))


def step_head_linear(r: Recipe) -> None:
    def fits(t: TensorType) -> bool:
        return t.rank >= 2 and isinstance(t.shape[-2], int) and isinstance(t.shape[-1], int)

    x, xt = r.take(
        fits, lambda: (r.fdtype(), (r.dim(1, 2), r.draw(st.integers(1, 3)), r.draw(st.integers(1, 4))))
    )
    r.op("head_linear", x, r.param(xt.dtype, (xt.shape[-2], r.dim(), xt.shape[-1])))


def _indexer(r: Recipe, p: Paged) -> str:
    """indexer_topk over a fresh one-head indexer cache addressed like `p`'s caches."""
    blocks, block_size = r.builder.graph.types()[p.states[0]].shape[:2]
    heads, dim = r.draw(st.integers(1, 3)), r.draw(st.integers(1, 4))
    cache = r.builder.state(r.fresh("indexer_cache"), p.dtype, (blocks, block_size, 1, dim))
    q = r.input(r.fdtype(), (p.batch, p.seq, heads, dim))
    weights = r.input(DType.F32, (p.batch, p.seq, heads))
    k = r.draw(st.integers(1, 5))
    return r.op("indexer_topk", q, cache, weights, p.table, p.positions, k=k, scale=dim**-0.5, reusable=False)


def step_indexer_topk(r: Recipe) -> None:
    _indexer(r, r.setup())


def step_index_attention(r: Recipe) -> None:
    """Attention over the positions an indexer chose: it always keeps a visible one (t <= p), so no
    row attends to nothing."""
    p = r.setup()
    selected = _indexer(r, p)
    rep = r.draw(st.integers(1, 2))
    q = r.input(p.dtype, (p.batch, p.seq, p.kv_heads * rep, p.head_dim))
    r.op("index_attention", q, *p.caches, p.table, p.positions, selected, scale=0.5)


def step_kv_write(r: Recipe) -> None:
    p = r.setup()
    want = (p.batch, p.seq, p.kv_heads, p.head_dim)
    x, _ = r.take(lambda t: t.dtype == p.dtype and t.shape == want, lambda: (p.dtype, want))
    which = r.draw(st.sampled_from([0, 1]))
    p.caches[which] = r.op("kv_write", p.caches[which], x, p.table, p.positions, reusable=False)
    r.written.add(p.caches[which])
    r.builder.update(p.states[which], p.caches[which])


def step_cache_attention(r: Recipe) -> None:
    p = r.setup()
    rep = r.draw(st.integers(1, 2))

    def fits(t: TensorType) -> bool:
        h = t.shape[2]
        return (
            t.shape[:2] == (p.batch, p.seq)
            and t.shape[3] == p.head_dim
            and isinstance(h, int)
            and h % p.kv_heads == 0
        )

    q, _ = rank4(r, fits, lambda: (p.batch, p.seq, p.kv_heads * rep, p.head_dim))
    r.op(
        "cache_attention",
        q,
        *p.caches,
        p.table,
        p.positions,
        scale=r.draw(st.sampled_from([0.125, 0.5, 1.0])),
    )


def step_attention(r: Recipe) -> None:
    kv_heads, rep, head_dim = r.draw(st.integers(1, 2)), r.draw(st.integers(1, 2)), r.draw(st.integers(1, 4))
    q, qt = rank4(
        r,
        lambda t: isinstance(t.shape[2], int) and t.shape[2] % kv_heads == 0,
        lambda: (r.dim(1, 2), r.dim(1, 3), kv_heads * rep, head_dim),
    )
    causal = r.draw(st.booleans())
    length = qt.shape[1] if causal else r.dim()
    kv = (qt.shape[0], length, kv_heads, qt.shape[3])
    kdtype = r.fdtype()
    r.op(
        "attention",
        q,
        r.input(kdtype, kv),
        r.input(kdtype, kv),
        causal=causal,
        scale=r.draw(st.sampled_from([0.25, 1.0])),
    )


def step_silu(r: Recipe) -> None:
    r.op("silu", r.any_float(min_rank=0)[0])


def step_gelu(r: Recipe) -> None:
    r.op("gelu", r.any_float(min_rank=0)[0], approximate=r.draw(st.sampled_from(["none", "tanh"])))


def step_scale(r: Recipe) -> None:
    r.op("scale", r.any_float(min_rank=0)[0], factor=r.draw(st.sampled_from([0.37, 2048**0.5])),
         round_factor_to_dtype=r.draw(st.booleans()))  # fmt: skip


def step_softcap(r: Recipe) -> None:
    r.op("softcap", r.any_float(min_rank=0)[0], cap=r.draw(st.sampled_from([1.0, 30.0])))


def _binary(r: Recipe, op: str) -> None:
    a, at = r.any_float(min_rank=0)
    if r.draw(st.booleans()):
        b = a
    else:  # a broadcastable partner: a suffix of a's shape with some dims set to 1
        shape = at.shape[r.draw(st.integers(0, at.rank)) :]
        shape = tuple(1 if r.draw(st.booleans()) else d for d in shape)
        b = r.input(at.dtype, shape)
    r.op(op, *((a, b) if r.draw(st.booleans()) else (b, a)))


def step_mul(r: Recipe) -> None:
    _binary(r, "mul")


def step_add(r: Recipe) -> None:
    _binary(r, "add")


def step_softmax(r: Recipe) -> None:
    x, xt = r.any_float()
    r.op("softmax", x, axis=r.draw(st.integers(-xt.rank, xt.rank - 1)))


def step_argmax(r: Recipe) -> None:
    x, xt = r.any_float()
    r.op("argmax", x, axis=r.draw(st.integers(-xt.rank, xt.rank - 1)))


def step_topk_router(r: Recipe) -> None:
    logits, lt = r.take(
        lambda t: t.rank >= 1 and isinstance(t.shape[-1], int) and t.shape[-1] >= 1,
        lambda: (r.fdtype(), (*r.shape(0, 2), r.draw(st.integers(1, 6)))),
    )
    experts = lt.shape[-1]
    assert isinstance(experts, int)
    r.op(
        "topk_router",
        logits,
        n_out=2,
        reusable=True,
        k=r.draw(st.integers(1, experts)),
        mode=r.draw(st.sampled_from(["topk_softmax", "softmax_topk"])),
        normalize=r.draw(st.booleans()),
    )


def step_moe_ffn(r: Recipe) -> None:
    x, xt = r.any_float()
    experts, ffn, wdtype = r.draw(st.integers(1, 4)), r.dim(), r.fdtype()
    k = r.draw(st.integers(1, experts))
    lead, d = xt.shape[:-1], xt.shape[-1]
    if r.draw(st.booleans()):  # routed by a router on x, as the models do
        logits = r.op("linear", x, r.param(xt.dtype, (experts, d)), reusable=False)
        weights, idx = r.op(
            "topk_router", logits, n_out=2, reusable=False, k=k, mode="softmax_topk", normalize=True
        )
    else:
        weights = r.input(r.fdtype(), (*lead, k))
        idx = r.input(r.draw(st.sampled_from(INTS)), (*lead, k), hi=experts)
    gate, up = r.param(wdtype, (experts, ffn, d)), r.param(wdtype, (experts, ffn, d))
    r.op("moe_ffn", x, weights, idx, gate, up, r.param(wdtype, (experts, d, ffn)))


def step_reshape(r: Recipe) -> None:
    x, xt = r.any_float(min_rank=0)
    shape: list[Dim] = list(xt.shape)
    for _ in range(r.draw(st.integers(1, 2))):
        ints = [i for i, d in enumerate(shape) if isinstance(d, int)]
        move = r.draw(st.sampled_from(["insert1", "merge", "split", "drop1"]))
        pairs = [
            i for i in range(len(shape) - 1) if isinstance(shape[i], int) and isinstance(shape[i + 1], int)
        ]
        splittable = [i for i in ints if shape[i] >= 4 and shape[i] % 2 == 0]  # type: ignore[operator]
        ones = [i for i in ints if shape[i] == 1]
        if move == "merge" and pairs:
            i = r.draw(st.sampled_from(pairs))
            shape[i : i + 2] = [shape[i] * shape[i + 1]]  # type: ignore[operator]
        elif move == "split" and splittable:
            i = r.draw(st.sampled_from(splittable))
            shape[i : i + 1] = [2, shape[i] // 2]  # type: ignore[operator]
        elif move == "drop1" and ones:
            del shape[r.draw(st.sampled_from(ones))]
        else:
            shape.insert(r.draw(st.integers(0, len(shape))), 1)
    r.op("reshape", x, shape=tuple(shape))


def step_transpose(r: Recipe) -> None:
    x, xt = r.any_float(min_rank=0)
    r.op("transpose", x, perm=tuple(r.draw(st.permutations(range(xt.rank)))))


def step_slice(r: Recipe) -> None:
    x, xt = r.any_float()
    axis = r.draw(st.integers(0, xt.rank - 1))
    dim = xt.shape[axis]
    size = r.size(dim)
    if isinstance(dim, str):
        if r.draw(st.booleans()):
            start, end = -r.draw(st.integers(1, size)), None
        else:
            start = r.draw(st.integers(0, size - 1))
            end = r.draw(st.integers(start + 1, size))
    else:
        lo = r.draw(st.integers(0, size - 1))
        hi = r.draw(st.integers(lo + 1, size))
        start = lo - size if r.draw(st.booleans()) else lo
        end = r.draw(st.sampled_from([hi] + ([hi - size] if hi < size else [None, size + 3])))
    if r.draw(st.booleans()):
        axis -= xt.rank
    r.op("slice", x, axis=axis, start=start, end=end)


def step_concat(r: Recipe) -> None:
    x, xt = r.take(
        lambda t: any(isinstance(d, int) for d in t.shape),
        lambda: (r.fdtype(), (*r.shape(0, 2), r.draw(st.integers(1, 3)))),
    )
    axis = r.draw(st.sampled_from([i for i, d in enumerate(xt.shape) if isinstance(d, int)]))
    parts = [x]
    for _ in range(r.draw(st.integers(0, 2))):
        if r.draw(st.booleans()):
            parts.append(x)
        else:
            shape = list(xt.shape)
            shape[axis] = r.draw(st.integers(1, 3))
            parts.append(r.input(xt.dtype, tuple(shape)))
    r.op("concat", *parts, axis=axis - xt.rank if r.draw(st.booleans()) else axis)


def step_cast(r: Recipe) -> None:
    x, _ = r.any_float(min_rank=0)
    target = r.draw(st.sampled_from([*FLOATS, DType.I32]))
    alias = {DType.F32: "float32", DType.BF16: "bfloat16", DType.F16: "float16", DType.I32: "int32"}[target]
    r.op("cast", x, dtype=r.draw(st.sampled_from([target.value, alias])))


def _load_general_steps() -> dict[str, Callable[[Recipe], None]]:
    import importlib.util

    path = Path(__file__).with_name("general_steps.py")
    spec = importlib.util.spec_from_file_location("general_steps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GENERAL_STEPS


STEPS: dict[str, Callable[[Recipe], None]] = {
    "embedding": step_embedding,
    "linear": step_linear,
    "matmul": step_matmul,
    "rmsnorm": step_rmsnorm,
    "layernorm": step_layernorm,
    "rope": step_rope,
    "kv_write": step_kv_write,
    "attention": step_attention,
    "cache_attention": step_cache_attention,
    "attn_temperature": step_attn_temperature,
    "head_linear": step_head_linear,
    "indexer_topk": step_indexer_topk,
    "index_attention": step_index_attention,
    "silu": step_silu,
    "gelu": step_gelu,
    "scale": step_scale,
    "softcap": step_softcap,
    "mul": step_mul,
    "add": step_add,
    "softmax": step_softmax,
    "argmax": step_argmax,
    "topk_router": step_topk_router,
    "moe_ffn": step_moe_ffn,
    "reshape": step_reshape,
    "transpose": step_transpose,
    "slice": step_slice,
    "concat": step_concat,
    "cast": step_cast,
}
STEPS.update(_load_general_steps())  # the general ops' steps (tests/unit/general_steps.py)


@dataclass(frozen=True)
class Drawn:
    graph: Graph
    sizes: dict[str, int]
    ranges: dict[str, tuple[int, int]]
    ops: tuple[str, ...]
    seed: int


@st.composite
def graphs(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    first: str | None = None,
    min_steps: int = 2,
    max_steps: int = 8,
) -> Drawn:
    """A random valid graph; `first` forces the first step's op."""
    sizes = {s: draw(st.integers(1, 4)) for s in SYMBOLS}
    sizes |= {"cache_blocks": draw(st.integers(1, 4)), "ctx_blocks": draw(st.integers(1, 3))}
    r = Recipe(draw, GraphBuilder("random"), sizes)
    steps = draw(st.lists(st.sampled_from(sorted(STEPS)), min_size=min_steps, max_size=max_steps))
    for op in ([first] if first else []) + steps:
        STEPS[op](r)
    for v in r.produced:
        if v not in r.written:  # an earlier cache version is stale: the verifier should refuse it
            r.builder.output(f"out.{v}", v)
    if not r.builder.graph.outputs:  # only kv_writes: return the last cache version
        r.builder.output("cache", r.produced[-1])
    graph = r.builder.build()
    note(format_graph(graph))
    return Drawn(graph, sizes, r.ranges, tuple(r.ops), draw(st.integers(0, 2**32 - 1)))


def arrays(drawn: Drawn) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Fresh random params, inputs and state for `drawn` (ints inside their recorded ranges)."""
    rng = np.random.default_rng(drawn.seed)
    graph, sizes = drawn.graph, drawn.sizes

    def make(name: str, t: TensorType) -> np.ndarray:
        shape = concrete(t.shape, sizes)
        if t.dtype.is_float:
            return rng.standard_normal(shape).astype(t.dtype.numpy)
        lo, hi = drawn.ranges[name]
        return rng.integers(lo, hi, size=shape).astype(t.dtype.numpy)

    def table(kind: dict[str, TensorType]) -> dict[str, np.ndarray]:
        return {name: make(name, t) for name, t in kind.items()}

    return table(graph.params), table(graph.inputs), table(graph.state)


# --- valid graphs ------------------------------------------------------------------------------------


def test_steps_cover_the_op_table() -> None:
    assert set(STEPS) == set(OPS)


def check_valid(drawn: Drawn) -> None:
    graph = drawn.graph
    types = verify(graph)
    text = to_json(graph)
    back = from_json(text, "random.json")
    assert back == graph
    assert content_hash(back) == content_hash(graph)
    assert to_json(back) == text
    assert verify(back) == types
    format_graph(graph)


def check_runs(drawn: Drawn) -> None:
    graph = drawn.graph
    types = graph.types()
    params, inputs, state = arrays(drawn)
    outs = reference.run(graph, params, inputs, state)
    assert set(outs) == set(graph.outputs)
    for name, value in graph.outputs.items():
        want = types[value]
        got = outs[name]
        assert got.dtype == want.dtype.numpy, f"{name}: {got.dtype} is not {want}"
        assert got.shape == concrete(want.shape, drawn.sizes), f"{name}: {list(got.shape)} is not {want}"
        if want.dtype.is_float:
            assert not np.isnan(got.astype(np.float32)).any(), f"{name} has NaN from finite inputs"
    for name, t in graph.state.items():
        assert state[name].dtype == t.dtype.numpy and state[name].shape == concrete(t.shape, drawn.sizes)
        assert not np.isnan(state[name].astype(np.float32)).any()


@RANDOM
@given(graphs())
def test_random_graph_verifies_and_round_trips(drawn: Drawn) -> None:
    check_valid(drawn)


@RANDOM
@given(graphs())
def test_reference_runs_random_graph(drawn: Drawn) -> None:
    check_runs(drawn)


@pytest.mark.parametrize("op", sorted(OPS))
@PER_OP
@given(data=st.data())
def test_every_op_in_a_random_graph(op: str, data: st.DataObject) -> None:
    drawn = data.draw(graphs(first=op, min_steps=0, max_steps=2))
    assert op in drawn.ops
    check_valid(drawn)
    check_runs(drawn)


# --- malformed graphs --------------------------------------------------------------------------------


def assert_user_error(fn: Callable[[], Any]) -> UserError:
    """`fn` raises UserError (no other exception), with a one-line message."""
    try:
        fn()
    except UserError as e:
        assert str(e) and "\n" not in str(e), f"not one line: {e!s}"
        return e
    raise AssertionError("no UserError was raised")


def via_json(graph: Graph) -> None:
    verify(from_dict(json.loads(to_json(graph)), "mutated.json"))


def _replace_node(graph: Graph, i: int, **changes: Any) -> Graph:
    g = graph.copy()
    g.nodes[i] = replace(g.nodes[i], **changes)
    return g


def _wrong_value(kind: str) -> list[Any]:
    """Values of the wrong kind for an attribute of `kind` (JSON-representable)."""
    common: list[Any] = [{"x": 1}, [[1]]]
    return (
        common
        + {
            "bool": [1, "true", None, 0.0],
            "int": [1.5, "3", True, None],
            "optint": [1.5, "3", False],
            "float": ["0.5", True, None, [0.5]],
            "floats": ["0.5", 3, [True], ["a"], [None]],
            "str": [1, None, True, "not-a-choice"],
            "dtype": ["float7", 5, None, "F32x"],
            "dims": ["batch", 3, [1.5], [True], [-1]],
            "ints": ["0", 3, [0.5], ["a"], [False]],
        }[kind]
    )


MUTATIONS = ["drop-input", "undefined-input", "wrong-attr", "param-rank", "duplicate-node-name", "bad-output"]


@st.composite
def mutants(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[str, Graph]:
    drawn = draw(graphs(max_steps=4))
    graph = drawn.graph
    kinds = [m for m in MUTATIONS if m != "duplicate-node-name" or len(graph.nodes) >= 2]
    if not graph.params:
        kinds.remove("param-rank")
    minimal = [i for i, n in enumerate(graph.nodes) if len(n.inputs) == OPS[n.op].arity[0]]
    with_attrs = [i for i, n in enumerate(graph.nodes) if OPS[n.op].attrs]
    kinds = [k for k in kinds if (k != "drop-input" or minimal) and (k != "wrong-attr" or with_attrs)]
    kind = draw(st.sampled_from(kinds))
    if kind == "drop-input":  # below the op's arity
        i = draw(st.sampled_from(minimal))
        inputs = list(graph.nodes[i].inputs)
        del inputs[draw(st.integers(0, len(inputs) - 1))]
        return kind, _replace_node(graph, i, inputs=tuple(inputs))
    if kind == "undefined-input":
        i = draw(st.integers(0, len(graph.nodes) - 1))
        inputs = list(graph.nodes[i].inputs)
        inputs[draw(st.integers(0, len(inputs) - 1))] = draw(st.sampled_from(["nowhere", "", "in0", "w 1"]))
        return kind, _replace_node(graph, i, inputs=tuple(inputs))
    if kind == "wrong-attr":
        i = draw(st.sampled_from(with_attrs))
        node = graph.nodes[i]
        key = draw(st.sampled_from(sorted(OPS[node.op].attrs)))
        spec = OPS[node.op].attrs[key]
        bad = [v for v in _wrong_value(spec.kind) if not (spec.kind == "str" and v in spec.choices)]
        return kind, _replace_node(graph, i, attrs={**node.attrs, key: draw(st.sampled_from(bad))})
    if kind == "param-rank":  # every param is a weight whose op checks its rank
        name = draw(st.sampled_from(sorted(graph.params)))
        g = graph.copy()
        t = g.params[name]
        g.params[name] = TensorType(t.dtype, (*t.shape, draw(st.integers(2, 3))))
        return kind, g
    if kind == "duplicate-node-name":
        i, j = draw(st.lists(st.integers(0, len(graph.nodes) - 1), min_size=2, max_size=2, unique=True))
        return kind, _replace_node(graph, j, name=graph.nodes[i].name)
    g = graph.copy()  # bad-output
    if draw(st.booleans()):
        g.outputs = {}
    else:
        g.outputs = {**g.outputs, "extra": "undefined.value"}
    return kind, g


@RANDOM
@given(mutants())
def test_mutated_graph_raises_user_error(mutant: tuple[str, Graph]) -> None:
    kind, graph = mutant
    note(kind)
    assert_user_error(lambda: verify(graph))
    assert_user_error(lambda: via_json(graph))  # from_dict or verify rejects it


@RANDOM
@given(graphs(max_steps=3), st.data())
def test_truncated_json_raises_user_error(drawn: Drawn, data: st.DataObject) -> None:
    text = to_json(drawn.graph, indent=data.draw(st.sampled_from([None, 1])))
    cut = data.draw(st.integers(0, len(text) - 1))
    error = assert_user_error(lambda: from_json(text[:cut], "cut.json"))
    assert str(error).startswith("cut.json: not valid JSON")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@RANDOM
@given(st.text(max_size=60) | JSON.map(json.dumps))
def test_junk_text_raises_user_error(text: str) -> None:
    error = assert_user_error(lambda: from_json(text, "junk.json"))
    assert str(error).startswith("junk.json: ")


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*prefix, i))
    return out


def _known_bug(d: Any) -> bool:
    """Mutations that reach bugs reported by strict xfails in tests/unit/test_ir.py (drop each case
    when its bug is fixed): a non-object meta, node inputs/outputs that are not lists, and rank-0 or
    zero-sized tensors (shape inference crashes with IndexError / ZeroDivisionError)."""

    def items(value: Any) -> list[Any]:
        return list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []

    def degenerate(shape: Any) -> bool:
        return isinstance(shape, list) and (not shape or 0 in shape)

    if not isinstance(d, dict):
        return False
    if "meta" in d and not isinstance(d["meta"], dict):
        return True
    nodes = [n for n in items(d.get("nodes")) if isinstance(n, dict)]
    if any(k in n and not isinstance(n[k], list) for n in nodes for k in ("inputs", "outputs")):
        return True
    types = [t for key in ("inputs", "params", "state") for t in items(d.get(key)) if isinstance(t, dict)]
    if any(degenerate(t.get("shape")) for t in types):
        return True
    # a reshape to rank 0 makes a rank-0 activation too
    return any(isinstance(n.get("attrs"), dict) and degenerate(n["attrs"].get("shape")) for n in nodes)


def _has_newline(value: Any) -> bool:
    if isinstance(value, str):
        return "\n" in value
    if isinstance(value, dict):
        return any(_has_newline(k) or _has_newline(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_newline(v) for v in value)


@RANDOM
@given(graphs(max_steps=3), st.data())
def test_json_with_a_junk_subtree_reads_or_raises_user_error(drawn: Drawn, data: st.DataObject) -> None:
    """Any part of a valid graph's JSON replaced by junk: the graph reads and verifies, or a UserError."""
    d = to_dict(drawn.graph)
    path = data.draw(st.sampled_from(_paths(d)))
    junk = data.draw(JSON)
    mutated = copy.deepcopy(d)
    target = mutated
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = junk
    note(f"{path} = {junk!r}")
    if _known_bug(mutated):
        return
    try:
        graph = from_dict(mutated, "junk.json")
        types = verify(graph)
    except UserError as e:
        # Known bug (strict xfail in test_ir.py): names are quoted verbatim, newline and all.
        assert str(e) and ("\n" not in str(e) or _has_newline(junk)), f"not one line: {e!s}"
        return
    # Still valid: then it still round-trips.
    assert from_json(to_json(graph)) == graph
    assert verify(from_json(to_json(graph))) == types
