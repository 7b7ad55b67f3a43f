"""Sliding-window attention over a paged KV cache whose blocks outside the window hold NaN.

A decode or prefill step under a window of W tokens sees, for the query at position p, the keys at
p - W < k <= p (the op table's `window`). Every cache block wholly outside that range for all of a
sequence's queries (blocks that slid out of the window, blocks past the sequence's end, blocks no
sequence names, guard block 0 included) is filled with NaN, in K and in V: a kernel that loads one and
masks it arithmetically (0 * NaN) or lets it into a max or a sum shows NaN. The outputs must match the
reference run on the same cache with random values in those blocks instead, at `op_tolerance`.

Checked on the reference itself, on the cpu backend (kernels/torch), on the neuron backend's XLA
lowering (JAX on the XLA CPU backend) through the same lower/compile/load path the conformance table
uses, and on the Triton files (kernels/triton decode_attention.py and prefill_attention.py) under
Triton's interpreter in child processes (`python tests/conformance/test_window_nan.py CASE...` runs
cases directly). Sequences own distinct blocks (a shuffled table), contexts are ragged, windows are
shorter than one block, across blocks and longer than every context, with and without soft-capping,
with several query positions per sequence. Inputs are fresh each run; WINDOW_NAN_SEED reproduces one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.hardware.profile import load_profile
from polymorph.hardware.target import Target
from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.pipeline.backend import Backend, registry
from polymorph.pipeline.kernel_files import KernelSpec
from polymorph.verify.tolerance import compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, selected
from polymorph.verify.triton_interpreter import load as triton_kernel

CACHES = ("k_cache", "v_cache")


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("WINDOW_NAN_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


@functools.cache
def _backend(name: str) -> Backend | str:
    try:
        backend = registry.get(name)
    except UserError as e:
        return str(e)
    run = backend.probe().run
    return backend if run.ok else f"backend `{name}` cannot run here: {run.reason}"


# --- graphs and arrays ---------------------------------------------------------------------------------


def window_graph(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, block: int, ctx_blocks: int,
                 cache_blocks: int, dtype: DType, window: int, softcap: float) -> Graph:  # fmt: skip
    """One cache_attention node, the caches as graph inputs (the conformance table's form)."""
    g = GraphBuilder("window_nan")
    q = g.input("q", dtype, (batch, seq, heads, head_dim))
    kc = g.input("k_cache", dtype, (cache_blocks, block, kv_heads, head_dim))
    vc = g.input("v_cache", dtype, (cache_blocks, block, kv_heads, head_dim))
    table = g.input("block_table", DType.I32, (batch, ctx_blocks))
    pos = g.input("positions", DType.I32, (batch, seq))
    attrs: dict[str, Any] = {"scale": head_dim**-0.5, "window": window}
    if softcap:
        attrs["softcap"] = softcap
    g.output("out", g.op("cache_attention", "attn", q, kc, vc, table, pos, **attrs))
    return g.build()


def outside_window(
    table: np.ndarray, positions: np.ndarray, block: int, window: int, cache_blocks: int
) -> np.ndarray:
    """[cache_blocks] bool: the blocks no query of any sequence may see under `window` (every block
    not in a table, and each named block whose positions all lie outside the union of its sequence's
    query windows (p - window, p])."""
    dead = np.ones(cache_blocks, dtype=bool)
    for row, pos in zip(table, positions, strict=True):
        first, last = int(pos.min()) - window + 1, int(pos.max())  # the keys some query of it sees
        for j, blk in enumerate(row):
            if j * block <= last and (j + 1) * block - 1 >= first:
                dead[blk] = False
    return dead


def nan_case(rng: np.random.Generator, lens: tuple[int, ...], seq: int, heads: int, kv_heads: int,
             head_dim: int, block: int, ctx_blocks: int, dtype: DType, window: int,
             softcap: float = 0.0) -> tuple[Graph, dict[str, np.ndarray], dict[str, np.ndarray], int]:  # fmt: skip
    """(graph, arrays with NaN outside the window, the same arrays with random values there instead,
    how many blocks hold NaN). Sequence b holds lens[b] tokens; its last `seq` are the queries."""
    batch = len(lens)
    cache_blocks = batch * ctx_blocks + 2  # block 0 and one more are never named
    graph = window_graph(batch, seq, heads, kv_heads, head_dim, block, ctx_blocks, cache_blocks, dtype, window,
                         softcap)  # fmt: skip
    table = (rng.permutation(cache_blocks - 1)[: batch * ctx_blocks] + 1).reshape(batch, ctx_blocks)
    positions = np.array([[n - seq + j for j in range(seq)] for n in lens], dtype=np.int32)
    dead = outside_window(table, positions, block, window, cache_blocks)
    clean = {
        # q x3: scores of several units, where a soft cap of a few units bends them
        "q": (3 * rng.standard_normal((batch, seq, heads, head_dim))).astype(np.float32).astype(dtype.numpy),
        "block_table": table.astype(np.int32),
        "positions": positions,
    }
    for name in CACHES:
        clean[name] = rng.standard_normal((cache_blocks, block, kv_heads, head_dim)).astype(np.float32)
        clean[name] = clean[name].astype(dtype.numpy)
    poisoned = dict(clean)
    for name in CACHES:
        poisoned[name] = clean[name].copy()
        poisoned[name][dead] = np.nan
    return graph, poisoned, clean, int(dead.sum())


def expected(graph: Graph, clean: dict[str, np.ndarray]) -> np.ndarray:
    return reference.run(graph, {}, {k: v.copy() for k, v in clean.items()}, {})["out"]


def assert_close(got: np.ndarray, want: np.ndarray, dtype: DType, where: str) -> None:
    assert not np.isnan(np.asarray(got, dtype=np.float32)).any(), f"{where}: NaN in the output"
    result = compare(np.asarray(got).astype(np.float32), want.astype(np.float32), op_tolerance(dtype))
    assert result.ok, f"{where}: {result}"


# Ragged contexts in 8-block tables of 4-token blocks; windows inside one block (3), across blocks (6,
# 13) and longer than every context (64); one and three queries per sequence.
NUMPY_CASES = [
    pytest.param(seq, window, softcap, dtype, id=f"S{seq}-w{window}{'-softcap' if softcap else ''}-{dtype}")
    for seq in (1, 3)
    for window, softcap in ((3, 0.0), (6, 0.0), (13, 0.0), (64, 0.0), (6, 5.0))
    for dtype in (DType.F32, DType.BF16)
]


def numpy_case(rng: np.random.Generator, seq: int, window: int, softcap: float, dtype: DType) -> tuple:
    return nan_case(rng, (seq + 2, 17, 32), seq, 4, 2, 16, 4, 8, dtype, window, softcap)


@pytest.mark.parametrize(("seq", "window", "softcap", "dtype"), NUMPY_CASES)
def test_reference_ignores_blocks_outside_the_window(
    seq: int, window: int, softcap: float, dtype: DType
) -> None:
    seed, rng = seeded()
    graph, poisoned, clean, dead = numpy_case(rng, seq, window, softcap, dtype)
    assert dead > 2, "the case must put NaN in blocks a table names"
    got = reference.run(graph, {}, poisoned, {})["out"]
    assert_close(got, expected(graph, clean), dtype, f"reference (seed {seed})")
    if window < 32:  # the window matters: the full attention differs
        full = window_graph(3, seq, 4, 2, 16, 4, 8, poisoned["k_cache"].shape[0], dtype, 0, softcap)
        assert not compare(expected(full, clean), got, op_tolerance(dtype)).ok


@pytest.mark.parametrize("backend_name", ["cpu", "neuron"])
@pytest.mark.parametrize(("seq", "window", "softcap", "dtype"), NUMPY_CASES)
def test_backend_skips_blocks_outside_the_window(
    backend_name: str, seq: int, window: int, softcap: float, dtype: DType
) -> None:
    backend = _backend(backend_name)
    if isinstance(backend, str):
        pytest.skip(backend)
    seed, rng = seeded()
    graph, poisoned, clean, _ = numpy_case(rng, seq, window, softcap, dtype)
    plan = backend.lower(graph, load_profile(backend.targets[0]))
    exe = backend.load(backend.compile(plan), {})
    exe.poison = True  # outputs NaN-filled before each kernel: an unwritten element shows
    got = exe.run({k: v.copy() for k, v in poisoned.items()})["out"]
    assert_close(got, expected(graph, clean), dtype, f"{backend_name} (seed {seed})")


# --- Triton under the interpreter ----------------------------------------------------------------------

CUDA = Target.parse("cuda:sm_90")
ROCM = Target.parse("rocm:gfx942")
# 16-token splits even at the interpreter's short contexts (tests/kernels/triton/test_attention.py)
MANY_SPLITS = {"block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 4, "num_warps": 4, "num_stages": 2}


def triton_case(file: str, target: Target, seq: int, window: int, softcap: float, dtype: DType,
                many_splits: bool) -> None:  # fmt: skip
    import torch

    kf = triton_kernel(file, interpret=True)
    seed, rng = seeded()
    # ragged 1..95-token contexts (S = 8: 8..95) in 6-block tables of 16-token blocks, 4 heads over 2
    lens = tuple(max(n, seq) for n in (1, 40, 95))
    graph, poisoned, clean, dead = nan_case(rng, lens, seq, 4, 2, 64, 16, 6, dtype, window, softcap)
    assert dead > 2
    (node,) = graph.nodes
    types = graph.types()
    spec = KernelSpec(node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, types, target)
    where = f"{file} S={seq} window {window} softcap {softcap} {dtype} {target} (seed {seed})"
    assert kf.supports(spec), f"{file} should take {where}"
    want = expected(graph, clean)
    tdtype = {DType.F32: torch.float32, DType.BF16: torch.bfloat16}[dtype]
    args = []
    for v in spec.inputs:
        a = np.ascontiguousarray(poisoned[v])
        t = torch.from_numpy(a.astype(np.float32) if types[v].dtype.is_float else a)
        args.append(t.to(tdtype) if types[v].dtype.is_float else t)
    configs = [kf.configs_for(target)[0], *([MANY_SPLITS] if many_splits else [])]
    for config in configs:
        out = torch.full(want.shape, float("nan"), dtype=tdtype)
        kf.build(spec, config, target)(args, [out], None)
        assert_close(out.float().numpy(), want, dtype, f"{where}, config {config}")


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for target in (CUDA, ROCM):
        for seq, window in ((1, 20), (3, 20), (1, 7)):
            cases[f"decode-{target.family}-S{seq}-w{window}"] = functools.partial(
                triton_case, "decode_attention", target, seq, window, 0.0, DType.BF16, True
            )
    cases["decode-cuda-w20-softcap-f32"] = functools.partial(
        triton_case, "decode_attention", CUDA, 1, 20, 5.0, DType.F32, True
    )
    cases["decode-cuda-w200"] = functools.partial(
        triton_case, "decode_attention", CUDA, 1, 200, 0.0, DType.BF16, True
    )
    for target in (CUDA, ROCM):
        cases[f"prefill-{target.family}-S8-w20"] = functools.partial(
            triton_case, "prefill_attention", target, 8, 20, 0.0, DType.BF16, False
        )
    cases["prefill-cuda-S8-w20-softcap-f32"] = functools.partial(
        triton_case, "prefill_attention", CUDA, 8, 20, 5.0, DType.F32, False
    )
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_triton_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


if __name__ == "__main__":
    child_main(CASES)
