"""The values an integer tensor of a graph can legally hold: what the gates draw a group's integer
inputs from, and what an imported program's fresh inputs are drawn from.

An index must address its dim: the index of an `index_select`, `gather`, `scatter_add` or
`index_add` lies in [0, n) for the dim of n it selects along, an `embedding`'s ids in [0, rows). That
bound reaches back to the values the index was taken from through ops that only move integers
(reshape, slice, transpose, expand, concat, an integer cast, an index_select of an integer tensor):
a GNN's edge list `edges[2, E]`, sliced into source and target rows, is bounded by the node count.
Where no index use bounds a value, an integer graph input takes its example inputs' range
(`meta["int_ranges"]`, recorded by the torch.export import), and a value moved from a bounded one
takes that one's range. Every range is half-open, [lo, hi). Anything else (integers computed by
arithmetic) has no known range, and the caller says so.
"""

from __future__ import annotations

from typing import Any

from polymorph.ir.graph import Graph

# op -> (the index input, the indexed input, the attr naming the indexed axis; None: axis 0)
INDEX_USES: dict[str, tuple[int, int, str | None]] = {
    "index_select": (1, 0, "axis"),
    "gather": (1, 0, "axis"),
    "scatter_add": (1, 0, "axis"),
    "scatter_max": (1, 0, "axis"),
    "scatter_min": (1, 0, "axis"),
    "index_add": (1, 0, "axis"),
    "embedding": (1, 0, None),
}
# Ops whose output holds only values of their integer inputs (the ones listed; None: every input).
MOVES: dict[str, tuple[int, ...] | None] = {
    "reshape": (0,),
    "slice": (0,),
    "strided_slice": (0,),
    "transpose": (0,),
    "expand": (0,),
    "concat": None,
    "cast": (0,),
    "index_select": (0,),
}

Range = tuple[int, int]


def legal_ranges(graph: Graph) -> dict[str, Range]:
    """Value name -> [lo, hi) for every integer value of `graph` whose legal range is known."""
    types = graph.types()

    def is_int(v: str) -> bool:
        t = types.get(v)
        return t is not None and t.dtype.is_int

    # Each value's index bound, then carried back from a moved value to what it was moved from.
    bound: dict[str, Range] = {}
    for node in graph.nodes:
        use = INDEX_USES.get(node.op)
        if use is None or len(node.inputs) <= use[0]:
            continue
        idx, src, attr = use
        t = types[node.inputs[src]]
        axis = int(node.attrs.get(attr, 0)) % t.rank if attr else 0
        n = t.shape[axis]
        if isinstance(n, int):
            bound[node.inputs[idx]] = _meet(bound.get(node.inputs[idx]), (0, n))
    for node in reversed(graph.nodes):  # consumers come after producers: one backward sweep
        moved = _moved_inputs(node, is_int)
        for out in node.outputs:
            if out in bound:
                for v in moved:
                    bound[v] = _meet(bound.get(v), bound[out])
    known: dict[str, Range] = {
        name: (int(lo), int(hi)) for name, (lo, hi) in dict(graph.meta.get("int_ranges", {})).items()
    }
    for name, r in known.items():
        if name in bound:  # the index bound is the law; the example's range only a sample of it
            continue
        bound[name] = r
    for node in graph.nodes:  # a moved value with no bound of its own takes its sources' range
        moved = _moved_inputs(node, is_int)
        if not moved or any(v not in bound for v in moved):
            continue
        joined = (min(bound[v][0] for v in moved), max(bound[v][1] for v in moved))
        for out in node.outputs:
            if is_int(out) and out not in bound:
                bound[out] = joined
    return {v: r for v, r in bound.items() if r[0] < r[1]}


def _moved_inputs(node: Any, is_int: Any) -> list[str]:
    if node.op not in MOVES or not all(is_int(o) for o in node.outputs):
        return []
    which = MOVES[node.op]
    picked = node.inputs if which is None else [node.inputs[i] for i in which if i < len(node.inputs)]
    return [v for v in picked if is_int(v)]


def _meet(a: Range | None, b: Range) -> Range:
    return b if a is None else (max(a[0], b[0]), min(a[1], b[1]))
