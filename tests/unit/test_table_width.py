"""`polymorph board results` and `polymorph registry list` fit 80 columns on a non-terminal output,
long cells cut with `...` (the full text stays in `board show` / `registry show`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from polymorph.cli import main
from polymorph.knobs import knobs
from polymorph.search.board import Board
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry
from polymorph.verify.tolerance import Tolerance

KERNEL = "IMPLEMENTS = 'rmsnorm'\nCONFIGS = [{'block': 128}]\n"
GROUP = "layers.17.mlp.down+residual@b16-ctx2048-4096@0123456789ab"
CAUSE = "timing.checked: the candidate's output differed from the reference on a checked call " * 2
SIGNATURE = "linear+residual(f32[batch,seq,2048],f32[2048,8192],f32[batch,seq,2048])->(f32[batch,seq,2048])"


def table(out: str) -> list[str]:
    """The header and rows of the one plain table in `out`."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ")) + 1
    return [line for line in lines[start:] if "\t" in line]


def test_board_results_fit_80_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "board.sqlite"
    board = Board(db)
    ok = board.post(group=GROUP, backend="cpu", target="cpu", source=KERNEL, agent="a", reasoning="r")
    bad = board.post(
        group=GROUP, backend="cpu", target="cpu", source=KERNEL + "#\n", agent="a", reasoning="r"
    )
    for cid, passed in ((ok, True), (bad, False)):
        assert board.claim("worker-with-a-long-name-0", 30) is not None
        board.post_result(cid, "worker-with-a-long-name-0", passed, "" if passed else CAUSE,
                          {"median_s": 2.5e-5, "spread_s": 1e-7} if passed else {}, {})  # fmt: skip
    board.close()
    with knobs.scope(plain=True):
        assert main(["board", "results", "--board", str(db)]) == 0
    lines = table(capsys.readouterr().out)
    assert lines[0].split("\t") == ["id", "group", "result", "median", "max-min", "worker", "cause"]
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert "..." in lines[2] and lines[2].split("\t")[-1].startswith("timing.checked")


def test_registry_list_fits_80_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "registry.sqlite"
    reg = Registry(path)
    for i, bucket in enumerate(("b16-ctx2048-4096", "b1-ctx512-1024")):
        champ = Champion(
            key=ChampionKey(SIGNATURE, bucket, "h200", "cuda 13.0, triton 3.9.0, torch 2.13.0+cu130"),
            source=KERNEL + f"# {i}\n", config={"block": 128}, measurement=Measurement(1e-5, 1e-7, 20),
            gates=("numerics",), tolerance=Tolerance(1e-4, 1e-5), reasoning="rows in registers " * 20,
            agent="config-neighbourhood-search", kernel="my_rmsnorm.py",
        )  # fmt: skip
        reg.offer(champ)
    demoted = champ
    sha = hashlib.sha256(demoted.source.encode()).hexdigest()
    reg.demote(demoted.key, sha, demoted.config, CAUSE)
    reg.close()
    with knobs.scope(plain=True):
        assert main(["registry", "list", "--registry", str(path)]) == 0
    out = capsys.readouterr().out
    lines = table(out)
    assert lines[0].split("\t")[5:] == ["median", "state"]
    assert len(lines) == 3 and all(len(line) <= 80 for line in out.splitlines()[1:]), out
    assert all("..." in line for line in lines[1:]) and lines[2].split("\t")[-1] == "demoted"
    cause = " ".join(out.split("\n", 4)[-1].split())  # the lines after the table, unwrapped
    assert " ".join(CAUSE.split()) in cause  # the demotion's cause in full, below the table
