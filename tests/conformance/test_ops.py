"""Every op (and every fused pattern a backend opts into) on every runnable backend, against the
reference interpreter, in every dtype of its conformance entry, with every config of its kernel.
A backend is held to what it declares: the fused patterns it opts into (`patterns`, or
`fusion_patterns` at no bindings) that its kernel library implements, and the ops its kernel files
name in IMPLEMENTS; a case outside those is skipped with the reason.

Each case: lower the entry's graph for the backend's first target, then for the plan as lowered and
for each other config of each group's kernel, compile, load with the sample's weights, run with
poisoned outputs (NaN-filled before each kernel), and compare every output with `reference.run` on
copies of the same arrays, at `op_tolerance` of the output's dtype. A graph with a KV cache is
checked step by step: the whole cache must equal the reference's bit for bit, and every slot the step
does not write must be exactly what it was before the step. `test_weights_live` checks that a weight
changed in place through `Executable.weight` is what the next run reads, in every config.

Inputs are fresh random arrays each run; a failure prints the seed. Reproduce it with
`CONFORMANCE_SEED=<seed> pytest 'tests/conformance/test_ops.py::test_op[<id>]'`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.hardware.profile import load_profile
from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.ir.ops import OPS
from polymorph.ir.shapes import concrete
from polymorph.pipeline.backend import Backend, Executable, registry
from polymorph.pipeline.kernel_files import load_choice
from polymorph.pipeline.plan import Plan
from polymorph.verify.tolerance import Tolerance, compare, op_tolerance

if TYPE_CHECKING:  # conftest.py is not importable under --import-mode=importlib; types only
    from conftest import OpInfo, Sample

# --- backends, lazily --------------------------------------------------------------------------------


@functools.cache
def _runnable(name: str) -> Backend | str:
    """The backend, or why it cannot run plans here (its load failure or its probe's reason)."""
    try:
        backend = registry.get(name)
    except UserError as e:
        return str(e)
    run = backend.probe().run
    return backend if run.ok else f"backend `{name}` cannot run here: {run.reason}"


def runnable_backend(name: str) -> Backend:
    backend = _runnable(name)
    if isinstance(backend, str):
        pytest.skip(backend)
    return backend


# --- plans, one per kernel config --------------------------------------------------------------------


def config_variants(plan: Plan) -> Iterator[tuple[str, Plan]]:
    """The plan as lowered, then one plan per other config of each group's kernel (that group changed,
    the others left at their defaults)."""
    yield "default configs", plan
    target = plan.kernel_target()
    for i, group in enumerate(plan.groups):
        kernel = load_choice(group.kernel.file, group.kernel.sha256)
        offered = kernel.configs_for(target)  # what a tune may choose here (a file's `configs(traits)`)
        assert group.kernel.config == offered[0], f"{group.id}: a plan starts at the default config"
        for config in offered[1:]:
            groups = list(plan.groups)
            groups[i] = dataclasses.replace(
                group, kernel=dataclasses.replace(group.kernel, config=dict(config))
            )
            label = f"group `{group.id}` ({group.kernel.file}) config {config}"
            yield label, dataclasses.replace(plan, groups=groups)


def declared_patterns(backend: Backend) -> list[str]:
    """The fusion patterns `backend` opts into for a plan made without bindings (as `lowered` makes
    it) and that its kernel library implements (a kernel file's IMPLEMENTS)."""
    fusion_patterns = getattr(backend, "fusion_patterns", None)
    patterns = fusion_patterns(None) if fusion_patterns is not None else backend.patterns
    implemented = backend.ops()
    return [p for p in patterns if p in implemented]


def required_patterns(entry: OpInfo, graph: Graph, backend: Backend) -> tuple[str, ...]:
    """The groups the plan of `entry` must have on `backend`, read from what the backend declares, so
    that a backend is held to its own patterns and ops, not to another's. Skips the case when the
    backend opts into none of the entry's fused patterns, or (a single-op entry) its kernel library
    implements no kernel for one of the graph's ops."""
    if entry.patterns:
        declared = declared_patterns(backend)
        wanted = tuple(p for p in entry.patterns if p in declared)
        if not wanted:
            pytest.skip(
                f"{backend.name} opts into none of {', '.join(entry.patterns)} with a kernel "
                f"(its patterns with kernels: {', '.join(declared) or 'none'})"
            )
        return wanted if entry.fusion_required else ()
    missing = sorted({n.op for n in graph.nodes} - backend.ops())
    if missing:
        pytest.skip(
            f"the {backend.language} kernel library of {backend.name} implements no {', '.join(missing)}"
        )
    return (entry.op,) if entry.fusion_required else ()


def lowered(entry: OpInfo, dtype: DType, backend: Backend) -> Plan:
    graph = entry.build(dtype)
    required = required_patterns(entry, graph, backend)
    plan = backend.lower(graph, load_profile(backend.targets[0]))
    patterns = [g.pattern for g in plan.groups]
    for pattern in required:
        assert pattern in patterns, (
            f"the {backend.name} plan has no `{pattern}` group; its groups: {patterns}"
        )
    return plan


# --- running one sample ------------------------------------------------------------------------------


def seeded_rng() -> tuple[int, np.random.Generator]:
    seed = os.environ.get("CONFORMANCE_SEED")
    entropy = int(seed) if seed else np.random.SeedSequence().entropy
    return entropy, np.random.default_rng(entropy)


def copies(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in arrays.items()}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def run_reference(
    graph: Graph,
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray],
    state: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    with np.errstate(over="ignore"):  # exp(-x) of a large negative x is inf, and silu is then -0
        return reference.run(graph, copies(params), copies(inputs), state)


def intermediate_scale(
    graph: Graph,
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray],
    state: Mapping[str, np.ndarray],
) -> float:
    """The largest |value| among the reference's float intermediates (node outputs the graph does not
    return): an error made computing them is relative to them, not to the output, fused or not (a
    projection of +-100 that the residual add cancels to ~0 carries the projection's rounding; a fused
    kernel may also keep them unrounded)."""
    types = graph.types()
    inner = [
        v
        for n in graph.nodes
        for v in n.outputs
        if v not in graph.outputs.values() and types[v].dtype.is_float
    ]
    probe = graph.copy()
    probe.outputs = {**graph.outputs, **{f"<{v}>": v for v in inner}}
    values = run_reference(probe, params, inputs, copies(state))
    return max((float(np.abs(values[f"<{v}>"].astype(np.float64)).max()) for v in inner), default=0.0)


