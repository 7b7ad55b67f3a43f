"""The registry keeps champions for imported programs: a tune of a .pt2 records each op signature's
best kernel under its program bucket (the input shapes, `shape-4x8`), and a later tune of the same
program posts them back as warm starts, re-verified by the gates (never taken on trust), and does not
search a bucket they cover. Both tunes run on one engine started here (TuneOptions.engine), so the
test pays for one engine start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from polymorph.engine.controller import Controller
from polymorph.errors import UserError
from polymorph.search.board import Board
from polymorph.search.registry import ChampionKey, Registry, parse_program_bucket, program_bucket
from polymorph.search.tune import TuneOptions, tune


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).relu()


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(11)
    path = tmp_path_factory.mktemp("pt2") / "tiny.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(4, 8),), strict=False), str(path))
    return path


@pytest.fixture(scope="module")
def engine(program: Path) -> Any:
    with Controller.start(str(program), "cpu") as e:
        yield e


@pytest.fixture(scope="module")
def first(program: Path, engine: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The first tune: a fresh registry, a short budget (the stock kernels and a few configs)."""
    root = tmp_path_factory.mktemp("tune")
    registry = root / "registry.sqlite"
    report = tune(TuneOptions(model=str(program), budget_s=10.0, out=root / "first", registry=registry,
                              engine=engine, quiet=True))  # fmt: skip
    return registry, report


def test_program_bucket_ids_round_trip() -> None:
    assert program_bucket([(4, 3, 8), (4,), ()]) == "shape-4x3x8-4-s"
    assert parse_program_bucket("shape-4x3x8-4-s") == [(4, 3, 8), (4,), ()]
    ChampionKey("relu(f32[4,4])->(f32[4,4])", "shape-4x8", "cpu", "cpu: torch")  # a valid key
    with pytest.raises(UserError, match="nor an imported program's"):
        ChampionKey("relu(f32[4,4])->(f32[4,4])", "shape-4x", "cpu", "cpu: torch")


def test_a_program_tune_keeps_champions(first: tuple[Path, Any]) -> None:
    registry, report = first
    (bucket,) = report.buckets
    assert bucket.bucket == "shape-4x8"
    reg = Registry(registry)
    try:
        champions = reg.list()
    finally:
        reg.close()
    assert champions, f"no champion recorded: {bucket.stopped}; failed {bucket.failed}"
    assert {c.key.bucket for c in champions} == {"shape-4x8"}
    measured = {s.signature for s in bucket.signatures if s.best is not None}
    assert {c.key.op_signature for c in champions} == measured


def test_a_later_tune_re_verifies_them(
    program: Path, engine: Any, first: tuple[Path, Any], tmp_path: Path
) -> None:
    registry, _ = first
    reg = Registry(registry)
    try:
        kept = {(c.key.op_signature, c.sha256, tuple(sorted(c.config.items()))) for c in reg.list()}
    finally:
        reg.close()
    out = tmp_path / "second"
    report = tune(TuneOptions(model=str(program), budget_s=8.0, out=out, registry=registry, engine=engine,
                              quiet=True))  # fmt: skip
    (bucket,) = report.buckets
    board = Board(out / "board.sqlite")
    try:
        results = {r.candidate: r for r in board.results()}
        posted = board.candidates()
    finally:
        board.close()
    # Each champion was posted and gated here: as a registry warm start, or, where the champion is the
    # stock kernel and config itself (a short first tune may find nothing faster), as the baseline.
    for sig, sha, config in kept:
        same = [c for c in posted if c.sha256 == sha and tuple(sorted(c.config.items())) == config]
        assert same, f"{sig}: the champion was not posted again"
        assert any(c.agent in ("registry", "baseline") for c in same)
        r = results.get(same[0].id)
        assert r is not None and r.ok and r.gates, (sig, r and r.cause)
    if len(kept) == len(bucket.signatures):  # nothing searched: the champions cover the bucket
        assert {c.agent for c in posted} <= {"registry", "baseline"}
        assert bucket.skipped.startswith("every op signature has a champion"), bucket.skipped
