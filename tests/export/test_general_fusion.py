"""General fusion of imported programs (polymorph/passes/fuse_general.py): an elementwise chain, a layer
norm and a softmax written by hand each become one group, one kernel file (general_fused.py) on cpu
and on neuron, never across a matmul or a value read elsewhere, and the outputs stay PyTorch eager's
within the f32 model tolerance on fresh random inputs; in bf16 the fused groups are bit for bit the
unfused plan (each op rounded to its dtype, as its own kernel does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polymorph import api
from polymorph.engine.controller import Controller
from polymorph.engine.gates import NUMERICS
from polymorph.frontend import from_torch
from polymorph.frontend.tensors import run_on
from polymorph.ir import reference
from polymorph.ir.dtypes import DType
from polymorph.passes import fuse_general
from polymorph.pipeline.backend import registry
from polymorph.pipeline.kernel_files import kernels_root
from polymorph.verify.tolerance import compare, model_tolerance

# x * sigmoid(x) is raised to silu at import (polymorph/passes/recognize.py) where recognition runs.
CHAINS = ("elementwise:silu+add+gelu", "elementwise:sigmoid+mul+add+gelu")
LAYER_NORM = "reduction:reduce_mean+sub+mul+reduce_mean+sqrt+mul+add+div+add"
SOFTMAX = "reduction:mul+add+reduce_max+sub+exp+reduce_sum+div"
# Ops of the three parts that only a fused group may hold.
PART_OPS = frozenset(
    {"sigmoid", "silu", "gelu", "sqrt", "exp", "reduce_mean", "reduce_max", "reduce_sum", "div"}
)
KERNEL = {"cpu": "torch/general_fused.py", "neuron": "xla/general_fused.py"}


class Block(torch.nn.Module):
    """A chain between two projections, a layer norm and an attention softmax written by hand."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.w = torch.nn.Parameter(torch.randn(dim))
        self.b = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        h = F.gelu(h * torch.sigmoid(h) + 1)  # the chain
        h = self.down(h)
        mu = h.mean(-1, keepdim=True)  # the layer norm, eps added to the deviation (no LLM norm)
        xc = h - mu
        std = torch.sqrt((xc * xc).mean(-1, keepdim=True))
        y = self.w * xc / (std + 1e-5) + self.b
        s = y @ y.transpose(-1, -2) * 0.125 + mask  # the softmax, its scale and mask as prologue
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - m)
        p = e / e.sum(-1, keepdim=True)
        return p @ y


_MODELS: dict[str, Any] = {}


def block(dtype: str = "f32") -> tuple[torch.nn.Module, Any, tuple[torch.Tensor, ...]]:
    """(eager module, imported model, example inputs), imported once per session and dtype."""
    if dtype not in _MODELS:
        torch.manual_seed(7)
        module = Block().eval()
        example = (torch.randn(2, 8, 32), torch.randn(2, 8, 8))
        _MODELS[dtype] = (
            module,
            from_torch(module, example, dtype=None if dtype == "f32" else dtype),
            example,
        )
    return _MODELS[dtype]


def fresh(example: tuple[torch.Tensor, ...], rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in example]


@pytest.mark.parametrize("backend", ["cpu", "neuron"])
def test_one_kernel_per_chain_and_reduction(backend: str) -> None:
    _, model, _ = block()
    plan = api.compile(model, backend).plan
    fused = [g for g in plan.groups if fuse_general.family(g.pattern)]
    patterns = sorted(g.pattern for g in fused)
    assert len(fused) == 3 and patterns[0] in CHAINS, patterns
    assert patterns[1:] == sorted([LAYER_NORM, SOFTMAX]), patterns
    assert {g.kernel.file for g in fused} == {KERNEL[backend]}
    assert all(len(g.outputs) == 1 for g in fused)
    # Nothing fuses across a projection: the matmuls and layout ops stay groups of their own.
    by_name = {n.name: n for n in plan.graph.nodes}
    for g in plan.groups:
        ops = {by_name[n].op for n in g.nodes}
        assert not (ops & {"matmul", "linear", "reshape", "transpose"}) or len(g.nodes) == 1, g.id
    # Every op of the three parts is inside one of the fused groups.
    inside = {n for g in fused for n in g.nodes}
    for n in plan.graph.nodes:
        if n.op in PART_OPS:
            assert n.name in inside, n.name


