"""The engine and the tune loop on a tiny model of each new MoE router, on the cpu backend:
glm4-moe-tiny (sigmoid scores with a correction bias, 2 of 4 expert groups, routed scaling, a shared
expert, a first dense layer), llama4-tiny (top-k then sigmoid, each expert's input weighted; chunked
attention, a layer without rope) and gpt-oss-tiny (top-k softmax over biased logits, clamped SwiGLU experts
with biases, attention sinks, a sliding layer). The stock router and expert kernels swapped in as
candidates pass every gate; the expert group's numerics cases are drawn with uniform, imbalanced and
single-set routing (`polymorph.engine.cases`), the router's with imbalanced and tied logits. A short tune
on each, and on the latent and sparse attention tiny models, gates (the state gate included) and
measures candidates (the times are reported, never asserted)."""

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
# model -> (its first MoE layer's router and expert groups, the router mode the graph must carry)
FAMILIES = {
    "glm4-moe-tiny": ("layers.1.moe", "sigmoid_topk"),
    "llama4-tiny": ("layers.1.moe", "topk_sigmoid"),
    "gpt-oss-tiny": ("layers.0.moe", "topk_softmax"),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, Controller]]:
    # generous: the zygote loads the model and its stock kernels on a loaded 2-core machine
    with Controller.start(request.param, backend="cpu", ctx=CTX, budget_s=60.0) as running:
        yield request.param, running


def _group_of(running: Controller, node: str) -> str:
    """The loaded plan's group that holds `node`."""
    groups = running.status()["groups"]
    return next(g for g, info in groups.items() if node in info.get("nodes", (g,)) or g == node)


@pytest.mark.timeout(300)
def test_the_graph_carries_the_router(engine: tuple[str, Controller]) -> None:
    name, running = engine
    prefix, mode = FAMILIES[name]
    routers = {n.name: n.attrs for n in running.graph.nodes if n.op == "topk_router"}
    assert routers[f"{prefix}.topk"]["mode"] == mode, routers


@pytest.mark.timeout(420)
def test_the_stock_router_and_expert_kernels_swapped_in_pass_every_gate(
    engine: tuple[str, Controller],
) -> None:
    name, running = engine
    prefix, _ = FAMILIES[name]
    for node in (f"{prefix}.topk", f"{prefix}.experts"):
        running.reset()
        group = _group_of(running, node)
        stock = kernels_root() / running.status()["groups"][group]["kernel"]
        swap, report = running.try_candidate(group, stock, seed=5)
        assert swap.ok, swap
        assert report is not None and report.ok, (node, report.failed())
        numerics = report.gate(gates.NUMERICS)
        assert numerics.verdict == "pass", (node, numerics)  # drawn, not skipped as undrawable
        assert report.measurement is not None and report.measurement["median_s"] > 0
    assert running.verify(seed=7).ok


# the routers' tiny models, and the latent and sparse attention ones (tests/engine/test_state_isolation.py)
TUNED = [*sorted(FAMILIES), "deepseek-v3-tiny", "deepseek-v32-tiny"]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("model", TUNED)
def test_a_short_tune_gates_and_measures_candidates(model: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    opts = TuneOptions(model=model, ctx=CTX, budget_s=40, workers=1, out=out, registry=tmp_path / "r.sqlite",
                       trials=3, ab_trials=2, quiet=True)  # fmt: skip
    report = tune(opts)
    (bucket,) = report.buckets
    assert bucket.candidates >= 1 and bucket.passed >= 1, bucket
    board = Board(out / "board.sqlite")
    try:
        done = [c for c in board.candidates() if c.state == "done" and c.result is not None]
    finally:
        board.close()
    passed = [c.result for c in done if c.result is not None and c.result.ok]
    assert passed, [c.result.cause for c in done if c.result is not None]
    for result in passed:  # gated, then timed
        assert {gates.NUMERICS, gates.QUALITY, gates.KV_ISOLATION} <= set(result.gates), sorted(result.gates)
        assert result.measurements["median_s"] > 0
    assert (out / "plan.json").exists()
