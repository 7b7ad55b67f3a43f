"""The conformance table: one OpInfo-style entry per op of the op table (and per variant worth its own
row), plus the fused patterns a backend opts into.

An entry says how to build a small graph around its op (leaves as graph inputs and params, symbolic
dims where the op allows them), how to draw fresh random sample inputs for it, and which dtypes it is
checked in. The tests in this folder run every entry × dtype × backend against `polymorph.ir.reference`
with `polymorph.verify.tolerance.op_tolerance` of each output's dtype.

Known bugs are part of the table, as OpInfo's `skips`: an entry lists the (test, dtype, backend) cases
a bug in non-test code breaks, and those run as strict xfails that expect the bug's exception. When the
bug is fixed they XPASS, which fails: delete the `KnownBug` then.

`pytest_generate_tests` below parametrizes every test here that asks for `entry`, `dtype` and
`backend_name`, with ids like `rmsnorm-bf16-cpu` (a variant: `gelu.tanh-f32-cpu`). Backends come from
the registry's names (no import, no probe); the tests probe lazily and skip with the probe's reason,
and skip the cases a backend does not declare (test_ops.py: `required_patterns`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.ir.shapes import concrete
from polymorph.pipeline.backend import registry

F32, BF16, F16, I32, I64 = DType.F32, DType.BF16, DType.F16, DType.I32, DType.I64
F8E4M3, F8E5M2 = DType.F8E4M3, DType.F8E5M2
FLOATS = (F32, BF16, F16)
FP8 = (F8E4M3, F8E5M2)

# Every float input that an entry does not pin down is drawn from each of these in turn.
DISTRIBUTIONS = ("normal", "uniform", "outliers")

BLOCK_SIZE = 4  # paged-KV block size of every paged entry: small, so a few steps cross blocks


# --- samples -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One set of arrays for an entry's graph: params, then the inputs of each step in order (state,
    the paged KV cache, carries over from step to step; it starts zero-filled with `cache_blocks`)."""

    label: str
    params: dict[str, np.ndarray]
    steps: tuple[dict[str, np.ndarray], ...]
    cache_blocks: int = 1


def draw(
    rng: np.random.Generator, shape: Sequence[int], dtype: DType, dist: str, large: float = 100.0
) -> np.ndarray:
    """Floats of `dist` stored in `dtype`: normal, uniform in ±`large`, or normal with ~2% outliers."""
    shape = tuple(shape)
    if dist == "normal":
        x = rng.standard_normal(shape)
    elif dist == "uniform":
        x = rng.uniform(-large, large, shape)
    elif dist == "outliers":
        x = rng.standard_normal(shape)
        hit = rng.random(shape) < 0.02
        hit.flat[rng.integers(x.size)] = True  # at least one
        x = np.where(hit, rng.choice([-1.0, 1.0], shape) * rng.uniform(0.2, 1.0, shape) * large, x)
    else:
        raise ValueError(f"unknown distribution `{dist}`")
    return x.astype(np.float32).astype(dtype.numpy)


IntGen = Callable[[np.random.Generator, tuple[int, ...], Mapping[str, int]], np.ndarray]


def ids_below(n: int | str) -> IntGen:
    """Uniform ids in [0, n) (n an int or the name of a size), both ends always present."""

    def gen(rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]) -> np.ndarray:
        hi = int(sizes[n]) if isinstance(n, str) else n
        x = rng.integers(0, hi, shape)
        if x.size >= 2:
            x.flat[rng.choice(x.size, 2, replace=False)] = (0, hi - 1)
        return x

    return gen


def context_positions(
    rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]
) -> np.ndarray:
    """positions[B, S] of the last S tokens of ragged sequences that fit their block tables."""
    b, s = shape
    room = sizes["ctx_blocks"] * BLOCK_SIZE
    lengths = rng.integers(s, room + 1, b)  # context length of each sequence, this step included
    lengths[rng.integers(b)] = room  # one sequence fills its table
    return lengths[:, None] - s + np.arange(s)[None, :]


def distinct_experts(k: int) -> IntGen:
    def gen(rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]) -> np.ndarray:
        return np.argsort(rng.random((*shape[:-1], sizes["experts"])), axis=-1)[..., :k]

    return gen