@pytest.mark.parametrize("engine", ["reference", "cpu", "neuron"])
def test_fused_program_matches_eager(engine: str) -> None:
    module, model, example = block()
    args = fresh(example, np.random.default_rng())
    inputs = dict(zip(model.input_names, args, strict=True))
    with torch.no_grad():
        want = module(*map(torch.from_numpy, args)).numpy()
    if engine == "reference":
        got = reference.run(model.graph, model.weights(), inputs, {})
    else:
        got = run_on(model, inputs, engine)
    result = compare(got["output_0"].astype(np.float32), want, model_tolerance(DType.F32))
    assert result.ok, f"{engine}: {result}"


@pytest.mark.parametrize("backend", ["cpu", "neuron"])
def test_bf16_groups_round_each_op_as_the_unfused_plan(backend: str, monkeypatch: Any) -> None:
    """Per-op rounding: the fused plan's output is bitwise the unfused plan's on the same inputs."""
    _, model, example = block("bf16")
    rng = np.random.default_rng()
    inputs = {
        n: a.astype(DType.BF16.numpy) for n, a in zip(model.input_names, fresh(example, rng), strict=True)
    }

    def run() -> tuple[np.ndarray, int]:
        artifact = api.compile(model, backend)
        out = registry.get(backend).load(artifact, model.weights()).run(dict(inputs))["output_0"]
        return out, sum(1 for g in artifact.plan.groups if fuse_general.family(g.pattern))

    fused, n_fused = run()
    monkeypatch.setattr(fuse_general, "general_groups", lambda graph, taken=(): [])
    unfused, n_unfused = run()
    assert (n_fused, n_unfused) == (3, 0)
    np.testing.assert_array_equal(fused.view(np.uint16), unfused.view(np.uint16))
    want = reference.run(model.graph, model.weights(), inputs, {})["output_0"]
    assert compare(fused.astype(np.float32), want.astype(np.float32), model_tolerance(DType.BF16)).ok


