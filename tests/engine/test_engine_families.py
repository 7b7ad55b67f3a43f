"""The engine and the tune loop on the tiny zoo models of the newer attention kinds, on the cpu backend:
gemma2-tiny (layer 0 slides over 16 tokens, layer 1 attends fully, attention and final logits soft-capped,
a query_pre_attn_scalar other than head_dim) and phi3-tiny (fused qkv and gate_up, rope on half of each
head, every layer sliding over 24 tokens). Both windows are shorter than the 64-token context the engine
loads here, so the gates' group cases reach past them. The stock kernel of the windowed attention group,
swapped in as a candidate, passes every gate; a short tune gates and measures candidates (the times are
reported, never asserted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from polymorph.engine import gates
from polymorph.engine.controller import Controller
from polymorph.pipeline.kernel_files import kernels_root
from polymorph.search.board import Board
from polymorph.search.tune import TuneOptions, tune

pytestmark = pytest.mark.slow

CTX = 64
WINDOWED = "layers.0.attn.sdpa"
# model -> the windowed group's attention attributes as the zoo config asks for them
FAMILIES = {
    "gemma2-tiny": {"window": 16, "softcap": 50.0},
    "phi3-tiny": {"window": 24},
}
FULL_LAYER = {"gemma2-tiny": 0, "phi3-tiny": 24}  # layer 1's window: gemma2 alternates, phi3 slides all


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, Controller]]:
    # generous: the zygote loads the model and its stock kernels on a loaded 2-core machine
    with Controller.start(request.param, backend="cpu", ctx=CTX, budget_s=60.0) as running:
        yield request.param, running


@pytest.mark.timeout(300)
def test_the_graph_carries_each_layers_window_and_softcap(engine: tuple[str, Controller]) -> None:
    name, running = engine
    attention = {n.name: n.attrs for n in running.graph.nodes if n.op == "cache_attention"}
    want = FAMILIES[name]
    assert {k: attention[WINDOWED].get(k) for k in want} == want
    assert attention["layers.1.attn.sdpa"].get("window", 0) == FULL_LAYER[name]
    assert all(w < CTX for w in (want["window"], FULL_LAYER[name]))  # the cases reach past the window


@pytest.mark.timeout(300)
def test_the_stock_attention_kernel_swapped_in_passes_every_gate(engine: tuple[str, Controller]) -> None:
    _, running = engine
    running.reset()
    stock = kernels_root() / running.status()["groups"][WINDOWED]["kernel"]
    assert stock.name == "attention.py"
    swap, report = running.try_candidate(WINDOWED, stock, seed=3)
    assert swap.ok, swap
    assert report is not None and report.ok, report.failed()
    isolation = report.gate(gates.KV_ISOLATION)
    assert isolation.verdict == "pass" and "guard regions zero" in isolation.cause
    assert report.measurement is not None and report.measurement["median_s"] > 0
    assert WINDOWED in running.accepted
    # the whole model, teacher-forced past both windows, with the accepted candidate in place
    assert running.verify(seed=7).ok


@pytest.mark.timeout(420)
@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_a_short_tune_gates_and_measures_candidates(model: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    opts = TuneOptions(model=model, ctx=CTX, budget_s=40, workers=1, out=out, registry=tmp_path / "r.sqlite",
                       trials=3, ab_trials=2, quiet=True)  # fmt: skip
    report = tune(opts)
    (bucket,) = report.buckets
    scope = {g for s in bucket.signatures for g in s.groups}
    assert WINDOWED in scope, sorted(scope)  # the windowed attention group is searched
    assert bucket.candidates >= 1 and bucket.passed >= 1, bucket
    board = Board(out / "board.sqlite")
    try:
        done = [c for c in board.candidates() if c.state == "done" and c.result is not None]
    finally:
        board.close()
    results = [c.result for c in done if c.result is not None]
    passed = [r for r in results if r.ok]
    assert passed, [r.cause for r in results]
    for result in passed:  # gated, then timed
        assert gates.NUMERICS in result.gates and gates.KV_ISOLATION in result.gates, sorted(result.gates)
        assert result.measurements["median_s"] > 0
    # the stock attention kernel on the windowed group (its baseline), once measured, passed its gates
    stock = [c.result for c in done if c.group.split("@")[0] == WINDOWED and c.agent == "baseline"]
    assert all(r is not None and r.ok for r in stock), [r and r.cause for r in stock]
    assert (out / "plan.json").exists()
