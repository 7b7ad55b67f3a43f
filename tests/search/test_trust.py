"""Results, measurements and champions come only from the tune's trusted side. The board is a file that
agents write too (they post candidates there), so a pass written onto it, through the Board API or
straight into the SQLite file, is not a verdict: the tune takes a pass only from the pipes of its own
workers, and measures again what it finds passing on the board without one. A time a bundle carries is
a claim: a re-verified champion's time becomes the one measured here."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

from polymorph.search.agents import Proposal
from polymorph.search.board import Board
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry
from polymorph.search.tune import _Run
from polymorph.verify.tolerance import Tolerance

SIG = "rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])"
SCOPE = "b1-ctx16-32@0123456789ab"


def _run(tmp_path: Path) -> tuple[Board, _Run, int, int]:
    board = Board(tmp_path / "board.sqlite")
    run = _Run(board, "cpu", "cpu", SCOPE)
    ids = []
    for n in (1, 2):
        kernel = tmp_path / f"k{n}.py"
        kernel.write_text(f"IMPLEMENTS = 'rmsnorm'\n# {n}\n")
        ids.append(run.post(Proposal(SIG, "layers.0.norm", kernel, {}, "agent", "")))
    return board, run, ids[0], ids[1]


def test_a_pass_written_onto_the_board_is_not_a_verdict(tmp_path: Path) -> None:
    board, run, forged, honest = _run(tmp_path)
    # Anyone who can open the board can claim and post a result; the tune's worker names are no secret.
    assert board.claim("worker-b1-ctx16-32-1-0", 60.0, group_suffix=f"@{SCOPE}").id == forged
    board.post_result(
        forged, "worker-b1-ctx16-32-1-0", True, "", {"median_s": 1e-9}, {"numerics": {"ok": True}}
    )
    # ... or write the row straight into the SQLite file
    db = sqlite3.connect(board.path)
    db.execute("INSERT INTO results VALUES (?, 'w', 1, '', '{\"median_s\": 1e-9}', '{}', 0, 1)", (honest,))
    db.execute("UPDATE candidates SET state = 'done' WHERE id = ?", (honest,))
    db.commit()
    db.close()

    assert run.collect() == []  # neither counts
    assert run.inflight == 2
    # both are open again, to be measured by the tune's own workers
    assert {board.show(forged).state, board.show(honest).state} == {"open"}
    assert board.show(forged).result is None

    # what a worker of this run sends on its pipe is what counts
    receive, send = multiprocessing.get_context("spawn").Pipe(duplex=False)
    run.channels.append(receive)
    assert board.claim("worker-b1-ctx16-32-1-0", 60.0).id == forged
    send.send((forged, "worker-b1-ctx16-32-1-0", True, "", {"median_s": 2e-5, "trials": 3}, {}))
    board.post_result(forged, "worker-b1-ctx16-32-1-0", True, "", {"median_s": 2e-5}, {})
    ((p, r),) = run.collect()
    assert r.candidate == forged and r.ok and r.measurements["median_s"] == 2e-5
    send.close()
    board.close()


def test_a_failure_on_the_board_still_counts(tmp_path: Path) -> None:
    """Failures come from the board (a lost worker, a duplicate): forging one only harms the forger."""
    board, run, first, _ = _run(tmp_path)
    board.claim("w", 60.0)
    board.post_result(first, "w", False, "numerics: mismatch", {}, {})
    ((p, r),) = run.collect()
    assert r.candidate == first and not r.ok and r.cause == "numerics: mismatch"
    board.close()


def test_a_reverified_champion_keeps_the_time_measured_here(tmp_path: Path) -> None:
    key = ChampionKey(SIG, "b1-ctx16-32", "cpu", "t")
    reg = Registry(tmp_path / "r.sqlite")
    claimed = Champion(key=key, source="IMPLEMENTS = 'rmsnorm'\n", config={}, reasoning="", gates=("numerics",),
                       measurement=Measurement(1e-9, 0.0, 1), tolerance=Tolerance(0, 0))  # fmt: skip
    reg.offer(claimed)
    assert reg.remeasure(key, claimed.sha256, {}, Measurement(3e-5, 1e-6, 10))
    assert reg.best(key).measurement == Measurement(3e-5, 1e-6, 10)
    assert not reg.remeasure(key, "0" * 64, {}, Measurement(1e-5, 0.0, 1))  # another kernel: untouched
    honest = Champion(key=key, source="IMPLEMENTS = 'rmsnorm'\n# faster\n", config={}, reasoning="",
                      gates=("numerics",), measurement=Measurement(2e-5, 0.0, 3), tolerance=Tolerance(0, 0))  # fmt: skip
    assert reg.offer(honest).kept  # beats the measured time, which it never could beat the claimed one
    reg.close()
