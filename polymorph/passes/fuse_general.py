"""General fusion: the groups of an imported program's general ops that one kernel each can run.

A program imported from torch.export (polymorph/frontend/) is general ops, and one kernel per op makes
`x * sigmoid(x) + 1` then gelu four round trips through memory. This pass finds two kinds of group:

- elementwise: elementwise ops (unary, binary, comparison, logical, where, cast, and the model-level
  add, mul, silu, gelu, scale, softcap the import also makes), broadcasting as each op does;
- reduction: reductions over one set of axes of operands of one shape (reduce_sum, _mean, _max, _min,
  _prod, _any, _all, _var over their axes; softmax and log_softmax over their axis) with their
  elementwise prologue (ops that feed them) and epilogue (ops that read them). A softmax or a layer
  norm written by hand (max, sub, exp, sum, div; mean, sub, square, mean, rsqrt, mul) is one group.
  Every elementwise op of such a group makes a value of the reductions' operand shape, or one that
  broadcasts into it (a keepdims statistic), or of their reduced shape: one iteration space.

The rules:
1. Only the ops above join a group, so nothing fuses across a matmul, a convolution, a layout op or
   any other op; nodes an earlier fusion took (pattern matches) are left alone.
2. A group has exactly one output value; every other value it makes is read only inside it (never by
   another node, as a graph output or as a state update). One output keeps the group convex: every
   member reaches the output through members, so a path that leaves the group (only through the
   output) cannot come back in without a cycle.
3. Groups grow backwards from their output, in reverse graph order: a producer joins once every
   reader of its value is in the group (repeated until nothing more joins), so each group is maximal
   for its output, and a value read by two chains stays the boundary between them.
4. A group of one node is no group: its op's own kernel runs it, as before.

A group's pattern is its kind, `:`, and its ops in graph order joined by `+`
(`elementwise:mul+sigmoid+add+gelu`), so the op signature (the registry's key: pattern and types)
tells different chains apart; a kernel file takes a whole kind by naming `elementwise` or `reduction`
in IMPLEMENTS (polymorph/pipeline/kernel_files.py). Group ids come from node names as for every group
(polymorph/passes/fuse.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from polymorph.ir.general_ops import BINARY_ARITH, BINARY_LOGICAL, COMPARE, REDUCE, UNARY_FLOAT
from polymorph.ir.graph import Graph, Node, TensorType
from polymorph.ir.ops import normalize_attrs, op_def
from polymorph.ir.shapes import Shape, broadcast

ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
FAMILIES = (ELEMENTWISE, REDUCTION)

# Ops with one output element per (broadcast) input element, each computed on its own.
ELEMENTWISE_OPS = frozenset(
    {*UNARY_FLOAT, "logical_not", *BINARY_ARITH, *BINARY_LOGICAL, *COMPARE, "where", "cast"}
    | {"add", "mul", "silu", "gelu", "scale", "softcap"}
)
# Reductions over `axes` (all when empty), and the row-wise ops over one `axis` that keep the shape.
AXES_REDUCTIONS = frozenset({*REDUCE, "reduce_var"})
ROW_REDUCTIONS = frozenset({"softmax", "log_softmax"})
REDUCTION_OPS = AXES_REDUCTIONS | ROW_REDUCTIONS
FUSABLE_OPS = ELEMENTWISE_OPS | REDUCTION_OPS


@dataclass(frozen=True)
class GeneralGroup:
    """Nodes (names, in graph order) one kernel runs, and the group's pattern name."""

    pattern: str
    nodes: tuple[str, ...]


def family(pattern: str) -> str:
    """The kind of a general group's pattern (`elementwise`, `reduction`); "" for any other pattern."""
    kind, colon, _ = pattern.partition(":")
    return kind if colon and kind in FAMILIES else ""


def reduced_space(node: Node, types: Mapping[str, TensorType]) -> tuple[Shape, frozenset[int]]:
    """(operand shape, reduced axes) of a reduction node: reductions fuse only where these agree."""
    x = types[node.inputs[0]]
    attrs = normalize_attrs(op_def(node.op), node.attrs)
    if node.op in ROW_REDUCTIONS:
        axes = frozenset({attrs["axis"] % x.rank})
    else:
        axes = frozenset(a % x.rank for a in attrs["axes"]) if attrs["axes"] else frozenset(range(x.rank))
    return tuple(x.shape), axes


def general_groups(graph: Graph, taken: Collection[str] = ()) -> list[GeneralGroup]:
    """The general groups of `graph` (verified), in reverse graph order of their outputs; nodes in
    `taken` (already grouped by an earlier fusion) join none."""
    types = graph.types()
    nodes = {n.name: n for n in graph.nodes}
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    producer = {v: n.name for n in graph.nodes for v in n.outputs}
    readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        for v in n.inputs:
            readers.setdefault(v, set()).add(n.name)
    sinks = set(graph.outputs.values()) | set(graph.state_updates.values())
    done = set(taken)
    groups: list[GeneralGroup] = []
    for root in reversed(graph.nodes):
        if root.name in done or not _fusable(root):
            continue
        members = {root.name}
        grown = True
        while grown:  # a producer may wait for its last reader to join: repeat until none joins
            grown = False
            for name in sorted(members, key=index.__getitem__, reverse=True):
                for value in nodes[name].inputs:
                    p = producer.get(value)
                    if p is None or p in members or p in done or not _fusable(nodes[p]):
                        continue
                    if any(v in sinks or not readers.get(v, set()) <= members for v in nodes[p].outputs):
                        continue
                    if not _one_space([nodes[m] for m in (*members, p)], types):
                        continue
                    members.add(p)
                    grown = True
        done |= members
        if len(members) > 1:
            ordered = tuple(sorted(members, key=index.__getitem__))
            kind = REDUCTION if any(nodes[m].op in REDUCTION_OPS for m in ordered) else ELEMENTWISE
            groups.append(GeneralGroup(f"{kind}:{'+'.join(nodes[m].op for m in ordered)}", ordered))
    return groups


def _fusable(node: Node) -> bool:
    return node.op in FUSABLE_OPS and len(node.outputs) == 1


def _one_space(members: list[Node], types: Mapping[str, TensorType]) -> bool:
    """Whether `members` are one iteration space: reductions over the same axes of one operand shape,
    and elementwise values that fit in that shape or in the reduced one (anything, without reductions)."""
    spaces = {reduced_space(n, types) for n in members if n.op in REDUCTION_OPS}
    if not spaces:
        return True
    if len(spaces) > 1:
        return False
    ((full, axes),) = spaces
    reduced = tuple(d for i, d in enumerate(full) if i not in axes)
    for n in members:
        if n.op in REDUCTION_OPS:
            continue
        shape = tuple(types[n.outputs[0]].shape)
        if shape != reduced and not _fits(shape, full):
            return False
    return True


def _fits(shape: Shape, full: Shape) -> bool:
    """Whether a value of `shape` broadcasts into `full` without growing it."""
    try:
        return broadcast(shape, full) == tuple(full)
    except ValueError:
        return False
