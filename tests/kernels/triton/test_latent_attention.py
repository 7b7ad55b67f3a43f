"""kernels/triton/latent_attention.py: cache_attention over DeepSeek-V3's paged latent cache (one KV head
of width R + P, k_cache and v_cache the same value, as `mla` in polymorph/models/decoder.py builds it).

Under Triton's interpreter, against the numpy reference (a one-node graph whose k and v are the same
state value): fresh random inputs, NaN-poisoned outputs, a shuffled paged table, ragged contexts in one
batch (1 to 96 tokens), and NaN in every cache slot past a sequence's end and in the never-used blocks,
so a read past the end shows as NaN in the output. f32 and bf16, S = 1 and S = 3 (a tile of rows then
holds two tokens' heads), R 32 + P 16 over 8 heads, each under the cuda and rocm default configs and
one that splits the context into many 16-token pieces (the reduce merges up to 6 partials) and one
that takes it in one split of 32-row tiles (the split kernel writes the output); the small
R 16 + P 8 of the tiny test models (the roped part narrower than a tl.dot: broadcast sums), distinct
k and v caches of one type, and a symbolic seq (a 5-token prefill chunk, S read at launch). The
interpreted cases run in child processes unless this process interprets (`python
tests/kernels/triton/test_latent_attention.py CASE` runs them directly); LATENT_SEED reproduces a
failure's seed.

Without a device: which specs the file takes (and that the plain attention files refuse D = 576), and
ahead-of-time compiles of every config for sm_90, sm_100, gfx942 and gfx950 at DeepSeek-V3's decode
shape (H 128, R 512, P 64, bf16, 4k context, batch 1 and 32) without register spills."""

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
ROCM = Target.parse("rocm:gfx942")
AOT_TARGETS = ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950")
BLOCK, CTX_BLOCKS, HEADS = 16, 6, 8
LENS = (1, 13, 40, 96, 70)  # tokens per sequence once this step's tokens are in
MANY = {"block_h": 16, "block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 64, "num_warps": 4,
        "num_stages": 2}  # fmt: skip
# One split over the whole 96-token table (the split kernel writes the output), 32 rows a program.
ONE = {"block_h": 32, "block_n": 32, "min_split_tokens": 256, "ctas_per_cu": 2, "num_warps": 4,
       "num_stages": 2}  # fmt: skip
TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F32: torch.float32}


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("LATENT_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def latent_graph(batch: int | str, seq: int | str, heads: int, r: int, p: int, block: int,
                 ctx_blocks: int | str, cache_blocks: int | str, dtype: DType, same_kv: bool = True,
                 **attrs: Any) -> Graph:  # fmt: skip
    """cache_attention as `mla` calls it: one KV head of width r + p, k_cache and v_cache one value
    (same_kv), else two state values of one type."""
    g = GraphBuilder("cache_attention")
    q = g.input("q", dtype, (batch, seq, heads, r + p))
    kc = g.state("k_cache", dtype, (cache_blocks, block, 1, r + p))
    vc = kc if same_kv else g.state("v_cache", dtype, (cache_blocks, block, 1, r + p))
    table = g.input("block_table", DType.I32, (batch, ctx_blocks))
    pos = g.input("positions", DType.I32, (batch, seq))
    out = g.op("cache_attention", "attn", q, kc, vc, table, pos, scale=float(r + p) ** -0.5, **attrs)
    g.output("out", out)
    return g.build()


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


