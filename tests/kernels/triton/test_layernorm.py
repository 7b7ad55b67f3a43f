"""kernels/triton/layernorm.py (DeepSeek-V3.2's indexer key norm, and any layernorm) against the numpy
reference under Triton's interpreter: every cuda config (and rocm's, whose configs differ), f32 and
bf16, rows of 72, 128 and 1000 (one masked block, one full block, several blocks a row under the
smaller configs), fresh random inputs (normal, and shifted by +-50 so the mean matters), NaN-poisoned
outputs. The cases run in child processes unless this process interprets (`python
tests/kernels/triton/test_layernorm.py CASE...` runs them directly); LAYERNORM_SEED reproduces a seed.
Without a device: the indexer's shapes (one key of 128 per token, decode and a 2k prefill) compile ahead
of time for sm_90, sm_100, gfx942 and gfx950 without spills, every config."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polymorph.hardware.target import Target
from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.passes.fuse import fuse
from polymorph.pipeline.kernel_files import KernelSpec
from polymorph.pipeline.lowering import kernel_spec
from polymorph.verify.tolerance import compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, process_interprets, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA, ROCM = Target.parse("cuda:sm_90"), Target.parse("rocm:gfx942")
F32, BF16 = DType.F32, DType.BF16
TORCH = {F32: torch.float32, BF16: torch.bfloat16}


def graph_of(dtype: DType, shape: tuple[Any, ...], eps: float = 1e-6) -> Graph:
    g = GraphBuilder("layernorm")
    x = g.input("x", dtype, shape)
    w = g.param("w", dtype, (shape[-1],))
    b = g.param("b", dtype, (shape[-1],))
    g.output("y", g.op("layernorm", "norm", x, w, b, eps=eps))
    return g.build()


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (group,) = fuse(graph, ())
    return kernel_spec(graph, group, graph.types(), target)


def case(d: int, dtype: DType, target: Target) -> None:
    seed = int(os.environ.get("LAYERNORM_SEED") or np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    graph = graph_of(dtype, (3, 5, d))
    kf = kernel("layernorm", interpret=True)
    spec = spec_of(graph, target)
    assert kf.supports(spec)
    # A shifted row makes the mean matter; its f32 sum carries the rounding of its magnitude (a shift of
    # 50 over 1000 columns moves the f32 mean by ~1e-5, past the f32 atol), so f32 shifts by 4.
    for shift in (0.0, 50.0 if dtype == BF16 else 4.0):
        arrays = {
            "x": (rng.standard_normal((3, 5, d)) + shift * rng.choice([-1, 1], (3, 5, 1))).astype(np.float32),
            "w": (1 + 0.3 * rng.standard_normal(d)).astype(np.float32),
            "b": (0.2 * rng.standard_normal(d)).astype(np.float32),
        }
        arrays = {k: v.astype(dtype.numpy) for k, v in arrays.items()}
        want = reference.run(graph, {k: arrays[k] for k in ("w", "b")}, {"x": arrays["x"]}, {})["y"]
        args = [torch.from_numpy(arrays[v].astype(np.float32)).to(TORCH[dtype]) for v in spec.inputs]
        for config in kf.configs_for(target):
            out = torch.full((3, 5, d), float("nan"), dtype=TORCH[dtype])
            kf.build(spec, config, target)(args, [out], None)
            got = out.float().numpy()
            check = compare(got, want.astype(np.float32), op_tolerance(dtype))
            assert check.ok, (
                f"layernorm d={d} {dtype} shift {shift} {config} on {target} (seed {seed}): {check}"
            )


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for d in (72, 128, 1000):
        for dtype in (F32, BF16):
            cases[f"cuda-d{d}-{dtype}"] = functools.partial(case, d, dtype, CUDA)
        cases[f"rocm-d{d}-bf16"] = functools.partial(case, d, BF16, ROCM)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_supports() -> None:
    kf = kernel("layernorm", interpret=False)
    assert kf.supports(spec_of(graph_of(BF16, ("batch", "seq", 128)), CUDA))
    assert kf.supports(spec_of(graph_of(F32, ("batch", 128)), ROCM))
    assert not kf.supports(spec_of(graph_of(BF16, ("batch", "seq", 128)), Target.parse("cpu")))
    assert not kf.supports(spec_of(graph_of(BF16, ("batch", "seq", "d")), CUDA))


@pytest.mark.compile
@pytest.mark.parametrize("target_name", ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950"))
def test_compiles_without_spills(target_name: str) -> None:
    from polymorph.backends.gpu.aot import compile_unit
    from polymorph.hardware.traits import traits_for

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    traits = traits_for(target)
    kf = kernel("layernorm", interpret=False)
    for shape in ((1, 1, 128), (1, 2048, 128), (1, 1, 7168)):
        spec = spec_of(graph_of(BF16, shape), target)
        for config in kf.configs_for(traits):
            (unit,) = kf.compile_units(spec, config, traits)
            c = compile_unit(unit, target)
            assert c.resources.get("spill_bytes") == 0, f"{shape} {config} on {target_name}: spills"


if __name__ == "__main__":
    child_main(CASES)
