"""Dead-code elimination: drop the nodes whose values reach neither a graph output nor a state update.

A `kv_write` chain is live because its last write is a state update (the verifier makes every
written state declare one), so the cache writes of a layer stay even where nothing reads the layer's
attention output.

What is dropped besides nodes: params that no live node reads (the loader then reads fewer weights).
What is kept even when unread: every graph input and every state tensor. They are the calling
convention — a runtime feeds `tokens`, `positions` and `block_table`, and allocates the KV cache,
whatever the graph happens to read — and an input may be the only leaf that gives a symbol its value
(`block_table` carries `ctx_blocks`).
"""

from __future__ import annotations

from polymorph.ir.graph import Graph
from polymorph.ir.spec import verify


def dce(graph: Graph, *, verified: bool = False) -> Graph:
    """A new graph with the dead nodes and unread params of `graph` removed; `graph` is unchanged.

    Node order, names, attributes, inputs, state, outputs, state updates and meta are kept as they
    are. The input must verify (GraphError otherwise); the result verifies. `verified`: the caller
    has verified `graph` (the compile stages do, once), so neither it nor the result is checked again:
    dropping nodes whose values nothing reads keeps every invariant.
    """
    if not verified:
        verify(graph)
    live = set(graph.outputs.values()) | set(graph.state_updates.values())
    kept = []
    for node in reversed(graph.nodes):
        if any(value in live for value in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    kept.reverse()
    out = graph.copy()
    out.nodes = kept
    out.params = {name: t for name, t in graph.params.items() if name in live}
    if not verified:
        verify(out)
    return out
