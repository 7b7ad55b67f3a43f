"""Attention sinks (the optional last input `sinks[H]` of attention and cache_attention: one logit per
query head in each row's softmax, no value; gpt-oss) and chunked attention (the `chunk` attr: the query
at p sees p // chunk * chunk <= t <= p; Llama 4) in kernels/triton/decode_attention.py and
prefill_attention.py.

Under Triton's interpreter, against the numpy reference: fresh random inputs, NaN-poisoned outputs, a
shuffled paged table, ragged contexts in one batch, and NaN in every cache slot no query of its
sequence sees (outside its chunk or window, past its end, never-used blocks), so a read of a block
outside the chunk shows as NaN in the output. Sinks per head span large negative (no effect) to large
positive (nearly all the weight) values. Decode runs the one-token kernel (S = 1), the general split
kernel at S = 1 (`one_kernel` off) and at S = 3, each under the default config and one that splits the
context into many 16-token pieces (the reduce must add the sink once, not once per split); chunks of
24 and 38 (cutting the 16-token blocks mid-block; 38 also splits one sequence's queries between two
chunks), 32 (at block edges), 16 (one block) and 7 (shorter than a block). The interpreted cases run
in child processes unless this process interprets (`python tests/kernels/triton/test_attention_sinks.py
CASE` runs them directly); SINKS_SEED reproduces a failure's seed.

Without a device: the new variants compile ahead of time for sm_90, sm_100, gfx942 and gfx950 without
spills, and a spec without sinks or chunk gets CHUNK 0 and SINKS off (the kernels' code as before)."""

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
BLOCK, CTX_BLOCKS, HEAD_DIM, HEADS, KV_HEADS = 16, 6, 32, 4, 2
LENS = (1, 13, 40, 96, 70)  # tokens per sequence once this step's tokens are in
MANY = {"block_n": 16, "one_block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 64, "num_warps": 4,
        "num_stages": 2}  # fmt: skip
TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F32: torch.float32}
# one per head (HEADS = 4): large negative, moderate, large positive, against scores of a few units
SINKS = np.array([-30.0, 0.5, 3.0, 25.0], dtype=np.float32)


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("SINKS_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def sinks_of(rng: np.random.Generator, dtype: DType) -> np.ndarray:
    x = rng.permutation(SINKS) + rng.uniform(-0.5, 0.5, SINKS.size).astype(np.float32)
    if dtype == DType.BF16:
        x = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    return x.astype(np.float32)


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


def cache_graph(batch: int, seq: int, ctx_blocks: int, cache_blocks: int, dtype: DType, sinks: bool,
                heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM, block: int = BLOCK,
                **attrs: Any) -> Graph:  # fmt: skip
    g = GraphBuilder("cache_attention")
    q = g.input("q", dtype, (batch, seq, heads, head_dim))
    kc = g.state("k_cache", dtype, (cache_blocks, block, kv_heads, head_dim))
    vc = g.state("v_cache", dtype, (cache_blocks, block, kv_heads, head_dim))
    table = g.input("block_table", DType.I32, (batch, ctx_blocks))
    pos = g.input("positions", DType.I32, (batch, seq))
    extra = [g.input("sinks", dtype, (heads,))] if sinks else []
    out = g.op("cache_attention", "attn", q, kc, vc, table, pos, *extra, scale=head_dim**-0.5, **attrs)
    g.output("out", out)
    return g.build()


def plain_graph(batch: int, seq: int, dtype: DType, sinks: bool, heads: int = HEADS, kv_heads: int = KV_HEADS,
                head_dim: int = HEAD_DIM, **attrs: Any) -> Graph:  # fmt: skip
    g = GraphBuilder("attention")
    q = g.input("q", dtype, (batch, seq, heads, head_dim))
    k = g.input("k", dtype, (batch, seq, kv_heads, head_dim))
    v = g.input("v", dtype, (batch, seq, kv_heads, head_dim))
    extra = [g.input("sinks", dtype, (heads,))] if sinks else []
    g.output("out", g.op("attention", "attn", q, k, v, *extra, scale=head_dim**-0.5, causal=True, **attrs))
    return g.build()


def first_seen(p: int, window: int, chunk: int) -> int:
    if window:
        return max(0, p - window + 1)
    return p // chunk * chunk if chunk else 0


def cache_arrays(rng: np.random.Generator, seq: int, dtype: DType, window: int, chunk: int,
                 sinks: bool) -> dict[str, Any]:  # fmt: skip
    """Sequence b holds LENS[b] tokens, its queries the last `seq` of them (fewer if it is shorter: the
    others repeat its first). Every slot no query of its sequence sees holds NaN: past the end, before
    its window or outside its chunk, and the never-used blocks, one of which every table entry past a
    sequence's last block names."""
    batch = len(LENS)
    cache_blocks = batch * CTX_BLOCKS + 2
    order = rng.permutation(np.arange(1, cache_blocks))[: batch * CTX_BLOCKS].reshape(batch, CTX_BLOCKS)
    table = np.zeros((batch, CTX_BLOCKS), dtype=np.int32)
    seen = np.zeros((cache_blocks, BLOCK), dtype=bool)
    positions = np.zeros((batch, seq), dtype=np.int32)
    for b, n in enumerate(LENS):
        table[b, : -(-n // BLOCK)] = order[b, : -(-n // BLOCK)]
        positions[b] = np.maximum(np.arange(n - seq, n), 0)
        for p in positions[b]:
            t = np.arange(first_seen(int(p), window, chunk), p + 1)
            seen[table[b, t // BLOCK], t % BLOCK] = True
    arrays: dict[str, Any] = {
        "q": rng.standard_normal((batch, seq, HEADS, HEAD_DIM)).astype(np.float32),
        "block_table": table,
        "positions": positions,
    }
    for name in ("k_cache", "v_cache"):
        x = 2.0 * rng.standard_normal((cache_blocks, BLOCK, KV_HEADS, HEAD_DIM)).astype(np.float32)
        arrays[name] = np.where(seen[:, :, None, None], x, np.nan).astype(np.float32)
    if dtype == DType.BF16:  # the reference takes the values the kernel sees
        for name in ("q", "k_cache", "v_cache"):
            arrays[name] = torch.from_numpy(arrays[name]).to(torch.bfloat16).float().numpy()
    if sinks:
        arrays["sinks"] = sinks_of(rng, dtype)
    return arrays


def run_case(file: str, graph: Graph, arrays: dict[str, Any], dtype: DType, configs: list[dict[str, Any]],
             where: str) -> None:  # fmt: skip
    kf = kernel(file, interpret=True)
    spec = spec_of(graph, CUDA)
    types = graph.types()
    assert kf.supports(spec), f"{where}: {file} does not support it"
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
        kf.build(spec, config, CUDA)(args, [out], None)
        got = out.float().numpy()
        assert np.isfinite(got).all(), f"{where} config {config}: NaN in the output (a slot outside read?)"
        result = compare(got, want, op_tolerance(dtype))
        assert result.ok, f"{where} config {config}: {result}"


def decode_case(seq: int, dtype: DType, one_kernel: bool, sinks: bool, **attrs: Any) -> None:
    seed, rng = seeded()
    arrays = cache_arrays(rng, seq, dtype, attrs.get("window", 0), attrs.get("chunk", 0), sinks)
    graph = cache_graph(len(LENS), seq, CTX_BLOCKS, len(LENS) * CTX_BLOCKS + 2, dtype, sinks, **attrs)
    default = kernel("decode_attention", interpret=True).configs_for(CUDA)[0]
    configs = [{**c, "one_kernel": one_kernel} for c in (default, MANY)]
    where = f"decode S={seq} {attrs} sinks {sinks} {dtype} one_kernel {one_kernel} (seed {seed})"
    run_case("decode_attention", graph, arrays, dtype, configs, where)


def prefill_cache_case(dtype: DType, sinks: bool, **attrs: Any) -> None:
    seed, rng = seeded()
    seq = 7  # > 4: prefill_attention's (a chunk of each sequence's last 7 tokens)
    arrays = cache_arrays(rng, seq, dtype, attrs.get("window", 0), attrs.get("chunk", 0), sinks)
    graph = cache_graph(len(LENS), seq, CTX_BLOCKS, len(LENS) * CTX_BLOCKS + 2, dtype, sinks, **attrs)
    configs = list(kernel("prefill_attention", interpret=True).configs_for(CUDA)[:2])
    where = f"prefill cache S={seq} {attrs} sinks {sinks} {dtype} (seed {seed})"
    run_case("prefill_attention", graph, arrays, dtype, configs, where)


def prefill_plain_case(dtype: DType, sinks: bool, **attrs: Any) -> None:
    """attention (causal, plain k and v) over a 75-token prompt, batch 2."""
    seed, rng = seeded()
    b, s = 2, 75
    graph = plain_graph(b, s, dtype, sinks, **attrs)
    arrays = {n: 2.0 * rng.standard_normal(shape).astype(np.float32)
              for n, shape in (("q", (b, s, HEADS, HEAD_DIM)), ("k", (b, s, KV_HEADS, HEAD_DIM)),
                               ("v", (b, s, KV_HEADS, HEAD_DIM)))}  # fmt: skip
    if dtype == DType.BF16:
        arrays = {n: torch.from_numpy(a).to(torch.bfloat16).float().numpy() for n, a in arrays.items()}
    if sinks:
        arrays["sinks"] = sinks_of(rng, dtype)
    configs = list(kernel("prefill_attention", interpret=True).configs_for(CUDA)[:2])
    where = f"prefill plain {attrs} sinks {sinks} {dtype} (seed {seed})"
    run_case("prefill_attention", graph, arrays, dtype, configs, where)


# (tag, sinks, attrs): chunks mid-block (24, 38), at block edges (32), of one block (16), shorter than one
# (7); 38 puts a chunk boundary among the queries of one sequence at S = 3 and S = 7
VARIANTS = [
    ("sinks", True, {}),
    ("chunk24", False, {"chunk": 24}),
    ("chunk32-sinks", True, {"chunk": 32}),
    ("chunk16", False, {"chunk": 16}),
    ("chunk7-softcap", False, {"chunk": 7, "softcap": 5.0}),
    ("chunk38-sinks", True, {"chunk": 38}),  # the 40-token sequence's queries straddle its chunks
    ("w20-sinks", True, {"window": 20}),
]


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for dtype in (DType.BF16, DType.F32):
        for tag, sinks, attrs in VARIANTS:
            t = f"{tag}-{dtype}"
            cases[f"decode-one-{t}"] = functools.partial(decode_case, 1, dtype, True, sinks, **attrs)
            cases[f"decode-split1-{t}"] = functools.partial(decode_case, 1, dtype, False, sinks, **attrs)
            cases[f"decode-split3-{t}"] = functools.partial(decode_case, 3, dtype, True, sinks, **attrs)
            cases[f"prefill-cache-{t}"] = functools.partial(prefill_cache_case, dtype, sinks, **attrs)
            cases[f"prefill-plain-{t}"] = functools.partial(prefill_plain_case, dtype, sinks, **attrs)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_sinks_chunk_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_chunk_plan_covers_only_the_chunk() -> None:
    """Under a chunk the one-token splits cover chunk + BS - 1 tokens (as under a window of the chunk's
    size), not the table: at 8k context a 2048-token chunk takes a quarter of the table's tokens, less
    than half of full attention's splits; without a chunk nothing changes."""
    from polymorph.hardware.traits import traits_for

    module = kernel("decode_attention", interpret=False).module
    traits = traits_for(CUDA)
    config = module.configs(traits)[0]
    full = module.occupancy(1, 8, 8192, config, traits)
    chunked = module.occupancy(1, 8, 8192, config, traits, chunk=2048, block_size=16)
    covered = chunked["splits"] * chunked["split_tokens"]
    assert 2048 + 15 <= covered < full["splits"] * full["split_tokens"] // 2, (chunked, full)
    assert module.occupancy(1, 8, 8192, config, traits, chunk=0) == full


def test_supports() -> None:
    """Both files take sinks and chunks (decode at S <= 4, prefill above), as the CHUNK and SINKS
    constexprs (0 and False without them: the kernels' code as before) and the sinks pointer (q's type
    without sinks: launch passes q, never read)."""
    decode = kernel("decode_attention", interpret=False)
    prefill = kernel("prefill_attention", interpret=False)
    for seq, kf in ((1, decode), (3, decode), (7, prefill)):
        for sinks, attrs in ((True, {}), (False, {"chunk": 24}), (True, {"chunk": 8, "softcap": 3.0})):
            spec = spec_of(cache_graph(2, seq, 4, 9, DType.BF16, sinks, **attrs), CUDA)
            assert kf.supports(spec), (seq, sinks, attrs)
            for unit in kf.compile_units(spec, kf.configs_for(CUDA)[0], CUDA):
                assert unit.constexprs["CHUNK"] == attrs.get("chunk", 0)
                if unit.name.endswith("reduce"):
                    assert "SINKS" not in unit.constexprs  # split 0 carries the sink
                    continue
                assert unit.constexprs["SINKS"] == sinks
                assert unit.signature["sinks_ptr"] == ("*bf16" if sinks else unit.signature["q_ptr"])
        spec = spec_of(cache_graph(2, seq, 4, 9, DType.BF16, False), CUDA)
        for unit in kf.compile_units(spec, kf.configs_for(CUDA)[0], CUDA):
            assert not unit.constexprs.get("SINKS", False) and unit.constexprs["CHUNK"] == 0
    assert prefill.supports(spec_of(plain_graph(1, 9, DType.F32, True, chunk=4), CUDA))


# --- ahead-of-time compile, no device -------------------------------------------------------------------

AOT_TARGETS = ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950")


def aot_cases(target: Target) -> list[tuple[str, KernelSpec, dict[str, Any]]]:
    """Llama-3.2-1B attention shapes (H 32, Hkv 8, Dh 64, block 16, bf16), 8k-token tables: decode at
    S = 1 (one-token and split kernels) and S = 3, a 512-token prefill chunk and a 2k causal prompt."""

    def cache(seq: int, sinks: bool, **attrs: Any) -> KernelSpec:
        graph = cache_graph(1, seq, 520, 600, DType.BF16, sinks, 32, 8, 64, 16, **attrs)
        return spec_of(graph, target)

    def plain(sinks: bool, **attrs: Any) -> KernelSpec:
        return spec_of(plain_graph(1, 2048, DType.BF16, sinks, 32, 8, 64, **attrs), target)

    return [
        ("decode_attention", cache(1, True), {}),
        ("decode_attention", cache(1, True, window=128), {}),
        ("decode_attention", cache(1, False, chunk=8192 // 4), {}),
        ("decode_attention", cache(1, True, chunk=2048, softcap=30.0), {"one_kernel": False}),
        ("decode_attention", cache(3, True, chunk=2048), {}),
        ("prefill_attention", cache(512, True), {}),
        ("prefill_attention", cache(512, False, chunk=2048), {}),
        ("prefill_attention", plain(True, window=128), {}),
        ("prefill_attention", plain(True, chunk=1024), {}),
    ]


@pytest.mark.compile
@pytest.mark.parametrize("target_name", AOT_TARGETS)
def test_sinks_chunk_compile_without_spills(target_name: str) -> None:
    from polymorph.backends.gpu.aot import compile_unit
    from polymorph.hardware.traits import traits_for

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    traits = traits_for(target)
    for name, spec, keys in aot_cases(target):
        kf = kernel(name, interpret=False)
        assert kf.supports(spec), (name, spec)
        units = kf.compile_units(spec, {**kf.configs_for(traits)[0], **keys}, traits)
        for unit in units:
            c = compile_unit(unit, target)
            where = f"{unit.name} {keys} {sorted(unit.constexprs.items())} on {target_name}"
            assert c.resources.get("spill_bytes") == 0, (
                f"{where}: spills {c.resources.get('spill_bytes')} bytes"
            )


if __name__ == "__main__":
    child_main(CASES)