def written_slots(
    graph: Graph, inputs: Mapping[str, np.ndarray], state: str, shape: tuple[int, ...]
) -> np.ndarray:
    """Mask over the cache's [blocks, block_size] of the slots that the kv_writes of `state` write."""
    mask = np.zeros(shape[:2], dtype=bool)
    chain = {state}
    for node in graph.nodes:
        if node.op == "kv_write" and node.inputs[0] in chain:
            chain.add(node.outputs[0])
            blocks, slots = reference.cache_slots(inputs[node.inputs[2]], inputs[node.inputs[3]], shape[1])
            mask[blocks, slots] = True
    return mask


def load(backend: Backend, plan: Plan, sample: Sample) -> Executable:
    """Compile and load `plan` with the sample's weights, outputs poisoned, state (if any) allocated."""
    exe = backend.load(backend.compile(plan), copies(sample.params))
    assert hasattr(exe, "poison"), f"the {backend.name} executable has no poison (verify) mode"
    exe.poison = True
    if plan.graph.state:
        exe.allocate_state(sample.cache_blocks)
    return exe


def check_outputs(
    graph: Graph, actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], slack: float, at: str
) -> None:
    assert set(actual) == set(expected), f"{at}: outputs {sorted(actual)}, expected {sorted(expected)}"
    types = graph.types()
    for name, want in expected.items():
        got = actual[name]
        dtype = types[graph.outputs[name]].dtype
        assert got.dtype == want.dtype, f"{at}: output `{name}` is {got.dtype}, expected {want.dtype}"
        tol = op_tolerance(dtype)
        result = compare(got, want, Tolerance(tol.rtol, tol.atol + tol.rtol * slack))
        assert result.ok, f"{at}: output `{name}` ({dtype}): {result}"


def check_sample(backend: Backend, plan: Plan, sample: Sample, where: str) -> None:
    graph = plan.graph
    chained = len(plan.graph.nodes) > 1  # intermediates exist: their errors carry (intermediate_scale)
    exe = load(backend, plan, sample)
    ref_state = {
        name: np.zeros(concrete(t.shape, {"cache_blocks": sample.cache_blocks}), dtype=t.dtype.numpy)
        for name, t in graph.state.items()
    }
    for name, zeros in ref_state.items():
        assert same_bits(exe.read_state(name), zeros), (
            f"{where}: state `{name}` is not zero after allocate_state"
        )
    for step, inputs in enumerate(sample.steps):
        at = f"{where}, step {step}" if len(sample.steps) > 1 else where
        before = {name: exe.read_state(name) for name in graph.state}
        slack = intermediate_scale(graph, sample.params, inputs, ref_state) if chained else 0.0
        expected = run_reference(graph, sample.params, inputs, ref_state)
        given = copies(inputs)
        actual = exe.run(given)
        for name, arr in inputs.items():
            assert same_bits(given[name], arr), f"{at}: the run wrote into its input `{name}`"
        check_outputs(graph, actual, expected, slack, at)
        for name, want in ref_state.items():
            after = exe.read_state(name)
            kept = ~written_slots(graph, inputs, name, after.shape)
            if not same_bits(after[kept], before[name][kept]):
                changed = np.argwhere(kept & (after != before[name]).any(axis=(2, 3)))
                raise AssertionError(
                    f"{at}: state `{name}`: {len(changed)} slots that the step does not write changed, "
                    f"e.g. [block, slot] {changed[:4].tolist()}"
                )
            assert same_bits(after, want), (
                f"{at}: state `{name}` differs from the reference: {compare(after, want, Tolerance(0.0, 0.0))}"
            )


