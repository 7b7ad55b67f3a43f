"""State isolation beyond a KV cache, on the cpu backend: the latent cache of DeepSeek-V3's attention
(deepseek-v3-tiny) and the indexer cache of DeepSeek-V3.2's sparse attention (deepseek-v32-tiny) are
per-sequence state like a KV cache, and the gates hold them to the same rules. Honest stock kernels of
the latent write, the latent attention, the indexer and the sparse attention pass every gate; a
candidate that reads another sequence's latent blocks, writes a slot its sequence has not reached, or
scores one sequence's positions against another's indexer cache, or reads positions its indexer did
not select is rejected, and the engine keeps
serving with the stock kernel. A short tune on each model runs in
tests/engine/test_engine_moe.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from polymorph.engine import gates
from polymorph.engine.controller import Controller
from polymorph.pipeline.kernel_files import kernels_root

pytestmark = pytest.mark.slow

CTX = 64
ADVERSARIAL = Path(__file__).parent / "adversarial"
# model -> the groups of its first layer whose state is not a plain KV cache
HONEST = {
    "deepseek-v3-tiny": ("layers.0.attn.latent_write", "layers.0.attn.sdpa"),
    "deepseek-v32-tiny": ("layers.0.attn.latent_write", "layers.0.index.write", "layers.0.index.topk",
                          "layers.0.attn.sdpa"),
}  # fmt: skip
# (model, group, candidate file): each must be rejected by one of the gates that compare sequences
LEAKS = [
    ("deepseek-v3-tiny", "layers.0.attn.sdpa", "latent_batch_leak.py"),
    ("deepseek-v3-tiny", "layers.0.attn.latent_write", "latent_write_strays.py"),
    ("deepseek-v32-tiny", "layers.0.index.write", "latent_write_strays.py"),
    ("deepseek-v32-tiny", "layers.0.index.topk", "indexer_batch_leak.py"),
    ("deepseek-v32-tiny", "layers.0.attn.sdpa", "ignores_selection.py"),  # reads what was not selected
]
CATCHERS = (gates.NUMERICS, gates.KV_ISOLATION, gates.QUALITY)


@pytest.fixture(scope="module", params=sorted(HONEST))
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, Controller]]:
    with Controller.start(request.param, backend="cpu", ctx=CTX, budget_s=60.0) as running:
        yield request.param, running


@pytest.mark.timeout(600)
def test_stock_state_kernels_pass_every_gate(engine: tuple[str, Controller]) -> None:
    name, running = engine
    groups = running.status()["groups"]
    for group in HONEST[name]:
        running.reset()
        stock = kernels_root() / groups[group]["kernel"]
        swap, report = running.try_candidate(group, stock, seed=3)
        assert swap.ok, (group, swap)
        assert report is not None and report.ok, (group, report.failed())
        isolation = report.gate(gates.KV_ISOLATION)
        assert isolation.verdict == "pass" and "guard regions zero" in isolation.cause, (group, isolation)


@pytest.mark.timeout(600)
def test_state_leaks_are_rejected(engine: tuple[str, Controller]) -> None:
    name, running = engine
    for model, group, file in LEAKS:
        if model != name:
            continue
        running.reset()
        swap, report = running.try_candidate(group, ADVERSARIAL / file, seed=5)
        assert swap.ok, (file, swap)
        assert report is not None and not report.ok, f"{file} on {group} passed every gate"
        failed = {g.name for g in report.failed()}
        assert failed & set(CATCHERS), (file, group, [(g.name, g.cause) for g in report.failed()])
        assert group not in running.accepted
    running.reset()
    assert running.verify(seed=7).ok  # the engine serves on, with the stock kernels
