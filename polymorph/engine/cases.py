"""Inputs for one node group and what the reference makes of them: the cases the gates run and the
calls the trusted timing checks, drawn on the controller's side.

A case is one call of a group's launch at a (batch, seq) shape: activations (and caches) from a
distribution, token ids, positions and block tables as a serving step has them (ragged contexts,
blocks scattered through a small pool), None for a weight, which the worker takes from the engine.

MoE routing, by the case's distribution (`ROUTING`): the expert indices an moe_ffn reads are k distinct
experts per token, spread uniformly, imbalanced (nine tokens in ten send their first choice to
expert 0) or all on the same k experts; the logits a topk_router reads are drawn as they come,
pushed towards expert 0 for most tokens (imbalance), or with near-ties: half the rows with the k-th
and (k+1)-th logit equal (the contract breaks ties to the lower index), half with them
`NEAR_TIE_STEPS` steps of the dtype apart relative to the row (beyond the rounding a kernel may
differ by, so the choice is still determined). The positions an index_attention reads (DeepSeek-V3.2's
sparse attention) are what an indexer would hand it: up to k distinct visible positions per query,
its own among them, -1 after.

Any other integer input (an imported program's: a GNN's edge indices) is drawn from the range it can
legally take (polymorph/ir/int_ranges.py): [0, n) where it indexes a dim of n, else the program's
example inputs' range; both ends of the range are in every draw, and the case's distribution picks
the pattern of the rest (`INDEX_PATTERNS`): uniform, sorted (a kernel's fast path for sorted or
CSR-style indices), or a hub (all but a few entries one value: a target many times over, as a
power-law graph's hub node is, and most rows no entry reaches). A bool input (a mask) is drawn half
True at random, all True (nothing masked) or all False, by the case's distribution (`BOOL_PATTERNS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polymorph.engine.windows import released_blocks
from polymorph.ir.dtypes import DType
from polymorph.ir.int_ranges import legal_ranges
from polymorph.ir.shapes import concrete
from polymorph.serving.kvcache import PagedKVCache

DISTRIBUTIONS = ("normal", "uniform ±1e3", "normal with outliers ±1e4")
ROUTING = dict(zip(DISTRIBUTIONS, ("uniform", "imbalanced", "near-ties"), strict=True))
INDEX_PATTERNS = dict(zip(DISTRIBUTIONS, ("uniform", "sorted", "hub"), strict=True))
HUB_SHARE = 0.875  # of a hub draw's entries that hold its one value
# A bool input (a mask) by the case's distribution: half True at random, every element True (nothing
# masked: a batch without padding), or every element False.
BOOL_PATTERNS = dict(zip(DISTRIBUTIONS, ("random", "all True", "all False"), strict=True))
# An imported program's extra float regime: normal draws about a common offset of 1e3 (a random sign
# per tensor), as activations with a DC component are. A variance as E[x^2] - E[x]^2, or any sum that
# cancels in float32, is right about zero and wrong here.
OFFSET = "normal about a common offset ±1e3"
# And one past float16's range (65504): an eighth of the elements at ±1e6 (a kernel that clamps to a
# narrower format's range, or computes in it, is right below it and wrong here).
HUGE = "normal with outliers ±1e6"
PROGRAM_REGIMES = (OFFSET, HUGE)
# Bit-exact mode's extra float regimes (the `exact` gate's, compared with the stock kernel's bytes and
# never with the reference): normal draws with a quarter of the elements special values, each of them
# at least once. Tiny: signed zeros, float32 subnormals and the smallest normals, f16 subnormals,
# exact integers and powers of two (a flush-to-zero mode, a max(x, 0) that drops a zero's sign, a
# rounding that differs only on exact halves). Non-finite: infinities, NaN, magnitudes that overflow a
# narrower format.
SPECIALS = ("zeros, subnormals and exact values", "infinities, NaN and huge values")
_TINY = (0.0, -0.0, 2.0**-149, -(2.0**-149), 3 * 2.0**-140, -(2.0**-130), 2.0**-126, -(2.0**-126),
         2.0**-20, -(3 * 2.0**-24), 0.5, -1.5, 2.0, -3.0, 2.0**24 + 1, 1.0)  # fmt: skip
_NONFINITE = (np.inf, -np.inf, np.nan, 1e30, -1e30, 7e4, -7e4, 3.4e38, -3.4e38)
NEAR_TIE_STEPS = 16


class Undrawable(Exception):
    """No meaningful inputs can be drawn for this group."""


@dataclass(frozen=True)
class GroupInfo:
    """What the controller knows of a group of the loaded plan, with the graph it comes from."""

    id: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[str, ...]
    graph: Any
    types: Any

    @classmethod
    def of(cls, info: dict[str, Any], graph: Any, types: Any) -> GroupInfo:
        return cls(
            info["id"], tuple(info["inputs"]), tuple(info["outputs"]), tuple(info["nodes"]), graph, types
        )

    def is_weight(self, value: str) -> bool:
        return value in self.graph.params

    def is_state(self, value: str) -> bool:
        return value in self.graph.state


def draw_float(rng: np.random.Generator, dist: str, shape: tuple[int, ...]) -> np.ndarray:
    if dist == DISTRIBUTIONS[0]:
        return rng.standard_normal(shape)
    if dist == DISTRIBUTIONS[1]:
        return rng.uniform(-1e3, 1e3, shape)
    if dist == OFFSET:
        return rng.standard_normal(shape) + float(rng.choice([-1e3, 1e3]))
    if dist == HUGE:
        x = rng.standard_normal(shape)
        n = max(1, x.size // 8)
        x.flat[rng.choice(x.size, n, replace=False)] = rng.choice([-1e6, 1e6], n)
        return x
    if dist in SPECIALS:
        x = rng.standard_normal(shape)
        values = np.array(_TINY if dist == SPECIALS[0] else _NONFINITE)
        n = min(x.size, max(values.size, x.size // 4))
        at = rng.choice(x.size, n, replace=False)
        x.flat[at] = np.resize(rng.permutation(values), n)  # each value at least once where there is room
        return x
    x = rng.standard_normal(shape)
    n = max(1, x.size // 200)
    x.flat[rng.choice(x.size, n, replace=False)] = rng.choice([-1e4, 1e4], n)
    return x


def draw(
    group: GroupInfo,
    rng: np.random.Generator,
    shape: tuple[int, int],
    dist: str,
    *,
    block_size: int,
    bucket_ctx: int,
    vocab: int,
    longest: bool = False,
) -> tuple[list[np.ndarray | None], dict[str, int]]:
    """Inputs for one call at `shape` = (batch, seq). The contexts are ragged: each sequence holds a
    random number of tokens before the chunk; with `longest`, they range up to the bucket's longest
    context and the first sequence reaches it (an attention that reads only a prefix, or a kernel that
    reads another sequence's blocks at long contexts, shows here), else they stay short (a few blocks)."""
    batch, seq = shape
    ctx_blocks = max(1, bucket_ctx // block_size)
    if longest:
        per_seq = ctx_blocks
    else:
        per_seq = min(ctx_blocks, -(-(seq + 2 * block_size) // block_size))
    room = per_seq * block_size - seq  # tokens a sequence may hold before its chunk
    cache = PagedKVCache(block_size, batch * per_seq + 1, ctx_blocks)
    positions = []
    for b in range(batch):
        before = room if longest and b == 0 else int(rng.integers(0, room + 1))
        cache.reserve(b, before)
        positions.append(cache.reserve(b, seq))
    bindings = {"batch": batch, "seq": seq, "ctx_blocks": ctx_blocks, "cache_blocks": batch * per_seq + 1}
    ints = {
        "positions": np.stack(positions),
        "block_table": cache.block_table(list(range(batch))),
        "tokens": rng.integers(0, vocab, size=(batch, seq), dtype=np.int32),
    }
    experts = _expert_inputs(group)
    selections = _selection_inputs(group)
    inputs: list[np.ndarray | None] = []
    for v in group.inputs:
        t = group.types[v]
        unbound = [d for d in t.shape if isinstance(d, str) and d not in bindings]
        if unbound:
            raise Undrawable(f"input `{v}` has dims {unbound} the gate cannot choose")
        if group.is_weight(v):
            inputs.append(None)  # the engine's weights: kernels may rely on them staying put
        elif t.dtype.is_float:
            inputs.append(draw_float(rng, dist, concrete(t.shape, bindings)).astype(t.dtype.numpy))
        elif v in ints:
            inputs.append(ints[v].astype(t.dtype.numpy))
        elif v in selections:
            inputs.append(_selected_positions(rng, ints["positions"], selections[v]).astype(t.dtype.numpy))
        elif v in experts:
            inputs.append(
                _expert_indices(rng, concrete(t.shape, bindings), experts[v], ROUTING.get(dist, "uniform"))
            )
        elif t.dtype == DType.BOOL:
            inputs.append(_draw_bool(rng, concrete(t.shape, bindings), BOOL_PATTERNS.get(dist, "random")))
        elif v in (legal := _legal(group)):
            lo, hi = legal[v]
            pattern = INDEX_PATTERNS.get(dist, "uniform")
            inputs.append(_draw_in(rng, concrete(t.shape, bindings), lo, hi, pattern).astype(t.dtype.numpy))
        else:
            raise Undrawable(f"integer input `{v}` has no known meaning or range to draw from")
    _shape_router_logits(group, inputs, rng, ROUTING.get(dist, "uniform"))
    release_slid_out(group, inputs, ints["block_table"], ints["positions"], block_size)
    return inputs, {k: n for k, n in bindings.items() if k in group.graph.symbols()}


def _legal(group: GroupInfo) -> dict[str, tuple[int, int]]:
    """The legal ranges of the graph's integer values (polymorph/ir/int_ranges.py), once per graph."""
    got = _LEGAL.get(id(group.graph))
    if got is None or got[0] is not group.graph:
        got = (group.graph, legal_ranges(group.graph))
        _LEGAL.clear()  # one graph at a time: an engine holds one plan
        _LEGAL[id(group.graph)] = got
    return got[1]


_LEGAL: dict[int, tuple[Any, dict[str, tuple[int, int]]]] = {}


def _draw_in(
    rng: np.random.Generator, shape: tuple[int, ...], lo: int, hi: int, pattern: str = "uniform"
) -> np.ndarray:
    """Integers in [lo, hi) in `pattern` (`INDEX_PATTERNS`), both ends among them where there is room:
    an index kernel that drops the first or the last row of its dim, or clamps short of it, shows on
    every draw. uniform: independent draws; sorted: the same, ascending over the flattened tensor;
    hub: all but a few entries one value drawn from the range (one target many times over, most rows
    none)."""
    x = rng.integers(lo, hi, shape)
    if x.size >= 2:
        flat = x.reshape(-1)
        if pattern == "hub":
            flat[rng.random(flat.size) < HUB_SHARE] = rng.integers(lo, hi)
        at = rng.choice(flat.size, 2, replace=False)
        flat[at[0]], flat[at[1]] = lo, hi - 1
        if pattern == "sorted":
            flat.sort()
    return x


def _draw_bool(rng: np.random.Generator, shape: tuple[int, ...], pattern: str) -> np.ndarray:
    if pattern == "all True":
        return np.ones(shape, dtype=bool)
    if pattern == "all False":
        return np.zeros(shape, dtype=bool)
    return rng.random(shape) < 0.5


def _group_nodes(group: GroupInfo) -> list[Any]:
    by_name = {n.name: n for n in group.graph.nodes}
    return [by_name[name] for name in group.nodes]


def _expert_inputs(group: GroupInfo) -> dict[str, int]:
    """The expert-index inputs of the group's moe_ffn nodes -> the number of experts."""
    return {
        n.inputs[2]: int(group.types[n.inputs[3]].shape[0])
        for n in _group_nodes(group)
        if n.op == "moe_ffn" and n.inputs[2] in group.inputs
    }


def _selection_inputs(group: GroupInfo) -> dict[str, int]:
    """The selected-position inputs of the group's index_attention nodes -> positions per query."""
    return {
        n.inputs[5]: int(group.types[n.inputs[5]].shape[-1])
        for n in _group_nodes(group)
        if n.op == "index_attention" and n.inputs[5] in group.inputs
    }


def _selected_positions(rng: np.random.Generator, positions: np.ndarray, k: int) -> np.ndarray:
    """What an indexer hands its sparse attention: per query, up to k distinct positions it may see
    (t <= its own, in random order, always its own among them), -1 after them."""
    out = np.full((*positions.shape, k), -1, dtype=np.int64)
    for b, s in np.ndindex(positions.shape):
        p = int(positions[b, s])
        seen = rng.permutation(p)[: k - 1] if p else np.zeros(0, dtype=np.int64)
        chosen = rng.permutation(np.concatenate([seen, [p]]))
        out[b, s, : chosen.size] = chosen
    return out


def _expert_indices(
    rng: np.random.Generator, shape: tuple[int, ...], experts: int, routing: str
) -> np.ndarray:
    """k distinct experts per token ([*, k]) as `routing` spreads them."""
    k = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if routing == "near-ties":  # every token on the same k experts: one expert group holds them all
        chosen = np.tile(rng.permutation(experts)[:k], (rows, 1))
    else:
        chosen = np.argsort(rng.random((rows, experts)), axis=-1)[:, :k]
        if routing == "imbalanced":  # nine tokens in ten send their first choice to expert 0
            hot = rng.random(rows) < 0.9
            has0 = (chosen == 0).any(axis=-1)
            swap = hot & ~has0
            chosen[swap, 0] = 0
            first = np.argmax(chosen == 0, axis=-1)
            move = hot & has0
            chosen[move, first[move]], chosen[move, 0] = chosen[move, 0], 0
    return chosen.reshape(shape)


def _shape_router_logits(
    group: GroupInfo, inputs: list[np.ndarray | None], rng: np.random.Generator, routing: str
) -> None:
    """Imbalance or near-ties into the logits a topk_router of the group reads (see the module doc)."""
    for node in _group_nodes(group):
        v = node.inputs[0]
        if node.op != "topk_router" or v not in group.inputs or routing == "uniform":
            continue
        i = group.inputs.index(v)
        x = inputs[i]
        if x is None or x.shape[-1] <= int(node.attrs["k"]):
            continue
        dtype = x.dtype
        rows = x.astype(np.float32).reshape(-1, x.shape[-1])
        scale = np.maximum(np.abs(rows).max(axis=-1), 1.0)
        if routing == "imbalanced":
            hot = rng.random(rows.shape[0]) < 0.9
            rows[hot, 0] += 2.0 * scale[hot]
        else:
            k = int(node.attrs["k"])
            order = np.argsort(-rows, axis=-1, kind="stable")
            kth, nxt = order[:, k - 1], order[:, k]
            at = np.arange(rows.shape[0])
            eps = float(np.finfo(np.float32).eps) if dtype == np.float32 else 2.0**-7
            gap = np.where(at % 2 == 0, 0.0, NEAR_TIE_STEPS * eps * scale)
            rows[at, nxt] = rows[at, kth] - gap
        inputs[i] = rows.reshape(x.shape).astype(dtype)


def release_slid_out(
    group: GroupInfo,
    inputs: list[np.ndarray | None],
    table: np.ndarray,
    positions: np.ndarray,
    block_size: int,
) -> None:
    """NaN into the blocks of the drawn caches that every query of their sequence sees nothing of under
    the window of the group's attention (`polymorph.engine.windows`): a kernel may skip them, never read
    them (a read, or a mask applied by multiplication, shows NaN)."""
    by_name = {n.name: n for n in group.graph.nodes}
    producer = {v: by_name[name] for name in group.nodes for v in by_name[name].outputs}
    owned = -(-(positions.max(axis=1) + 1) // block_size)  # each sequence's blocks, this chunk included
    for name in group.nodes:
        node = by_name[name]
        window = int(node.attrs.get("window", 0) or 0)
        if node.op != "cache_attention" or not window:
            continue
        released = released_blocks(table, positions.min(axis=1), window, block_size, owned)
        for v in node.inputs[1:3]:  # k_cache, v_cache: a group input, or a kv_write of one in the group
            while v in producer and producer[v].op == "kv_write":
                v = producer[v].inputs[0]
            i = group.inputs.index(v) if v in group.inputs else None
            if released and i is not None and inputs[i] is not None and not group.is_weight(v):
                inputs[i][sorted(released)] = np.nan


def vary(
    inputs: list[np.ndarray | None], group: GroupInfo, rng: np.random.Generator
) -> list[np.ndarray | None]:
    """Other content of the same kind for a timed call: every float activation drawn afresh (normal);
    token ids, a bool input and any integer input drawn from its legal range (`int_ranges`: a GNN's
    edge indices) drawn afresh too, so that a group whose output follows from them alone (an
    embedding, an index_add of constant rows) cannot be answered from a cache while it is timed;
    positions, block tables, routing and selections (which must agree with the cache and with one
    another) and caches as they are (a cache's content does not change the work; a fresh copy is made
    per call)."""
    structured = {"positions", "block_table", *_expert_inputs(group), *_selection_inputs(group)}
    legal = _legal(group)
    out: list[np.ndarray | None] = []
    for v, a in zip(group.inputs, inputs, strict=True):
        t = group.types[v].dtype
        if a is None or group.is_state(v) or (not t.is_float and (v in structured or not a.size)):
            out.append(None if a is None else a.copy())
        elif t.is_float:
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
        elif t == DType.BOOL:
            out.append(rng.random(a.shape) < 0.5)
        elif v == "tokens" or v in legal:
            lo, hi = legal[v] if v in legal else (int(a.min()), int(a.max()) + 1)
            out.append(_draw_in(rng, a.shape, lo, hi).astype(a.dtype))
        else:
            out.append(a.copy())
    return out


def reference_outputs(
    group: GroupInfo, weights: Any, wide: Any, inputs: list[np.ndarray | None], bindings: dict[str, int]
) -> list[np.ndarray]:
    """The numpy reference's outputs of `group` on `inputs` (weights as the reference holds them)."""
    from polymorph.ir import reference

    # input in place.
    env = {v: weights[v] if a is None else a.copy() for v, a in zip(group.inputs, inputs, strict=True)}
    by_name = {n.name: n for n in group.graph.nodes}
    for name in group.nodes:
        with np.errstate(over="ignore"):  # exp(-x) of large inputs: inf, and silu(x) = 0 right
            reference.run_node(by_name[name], env, group.types, bindings, wide)
    return [np.asarray(env[v]) for v in group.outputs]


def error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error relative to the scale of its row (the last axis), over the whole output; inf
    where an element is not finite in one and not the same in the other: NaN only where the reference
    has NaN, an infinity only where it has that infinity, of that sign (a kernel that returns anything
    where the reference overflows or has no value is judged there too, not let off)."""
    a = np.asarray(got, dtype=np.float64)
    e = np.asarray(want, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    finite = np.isfinite(e)
    both = finite & np.isfinite(a)
    if not both.all():
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        if (~both & ~same).any():
            return float("inf")
    if e.size == 0:
        return 0.0
    e = np.where(finite, e, 0.0)
    a = np.where(finite, a, 0.0)
    rows = np.abs(e).max(axis=-1, keepdims=True) if e.ndim else np.abs(e)
    scale = np.maximum(rows, max(float(np.abs(e).max()) * 1e-3, 1e-30))
    return float((np.abs(a - e) / scale).max())