def latent_arrays(rng: np.random.Generator, seq: int, r: int, p: int, dtype: DType,
                  caches: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    """Sequence b holds LENS[b] tokens, its queries the last `seq` of them (fewer if it is shorter: the
    others repeat its first). Every slot past a sequence's end holds NaN, as do the never-used blocks,
    one of which (block 0) every table entry past a sequence's last block names."""
    batch = len(LENS)
    cache_blocks = batch * CTX_BLOCKS + 2
    order = rng.permutation(np.arange(1, cache_blocks))[: batch * CTX_BLOCKS].reshape(batch, CTX_BLOCKS)
    table = np.zeros((batch, CTX_BLOCKS), dtype=np.int32)
    seen = np.zeros((cache_blocks, BLOCK), dtype=bool)
    positions = np.zeros((batch, seq), dtype=np.int32)
    for b, n in enumerate(LENS):
        table[b, : -(-n // BLOCK)] = order[b, : -(-n // BLOCK)]
        positions[b] = np.maximum(np.arange(n - seq, n), 0)
        t = np.arange(n)
        seen[table[b, t // BLOCK], t % BLOCK] = True
    arrays: dict[str, Any] = {
        "q": rng.standard_normal((batch, seq, HEADS, r + p)).astype(np.float32),
        "block_table": table,
        "positions": positions,
    }
    for name in caches:
        x = 2.0 * rng.standard_normal((cache_blocks, BLOCK, 1, r + p)).astype(np.float32)
        arrays[name] = np.where(seen[:, :, None, None], x, np.nan).astype(np.float32)
    if dtype == DType.BF16:  # the reference takes the values the kernel sees
        for name in ("q", *caches):
            arrays[name] = torch.from_numpy(arrays[name]).to(torch.bfloat16).float().numpy()
    return arrays


def run_case(graph: Graph, arrays: dict[str, Any], dtype: DType, target: Target, configs: list[dict[str, Any]],
             where: str, spec_graph: Graph | None = None) -> None:  # fmt: skip
    """Every config against the reference of `graph` on NaN-poisoned outputs; the kernel is built for
    `spec_graph` (the same op with symbolic dims) where given."""
    kf = kernel("latent_attention", interpret=True)
    spec = spec_of(spec_graph or graph, target)
    assert kf.supports(spec), f"{where}: latent_attention does not support it"
    types = graph.types()
    ref_in = {k: v.astype(types[k].dtype.numpy) for k, v in arrays.items() if k in graph.inputs}
    ref_state = {
        k: np.nan_to_num(v, nan=0.0).astype(types[k].dtype.numpy)
        for k, v in arrays.items()
        if k in graph.state
    }
    want = reference.run(graph, {}, ref_in, ref_state)["out"].astype(np.float32)
    args = []
    for v in spec.inputs:
        t = torch.from_numpy(np.ascontiguousarray(arrays[v]))
        args.append(t.to(TORCH_DTYPE[dtype]) if types[v].dtype.is_float else t)
    for config in configs:
        out = torch.full(want.shape, float("nan"), dtype=TORCH_DTYPE[dtype])
        kf.build(spec, config, target)(args, [out], None)
        got = out.float().numpy()
        assert np.isfinite(got).all(), (
            f"{where} config {config}: NaN in the output (a slot past the end read?)"
        )
        result = compare(got, want, op_tolerance(dtype))
        assert result.ok, f"{where} config {config}: {result}"


def latent_case(seq: int, r: int, p: int, dtype: DType, target: Target) -> None:
    seed, rng = seeded()
    arrays = latent_arrays(rng, seq, r, p, dtype, ("k_cache",))
    graph = latent_graph(len(LENS), seq, HEADS, r, p, BLOCK, CTX_BLOCKS, len(LENS) * CTX_BLOCKS + 2, dtype)
    default = kernel("latent_attention", interpret=True).configs_for(target)[0]
    where = f"latent S={seq} R={r} P={p} {dtype} {target} (seed {seed})"
    run_case(graph, arrays, dtype, target, [default, MANY, ONE], where)


def distinct_kv_case() -> None:
    """k_cache and v_cache two values of one type: the values come from v_cache."""
    seed, rng = seeded()
    arrays = latent_arrays(rng, 2, 32, 16, DType.F32, ("k_cache", "v_cache"))
    graph = latent_graph(len(LENS), 2, HEADS, 32, 16, BLOCK, CTX_BLOCKS, len(LENS) * CTX_BLOCKS + 2, DType.F32,
                         same_kv=False)  # fmt: skip
    default = kernel("latent_attention", interpret=True).configs_for(CUDA)[0]
    run_case(graph, arrays, DType.F32, CUDA, [default, MANY, ONE], f"latent distinct k, v (seed {seed})")


def symbolic_seq_case() -> None:
    """A 5-token prefill chunk of each sequence, built for a spec with symbolic batch, seq, ctx_blocks
    and cache_blocks (the launch reads them from the tensors)."""
    seed, rng = seeded()
    seq = 5
    arrays = latent_arrays(rng, seq, 32, 16, DType.BF16, ("k_cache",))
    graph = latent_graph(
        len(LENS), seq, HEADS, 32, 16, BLOCK, CTX_BLOCKS, len(LENS) * CTX_BLOCKS + 2, DType.BF16
    )
    symbolic = latent_graph("batch", "seq", HEADS, 32, 16, BLOCK, "ctx_blocks", "cache_blocks", DType.BF16)
    default = kernel("latent_attention", interpret=True).configs_for(CUDA)[0]
    run_case(
        graph, arrays, DType.BF16, CUDA, [default, MANY, ONE], f"latent symbolic seq (seed {seed})", symbolic
    )


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for dtype in (DType.BF16, DType.F32):
        for seq in (1, 3):
            for target in (CUDA, ROCM):
                cases[f"latent-S{seq}-{dtype}-{target.family}"] = functools.partial(
                    latent_case, seq, 32, 16, dtype, target
                )
    for seq in (1, 3):
        cases[f"latent-small-S{seq}"] = functools.partial(latent_case, seq, 16, 8, DType.BF16, CUDA)
    cases["latent-distinct-kv"] = distinct_kv_case
    cases["latent-symbolic-seq"] = symbolic_seq_case
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_latent_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


# --- which file takes which spec ------------------------------------------------------------------------


def test_supports_only_what_it_implements() -> None:
    """The latent file takes one-KV-head caches of width R + P (both powers of two) on GPUs, any S, k and
    v the same value or of one type; it refuses a window, a chunk, a softcap, sinks, more KV heads, a
    power-of-two width (a plain head), other widths, other dtypes and the cpu; the plain attention files
    refuse D = 576, so the backend has exactly one choice for DeepSeek-V3."""
    latent = kernel("latent_attention", interpret=False)
    decode = kernel("decode_attention", interpret=False)
    prefill = kernel("prefill_attention", interpret=False)
    targets = [Target.parse(t) for t in AOT_TARGETS]

    def graph(**kw: Any) -> Graph:
        args = {"batch": 1, "seq": 1, "heads": 128, "r": 512, "p": 64, "block": 16, "ctx_blocks": 4,
                "cache_blocks": 5, "dtype": DType.BF16} | kw  # fmt: skip
        return latent_graph(**args)

    for seq in (1, 3, 512, "seq"):
        for target in targets:
            spec = spec_of(graph(seq=seq, batch="batch"), target)
            assert latent.supports(spec), (seq, target)
            assert not decode.supports(spec) and not prefill.supports(spec), (seq, target)
    for kw in ({"heads": 64}, {"r": 16, "p": 8}, {"r": 32, "p": 16}, {"p": 128}, {"dtype": DType.F32},
               {"dtype": DType.F16}, {"same_kv": False}):  # fmt: skip
        assert latent.supports(spec_of(graph(**kw), CUDA)), kw
    for kw in ({"window": 128}, {"chunk": 64}, {"softcap": 30.0}, {"r": 512, "p": 512}, {"r": 64, "p": 0},
               {"r": 1024, "p": 64}, {"r": 512, "p": 256}, {"r": 32, "p": 24}, {"r": 16, "p": 4},
               {"dtype": DType.F8E4M3}):  # fmt: skip
        assert not latent.supports(spec_of(graph(**kw), CUDA)), kw
    assert not latent.supports(spec_of(graph(), Target("cpu")))
    # more than one KV head (a GQA cache of width 576) and sinks
    g = GraphBuilder("cache_attention")
    q = g.input("q", DType.BF16, (1, 1, 8, 576))
    kc = g.state("k_cache", DType.BF16, (5, 16, 2, 576))
    table, pos = g.input("block_table", DType.I32, (1, 4)), g.input("positions", DType.I32, (1, 1))
    g.output("out", g.op("cache_attention", "attn", q, kc, kc, table, pos, scale=0.1))
    assert not latent.supports(spec_of(g.build(), CUDA))
    g = GraphBuilder("cache_attention")
    q = g.input("q", DType.BF16, (1, 1, 8, 576))
    kc = g.state("k_cache", DType.BF16, (5, 16, 1, 576))
    table, pos = g.input("block_table", DType.I32, (1, 4)), g.input("positions", DType.I32, (1, 1))
    sinks = g.param("sinks", DType.BF16, (8,))
    g.output("out", g.op("cache_attention", "attn", q, kc, kc, table, pos, sinks, scale=0.1))
    assert not latent.supports(spec_of(g.build(), CUDA))


def test_decode_fills_h200() -> None:
    """DeepSeek-V3's decode at batch 1, 4k context: 8 head tiles of 16, split so that every one of the
    H200's 132 SMs has a program."""
    from polymorph.hardware.traits import traits_for

    module = kernel("latent_attention", interpret=False).module
    traits = traits_for(CUDA)
    occ = module.occupancy(1, 128, 4096, module.configs(traits)[0], traits)
    assert occ["compute_units"] == 132 and occ["ctas"] >= 132, occ
    assert occ["splits"] * occ["split_tokens"] >= 4096, occ


# --- ahead-of-time compile, no device -------------------------------------------------------------------


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("target_name", AOT_TARGETS)
def test_compile_deepseek_v3_decode_without_spills(target_name: str) -> None:
    """Every config at DeepSeek-V3's decode shape (H 128, R 512, P 64, block 16, bf16, 4k-token table)
    at batch 1 and 32: device code, no spills, shared memory / LDS within one block's."""
    from polymorph.backends.gpu.aot import compile_unit
    from polymorph.hardware.traits import traits_for

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    traits = traits_for(target)
    kf = kernel("latent_attention", interpret=False)
    done: set[str] = set()
    for config in kf.configs_for(traits):
        for batch in (1, 32):
            graph = latent_graph(batch, 1, 128, 512, 64, 16, 4096 // 16, batch * 4096 // 16 + 1, DType.BF16)
            spec = spec_of(graph, target)
            assert kf.supports(spec)
            units = kf.compile_units(spec, config, traits)
            assert units and all(u.name.startswith("latent_attention.") for u in units)
            for unit in units:
                key = f"{unit.name} {sorted(unit.constexprs.items())} {sorted(unit.options.items())}"
                if key in done:
                    continue
                done.add(key)
                c = compile_unit(unit, target)
                res = c.resources
                where = f"{unit.name} batch {batch} config {config} on {target_name}"
                binary = "cubin" if target.family == "cuda" else "hsaco"
                assert c.asm.get(binary), f"{where}: no {binary}"
                assert res.get("spill_bytes") == 0, f"{where}: spills {res.get('spill_bytes')} bytes ({res})"
                shared = res.get("shared_bytes") if target.family == "cuda" else res.get("lds_bytes")
                assert shared is not None and shared <= traits.shared_per_block, f"{where}: {res}"
    assert any(name.startswith("latent_attention.reduce") for name in done)


if __name__ == "__main__":
    child_main(CASES)
