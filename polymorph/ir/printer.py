"""A text form of a graph that a person can read (not parsed back: JSON is the exchange form)."""

from __future__ import annotations

from polymorph.ir.graph import Graph
from polymorph.ir.ops import OPS


def _attrs_text(op: str, attrs: dict) -> str:
    spec = OPS[op].attrs
    # Defaults are noise when reading a graph: show only what differs from the op's default.
    shown = {k: v for k, v in attrs.items() if k not in spec or v != spec[k].default or spec[k].required}
    if not shown:
        return ""
    parts = []
    for k, v in sorted(shown.items()):
        text = "[" + ", ".join(map(str, v)) + "]" if isinstance(v, tuple) else repr(v)
        parts.append(f"{k}={text}")
    return " {" + ", ".join(parts) + "}"


def format_graph(graph: Graph) -> str:
    types = graph.types()
    lines = [f"graph {graph.name}"]
    for kind, table in (("input", graph.inputs), ("param", graph.params), ("state", graph.state)):
        for name, t in table.items():
            lines.append(f"  {kind:<5} {name}: {t}")
    for n in graph.nodes:
        outs = ", ".join(f"%{o}: {types[o]}" for o in n.outputs)
        args = ", ".join(n.inputs)
        named = "" if n.outputs == (n.name,) else f"  # node {n.name}"
        lines.append(f"  {outs} = {n.op}({args}){_attrs_text(n.op, dict(n.attrs))}{named}")
    for name, value in graph.outputs.items():
        lines.append(f"  output {name} = %{value}")
    for name, value in graph.state_updates.items():
        lines.append(f"  update {name} = %{value}")
    return "\n".join(lines)