def leaf_samples(
    sizes: Sequence[Mapping[str, int]],
    *,
    wide: Sequence[str] | None = None,
    ints: Mapping[str, IntGen] | None = None,
    scale: Mapping[str, float] | None = None,
    large: float = 100.0,
    dists: Sequence[str] = DISTRIBUTIONS,
    fix: Callable[[dict[str, np.ndarray], np.random.Generator], None] | None = None,
) -> Callable[[Graph, DType, np.random.Generator], list[Sample]]:
    """Samples for a one-step graph: one per distribution of `dists`, each at one of `sizes` (symbol
    values) in turn, starting from the second (every size and every distribution is drawn, not every
    pair: fresh inputs each run cover the rest over time, and a slow backend stays affordable).

    A float leaf named in `wide` (default: every float graph input) is drawn from the distribution;
    other float leaves are normal. `scale` multiplies a leaf; `ints` draws each integer leaf; `fix`
    edits the arrays last (to make routing logits tie-free, say).
    """
    ints, scale = dict(ints or {}), dict(scale or {})

    def samples(graph: Graph, dtype: DType, rng: np.random.Generator) -> list[Sample]:
        out = []
        varied = set(graph.inputs) if wide is None else set(wide)
        for i in range(max(len(sizes), len(dists))):
            size, dist = sizes[(i + 1) % len(sizes)], dists[i % len(dists)]
            arrays: dict[str, np.ndarray] = {}
            for name, t in {**graph.inputs, **graph.params}.items():
                shape = concrete(t.shape, size)
                if t.dtype.is_int:
                    arrays[name] = ints[name](rng, shape, size).astype(t.dtype.numpy)
                else:
                    x = draw(rng, shape, F32, dist if name in varied else "normal", large)
                    arrays[name] = (x * np.float32(scale.get(name, 1.0))).astype(t.dtype.numpy)
            if fix is not None:
                fix(arrays, rng)
            label = f"{dist} " + " ".join(f"{k}={v}" for k, v in size.items())
            params = {k: v for k, v in arrays.items() if k in graph.params}
            inputs = {k: v for k, v in arrays.items() if k in graph.inputs}
            out.append(Sample(label, params, (inputs,), int(size.get("cache_blocks", 1))))
        return out

    return samples


def kv_write_samples(graph: Graph, dtype: DType, rng: np.random.Generator) -> list[Sample]:
    """A fill step that writes every slot of the cache with random values (so the next steps start
    from random content, not zeros), then steps that write a few slots: a prefill at contiguous
    positions, a decode batch, a batch at scattered positions. Two blocks are never in a table."""
    t = graph.inputs["x"]
    heads, head_dim = t.shape[2], t.shape[3]
    out = []
    for dist, (batch, seq, ctx_blocks, scattered) in zip(
        DISTRIBUTIONS, [(1, 7, 3, False), (3, 1, 2, False), (2, 3, 2, True)], strict=True
    ):
        cache_blocks = batch * ctx_blocks + 2
        slots = cache_blocks * BLOCK_SIZE
        fill = {
            "x": draw(rng, (1, slots, heads, head_dim), dtype, dist),
            "block_table": rng.permutation(cache_blocks)[None, :].astype(np.int32),
            "positions": np.arange(slots, dtype=np.int32)[None, :],
        }
        steps = [fill]
        for _ in range(2):  # the second write overwrites some slots of the first
            table = rng.permutation(cache_blocks)[: batch * ctx_blocks].reshape(batch, ctx_blocks)
            room = ctx_blocks * BLOCK_SIZE
            if scattered:
                pos = np.stack([rng.choice(room, seq, replace=False) for _ in range(batch)])
            else:
                pos = rng.integers(0, room - seq + 1, (batch, 1)) + np.arange(seq)[None, :]
            x = draw(rng, (batch, seq, heads, head_dim), dtype, dist)
            steps.append({"x": x, "block_table": table.astype(np.int32), "positions": pos.astype(np.int32)})
        out.append(
            Sample(f"{dist} batch={batch} seq={seq} ctx_blocks={ctx_blocks}", {}, tuple(steps), cache_blocks)
        )
    return out


