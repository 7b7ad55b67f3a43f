"""The stable JSON form of a graph: exact round trip, content hash, schema version.

The form is canonical (keys sorted, attributes normalized with their defaults filled in, no
whitespace in the hashed form), so two equal graphs have one text and one hash. `meta` (builder
provenance: model name, config) travels along but is not hashed: it does not change what runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, Node, TensorType
from polymorph.ir.ops import OpError, normalize_attrs, op_def

SCHEMA_VERSION = 1


class GraphFormatError(UserError):
    """IR JSON that cannot be read as a graph."""


def _type_json(t: TensorType) -> dict[str, Any]:
    return {"dtype": t.dtype.value, "shape": list(t.shape)}


def _attr_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def to_dict(graph: Graph, *, with_meta: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "name": graph.name,
        "inputs": {k: _type_json(t) for k, t in graph.inputs.items()},
        "params": {k: _type_json(t) for k, t in graph.params.items()},
        "state": {k: _type_json(t) for k, t in graph.state.items()},
        "nodes": [
            {
                "name": n.name,
                "op": n.op,
                "inputs": list(n.inputs),
                "outputs": list(n.outputs),
                "attrs": {k: _attr_json(v) for k, v in sorted(n.attrs.items())},
            }
            for n in graph.nodes
        ],
        "outputs": dict(graph.outputs),
        "state_updates": dict(graph.state_updates),
    }
    if with_meta and graph.meta:
        d["meta"] = graph.meta
    return d


def to_json(graph: Graph, *, indent: int | None = 1) -> str:
    return json.dumps(to_dict(graph), indent=indent, sort_keys=True)


def content_hash(graph: Graph) -> str:
    """sha256 of the canonical form without `meta`: what the graph computes, not where it came from."""
    text = json.dumps(to_dict(graph, with_meta=False), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _printable(name: Any) -> str:
    """A name as it can appear in a one-line message (control characters escaped)."""
    return repr(name)[1:-1] if isinstance(name, str) else repr(name)


def from_dict(d: Any, source: str = "<graph>") -> Graph:
    """Read a graph from its JSON form. Structural faults raise GraphFormatError naming `source`.

    The result is not verified: call `polymorph.ir.verify` for the semantic invariants.
    """

    def fail(where: str, fault: str) -> GraphFormatError:
        return GraphFormatError(f"{source}: {where}: {fault}")

    if not isinstance(d, dict):
        raise fail("top level", "expected a JSON object")
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
        raise fail("schema_version", f"expected {SCHEMA_VERSION}, got {version!r}")
    for key in ("name", "inputs", "params", "state", "nodes", "outputs"):
        if key not in d:
            raise fail(key, "missing")

    def tensor_types(key: str) -> dict[str, TensorType]:
        table = d[key]
        if not isinstance(table, dict):
            raise fail(key, "expected an object of name -> {dtype, shape}")
        out = {}
        for name, t in table.items():
            if not isinstance(t, dict) or set(t) != {"dtype", "shape"} or not isinstance(t["shape"], list):
                raise fail(f"{key}.{_printable(name)}", "expected {dtype, shape}")
            try:
                dtype = DType.parse(str(t["dtype"]))
            except ValueError as e:
                raise fail(f"{key}.{name}", str(e)) from None
            shape = t["shape"]
            if any(isinstance(x, bool) or not isinstance(x, int | str) for x in shape):
                raise fail(f"{key}.{name}", f"shape entries must be ints or symbol names, got {shape}")
            out[str(name)] = TensorType(dtype, tuple(shape))
        return out

    nodes = []
    if not isinstance(d["nodes"], list):
        raise fail("nodes", "expected a list")
    for i, n in enumerate(d["nodes"]):
        if not isinstance(n, dict) or not {"name", "op", "inputs", "outputs"} <= set(n):
            raise fail(f"nodes[{i}]", "expected {name, op, inputs, outputs, attrs}")
        where = f"node `{_printable(n['name'])}`"
        if not isinstance(n["name"], str) or not isinstance(n["op"], str):
            raise fail(where, "name and op must be strings")
        if not all(isinstance(n[k], list) for k in ("inputs", "outputs")) or not all(
            isinstance(v, str) for v in [*n["inputs"], *n["outputs"]]
        ):
            raise fail(where, "inputs and outputs must be lists of value names")
        attrs = n.get("attrs", {})
        if not isinstance(attrs, dict):
            raise fail(where, "attrs must be an object")
        try:
            attrs = normalize_attrs(op_def(str(n["op"])), attrs)
        except OpError as e:
            raise fail(where, str(e)) from None
        nodes.append(Node(str(n["name"]), str(n["op"]), tuple(n["inputs"]), tuple(n["outputs"]), attrs))

    for key in ("outputs", "state_updates"):
        table = d.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise fail(key, "expected an object of name -> value name")
    if not isinstance(d["name"], str):
        raise fail("name", "expected a string")
    if not isinstance(d.get("meta", {}), dict):
        raise fail("meta", "expected an object")
    return Graph(
        name=d["name"],
        inputs=tensor_types("inputs"),
        params=tensor_types("params"),
        state=tensor_types("state"),
        nodes=nodes,
        outputs=dict(d["outputs"]),
        state_updates=dict(d.get("state_updates", {})),
        meta=dict(d.get("meta", {})),
    )


def from_json(text: str, source: str = "<graph>") -> Graph:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphFormatError(
            f"{source}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    except RecursionError:
        raise GraphFormatError(f"{source}: JSON nested too deeply to be a graph") from None
    return from_dict(d, source)


def load(path: str | Path) -> Graph:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise GraphFormatError(f"{path}: cannot read the IR file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise GraphFormatError(f"{path}: not a UTF-8 text file; an IR file is JSON") from None
    return from_json(text, str(path))


def save(graph: Graph, path: str | Path) -> None:
    Path(path).write_text(to_json(graph) + "\n")
