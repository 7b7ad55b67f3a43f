"""The reference engine: a numpy interpreter that defines every op of the op table.

This is the living definition of the IR and the stock engine every backend is checked against.
Every op computes in float32 (integers stay integers) and casts its result to the output dtype the
op table infers, so a bf16 graph rounds exactly where its values are stored, never inside an op.

`run` writes the state (the KV cache) in place, as a device engine does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np

from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, TensorType
from polymorph.ir.ops import OPS, normalize_attrs, rope_rotary_dim
from polymorph.ir.shapes import bind, format_shape

Array = np.ndarray
RefFn = Callable[[list[Array], Mapping[str, Any]], list[Array]]


def f32(x: Array) -> Array:
    return np.asarray(x, dtype=np.float32)


# --- op definitions ----------------------------------------------------------------------------------


def _embedding(ins: list[Array], a: Mapping) -> list[Array]:
    table, ids = ins
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise UserError(f"token ids must be in [0, {table.shape[0]}), got {ids.min()}..{ids.max()}")
    return [table[ids]]


def _linear(ins: list[Array], a: Mapping) -> list[Array]:
    x, w = f32(ins[0]), f32(ins[1])
    y = x @ w.T  # [*, K] @ [K, N]
    if len(ins) == 3:
        y = y + f32(ins[2])
    return [y]


def _head_linear(ins: list[Array], a: Mapping) -> list[Array]:
    x, w = f32(ins[0]), f32(ins[1])
    return [np.einsum("...hk,hnk->...hn", x, w)]


def _matmul(ins: list[Array], a: Mapping) -> list[Array]:
    return [f32(ins[0]) @ f32(ins[1])]


def _rmsnorm(ins: list[Array], a: Mapping) -> list[Array]:
    x, w = f32(ins[0]), f32(ins[1])
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(a["eps"]))
    return [x / rms * w]


def _layernorm(ins: list[Array], a: Mapping) -> list[Array]:
    x, w, b = (f32(t) for t in ins)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return [(x - mean) / np.sqrt(var + np.float32(a["eps"])) * w + b]


def rope_inv_freq(head_dim: int, a: Mapping, dtype: type = np.float32, seq_len: int | None = None) -> Array:
    """Inverse frequencies [rotary_dim / 2] of a rope op's attributes, as transformers'
    `ROPE_INIT_FUNCTIONS[rope_type]` computes them (in float64 here), returned as `dtype`.

    `seq_len` is the sequence length "dynamic" and "longrope" depend on (a call's max(positions) + 1);
    None: the length transformers starts from (dynamic: max_position_embeddings, so the unscaled
    frequencies; longrope: the short factors). Attributes `a` omits take the op table's defaults."""
    a = _rope_attrs(a)
    dim = rope_rotary_dim(a, head_dim)
    base, kind, factor = a["theta"], a["rope_type"], a["factor"]
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim  # [dim / 2]
    if kind == "dynamic":
        # NTK-aware: the base grows with the sequence beyond max_position_embeddings.
        max_pos = a["max_position_embeddings"]
        length = max(seq_len or max_pos, max_pos)
        base = base * ((factor * length / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    inv = 1.0 / (base**exponents)
    if kind == "linear":
        inv = inv / factor
    elif kind == "llama3":
        lo, hi = a["low_freq_factor"], a["high_freq_factor"]
        old = a["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        if hi != lo:  # equal factors (Llama 4 Scout's 1.0 and 1.0): no medium band, no smoothing
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= old / hi) & (wavelen <= old / lo)
            inv = np.where(medium, smoothed, scaled)
        else:
            inv = scaled
    elif kind == "yarn":
        inv = _yarn_inv_freq(inv, dim, a)
    elif kind == "longrope":
        long = seq_len is not None and seq_len > a["original_max_position_embeddings"]
        ext = np.asarray(a["long_factor"] if long else a["short_factor"], dtype=np.float64)
        inv = inv / ext
    return inv.astype(dtype)


def _rope_attrs(a: Mapping) -> Mapping:
    return {**{k: spec.default for k, spec in OPS["rope"].attrs.items()}, **a}


def _yarn_inv_freq(inv_extrapolation: Array, dim: int, a: Mapping) -> Array:
    """YaRN: interpolated (divided by factor) frequencies below the correction range of [beta_slow,
    beta_fast] rotations over the original context, the original ones above it, a linear ramp between."""
    base, old = a["theta"], a["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(a["beta_fast"]), correction_dim(a["beta_slow"])
    if a["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    return inv_extrapolation / a["factor"] * (1 - extrapolation) + inv_extrapolation * extrapolation


def rope_attention_factor(
    rope_type: str,
    factor: float,
    original_max_position_embeddings: int,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
) -> float:
    """The attention factor transformers' init function of `rope_type` returns for these HF rope
    parameters (what a loader sets the rope op's `attention_factor` to): the given `attention_factor`
    for yarn and longrope, else yarn's mscale (of `mscale` / `mscale_all_dim` where both are set),
    longrope's sqrt(1 + ln(factor) / ln(original_max_position_embeddings)); 1 for the other types."""
    if rope_type not in ("yarn", "longrope"):
        return 1.0
    if attention_factor is not None:
        return float(attention_factor)
    if rope_type == "yarn":

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if mscale and mscale_all_dim:
            return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        return float(get_mscale(factor))
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))


def rope_seq_len(positions: Array) -> int | None:
    """The sequence length a call of rope stands for: max(positions) + 1 (None for no tokens)."""
    return int(positions.max()) + 1 if positions.size else None


def _rope(ins: list[Array], a: Mapping) -> list[Array]:
    x, pos = f32(ins[0]), ins[1]
    dim = rope_rotary_dim(a, x.shape[-1])
    half = dim // 2
    inv = rope_inv_freq(x.shape[-1], a, seq_len=rope_seq_len(pos))  # [dim / 2]
    angles = pos.astype(np.float32)[..., None] * inv  # [B, S, dim / 2]
    af = np.float32(a["attention_factor"])
    cos = np.cos(angles)[:, :, None, :] * af  # [B, S, 1, dim / 2]
    sin = np.sin(angles)[:, :, None, :] * af
    x1, x2, rest = x[..., :half], x[..., half:dim], x[..., dim:]
    return [np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)]


def cache_slots(block_table: Array, positions: Array, block_size: int) -> tuple[Array, Array]:
    """(block id, slot in block) of every token (b, s): the paged-KV addressing every kernel uses."""
    logical_block = positions // block_size
    if (positions < 0).any() or (logical_block >= block_table.shape[1]).any():
        raise UserError(
            f"a position is outside the block table (positions {positions.min()}..{positions.max()}, "
            f"{block_table.shape[1]} blocks of {block_size})"
        )
    blocks = np.take_along_axis(block_table, logical_block, axis=1)  # [B, S]
    return blocks, positions % block_size


def _kv_write(ins: list[Array], a: Mapping) -> list[Array]:
    cache, x, table, pos = ins
    blocks, slots = cache_slots(table, pos, cache.shape[1])
    cache[blocks, slots] = x.astype(cache.dtype)  # in place: the cache is state
    return [cache]


def _attend(
    q: Array,
    k: Array,
    v: Array,
    visible: Array,
    scale: float,
    softcap: float = 0.0,
    sinks: Array | None = None,
) -> Array:
    """q[B, S, H, Dh], k/v[B, T, Hkv, Dh], visible[B, S, T] -> [B, S, H, Dh], grouped-query; scores
    soft-capped to softcap * tanh(scores / softcap) after the scale where softcap > 0; sinks[H]: one more
    logit per head in each row's softmax, with no value."""
    b, s, h, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, s, hkv, h // hkv, d)  # query heads grouped by the kv head they share
    scores = np.einsum("bsgrd,btgd->bgrst", qg, k) * np.float32(scale)  # [B, Hkv, rep, S, T]
    if softcap:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    scores = np.where(visible[:, None, None], scores, -np.inf)
    if sinks is None:
        top = scores.max(axis=-1, keepdims=True)
        total = np.float32(0)
    else:
        sink = f32(sinks).reshape(1, hkv, h // hkv, 1, 1)
        top = np.maximum(scores.max(axis=-1, keepdims=True), sink)
        total = np.exp(sink - top)
    p = np.exp(scores - top)
    p = p / (p.sum(axis=-1, keepdims=True) + total)
    # A slot no query sees may hold anything (unwritten cache memory, a block outside the window, NaN
    # included): it must not reach the output (its scores are already masked to -inf).
    v = np.where(visible.any(axis=1)[:, :, None, None], v, np.float32(0))
    out = np.einsum("bgrst,btgd->bsgrd", p, v)
    return out.reshape(b, s, h, -1)  # v may be narrower than q and k


def _attention(ins: list[Array], a: Mapping) -> list[Array]:
    q, k, v = (f32(t) for t in ins[:3])
    s, t = q.shape[1], k.shape[1]
    visible = np.ones((q.shape[0], s, t), dtype=bool)
    if a["causal"]:
        visible &= np.tril(np.ones((s, t), dtype=bool))
    if a["window"]:  # causal: query i sees keys i - window < j <= i
        visible &= ~np.tril(np.ones((s, t), dtype=bool), -a["window"])
    if a["chunk"]:  # causal: query i sees keys j <= i of its own chunk
        visible &= (np.arange(s)[:, None] // a["chunk"]) == (np.arange(t)[None, :] // a["chunk"])
    sinks = ins[3] if len(ins) > 3 else None
    return [_attend(q, k, v, visible, a["scale"], a["softcap"], sinks)]


def _cache_attention(ins: list[Array], a: Mapping) -> list[Array]:
    q, kc, vc, table, pos = ins[:5]
    nb, bs, hkv, d = kc.shape
    k = f32(kc[table]).reshape(table.shape[0], table.shape[1] * bs, hkv, d)  # [B, T, Hkv, Dh]
    v = f32(vc[table]).reshape(table.shape[0], table.shape[1] * bs, hkv, d)
    t = np.arange(k.shape[1])
    visible = t[None, None, :] <= pos[:, :, None]  # [B, S, T]
    if a["window"]:
        visible &= t[None, None, :] > pos[:, :, None] - a["window"]
    if a["chunk"]:
        visible &= t[None, None, :] // a["chunk"] == pos[:, :, None] // a["chunk"]
    sinks = ins[5] if len(ins) > 5 else None
    return [_attend(f32(q), k, v, visible, a["scale"], a["softcap"], sinks)]


def paged_keys(cache: Array, table: Array) -> Array:
    """A paged cache's entries per sequence in position order: [B, blocks * bs, heads, dim] f32."""
    _, bs, heads, dim = cache.shape
    return f32(cache[table]).reshape(table.shape[0], table.shape[1] * bs, heads, dim)


def index_scores(q: Array, keys: Array, weights: Array, pos: Array, scale: float) -> Array:
    """DeepSeek-V3.2's indexer: sum_h weights * relu(scale q_h . k_t) per query and position, f32
    [B, S, T], -inf at positions past the query's."""
    dots = np.einsum("bshd,btd->bsht", f32(q), keys[:, :, 0]) * np.float32(scale)
    scores = np.einsum("bsh,bsht->bst", f32(weights), np.maximum(dots, np.float32(0)))
    t = np.arange(keys.shape[1])
    return np.where(t[None, None, :] <= pos[:, :, None], scores, -np.inf).astype(np.float32)


def _indexer_topk(ins: list[Array], a: Mapping) -> list[Array]:
    q, kc, w, table, pos = ins
    scores = index_scores(q, paged_keys(kc, table), w, pos, a["scale"])
    k = a["k"]
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]  # best first, lower position on ties
    best = np.take_along_axis(scores, order, axis=-1)
    out = np.where(np.isfinite(best), order, -1).astype(np.int32)
    if out.shape[-1] < k:  # fewer positions in the table than k
        out = np.concatenate([out, np.full((*out.shape[:-1], k - out.shape[-1]), -1, np.int32)], axis=-1)
    return [out]


def _index_attention(ins: list[Array], a: Mapping) -> list[Array]:
    q, kc, vc, table, pos, selected = ins
    k, v = paged_keys(kc, table), paged_keys(vc, table)
    t = np.arange(k.shape[1])
    chosen = (selected[:, :, :, None] == t[None, None, None, :]).any(axis=2)  # [B, S, T]
    visible = chosen & (t[None, None, :] <= pos[:, :, None])
    return [_attend(f32(q), k, v, visible, a["scale"])]


def _silu(ins: list[Array], a: Mapping) -> list[Array]:
    x = f32(ins[0])
    return [x / (1.0 + np.exp(-x))]


def _gelu(ins: list[Array], a: Mapping) -> list[Array]:
    x = f32(ins[0])
    if a["approximate"] == "tanh":
        return [0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))]
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return [(0.5 * x * (1 + erf(x / np.sqrt(2)))).astype(np.float32)]


def _scale(ins: list[Array], a: Mapping) -> list[Array]:
    factor = np.float32(a["factor"])
    if a["round_factor_to_dtype"] and ins[0].dtype != np.float32:
        factor = f32(np.asarray(a["factor"], dtype=np.float32).astype(ins[0].dtype))
    return [f32(ins[0]) * factor]


def _softcap(ins: list[Array], a: Mapping) -> list[Array]:
    cap = np.float32(a["cap"])
    return [cap * np.tanh(f32(ins[0]) / cap)]


def _arith(x: Array) -> Array:
    """float32 for float tensors; integers stay integers (i32 + i32 must not round through f32)."""
    return x if np.issubdtype(x.dtype, np.integer) else f32(x)


def _mul(ins: list[Array], a: Mapping) -> list[Array]:
    return [_arith(ins[0]) * _arith(ins[1])]


def _add(ins: list[Array], a: Mapping) -> list[Array]:
    return [_arith(ins[0]) + _arith(ins[1])]


def softmax(x: Array, axis: int = -1) -> Array:
    x = f32(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax(ins: list[Array], a: Mapping) -> list[Array]:
    return [softmax(ins[0], a["axis"])]


def attn_temperature_factor(pos: Array, floor_scale: float, scale: float) -> Array:
    """Llama 4's per-position query scale, f32 [B, S] (transformers: log1p(floor((p + 1) / floor_scale))
    * attn_scale + 1, in f32)."""
    p = pos.astype(np.float32)
    return np.log1p(np.floor((p + np.float32(1)) / np.float32(floor_scale))) * np.float32(scale) + np.float32(
        1
    )


def _attn_temperature(ins: list[Array], a: Mapping) -> list[Array]:
    x, pos = ins
    return [f32(x) * attn_temperature_factor(pos, a["floor_scale"], a["scale"])[:, :, None, None]]


def _topk(x: Array, k: int) -> tuple[Array, Array]:
    # Stable descending order: ties go to the lower expert index (every backend's kernel matches this).
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx.astype(np.int32)


def sigmoid(x: Array) -> Array:
    with np.errstate(over="ignore"):  # exp(-x) of a large negative x is inf: sigmoid 0
        return np.float32(1) / (np.float32(1) + np.exp(-x))


def sigmoid_choice(scores: Array, bias: Array | None, a: Mapping) -> tuple[Array, Array | None]:
    """What sigmoid_topk chooses its experts by: scores (+ bias), -inf outside the kept groups; and the
    group scores (the sum of each group's two best) where the router has groups, else None."""
    choice = scores + bias if bias is not None else scores
    groups = a["groups"]
    if groups <= 1:
        return choice, None
    e = choice.shape[-1]
    grouped = choice.reshape(*choice.shape[:-1], groups, e // groups)
    best2, _ = _topk(grouped, 2)
    group_scores = best2.sum(axis=-1)
    _, keep = _topk(group_scores, a["topk_groups"] or groups)  # [*, topk_groups]
    allowed = np.zeros(grouped.shape[:-1], dtype=bool)
    np.put_along_axis(allowed, keep, True, axis=-1)
    return np.where(np.repeat(allowed, e // groups, axis=-1), choice, -np.inf), group_scores


def _topk_router(ins: list[Array], a: Mapping) -> list[Array]:
    """The routers of ops._ROUTER."""
    logits, mode, k = f32(ins[0]), a["mode"], a["k"]
    if mode == "topk_softmax":
        vals, idx = _topk(logits, k)
        vals = softmax(vals)
    elif mode == "topk_sigmoid":
        vals, idx = _topk(logits, k)
        vals = sigmoid(vals)
    elif mode == "softmax_topk":
        vals, idx = _topk(softmax(logits), k)
    else:  # sigmoid_topk
        scores = sigmoid(logits)
        choice, _ = sigmoid_choice(scores, f32(ins[1]) if len(ins) > 1 else None, a)
        _, idx = _topk(choice, k)
        vals = np.take_along_axis(scores, idx, axis=-1)
    if a["normalize"] and mode in ("softmax_topk", "sigmoid_topk"):
        vals = vals / vals.sum(axis=-1, keepdims=True)
    return [(vals * np.float32(a["scaling"])).astype(np.float32), idx]


def expert_activation(g: Array, u: Array, a: Mapping) -> Array:
    """The expert's gated activation of gate and up projections (ops._EXPERTS), in f32."""
    if a["activation"] == "swiglu_clamp":
        limit = np.float32(a["limit"])
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        return (u + np.float32(1)) * g * sigmoid(np.float32(a["alpha"]) * g)
    return g * sigmoid(g) * u


def _moe_ffn(ins: list[Array], a: Mapping) -> list[Array]:
    x, weights, idx, wg, wu, wd = ins[:6]
    biases = [f32(b) for b in ins[6:]]
    lead = x.shape[:-1]
    xt = f32(x).reshape(-1, x.shape[-1])  # [T, D]
    wt = f32(weights).reshape(-1, weights.shape[-1])  # [T, k]
    it = idx.reshape(-1, idx.shape[-1])
    out = np.zeros_like(xt)
    for e in np.unique(it):
        tok, slot = np.nonzero(it == e)
        w = wt[tok, slot][:, None]
        h = xt[tok] * w if a["weight_input"] else xt[tok]
        g, u = h @ f32(wg[e]).T, h @ f32(wu[e]).T
        if biases:
            g, u = g + biases[0][e], u + biases[1][e]
        y = expert_activation(g, u, a) @ f32(wd[e]).T
        if biases:
            y = y + biases[2][e]
        np.add.at(out, tok, y if a["weight_input"] else w * y)
    return [out.reshape(*lead, x.shape[-1])]


def _argmax(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.argmax(f32(ins[0]), axis=a["axis"])]


def _reshape(ins: list[Array], a: Mapping, shape: tuple[int, ...] = ()) -> list[Array]:
    return [ins[0].reshape(shape).copy()]


def _transpose(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.transpose(ins[0], a["perm"]).copy()]


def _slice(ins: list[Array], a: Mapping) -> list[Array]:
    x = ins[0]
    index = [slice(None)] * x.ndim
    index[a["axis"]] = slice(a["start"], a["end"])
    return [x[tuple(index)].copy()]


def _concat(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.concatenate(ins, axis=a["axis"])]


def _cast(ins: list[Array], a: Mapping) -> list[Array]:
    return [ins[0].copy()]  # the interpreter casts every result to its inferred dtype


REFERENCE: dict[str, RefFn] = {
    "embedding": _embedding,
    "linear": _linear,
    "head_linear": _head_linear,
    "matmul": _matmul,
    "rmsnorm": _rmsnorm,
    "layernorm": _layernorm,
    "rope": _rope,
    "attn_temperature": _attn_temperature,
    "kv_write": _kv_write,
    "attention": _attention,
    "cache_attention": _cache_attention,
    "indexer_topk": _indexer_topk,
    "index_attention": _index_attention,
    "silu": _silu,
    "gelu": _gelu,
    "scale": _scale,
    "softcap": _softcap,
    "mul": _mul,
    "add": _add,
    "softmax": _softmax,
    "argmax": _argmax,
    "topk_router": _topk_router,
    "moe_ffn": _moe_ffn,
    "reshape": _reshape,
    "transpose": _transpose,
    "slice": _slice,
    "concat": _concat,
    "cast": _cast,
}
from polymorph.ir.general_reference import GENERAL_REFERENCE  # noqa: E402  (the general ops)

REFERENCE.update(GENERAL_REFERENCE)
assert set(REFERENCE) == set(OPS), "every op of the table has exactly one reference"


# --- the interpreter ---------------------------------------------------------------------------------


def round_to(x: Array, dtype: DType) -> Array:
    """float32 to `dtype`, rounding to nearest even. fp8 saturates: a value beyond the format's largest
    finite number becomes that number (as torch's and the hardware's conversions do), never NaN."""
    if dtype in (DType.F8E4M3, DType.F8E5M2):
        limit = float(ml_dtypes.finfo(dtype.numpy).max)
        x = np.where(np.isfinite(x), np.clip(x, -limit, limit), x)
    return x.astype(dtype.numpy)


def bind_symbols(graph: Graph, arrays: Mapping[str, Array]) -> dict[str, int]:
    """Match leaf arrays against the graph's declared types; return the value of every symbol.

    A missing leaf, a wrong dtype, a wrong rank or a dim that contradicts another raises UserError.
    """
    leaves = {}
    for name, arr in arrays.items():
        try:
            leaves[name] = (DType.of(arr), tuple(arr.shape))
        except ValueError:
            raise UserError(f"`{name}` is {arr.dtype}, which no IR dtype stores") from None
    return bind_leaf_shapes(graph, leaves)


def bind_leaf_shapes(graph: Graph, leaves: Mapping[str, tuple[DType, tuple[int, ...]]]) -> dict[str, int]:
    """`bind_symbols` from (dtype, shape) pairs, for engines whose tensors are not numpy arrays."""
    bindings: dict[str, int] = {}
    for name, t in graph.leaves().items():
        if name not in leaves:
            raise UserError(f"graph `{graph.name}` needs `{name}` ({t}), which was not given")
        dtype, shape = leaves[name]
        if dtype != t.dtype:
            raise UserError(f"`{name}` is {dtype}, the graph declares {t}")
        if len(shape) != t.rank:
            raise UserError(f"`{name}` has shape {list(shape)}, the graph declares {t}")
        for dim, size in zip(t.shape, shape, strict=True):
            if isinstance(dim, str):
                if bindings.setdefault(dim, size) != size:
                    raise UserError(f"`{name}` gives {dim}={size}, another input gave {dim}={bindings[dim]}")
            elif dim != size:
                raise UserError(f"`{name}` has shape {list(shape)}, the graph declares {t}")
    return bindings


# Ops whose reference computes in float32 whatever its operands' dtype: they may take a weight's
# float32 copy (`run(..., wide=)`) and give the same result without converting it on every call.
WIDE_OPS = frozenset({"linear", "head_linear", "matmul", "moe_ffn"})


def run(
    graph: Graph,
    params: Mapping[str, Array],
    inputs: Mapping[str, Array],
    state: dict[str, Array],
    trace: dict[str, Array] | None = None,
    wide: Mapping[str, Array] | None = None,
) -> dict[str, Array]:
    """Run `graph` once; return its outputs by name. `state` arrays are written in place.
    With `trace`, every value of the step (intermediates included) is stored in it by name. `wide`:
    float32 copies of some params, which the ops of WIDE_OPS read in their place (exactly the values
    they would convert to: bf16 and f16 widen to f32 exactly)."""
    env: dict[str, Array] = {**params, **inputs, **state}
    bindings = bind_symbols(graph, env)
    types = graph.types()
    for node in graph.nodes:
        run_node(node, env, types, bindings, wide)
    for name, value in graph.state_updates.items():
        if env[value] is not state[name]:
            state[name][...] = env[value]
    if trace is not None:
        trace.update(env)
    return {name: env[value] for name, value in graph.outputs.items()}


def run_node(
    node: Any,
    env: dict[str, Array],
    types: Mapping[str, TensorType],
    bindings: Mapping[str, int],
    wide: Mapping[str, Array] | None = None,
) -> None:
    """One node on the values of `env` (by name); its outputs go into `env`, rounded to their types.
    The ops of WIDE_OPS read a param's f32 copy from `wide` where it has one."""
    attrs = normalize_attrs(OPS[node.op], node.attrs)
    wide = wide if wide and node.op in WIDE_OPS else {}
    args = [wide[v] if v in wide else env[v] for v in node.inputs]
    if node.op == "reshape":
        outs = _reshape(args, attrs, tuple(int(d) for d in bind(attrs["shape"], bindings)))
    else:
        outs = REFERENCE[node.op](args, attrs)
    for value, arr in zip(node.outputs, outs, strict=True):
        env[value] = _as_type(arr, types[value], bindings, node.name)


def _as_type(arr: Array, t: TensorType, bindings: Mapping[str, int], where: str) -> Array:
    shape = bind(t.shape, bindings)
    if arr.shape != shape:
        raise AssertionError(f"{where}: reference produced {list(arr.shape)}, inferred {format_shape(shape)}")
    if t.dtype.is_float and arr.dtype != t.dtype.numpy:
        return round_to(f32(arr), t.dtype)
    return arr.astype(t.dtype.numpy, copy=False)
