"""kernels/triton/attn_temperature.py (Llama 4's attention temperature: x * (log1p(floor((p + 1) /
floor_scale)) * scale + 1) per token) against the numpy reference.

Under Triton's interpreter on CPU tensors: every config for cuda (and for rocm, whose configs differ),
f32 and bf16 (f16 once), i32 and i64 positions, fresh random inputs (normal, and uniform in +-100),
NaN-poisoned outputs. Positions span several multiples of floor_scale, with the tokens at and beside
each boundary (p + 1 a multiple of floor_scale, where the quotient is exact and its floor must not drop);
the floor scales are Llama 4's 8192, a power of two and one whose quotients round. Rows of 72 (one
masked block) and 400 elements (several blocks a token under the smaller configs). The cases run in
child processes unless this process interprets (`python tests/kernels/triton/test_attn_temperature.py
CASE...` runs them directly); ATTN_TEMPERATURE_SEED=<seed> reproduces a failure's seed.

Without a device: Llama 4 Scout's query shapes (40 heads of 128) at decode and prefill compile ahead of
time for sm_90, sm_100, gfx942 and gfx950 without spills, every config.
"""

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
F32, BF16, F16, I32, I64 = DType.F32, DType.BF16, DType.F16, DType.I32, DType.I64
TORCH = {F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16}
# name -> (floor_scale, scale, x shape [B, S, H, Dh])
SETTINGS: dict[str, tuple[float, float, tuple[int, int, int, int]]] = {
    "llama4": (8192.0, 0.1, (3, 7, 3, 24)),
    "pow2": (64.0, 0.37, (3, 7, 5, 80)),
    "odd": (3.0, 1.5, (2, 9, 3, 24)),
}
MULTIPLES = 6  # positions reach this many multiples of floor_scale


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("ATTN_TEMPERATURE_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def graph_of(
    dtype: DType, pos_dtype: DType, shape: tuple[Any, ...], floor_scale: float, scale: float
) -> Graph:
    g = GraphBuilder("attn_temperature")
    x = g.input("x", dtype, shape)
    pos = g.input("positions", pos_dtype, shape[:2])
    g.output("y", g.op("attn_temperature", "temperature", x, pos, floor_scale=floor_scale, scale=scale))
    return g.build()


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (group,) = fuse(graph, ())
    return kernel_spec(graph, group, graph.types(), target)


