"""DeepSeek-V3.2's sparse attention (indexer_topk, index_attention) in kernels/triton/sparse_attention.py,
against the numpy reference under Triton's interpreter: fresh random inputs, NaN-poisoned outputs, a
shuffled paged table, ragged contexts, and NaN in every cache slot the op must not read (past each
sequence's end, never-used blocks; for index_attention every slot no query selected and sees, so a
selected entry past its query's position or a -1 that is read shows as NaN in the output; a position
selected twice must count once).

The indexer's inputs are small integers (q, cache in -2..2, weights multiples of 1/4, scale 1/8), so
every index score is exact in f32 in any order of summation: distinct scores differ by at least 1/32
and equal ones are equal, so the selection is unambiguous and the tie rule (lower position first) is
checked exactly; a few cache rows are copied to other positions to make ties certain. k is below the
visible count of every query, between, and above the table's width. index_attention runs grouped-query
(8 heads on 2 kv heads, D 32) and DeepSeek's latent layout (one kv head, k_cache the same value as
v_cache, D 48 = 32 + 16 split as a 576 = 512 + 64 one), each under the default config and one that
splits the selected entries into many pieces (the reduce kernel).

The interpreted cases run in child processes unless this process interprets (`python
tests/kernels/triton/test_sparse_attention.py CASE` runs them directly); SPARSE_SEED reproduces a
failure's seed. The AOT cases compile DeepSeek-V3.2's decode shapes (batch 1 and 16, 8k context) for
sm_90, sm_100, gfx942 and gfx950 with no device and check that nothing spills."""

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
from polymorph.pipeline.kernel_files import KernelSpec
from polymorph.verify.tolerance import compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, process_interprets, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA = Target.parse("cuda:sm_90")
BLOCK, CTX_BLOCKS = 16, 6
LENS = (1, 13, 40, 96, 70)  # tokens per sequence once this step's tokens are in
SEQ = 2  # query tokens per sequence (the last two; one for the 1-token sequence, repeated)
TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F32: torch.float32}
FILE = "sparse_attention"
# Many small pieces: several scoring tiles and selection steps a row, many attend splits.
SMALL = {"score_block_t": 16, "score_warps": 4, "select_block": 16, "select_warps": 4, "rows": 16,
         "block_n": 16, "min_split": 16, "ctas_per_cu": 64, "num_warps": 4, "num_stages": 1}  # fmt: skip


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("SPARSE_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


def paging(rng: np.random.Generator, lens: tuple[int, ...], ctx_blocks: int, bs: int) -> tuple[Any, ...]:
    """A shuffled table (entries past a sequence's last block name block 0, never written), the last SEQ
    positions of each sequence, and which (block, slot) each sequence's tokens occupy."""
    batch = len(lens)
    cache_blocks = batch * ctx_blocks + 1
    order = rng.permutation(np.arange(1, cache_blocks)).reshape(batch, ctx_blocks)
    table = np.zeros((batch, ctx_blocks), dtype=np.int32)
    positions = np.zeros((batch, SEQ), dtype=np.int32)
    for b, n in enumerate(lens):
        table[b, : -(-n // bs)] = order[b, : -(-n // bs)]
        positions[b] = np.maximum(np.arange(n - SEQ, n), 0)
    return cache_blocks, table, positions


def to_dtype(x: Any, dtype: DType) -> Any:
    """The values the kernel sees in `dtype`, as f32 (the reference takes these)."""
    if dtype == DType.BF16:
        return torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    return x.astype(np.float32)


def run_kernel(graph: Graph, arrays: dict[str, Any], dtype: DType, config: dict[str, Any], out_dtype: Any,
               poison: float) -> Any:  # fmt: skip
    kf = kernel(FILE, interpret=True)
    spec = spec_of(graph, CUDA)
    assert kf.supports(spec), f"{FILE} does not support {graph.nodes[0].op}"
    types = graph.types()
    args = []
    for v in spec.inputs:
        t = torch.from_numpy(np.ascontiguousarray(arrays[v]))
        args.append(t.to(TORCH_DTYPE[dtype]) if types[v].dtype.is_float and v != "weights" else t)
    shape = types[graph.nodes[0].outputs[0]].shape
    out = torch.full(shape, poison, dtype=out_dtype)
    kf.build(spec, config, CUDA)(args, [out], None)
    return out


def reference_out(graph: Graph, arrays: dict[str, Any]) -> Any:
    types = graph.types()
    ins = {k: v.astype(types[k].dtype.numpy) for k, v in arrays.items() if k in graph.inputs}
    state = {
        k: np.nan_to_num(v, nan=0.0).astype(types[k].dtype.numpy)
        for k, v in arrays.items()
        if k in graph.state
    }
    return reference.run(graph, {}, ins, state)["out"]


# --- indexer_topk -----------------------------------------------------------------------------------------


def topk_graph(batch: int, seq: int, heads: int, dim: int, cache_blocks: int, ctx_blocks: int, bs: int,
               dtype: DType, k: int, scale: float) -> Graph:  # fmt: skip
    g = GraphBuilder("indexer_topk")
    q = g.input("q", dtype, (batch, seq, heads, dim))
    kc = g.state("index_cache", dtype, (cache_blocks, bs, 1, dim))
    w = g.input("weights", DType.F32, (batch, seq, heads))
    table = g.input("block_table", DType.I32, (batch, ctx_blocks))
    pos = g.input("positions", DType.I32, (batch, seq))
    g.output("out", g.op("indexer_topk", "topk", q, kc, w, table, pos, k=k, scale=scale))
    return g.build()


def topk_case(k: int, heads: int, dtype: DType, ties: bool = False) -> None:
    """ties: each sequence's keys copies of 3 rows, so at most 3 distinct scores a query and the k-th
    best shared by many positions (the lowest of them taken)."""
    seed, rng = seeded()
    dim = 32
    cache_blocks, table, positions = paging(rng, LENS, CTX_BLOCKS, BLOCK)
    cache = rng.integers(-2, 3, (cache_blocks, BLOCK, 1, dim)).astype(np.float32)
    written = np.zeros((cache_blocks, BLOCK), dtype=bool)
    for b, n in enumerate(LENS):
        t = np.arange(n)
        written[table[b, t // BLOCK], t % BLOCK] = True
        for dst in range(n) if ties else ():
            src = rng.integers(0, min(3, n))
            cache[table[b, dst // BLOCK], dst % BLOCK] = cache[table[b, src // BLOCK], src % BLOCK]
        for _ in range(n // 4):  # ties: a position's key copied to another of the same sequence
            src, dst = rng.integers(0, n, 2)
            cache[table[b, dst // BLOCK], dst % BLOCK] = cache[table[b, src // BLOCK], src % BLOCK]
    cache = np.where(written[:, :, None, None], cache, np.nan).astype(np.float32)
    arrays = {
        "q": rng.integers(-2, 3, (len(LENS), SEQ, heads, dim)).astype(np.float32),
        "index_cache": cache,
        "weights": (rng.integers(-4, 9, (len(LENS), SEQ, heads)) / 4).astype(np.float32),
        "block_table": table,
        "positions": positions,
    }
    graph = topk_graph(len(LENS), SEQ, heads, dim, cache_blocks, CTX_BLOCKS, BLOCK, dtype, k, 0.125)
    want = reference_out(graph, arrays)
    default = kernel(FILE, interpret=True).configs_for(CUDA)[0]
    for config in (default, SMALL):
        got = run_kernel(graph, arrays, dtype, config, torch.int32, -7).numpy()
        where = f"indexer_topk k {k} heads {heads} ties {ties} {dtype} config {config} (seed {seed})"
        bad = np.argwhere(got != want)
        assert not len(bad), f"{where}: {len(bad)} of {got.size} differ, first at {bad[0].tolist()}: " \
            f"got {got[tuple(bad[0][:2])].tolist()}, want {want[tuple(bad[0][:2])].tolist()}"  # fmt: skip


# --- index_attention --------------------------------------------------------------------------------------


def attention_graph(heads: int, kv_heads: int, dim: int, cache_blocks: int, dtype: DType, ksel: int,
                    same_kv: bool) -> Graph:  # fmt: skip
    g = GraphBuilder("index_attention")
    batch = len(LENS)
    q = g.input("q", dtype, (batch, SEQ, heads, dim))
    kc = g.state("k_cache", dtype, (cache_blocks, BLOCK, kv_heads, dim))
    vc = kc if same_kv else g.state("v_cache", dtype, (cache_blocks, BLOCK, kv_heads, dim))
    table = g.input("block_table", DType.I32, (batch, CTX_BLOCKS))
    pos = g.input("positions", DType.I32, (batch, SEQ))
    sel = g.input("selected", DType.I32, (batch, SEQ, ksel))
    g.output("out", g.op("index_attention", "attn", q, kc, vc, table, pos, sel, scale=dim**-0.5))
    return g.build()


def attention_case(heads: int, kv_heads: int, dim: int, ksel: int, same_kv: bool, dtype: DType) -> None:
    """Each query selects positions in a random order: up to ksel - 2 of the ones it sees, a future one
    (past its position: masked) where there is one, in half the rows a repeat of one (seen once), -1
    in the rest."""
    seed, rng = seeded()
    batch = len(LENS)
    cache_blocks, table, positions = paging(rng, LENS, CTX_BLOCKS, BLOCK)
    chosen = np.full((batch, SEQ, ksel), -1, dtype=np.int32)
    seen = np.zeros((cache_blocks, BLOCK), dtype=bool)
    for b, n in enumerate(LENS):
        for s in range(SEQ):
            p = positions[b, s]
            picks = rng.permutation(p + 1)[: max(1, min(ksel - 2, p + 1) - int(rng.integers(0, 3)))]
            seen[table[b, picks // BLOCK], picks % BLOCK] = True
            if p + 1 < n:
                picks = np.append(picks, p + 1)  # not visible to this query
            if rng.random() < 0.5:
                picks = np.append(picks, picks[0])  # a repeat: seen once
            row = np.full(ksel, -1, dtype=np.int32)
            row[: len(picks)] = picks
            chosen[b, s] = rng.permutation(row)
    arrays: dict[str, Any] = {
        "q": to_dtype(rng.standard_normal((batch, SEQ, heads, dim)).astype(np.float32), dtype),
        "block_table": table,
        "positions": positions,
        "selected": chosen,
    }
    for name in ("k_cache",) if same_kv else ("k_cache", "v_cache"):
        x = to_dtype(
            2.0 * rng.standard_normal((cache_blocks, BLOCK, kv_heads, dim)).astype(np.float32), dtype
        )
        arrays[name] = np.where(seen[:, :, None, None], x, np.nan).astype(np.float32)
    graph = attention_graph(heads, kv_heads, dim, cache_blocks, dtype, ksel, same_kv)
    want = reference_out(graph, arrays).astype(np.float32)
    default = kernel(FILE, interpret=True).configs_for(CUDA)[0]
    for config in (default, SMALL):
        got = run_kernel(graph, arrays, dtype, config, TORCH_DTYPE[dtype], float("nan")).float().numpy()
        where = (
            f"index_attention H {heads} Hkv {kv_heads} D {dim} k {ksel} same_kv {same_kv} {dtype} config "
            f"{config} (seed {seed})"
        )
        assert np.isfinite(got).all(), f"{where}: NaN in the output (an unselected slot read?)"
        result = compare(got, want, op_tolerance(dtype))
        assert result.ok, f"{where}: {result}"


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for dtype in (DType.BF16, DType.F32):
        for k in (5, 50, 128):  # below every visible count but one; between; past the table (96)
            cases[f"topk-k{k}-{dtype}"] = functools.partial(topk_case, k, 4, dtype)
        cases[f"topk-k20-h3-{dtype}"] = functools.partial(topk_case, 20, 3, dtype)
        cases[f"topk-k30-ties-{dtype}"] = functools.partial(topk_case, 30, 4, dtype, True)
        for ksel in (24, 128):
            cases[f"attn-gqa-k{ksel}-{dtype}"] = functools.partial(
                attention_case, 8, 2, 32, ksel, False, dtype
            )
            cases[f"attn-latent-k{ksel}-{dtype}"] = functools.partial(
                attention_case, 4, 1, 48, ksel, True, dtype
            )
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_sparse_attention_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_supports() -> None:
    """The refusals: k (or a row of selected) past MAX_K, an indexer head dim not a power of two, an
    attention head dim neither a power of two nor R + P, mixed dtypes, a cpu target."""
    kf = kernel(FILE, interpret=False)
    ok = topk_graph(1, 1, 64, 128, 9, 8, 64, DType.BF16, 2048, 0.1)
    assert kf.supports(spec_of(ok, CUDA))
    assert not kf.supports(spec_of(topk_graph(1, 1, 64, 128, 9, 8, 64, DType.BF16, 8192, 0.1), CUDA))
    assert not kf.supports(spec_of(topk_graph(1, 1, 64, 96, 9, 8, 64, DType.BF16, 16, 0.1), CUDA))
    assert not kf.supports(spec_of(ok, Target.parse("cpu")))
    assert kf.supports(spec_of(attention_graph(16, 1, 576, 9, DType.BF16, 64, True), CUDA))
    assert kf.supports(spec_of(attention_graph(16, 2, 64, 9, DType.F32, 64, False), CUDA))
    assert not kf.supports(spec_of(attention_graph(16, 1, 576, 9, DType.BF16, 8192, True), CUDA))  # > MAX_K
    for dim in (80, 24, 1088):  # 64 + 16 is fine; 80 = 64 + 16 is: check the ones that are not
        if dim == 80:
            assert kf.supports(spec_of(attention_graph(4, 1, dim, 9, DType.BF16, 16, True), CUDA))
        else:
            assert not kf.supports(spec_of(attention_graph(4, 1, dim, 9, DType.BF16, 16, True), CUDA)), dim
    g = GraphBuilder("index_attention")
    q = g.input("q", DType.BF16, (1, 1, 4, 64))
    kc = g.state("k_cache", DType.F32, (9, 16, 1, 64))
    table = g.input("block_table", DType.I32, (1, 8))
    pos = g.input("positions", DType.I32, (1, 1))
    sel = g.input("selected", DType.I32, (1, 1, 16))
    g.output("out", g.op("index_attention", "attn", q, kc, kc, table, pos, sel, scale=0.1))
    assert not kf.supports(spec_of(g.build(), CUDA))


# --- ahead-of-time compile, no device -------------------------------------------------------------------

AOT_TARGETS = ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950")


def aot_specs(target: Target) -> list[KernelSpec]:
    """DeepSeek-V3.2 decode (bf16, block 64, an 8k-token table): the indexer (64 heads, D 128, k 2048)
    and sparse attention over the latent cache (128 heads on one, D 576, k_cache = v_cache), batch 1
    and 16; GLM-5's indexer (32 heads) at batch 1."""
    specs = []
    for batch in (1, 16):
        blocks = batch * 128 + 1
        for heads in (64, 32) if batch == 1 else (64,):
            specs.append(
                spec_of(topk_graph(batch, 1, heads, 128, blocks, 128, 64, DType.BF16, 2048, 0.088), target)
            )
        g = GraphBuilder("index_attention")
        q = g.input("q", DType.BF16, (batch, 1, 128, 576))
        kc = g.state("kv_cache", DType.BF16, (blocks, 64, 1, 576))
        table = g.input("block_table", DType.I32, (batch, 128))
        pos = g.input("positions", DType.I32, (batch, 1))
        sel = g.input("selected", DType.I32, (batch, 1, 2048))
        g.output("out", g.op("index_attention", "attn", q, kc, kc, table, pos, sel, scale=576**-0.5))
        specs.append(spec_of(g.build(), target))
    return specs


@pytest.mark.compile
@pytest.mark.parametrize("target_name", AOT_TARGETS)
def test_sparse_attention_compiles_without_spills(target_name: str) -> None:
    from polymorph.backends.gpu.aot import compile_unit
    from polymorph.hardware.traits import traits_for

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    traits = traits_for(target)
    kf = kernel(FILE, interpret=False)
    for spec in aot_specs(target):
        assert kf.supports(spec), spec
        for unit in kf.compile_units(spec, kf.configs_for(traits)[0], traits):
            c = compile_unit(unit, target)
            where = f"{unit.name} {sorted(unit.constexprs.items())} on {target_name}"
            assert c.resources.get("spill_bytes") == 0, (
                f"{where}: spills {c.resources.get('spill_bytes')} bytes"
            )


if __name__ == "__main__":
    child_main(CASES)
