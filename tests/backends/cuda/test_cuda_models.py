"""The cuda backend on an NVIDIA GPU: whole models against the reference engine, teacher-forced, at
the bf16 model tolerance, with outputs poisoned (NaN) before every kernel. Run: nox -s tests-cuda."""

from __future__ import annotations

import pytest

from polymorph import api
from polymorph.models import Model, load_model
from polymorph.pipeline.backend import registry
from polymorph.serving.session import ReferenceExecutable
from polymorph.verify import verify_executable

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"])
def test_tiny_models_match_the_reference(name: str) -> None:
    result = api.verify(load_model(name, dtype="bf16"), "cuda")
    assert result.ok, result.first_failure()


def test_llama_3_2_1b_shapes_two_layers() -> None:
    """Full Llama-3.2-1B shapes (2048 hidden, 32/8 heads, 128256 vocab), two of its 16 layers."""
    full = load_model("llama-3.2-1b", dtype="bf16")
    graph = full.rebuild(num_layers=2)
    model = Model(name="llama-3.2-1b-2l", graph=graph, source="llama-3.2-1b", config=full.config)
    artifact = api.compile(model, "cuda", "h200")
    exe = registry.get("cuda").load(artifact, model.weights())
    exe.poison = True
    # A 70-token prompt runs the prefill plan (norm on its own, plain projections, the one-pass
    # SwiGLU product: more than 64 rows); the 5-token one and the decode steps the fused kernels.
    result = verify_executable(exe, ReferenceExecutable(graph, model.weights()), graph, prompt_lens=(70, 5))
    assert result.ok, result.first_failure()
