"""Recognition: the LLM patterns of an imported program raised from general ops to the model-level ops
the builder emits (rmsnorm, linear, silu, rope, attention), so that the fusion tables and kernel files
of builder graphs (polymorph/passes/fuse.py, kernels/) apply to imported graphs as they are.

A torch.export program reaches the IR as general ops (polymorph/frontend/aten.py): an RMSNorm is
pow → mean → add eps → rsqrt → mul → mul weight, a Linear is reshape → matmul with the transposed
weight → reshape, rotary embeddings are slices, a negation, a concat and products with cos/sin tables,
and scaled-dot-product attention is two batched matmuls around a masked softmax. Each rule below
matches one such subgraph by structure, from its last node (the root), and checks every constant it
turns into an attribute against the weights (the import keeps the program's constants as params with
values: eps, the exponent 2, the attention scale, the causal mask, the positions and inverse
frequencies the rope tables come from). A subgraph that does not match exactly — another formula, an
unexpected constant, a mask that is not causal, another dtype than f32 — is left as it is: the rules
only ever replace a value by the same value computed by one op (up to float rounding order).

A rewrite replaces the root with new nodes that define the root's value from the subgraph's outside
inputs only; inner nodes die when nothing else reads them (dce at the end), so a value shared with
the rest of the graph is never lost. Rules run in order (each over the graph the previous one made):
rope reads the attention layout that linear leaves, attention reads rope's output.

It runs once, at import (polymorph/frontend/torch_export.py), not as a compile stage: the rules need
the constants' values, which a compile does not hold, and the rewritten graph is then the model's own,
the one the engine's workers load from IR JSON, `load` checks a plan against and the reference runs.

Not recognized yet: MoE blocks (transformers' do not import today: aten.topk is outside the general
op set), rope scaling other than none, linear or llama3 (yarn, longrope, dynamic: the frequencies
alone do not give their parameters), partial rotary dims, sliding windows and soft-capping in
attention, norms with a bias, and graphs in another dtype than f32 (`--dtype`: the program's f32
upcasts became no-ops, so the ops' f32 statistics would round differently from the program).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, Node, TensorType
from polymorph.ir.ops import OpError, infer_node, normalize_attrs, op_def
from polymorph.ir.reference import rope_inv_freq
from polymorph.passes.dce import dce

# The rotate-half layouts a rope rule can see: heads before positions (transformers' q/k after their
# transpose: [B, H, S, Dh], cos/sin unsqueezed at dim 1) or after ([B, S, H, Dh], unsqueezed at 2).
_TO_BSHD = (0, 2, 1, 3)
_F32_MIN = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Recognized:
    """The rewritten graph, its weights (the input's, less the params no node reads any more, plus
    any new constant such as the rope positions) and how many subgraphs each rule raised."""

    graph: Graph
    weights: dict[str, np.ndarray]
    counts: dict[str, int]


@dataclass(frozen=True)
class _Match:
    root: str  # the node whose value the new nodes define
    nodes: tuple[Node, ...]  # new nodes, in order; the last defines the root's (only) value
    inner: frozenset[str]  # matched nodes besides the root (not tried again as roots of this rule)
    params: Mapping[str, np.ndarray] = field(default_factory=dict)  # new constant params


class _View:
    """One graph's def-use tables, types and constant values, for the rules to read."""

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray]) -> None:
        self.graph = graph
        self.weights = weights
        self.types = graph.types()
        self.producer = graph.producers()
        self.consumers = graph.consumers()
        self.taken = set(self.types) | {n.name for n in graph.nodes}
        self.new_params: dict[str, np.ndarray] = {}
        self.rope_types: dict[tuple[str, int], dict[str, object] | None] = {}

    def node(self, value: str, op: str) -> Node | None:
        """The node that defines `value`, if it is an `op`."""
        n = self.producer.get(value)
        return n if n is not None and n.op == op else None

    def const(self, value: str) -> np.ndarray | None:
        """The value of a param (a weight, or a constant the import folded), else None."""
        if value not in self.graph.params:
            return None
        arr = self.weights.get(value)
        return None if arr is None else np.asarray(arr)

    def scalar(self, value: str) -> float | None:
        arr = self.const(value)
        return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 else None

    def shape(self, value: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.types[value].shape)

    def is_f32(self, *values: str) -> bool:
        return all(self.types[v].dtype == DType.F32 for v in values)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def only_reader(self, value: str) -> Node | None:
        readers = self.consumers.get(value, [])
        return readers[0] if len(readers) == 1 and value not in self.graph.outputs.values() else None


Rule = Callable[[_View, Node], "_Match | None"]


