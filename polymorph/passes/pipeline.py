"""The pass pipeline a backend runs before lowering: verify → dce → specialize → fuse."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polymorph.ir.graph import Graph
from polymorph.ir.spec import verify
from polymorph.passes.dce import dce
from polymorph.passes.fuse import NodeGroup, Pattern, fuse
from polymorph.passes.specialize import specialize


def prepare(
    graph: Graph,
    bindings: Mapping[str, int] | None = None,
    patterns: Sequence[Pattern] = (),
) -> tuple[Graph, list[NodeGroup]]:
    """The graph a backend lowers, and its node groups.

    Runs verify (GraphError), dce, specialize when `bindings` is given (UserError for a name that is
    not a symbol of the graph after dce), and fuse with `patterns` in table order (no patterns: one
    group per node). `graph` is unchanged; the returned graph verifies.
    """
    verify(graph)
    out = dce(graph)
    if bindings is not None:
        out = specialize(out, bindings)
    return out, fuse(out, patterns)
