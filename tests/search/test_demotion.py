"""A champion that a bundle (or a warm start) brings is a claim, not a verdict: a tune re-verifies it,
and one that fails there is demoted (kept on the record with its cause, never again a champion, never
taken back from the same bundle) and its op signature is tuned again in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polymorph import api
from polymorph.cli import main
from polymorph.search.board import Board
from polymorph.search.registry import (
    Champion,
    ChampionKey,
    Measurement,
    Registry,
    shape_bucket_at,
)
from polymorph.search.space import group_spaces, predicted_times, toolchain
from polymorph.search.tune import TuneOptions, tune
from polymorph.verify.tolerance import Tolerance

# Appended to a stock kernel: it runs, then adds 1 to every output (wrong numbers, plausible speed).
WRONG = """

_honest_build = build


def build(spec, config, target):
    launch = _honest_build(spec, config, target)

    def forged(inputs, outputs, scratch):
        launch(inputs, outputs, scratch)
        for out in outputs:
            out.add_(1)

    return forged
"""
BATCH, CTX = 1, 32


def forged_bundle(tmp_path: Path) -> tuple[Path, list[ChampionKey]]:
    """A bundle with a wrong, impossibly fast champion for every op signature of llama-tiny at the
    tune's bucket on this machine: the bucket is 'covered', so today's tune would skip it."""
    artifact = api.lower("llama-tiny", "cpu", batch=BATCH, ctx=CTX)
    spaces = group_spaces(artifact.plan, "torch", predicted_times(artifact.report)).spaces
    source = Registry(tmp_path / "forger.sqlite")
    keys = []
    for space in spaces:
        key = ChampionKey(space.signature, shape_bucket_at(BATCH, CTX), "cpu", toolchain("cpu"))
        source.offer(Champion(key=key, source=space.stock_kernel.read_text() + WRONG, config=dict(space.stock_config),
                              measurement=Measurement(1e-9, 0.0, 10), gates=("numerics", "kv-isolation"),
                              tolerance=Tolerance(1e-4, 1e-5), reasoning="trust me", agent="forger"))  # fmt: skip
        keys.append(key)
    bundle = tmp_path / "forged.json"
    source.export_bundle(bundle)
    source.close()
    return bundle, keys


@pytest.mark.slow
def test_a_forged_champion_is_demoted_and_its_bucket_tuned_again(tmp_path: Path, capsys) -> None:
    bundle, keys = forged_bundle(tmp_path)
    reg_path = tmp_path / "registry.sqlite"
    assert main(["registry", "import", str(bundle), "--registry", str(reg_path)]) == 0
    capsys.readouterr()

    out = tmp_path / "run"
    # 60 s: a stock baseline and a forged champion for each of 12 signatures come first, at up to 2 s a
    # candidate on a loaded 2-core machine (40 s left the last forged champions unverified there).
    report = tune(TuneOptions(model="llama-tiny", batch=BATCH, ctx=CTX, budget_s=60, workers=1, out=out,
                              registry=reg_path, trials=3, ab_trials=2, lease_s=20))  # fmt: skip
    (bucket,) = report.buckets
    assert not bucket.skipped  # covered by the forged champions, and searched all the same
    assert bucket.demoted, bucket.failed

    reg = Registry(reg_path)
    demoted = {d.champion.key: d for d in reg.demoted()}
    forged_left = [ch for ch in reg.list() if ch.agent == "forger"]
    reg.close()
    assert demoted and not forged_left, (bucket.demoted, forged_left)  # not one forged champion stays
    for key, d in demoted.items():
        assert key in keys and d.champion.agent == "forger" and "re-verification" in d.cause
    again = Registry(reg_path)
    for key in demoted:
        best = again.best(key)
        assert best is None or best.agent != "forger"  # a champion from this run, or none
        assert all(ch.agent != "forger" for ch in again.related(key, ["cpu"]))
    again.close()

    # the demoted signatures were searched in this run: the built-in agents' proposals were measured
    board = Board(out / "board.sqlite")
    searched = [
        c for c in board.candidates() if c.agent not in ("baseline", "registry") and c.state == "done"
    ]
    board.close()
    assert searched, "no candidate of the built-in agents was measured"

    # `registry list` shows them demoted, with the cause; importing the same bundle does not bring them back
    assert main(["registry", "list", "--registry", str(reg_path)]) == 0
    listed = capsys.readouterr().out
    assert listed.count("demoted") >= len(demoted) and "re-verification" in listed
    assert main(["registry", "import", str(bundle), "--registry", str(reg_path)]) == 0
    assert f"{len(demoted)} refused" in capsys.readouterr().out
    reg = Registry(reg_path)
    assert not [ch for ch in reg.list() if ch.agent == "forger"]
    reg.close()
    report_json = json.loads((out / "tune-report.json").read_text())
    assert report_json["buckets"][0]["demoted"]


def test_demote_moves_only_the_champion_that_failed(tmp_path: Path) -> None:
    key = ChampionKey("rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])", "b1-ctx16-32", "cpu", "t")
    reg = Registry(tmp_path / "r.sqlite")

    def champ(src: str, median: float) -> Champion:
        return Champion(key=key, source=f"IMPLEMENTS = 'rmsnorm'\n# {src}\n", config={}, reasoning="",
                        measurement=Measurement(median, 0.0, 1), gates=("numerics",), tolerance=Tolerance(0, 0))  # fmt: skip

    old = champ("old", 2e-5)
    reg.offer(old)
    faster = champ("faster", 1e-5)
    reg.offer(faster)  # offered after the old one was posted for re-verification
    assert not reg.demote(key, old.sha256, old.config, "numerics: wrong")  # not the champion any more
    assert reg.best(key) == faster and reg.demoted() == []
    assert reg.demote(key, faster.sha256, faster.config, "numerics: wrong")
    assert reg.best(key) is None and reg.list() == []
    (d,) = reg.demoted()
    assert d.champion == faster and d.cause == "numerics: wrong"
    reg.close()
