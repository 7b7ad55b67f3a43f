"""Specialization: give a graph's named dims the concrete sizes of one traffic bucket.

A graph is built once with symbols (`batch`, `seq`, `ctx_blocks`, `cache_blocks`); a backend compiles
it per shape bucket, and a kernel's registry key holds concrete dims. `specialize` replaces symbols
in the leaf types and in every attribute that holds dims (the `shape` of a reshape); symbols that
the bindings leave out stay symbolic, so a graph may be specialized in steps.

`bucket_bindings` derives the decoder graph's symbols from a traffic bucket (polymorph/serving/traffic.py):
a batch of `batch` sequences whose longest context is `ctx` tokens, `seq` of them new in this step.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from polymorph.errors import UserError
from polymorph.ir.graph import Graph, Node, TensorType
from polymorph.ir.ops import OPS
from polymorph.ir.shapes import bind
from polymorph.ir.spec import verify

# Attribute kinds whose values are shapes and so may name symbols (see ops.AttrSpec.kind).
SHAPE_ATTR_KINDS = frozenset({"dims"})

# The symbols of the decoder graph (polymorph/models/decoder.py) that a traffic bucket determines.
BUCKET_SYMBOLS = ("batch", "seq", "ctx_blocks", "cache_blocks")


def graph_symbols(graph: Graph) -> set[str]:
    """Every named dim of `graph`: in its leaves and in the shape attributes of its nodes."""
    symbols = graph.symbols()
    for node in graph.nodes:
        for value in _shape_attrs(node).values():
            symbols.update(d for d in value if isinstance(d, str))
    return symbols


def specialize(graph: Graph, bindings: Mapping[str, int], *, verified: bool = False) -> Graph:
    """A new graph with each symbol that `bindings` names replaced by its size; `graph` is unchanged.

    Every name in `bindings` must be a symbol of the graph, and every size an int >= 1; otherwise
    UserError, listing the graph's symbols. The bindings are merged into `meta["bindings"]` (meta is
    not hashed). The result verifies (GraphError when the sizes break an op's contract, e.g. a slice
    longer than its bound dim). `verified`: the caller has verified `graph` and checks the result itself
    with `infer_types` (sizes are all that changed, so shape inference is the whole check; the compile
    stages keep the types it returns), so nothing is verified here.
    """
    if not verified:
        verify(graph)
    symbols = graph_symbols(graph)
    unknown = sorted(set(bindings) - symbols)
    if unknown:
        known = ", ".join(sorted(symbols)) or "none"
        raise UserError(
            f"graph `{graph.name}` has no symbol {', '.join(f'`{s}`' for s in unknown)}; its symbols are: {known}"
        )
    sizes = {name: _size(f"symbol `{name}`", value) for name, value in bindings.items()}

    def leaf(t: TensorType) -> TensorType:
        return TensorType(t.dtype, bind(t.shape, sizes))

    def node(n: Node) -> Node:
        shape_attrs = _shape_attrs(n)
        if not shape_attrs:
            return n
        attrs = dict(n.attrs)
        attrs.update({key: bind(value, sizes) for key, value in shape_attrs.items()})
        return Node(n.name, n.op, n.inputs, n.outputs, attrs)

    out = graph.copy()
    out.inputs = {name: leaf(t) for name, t in graph.inputs.items()}
    out.params = {name: leaf(t) for name, t in graph.params.items()}
    out.state = {name: leaf(t) for name, t in graph.state.items()}
    out.nodes = [node(n) for n in graph.nodes]
    out.meta["bindings"] = {**graph.meta.get("bindings", {}), **sizes}
    if not verified:
        verify(out)
    return out


def bucket_bindings(graph: Graph, batch: int, ctx: int, seq: int = 1) -> dict[str, int]:
    """The sizes of the decoder graph's symbols for one traffic bucket.

    batch: sequences per step; ctx: the longest context in the bucket, in tokens, the new ones
    included (a bucket's `ctx_hi`); seq: new tokens per sequence (1 for decode).
    Derived: ctx_blocks = ceil(ctx / block_size), cache_blocks = batch * ctx_blocks + 1 — one spare
    block that no sequence owns, kept as the guard region the isolation gate checks. The block size
    is `graph.meta["block_size"]`, else the second dim of the `*k_cache` state.
    Returns only the symbols the graph has (of BUCKET_SYMBOLS); any other symbol is the caller's to bind.
    """
    batch, ctx, seq = _size("batch", batch), _size("ctx", ctx), _size("seq", seq)
    if ctx < seq:
        raise UserError(
            f"a bucket with ctx={ctx} cannot hold seq={seq} new tokens per sequence; use ctx >= seq"
        )
    symbols = graph_symbols(graph)
    sizes = {"batch": batch, "seq": seq}
    if symbols & {"ctx_blocks", "cache_blocks"}:
        block_size = _block_size(graph)
        ctx_blocks = -(-ctx // block_size)
        sizes.update(ctx_blocks=ctx_blocks, cache_blocks=batch * ctx_blocks + 1)
    return {name: size for name, size in sizes.items() if name in symbols}


def _shape_attrs(node: Node) -> dict[str, Any]:
    op = OPS.get(node.op)
    if op is None:
        return {}
    return {
        key: node.attrs[key]
        for key, spec in op.attrs.items()
        if spec.kind in SHAPE_ATTR_KINDS and node.attrs.get(key) is not None
    }


def _size(what: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        size = operator.index(value)  # numpy ints too; dims must be plain ints
    except TypeError:
        raise UserError(f"{what} must be an integer, got {value!r}") from None
    if size < 1:
        raise UserError(f"{what} must be >= 1, got {size}")
    return int(size)


def _block_size(graph: Graph) -> int:
    from_state = {
        t.shape[1]
        for name, t in graph.state.items()
        if name.endswith("k_cache") and t.rank == 4 and isinstance(t.shape[1], int)
    }
    if len(from_state) > 1:
        raise UserError(
            f"graph `{graph.name}`: its k caches disagree on the block size: {sorted(from_state)}"
        )
    if "block_size" in graph.meta:
        size = _size(f"graph `{graph.name}` meta block_size", graph.meta["block_size"])
        if from_state and from_state != {size}:
            raise UserError(
                f"graph `{graph.name}`: meta block_size={size} but its k caches have blocks of {from_state.pop()}"
            )
        return size
    if not from_state:
        raise UserError(
            f"graph `{graph.name}` has no meta `block_size` and no `*k_cache` state "
            "[cache_blocks, block_size, kv_heads, head_dim] to read it from; bind ctx_blocks and cache_blocks explicitly"
        )
    return from_state.pop()
