"""The neuron backend on a Trainium device: NEFF compile with the real neuronx-cc, models run on a
NeuronCore through jax-neuronx against the reference engine, and a timed decode step.
Run: nox -s tests-neuron (plain: python -m pytest tests -m neuron).

UNPROVEN: written against AWS's Neuron documentation; no Trainium machine or Neuron toolchain is
reachable from where this was written, so these tests have never run. They skip elsewhere with the
reason (tests/conftest.py: /dev/neuron0 absent)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polymorph import api
from polymorph.knobs import knobs
from polymorph.models import load_model
from polymorph.pipeline.backend import registry

pytestmark = pytest.mark.neuron


def _require_toolchain() -> None:
    probe = registry.get("neuron").probe()
    if not probe.measure.ok:
        pytest.fail(f"a Neuron device is present but the backend cannot use it: {probe.measure.reason}")


def test_neff_is_built_for_llama_tiny(tmp_path: Path) -> None:
    _require_toolchain()
    with knobs.scope(cache_dir=tmp_path / "cache"):
        artifact = api.compile(load_model("llama-tiny", dtype="bf16"), "neuron", "trn2", tmp_path / "out")
    assert not artifact.report.warnings, artifact.report.warnings
    assert (tmp_path / "out" / "model.neff").stat().st_size > 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["neuronx_cc"]["installed"] and manifest["neuronx_cc"]["neff"].startswith("built")


@pytest.mark.parametrize("name", ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"])
def test_tiny_models_match_the_reference_on_a_neuroncore(name: str) -> None:
    _require_toolchain()
    model = load_model(name, dtype="bf16")
    exe = api.load(api.compile(model, "neuron"), model)
    assert exe.platform == "neuron"
    result = api.verify(model, "neuron")
    assert result.ok, result.first_failure()


def test_decode_step_is_timed_on_the_device() -> None:
    _require_toolchain()
    model = load_model("llama-tiny", dtype="bf16")
    artifact = api.compile(model, "neuron", batch=1, ctx=64)
    exe = api.load(artifact, model)
    exe.allocate_state(artifact.plan.bindings["cache_blocks"])
    step = {
        "tokens": np.array([[1]], np.int32),
        "positions": np.array([[0]], np.int32),
        "block_table": np.arange(artifact.plan.bindings["ctx_blocks"], dtype=np.int32)[None],
    }
    timing = exe.time_step(step, iters=10)
    assert timing["platform"] == "neuron" and 0 < timing["median_s"] < 1.0
