"""Every entry of the conformance table (tests/conformance/conftest.py) through the neuron lowering,
run by JAX on XLA's CPU backend, against polymorph.ir.reference at polymorph.verify.tolerance.op_tolerance.

Each case lowers the entry's graph for trn2, loads it with the sample's weights and runs every step
of its samples: outputs within the op tolerance of their dtype (plus, for a fused group, the
reference's intermediates' scale, which a fused kernel keeps unrounded), and the KV cache equal to
the reference's bit for bit after every step. Kernels with several configs run each. Every shape
is one XLA compile (~0.1-0.3 s), so a stateless entry runs the samples of its last size only (all
of its value distributions); an entry with a KV cache runs all.
Inputs are fresh random arrays each run; a failure names the seed (CONFORMANCE_SEED=<seed>).

This proves the numerics of the lowering on XLA's CPU backend, not on a NeuronCore.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polymorph.hardware.profile import load_profile
from polymorph.ir import reference
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.ir.shapes import concrete
from polymorph.pipeline.backend import registry
from polymorph.pipeline.kernel_files import load_choice
from polymorph.pipeline.plan import Plan
from polymorph.verify.tolerance import Tolerance, compare, op_tolerance

pytest.importorskip("jax", reason="the neuron backend lowers through JAX: pip install 'polymorph[neuron]'")

TABLE_FILE = Path(__file__).resolve().parents[2] / "conformance" / "conftest.py"


def _load_table() -> Any:
    spec = importlib.util.spec_from_file_location("neuron_conformance_table", TABLE_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


TABLE = _load_table()


def _known_bug(entry: Any, dtype: DType) -> Any:
    """The entry's KnownBug that names the neuron backend (or every backend) for this dtype."""
    for bug in getattr(entry, "known_bugs", ()):
        backends, dtypes = getattr(bug, "backends", None), getattr(bug, "dtypes", None)
        if (backends is None or "neuron" in backends) and (dtypes is None or dtype in dtypes):
            return bug
    return None


def _cases() -> list[Any]:
    out = []
    for entry in TABLE.OP_TABLE:
        for dtype in entry.dtypes:
            bug = _known_bug(entry, dtype)
            marks = [pytest.mark.xfail(strict=True, reason=bug.reason)] if bug else []
            out.append(pytest.param(entry, dtype, marks=marks, id=f"{entry.name}-{dtype}"))
    return out


def _variants(plan: Plan) -> list[tuple[str, Plan]]:
    """The plan, then one plan per other config of each group's kernel."""
    out = [("default configs", plan)]
    for i, group in enumerate(plan.groups):
        kernel = load_choice(group.kernel.file, group.kernel.sha256)
        for config in kernel.configs[1:]:
            groups = list(plan.groups)
            groups[i] = dataclasses.replace(
                group, kernel=dataclasses.replace(group.kernel, config=dict(config))
            )
            out.append((f"`{group.id}` config {config}", dataclasses.replace(plan, groups=groups)))
    return out


def _reference(graph: Graph, params: dict, inputs: dict, state: dict) -> dict[str, np.ndarray]:
    with np.errstate(over="ignore"):  # exp(-x) of a large negative x is inf, and silu is then -0
        return reference.run(
            graph, {k: v.copy() for k, v in params.items()}, {k: v.copy() for k, v in inputs.items()}, state
        )


def _intermediate_scale(graph: Graph, params: dict, inputs: dict, state: dict) -> float:
    """The largest |value| among the reference's float intermediates: a fused kernel keeps them unrounded."""
    probe = graph.copy()
    types = graph.types()
    inner = [
        v
        for n in graph.nodes
        for v in n.outputs
        if v not in graph.outputs.values() and types[v].dtype.is_float
    ]
    probe.outputs = {**graph.outputs, **{f"<{v}>": v for v in inner}}
    values = _reference(probe, params, inputs, {k: v.copy() for k, v in state.items()})
    return max((float(np.abs(values[f"<{v}>"].astype(np.float64)).max()) for v in inner), default=0.0)


@pytest.mark.parametrize(("entry", "dtype"), _cases())
def test_op_on_xla_cpu(entry: Any, dtype: DType) -> None:
    backend = registry.get("neuron")
    seed_text = os.environ.get("CONFORMANCE_SEED")
    seed = int(seed_text) if seed_text else int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    graph = entry.build(dtype)
    plan = backend.lower(graph, load_profile("trn2"))
    patterns = [g.pattern for g in plan.groups]
    for pattern in entry.patterns or (entry.op,):
        assert pattern in patterns, f"the neuron plan has no `{pattern}` group; its groups: {patterns}"
    fused = any(len(g.nodes) > 1 for g in plan.groups)
    types = graph.types()
    samples = entry.samples(graph, dtype, rng)
    if not graph.state:  # labels are "<distribution> <sizes>": keep the last sizes, every distribution
        last = samples[-1].label.split(" ", 1)[-1]
        samples = [s for s in samples if s.label.split(" ", 1)[-1] == last]
    for label, variant in _variants(plan):
        artifact = backend.compile(variant)
        for sample in samples:
            where = f"{entry.name} {dtype}, {label}, sample `{sample.label}` (seed {seed})"
            exe = backend.load(artifact, {k: v.copy() for k, v in sample.params.items()})
            exe.allocate_state(sample.cache_blocks)
            state = {
                name: np.zeros(concrete(t.shape, {"cache_blocks": sample.cache_blocks}), dtype=t.dtype.numpy)
                for name, t in graph.state.items()
            }
            for step, inputs in enumerate(sample.steps):
                at = f"{where}, step {step}"
                slack = _intermediate_scale(graph, sample.params, inputs, state) if fused else 0.0
                expected = _reference(graph, sample.params, inputs, state)
                given = {k: v.copy() for k, v in inputs.items()}
                actual = exe.run(given)
                assert set(actual) == set(expected), (
                    f"{at}: outputs {sorted(actual)}, expected {sorted(expected)}"
                )
                for name, want in expected.items():
                    got = actual[name]
                    out_dtype = types[graph.outputs[name]].dtype
                    assert got.dtype == want.dtype, (
                        f"{at}: output `{name}` is {got.dtype}, expected {want.dtype}"
                    )
                    tol = op_tolerance(out_dtype)
                    result = compare(got, want, Tolerance(tol.rtol, tol.atol + tol.rtol * slack))
                    assert result.ok, f"{at}: output `{name}` ({out_dtype}): {result}"
                for name, want in state.items():
                    after = exe.read_state(name)
                    assert after.dtype == want.dtype and after.tobytes() == want.tobytes(), (
                        f"{at}: state `{name}` differs from the reference in "
                        f"{int((after != want).reshape(want.shape[0], want.shape[1], -1).any(-1).sum())} slots"
                    )


def test_every_op_has_an_xla_kernel() -> None:
    from polymorph.ir.ops import OPS

    missing = sorted(set(OPS) - registry.get("neuron").ops())
    assert not missing, f"ops without a kernels/xla/ file: {', '.join(missing)}"
