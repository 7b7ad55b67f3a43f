"""The op table: the closed set of ops every backend implements.

Each op declares its attributes, its shape/dtype inference, and its cost (FLOPs and bytes moved) at
concrete shapes. Each has exactly one definition in `polymorph.ir.reference`. Adding an op is a reviewed
event: it touches this table, the reference, the conformance table and every backend's kernels.

Layout conventions (the builders and every kernel follow them):
  activations  [*, D]                    leading dims are any (batch, seq, ...)
  linear       x [*, K] @ w[N, K]^T      weights in the checkpoint's [out, in] layout
  heads        [B, S, H, Dh]
  paged cache  [cache_blocks, block_size, Hkv, Dh], block_table [B, ctx_blocks] (i32 block ids),
               positions [B, S] (i32 absolute position of each token in its sequence)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Node, TensorType
from polymorph.ir.shapes import Dim, broadcast, concrete, format_shape, is_symbol, numel, same_numel


class OpError(ValueError):
    """A node's inputs or attributes break its op's contract (the verifier adds the node's name)."""


@dataclass(frozen=True)
class AttrSpec:
    kind: str  # int | float | bool | str | dtype | dims | ints | optint | floats
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


@dataclass(frozen=True)
class OpDef:
    name: str
    group: str
    arity: tuple[int, int]  # min and max number of inputs
    infer: Callable[[list[TensorType], Mapping[str, Any]], list[TensorType]]
    cost: Callable[[list[tuple[DType, tuple[int, ...]]], list[tuple[DType, tuple[int, ...]]], Mapping], Cost]
    attrs: Mapping[str, AttrSpec] = field(default_factory=dict)
    doc: str = ""


def _req(cond: bool, message: str) -> None:
    if not cond:
        raise OpError(message)


def _nbytes(t: tuple[DType, tuple[int, ...]]) -> int:
    dtype, shape = t
    return numel(shape) * dtype.itemsize


def _io_bytes(ins: Sequence, outs: Sequence) -> float:
    return float(sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs))


def _float(t: TensorType, what: str) -> None:
    _req(t.dtype.is_float, f"{what} must be a float tensor, got {t}")


def _int(t: TensorType, what: str) -> None:
    _req(t.dtype.is_int, f"{what} must be an integer tensor, got {t}")


def _same_dim(a: Dim, b: Dim, what: str) -> None:
    _req(a == b, f"{what}: {a} != {b}")


# --- shape inference and costs, op by op -------------------------------------------------------------


