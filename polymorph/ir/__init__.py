"""polymorph's IR: a typed SSA graph over a closed op table (see ops.py), with a verifier and JSON form."""

from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, Node, TensorType
from polymorph.ir.ops import OPS, Cost, OpDef, node_cost
from polymorph.ir.printer import format_graph
from polymorph.ir.serialize import content_hash, from_json, to_json
from polymorph.ir.spec import GraphError, verify

__all__ = [
    "OPS",
    "Cost",
    "DType",
    "Graph",
    "GraphError",
    "Node",
    "OpDef",
    "TensorType",
    "content_hash",
    "format_graph",
    "from_json",
    "node_cost",
    "to_json",
    "verify",
]