def _orders(node: Node) -> Iterator[tuple[str, str]]:
    """The two inputs of a commutative binary node, in both orders."""
    a, b = node.inputs
    yield a, b
    if a != b:
        yield b, a


def _prefix(names: Iterator[str] | list[str]) -> str:
    """The dotted module path the matched nodes share (`model.layers.0.input_layernorm`)."""
    parts = [n.split(".")[:-1] for n in names]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if any(c != column[0] for c in column):
            break
        common.append(column[0])
    return ".".join(common) or "recognized"


def _new(
    view: _View, name: str, op: str, inputs: tuple[str, ...], output: str | None, **attrs: object
) -> Node:
    """A node of `op`; its output is `output` (the root's value) or a fresh value named as the node."""
    node_name = view.fresh(name)
    out = output if output is not None else node_name
    if output is None:
        view.taken.add(out)
    return Node(node_name, op, inputs, (out,), normalize_attrs(op_def(op), attrs))


# --- rmsnorm -----------------------------------------------------------------------------------------


def _rmsnorm(view: _View, root: Node) -> _Match | None:
    """w * (x * rsqrt(mean(x ** 2, last axis, keepdim) + eps)), w a [D] weight, all f32; or Gemma's
    (1 + w) * (...), whose weight becomes a new param holding 1 + w (the sum eager computes, in f32)."""
    if root.op != "mul":
        return None
    for w_value, normed in _orders(root):
        scaled = view.node(normed, "mul")
        weight = _norm_weight(view, w_value)
        if weight is None or scaled is None:
            continue
        w, offset, offset_node = weight
        for x, r in _orders(scaled):
            rs = view.node(r, "rsqrt")
            if rs is None or len(view.shape(x)) < 1 or view.shape(w) != view.shape(x)[-1:]:
                continue
            if not view.is_f32(x, w, root.outputs[0]):
                continue
            add = view.node(rs.inputs[0], "add")
            if add is None:
                continue
            for m, e in _orders(add):
                eps, mean = view.scalar(e), view.node(m, "reduce_mean")
                if eps is None or not eps >= 0 or mean is None:
                    continue
                rank = len(view.shape(x))
                if tuple(mean.attrs["axes"]) not in ((rank - 1,), (-1,)) or not mean.attrs["keepdims"]:
                    continue
                square = view.producer.get(mean.inputs[0])
                if not _is_square(view, square, x):
                    continue
                assert square is not None
                inner = {scaled.name, rs.name, add.name, mean.name, square.name}
                params: dict[str, np.ndarray] = {}
                if offset_node is not None:
                    inner.add(offset_node)
                    value = view.const(w)
                    assert value is not None
                    folded = np.asarray(value, dtype=np.float32) + np.float32(offset)  # [D], as eager adds
                    w = _folded_param(view, f"{w}.plus_{offset:g}", folded)
                    params[w] = folded
                name = _prefix([root.name, *inner])
                node = _new(view, name, "rmsnorm", (x, w), root.outputs[0], eps=eps)
                return _Match(root.name, (node,), frozenset(inner), params)
    return None


def _norm_weight(view: _View, value: str) -> tuple[str, float, str | None] | None:
    """A norm's weight: a [D] param (offset 0), or param + scalar constant (Gemma's 1 + w: the param,
    the offset and the add node)."""
    if value in view.graph.params and view.const(value) is not None:
        return value, 0.0, None
    add = view.node(value, "add")
    if add is None:
        return None
    for w, c in _orders(add):
        offset = view.scalar(c)
        fits = offset is not None and math.isfinite(offset) and c != w and view.const(w) is not None
        if fits and len(view.shape(w)) == 1 and view.shape(add.outputs[0]) == view.shape(w):
            assert offset is not None
            return w, offset, add.name
    return None


def _folded_param(view: _View, base: str, value: np.ndarray) -> str:
    """A param for a weight folded with its constant (one per source weight and offset)."""
    if base in view.new_params or base in view.graph.params:
        return base
    view.taken.add(base)
    view.new_params[base] = value
    return base


def _is_square(view: _View, node: Node | None, x: str) -> bool:
    if node is None:
        return False
    if node.op == "pow":
        return node.inputs[0] == x and view.scalar(node.inputs[1]) == 2.0
    return node.op == "mul" and node.inputs == (x, x)


# --- silu --------------------------------------------------------------------------------------------


def _silu(view: _View, root: Node) -> _Match | None:
    """x * sigmoid(x)."""
    if root.op != "mul":
        return None
    for x, s in _orders(root):
        sig = view.node(s, "sigmoid")
        if sig is not None and sig.inputs[0] == x and view.is_f32(x):
            node = _new(view, _prefix([root.name, sig.name]) + ".silu", "silu", (x,), root.outputs[0])
            return _Match(root.name, (node,), frozenset({sig.name}))
    return None