def _infer_embedding(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    table, ids = ins
    _req(table.rank == 2, f"table must be [vocab, dim], got {table}")
    _int(ids, "ids")
    return [TensorType(table.dtype, (*ids.shape, table.shape[1]))]


def _cost_embedding(ins, outs, attrs) -> Cost:
    # Gathers one row per id: reads the ids and the rows, writes the rows.
    return Cost(0.0, float(_nbytes(ins[1]) + 2 * _nbytes(outs[0])))


def _infer_linear(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, w = ins[0], ins[1]
    _float(x, "x")
    _req(w.rank == 2, f"weight must be [out, in], got {w}")
    _req(x.rank >= 1, "x must have at least one dim")
    _same_dim(x.shape[-1], w.shape[1], f"x {x} and weight {w} disagree on the inner dim")
    if len(ins) == 3:
        _req(ins[2].shape == (w.shape[0],), f"bias must be [{w.shape[0]}], got {ins[2]}")
    return [TensorType(x.dtype, (*x.shape[:-1], w.shape[0]))]


def _infer_head_linear(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, w = ins
    _float(x, "x")
    _req(x.rank >= 2, f"x must be [*, heads, in], got {x}")
    _req(w.rank == 3, f"weight must be [heads, out, in], got {w}")
    _same_dim(x.shape[-2], w.shape[0], f"x {x} and weight {w} disagree on the heads")
    _same_dim(x.shape[-1], w.shape[2], f"x {x} and weight {w} disagree on the inner dim")
    return [TensorType(x.dtype, (*x.shape[:-1], w.shape[1]))]


def _cost_head_linear(ins, outs, attrs) -> Cost:
    (_, xs), (_, ws) = ins[0], ins[1]
    h, n, k = ws
    return Cost(2.0 * numel(xs[:-2]) * h * n * k, _io_bytes(ins, outs))


def _cost_linear(ins, outs, attrs) -> Cost:
    (_, xs), (_, ws) = ins[0], ins[1]
    m = numel(xs[:-1])
    n, k = ws
    return Cost(2.0 * m * n * k, _io_bytes(ins, outs))


def _infer_matmul(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    a, b = ins
    _float(a, "a")
    _req(a.rank >= 2 and b.rank >= 2, f"matmul needs rank >= 2, got {a} and {b}")
    _same_dim(a.shape[-1], b.shape[-2], f"a {a} and b {b} disagree on the inner dim")
    try:
        batch = broadcast(a.shape[:-2], b.shape[:-2])
    except ValueError as e:
        raise OpError(str(e)) from None
    return [TensorType(a.dtype, (*batch, a.shape[-2], b.shape[-1]))]


def _cost_matmul(ins, outs, attrs) -> Cost:
    (_, a), (_, b) = ins
    return Cost(2.0 * numel(outs[0][1]) * a[-1], _io_bytes(ins, outs))


def _infer_norm(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x = ins[0]
    _float(x, "x")
    _req(x.rank >= 1, f"x must have at least one dim, got {x}")
    for i, p in enumerate(ins[1:], start=1):
        _req(p.shape == (x.shape[-1],), f"input {i} must be [{x.shape[-1]}], got {p}")
    return [x]


def _cost_norm(ins, outs, attrs) -> Cost:
    return Cost(4.0 * numel(ins[0][1]), _io_bytes(ins, outs))


def _infer_rope(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, pos = ins
    _float(x, "x")
    _req(x.rank == 4, f"x must be [batch, seq, heads, head_dim], got {x}")
    _int(pos, "positions")
    _req(pos.shape == x.shape[:2], f"positions must be {format_shape(x.shape[:2])}, got {pos}")
    _req(not isinstance(x.shape[3], int) or x.shape[3] % 2 == 0, "head_dim must be even")
    _check_rope_attrs(attrs, x.shape[3])
    return [x]


def _infer_attn_temperature(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, pos = ins
    _float(x, "x")
    _req(x.rank == 4, f"x must be [batch, seq, heads, head_dim], got {x}")
    _int(pos, "positions")
    _req(pos.shape == x.shape[:2], f"positions must be {format_shape(x.shape[:2])}, got {pos}")
    _req(attrs["floor_scale"] > 0, f"floor_scale must be > 0, got {attrs['floor_scale']}")
    return [x]


def rope_rotary_dim(attrs: Mapping, head_dim: int) -> int:
    """The dims a rope op rotates: the first `rotary_dim` of each head (0: all of them)."""
    return attrs["rotary_dim"] or head_dim


def _check_rope_attrs(a: Mapping, head_dim: Dim) -> None:
    rd = a["rotary_dim"]
    _req(rd >= 0 and rd % 2 == 0, f"rotary_dim must be even and >= 0 (0: the whole head), got {rd}")
    if isinstance(head_dim, int):
        _req(rd <= head_dim, f"rotary_dim {rd} exceeds head_dim {head_dim}")
    _req(a["theta"] > 0, f"theta must be > 0, got {a['theta']}")
    kind = a["rope_type"]
    if kind != "default":
        _req(a["factor"] > 0, f"{kind} rope needs factor > 0, got {a['factor']}")
    if kind == "llama3":
        # equal factors have no medium band (Llama 4 Scout): reference.rope_inv_freq
        _req(
            a["low_freq_factor"] > 0 and a["high_freq_factor"] > 0, "llama3 rope needs positive freq factors"
        )
    if kind == "dynamic":
        _req(a["max_position_embeddings"] > 0, "dynamic rope needs max_position_embeddings > 0")
        _req(rd != 2 and head_dim != 2, "dynamic rope needs more than 2 rotary dims")
    if kind in ("yarn", "longrope"):
        _req(a["original_max_position_embeddings"] > 0, f"{kind} rope needs original_max_position_embeddings")
    if kind == "longrope" and (rd or isinstance(head_dim, int)):
        half = (rd or int(head_dim)) // 2
        for key in ("short_factor", "long_factor"):
            got = len(a[key])
            _req(got == half, f"longrope `{key}` needs rotary_dim / 2 = {half} values, got {got}")


def _cost_rope(ins, outs, attrs) -> Cost:
    return Cost(3.0 * numel(ins[0][1]), _io_bytes(ins, outs))


def _infer_kv_write(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    cache, x, table, pos = ins
    _req(cache.rank == 4, f"cache must be [cache_blocks, block_size, kv_heads, head_dim], got {cache}")
    _req(x.rank == 4, f"x must be [batch, seq, kv_heads, head_dim], got {x}")
    _req(x.dtype == cache.dtype, f"x dtype {x.dtype} != cache dtype {cache.dtype}")
    _req(x.shape[2:] == cache.shape[2:], f"x {x} and cache {cache} disagree on heads/head_dim")
    _int(table, "block_table")
    _int(pos, "positions")
    _req(
        table.rank == 2 and table.shape[0] == x.shape[0], f"block_table must be [batch, blocks], got {table}"
    )
    _req(pos.shape == x.shape[:2], f"positions must be {format_shape(x.shape[:2])}, got {pos}")
    return [cache]


def _cost_kv_write(ins, outs, attrs) -> Cost:
    # Writes only the new rows; the rest of the cache is untouched.
    return Cost(0.0, 2.0 * _nbytes(ins[1]) + _nbytes(ins[3]))


def _check_gqa(q: TensorType, kv_heads: Dim, head_dim: Dim) -> None:
    _req(q.rank == 4, f"q must be [batch, seq, heads, head_dim], got {q}")
    _same_dim(q.shape[3], head_dim, "q and k/v head_dim")
    h = q.shape[2]
    if isinstance(kv_heads, int):
        _req(kv_heads > 0, "k/v have no heads")
    if isinstance(h, int) and isinstance(kv_heads, int):
        _req(h % kv_heads == 0, f"query heads {h} are not a multiple of kv heads {kv_heads}")


def _infer_attention(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    q, k, v = ins[:3]
    _float(q, "q")
    _req(k.shape == v.shape, f"k {k} and v {v} differ")
    _req(k.rank == 4, f"k must be [batch, seq_kv, kv_heads, head_dim], got {k}")
    _check_gqa(q, k.shape[2], k.shape[3])
    _same_dim(q.shape[0], k.shape[0], "q and k batch")
    if attrs["causal"]:
        _same_dim(q.shape[1], k.shape[1], "causal attention needs q and k of one length")
    _check_window_softcap(attrs, q, ins[3:])
    _req(
        not (attrs["window"] or attrs["chunk"]) or attrs["causal"], "a window or chunk needs causal attention"
    )
    return [q]


def _check_window_softcap(attrs: Mapping, q: TensorType, sinks: Sequence[TensorType]) -> None:
    _req(attrs["window"] >= 0, f"window must be >= 0 (0: full attention), got {attrs['window']}")
    _req(attrs["chunk"] >= 0, f"chunk must be >= 0 (0: no chunks), got {attrs['chunk']}")
    _req(not (attrs["window"] and attrs["chunk"]), "a window and a chunk together are not defined")
    _req(attrs["softcap"] >= 0, f"softcap must be >= 0 (0: none), got {attrs['softcap']}")
    for s in sinks:
        _float(s, "sinks")
        _req(s.rank == 1, f"sinks must be [heads], got {s}")
        _same_dim(s.shape[0], q.shape[2], "sinks and q heads")


def _windowed_keys(s: int, window: int) -> int:
    """Keys the s causal queries of positions 0..s-1 see in all under a window (0: none)."""
    w = min(window, s) if window else s
    return w * (w + 1) // 2 + (s - w) * w


def _chunked_keys(s: int, chunk: int) -> int:
    """Keys the s causal queries of positions 0..s-1 see in all under chunks of `chunk` positions."""
    r = s % chunk
    return (s // chunk) * chunk * (chunk + 1) // 2 + r * (r + 1) // 2


def _cost_attention(ins, outs, attrs) -> Cost:
    (_, q), (_, k) = ins[0], ins[1]
    b, s, h, d = q
    if attrs["chunk"]:  # causal (the verifier checks): query i sees i % chunk + 1 keys
        return Cost(4.0 * b * h * _chunked_keys(s, attrs["chunk"]) * d, _io_bytes(ins, outs))
    if attrs["window"]:  # causal (the verifier checks): query i sees min(i + 1, window) keys
        return Cost(4.0 * b * h * _windowed_keys(s, attrs["window"]) * d, _io_bytes(ins, outs))
    flops = 4.0 * b * h * s * k[1] * d
    if attrs["causal"]:
        flops /= 2
    return Cost(flops, _io_bytes(ins, outs))


def _infer_cache_attention(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    q, kc, vc, table, pos = ins[:5]
    _float(q, "q")
    _req(kc.shape == vc.shape, f"k_cache {kc} and v_cache {vc} differ")
    _req(kc.rank == 4, f"caches must be [cache_blocks, block_size, kv_heads, head_dim], got {kc}")
    _check_gqa(q, kc.shape[2], kc.shape[3])
    _int(table, "block_table")
    _int(pos, "positions")
    _req(
        table.rank == 2 and table.shape[0] == q.shape[0], f"block_table must be [batch, blocks], got {table}"
    )
    _req(pos.shape == q.shape[:2], f"positions must be {format_shape(q.shape[:2])}, got {pos}")
    _check_window_softcap(attrs, q, ins[5:])
    return [q]


def _check_paged(q: TensorType, cache: TensorType, table: TensorType, pos: TensorType, what: str) -> None:
    _req(cache.rank == 4, f"{what} must be [cache_blocks, block_size, kv_heads, dim], got {cache}")
    _int(table, "block_table")
    _int(pos, "positions")
    _req(
        table.rank == 2 and table.shape[0] == q.shape[0], f"block_table must be [batch, blocks], got {table}"
    )
    _req(pos.shape == q.shape[:2], f"positions must be {format_shape(q.shape[:2])}, got {pos}")


def _infer_indexer_topk(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    q, kc, w, table, pos = ins
    _float(q, "q")
    _req(q.rank == 4, f"q must be [batch, seq, heads, dim], got {q}")
    _check_paged(q, kc, table, pos, "the indexer cache")
    _req(kc.shape[2] == 1, f"the indexer cache has one head, got {kc}")
    _same_dim(kc.shape[3], q.shape[3], "indexer q and cache dims")
    _float(w, "indexer weights")
    _req(w.shape == q.shape[:3], f"indexer weights must be {format_shape(q.shape[:3])}, got {w}")
    _req(attrs["k"] >= 1, f"k must be >= 1, got {attrs['k']}")
    return [TensorType(DType.I32, (*q.shape[:2], attrs["k"]))]


def _cost_indexer_topk(ins, outs, attrs) -> Cost:
    (_, q), (kd, kc), (_, table) = ins[0], ins[1], ins[3]
    b, s, h, d = q
    ctx = table[1] * kc[1]
    return Cost(2.0 * b * s * h * ctx * d + 4.0 * b * s * ctx, b * ctx * d * kd.itemsize + _nbytes(ins[0]))


def _infer_index_attention(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    q, kc, vc, table, pos, selected = ins
    _float(q, "q")
    _check_paged(q, kc, table, pos, "k_cache")
    _req(kc.shape[:3] == vc.shape[:3], f"k_cache {kc} and v_cache {vc} differ")
    _check_gqa(q, kc.shape[2], kc.shape[3])
    _int(selected, "selected positions")
    _req(
        selected.rank == 3 and selected.shape[:2] == q.shape[:2],
        f"selected must be [batch, seq, k], got {selected}",
    )
    return [TensorType(q.dtype, (*q.shape[:3], vc.shape[3]))]


def _cost_index_attention(ins, outs, attrs) -> Cost:
    (_, q), (kd, kc), (_, vc), (_, sel) = ins[0], ins[1], ins[2], ins[5]
    b, s, h, d = q
    k = sel[2]
    return Cost(2.0 * b * h * s * k * (d + vc[3]), b * s * k * (kc[3] + vc[3]) * kc[2] * kd.itemsize)


def _cost_cache_attention(ins, outs, attrs) -> Cost:
    # Upper bound: every sequence attends over its whole block table, or under a window over the
    # blocks the window of its s queries covers (a kernel skips the blocks wholly outside it).
    (_, q), (kd, kc), (_, table) = ins[0], ins[1], ins[3]
    b, s, h, d = q
    block = kc[1]
    ctx = table[1] * block
    seen, read = ctx, ctx  # keys each query sees; cache positions read per sequence
    span = attrs["window"] or attrs["chunk"]  # a query sees at most that many positions
    if span:
        seen = min(ctx, span)
        # span + s - 1 positions, over whole blocks, one more where they straddle a block boundary
        read = min(ctx, (-(-(span + s - 1) // block) + 1) * block)
    kv_bytes = 2.0 * b * read * kc[2] * kc[3] * kd.itemsize
    return Cost(4.0 * b * h * s * seen * d, kv_bytes + 2.0 * _nbytes(ins[0]) + _nbytes(ins[3]))


def _infer_unary(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    _float(ins[0], "x")
    return [ins[0]]


def _infer_softcap(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    _req(attrs["cap"] > 0, f"cap must be > 0, got {attrs['cap']}")
    return _infer_unary(ins, attrs)


def _cost_elementwise(flops_per: float) -> Callable:
    def cost(ins, outs, attrs) -> Cost:
        return Cost(flops_per * numel(outs[0][1]), _io_bytes(ins, outs))

    return cost


def _infer_binary(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    a, b = ins
    _req(a.dtype == b.dtype, f"dtypes differ: {a.dtype} and {b.dtype}")
    try:
        return [TensorType(a.dtype, broadcast(a.shape, b.shape))]
    except ValueError as e:
        raise OpError(str(e)) from None


def _axis(rank: int, axis: int) -> int:
    _req(-rank <= axis < rank, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _infer_softmax(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    _float(ins[0], "x")
    _axis(ins[0].rank, attrs["axis"])
    return [ins[0]]


def _infer_topk_router(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    logits = ins[0]
    _float(logits, "router logits")
    _req(logits.rank >= 1, f"router logits must be [*, experts], got {logits}")
    k, experts, mode = attrs["k"], logits.shape[-1], attrs["mode"]
    _req(k >= 1, "k must be >= 1")
    _req(not isinstance(experts, int) or k <= experts, f"k={k} exceeds the {experts} experts")
    for bias in ins[1:]:
        _req(mode == "sigmoid_topk", f"a selection bias is defined for mode sigmoid_topk only, not {mode}")
        _float(bias, "router bias")
        _req(bias.rank == 1, f"router bias must be [experts], got {bias}")
        _same_dim(bias.shape[0], experts, "router bias and experts")
    groups, chosen = attrs["groups"], attrs["topk_groups"] or attrs["groups"]
    _req(groups >= 1 and 1 <= chosen <= groups, f"topk_groups {chosen} must be in 1..groups ({groups})")
    if groups > 1:
        _req(mode == "sigmoid_topk", f"expert groups are defined for mode sigmoid_topk only, not {mode}")
        _req(isinstance(experts, int) and experts % groups == 0, f"{experts} experts in {groups} groups")
        _req(experts // groups >= 2, "a group scores its two best experts: groups need >= 2 experts")
        _req(k <= chosen * (experts // groups), f"k={k} exceeds the experts of {chosen} groups")
    _req(attrs["scaling"] > 0, f"scaling must be > 0, got {attrs['scaling']}")
    lead = logits.shape[:-1]
    return [TensorType(DType.F32, (*lead, k)), TensorType(DType.I32, (*lead, k))]


def _cost_topk_router(ins, outs, attrs) -> Cost:
    return Cost(5.0 * numel(ins[0][1]), _io_bytes(ins, outs))


def _infer_moe_ffn(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, weights, idx, wg, wu, wd = ins[:6]
    _float(x, "x")
    _req(x.rank >= 1 and weights.rank >= 1, f"x must be [*, dim] and routing [*, k], got {x} and {weights}")
    _float(weights, "routing weights")
    _int(idx, "expert indices")
    _req(weights.shape == idx.shape, f"routing weights {weights} and indices {idx} differ")
    _req(weights.shape[:-1] == x.shape[:-1], f"routing {weights} does not match tokens of x {x}")
    _req(wg.rank == 3 and wg.shape == wu.shape, f"w_gate {wg} and w_up {wu} must be [experts, ffn, dim]")
    _same_dim(wg.shape[2], x.shape[-1], "w_gate input dim and x")
    _req(wd.shape == (wg.shape[0], wg.shape[2], wg.shape[1]), f"w_down must be [experts, dim, ffn], got {wd}")
    biases = ins[6:]
    _req(
        len(biases) in (0, 3), f"expert biases come as b_gate, b_up, b_down or not at all, got {len(biases)}"
    )
    if biases:
        bg, bu, bd = biases
        _req(bg.shape == wg.shape[:2] and bu.shape == wg.shape[:2], f"b_gate {bg}, b_up {bu}: [experts, ffn]")
        _req(bd.shape == (wg.shape[0], wg.shape[2]), f"b_down must be [experts, dim], got {bd}")
    if attrs["activation"] == "swiglu_clamp":
        _req(attrs["limit"] > 0, f"limit must be > 0, got {attrs['limit']}")
    return [x]


def _cost_moe_ffn(ins, outs, attrs) -> Cost:
    (_, xs), (_, ks), (wdt, wg) = ins[0], ins[1], ins[3]
    tokens, k = numel(xs[:-1]), ks[-1]
    e, f, d = wg
    touched = min(e, tokens * k)  # experts whose weights are read at least once
    weight_bytes = 3.0 * touched * f * d * wdt.itemsize
    act = _nbytes(ins[0]) + _nbytes(ins[1]) + _nbytes(ins[2]) + _nbytes(outs[0])
    return Cost(6.0 * tokens * k * f * d, weight_bytes + act)


def _infer_argmax(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    axis = _axis(x.rank, attrs["axis"])
    return [TensorType(DType.I32, x.shape[:axis] + x.shape[axis + 1 :])]


def _infer_reshape(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    shape = tuple(attrs["shape"])
    _req(same_numel(x.shape, shape), f"cannot reshape {x} into {format_shape(shape)}")
    return [TensorType(x.dtype, shape)]


def _infer_transpose(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    perm = tuple(attrs["perm"])
    _req(sorted(perm) == list(range(x.rank)), f"perm {perm} is not a permutation of {x.rank} axes")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


def slice_bounds(dim: Dim, start: int, end: int | None) -> tuple[Dim, int, int | None]:
    """Length of `x[start:end]` along a dim of size `dim` (symbolic only for start<0 and no end)."""
    if is_symbol(dim):
        if start < 0 and end is None:
            return -start, start, end
        _req(start >= 0 and end is not None and end >= start, f"slice [{start}:{end}] of symbolic dim {dim}")
        return end - start, start, end
    lo, hi, _ = slice(start, end).indices(int(dim))
    _req(hi > lo, f"slice [{start}:{end}] of a dim of {dim} is empty")
    return hi - lo, start, end


def _infer_slice(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    axis = _axis(x.rank, attrs["axis"])
    length, _, _ = slice_bounds(x.shape[axis], attrs["start"], attrs["end"])
    return [TensorType(x.dtype, (*x.shape[:axis], length, *x.shape[axis + 1 :]))]


def _infer_concat(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    first = ins[0]
    axis = _axis(first.rank, attrs["axis"])
    total: Dim = 0
    for i, t in enumerate(ins):
        _req(t.dtype == first.dtype and t.rank == first.rank, f"input {i} {t} does not match {first}")
        _req(
            t.shape[:axis] == first.shape[:axis] and t.shape[axis + 1 :] == first.shape[axis + 1 :],
            f"input {i} {t} differs from {first} off the concat axis",
        )
        d = t.shape[axis]
        _req(isinstance(d, int) and isinstance(total, int), "concat along a symbolic dim")
        total = int(total) + int(d)
    return [TensorType(first.dtype, (*first.shape[:axis], total, *first.shape[axis + 1 :]))]


def _infer_cast(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    return [TensorType(DType.parse(attrs["dtype"]), ins[0].shape)]


def _cost_move(ins, outs, attrs) -> Cost:
    return Cost(0.0, _io_bytes(ins, outs))


def _cost_view(ins, outs, attrs) -> Cost:
    # A reshape is a view: no bytes move.
    return Cost(0.0, 0.0)


_EPS = {"eps": AttrSpec("float", default=1e-5)}
# Sliding window (transformers' `sliding_window`: the window counts the token itself; 0 = full) and
# logit soft-capping (Gemma 2's `attn_logit_softcapping`: scores = cap * tanh(q.k * scale / cap),
# after the scale, before the mask and the softmax; 0 = none).
# Chunked attention (Llama 4's `attention_chunk_size`: the prompt is cut into chunks of `chunk` positions
# and a query sees the keys of its own chunk up to itself; 0 = none). Sinks (gpt-oss): an optional last
# input of one logit per query head that joins each row's softmax and carries no value (the row's
# weights sum to less than 1).
_WINDOW_SOFTCAP = {
    "window": AttrSpec("int", default=0),
    "softcap": AttrSpec("float", default=0.0),
    "chunk": AttrSpec("int", default=0),
}
# Routers (weights f32 and indices i32 of the k chosen experts, per token; ties go to the lower index):
# - topk_softmax (Mixtral, gpt-oss): the k largest logits, softmax over them;
# - softmax_topk (Qwen3-MoE, OLMoE): softmax over all experts, the k largest probabilities;
# - sigmoid_topk (GLM-4.5, MiniMax-M2, DeepSeek-V3): scores sigmoid(logits); experts are chosen by
#   scores + bias (the optional second input, [E]: e_score_correction_bias), weighted by their scores;
#   with groups > 1 the experts split into `groups` equal groups, each scored by the sum of its two best
#   choice scores, and only the experts of the `topk_groups` best groups are candidates;
# - topk_sigmoid (Llama 4): the k largest logits, each weighted by its sigmoid.
# Then normalize: weights / their sum (softmax_topk, sigmoid_topk); then times `scaling`
# (routed_scaling_factor).
ROUTER_MODES = ("topk_softmax", "softmax_topk", "sigmoid_topk", "topk_sigmoid")
_ROUTER = {
    "k": AttrSpec("int", required=True),
    "mode": AttrSpec("str", default="topk_softmax", choices=ROUTER_MODES),
    "normalize": AttrSpec("bool", default=False),
    "groups": AttrSpec("int", default=1),
    "topk_groups": AttrSpec("int", default=0),  # 0: all groups
    "scaling": AttrSpec("float", default=1.0),
}
# Experts: act "silu" is SwiGLU, silu(g) * u with g = gate x (+ b_gate), u = up x (+ b_up);
# "swiglu_clamp" is gpt-oss's, g' = min(g, limit), u' = clip(u, -limit, limit), (u' + 1) * g' *
# sigmoid(alpha g'). weight_input (Llama 4): the routing weight multiplies the expert's input rather
# than its output.
_EXPERTS = {
    "activation": AttrSpec("str", default="silu", choices=("silu", "swiglu_clamp")),
    "alpha": AttrSpec("float", default=1.702),
    "limit": AttrSpec("float", default=7.0),
    "weight_input": AttrSpec("bool", default=False),
}
# Rope: the frequency types of transformers' ROPE_INIT_FUNCTIONS (reference.rope_inv_freq computes each
# as it does); each type reads only its own parameters. `rotary_dim` (0: the whole head) rotates the
# first rotary_dim dims (rotate-half within them) and passes the rest through (partial_rotary_factor).
# `attention_factor` multiplies cos and sin (yarn's mscale, longrope's factor: the value transformers'
# init function returns, which `reference.rope_attention_factor` computes from the HF parameters for
# the loader). `factor` is used as given (transformers' fallback max_position_embeddings /
# original_max_position_embeddings for yarn and longrope is the loader's). "dynamic" and "longrope"
# depend on the sequence length, which a call takes as max(positions) + 1.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
_ROPE = {
    "theta": AttrSpec("float", default=10000.0),
    "rope_type": AttrSpec("str", default="default", choices=ROPE_TYPES),
    "rotary_dim": AttrSpec("int", default=0),
    "attention_factor": AttrSpec("float", default=1.0),
    "factor": AttrSpec("float", default=1.0),  # linear, dynamic, yarn, longrope, llama3
    "low_freq_factor": AttrSpec("float", default=1.0),  # llama3
    "high_freq_factor": AttrSpec("float", default=4.0),  # llama3
    "original_max_position_embeddings": AttrSpec("int", default=8192),  # llama3, yarn, longrope
    "max_position_embeddings": AttrSpec("int", default=0),  # dynamic
    "beta_fast": AttrSpec("float", default=32.0),  # yarn
    "beta_slow": AttrSpec("float", default=1.0),  # yarn
    "truncate": AttrSpec("bool", default=True),  # yarn
    "short_factor": AttrSpec("floats", default=()),  # longrope: [rotary_dim / 2]
    "long_factor": AttrSpec("floats", default=()),  # longrope: [rotary_dim / 2]
}

OPS: dict[str, OpDef] = {
    op.name: op
    for op in [
        # --- lookup and projections
        OpDef("embedding", "projection", (2, 2), _infer_embedding, _cost_embedding,
              doc="table[V, D], ids[*] -> [*, D]"),
        OpDef("linear", "projection", (2, 3), _infer_linear, _cost_linear,
              doc="x[*, K], w[N, K] (, bias[N]) -> [*, N]"),
        OpDef("head_linear", "projection", (2, 2), _infer_head_linear, _cost_head_linear,
              doc="x[*, H, K], w[H, N, K] -> [*, H, N]: each head its own projection (MLA's absorbed "
                  "up-projections)"),
        OpDef("matmul", "projection", (2, 2), _infer_matmul, _cost_matmul,
              doc="a[*, M, K], b[*, K, N] -> [*, M, N]"),
        # --- normalization and position
        OpDef("rmsnorm", "norm", (2, 2), _infer_norm, _cost_norm, dict(_EPS),
              doc="x[*, D], w[D] -> x / rms(x) * w (float32 statistics)"),
        OpDef("layernorm", "norm", (3, 3), _infer_norm, _cost_norm, dict(_EPS),
              doc="x[*, D], w[D], b[D] -> (x - mean) / std * w + b"),
        OpDef("attn_temperature", "position", (2, 2), _infer_attn_temperature, _cost_rope,
              {"floor_scale": AttrSpec("float", required=True), "scale": AttrSpec("float", required=True)},
              doc="x[B, S, H, Dh], positions[B, S] -> x * (log1p(floor((p + 1) / floor_scale)) * scale + 1) "
                  "(Llama 4's attention temperature on its layers without rope)"),
        OpDef("rope", "position", (2, 2), _infer_rope, _cost_rope, dict(_ROPE),
              doc="x[B, S, H, Dh], positions[B, S] -> rotary embedding, rotate-half (neox) layout, on the "
                  "first rotary_dim dims of each head (0: all), cos and sin times attention_factor"),
        # --- attention and the KV cache
        OpDef("kv_write", "attention", (4, 4), _infer_kv_write, _cost_kv_write,
              doc="cache, x[B, S, Hkv, Dh], block_table, positions -> cache with x at its slots (in place)"),
        OpDef("attention", "attention", (3, 4), _infer_attention, _cost_attention,
              {"causal": AttrSpec("bool", default=True), "scale": AttrSpec("float", required=True),
               **_WINDOW_SOFTCAP},
              doc="q[B, S, H, Dh], k, v[B, T, Hkv, Dh] (, sinks[H]) -> [B, S, H, Dh] (grouped-query); "
                  "causal: query i sees keys j <= i, and j > i - window under a window, j // chunk == "
                  "i // chunk under a chunk"),
        OpDef("cache_attention", "attention", (5, 6), _infer_cache_attention, _cost_cache_attention,
              {"scale": AttrSpec("float", required=True), **_WINDOW_SOFTCAP},
              doc="q[B, S, H, Dh] over the paged cache (, sinks[H]); token (b, s) at p = positions[b, s] "
                  "sees positions k <= p, and k > p - window under a window, k // chunk == p // chunk "
                  "under a chunk"),
        OpDef("indexer_topk", "attention", (5, 5), _infer_indexer_topk, _cost_indexer_topk,
              {"k": AttrSpec("int", required=True), "scale": AttrSpec("float", required=True)},
              doc="q[B, S, H, D], cache[blocks, bs, 1, D], weights[B, S, H], block_table, positions -> the "
                  "positions t <= p of the k best sum_h weights * relu(scale q.k_t), i32 [B, S, k], best "
                  "first, ties to the lower position, -1 past the visible ones (DeepSeek-V3.2's indexer)"),
        OpDef("index_attention", "attention", (6, 6), _infer_index_attention, _cost_index_attention,
              {"scale": AttrSpec("float", required=True)},
              doc="q[B, S, H, Dk] over the paged k/v caches, each query seeing only the positions of its row "
                  "of selected[B, S, k] (-1: none) -> [B, S, H, Dv] (DeepSeek-V3.2's sparse attention)"),
        # --- elementwise
        OpDef("silu", "elementwise", (1, 1), _infer_unary, _cost_elementwise(4.0)),
        OpDef("gelu", "elementwise", (1, 1), _infer_unary, _cost_elementwise(8.0),
              {"approximate": AttrSpec("str", default="none", choices=("none", "tanh"))}),
        OpDef("scale", "elementwise", (1, 1), _infer_unary, _cost_elementwise(1.0),
              {"factor": AttrSpec("float", required=True), "round_factor_to_dtype": AttrSpec("bool", default=False)},
              doc="x * factor in f32; round_factor_to_dtype: factor rounded to x's dtype first (Gemma's "
                  "embedding normalizer)"),
        OpDef("softcap", "elementwise", (1, 1), _infer_softcap, _cost_elementwise(4.0),
              {"cap": AttrSpec("float", required=True)},
              doc="cap * tanh(x / cap) (Gemma 2's final logit soft-capping)"),
        OpDef("mul", "elementwise", (2, 2), _infer_binary, _cost_elementwise(1.0)),
        OpDef("add", "elementwise", (2, 2), _infer_binary, _cost_elementwise(1.0)),
        OpDef("softmax", "reduction", (1, 1), _infer_softmax, _cost_elementwise(5.0),
              {"axis": AttrSpec("int", default=-1)}),
        OpDef("argmax", "reduction", (1, 1), _infer_argmax, _cost_move, {"axis": AttrSpec("int", default=-1)}),
        # --- mixture of experts
        OpDef("topk_router", "moe", (1, 2), _infer_topk_router, _cost_topk_router, dict(_ROUTER),
              doc="logits[*, E] (, bias[E]) -> weights[*, k] f32, indices[*, k] i32 (see _ROUTER)"),
        OpDef("moe_ffn", "moe", (6, 9), _infer_moe_ffn, _cost_moe_ffn, dict(_EXPERTS),
              doc="x[*, D], weights[*, k], indices[*, k], w_gate/w_up[E, F, D], w_down[E, D, F] (, b_gate/"
                  "b_up[E, F], b_down[E, D]) -> sum_k weight * down(act(gate x, up x)) (see _EXPERTS)"),
        # --- layout
        OpDef("reshape", "layout", (1, 1), _infer_reshape, _cost_view, {"shape": AttrSpec("dims", required=True)}),
        OpDef("transpose", "layout", (1, 1), _infer_transpose, _cost_move,
              {"perm": AttrSpec("ints", required=True)}),
        OpDef("slice", "layout", (1, 1), _infer_slice, _cost_move,
              {"axis": AttrSpec("int", required=True), "start": AttrSpec("int", required=True),
               "end": AttrSpec("optint", default=None)}),
        OpDef("concat", "layout", (1, 64), _infer_concat, _cost_move, {"axis": AttrSpec("int", required=True)}),
        OpDef("cast", "layout", (1, 1), _infer_cast, _cost_move,
              {"dtype": AttrSpec("dtype", required=True)}),
    ]
}  # fmt: skip


def op_def(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise OpError(f"unknown op `{name}`; the op table has: {', '.join(sorted(OPS))}") from None


def normalize_attrs(op: OpDef, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Check `attrs` against the op's spec; fill defaults; return canonical values (tuples, floats)."""
    unknown = set(attrs) - set(op.attrs)
    if unknown:
        raise OpError(f"unknown attribute(s) {sorted(unknown)} for op `{op.name}`")
    out: dict[str, Any] = {}
    for key, spec in op.attrs.items():
        if key not in attrs:
            if spec.required:
                raise OpError(f"missing required attribute `{key}`")
            out[key] = spec.default
            continue
        out[key] = _check_attr(key, spec, attrs[key])
    return out


def _check_attr(key: str, spec: AttrSpec, value: Any) -> Any:
    def bad() -> OpError:
        return OpError(f"attribute `{key}` must be {spec.kind}, got {value!r}")

    kind = spec.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad()
        return value
    if kind in ("int", "optint"):
        if value is None and kind == "optint":
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad()
        return float(value)
    if kind == "floats":
        if not isinstance(value, list | tuple) or any(
            isinstance(v, bool) or not isinstance(v, int | float) for v in value
        ):
            raise bad()
        return tuple(float(v) for v in value)
    if kind == "str":
        if not isinstance(value, str):
            raise bad()
        if spec.choices and value not in spec.choices:
            raise OpError(f"attribute `{key}` must be one of {list(spec.choices)}, got {value!r}")
        return value
    if kind == "dtype":
        try:
            return DType.parse(str(value)).value
        except ValueError as e:
            raise OpError(str(e)) from None
    if kind in ("dims", "ints"):
        if not isinstance(value, list | tuple):
            raise bad()
        allowed = (int,) if kind == "ints" else (int, str)
        if any(isinstance(v, bool) or not isinstance(v, allowed) for v in value):
            raise bad()
        if kind == "dims" and any(isinstance(v, int) and v < 0 for v in value):
            raise OpError(f"attribute `{key}`: dims must be >= 0 or named, got {list(value)}")
        return tuple(value)
    raise AssertionError(f"attr kind {kind}")


def infer_node(node: Node, in_types: list[TensorType]) -> list[TensorType]:
    """Output types of `node` given its input types (OpError without the node's name)."""
    op = op_def(node.op)
    lo, hi = op.arity
    if not lo <= len(in_types) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise OpError(f"takes {want} inputs, got {len(in_types)}")
    attrs = normalize_attrs(op, node.attrs)
    outs = op.infer(in_types, attrs)
    if len(outs) != len(node.outputs):
        raise OpError(f"produces {len(outs)} outputs, the node names {len(node.outputs)}")
    return outs


def node_cost(
    node: Node, in_types: list[TensorType], out_types: list[TensorType], bindings: Mapping[str, int]
) -> Cost:
    """FLOPs and bytes moved by `node` at the concrete dims `bindings` gives its symbols."""
    op = op_def(node.op)
    ins = [(t.dtype, concrete(t.shape, bindings)) for t in in_types]
    outs = [(t.dtype, concrete(t.shape, bindings)) for t in out_types]
    return op.cost(ins, outs, normalize_attrs(op, node.attrs))


# The general ops (torch.export's core ATen graphs import into them): their own module, one table.
from polymorph.ir.general_ops import GENERAL_OPS  # noqa: E402

OPS.update(GENERAL_OPS)
