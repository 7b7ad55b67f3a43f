"""The Llama-3.2-1B decode plan with the rope and elementwise forms of the dense families compiles for
sm_90 and gfx942 without a GPU and without spills: every layer's rope a partial-rotary yarn (rotary_dim
32 of head_dim 64, Phi-4-mini's kind of split, Qwen2.5's YaRN), which the fused attention-input kernel
refuses, so the plan runs q/k/v, rope and the cache writes as single-op kernels; Gemma's scaled
embedding (`scale`) after the lookup and Gemma 2's final logit soft-capping (`softcap`) after lm_head."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from polymorph import api
from polymorph.ir.graph import Graph, Node
from polymorph.models import load_model

pytest.importorskip("triton")

ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rotary_dim": 32}


def insert_after(graph: Graph, op: str, node: Node, **attrs: object) -> Graph:
    """`graph` with an `op` node on `node`'s output; every later reader (and graph output) reads it."""
    value = node.outputs[0]
    new_value = f"{value}.{op}"
    nodes = []
    for n in graph.nodes:  # SSA order: only nodes after `node` read its output
        nodes.append(dataclasses.replace(n, inputs=tuple(new_value if v == value else v for v in n.inputs)))
        if n.name == node.name:
            nodes.append(Node(f"{node.name}.{op}", op, (value,), (new_value,), dict(attrs)))
    out = graph.copy()
    out.nodes = nodes
    out.outputs = {k: new_value if v == value else v for k, v in graph.outputs.items()}
    return out


def variant_graph(graph: Graph) -> Graph:
    nodes = [dataclasses.replace(n, attrs={**n.attrs, **ROPE}) if n.op == "rope" else n for n in graph.nodes]
    g = graph.copy()
    g.nodes = nodes
    embedding = next(n for n in g.nodes if n.op == "embedding")
    g = insert_after(g, "scale", embedding, factor=2048**0.5, round_factor_to_dtype=True)
    head = next(n for n in reversed(g.nodes) if n.op == "linear")  # lm_head: the last projection
    return insert_after(g, "softcap", head, cap=30.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "chip", "target"), [("cuda", "h200", "cuda:sm_90"), ("rocm", "mi300x", "rocm:gfx942")]
)
def test_partial_yarn_scaled_softcapped_decode_compiles_without_spills(
    tmp_path: Path, backend: str, chip: str, target: str
) -> None:
    base = load_model("llama-3.2-1b", dtype="bf16")
    model = dataclasses.replace(base, graph=variant_graph(base.graph))
    artifact = api.compile(model, backend, chip, tmp_path, batch=1, ctx=1024)
    patterns = {g.pattern for g in artifact.plan.groups}
    assert {"rope", "scale", "softcap"} <= patterns, patterns
    assert "rmsnorm+qkv+rope+kv_write" not in patterns, "the fused kernel took a partial rotary rope"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"] == target
    assert len(report["kernels"]) == len(artifact.plan.groups)
    register = "registers" if backend == "cuda" else "vgprs"
    for k in (k for k in report["kernels"] if k["library"] is None):
        res = k["resources"]
        assert res.get(register), f"{k['group']}: no {register} in {res}"
        assert res.get("spill_bytes") == 0, f"{k['group']} spills {res.get('spill_bytes')} bytes on {target}"
    assert not report["warnings"]
