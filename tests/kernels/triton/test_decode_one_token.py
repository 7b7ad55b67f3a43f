"""The one-token split-K path of kernels/triton/decode_attention.py (S = 1) against the reference, under
Triton's interpreter: fresh random inputs, NaN-poisoned outputs, a paged cache with ragged contexts in
one batch, a shuffled table whose entries past each sequence's end all name one NaN-filled block, and
NaN in every unwritten slot of a written block, so a read past a sequence's end shows as NaN. Every
case runs the default config of each GPU target and configs that split the short contexts many ways
(one 16-token tile a split) and few (several tiles a split). The interpreted cases run in child
processes unless this process interprets (`python tests/kernels/triton/test_decode_one_token.py CASE`
runs them directly); ONE_TOKEN_SEED reproduces a failure's seed."""

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

TARGETS = (Target.parse("cuda:sm_90"), Target.parse("rocm:gfx942"))
BLOCK, CTX_BLOCKS, HEAD_DIM = 16, 6, 64
LENS = (1, 16, 33, 96, 50)  # tokens per sequence (the last query is at position len - 1)
# one 16-token tile a split (6 splits at 96 tokens), and 32-token splits of two 16-token tiles
MANY = {"block_n": 16, "one_block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 64, "num_warps": 4,
        "num_stages": 2}  # fmt: skip
TWO_TILES = {"block_n": 16, "one_block_n": 16, "min_split_tokens": 16, "ctas_per_cu": 1, "num_warps": 4,
             "num_stages": 2}  # fmt: skip
TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F32: torch.float32}


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("ONE_TOKEN_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def graph_of(batch: int, heads: int, kv_heads: int, cache_blocks: int, dtype: DType) -> Graph:
    g = GraphBuilder("cache_attention")
    q = g.input("q", dtype, (batch, 1, heads, HEAD_DIM))
    kc = g.state("k_cache", dtype, (cache_blocks, BLOCK, kv_heads, HEAD_DIM))
    vc = g.state("v_cache", dtype, (cache_blocks, BLOCK, kv_heads, HEAD_DIM))
    table = g.input("block_table", DType.I32, (batch, CTX_BLOCKS))
    pos = g.input("positions", DType.I32, (batch, 1))
    g.output("out", g.op("cache_attention", "attn", q, kc, vc, table, pos, scale=HEAD_DIM**-0.5))
    return g.build()


def arrays_of(
    rng: np.random.Generator, heads: int, kv_heads: int, dtype: DType
) -> tuple[Graph, dict[str, Any]]:
    """A cache of batch * CTX_BLOCKS + 2 blocks: block 0 NaN, named by every table entry past a
    sequence's last block; the others shuffled among the sequences."""
    batch = len(LENS)
    cache_blocks = batch * CTX_BLOCKS + 2
    order = rng.permutation(np.arange(1, cache_blocks))[: batch * CTX_BLOCKS].reshape(batch, CTX_BLOCKS)
    table = np.zeros((batch, CTX_BLOCKS), dtype=np.int32)
    written = np.zeros((cache_blocks, BLOCK), dtype=bool)
    for b, n in enumerate(LENS):
        used = -(-n // BLOCK)
        table[b, :used] = order[b, :used]
        t = np.arange(n)
        written[table[b, t // BLOCK], t % BLOCK] = True
    arrays: dict[str, Any] = {
        "q": rng.standard_normal((batch, 1, heads, HEAD_DIM)).astype(np.float32),
        "block_table": table,
        "positions": np.array([[n - 1] for n in LENS], dtype=np.int32),
    }
    for name in ("k_cache", "v_cache"):
        x = rng.standard_normal((cache_blocks, BLOCK, kv_heads, HEAD_DIM)).astype(np.float32)
        arrays[name] = np.where(written[:, :, None, None], x, np.nan).astype(np.float32)
    if dtype == DType.BF16:  # the reference takes the values the kernel sees
        for name in ("q", "k_cache", "v_cache"):
            arrays[name] = torch.from_numpy(arrays[name]).to(torch.bfloat16).float().numpy()
    return graph_of(batch, heads, kv_heads, cache_blocks, dtype), arrays


def one_token_case(target: Target, dtype: DType, rep: int) -> None:
    kf = kernel("decode_attention", interpret=True)
    seed, rng = seeded()
    heads = 4
    graph, arrays = arrays_of(rng, heads, heads // rep, dtype)
    (node,) = graph.nodes
    types = graph.types()
    spec = KernelSpec(node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, types, target)
    assert kf.supports(spec)
    ref_in = {k: v.astype(types[k].dtype.numpy) for k, v in arrays.items() if k in graph.inputs}
    ref_state = {
        k: np.nan_to_num(v, nan=0.0).astype(types[k].dtype.numpy)
        for k, v in arrays.items()
        if k in graph.state
    }
    want = reference.run(graph, {}, ref_in, ref_state)["out"]  # the reference never reads past an end
    args = []
    for v in spec.inputs:
        t = torch.from_numpy(np.ascontiguousarray(arrays[v]))
        args.append(t.to(TORCH_DTYPE[dtype]) if types[v].dtype.is_float else t)
    for config in (kf.configs_for(target)[0], MANY, TWO_TILES):
        splits = kf.module._one_plan(len(LENS), heads // rep, CTX_BLOCKS * BLOCK, config, 304)[0]
        out = torch.full(want.shape, float("nan"), dtype=TORCH_DTYPE[dtype])
        kf.build(spec, config, target)(args, [out], None)
        got = out.float().numpy()
        where = (
            f"one-token {target} {dtype} gqa{rep} config {config} (seed {seed}, {splits} splits at 304 units)"
        )
        assert np.isfinite(got).all(), f"{where}: NaN or inf in the output (a read past a sequence's end?)"
        result = compare(got, want.astype(np.float32), op_tolerance(dtype))
        assert result.ok, f"{where}: {result}"


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for target in TARGETS:
        for dtype in (DType.BF16, DType.F32):
            for rep in (1, 4):
                cases[f"one-token-{target.family}-{dtype}-gqa{rep}"] = functools.partial(
                    one_token_case, target, dtype, rep
                )
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_one_token_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_one_token_plan_fills_the_chip() -> None:
    """The one-token plan from the target's traits: on sm_90 (132 SMs), batch 1, 8 kv heads, the
    default config (ctas_per_cu 8, tiles up to 128) makes one tile a split of 64 tokens at 1k (128
    programs) and at 8k (1,024 programs); the default before it (ctas_per_cu 2, tiles up to 256, the
    second config) made 32 splits of 256 tokens at 8k on 8 warps. Splits cover the context exactly in
    whole tiles at every batch."""
    from polymorph.hardware.traits import traits_for

    module = kernel("decode_attention", interpret=False).module
    traits = traits_for(TARGETS[0])
    config, previous = module.configs(traits)[:2]
    assert module._one_plan(1, 8, 1024, config, traits.units) == (16, 64, 64)
    assert module._one_plan(1, 8, 8192, config, traits.units) == (128, 64, 64)
    assert module._one_plan(1, 8, 8192, previous, traits.units) == (32, 256, 256)
    assert module._one_warps(previous, 256, traits.warp_size) == 8
    for target in TARGETS:
        traits = traits_for(target)
        for config in module.configs(traits):
            for batch in (1, 3, 8, 32, 64):
                for ctx in (16, 80, 1024, 8192, 32768):
                    splits, tokens, tile = module._one_plan(batch, 8, ctx, config, traits.units)
                    assert tokens % tile == 0 and (splits - 1) * tokens < ctx <= splits * tokens
                    top = max(config.get("one_block_n", config["block_n"]), config["min_split_tokens"], 16)
                    assert 16 <= tile <= top, (target, config, batch, ctx, tile)


if __name__ == "__main__":
    child_main(CASES)