class Shared(torch.nn.Module):
    """Values read outside a chain: `t` is an output and `u` has two readers."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.tanh(x)
        u = torch.exp(x) * 2
        return t, (t * 3 + 1).relu(), u + 1, u.sum(-1) / 4


def test_values_read_elsewhere_bound_the_groups() -> None:
    model = from_torch(Shared(), (torch.randn(4, 16),))
    plan = api.compile(model, "cpu").plan
    by_name = {n.name: n for n in plan.graph.nodes}
    ops = sorted("+".join(by_name[n].op for n in g.nodes) for g in plan.groups)
    # tanh is an output, so it ends its own group; exp * 2 has two readers, so it is a group of its own
    # (a chain), and each reader starts another (the sum with its epilogue is a reduction group).
    assert ops == ["add", "exp+mul", "mul+add+relu", "reduce_sum+div", "tanh"], ops
    x = np.random.default_rng().standard_normal((4, 16)).astype(np.float32)
    with torch.no_grad():
        want = [t.numpy() for t in Shared()(torch.from_numpy(x))]
    got = run_on(model, {model.input_names[0]: x}, "cpu")
    for i, w in enumerate(want):
        assert compare(got[f"output_{i}"], w, model_tolerance(DType.F32)).ok, i


def test_engine_swaps_a_fused_group(tmp_path: Path) -> None:
    """A fused group is a unit of the engine like any other: a config of its kernel file swaps in and
    passes the gates; a candidate 1% off in one op of the group is rejected by the numerics gate."""

    module, model, example = block()
    path = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(module, example, strict=False), str(path))
    stock = kernels_root() / KERNEL["cpu"]
    bad = tmp_path / "general_fused_off.py"
    text = stock.read_text()
    bad.write_text(text.replace('"add": torch.add,', '"add": lambda a, b: a + 1.01 * b,'))
    assert bad.read_text() != text
    with Controller.start(str(path), "cpu") as engine:
        (group,) = [g for g in engine.groups() if engine.plan_group(g)["pattern"] == SOFTMAX]
        _, good = engine.try_candidate(group, str(stock), {"round": "output"})
        assert good is not None and good.ok, [(g.name, g.cause) for g in good.failed()]
        _, off = engine.try_candidate(group, str(bad), {})
        assert off is not None and [g.name for g in off.failed()] == [NUMERICS], off.failed()


# --- random programs ---------------------------------------------------------------------------------

R, C = 3, 5  # rows, columns: every value is [R, C] or broadcasts into it
_SHAPES = ((R, C), (R, 1), (1, C), (C,), (1, 1))
_UNARY = ("tanh", "sigmoid", "neg", "abs", "relu", "sin")  # bounded, so chains stay finite
_BINARY = ("add", "mul", "sub", "maximum", "minimum")
_REDUCE = ("reduce_sum", "reduce_max", "reduce_mean", "softmax")


@st.composite
def programs(draw: st.DrawFn) -> tuple[Any, dict[str, np.ndarray]]:
    """A random imported-like program: elementwise ops, reductions over either axis and matmuls, each
    reading earlier values, several of them outputs."""
    from polymorph.ir.builder import GraphBuilder

    b = GraphBuilder("random", meta={"source": "torch.export"})
    shapes = {b.input("x", DType.F32, (R, C)): (R, C)}
    for i, shape in enumerate(draw(st.lists(st.sampled_from(_SHAPES), min_size=1, max_size=3))):
        shapes[b.param(f"p{i}", DType.F32, shape)] = shape
    b.param("w", DType.F32, (C, C))
    for i in range(draw(st.integers(2, 12))):
        values = sorted(shapes)
        kind = draw(st.sampled_from(("unary", "binary", "binary", "reduce", "matmul")))
        x = draw(st.sampled_from(values))
        if kind == "unary":
            y = b.op(draw(st.sampled_from(_UNARY)), f"n{i}", x)
            shapes[y] = shapes[x]
        elif kind == "binary":
            z = draw(st.sampled_from(values))
            y = b.op(draw(st.sampled_from(_BINARY)), f"n{i}", x, z)
            shapes[y] = tuple(np.broadcast_shapes(shapes[x], shapes[z]))
        elif kind == "reduce" and len(shapes[x]) == 2:
            op, axis = draw(st.sampled_from(_REDUCE)), draw(st.sampled_from((0, 1)))
            attrs = {"axis": axis} if op == "softmax" else {"axes": (axis,), "keepdims": True}
            y = b.op(op, f"n{i}", x, **attrs)
            shapes[y] = (
                shapes[x]
                if op == "softmax"
                else tuple(1 if a == axis else d for a, d in enumerate(shapes[x]))
            )
        elif shapes[x] == (R, C):
            y = b.op("matmul", f"n{i}", x, "w")
            shapes[y] = (R, C)
        else:
            continue
    made = [v for v in shapes if v.startswith("n")]
    if not made:
        made = [b.op("tanh", "n_last", "x")]
    for k, v in enumerate(dict.fromkeys([made[-1], *draw(st.lists(st.sampled_from(made), max_size=3))])):
        b.output(f"output_{k}", v)
    graph = b.build()
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    weights = {n: rng.standard_normal(t.shape).astype(np.float32) for n, t in graph.params.items()}
    return graph, weights


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_fuse_soundly(program: tuple[Any, dict[str, np.ndarray]]) -> None:
    """Every general group has one output, fusable ops only and one reduced space; the groups run in a
    valid order (fuse checks it), and the cpu plan equals the reference within the f32 tolerance."""
    from polymorph.hardware.profile import load_profile

    graph, weights = program
    backend = registry.get("cpu")
    plan = backend.lower(graph, load_profile("cpu"))
    by_name = {n.name: n for n in plan.graph.nodes}
    types = plan.graph.types()
    for g in plan.groups:
        if not fuse_general.family(g.pattern):
            continue
        nodes = [by_name[n] for n in g.nodes]
        assert len(g.outputs) == 1 and len(nodes) > 1, g
        assert all(n.op in fuse_general.FUSABLE_OPS for n in nodes), g
        spaces = {fuse_general.reduced_space(n, types) for n in nodes if n.op in fuse_general.REDUCTION_OPS}
        assert len(spaces) <= 1, g
        assert g.kernel.file == KERNEL["cpu"], g
    inputs = {"x": np.random.default_rng().standard_normal((R, C)).astype(np.float32)}
    got = backend.load(backend.compile(plan), weights).run(inputs)
    want = reference.run(plan.graph, weights, inputs, {})
    for name, expected in want.items():
        assert compare(got[name], expected, model_tolerance(DType.F32)).ok, name
