"""The engine on a tiny model with sliding-window attention on some layers (llama-tiny's shapes, layer 0
windowed over 12 tokens, layer 1 full, 4-token KV blocks), on the cpu backend: the gates treat the
blocks a sequence's window has left as released (`polymorph.engine.windows`), so an honest kernel that
never loads them passes every gate, and one that reads them, or leaks another sequence's blocks, is
rejected. The candidates are real kernel files beside this module, in tests/engine/windowed/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from polymorph.engine import gates
from polymorph.engine.cases import GroupInfo, draw
from polymorph.engine.controller import Controller
from polymorph.engine.windows import ReleasedBlocks, cache_windows, released_blocks, slid_out
from polymorph.ir import serialize
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.models.config import FULL, SLIDING
from polymorph.models.decoder import build_decoder
from polymorph.models.zoo import zoo_config
from polymorph.serving.kvcache import PagedKVCache

HERE = Path(__file__).parent / "windowed"
WINDOW, BLOCK = 12, 4
WINDOWED = "layers.0.attn.sdpa"
BUDGET_S = 30.0


def windowed_graph() -> Graph:
    """llama-tiny with a sliding window on layer 0 only (a ModelConfig's `layer_types`)."""
    cfg = dataclasses.replace(zoo_config("llama-tiny"), layer_types=(SLIDING, FULL), sliding_window=WINDOW)
    graph = build_decoder(cfg, name="llama-tiny-window", dtype=DType.F32, block_size=BLOCK)
    graph.meta["seed"] = 0
    return graph


def test_the_decoder_emits_the_window_of_each_layer() -> None:
    graph = windowed_graph()
    windows = {n.name: n.attrs.get("window", 0) for n in graph.nodes if n.op == "cache_attention"}
    assert windows == {WINDOWED: WINDOW, "layers.1.attn.sdpa": 0}
    # only layer 0's caches release blocks: layer 1 reads its own with full attention
    assert cache_windows(graph) == {"layers.0.k_cache": WINDOW, "layers.0.v_cache": WINDOW}


def test_released_blocks_are_those_every_later_query_sees_nothing_of() -> None:
    # window 12, 4-token blocks: the next query at 27 sees 16..27, so blocks 0-3 are gone
    assert [slid_out(p, 12, 4) for p in (0, 11, 14, 15, 27, 28)] == [0, 0, 0, 1, 4, 4]
    tables = np.array([[5, 6, 7, 8, 9, 0], [1, 2, 3, 0, 0, 0]])
    # row 0 (5 blocks) at 27: blocks 5-8 released; row 1 (3 blocks) at 11: none; guard block 0 is not
    # released (row 1 pads with it, and a padding entry is no sequence's block)
    assert released_blocks(tables, [27, 11], 12, 4, np.array([5, 3])) == {5, 6, 7, 8}


def test_a_write_into_a_released_block_counts_as_a_guard_write() -> None:
    torch = pytest.importorskip("torch")
    cache = PagedKVCache(BLOCK, 12, 8)
    cache.reserve(0, 30)
    state = {"k": torch.randn(12, BLOCK, 2, 16), "v": torch.randn(12, BLOCK, 2, 16)}
    released = ReleasedBlocks({"k": WINDOW}, BLOCK)
    released.before_step(cache, [0], state)  # the next query at 30 sees 19..30: blocks 0-3 of seq 0 go
    gone = cache.block_table([0])[0, :4].tolist()
    assert released.blocks == {"k": set(gone)}
    assert torch.isnan(state["k"][gone]).all() and not torch.isnan(state["v"]).any()
    assert not torch.isnan(state["k"][cache.block_table([0])[0, 4:8].tolist()]).any()
    assert released.written(state) == 0
    state["k"][gone[1], 2, 0, 3] = 0.0  # a kernel stashed something in a released block
    assert released.written(state) == 1


def test_the_numerics_cases_put_nan_in_the_released_blocks() -> None:
    graph = windowed_graph()
    types = graph.types()
    node = next(n for n in graph.nodes if n.name == WINDOWED)
    info = {"id": WINDOWED, "inputs": list(node.inputs), "outputs": list(node.outputs), "nodes": [node.name]}
    group = GroupInfo.of(info, graph, types)
    rng = np.random.default_rng(0)
    inputs, bindings = draw(
        group, rng, (2, 1), "normal", block_size=BLOCK, bucket_ctx=64, vocab=256, longest=True
    )
    table, pos = inputs[3], inputs[4]
    want = released_blocks(table, pos.min(axis=1), WINDOW, BLOCK, -(-(pos.max(axis=1) + 1) // BLOCK))
    assert len(want) >= 10  # the first sequence reaches the 64-token context: 13 of its blocks slid out
    for cache in inputs[1:3]:
        dead = np.isnan(cache).all(axis=(1, 2, 3))
        assert set(np.flatnonzero(dead)) == want
        assert not np.isnan(cache[~dead]).any()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    path = tmp_path_factory.mktemp("windowed") / "llama-tiny-window.json"
    serialize.save(windowed_graph(), path)
    with Controller.start(path, backend="cpu", ctx=64, budget_s=BUDGET_S) as running:
        yield running


def test_an_honest_windowed_kernel_passes_every_gate(engine: Controller) -> None:
    engine.reset()
    swap, report = engine.try_candidate(WINDOWED, HERE / "window_blocks_only.py", seed=3)
    assert swap.ok, swap
    assert report is not None and report.ok, report.failed()
    isolation = report.gate(gates.KV_ISOLATION)
    assert isolation.verdict == "pass" and "guard regions zero" in isolation.cause


@pytest.mark.parametrize(
    ("file", "stages"),
    [
        ("reads_slid_out_blocks.py", (gates.NUMERICS, gates.QUALITY, gates.KV_ISOLATION)),
        ("leaks_across_sequences.py", (gates.NUMERICS, gates.QUALITY, gates.KV_ISOLATION)),
    ],
)
def test_a_kernel_that_reads_outside_the_window_or_across_sequences_is_rejected(
    engine: Controller, file: str, stages: tuple[str, ...]
) -> None:
    engine.reset()
    recorded = len(engine.faults)
    swap, report = engine.try_candidate(WINDOWED, HERE / file, seed=5)
    assert swap.ok, swap  # it builds; the gates catch it
    assert report is not None and not report.ok and report.measurement is None
    failed = [g for g in report.gates if g.verdict == "fail"]
    assert failed and failed[0].name in stages, report.gates
    # the isolation gate sees it on its own: the batch reads released (NaN) or foreign blocks
    assert report.gate(gates.KV_ISOLATION).verdict == "fail", report.gate(gates.KV_ISOLATION)
    assert any(f.stage in stages for f in engine.faults[recorded:]), engine.faults[recorded:]
    assert WINDOWED not in engine.accepted and not engine.status()["groups"][WINDOWED]["candidate"]


def test_the_whole_model_run_releases_the_blocks_that_slid_out(engine: Controller) -> None:
    """The model-level run alone (teacher-forced decode past the window, no group cases): the kernel
    that reads every block of its table sees the released blocks' NaN in the worker's own cache."""
    engine.reset()
    assert engine.swap(WINDOWED, HERE / "reads_slid_out_blocks.py").ok
    result = engine.verify(seed=7)
    assert not result.ok
    failure = result.first_failure()
    assert failure is not None and "NaN" in str(failure.comparison), failure
    assert engine.swap(WINDOWED, HERE / "window_blocks_only.py").ok
    assert engine.verify(seed=7).ok