# --- linear ------------------------------------------------------------------------------------------


def _linear(view: _View, root: Node) -> _Match | None:
    """x @ W^T (+ b) with W an [N, K] weight, as aten.linear decomposes: matmul(reshape(x, [M, K]),
    transpose(W)) reshaped back to x's leading dims, or x already [M, K], or (x not contiguous) a
    batched matmul of x [*, S, K] with transpose(W) expanded to [*, K, N]; the bias, where there is
    one, added to the product."""
    inner: set[str] = set()
    flat_out = root.outputs[0]
    if root.op == "reshape":
        flat_out = root.inputs[0]
        inner.add(root.name)
    core = view.producer.get(flat_out)
    if core is None:
        return None
    bias = None
    if core.op == "add":
        for y, b in _orders(core):
            if b in view.graph.params and view.node(y, "matmul") is not None and len(view.shape(b)) == 1:
                bias, inner_mm = b, view.node(y, "matmul")
                inner.add(core.name)
                core = inner_mm
                break
        else:
            return None
    if core is None or core.op != "matmul":
        return None
    inner.add(core.name)
    a, t = core.inputs
    weight = _weight_of(view, t)
    if weight is None:
        return None
    w, passed = weight
    n, k = view.shape(w)
    a_shape, t_shape = view.shape(a), view.shape(t)
    # a plain weight takes a [M, K] operand, a batched one [*, S, K] of the weight's batch dims
    if len(a_shape) != len(t_shape) or a_shape[:-2] != t_shape[:-2] or a_shape[-1] != k:
        return None
    if bias is not None and view.shape(bias) != (n,):
        return None
    x = a
    flat = view.node(a, "reshape")
    if root.op == "reshape":
        if flat is None or len(a_shape) != 2:
            return None
        x = flat.inputs[0]
        lead = view.shape(x)[:-1]
        if view.shape(x)[-1:] != (k,) or view.shape(root.outputs[0]) != (*lead, n):
            return None
        inner.add(flat.name)
    elif root is not core and root.op != "add":
        return None
    if not view.is_f32(x, w, *(() if bias is None else (bias,))):
        return None
    inner |= passed
    inner.discard(root.name)
    name = _prefix([root.name, *inner])
    node = _new(view, name, "linear", (x, w) if bias is None else (x, w, bias), root.outputs[0])
    return _Match(root.name, (node,), frozenset(inner))


def _weight_of(view: _View, value: str) -> tuple[str, set[str]] | None:
    """The [N, K] weight param whose transpose `value` is ([K, N]), or whose transpose expanded over
    batch dims it is ([*, K, N], from [1.., K, N]), and the nodes passed."""
    node = view.producer.get(value)
    passed: set[str] = set()
    if node is not None and node.op == "expand":
        unsqueezed = view.node(node.inputs[0], "reshape")
        if unsqueezed is None:
            return None
        out = view.shape(node.outputs[0])
        if view.shape(unsqueezed.outputs[0]) != (1,) * (len(out) - 2) + out[-2:]:
            return None
        passed |= {node.name, unsqueezed.name}
        node = view.producer.get(unsqueezed.inputs[0])
    if node is None or node.op != "transpose" or tuple(node.attrs["perm"]) != (1, 0):
        return None
    if node.inputs[0] not in view.graph.params or len(view.shape(node.inputs[0])) != 2:
        return None
    return node.inputs[0], passed | {node.name}


# --- rope --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    """A cos or sin table: func(concat(pos * inv_freq, pos * inv_freq)) * factor, [Bt, S, Dh]."""

    angles: str  # the pos * inv_freq value
    positions: str  # the positions param ([Bt, S, 1], float)
    inv_freq: str
    factor: float
    positions_value: np.ndarray
    inv_freq_value: np.ndarray


def _table(view: _View, value: str, func: str) -> _Table | None:
    factor = 1.0
    node = view.producer.get(value)
    if node is not None and node.op == "mul":
        for t, c in _orders(node):
            f = view.scalar(c)
            if f is not None and view.node(t, func) is not None:
                factor, node = f, view.node(t, func)
                break
        else:
            return None
    if node is None or node.op != func:
        return None
    cat = view.node(node.inputs[0], "concat")
    if cat is None or len(cat.inputs) != 2 or cat.inputs[0] != cat.inputs[1]:
        return None
    rank = len(view.shape(cat.outputs[0]))
    if cat.attrs["axis"] not in (rank - 1, -1) or rank != 3:
        return None
    angles = view.node(cat.inputs[0], "mul")
    if angles is None:
        return None
    for p, inv in _orders(angles):
        pv, iv = view.const(p), view.const(inv)
        if pv is None or iv is None or pv.ndim != 3 or pv.shape[-1] != 1 or iv.ndim != 1:
            continue
        return _Table(angles.outputs[0], p, inv, factor, pv, iv)
    return None


