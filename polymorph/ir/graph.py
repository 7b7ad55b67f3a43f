"""The forward-pass graph: typed SSA values, nodes from the closed op table, weights and state by name.

A graph has four kinds of named values: `inputs` (fed per call: token ids, positions, the block
table), `params` (weights, by their checkpoint names), `state` (the paged KV cache, persistent across
calls and written in place by `kv_write`) and node outputs. `outputs` names the values a call returns;
`state_updates` says which value is the new content of each state tensor after the call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from polymorph.ir.dtypes import DType
from polymorph.ir.shapes import Shape, format_shape

AttrValue = Any


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: Shape

    def __str__(self) -> str:
        return f"{self.dtype}{format_shape(self.shape)}"

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Node:
    """One op application. `name` is stable and hierarchical (`layers.3.mlp.down`)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)

    def attr(self, key: str) -> AttrValue:
        return self.attrs[key]


@dataclass
class Graph:
    name: str
    inputs: dict[str, TensorType] = field(default_factory=dict)
    params: dict[str, TensorType] = field(default_factory=dict)
    state: dict[str, TensorType] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    state_updates: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def leaves(self) -> dict[str, TensorType]:
        """Every value that no node defines: inputs, params and state."""
        return {**self.inputs, **self.params, **self.state}

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def producers(self) -> dict[str, Node]:
        """Value name -> the node that defines it."""
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> the nodes that read it, in graph order."""
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for value in n.inputs:
                users.setdefault(value, []).append(n)
        return users

    def types(self) -> dict[str, TensorType]:
        """The type of every value, by shape inference over the op table."""
        from polymorph.ir.ops import infer_node

        types = dict(self.leaves())
        for n in self.nodes:
            outs = infer_node(n, [types[v] for v in n.inputs])
            types.update(zip(n.outputs, outs, strict=True))
        return types

    def symbols(self) -> set[str]:
        """Named dimensions that appear in the graph's leaves."""
        return {d for t in self.leaves().values() for d in t.shape if isinstance(d, str)}

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def copy(self) -> Graph:
        return Graph(
            name=self.name,
            inputs=dict(self.inputs),
            params=dict(self.params),
            state=dict(self.state),
            nodes=list(self.nodes),
            outputs=dict(self.outputs),
            state_updates=dict(self.state_updates),
            meta=dict(self.meta),
        )