def tensor(a: np.ndarray, dtype: DType) -> Any:
    if dtype == BF16:  # bf16 crosses as its bits
        return torch.from_numpy(a.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def array(t: Any, dtype: DType) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if dtype == BF16:
        return t.view(torch.int16).numpy().view(np.uint16).view(dtype.numpy).copy()
    return t.numpy().copy()


def positions_of(
    rng: np.random.Generator, floor_scale: float, shape: tuple[int, int], dtype: DType
) -> np.ndarray:
    """Random positions below MULTIPLES * floor_scale, the first tokens at each boundary and beside it
    (p + 1 = k * floor_scale, and one either side), shuffled into the batch."""
    top = int(MULTIPLES * floor_scale)
    pos = rng.integers(0, top, shape[0] * shape[1])
    # each multiple's boundary first (p + 1 = k * floor_scale: every factor appears even when the
    # batch holds only a few edges), then the positions either side of them
    edges = [int(k * floor_scale) - 1 + d for d in (0, -1, 1) for k in range(1, MULTIPLES)]
    edges = [e for e in edges if e >= 0][: pos.size // 2]
    pos[: len(edges)] = edges
    pos[len(edges)] = 0
    return rng.permutation(pos).reshape(shape).astype(dtype.numpy)


def case(setting: str, dtype: DType, pos_dtype: DType, target: Target) -> None:
    floor_scale, scale, shape = SETTINGS[setting]
    seed, rng = seeded()
    graph = graph_of(dtype, pos_dtype, shape, floor_scale, scale)
    kf = kernel("attn_temperature", interpret=True)
    spec = spec_of(graph, target)
    assert kf.supports(spec), f"attn_temperature does not support {setting} {dtype} {pos_dtype} on {target}"
    for dist in ("normal", "uniform"):
        x = rng.standard_normal(shape) if dist == "normal" else rng.uniform(-100, 100, shape)
        arrays = {
            "x": x.astype(np.float32).astype(dtype.numpy),
            "positions": positions_of(rng, floor_scale, shape[:2], pos_dtype),
        }
        factors = reference.attn_temperature_factor(arrays["positions"], floor_scale, scale)
        assert len(np.unique(factors)) >= MULTIPLES - 1, "the positions must span several factors"
        want = reference.run(graph, {}, arrays, {})["y"]
        for config in kf.configs_for(target):
            where = f"{setting} {dtype} positions {pos_dtype} {target} {dist}, config {config} (seed {seed})"
            inputs = [tensor(arrays[v], graph.types()[v].dtype) for v in spec.inputs]
            out = torch.full(shape, float("nan"), dtype=TORCH[dtype])
            kf.build(spec, config, target)(inputs, [out], None)
            got = array(out, dtype).astype(np.float32)
            result = compare(got, want.astype(np.float32), op_tolerance(dtype))
            assert result.ok, f"{where}: {result}"


def interpreter_cases() -> dict[str, Callable[[], None]]:
    """Every setting in f32 and bf16 on cuda, bf16 on rocm; f16 and i64 positions once each."""
    cases: dict[str, Callable[[], None]] = {}
    for dtype, target in ((F32, CUDA), (BF16, CUDA), (BF16, ROCM)):
        for setting in SETTINGS:
            cases[f"{setting}-{dtype}-{target.family}"] = functools.partial(case, setting, dtype, I32, target)
    cases["pow2-f16-cuda"] = functools.partial(case, "pow2", F16, I32, CUDA)
    cases["llama4-bf16-i64-cuda"] = functools.partial(case, "llama4", BF16, I64, CUDA)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_supports() -> None:
    """GPU targets, float x with i32 or i64 positions and concrete heads; nothing else."""
    kf = kernel("attn_temperature", interpret=False)
    ok = graph_of(BF16, I32, ("batch", "seq", 8, 64), 8192.0, 0.1)
    assert kf.supports(spec_of(ok, CUDA)) and kf.supports(spec_of(ok, ROCM))
    assert kf.supports(spec_of(graph_of(F32, I64, (1, 4, 8, 64), 8192.0, 0.1), CUDA))
    assert not kf.supports(spec_of(ok, Target.parse("cpu")))
    assert not kf.supports(spec_of(graph_of(BF16, I32, ("batch", "seq", "heads", 64), 8192.0, 0.1), CUDA))
    assert not kf.supports(spec_of(graph_of(BF16, I32, ("batch", "seq", 8, "dh"), 8192.0, 0.1), CUDA))


# --- ahead-of-time compile, no device -------------------------------------------------------------------

AOT_TARGETS = ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950")


@pytest.mark.compile
@pytest.mark.parametrize("target_name", AOT_TARGETS)
def test_compiles_without_spills(target_name: str) -> None:
    from polymorph.backends.gpu.aot import compile_unit
    from polymorph.hardware.traits import traits_for

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    traits = traits_for(target)
    kf = kernel("attn_temperature", interpret=False)
    # Llama 4 Scout's queries (40 heads of 128): decode in bf16, a 2k prefill in bf16 and f32 (i64 positions)
    specs = [
        (BF16, I32, (1, 1, 40, 128)),
        (BF16, I32, (1, 2048, 40, 128)),
        (F32, I64, (1, 2048, 40, 128)),
    ]
    for dtype, pos_dtype, shape in specs:
        spec = spec_of(graph_of(dtype, pos_dtype, shape, 8192.0, 0.1), target)
        assert kf.supports(spec), (dtype, pos_dtype, shape, target_name)
        for config in kf.configs_for(traits):
            (unit,) = kf.compile_units(spec, config, traits)
            c = compile_unit(unit, target)
            where = f"{unit.name} {dtype} {pos_dtype} {shape} {config} on {target_name}"
            assert c.resources.get("spill_bytes") == 0, (
                f"{where}: spills {c.resources.get('spill_bytes')} bytes"
            )
            if target.family == "cuda":  # the quotient by IEEE division, never an approximation
                ptx = str(c.asm.get("ptx", ""))
                assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx, where


if __name__ == "__main__":
    child_main(CASES)
