"""The verifier: a graph either satisfies every invariant or the error names the node and the fault.

Invariants: names are unique and SSA (each value defined once, before use); every op is in the op
table with valid attributes and inputs that its shape inference accepts; outputs and state updates
name defined values; a state tensor is written only through a chain of `kv_write` nodes that starts
at the state value itself, and its update is the last write of that chain.
"""

from __future__ import annotations

from polymorph.errors import UserError
from polymorph.ir.graph import Graph, TensorType
from polymorph.ir.ops import OpError, infer_node
from polymorph.ir.shapes import is_symbol


class GraphError(UserError):
    """A graph that breaks an invariant; the message names the graph, the node and the fault."""


def verify(graph: Graph) -> dict[str, TensorType]:
    """Check every invariant of `graph`; return the type of every value. Raises GraphError."""

    def fail(where: str, fault: str) -> GraphError:
        return GraphError(f"graph `{graph.name}`: {where}: {fault}")

    types: dict[str, TensorType] = {}
    for kind, table in (("input", graph.inputs), ("param", graph.params), ("state", graph.state)):
        for name, t in table.items():
            if name in types:
                raise fail(f"{kind} `{name}`", "name is defined twice")
            for d in t.shape:
                if not (is_symbol(d) and d.isidentifier()) and not (isinstance(d, int) and d >= 0):
                    raise fail(f"{kind} `{name}`", f"dimension {d!r} is neither a count nor a symbol name")
            types[name] = t

    node_names: set[str] = set()
    last_write: dict[str, str] = {}  # state name -> latest value in its kv_write chain
    write_root: dict[str, str] = {}  # kv_write output value -> the state it writes
    for node in graph.nodes:
        where = f"node `{node.name}` ({node.op})"
        if node.name in node_names:
            raise fail(where, "node name is used twice")
        node_names.add(node.name)
        for i, value in enumerate(node.inputs):
            if value not in types:
                raise fail(where, f"input {i} `{value}` is not defined before this node")
        try:
            outs = infer_node(node, [types[v] for v in node.inputs])
        except OpError as e:
            raise fail(where, str(e)) from None
        for value, t in zip(node.outputs, outs, strict=True):
            if value in types:
                raise fail(where, f"output `{value}` is already defined (values are SSA)")
            types[value] = t
        if node.op == "kv_write":
            cache = node.inputs[0]
            root = cache if cache in graph.state else write_root.get(cache)
            if root is None:
                raise fail(where, f"writes `{cache}`, which is neither a state tensor nor a kv_write result")
            if last_write.get(root, root) != cache:
                raise fail(where, f"writes a stale version of state `{root}`")
            last_write[root] = node.outputs[0]
            write_root[node.outputs[0]] = root
        else:
            for value in node.inputs:
                root = value if value in graph.state else write_root.get(value)
                if root is not None and last_write.get(root, root) != value:
                    raise fail(where, f"reads `{value}`, a stale version of state `{root}`")

    if not graph.outputs:
        raise fail("outputs", "the graph returns nothing")
    for out, value in graph.outputs.items():
        if value not in types:
            raise fail(f"output `{out}`", f"names undefined value `{value}`")
        root = value if value in graph.state else write_root.get(value)
        if root is not None and last_write.get(root, root) != value:
            raise fail(f"output `{out}`", f"returns `{value}`, a stale version of state `{root}`")
    for state, value in graph.state_updates.items():
        if state not in graph.state:
            raise fail(f"state update `{state}`", "is not a state tensor")
        if last_write.get(state) != value:
            raise fail(f"state update `{state}`", f"`{value}` is not the last kv_write of this state")
    for state, value in last_write.items():
        if graph.state_updates.get(state) != value:
            raise fail(f"state `{state}`", "is written but its update is not declared in state_updates")
    return types


def infer_types(graph: Graph) -> dict[str, TensorType]:
    """The type of every value of a graph whose structure is already verified (a specialization of a
    verified graph: same nodes, values and state chains, new sizes): shape inference only, with the
    node named in the GraphError when a size breaks an op's contract."""
    types: dict[str, TensorType] = dict(graph.leaves())
    for node in graph.nodes:
        try:
            outs = infer_node(node, [types[v] for v in node.inputs])
        except OpError as e:
            raise GraphError(f"graph `{graph.name}`: node `{node.name}` ({node.op}): {e}") from None
        types.update(zip(node.outputs, outs, strict=True))
    return types
