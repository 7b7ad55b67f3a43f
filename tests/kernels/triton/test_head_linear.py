"""kernels/triton/head_linear.py (x[*, H, K], w[H, N, K] -> [*, H, N], one projection per head: MLA's
absorbed up-projections) against the numpy reference.

Under Triton's interpreter on CPU tensors: every config of the cuda space in f32 and bf16, the rocm
space (its configs differ) in bf16, f16 once; token counts 1, 3 and 70 (none a multiple of a token
tile; 70 spans two of 64), N and K off the tiles (N 40 and 136: a partial N tile, one of them the
second; K 40 and 88: a masked K step, 88 after full ones, under the f32 K step of 16 too), fresh random inputs, NaN-poisoned outputs.
The cases run in child processes unless this process interprets (`python
tests/kernels/triton/test_head_linear.py CASE...` runs them directly); HEAD_LINEAR_SEED=<seed>
reproduces a failure's seed.

Without a device: DeepSeek-V3's absorbed projections (128 heads; K 128 -> N 512 for the queries, K 512
-> N 128 for the output) at decode (1 and 64 tokens) and a 2k-token prefill compile ahead of time for
sm_90, sm_100, gfx942 and gfx950 without spills, every config in bf16 and the default in f32.
"""

from __future__ import annotations

import functools
import itertools
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
F32, BF16, F16 = DType.F32, DType.BF16, DType.F16
TORCH = {F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16}
# name -> (leading dims of x, H, N, K): 1, 3 and 70 tokens
SHAPES: dict[str, tuple[tuple[int, ...], int, int, int]] = {
    "t1": ((1, 1), 3, 40, 88),
    "t3": ((3,), 2, 136, 40),
    "t70": ((2, 35), 3, 40, 88),
}


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("HEAD_LINEAR_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def graph_of(
    x_dtype: DType, lead: tuple[Any, ...], h: Any, n: int, k: int, w_dtype: DType | None = None
) -> Graph:
    g = GraphBuilder("head_linear")
    x = g.input("x", x_dtype, (*lead, h, k))
    w = g.param("w", w_dtype or x_dtype, (h, n, k))
    g.output("y", g.op("head_linear", "absorb", x, w))
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


# --- interpreter cases -------------------------------------------------------------------------------


def case(shape: str, dtype: DType, target: Target) -> None:
    lead, h, n, k = SHAPES[shape]
    seed, rng = seeded()
    graph = graph_of(dtype, lead, h, n, k)
    kf = kernel("head_linear", interpret=True)
    spec = spec_of(graph, target)
    assert kf.supports(spec), f"head_linear does not support {shape} {dtype} on {target}"
    arrays = {
        "x": rng.standard_normal((*lead, h, k)).astype(np.float32).astype(dtype.numpy),
        "w": (rng.standard_normal((h, n, k)) / np.sqrt(k)).astype(np.float32).astype(dtype.numpy),
    }
    want = reference.run(graph, {"w": arrays["w"]}, {"x": arrays["x"]}, {})["y"].astype(np.float32)
    assert np.abs(want).max() > 0.1, "the reference must not be near zero"
    for config in kf.configs_for(target):
        where = f"{shape} x{(*lead, h, k)} w{(h, n, k)} {dtype} {target}, config {config} (seed {seed})"
        inputs = [tensor(arrays[v], graph.types()[v].dtype) for v in spec.inputs]
        out = torch.full((*lead, h, n), float("nan"), dtype=TORCH[dtype])
        kf.build(spec, config, target)(inputs, [out], None)
        got = array(out, dtype).astype(np.float32)
        result = compare(got, want, op_tolerance(dtype))
        assert result.ok, f"{where}: {result}"


def interpreter_cases() -> dict[str, Callable[[], None]]:
    """Every shape in f32 and bf16 on cuda and bf16 on rocm; f16 once."""
    cases: dict[str, Callable[[], None]] = {}
    for dtype, target in ((F32, CUDA), (BF16, CUDA), (BF16, ROCM)):
        for shape in SHAPES:
            cases[f"{shape}-{dtype}-{target.family}"] = functools.partial(case, shape, dtype, target)
    cases["t70-f16-cuda"] = functools.partial(case, "t70", F16, CUDA)
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


# --- contract ----------------------------------------------------------------------------------------


