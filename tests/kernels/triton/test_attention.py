"""kernels/triton/decode_attention.py and kernels/triton/prefill_attention.py against the reference.

Numerics run under Triton's interpreter on CPU tensors, every config of each file for cuda and rocm,
bf16 and f32, GQA 1 and 4, head_dim 64, on fresh random inputs with NaN-poisoned outputs; a failure
names its seed, and ATTENTION_SEED reproduces it. The paged cases use a shuffled block table that never
names guard block 0, ragged contexts in one batch, and 1e4 in every cache slot no query may see
(unwritten slots of a sequence's last block, unreferenced blocks, block 0), so a read past the end
shows. The interpreter needs TRITON_INTERPRET=1 before triton is first imported (triton.language's own
@jit functions, tl.max and tl.sum, are decorated then), and AOT compilation needs it unset, so unless
this whole process is interpreting, the interpreted cases run in child processes (`python
tests/kernels/triton/test_attention.py CASE...` runs cases directly). The compile test builds the
compile units at Llama-3.2-1B shapes for cuda sm_90 and hip gfx942 without a device; the device test
runs the compiled kernels.
"""

from __future__ import annotations

import functools
import os
import re
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
from polymorph.pipeline.kernel_files import KernelFile, KernelSpec
from polymorph.verify.tolerance import compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, process_interprets, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA = Target.parse("cuda:sm_90")
ROCM = Target.parse("rocm:gfx942")
DTYPES = [DType.BF16, DType.F32]
TORCH_DTYPE = {DType.BF16: "bfloat16", DType.F32: "float32", DType.F16: "float16"}
POISON = 1e4  # in the cache slots that no query may see
HEADS, HEAD_DIM = 4, 64  # query heads and head_dim of the interpreted cases
# A config that splits even the interpreter's short contexts many ways (16-token splits).
MANY_SPLITS = {"block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 4, "num_warps": 4, "num_stages": 2}
# The files by path: a checkout need not be installed (the GPU image runs from the source tree).
SMALL_TILES = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 2}


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("ATTENTION_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def to_torch(a: np.ndarray, dtype: DType, device: str) -> Any:
    t = torch.from_numpy(
        np.ascontiguousarray(a).astype(np.float32) if dtype.is_float else np.ascontiguousarray(a)
    )
    return t.to(device=device, dtype=getattr(torch, TORCH_DTYPE[dtype]) if dtype.is_float else t.dtype)


# --- graphs, specs and inputs --------------------------------------------------------------------------


def cache_graph(batch: int | str, seq: int | str, heads: int, kv_heads: int, head_dim: int, block: int,
                ctx_blocks: int | str, cache_blocks: int | str, dtype: DType) -> Graph:  # fmt: skip
    g = GraphBuilder("cache_attention")
    q = g.input("q", dtype, (batch, seq, heads, head_dim))
    kc = g.state("k_cache", dtype, (cache_blocks, block, kv_heads, head_dim))
    vc = g.state("v_cache", dtype, (cache_blocks, block, kv_heads, head_dim))
    table = g.input("block_table", DType.I32, (batch, ctx_blocks))
    pos = g.input("positions", DType.I32, (batch, seq))
    g.output("out", g.op("cache_attention", "attn", q, kc, vc, table, pos, scale=head_dim**-0.5))
    return g.build()


def plain_graph(batch: int, seq: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, causal: bool,
                dtype: DType) -> Graph:  # fmt: skip
    g = GraphBuilder("attention")
    q = g.input("q", dtype, (batch, seq, heads, head_dim))
    k = g.input("k", dtype, (batch, kv_len, kv_heads, head_dim))
    v = g.input("v", dtype, (batch, kv_len, kv_heads, head_dim))
    g.output("out", g.op("attention", "attn", q, k, v, scale=head_dim**-0.5, causal=causal))
    return g.build()


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


def paged_arrays(rng: np.random.Generator, lens: tuple[int, ...], seq: int, heads: int, kv_heads: int,
                 head_dim: int, block: int, ctx_blocks: int, dtype: DType) -> tuple[Graph, dict[str, np.ndarray]]:  # fmt: skip
    """Sequence b holds lens[b] tokens of the cache; its last `seq` tokens are this step's queries."""
    batch = len(lens)
    cache_blocks = batch * ctx_blocks + 3  # block 0 and two others are never referenced
    graph = cache_graph(batch, seq, heads, kv_heads, head_dim, block, ctx_blocks, cache_blocks, dtype)
    table = (rng.permutation(cache_blocks - 1)[: batch * ctx_blocks] + 1).reshape(batch, ctx_blocks)
    written = np.zeros((cache_blocks, block), dtype=bool)
    for b, n in enumerate(lens):
        t = np.arange(n)
        written[table[b, t // block], t % block] = True
    arrays = {
        "q": rng.standard_normal((batch, seq, heads, head_dim)).astype(np.float32).astype(dtype.numpy),
        "block_table": table.astype(np.int32),
        "positions": np.array([[n - seq + j for j in range(seq)] for n in lens], dtype=np.int32),
    }
    for name in ("k_cache", "v_cache"):
        x = rng.standard_normal((cache_blocks, block, kv_heads, head_dim)).astype(np.float32)
        arrays[name] = np.where(written[:, :, None, None], x, POISON).astype(dtype.numpy)
    return graph, arrays


def plain_arrays(rng: np.random.Generator, graph: Graph) -> dict[str, np.ndarray]:
    return {
        name: rng.standard_normal(t.shape).astype(np.float32).astype(t.dtype.numpy)
        for name, t in graph.inputs.items()
    }


# --- checks ---------------------------------------------------------------------------------------------


def check(kf: KernelFile, graph: Graph, arrays: dict[str, np.ndarray], target: Target,
          configs: list[dict[str, Any]], where: str, device: str) -> None:  # fmt: skip
    """Every config of `configs` against the reference, on NaN-poisoned outputs."""
    spec = spec_of(graph, target)
    assert kf.supports(spec), f"{kf.name} should take {where}"
    types = graph.types()
    inputs = {k: v for k, v in arrays.items() if k in graph.inputs}
    state = {k: v.copy() for k, v in arrays.items() if k in graph.state}
    want = reference.run(graph, {}, inputs, state)["out"]
    args = [to_torch(arrays[v], types[v].dtype, device) for v in spec.inputs]
    dtype = types["q"].dtype
    for config in configs:
        out = torch.full(want.shape, float("nan"), dtype=getattr(torch, TORCH_DTYPE[dtype]), device=device)
        kf.build(spec, config, target)(args, [out], None)
        result = compare(out.float().cpu().numpy(), want.astype(np.float32), op_tolerance(dtype))
        assert result.ok, f"{where}, config {config}: {result}"


# --- interpreter: numerics ------------------------------------------------------------------------------


def decode_case(target: Target, dtype: DType, rep: int) -> None:
    """S = 1, ragged 1/17/75-token contexts in an 80-token table: each config takes one split or
    several (test_decode_configs_take_both_paths), and MANY_SPLITS takes five."""
    kf = kernel("decode_attention", interpret=True)
    seed, rng = seeded()
    graph, arrays = paged_arrays(rng, (1, 17, 75), 1, HEADS, HEADS // rep, HEAD_DIM, 16, 5, dtype)
    configs = [*kf.configs_for(target), MANY_SPLITS]
    check(kf, graph, arrays, target, configs, f"decode {dtype} gqa{rep} {target} (seed {seed})", "cpu")


def decode_rows_case(seq: int) -> None:
    """S = 2..4 query tokens per sequence, each with its own position (speculative decode)."""
    kf = kernel("decode_attention", interpret=True)
    seed, rng = seeded()
    graph, arrays = paged_arrays(rng, (seq, 17, 40), seq, HEADS, 2, HEAD_DIM, 16, 3, DType.BF16)
    configs = [kf.configs_for(CUDA)[0], MANY_SPLITS]
    check(kf, graph, arrays, CUDA, configs, f"decode S={seq} (seed {seed})", "cpu")


def prefill_case(target: Target, dtype: DType, rep: int) -> None:
    """S = 8: a whole 8-token prompt and chunks ending 17- and 140-token contexts (144-token table)."""
    kf = kernel("prefill_attention", interpret=True)
    seed, rng = seeded()
    graph, arrays = paged_arrays(rng, (8, 17, 140), 8, HEADS, HEADS // rep, HEAD_DIM, 16, 9, dtype)
    check(
        kf,
        graph,
        arrays,
        target,
        list(kf.configs_for(target)),
        f"prefill {dtype} gqa{rep} {target} (seed {seed})",
        "cpu",
    )


def prefill_tiles_case() -> None:
    """S = 40 over three 16-row query tiles, keys in 16-token tiles: unmasked and masked key tiles."""
    kf = kernel("prefill_attention", interpret=True)
    seed, rng = seeded()
    graph, arrays = paged_arrays(rng, (40, 71), 40, HEADS, 2, HEAD_DIM, 16, 5, DType.BF16)
    check(kf, graph, arrays, CUDA, [SMALL_TILES], f"prefill S=40 (seed {seed})", "cpu")


def attention_case(causal: bool, dtype: DType, rep: int) -> None:
    kf = kernel("prefill_attention", interpret=True)
    seed, rng = seeded()
    seq, kv_len = (20, 20) if causal else (7, 33)
    graph = plain_graph(2, seq, kv_len, HEADS, HEADS // rep, HEAD_DIM, causal, dtype)
    configs = [kf.configs_for(CUDA)[0], SMALL_TILES]
    check(
        kf,
        graph,
        plain_arrays(rng, graph),
        CUDA,
        configs,
        f"attention causal={causal} {dtype} gqa{rep} (seed {seed})",
        "cpu",
    )


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for target in (CUDA, ROCM):
        for dtype in DTYPES:
            for rep in (1, 4):
                cases[f"decode-{target.family}-{dtype}-gqa{rep}"] = functools.partial(
                    decode_case, target, dtype, rep
                )
                cases[f"prefill-{target.family}-{dtype}-gqa{rep}"] = functools.partial(
                    prefill_case, target, dtype, rep
                )
    for seq in (2, 4):
        cases[f"decode-rows-S{seq}"] = functools.partial(decode_rows_case, seq)
    cases["prefill-tiles"] = prefill_tiles_case
    for causal in (True, False):
        for dtype in DTYPES:
            for rep in (1, 4):
                name = f"attention-{'causal' if causal else 'full'}-{dtype}-gqa{rep}"
                cases[name] = functools.partial(attention_case, causal, dtype, rep)
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


def test_decode_configs_take_both_paths() -> None:
    """At the interpreted decode shape (3 sequences, 80-token table) some configs take one split and
    some several, for each target and GQA ratio."""
    from polymorph.hardware.traits import traits_for

    module = kernel("decode_attention", interpret=False).module
    for target in (CUDA, ROCM):
        traits = traits_for(target)
        for kv_heads in (HEADS, HEADS // 4):
            splits = {module._split_plan(3, kv_heads, 80, c, traits.units)[0] for c in module.configs(traits)}
            assert 1 in splits and max(splits) > 1, f"{target} kv_heads={kv_heads}: splits {splits}"


def test_decode_fills_h200() -> None:
    """Batch 1, 8 kv heads: 1k-8k contexts put at least 128 programs on H200's 132 SMs."""
    from polymorph.hardware.traits import traits_for

    module = kernel("decode_attention", interpret=False).module
    traits = traits_for(CUDA)
    config = module.configs(traits)[0]
    for ctx in (1024, 2048, 4096, 8192):
        occ = module.occupancy(1, 8, ctx, config, traits)
        assert occ["compute_units"] == 132 and occ["ctas"] >= 128, (ctx, occ)
    # The default's ctas_per_cu 8 (the 2026-12-02 H200 run, BENCHMARKS.md): 128 splits of 64 at 8k.
    assert module.occupancy(1, 8, 8192, config, traits)["ctas"] == 1024


# --- which file takes which spec ------------------------------------------------------------------------


def test_supports_split_by_seq() -> None:
    """decode takes S <= 4, prefill S > 4 or a symbolic seq; never both, never neither."""
    decode, prefill = (
        kernel("decode_attention", interpret=False),
        kernel("prefill_attention", interpret=False),
    )
    for seq in (1, 2, 3, 4, 5, 8, 512, "seq"):
        for target in (CUDA, ROCM, Target.parse("cuda:sm_100"), Target.parse("rocm:gfx950")):
            graph = cache_graph("batch", seq, 32, 8, 64, 16, "ctx_blocks", "cache_blocks", DType.BF16)
            takes = (decode.supports(spec_of(graph, target)), prefill.supports(spec_of(graph, target)))
            assert takes == ((True, False) if isinstance(seq, int) and seq <= 4 else (False, True)), (
                seq,
                target,
            )
    for seq in (1, 16):
        cpu = spec_of(cache_graph(1, seq, 32, 8, 64, 16, 4, 5, DType.BF16), Target("cpu"))
        assert not decode.supports(cpu) and not prefill.supports(cpu)
        for head_dim, dtype in ((96, DType.BF16), (512, DType.BF16), (64, DType.F8E4M3)):
            spec = spec_of(cache_graph(1, seq, 32, 8, head_dim, 16, 4, 5, dtype), CUDA)
            assert not decode.supports(spec) and not prefill.supports(spec), (head_dim, dtype, seq)
    assert prefill.supports(spec_of(plain_graph(1, 1, 9, 32, 8, 128, False, DType.F16), ROCM))


# --- ahead-of-time compile, no device -------------------------------------------------------------------

GPU_TARGETS = {"cuda:sm_90": ("cuda", 90, 32), "rocm:gfx942": ("hip", "gfx942", 64)}


def aligned(unit: Any) -> dict[tuple[int, ...], list[list[Any]]]:
    """16-byte alignment of every pointer argument: what Triton's JIT specializes torch tensors to at
    launch (every other argument of these kernels is a constexpr), so the compiled code is what runs."""
    return {
        (i,): [["tt.divisibility", 16]] for i, ty in enumerate(unit.signature.values()) if ty.startswith("*")
    }


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("target_name", list(GPU_TARGETS))
def test_compile_llama_1b(target_name: str) -> None:
    """Llama-3.2-1B attention (H 32, Hkv 8, Dh 64, block 16, bf16) at batch 1 and 32, context 1k and
    8k: decode (S = 1) and a 512-token prefill chunk, each file's default config, to PTX/cubin or
    AMDGCN/HSACO; shared memory within the chip, no VGPR spills on gfx942, wgmma for prefill on sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    gpu = GPUTarget(*GPU_TARGETS[target_name])
    done: set[str] = set()
    for name, seq in (("decode_attention", 1), ("prefill_attention", 512)):
        kf = kernel(name, interpret=False)
        config = kf.configs_for(target)[0]
        for batch in (1, 32):
            for ctx in (1024, 8192):
                graph = cache_graph(batch, seq, 32, 8, 64, 16, ctx // 16, batch * ctx // 16 + 1, DType.BF16)
                spec = spec_of(graph, target)
                assert kf.supports(spec)
                units = kf.compile_units(spec, config, target)
                assert units and all(u.name.startswith(name) for u in units)
                for unit in units:
                    key = f"{unit.name} {sorted(unit.constexprs.items())} {sorted(unit.options.items())}"
                    if key in done:  # prefill's units do not depend on the batch
                        continue
                    done.add(key)
                    source = ASTSource(
                        unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs), attrs=aligned(unit)
                    )
                    compiled = triton.compile(source, target=gpu, options=dict(unit.options))
                    where = f"{unit.name} batch {batch} ctx {ctx} on {target_name}"
                    binary = "cubin" if target.family == "cuda" else "hsaco"
                    assert compiled.asm.get(binary), f"{where}: no {binary}"
                    if target.family == "cuda":
                        assert compiled.metadata.shared <= 227 * 1024, where
                        if name == "prefill_attention":
                            assert "wgmma.mma_async" in compiled.asm["ptx"], f"{where}: no wgmma"
                    else:
                        assert compiled.metadata.shared <= 64 * 1024, where
                        spills = re.search(r"\.vgpr_spill_count:\s+(\d+)", compiled.asm["amdgcn"])
                        assert spills is not None and int(spills.group(1)) == 0, f"{where}: VGPR spills"
    assert len(done) >= 6


# --- on a device ----------------------------------------------------------------------------------------


def device_target() -> Target:
    if torch.version.hip:
        return Target("rocm", torch.cuda.get_device_properties(0).gcnArchName.split(":")[0])
    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", f"sm_{major}{minor}")


@pytest.mark.parametrize(
    "family", [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("rocm", marks=pytest.mark.rocm)]
)
def test_on_device(family: str) -> None:
    """Compiled kernels on the GPU: Llama-3.2-1B heads (32/8), ragged contexts up to 3k tokens in a
    3k-token table, decode S 1 and 3, a 64-token prefill chunk, plain attention causal and not; bf16
    with every config at head_dim 64 and 128, f32 with the default config at 64."""
    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; the device test runs compiled kernels")
    target = device_target()
    seed, rng = seeded()
    decode, prefill = (
        kernel("decode_attention", interpret=False),
        kernel("prefill_attention", interpret=False),
    )
    lens = (1, 17, 700, 3001)
    for dtype, head_dim in ((DType.BF16, 64), (DType.BF16, 128), (DType.F32, 64)):
        every = dtype == DType.BF16
        for seq, kf in ((1, decode), (3, decode), (64, prefill)):
            configs = list(kf.configs_for(target)) if every else [kf.configs_for(target)[0]]
            graph, arrays = paged_arrays(
                rng, tuple(max(n, seq) for n in lens), seq, 32, 8, head_dim, 16, 192, dtype
            )
            where = f"{kf.name} S={seq} {dtype} Dh={head_dim} {target} (seed {seed})"
            check(kf, graph, arrays, target, configs, where, "cuda")
        configs = list(prefill.configs_for(target)) if every else [prefill.configs_for(target)[0]]
        for causal, seq, kv_len in ((True, 300, 300), (False, 77, 1000)):
            graph = plain_graph(2, seq, kv_len, 32, 8, head_dim, causal, dtype)
            where = f"attention causal={causal} {dtype} Dh={head_dim} {target} (seed {seed})"
            check(prefill, graph, plain_arrays(rng, graph), target, configs, where, "cuda")


if __name__ == "__main__":
    child_main(CASES)