def untie_router_logits(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Redraw every row of router logits that has equal values (tie order is checked on its own)."""
    x = arrays["logits"]
    flat = x.reshape(-1, x.shape[-1])
    for row in flat:
        if len(np.unique(row.astype(np.float32))) < row.size:
            row[...] = (rng.permutation(row.size) - row.size / 2).astype(x.dtype)  # distinct integers
    arrays["logits"] = flat.reshape(x.shape)


def tied_router_logits(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Logits with ties: small integers, and one row of all-equal values."""
    x = arrays["logits"]
    ties = rng.integers(-2, 3, x.shape).astype(x.dtype)
    ties.reshape(-1, x.shape[-1])[0] = 0
    arrays["logits"] = ties


def overflow_f8(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Values past the largest finite fp8 e4m3 value (448) in both signs."""
    x = arrays["x"]
    x.flat[: min(4, x.size)] = np.array([500.0, -1000.0, 1e4, -465.0], dtype=np.float32)[: min(4, x.size)]


# --- graphs ------------------------------------------------------------------------------------------


def one_node(
    op: str, leaves: Mapping[str, tuple[str, DType, tuple]], *, outputs: Sequence[str] = ("y",), **attrs: Any
) -> Graph:
    """A graph of one `op` node over `leaves` (name -> (kind: input|param|state, dtype, shape)), in
    order; its outputs are the graph's outputs, and a state it writes is updated."""
    b = GraphBuilder(f"conformance.{op}")
    for name, (kind, dtype, shape) in leaves.items():
        getattr(b, kind)(name, dtype, shape)
    outs = b.op(op, op, *leaves, outputs=tuple(outputs), **attrs)
    outs = (outs,) if isinstance(outs, str) else outs
    for name in outs:
        b.output(name, name)
    if op == "kv_write":
        b.update(next(n for n, (kind, _, _) in leaves.items() if kind == "state"), outs[0])
    return b.build()


def inp(dtype: DType, *shape: Any) -> tuple[str, DType, tuple]:
    return ("input", dtype, shape)


def par(dtype: DType, *shape: Any) -> tuple[str, DType, tuple]:
    return ("param", dtype, shape)


def swiglu_graph(dtype: DType, *, up_first: bool = False) -> Graph:
    # x: [B, S, 16] -> silu(x @ w_gate^T) * (x @ w_up^T): [B, S, 24]; `up_first` reorders the nodes
    # and swaps the mul's operands (the pattern matches either order)
    b = GraphBuilder("conformance.swiglu")
    x = b.input("x", dtype, ("batch", "seq", 16))
    wg = b.param("w_gate", dtype, (24, 16))
    wu = b.param("w_up", dtype, (24, 16))
    if up_first:
        up = b.op("linear", "mlp.up", x, wu)
    gate = b.op("linear", "mlp.gate", x, wg)
    act = b.op("silu", "mlp.act", gate)
    if not up_first:
        up = b.op("linear", "mlp.up", x, wu)
    b.output("y", b.op("mul", "mlp.mul", *((up, act) if up_first else (act, up))))
    return b.build()


def residual_graph(
    dtype: DType,
    *,
    proj_first: bool = False,
    x_shape: tuple = ("batch", "seq", 24),
    r_shape: tuple = ("batch", "seq", 16),
) -> Graph:
    # residual[B, S, 16] + x[B, S, 24] @ w[16, 24]^T (either may broadcast against the other)
    b = GraphBuilder("conformance.linear_residual")
    x = b.input("x", dtype, x_shape)
    r = b.input("residual", dtype, r_shape)
    w = b.param("w", dtype, (16, 24))
    proj = b.op("linear", "o_proj", x, w)
    b.output("y", b.op("add", "residual_add", *((proj, r) if proj_first else (r, proj))))
    return b.build()


def mlp_graph(dtype: DType) -> Graph:
    # A whole SwiGLU MLP with its residual: both cpu patterns in one graph.
    b = GraphBuilder("conformance.mlp")
    x = b.input("x", dtype, ("batch", "seq", 16))
    wg = b.param("w_gate", dtype, (24, 16))
    wu = b.param("w_up", dtype, (24, 16))
    wd = b.param("w_down", dtype, (16, 24))
    act = b.op("silu", "mlp.act", b.op("linear", "mlp.gate", x, wg))
    h = b.op("mul", "mlp.mul", act, b.op("linear", "mlp.up", x, wu))
    b.output("y", b.op("add", "mlp.residual", x, b.op("linear", "mlp.down", h, wd)))
    return b.build()


# --- the table ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownBug:
    """A bug in non-test code that breaks an entry's cases in `dtypes` on `backends` in `tests` (None:
    all of them). Those cases run as strict xfails; delete the KnownBug when they XPASS."""

    reason: str
    raises: type[BaseException] = AssertionError  # what the broken case raises
    dtypes: tuple[DType, ...] | None = None
    backends: tuple[str, ...] | None = None
    tests: tuple[str, ...] | None = None

    def applies(self, test: str, dtype: DType, backend: str) -> bool:
        return all(
            allowed is None or value in allowed
            for value, allowed in ((test, self.tests), (dtype, self.dtypes), (backend, self.backends))
        )


@dataclass(frozen=True)
class OpInfo:
    """One row: `name` is the test id (`op` or `op.variant`); `op` is the op or fused pattern it checks."""

    name: str
    op: str
    build: Callable[[DType], Graph]
    samples: Callable[[Graph, DType, np.random.Generator], list[Sample]]
    dtypes: tuple[DType, ...] = FLOATS
    patterns: tuple[str, ...] = ()  # fused patterns it checks (a plan has those its backend declares)
    fusion_required: bool = True  # False: a backend may fuse the group or run it op by op
    known_bugs: tuple[KnownBug, ...] = field(default=())

    def known_bug(self, test: str, dtype: DType, backend: str) -> KnownBug | None:
        return next((bug for bug in self.known_bugs if bug.applies(test, dtype, backend)), None)


BATCH_SEQ = [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 7}]
ROWS = [{"batch": 1}, {"batch": 7}]
PAGED = [
    {"batch": 1, "seq": 7, "ctx_blocks": 3, "cache_blocks": 5},  # a prefill
    {"batch": 3, "seq": 1, "ctx_blocks": 4, "cache_blocks": 16},  # a decode batch
]
# the windowed cache_attention rows: PAGED and a ragged batch of 3-token chunks over 6-block tables
PAGED_WINDOWED = [*PAGED, {"batch": 3, "seq": 3, "ctx_blocks": 6, "cache_blocks": 20}]


def _ints(lo: int, hi: int) -> IntGen:
    return lambda rng, shape, sizes: rng.integers(lo, hi, shape)


# fmt: off
def _entries() -> list[OpInfo]:
    e: list[OpInfo] = []
    add = e.append

    # --- lookup and projections
    add(OpInfo("embedding", "embedding",
               lambda d: one_node("embedding", {"table": par(d, 37, 16), "ids": inp(I32, "batch", "seq")}),
               leaf_samples(BATCH_SEQ, wide=["table"], ints={"ids": ids_below(37)}),
               dtypes=(*FLOATS, *FP8)))
    add(OpInfo("embedding.i64", "embedding",
               lambda d: one_node("embedding", {"table": par(d, 37, 16), "ids": inp(I64, "batch", 3)}),
               leaf_samples(ROWS, wide=["table"], ints={"ids": ids_below(37)})))
    add(OpInfo("linear", "linear",
               lambda d: one_node("linear", {"x": inp(d, "batch", "seq", 16), "w": par(d, 7, 16)}),
               leaf_samples(BATCH_SEQ, scale={"w": 0.25})))
    add(OpInfo("linear.bias", "linear",
               lambda d: one_node("linear", {"x": inp(d, "batch", 3), "w": par(d, 16, 3), "b": par(d, 16)}),
               leaf_samples(ROWS)))
    # MLA's absorbed up-projections: 3 heads, each its own [N, K]
    add(OpInfo("head_linear", "head_linear",
               lambda d: one_node("head_linear", {"x": inp(d, "batch", "seq", 3, 16), "w": par(d, 3, 12, 16)}),
               leaf_samples(BATCH_SEQ, scale={"w": 0.25})))
    add(OpInfo("matmul", "matmul",
               lambda d: one_node("matmul", {"a": inp(d, "batch", 3, 16), "b": inp(d, "batch", 16, 7)}),
               leaf_samples(ROWS, wide=["a"], scale={"b": 0.25})))
    add(OpInfo("matmul.broadcast", "matmul",
               lambda d: one_node("matmul", {"a": inp(d, 2, "batch", 7, 16), "b": par(d, 1, 16, 3)}),
               leaf_samples(ROWS, scale={"b": 0.25})))

    # --- normalization and position
    add(OpInfo("rmsnorm", "rmsnorm",
               lambda d: one_node("rmsnorm", {"x": inp(d, "batch", "seq", 16), "w": par(d, 16)}, eps=1e-6),
               leaf_samples(BATCH_SEQ)))
    add(OpInfo("layernorm", "layernorm",
               lambda d: one_node("layernorm", {"x": inp(d, "batch", 7), "w": par(d, 7), "b": par(d, 7)}),
               leaf_samples(ROWS)))

    def rope(**attrs: Any) -> Callable[[DType], Graph]:
        return lambda d: one_node("rope", {"x": inp(d, "batch", "seq", 3, 16),
                                           "positions": inp(I32, "batch", "seq")}, **attrs)

    rope_samples = leaf_samples(BATCH_SEQ, ints={"positions": _ints(0, 4096)})
    add(OpInfo("rope", "rope", rope(), rope_samples))
    # Llama 4's temperature: floor_scale 64 over positions up to 4096 gives factors 1 to ~1.4
    add(OpInfo("attn_temperature", "attn_temperature",
               lambda d: one_node("attn_temperature", {"x": inp(d, "batch", "seq", 3, 16),
                                                       "positions": inp(I32, "batch", "seq")},
                                  floor_scale=64.0, scale=0.1), rope_samples))
    add(OpInfo("rope.llama3", "rope",
               rope(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64),
               rope_samples))
    # The other rope types (tests/unit/test_rope_types.py checks their frequencies against transformers).
    # dynamic and longrope pick their frequencies per call from max(positions) + 1: positions below
    # 4096 cross the boundaries (1024 and 2048) in most samples; `.short` keeps longrope below its own.
    longrope = dict(rope_type="longrope", original_max_position_embeddings=2048, factor=16.0,
                    attention_factor=1.1677484162422844,  # sqrt(1 + ln 16 / ln 2048)
                    short_factor=[1.0, 1.1, 1.25, 1.5, 2.0, 3.0], long_factor=[1.0, 2.0, 4.0, 9.0, 17.0, 31.0],
                    rotary_dim=12)
    for name, attrs in (
        ("linear", dict(rope_type="linear", factor=4.0)),
        # yarn's attention factors: mscale 0.1 ln(4) + 1, and mscale 0.707 over mscale_all_dim 1 at factor 8
        ("yarn", dict(theta=1e6, rope_type="yarn", factor=4.0, original_max_position_embeddings=512,
                      attention_factor=1.1386294361119891)),
        ("yarn.partial", dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=256, beta_fast=16.0,
                              truncate=False, rotary_dim=8, attention_factor=0.9495608824621653)),
        ("longrope", longrope),
        ("partial", dict(theta=500000.0, rotary_dim=8)),
        ("attention_factor", dict(rope_type="linear", factor=2.0, attention_factor=1.3, rotary_dim=14)),
    ):
        add(OpInfo(f"rope.{name}", "rope", rope(**attrs), rope_samples))
    add(OpInfo("rope.longrope.short", "rope", rope(**longrope),
               leaf_samples(BATCH_SEQ, ints={"positions": _ints(0, 2048)})))
    # dynamic grows its base on the device in float32 (kernels/xla/rope.py), a few ulp from the float64
    # reference: positions stay below 48 (past max_position_embeddings 8 in most samples), where that
    # moves an angle by less than the f32 tolerance
    add(OpInfo("rope.dynamic", "rope", rope(rope_type="dynamic", factor=4.0, max_position_embeddings=8),
               leaf_samples(BATCH_SEQ, ints={"positions": _ints(0, 48)})))

    # --- attention and the KV cache
    add(OpInfo("kv_write", "kv_write",
               lambda d: one_node("kv_write", {"cache": ("state", d, ("cache_blocks", BLOCK_SIZE, 3, 16)),
                                               "x": inp(d, "batch", "seq", 3, 16),
                                               "block_table": inp(I32, "batch", "ctx_blocks"),
                                               "positions": inp(I32, "batch", "seq")}),
               kv_write_samples, dtypes=(*FLOATS, *FP8)))
    # q: [B, S, 6, 16], k/v: [B, S, 3, 16]: two query heads per kv head. Only v takes the wide
    # distributions: large q and k make the softmax ill-conditioned, not the kernel wrong.
    add(OpInfo("attention", "attention",
               lambda d: one_node("attention", {"q": inp(d, "batch", "seq", 6, 16),
                                                "k": inp(d, "batch", "seq", 3, 16),
                                                "v": inp(d, "batch", "seq", 3, 16)}, scale=0.25),
               leaf_samples(BATCH_SEQ, wide=["v"], large=10.0)))
    add(OpInfo("attention.noncausal", "attention",
               lambda d: one_node("attention", {"q": inp(d, "batch", 3, 6, 16),
                                                "k": inp(d, "batch", "kv_len", 2, 16),
                                                "v": inp(d, "batch", "kv_len", 2, 16)}, scale=0.25, causal=False),
               leaf_samples([{"batch": 1, "kv_len": 1}, {"batch": 2, "kv_len": 16}], wide=["v"], large=10.0)))
    # sliding windows shorter (3) and longer (64) than the 7-token sequences; soft-capped scores (scale
    # 0.5: scores of a few units, where the cap of 2 bends them)
    for name, attrs in (("window3", {"window": 3}), ("window64", {"window": 64}),
                        ("softcap", {"softcap": 2.0}), ("window3_softcap", {"window": 3, "softcap": 2.0})):
        add(OpInfo(f"attention.{name}", "attention",
                   lambda d, attrs=attrs: one_node("attention", {"q": inp(d, "batch", "seq", 6, 16),
                                                                 "k": inp(d, "batch", "seq", 3, 16),
                                                                 "v": inp(d, "batch", "seq", 3, 16)},
                                                   scale=0.5, **attrs),
                   leaf_samples(BATCH_SEQ, wide=["v"], large=10.0)))

    def cache_attention(q_dtype: DType | None = None, scale: float = 0.25, **attrs: Any) -> Callable[[DType], Graph]:
        return lambda d: one_node("cache_attention", {
            "q": inp(q_dtype or d, "batch", "seq", 4, 16),
            "k_cache": inp(d, "cache_blocks", BLOCK_SIZE, 2, 16),
            "v_cache": inp(d, "cache_blocks", BLOCK_SIZE, 2, 16),
            "block_table": inp(I32, "batch", "ctx_blocks"),
            "positions": inp(I32, "batch", "seq")}, scale=scale, **attrs)

    paged_samples = leaf_samples(PAGED, wide=["v_cache"], large=10.0,
                                 ints={"block_table": ids_below("cache_blocks"), "positions": context_positions})
    add(OpInfo("cache_attention", "cache_attention", cache_attention(), paged_samples))
    # an fp8 KV cache read by bf16 queries
    add(OpInfo("cache_attention.f8cache", "cache_attention", cache_attention(BF16), paged_samples, dtypes=FP8))
    # Sliding windows shorter than the contexts (3: inside one or two blocks; 6: across blocks) and
    # longer (100), soft-capped scores; PAGED_WINDOWED adds a ragged batch of 3-token chunks.
    windowed_samples = leaf_samples(PAGED_WINDOWED, wide=["v_cache"], large=10.0,
                                    ints={"block_table": ids_below("cache_blocks"), "positions": context_positions})
    for name, attrs in (("window3", {"window": 3}), ("window6", {"window": 6}), ("window100", {"window": 100}),
                        ("softcap", {"softcap": 2.0}), ("window6_softcap", {"window": 6, "softcap": 2.0})):
        add(OpInfo(f"cache_attention.{name}", "cache_attention", cache_attention(scale=0.5, **attrs),
                   windowed_samples))

    # --- elementwise
    def unary(op: str, **attrs: Any) -> Callable[[DType], Graph]:
        return lambda d: one_node(op, {"x": inp(d, "batch", "seq", 16)}, **attrs)

    add(OpInfo("silu", "silu", unary("silu"), leaf_samples(BATCH_SEQ)))
    add(OpInfo("gelu", "gelu", unary("gelu"), leaf_samples(BATCH_SEQ)))
    add(OpInfo("gelu.tanh", "gelu", unary("gelu", approximate="tanh"), leaf_samples(BATCH_SEQ)))
    add(OpInfo("scale", "scale", unary("scale", factor=0.37), leaf_samples(BATCH_SEQ)))
    # Gemma's embedding normalizer sqrt(hidden_size), rounded to the activation dtype first
    add(OpInfo("scale.rounded", "scale", unary("scale", factor=2048**0.5, round_factor_to_dtype=True),
               leaf_samples(BATCH_SEQ)))
    # Gemma 2's final logit cap of 30: the uniform and outlier samples (|x| up to 100) saturate it
    add(OpInfo("softcap", "softcap", unary("softcap", cap=30.0), leaf_samples(BATCH_SEQ)))
    for op in ("mul", "add"):
        add(OpInfo(op, op, lambda d, op=op: one_node(op, {"a": inp(d, "batch", 7), "b": inp(d, "batch", 7)}),
                   leaf_samples(ROWS)))
        # [B, 1, 16] with [S, 16] -> [B, S, 16]
        add(OpInfo(f"{op}.broadcast", op,
                   lambda d, op=op: one_node(op, {"a": inp(d, "batch", 1, 16), "b": inp(d, "seq", 16)}),
                   leaf_samples(BATCH_SEQ)))
        # a weight [16] with an activation [B, S, 16]
        add(OpInfo(f"{op}.param", op,
                   lambda d, op=op: one_node(op, {"a": par(d, 16), "b": inp(d, "batch", "seq", 16)}),
                   leaf_samples(BATCH_SEQ)))
    add(OpInfo("softmax", "softmax", unary("softmax"), leaf_samples(BATCH_SEQ, large=30.0)))
    add(OpInfo("softmax.axis1", "softmax", unary("softmax", axis=1), leaf_samples(BATCH_SEQ, large=30.0)))
    add(OpInfo("argmax", "argmax", unary("argmax"), leaf_samples(BATCH_SEQ, ints={"x": _ints(-2**20, 2**20)}),
               dtypes=(*FLOATS, I32)))
    add(OpInfo("argmax.axis0", "argmax", lambda d: one_node("argmax", {"x": inp(d, 7, "batch")}, axis=0),
               leaf_samples(ROWS)))

    # --- mixture of experts
    def router(**attrs: Any) -> Callable[[DType], Graph]:
        return lambda d: one_node("topk_router", {"logits": inp(d, "batch", 8)},
                                  outputs=("weights", "indices"), **attrs)

    untied = leaf_samples(ROWS, large=8.0, fix=untie_router_logits)
    add(OpInfo("topk_router", "topk_router", router(k=2), untied))
    add(OpInfo("topk_router.softmax_topk", "topk_router", router(k=2, mode="softmax_topk"), untied))
    add(OpInfo("topk_router.softmax_topk_norm", "topk_router",
               router(k=2, mode="softmax_topk", normalize=True), untied))
    add(OpInfo("topk_router.ties", "topk_router", router(k=3),
               leaf_samples(ROWS, dists=("normal",), fix=tied_router_logits)))
    # x: [B, 16], 2 of 4 experts per token, ffn 24. Its activations grow as x², so "large" is 10.
    add(OpInfo("moe_ffn", "moe_ffn",
               lambda d: one_node("moe_ffn", {"x": inp(d, "batch", 16), "weights": inp(F32, "batch", 2),
                                              "indices": inp(I32, "batch", 2), "w_gate": par(d, 4, 24, 16),
                                              "w_up": par(d, 4, 24, 16), "w_down": par(d, 4, 16, 24)}),
               leaf_samples([{"batch": 1, "experts": 4}, {"batch": 7, "experts": 4}], wide=["x"], large=10.0,
                            ints={"indices": distinct_experts(2)},
                            scale={"w_gate": 0.25, "w_up": 0.25, "w_down": 0.2})))

    # --- layout: no float requirement in the op table, so fp8 and i32 too
    def layout(name: str, op: str, leaves: Mapping[str, Any], sizes: Sequence[Mapping[str, int]],
               **attrs: Any) -> OpInfo:
        return OpInfo(name, op, lambda d: one_node(op, {k: inp(d, *v) for k, v in leaves.items()}, **attrs),
                      leaf_samples(sizes, ints={k: _ints(-2**31, 2**31 - 1) for k in leaves}),
                      dtypes=(*FLOATS, *FP8, I32))

    add(layout("reshape", "reshape", {"x": ("batch", "seq", 16)}, BATCH_SEQ, shape=("batch", "seq", 4, 4)))
    add(layout("reshape.flatten", "reshape", {"x": ("batch", 3, 16)}, ROWS, shape=("batch", 48)))
    add(layout("transpose", "transpose", {"x": ("batch", "seq", 3, 16)}, BATCH_SEQ, perm=(0, 2, 1, 3)))
    add(layout("slice", "slice", {"x": ("batch", 16)}, ROWS, axis=-1, start=3, end=10))
    # the last token of a symbolic sequence (the lm_head's input)
    add(layout("slice.last", "slice", {"x": ("batch", "seq", 16)}, BATCH_SEQ, axis=1, start=-1))
    add(layout("concat", "concat", {"a": ("batch", 3), "b": ("batch", 16), "c": ("batch", 1)}, ROWS, axis=-1))
    add(layout("concat.axis0", "concat", {"a": (1, "seq", 4), "b": (7, "seq", 4)}, [{"seq": 1}, {"seq": 3}],
               axis=0))

    # cast: the entry's dtype is the narrow side, f32 (or i32) the other
    def cast(src: DType, dst: DType) -> Graph:
        return one_node("cast", {"x": inp(src, "batch", "seq", 16)}, dtype=dst.value)

    narrow = (BF16, F16, *FP8)
    add(OpInfo("cast.down", "cast", lambda d: cast(F32, d), leaf_samples(BATCH_SEQ), dtypes=narrow))
    add(OpInfo("cast.up", "cast", lambda d: cast(d, F32), leaf_samples(BATCH_SEQ), dtypes=narrow))
    add(OpInfo("cast.f8_overflow", "cast", lambda d: cast(F32, d),
               leaf_samples([{"batch": 2, "seq": 3}], dists=("normal",), fix=overflow_f8),
               dtypes=(F8E4M3,)))
    add(OpInfo("cast.to_int", "cast", lambda d: cast(d, I32), leaf_samples(BATCH_SEQ)))
    add(OpInfo("cast.from_int", "cast", lambda d: cast(I32, d),
               leaf_samples(BATCH_SEQ, ints={"x": _ints(-300, 300)})))

    # --- fused patterns (a backend that opts into one, with a kernel for it, must plan its group)
    swiglu = ("linear+silu*mul",)
    swiglu_samples = leaf_samples(BATCH_SEQ, scale={"w_gate": 0.25, "w_up": 0.25})
    add(OpInfo("linear+silu*mul", "linear+silu*mul", swiglu_graph, swiglu_samples,
               patterns=swiglu))
    add(OpInfo("linear+silu*mul.up_first", "linear+silu*mul", lambda d: swiglu_graph(d, up_first=True),
               swiglu_samples, patterns=swiglu))
    residual = ("linear+residual",)
    residual_samples = leaf_samples(BATCH_SEQ, scale={"w": 0.2})
    add(OpInfo("linear+residual", "linear+residual", residual_graph, residual_samples, patterns=residual))
    add(OpInfo("linear+residual.proj_first", "linear+residual", lambda d: residual_graph(d, proj_first=True),
               residual_samples, patterns=residual))
    add(OpInfo("linear+residual.bias_like", "linear+residual", lambda d: residual_graph(d, r_shape=(16,)),
               residual_samples, patterns=residual))
    # The projection broadcast up onto the residual: the fused kernel declines, single-op kernels run it.
    add(OpInfo("linear+residual.broadcast_proj", "linear+residual",
               lambda d: residual_graph(d, x_shape=(1, 24)), residual_samples, fusion_required=False))
    add(OpInfo("mlp", "linear+silu*mul", mlp_graph,
               leaf_samples(BATCH_SEQ, scale={"w_gate": 0.25, "w_up": 0.25, "w_down": 0.2}),
               patterns=(*swiglu, *residual)))
    # the general ops, and the routers, experts and attention of the MoE families, in files of their own
    for name in ("general_entries", "moe_entries", "attention_entries", "latent_entries"):
        e.extend(_file_entries(name))
    return e