def _rope_type(inv: np.ndarray, head_dim: int) -> dict[str, object] | None:
    """The rope op attributes whose inverse frequencies are `inv` (within 8 float32 ulp at every one:
    transformers computes them in float32, the rope op in float64, and llama3's smoothed band differs
    by up to 6 ulp; a builder graph of the same config has the same frequencies, and another base or
    factor is thousands of ulp away or more), if there are: the
    default type (theta ** (-2i / d)), linear scaling (all of them divided by one factor) or llama3
    (the low ones divided, a smooth band between). Other types (yarn, longrope, dynamic...) stay
    general."""
    if head_dim < 4 or inv.shape != (head_dim // 2,) or not np.all(np.isfinite(inv)) or np.any(inv <= 0):
        return None
    inv64 = inv.astype(np.float64)

    def fits(attrs: dict[str, object]) -> bool:
        want = rope_inv_freq(head_dim, attrs)
        return bool(np.all(np.abs(inv.astype(np.float32) - want) <= 8 * np.spacing(want)))

    # The highest frequencies are unscaled by llama3, divided by one factor by linear: the base from
    # inv[k] / inv[0] = theta ** (-2k / d), for the first k (a larger k amplifies inv's rounding less).
    thetas = [float((inv64[k] / inv64[0]) ** (-head_dim / (2 * k))) for k in range(1, min(8, len(inv)))]
    for t in dict.fromkeys(c for theta in thetas for c in _round_first(theta)):
        if not t > 1:
            continue
        for f in _round_first(float(1.0 / inv64[0])):
            attrs: dict[str, object] = (
                {"theta": t} if f == 1.0 else {"theta": t, "rope_type": "linear", "factor": f}
            )
            if f > 0 and fits(attrs):
                return attrs
        for attrs in _llama3_candidates(inv64, head_dim, t):
            if fits(attrs):
                return attrs
    return None


def _llama3_candidates(inv: np.ndarray, head_dim: int, theta: float) -> Iterator[dict[str, object]]:
    """llama3 attributes that may give `inv`: the factor is the lowest frequency's division, and the
    band edges come from a line through the smoothed frequencies (two or more of them), or from the
    gap between the scaled and unscaled ones (none smoothed), or they are Llama 3's own (low 1, high
    4, 8192 positions); the caller checks each against every frequency.
    Attributes that give the same frequencies at this head_dim are the same rope."""
    default = rope_inv_freq(head_dim, {"theta": theta}, dtype=np.float64)
    ratio = inv / default
    if ratio.min() >= 1 - 1e-6:
        return
    for factor in _round_first(float(1.0 / ratio.min())):
        base: dict[str, object] = {"theta": theta, "rope_type": "llama3", "factor": factor}
        yield {
            **base,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        if factor <= 1:
            continue
        smooth = (ratio - 1 / factor) / (1 - 1 / factor)  # 0 in the low band, 1 in the high band
        medium = (smooth > 1e-4) & (smooth < 1 - 1e-4)
        wavelen = 2 * math.pi / default
        if not medium.any():  # no smoothed band (Llama 4's equal factors): one edge, in the gap
            high, low = wavelen[smooth >= 1 - 1e-4], wavelen[smooth <= 1e-4]
            old = math.ceil(high.max()) if high.size else 1
            if not low.size or old < low.min():
                yield {**base, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                       "original_max_position_embeddings": old}  # fmt: skip
        if medium.sum() < 2:
            continue
        # smooth = old / wavelen / (hi - lo) - lo / (hi - lo): 0 at 1 / wavelen = lo / old, 1 at hi / old
        u = 1 / wavelen
        slope, intercept = np.polyfit(u[medium], smooth[medium], 1)
        if not slope > 0:
            continue
        u_lo, u_hi = -intercept / slope, (1 - intercept) / slope
        if not 0 < u_lo < u_hi:
            continue
        old = round(1 / u_lo)  # low_freq_factor 1: the rope op takes the context length as an integer
        if old >= 1:
            yield {**base, "low_freq_factor": 1.0, "high_freq_factor": round(float(old * u_hi), 3),
                   "original_max_position_embeddings": old}  # fmt: skip


def _round_first(x: float) -> tuple[float, ...]:
    return tuple(dict.fromkeys((float(round(x)), round(x, 3), x)))


def _rope(view: _View, root: Node) -> _Match | None:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., h:], x[..., :h]), with cos and sin
    tables of the default rope type at integer positions (transformers' apply_rotary_pos_emb)."""
    if root.op != "add" or len(view.shape(root.outputs[0])) != 4:
        return None
    for a, b in _orders(root):
        cos_mul, sin_mul = view.node(a, "mul"), view.node(b, "mul")
        if cos_mul is None or sin_mul is None:
            continue
        for x, cos4 in _orders(cos_mul):
            for rot, sin4 in _orders(sin_mul):
                found = _rope_match(view, root, x, cos4, rot, sin4, cos_mul, sin_mul)
                if found is not None:
                    return found
    return None


def _rope_match(
    view: _View, root: Node, x: str, cos4: str, rot: str, sin4: str, cos_mul: Node, sin_mul: Node
) -> _Match | None:
    shape = view.shape(x)
    if len(shape) != 4 or view.shape(root.outputs[0]) != shape or not view.is_f32(x):
        return None
    dh = shape[3]
    half = dh // 2
    cat = view.node(rot, "concat")
    if cat is None or len(cat.inputs) != 2 or cat.attrs["axis"] not in (3, -1) or dh % 2:
        return None
    neg = view.node(cat.inputs[0], "neg")
    first = view.node(cat.inputs[1], "slice")
    second = None if neg is None else view.node(neg.inputs[0], "slice")
    if first is None or second is None or neg is None:
        return None
    for s, (lo, hi) in ((first, (0, half)), (second, (half, dh))):
        if (
            s.inputs[0] != x
            or s.attrs["axis"] not in (3, -1)
            or (s.attrs["start"], s.attrs["end"]) != (lo, hi)
        ):
            return None
    # the tables, unsqueezed to [Bt, 1, S, Dh] (heads first) or [Bt, S, 1, Dh]
    c_view, s_view = view.node(cos4, "reshape"), view.node(sin4, "reshape")
    if c_view is None or s_view is None:
        return None
    cos, sin = _table(view, c_view.inputs[0], "cos"), _table(view, s_view.inputs[0], "sin")
    if cos is None or sin is None or cos.angles != sin.angles or cos.factor != sin.factor:
        return None
    table_shape = view.shape(c_view.inputs[0])  # [Bt, S, Dh]
    if view.shape(s_view.inputs[0]) != table_shape or table_shape[2] != dh:
        return None
    bt, s_len = table_shape[0], table_shape[1]
    if view.shape(cos4) == (bt, 1, s_len, dh) and shape[2] == s_len:
        heads_first = True
    elif view.shape(cos4) == (bt, s_len, 1, dh) and shape[1] == s_len:
        heads_first = False
    else:
        return None
    if view.shape(sin4) != view.shape(cos4) or bt not in (1, shape[0]):
        return None
    key = (cos.inv_freq, dh)
    if key not in view.rope_types:  # every layer reads the one inv_freq: its type is found once
        view.rope_types[key] = _rope_type(cos.inv_freq_value, dh)
    rope = view.rope_types[key]
    positions = _positions(cos.positions_value, shape[0])
    if rope is None or positions is None:
        return None
    pos_name = _positions_param(view, cos.positions, positions)
    name = _rope_name(view, x) or _prefix([root.name, cos_mul.name, sin_mul.name, cat.name]) + ".rope"
    nodes: list[Node] = []
    src = x
    if heads_first:  # the rope op reads [B, S, H, Dh]: undo the transpose that made x, or add one
        tr = view.node(x, "transpose")
        if tr is not None and tuple(tr.attrs["perm"]) == _TO_BSHD:
            src = tr.inputs[0]
        else:
            nodes.append(_new(view, f"{name}.to_bshd", "transpose", (x,), None, perm=_TO_BSHD))
            src = nodes[-1].outputs[0]
        nodes.append(_new(view, name, "rope", (src, pos_name), None, attention_factor=cos.factor, **rope))
        nodes.append(
            _new(view, f"{name}.to_bhsd", "transpose", nodes[-1].outputs, root.outputs[0], perm=_TO_BSHD)
        )
    else:
        nodes.append(
            _new(view, name, "rope", (src, pos_name), root.outputs[0], attention_factor=cos.factor, **rope)
        )
    inner = frozenset({cos_mul.name, sin_mul.name, cat.name, neg.name, first.name, second.name})
    params = {pos_name: positions} if pos_name not in view.graph.params else {}
    return _Match(root.name, tuple(nodes), inner, params)


def _rope_name(view: _View, x: str) -> str | None:
    """`<projection>.rope` (`model.layers.0.self_attn.q_proj.rope`) where x is a projection's output
    split into heads (and transposed), so that q's and k's ropes are told apart by name."""
    node = view.producer.get(x)
    while node is not None and node.op in ("transpose", "reshape"):
        node = view.producer.get(node.inputs[0])
    return f"{node.name}.rope" if node is not None and node.op == "linear" else None


def _positions(pos: np.ndarray, batch: int) -> np.ndarray | None:
    """[Bt, S, 1] float positions as i32 [B, S], if every one is a whole number in range."""
    flat = pos.reshape(pos.shape[0], pos.shape[1]).astype(np.float64)
    if (
        not np.all(np.isfinite(flat))
        or np.any(flat != np.round(flat))
        or np.any(flat < 0)
        or np.any(flat >= 2**24)
    ):
        return None
    return np.ascontiguousarray(np.broadcast_to(flat.astype(np.int32), (batch, flat.shape[1])))


def _positions_param(view: _View, source: str, positions: np.ndarray) -> str:
    """One i32 positions param per float positions constant and batch (shared by every layer's rope)."""
    for name, arr in view.new_params.items():
        if name.startswith(f"{source}.positions") and arr.shape == positions.shape:
            return name
    for name in view.graph.params:
        if name.startswith(f"{source}.positions") and view.shape(name) == positions.shape:
            return name
    name = view.fresh(f"{source}.positions")
    view.new_params[name] = positions
    return name


# --- attention ---------------------------------------------------------------------------------------


def _attention(view: _View, anchor: Node) -> _Match | None:
    """softmax(q k^T * scale + causal mask) v over [B, H, S, Dh] heads (torch's decomposed
    scaled_dot_product_attention: q and k each scaled by sqrt(scale), batched matmuls over [B * H],
    the rows that see no key zeroed; or transformers' eager attention: the scores scaled), grouped-
    query k and v repeated per query head (repeat_kv), its output transposed to [B, S, H, Dh].
    Anchored at the softmax."""
    if anchor.op != "softmax":
        return None
    masked = anchor.inputs[0]
    shape = view.shape(masked)
    if len(shape) != 4 or anchor.attrs["axis"] not in (-1, 3) or not view.is_f32(masked):
        return None
    b, h, s, t = shape
    inner = {anchor.name}
    # the mask: causal, added to the scores
    add = view.node(masked, "add")
    if add is None:
        return None
    for scores4, m in _orders(add):
        if _is_causal(view.const(m), shape) and view.shape(scores4) == shape:
            break
    else:
        return None
    inner.add(add.name)
    probs = anchor.outputs[0]
    safe = _safe_rows(view, anchor, masked)
    if safe is not None:
        probs, rows = safe
        inner |= rows
    # scores = (q * cq) @ (k^T * ck), as [B * H] batches, times cs (transformers' eager attention
    # scales the scores, torch's decomposed SDPA q and k)
    cs = 1.0
    scaled = view.node(scores4, "mul")
    if scaled is not None:
        for y, c in _orders(scaled):
            factor = view.scalar(c)
            if factor is not None and view.shape(y) == shape and view.node(y, "reshape") is not None:
                cs, scores4 = factor, y
                inner.add(scaled.name)
                break
        else:
            return None
    r_scores = view.node(scores4, "reshape")
    mm = None if r_scores is None else view.node(r_scores.inputs[0], "matmul")
    if r_scores is None or mm is None or view.shape(mm.outputs[0]) != (b * h, s, t):
        return None
    inner |= {r_scores.name, mm.name}
    q_side = _scaled(view, mm.inputs[0], (b * h, s, -1), (b, h, s, -1))
    k_side = _scaled(view, mm.inputs[1], (b * h, -1, t), (b, h, -1, t))
    if q_side is None or k_side is None:
        return None
    q4, cq, q_inner = q_side
    kt, ck, k_inner = k_side
    k_tr = view.node(kt, "transpose")
    if k_tr is None or tuple(k_tr.attrs["perm"]) != (0, 1, 3, 2):
        return None
    k4 = k_tr.inputs[0]
    inner |= q_inner | k_inner | {k_tr.name}
    dh = view.shape(q4)[3]
    # out = probs @ v, as [B * H] batches, back to [B, H, S, Dh]
    r_p = view.only_reader(probs)
    if r_p is None or r_p.op != "reshape" or view.shape(r_p.outputs[0]) != (b * h, s, t):
        return None
    pv = view.only_reader(r_p.outputs[0])
    if pv is None or pv.op != "matmul" or pv.inputs[0] != r_p.outputs[0]:
        return None
    r_v = view.node(pv.inputs[1], "reshape")
    out4 = view.only_reader(pv.outputs[0])
    if r_v is None or out4 is None or out4.op != "reshape" or view.shape(out4.outputs[0]) != (b, h, s, dh):
        return None
    v4 = r_v.inputs[0]
    if (
        view.shape(v4) != (b, h, t, dh)
        or view.shape(k4) != (b, h, t, dh)
        or view.shape(r_v.outputs[0]) != (b * h, t, dh)
    ):
        return None
    inner |= {r_p.name, pv.name, r_v.name}
    k, k_rep = _kv_heads(view, k4)
    v, v_rep = _kv_heads(view, v4)
    inner |= k_rep | v_rep
    if view.shape(k) != view.shape(v) or h % view.shape(k)[1] or not view.is_f32(q4, k, v):
        return None
    scale = cq * ck * cs
    if not (scale > 0 and math.isfinite(scale)):
        return None
    # the root: the transposes that take the output to [B, S, H, Dh], else the [B, H, S, Dh] output
    root, perm, node = out4, (0, 1, 2, 3), out4
    while (nxt := view.only_reader(node.outputs[0])) is not None and nxt.op == "transpose":
        perm = tuple(perm[j] for j in nxt.attrs["perm"])
        node = nxt
        if perm == _TO_BSHD:
            inner |= {out4.name} | {root.name}
            root = node
            break
    name = _prefix(sorted(inner)) + ".sdpa"
    nodes: list[Node] = []
    q_in, k_in, v_in = (
        _as_bshd(view, name, role, value, nodes) for role, value in (("q", q4), ("k", k), ("v", v))
    )
    heads_first = root is out4
    attention = _new(view, name, "attention", (q_in, k_in, v_in), None if heads_first else root.outputs[0],
                     causal=True, scale=scale)  # fmt: skip
    nodes.append(attention)
    if heads_first:
        nodes.append(
            _new(view, f"{name}.to_bhsd", "transpose", attention.outputs, root.outputs[0], perm=_TO_BSHD)
        )
    inner.discard(root.name)
    return _Match(root.name, tuple(nodes), frozenset(inner))


def _scaled(
    view: _View, flat: str, flat_shape: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[str, float, set[str]] | None:
    """A [B * H, ...] batch operand: reshape(value * c) (or of value alone), c a positive scalar: the
    [B, H, ...] value, c (1.0 when there is none) and the nodes passed."""

    def fits(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
        return len(got) == len(want) and all(w in (-1, g) for g, w in zip(got, want, strict=True))

    r = view.node(flat, "reshape")
    if r is None or not fits(view.shape(flat), flat_shape) or not fits(view.shape(r.inputs[0]), shape):
        return None
    value, passed = r.inputs[0], {r.name}
    mul = view.node(value, "mul")
    if mul is not None:
        for x, c in _orders(mul):
            scale = view.scalar(c)
            if scale is not None and view.shape(x) == view.shape(value):
                if not scale > 0:
                    return None
                return x, scale, passed | {mul.name}
    return value, 1.0, passed


def _kv_heads(view: _View, value: str) -> tuple[str, set[str]]:
    """The [B, Hkv, T, Dh] keys or values that repeat_kv expanded to `value` ([B, H, T, Dh]), or
    `value` itself when it is not such a repeat."""
    merged = view.node(value, "reshape")
    expand = None if merged is None else view.node(merged.inputs[0], "expand")
    split = None if expand is None else view.node(expand.inputs[0], "reshape")
    if merged is None or expand is None or split is None:
        return value, set()
    b, h, t, dh = view.shape(value)
    kv = split.inputs[0]
    if len(view.shape(kv)) != 4:
        return value, set()
    hkv = view.shape(kv)[1]
    rep = h // hkv if hkv and h % hkv == 0 else 0
    if (
        not rep
        or view.shape(kv) != (b, hkv, t, dh)
        or view.shape(split.outputs[0]) != (b, hkv, 1, t, dh)
        or view.shape(expand.outputs[0]) != (b, hkv, rep, t, dh)
    ):
        return value, set()
    return kv, {merged.name, expand.name, split.name}


def _as_bshd(view: _View, name: str, role: str, value: str, nodes: list[Node]) -> str:
    """`value` ([B, H, S, Dh]) as [B, S, H, Dh]: the input of the transpose that made it, or a new one."""
    tr = view.node(value, "transpose")
    if tr is not None and tuple(tr.attrs["perm"]) == _TO_BSHD:
        return tr.inputs[0]
    nodes.append(_new(view, f"{name}.{role}_bshd", "transpose", (value,), None, perm=_TO_BSHD))
    return nodes[-1].outputs[0]


def _is_causal(mask: np.ndarray | None, shape: tuple[int, ...]) -> bool:
    """Whether `mask`, added to [B, H, S, T] scores, is exactly the causal mask: 0 where key j <= query
    i, -inf (or float32's lowest, which softmax turns into the same 0) above the diagonal; S == T."""
    b, h, s, t = shape
    if mask is None or s != t or not 2 <= mask.ndim <= 4:
        return False
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # [S, T] or [B, S, T] broadcast as torch does
    if any(d not in (1, want) for d, want in zip(mask.shape, shape, strict=True)) or mask.shape[2:] != (s, t):
        return False
    full = np.broadcast_to(mask, shape)
    seen = np.tril(np.ones((s, t), dtype=bool))
    full = full.astype(np.float64)
    return bool(np.all(full[..., seen] == 0) and np.all(full[..., ~seen] <= _F32_MIN))


def _safe_rows(view: _View, softmax: Node, masked: str) -> tuple[str, set[str]] | None:
    """torch's safe softmax: where(not any(masked != -inf, last axis), 0, softmax). Under a causal
    mask every row sees its diagonal key, so this is the softmax itself."""
    for reader in view.consumers.get(softmax.outputs[0], []):
        if reader.op != "where" or reader.inputs[2] != softmax.outputs[0]:
            continue
        cond, zeros = reader.inputs[0], view.const(reader.inputs[1])
        if zeros is None or np.any(zeros != 0):
            continue
        not_any = view.node(cond, "logical_not")
        any_ = None if not_any is None else view.node(not_any.inputs[0], "reduce_any")
        seen = None if any_ is None else view.node(any_.inputs[0], "logical_not")
        eq = None if seen is None else view.node(seen.inputs[0], "eq")
        if not_any is None or any_ is None or seen is None or eq is None:
            continue
        if tuple(any_.attrs["axes"]) not in ((3,), (-1,)) or not any_.attrs["keepdims"]:
            continue
        if not any(a == masked and view.scalar(c) == -math.inf for a, c in _orders(eq)):
            continue
        return reader.outputs[0], {reader.name, not_any.name, any_.name, seen.name, eq.name}
    return None


# --- the pass ----------------------------------------------------------------------------------------

RULES: tuple[tuple[str, Rule], ...] = (
    ("rmsnorm", _rmsnorm),
    ("silu", _silu),
    ("linear", _linear),
    ("rope", _rope),
    ("attention", _attention),
)


def recognize(graph: Graph, weights: Mapping[str, np.ndarray]) -> Recognized:
    """`graph` with every subgraph a rule matches exactly raised to model-level ops (see the module
    docstring), dead code removed and verified; `graph` and `weights` are unchanged."""
    counts: dict[str, int] = {}
    current = graph
    values = dict(weights)
    for rule_name, rule in RULES:
        view = _View(current, values)
        matches: dict[str, _Match] = {}
        inner: set[str] = set()
        for node in reversed(current.nodes):  # the outermost match first: its inner nodes are not roots
            if node.name in inner:
                continue
            match = rule(view, node)
            if match is None or match.root in matches or match.root in inner or not _types_hold(view, match):
                continue
            matches[match.root] = match
            inner |= match.inner
        counts[rule_name] = len(matches)
        if matches:
            current = _rebuilt(current, matches)
            for match in matches.values():
                values.update(match.params)
    if current is graph:  # nothing raised: the import's graph as it is (its unread params kept)
        return Recognized(graph, dict(weights), counts)
    out = dce(current)  # verifies the rewritten graph, and what is left of it
    return Recognized(out, {name: values[name] for name in out.params}, counts)


def _types_hold(view: _View, match: _Match) -> bool:
    """Whether the new nodes infer, and define the root's value with the root's type (a safety net
    under the rules' own shape checks)."""
    types = dict(view.types)
    for name, arr in match.params.items():
        types[name] = TensorType(DType.of(arr), tuple(arr.shape))
    try:
        for node in match.nodes:
            types.update(zip(node.outputs, infer_node(node, [types[v] for v in node.inputs]), strict=True))
    except (OpError, KeyError):
        return False
    root = view.graph.node(match.root)
    return types[root.outputs[0]] == view.types[root.outputs[0]] and len(root.outputs) == 1


def _rebuilt(graph: Graph, matches: Mapping[str, _Match]) -> Graph:
    out = graph.copy()
    out.nodes = []
    for node in graph.nodes:
        out.nodes.extend(matches[node.name].nodes if node.name in matches else (node,))
    for match in matches.values():
        for name, arr in match.params.items():
            out.params[name] = TensorType(DType.of(arr), tuple(arr.shape))
    return out