def corrupt_weight(exe: Executable, name: str, value: np.ndarray) -> None:
    """Change one weight of a loaded executable the way a test that corrupts it does: through
    `set_weight` where the device arrays are immutable (JAX), else in place on `weight(name)`."""
    if hasattr(exe, "set_weight"):
        exe.set_weight(name, value)
        return
    weight = exe.weight(name)
    if isinstance(weight, np.ndarray):
        weight[...] = value
    else:  # a torch tensor (the cpu, cuda and rocm executables)
        from polymorph.backends.torch_bridge import to_torch

        weight.copy_(to_torch(value, weight.device))


# --- the tests ---------------------------------------------------------------------------------------


def check_case(entry: OpInfo, dtype: DType, backend_name: str) -> None:
    backend = runnable_backend(backend_name)
    seed, rng = seeded_rng()
    plan = lowered(entry, dtype, backend)
    samples = entry.samples(plan.graph, dtype, rng)
    for label, variant in config_variants(plan):
        for sample in samples:
            where = f"{entry.name} {dtype} on {backend_name}, {label}, sample `{sample.label}` (seed {seed})"
            try:
                check_sample(backend, variant, sample, where)
            except Exception as e:  # a crash names its case and seed too
                if not isinstance(e, AssertionError):
                    e.add_note(where)
                raise


def test_op(entry: OpInfo, dtype: DType, backend_name: str) -> None:
    check_case(entry, dtype, backend_name)


def test_fused(entry: OpInfo, dtype: DType, backend_name: str) -> None:
    check_case(entry, dtype, backend_name)


def test_weights_live(entry: OpInfo, dtype: DType, backend_name: str) -> None:
    """A weight changed after a first run (in place through `Executable.weight`, as the isolation gate
    does) is what the next run reads, in every kernel config: no config may keep a stale copy of it."""
    backend = runnable_backend(backend_name)
    seed, rng = seeded_rng()
    plan = lowered(entry, dtype, backend)
    weights = [name for name, t in plan.graph.params.items() if t.dtype.is_float]  # (conftest: no state)
    sample = entry.samples(plan.graph, dtype, rng)[0]
    (inputs,) = sample.steps
    corrupted = copies(sample.params)
    for name in weights:
        corrupted[name] = (-corrupted[name].astype(np.float32)).astype(corrupted[name].dtype)
    chained = len(plan.graph.nodes) > 1  # intermediates exist: their errors carry (intermediate_scale)
    for label, variant in config_variants(plan):
        where = f"{entry.name} {dtype} on {backend_name}, {label}, sample `{sample.label}` (seed {seed})"
        exe = load(backend, variant, sample)
        exe.run(copies(inputs))  # a first run may build caches of the weights
        for name in weights:
            corrupt_weight(exe, name, corrupted[name])
        slack = intermediate_scale(variant.graph, corrupted, inputs, {}) if chained else 0.0
        expected = run_reference(variant.graph, corrupted, inputs, {})
        check_outputs(
            variant.graph,
            exe.run(copies(inputs)),
            expected,
            slack,
            f"{where}, weights changed after a first run",
        )


def test_table_covers_every_op(op_table: tuple[OpInfo, ...]) -> None:
    covered = {e.op for e in op_table}
    missing = sorted(set(OPS) - covered)
    assert not missing, f"ops without a conformance entry: {', '.join(missing)}"


def test_table_covers_cpu_patterns(op_table: tuple[OpInfo, ...]) -> None:
    cpu = registry.get("cpu")
    covered = {p for e in op_table for p in e.patterns}
    missing = sorted(set(cpu.patterns) - covered)
    assert not missing, f"cpu fusion patterns without a conformance entry: {', '.join(missing)}"
    assert declared_patterns(cpu) == list(cpu.patterns), (
        "a cpu fusion pattern has no kernel in kernels/torch/"
    )


def test_cpu_implements_every_op() -> None:
    """The cpu backend runs any graph: no single-op case of it is skipped for a missing kernel."""
    missing = sorted(set(OPS) - registry.get("cpu").ops())
    assert not missing, f"ops without a kernel in kernels/torch/: {', '.join(missing)}"


def test_allocate_state_without_state() -> None:
    """allocate_state on a graph without state is harmless (every case above runs one without it)."""
    backend = runnable_backend("cpu")
    b = GraphBuilder("stateless")
    b.output("y", b.op("silu", "act", b.input("x", DType.F32, (3,))))
    graph = b.build()
    exe = backend.load(backend.compile(backend.lower(graph, load_profile("cpu"))), {})
    exe.allocate_state(1)
    x = np.arange(3, dtype=np.float32)
    want = reference.run(graph, {}, {"x": x}, {})["y"]
    assert compare(exe.run({"x": x})["y"], want, op_tolerance(DType.F32)).ok
