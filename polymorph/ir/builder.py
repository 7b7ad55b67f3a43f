"""A small builder that model code uses to write graphs that read like the model."""

from __future__ import annotations

from typing import Any

from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, Node, TensorType
from polymorph.ir.ops import normalize_attrs, op_def
from polymorph.ir.shapes import Dim
from polymorph.ir.spec import verify


class GraphBuilder:
    def __init__(self, name: str, meta: dict[str, Any] | None = None) -> None:
        self.graph = Graph(name=name, meta=dict(meta or {}))

    def input(self, name: str, dtype: DType, shape: tuple[Dim, ...]) -> str:
        self.graph.inputs[name] = TensorType(dtype, tuple(shape))
        return name

    def param(self, name: str, dtype: DType, shape: tuple[Dim, ...]) -> str:
        self.graph.params[name] = TensorType(dtype, tuple(shape))
        return name

    def state(self, name: str, dtype: DType, shape: tuple[Dim, ...]) -> str:
        self.graph.state[name] = TensorType(dtype, tuple(shape))
        return name

    def op(
        self, op: str, name: str, *inputs: str, outputs: tuple[str, ...] | None = None, **attrs: Any
    ) -> Any:
        """Add one node; return its output value name (a tuple when the op has several outputs)."""
        outs = outputs or (name,)
        attrs = normalize_attrs(op_def(op), attrs)
        self.graph.nodes.append(Node(name, op, tuple(inputs), outs, attrs))
        return outs[0] if len(outs) == 1 else outs

    def output(self, name: str, value: str) -> None:
        self.graph.outputs[name] = value

    def update(self, state: str, value: str) -> None:
        self.graph.state_updates[state] = value

    def build(self, *, check: bool = True) -> Graph:
        """The graph. `check`: verify it now (GraphError). Model builders whose graphs go through the
        compile stages pass False: the stages' `verified` step is where a model's graph is checked,
        once."""
        if check:
            verify(self.graph)
        return self.graph