# fmt: on


def _file_entries(name: str) -> list[OpInfo]:
    """tests/conformance/<name>.py's `entries(globals())`, or none where the file is absent."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name(f"{name}.py")
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.entries(globals())


OP_TABLE: tuple[OpInfo, ...] = tuple(_entries())
assert len({e.name for e in OP_TABLE}) == len(OP_TABLE), "entry names are test ids: keep them unique"


# --- parametrization ---------------------------------------------------------------------------------


def backend_names() -> list[str]:
    """Every backend the registry knows (in-tree and entry points), without importing or probing one."""
    return registry.names()


def has_live_weights(entry: OpInfo) -> bool:
    graph = entry.build(entry.dtypes[0])
    return not graph.state and any(t.dtype.is_float for t in graph.params.values())


# Which entries each parametrized test runs; a test not named here runs the single-op entries.
TEST_ENTRIES: dict[str, Callable[[OpInfo], bool]] = {
    "test_op": lambda e: not e.patterns,
    "test_fused": lambda e: bool(e.patterns),
    "test_weights_live": has_live_weights,
}


def cases(test: str, entries: Sequence[OpInfo]) -> list[Any]:
    out = []
    for entry in entries:
        for dtype in entry.dtypes:
            for backend in backend_names():
                bug = entry.known_bug(test, dtype, backend)
                marks = [pytest.mark.xfail(strict=True, raises=bug.raises, reason=bug.reason)] if bug else []
                out.append(
                    pytest.param(entry, dtype, backend, marks=marks, id=f"{entry.name}-{dtype}-{backend}")
                )
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize every test that takes (entry, dtype, backend_name) over its entries × their dtypes ×
    every backend, with the known bugs of each case as strict xfails."""
    if {"entry", "dtype", "backend_name"} <= set(metafunc.fixturenames):
        test = metafunc.function.__name__
        keep = TEST_ENTRIES.get(test, TEST_ENTRIES["test_op"])
        metafunc.parametrize(
            ("entry", "dtype", "backend_name"), cases(test, [e for e in OP_TABLE if keep(e)])
        )


@pytest.fixture
def op_table() -> tuple[OpInfo, ...]:
    return OP_TABLE
