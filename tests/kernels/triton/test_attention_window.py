"""Sliding window and logit soft-capping (`window`, `softcap` of attention and cache_attention) in
kernels/triton/decode_attention.py and prefill_attention.py, against the numpy reference under Triton's
interpreter: fresh random inputs, NaN-poisoned outputs, a shuffled paged table, ragged contexts in one
batch, and NaN in every cache slot outside each sequence's window (and past its end), so a read of a
block outside the window shows as NaN in the output. Decode runs the one-token kernel (S = 1), the
general split kernel at S = 1 (config `one_kernel` off) and at S = 3, each under the default config and
one that splits the context into many 16-token pieces; the split plan under a window is sized to the
window, not the table. The interpreted cases run in child processes unless this process interprets
(`python tests/kernels/triton/test_attention_window.py CASE` runs them directly); WINDOW_SEED
reproduces a failure's seed."""

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
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA = Target.parse("cuda:sm_90")
BLOCK, CTX_BLOCKS, HEAD_DIM, HEADS, KV_HEADS = 16, 6, 32, 4, 2
LENS = (1, 13, 40, 96, 70)  # tokens per sequence once this step's tokens are in
MANY = {"block_n": 16, "one_block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 64, "num_warps": 4,
        "num_stages": 2}  # fmt: skip
TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F32: torch.float32}


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("WINDOW_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def cache_graph(seq: int, cache_blocks: int, dtype: DType, window: int, softcap: float) -> Graph:
    g = GraphBuilder("cache_attention")
    q = g.input("q", dtype, (len(LENS), seq, HEADS, HEAD_DIM))
    kc = g.state("k_cache", dtype, (cache_blocks, BLOCK, KV_HEADS, HEAD_DIM))
    vc = g.state("v_cache", dtype, (cache_blocks, BLOCK, KV_HEADS, HEAD_DIM))
    table = g.input("block_table", DType.I32, (len(LENS), CTX_BLOCKS))
    pos = g.input("positions", DType.I32, (len(LENS), seq))
    out = g.op("cache_attention", "attn", q, kc, vc, table, pos, scale=HEAD_DIM**-0.5, window=window,
               softcap=softcap)  # fmt: skip
    g.output("out", out)
    return g.build()


def cache_arrays(rng: np.random.Generator, seq: int, window: int, dtype: DType) -> dict[str, Any]:
    """Sequence b holds LENS[b] tokens, its queries the last `seq` of them (fewer if it is shorter: the
    others repeat its first). Every slot no query of its sequence sees holds NaN: past the end, before
    the window (whole blocks and the part of the window's first block before it), and the never-used
    blocks, one of which every table entry past a sequence's last block names."""
    batch = len(LENS)
    cache_blocks = batch * CTX_BLOCKS + 2
    order = rng.permutation(np.arange(1, cache_blocks))[: batch * CTX_BLOCKS].reshape(batch, CTX_BLOCKS)
    table = np.zeros((batch, CTX_BLOCKS), dtype=np.int32)
    seen = np.zeros((cache_blocks, BLOCK), dtype=bool)
    positions = np.zeros((batch, seq), dtype=np.int32)
    for b, n in enumerate(LENS):
        table[b, : -(-n // BLOCK)] = order[b, : -(-n // BLOCK)]
        positions[b] = np.maximum(np.arange(n - seq, n), 0)
        first = max(0, positions[b].min() - window + 1) if window else 0
        t = np.arange(first, n)
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
    return arrays


def run_case(file: str, graph: Graph, arrays: dict[str, Any], dtype: DType, configs: list[dict[str, Any]],
             where: str) -> None:  # fmt: skip
    kf = kernel(file, interpret=True)
    (node,) = graph.nodes
    types = graph.types()
    spec = KernelSpec(node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, types, CUDA)
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
        assert np.isfinite(got).all(), (
            f"{where} config {config}: NaN in the output (a slot outside the window read?)"
        )
        result = compare(got, want, op_tolerance(dtype))
        assert result.ok, f"{where} config {config}: {result}"


def decode_case(seq: int, window: int, softcap: float, dtype: DType, one_kernel: bool) -> None:
    seed, rng = seeded()
    arrays = cache_arrays(rng, seq, window, dtype)
    graph = cache_graph(seq, len(LENS) * CTX_BLOCKS + 2, dtype, window, softcap)
    default = kernel("decode_attention", interpret=True).configs_for(CUDA)[0]
    configs = [{**c, "one_kernel": one_kernel} for c in (default, MANY)]
    where = f"decode S={seq} window {window} softcap {softcap} {dtype} one_kernel {one_kernel} (seed {seed})"
    run_case("decode_attention", graph, arrays, dtype, configs, where)


def prefill_cache_case(window: int, softcap: float, dtype: DType) -> None:
    seed, rng = seeded()
    seq = 7  # > 4: prefill_attention's (a chunk of each sequence's last 7 tokens)
    arrays = cache_arrays(rng, seq, window, dtype)
    graph = cache_graph(seq, len(LENS) * CTX_BLOCKS + 2, dtype, window, softcap)
    configs = list(kernel("prefill_attention", interpret=True).configs_for(CUDA)[:2])
    where = f"prefill cache S={seq} window {window} softcap {softcap} {dtype} (seed {seed})"
    run_case("prefill_attention", graph, arrays, dtype, configs, where)


def prefill_plain_case(window: int, softcap: float, dtype: DType) -> None:
    """attention (causal, plain k and v) over a 75-token prompt, batch 2."""
    seed, rng = seeded()
    b, s = 2, 75
    g = GraphBuilder("attention")
    q = g.input("q", dtype, (b, s, HEADS, HEAD_DIM))
    k = g.input("k", dtype, (b, s, KV_HEADS, HEAD_DIM))
    v = g.input("v", dtype, (b, s, KV_HEADS, HEAD_DIM))
    g.output("out", g.op("attention", "attn", q, k, v, scale=HEAD_DIM**-0.5, causal=True, window=window,
                         softcap=softcap))  # fmt: skip
    graph = g.build()
    arrays = {n: 2.0 * rng.standard_normal(shape).astype(np.float32)
              for n, shape in (("q", (b, s, HEADS, HEAD_DIM)), ("k", (b, s, KV_HEADS, HEAD_DIM)),
                               ("v", (b, s, KV_HEADS, HEAD_DIM)))}  # fmt: skip
    if dtype == DType.BF16:
        arrays = {n: torch.from_numpy(a).to(torch.bfloat16).float().numpy() for n, a in arrays.items()}
    configs = list(kernel("prefill_attention", interpret=True).configs_for(CUDA)[:2])
    where = f"prefill plain window {window} softcap {softcap} {dtype} (seed {seed})"
    run_case("prefill_attention", graph, arrays, dtype, configs, where)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for dtype in (DType.BF16, DType.F32):
        for window, softcap in ((20, 0.0), (37, 5.0), (0, 3.0), (8, 0.0)):
            tag = f"w{window}-c{softcap:g}-{dtype}"
            cases[f"decode-one-{tag}"] = functools.partial(decode_case, 1, window, softcap, dtype, True)
            cases[f"decode-split1-{tag}"] = functools.partial(decode_case, 1, window, softcap, dtype, False)
            cases[f"decode-split3-{tag}"] = functools.partial(decode_case, 3, window, softcap, dtype, True)
            cases[f"prefill-cache-{tag}"] = functools.partial(prefill_cache_case, window, softcap, dtype)
            cases[f"prefill-plain-{tag}"] = functools.partial(prefill_plain_case, window, softcap, dtype)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_window_softcap_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_window_plan_covers_only_the_window() -> None:
    """Under a window the one-token splits cover window + BS - 1 tokens (the window from the start of its
    first block), not the table: at 8k context with a 4096-token window about half the tokens of full
    attention on sm_90, still about `ctas_per_cu` programs an SM (shorter splits); without a window
    nothing changes."""
    from polymorph.hardware.traits import traits_for

    module = kernel("decode_attention", interpret=False).module
    traits = traits_for(CUDA)
    config = module.configs(traits)[0]
    full = module.occupancy(1, 8, 8192, config, traits)
    windowed = module.occupancy(1, 8, 8192, config, traits, window=4096, block_size=16)
    covered = windowed["splits"] * windowed["split_tokens"]
    assert 4096 + 15 <= covered < full["splits"] * full["split_tokens"] // 3 * 2, (windowed, full)
    assert windowed["ctas"] >= full["ctas"] // 2
    assert module.occupancy(1, 8, 8192, config, traits, window=0) == full
    assert module._span(1, 8192, 16, 100) == 115 and module._span(3, 8192, 16, 100) == 8192


if __name__ == "__main__":
    child_main(CASES)