def test_supports() -> None:
    """GPU targets, one float dtype throughout, concrete heads, N and K; nothing else."""
    kf = kernel("head_linear", interpret=False)
    ok = graph_of(BF16, ("batch", "seq"), 8, 64, 32)
    assert kf.supports(spec_of(ok, CUDA)) and kf.supports(spec_of(ok, ROCM))
    assert kf.supports(spec_of(graph_of(F32, (5,), 2, 3, 7), CUDA))
    assert not kf.supports(spec_of(ok, Target.parse("cpu")))
    assert not kf.supports(spec_of(graph_of(BF16, (1,), "heads", 64, 32), CUDA))
    assert not kf.supports(spec_of(graph_of(BF16, (1,), 8, 64, 32, w_dtype=F32), CUDA))
    assert not kf.supports(spec_of(graph_of(DType.F8E4M3, (1,), 8, 64, 32), CUDA))


def test_tiles_follow_the_tokens_and_the_shapes_reach_the_tails() -> None:
    """Decode shrinks the token tile to 16, a prefill takes the config's; the interpreted shapes leave
    a partial token, N and K tile under every config."""
    from polymorph.hardware.traits import traits_for

    kf = kernel("head_linear", interpret=False)
    for target in (CUDA, ROCM):
        traits = traits_for(target)
        for config in kf.configs_for(target):
            (decode,) = kf.compile_units(
                spec_of(graph_of(BF16, (1, 1), 128, 512, 128), target), config, traits
            )
            (prefill,) = kf.compile_units(
                spec_of(graph_of(BF16, (1, 2048), 128, 512, 128), target), config, traits
            )
            assert decode.constexprs["BLOCK_M"] == 16
            assert prefill.constexprs["BLOCK_M"] == config["block_m"]
            for (lead, h, n, k), dtype in itertools.product(SHAPES.values(), (BF16, F32)):
                (unit,) = kf.compile_units(spec_of(graph_of(dtype, lead, h, n, k), target), config, traits)
                c = unit.constexprs
                assert n % c["BLOCK_N"] and k % c["BLOCK_K"], (config, dtype, lead, h, n, k)
    tokens = [int(np.prod(lead)) for lead, _, _, _ in SHAPES.values()]
    assert tokens == [1, 3, 70]


# --- ahead-of-time compile, no device ----------------------------------------------------------------

AOT_TARGETS = ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950")
# DeepSeek-V3: 128 heads; q absorbed from the 128-wide nope head dim into the 512-wide latent, the
# attention output back from 512 to 128. Leading dims (batch, seq): decode at 1 and 64, a 2k prefill.
DEEPSEEK_V3 = {"q": (128, 512, 128), "out": (128, 128, 512)}
TOKENS = {"decode1": (1, 1), "decode64": (64, 1), "prefill2k": (1, 2048)}


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")  # triton 3.9 announces a default change
@pytest.mark.parametrize("target_name", AOT_TARGETS)
def test_compiles_without_spills(target_name: str) -> None:
    from polymorph.backends.gpu.aot import compile_unit
    from polymorph.hardware.traits import traits_for

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    traits = traits_for(target)
    kf = kernel("head_linear", interpret=False)
    seen: set[str] = set()
    for proj, (h, n, k) in DEEPSEEK_V3.items():
        for tokens, lead in TOKENS.items():
            for dtype in (BF16, F32):
                spec = spec_of(graph_of(dtype, lead, h, n, k), target)
                assert kf.supports(spec), (proj, tokens, dtype, target_name)
                configs = kf.configs_for(traits)
                for config in configs if dtype == BF16 else configs[:1]:
                    (unit,) = kf.compile_units(spec, config, traits)
                    key = repr(
                        (sorted(unit.signature.items()), sorted(unit.constexprs.items()), unit.options)
                    )
                    if key in seen:
                        continue
                    seen.add(key)
                    c = compile_unit(unit, target)
                    where = f"{proj} {tokens} {dtype} {config} on {target_name}"
                    binary = "cubin" if target.family == "cuda" else "hsaco"
                    assert c.asm.get(binary), f"{where}: no {binary}"
                    assert c.resources.get("spill_bytes") == 0, (
                        f"{where}: spills {c.resources.get('spill_bytes')} bytes ({c.resources})"
                    )


if __name__ == "__main__":
    child_main(CASES)
