"""The message board: real SQLite files, real processes (spawned workers, one killed with SIGKILL; a
fork, in a fresh interpreter that holds no JAX or torch threads, inherits a board)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from polymorph.errors import UserError
from polymorph.pipeline.kernel_files import source_hash
from polymorph.search.board import WORKER_LOST, Board

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import board_processes by name
import board_processes
from board_processes import SPAWN

KERNEL = "IMPLEMENTS = 'rmsnorm'\nCONFIGS = [{'block': 128}]\n"


@pytest.fixture
def board(tmp_path: Path) -> Board:
    return Board(tmp_path / "board.sqlite")


def post(board: Board, n: int = 0, **kw) -> int:
    args = dict(
        group=f"layers.{n}.attn.norm", backend="cpu", target="cpu", source=KERNEL, config={"block": 128}
    )
    args.update(kw)
    return board.post(**args)


def assert_one_line(e: pytest.ExceptionInfo[UserError], *needles: str) -> None:
    text = str(e.value)
    assert "\n" not in text and text.strip() == text and text
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"


# --- one process -------------------------------------------------------------------------------------


def test_post_claim_result_round_trip(board: Board) -> None:
    cid = post(board, agent="rmsnorm-agent", reasoning="wider rows per program")
    c = board.show(cid)
    assert (c.state, c.kind, c.source, c.config) == ("open", "kernel", KERNEL, {"block": 128})
    assert c.sha256 == source_hash(KERNEL.encode())
    assert (c.agent, c.reasoning, c.attempts, c.result) == (
        "rmsnorm-agent",
        "wider rows per program",
        0,
        None,
    )

    claimed = board.claim("w1", lease_s=30)
    assert claimed is not None and claimed.id == cid
    assert (claimed.state, claimed.worker, claimed.attempts) == ("claimed", "w1", 1)
    assert claimed.lease_until is not None and claimed.lease_until > time.time() + 20
    assert board.claim("w2", lease_s=30) is None  # held, not expired

    assert board.post_result(cid, "w1", True, "", {"median_s": 2e-5, "spread_s": 1e-7}, {"numerics": "ok"})
    done = board.show(cid)
    assert done.state == "done" and done.result is not None
    assert (done.result.ok, done.result.worker, done.result.measurements["median_s"]) == (True, "w1", 2e-5)
    assert done.result.gates == {"numerics": "ok"}
    assert board.wait(cid, timeout=0) == done.result
    assert board.claim("w2", lease_s=30) is None


def test_duplicates_are_posted_once_and_measured_once(board: Board) -> None:
    first = post(board, config={"block": 128, "warps": 4})
    # Same bytes (given as bytes), the same config with its keys in another order: the same candidate.
    again = post(board, source=KERNEL.encode(), config={"warps": 4, "block": 128}, agent="other")
    assert again == first
    assert post(board, config={"block": 256, "warps": 4}) != first  # another config
    assert post(board, n=1, config={"block": 128, "warps": 4}) != first  # another group
    assert post(board, target="h200", backend="cuda", config={"block": 128, "warps": 4}) != first
    assert post(board, source=KERNEL + "# v2\n", config={"block": 128, "warps": 4}) != first
    cfg = board.post(group="layers.0.attn.norm", backend="cpu", target="cpu", config={"block": 64})
    assert board.post(group="layers.0.attn.norm", backend="cpu", target="cpu", config={"block": 64}) == cfg
    assert board.show(cfg).kind == "config" and board.show(cfg).sha256 is None
    assert [c.id for c in board.candidates()] == [first, first + 1, first + 2, first + 3, first + 4, cfg]

    claimed = []
    while (c := board.claim("w", lease_s=30)) is not None:
        claimed.append(c.id)
        board.post_result(c.id, "w", True, "", {"median_s": 1e-3}, {})
    assert sorted(claimed) == [c.id for c in board.candidates()]  # each exactly once
    assert post(board, config={"block": 128, "warps": 4}) == first  # posted after it was measured
    assert board.claim("w", lease_s=30) is None
    assert len(board.results()) == 6


def test_adopt_readdresses_an_open_post_into_a_scope(board: Board) -> None:
    """A tune run takes a post for a bare group into its scope: its workers (group suffix) claim it."""
    cid = post(board, group="layers.0.attn.norm", agent="outside")
    assert board.claim("w", lease_s=30, group_suffix="@b1@abc") is None
    assert board.adopt(cid, "layers.0.attn.norm@b1@abc") == cid
    c = board.show(cid)
    assert (c.group, c.state, c.agent, c.source) == ("layers.0.attn.norm@b1@abc", "open", "outside", KERNEL)
    claimed = board.claim("w", lease_s=30, group_suffix="@b1@abc")
    assert claimed is not None and claimed.id == cid
    with pytest.raises(UserError, match="not open"):
        board.adopt(cid, "elsewhere")


def test_adopt_gives_a_config_post_its_kernel_and_sends_a_duplicate_to_the_first(board: Board) -> None:
    config_only = board.post(group="layers.0.attn.norm", backend="cpu", target="cpu", config={"block": 128})
    assert board.show(config_only).kind == "config"
    assert board.adopt(config_only, "layers.0.attn.norm@s", source=KERNEL) == config_only
    c = board.show(config_only)
    assert (c.kind, c.source, c.config) == ("kernel", KERNEL, {"block": 128})
    # The same file and config, posted bare again: it is the adopted one, measured once.
    again = post(board, group="layers.0.attn.norm")
    assert board.adopt(again, "layers.0.attn.norm@s") == config_only
    result = board.wait(again, timeout=0)
    assert result is not None and not result.ok and f"candidate {config_only}" in result.cause


def test_claim_filters_by_backend_and_target(board: Board) -> None:
    cpu = post(board)
    gpu = post(board, backend="cuda", target="h200")
    c = board.claim("h200-worker", 30, backend="cuda", target="h200")
    assert c is not None and c.id == gpu
    assert board.claim("h200-worker", 30, backend="cuda", target="h200") is None
    c = board.claim("cpu-worker", 30, target="cpu")
    assert c is not None and c.id == cpu


def test_heartbeat_keeps_the_lease_and_a_lost_lease_is_reported(board: Board) -> None:
    cid = post(board)
    board.claim("w1", lease_s=1.0)
    for _ in range(4):  # 1.2 s in all, longer than the lease
        time.sleep(0.3)
        assert board.heartbeat(cid, "w1")
        assert board.claim("w2", lease_s=1.0) is None
    assert not board.heartbeat(cid, "w2")  # not its claim
    time.sleep(1.05)  # w1 stops beating: its lease runs out and w2 takes the candidate
    c = board.claim("w2", lease_s=30)
    assert c is not None and (c.id, c.worker, c.attempts) == (cid, "w2", 2)
    assert not board.heartbeat(cid, "w1")
    assert not board.post_result(cid, "w1", True, "", {"median_s": 1.0}, {})  # w1's late result is refused
    assert board.post_result(cid, "w2", False, "numerics: max abs err 0.5", {}, {"numerics": "failed"})
    r = board.show(cid).result
    assert r is not None and (r.worker, r.ok, r.cause, r.attempts) == (
        "w2",
        False,
        "numerics: max abs err 0.5",
        2,
    )
    assert not board.heartbeat(cid, "w2")  # done


def test_claims_that_run_out_max_attempts_times_fail_as_worker_lost(tmp_path: Path) -> None:
    board = Board(tmp_path / "board.sqlite", max_attempts=2)
    cid = post(board)
    waiting = post(board, n=1)
    assert board.claim("w1", lease_s=0.1).id == cid
    time.sleep(0.15)
    assert board.claim("w2", lease_s=0.1).id == cid  # second and last attempt
    time.sleep(0.15)
    # w3 finds the first candidate out of attempts (recorded as failed) and gets the next one.
    c = board.claim("w3", lease_s=30)
    assert c is not None and c.id == waiting
    r = board.wait(cid, timeout=0)
    assert r is not None and not r.ok and r.cause.startswith(WORKER_LOST) and r.attempts == 2
    assert board.results(ok=False) == [r]


def test_wait_records_a_lost_worker_without_another_claim(tmp_path: Path) -> None:
    board = Board(tmp_path / "board.sqlite", max_attempts=1)
    cid = post(board)
    board.claim("w1", lease_s=0.5)
    assert board.wait(cid, timeout=0.02) is None  # still within the lease
    r = board.wait(cid, timeout=5)
    assert r is not None and r.cause.startswith(WORKER_LOST) and r.worker == "w1"


def test_results_filter_by_group_verdict_and_id(board: Board) -> None:
    ids = [post(board, n=i) for i in range(4)]
    for i in ids:
        board.claim("w", 30)
        ok = i % 2 == 0
        board.post_result(i, "w", ok, "" if ok else "kv isolation", {"median_s": i * 1e-3} if ok else {}, {})
    assert [r.candidate for r in board.results()] == ids
    assert [r.candidate for r in board.results(ok=True)] == [i for i in ids if i % 2 == 0]
    assert [r.candidate for r in board.results(ok=False)] == [i for i in ids if i % 2 == 1]
    assert [r.candidate for r in board.results(group="layers.2.attn.norm")] == [ids[2]]
    assert [r.candidate for r in board.results(after=ids[1])] == ids[2:]


def test_the_file_is_wal_and_outlives_the_board_object(tmp_path: Path) -> None:
    path = tmp_path / "board.sqlite"
    board = Board(path)
    cid = post(board)
    board.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert Board(path).show(cid).source == KERNEL


# --- bad input ---------------------------------------------------------------------------------------


def test_unknown_candidate_id_is_one_line(board: Board) -> None:
    cid = post(board)
    with pytest.raises(UserError) as e:
        board.show(cid + 41)
    assert_one_line(e, f"no candidate {cid + 41}", str(board.path), "ids run 1..1")
    for call in (
        lambda: board.wait(99, 0),
        lambda: board.heartbeat(99, "w"),
        lambda: board.post_result(99, "w", False, "x", {}, {}),
    ):
        with pytest.raises(UserError) as e:
            call()
        assert_one_line(e, "no candidate 99")


@pytest.mark.parametrize(
    "change, needles",
    [
        (dict(target="h9000"), ("unknown chip `h9000`", "h200")),
        (dict(backend="tpu"), ("unknown backend `tpu`", "cpu")),
        (dict(group=""), ("node group id",)),
        (dict(source=None, config=None), ("needs a kernel file's source, a config, or both",)),
        (dict(source="  \n"), ("kernel source is empty",)),
        (dict(source=b"\xff\xfe"), ("not UTF-8",)),
        (dict(config={"block": {1, 2}}), ("config is not plain JSON",)),
        (dict(config=[1, 2]), ("config must be a JSON object",)),
    ],
)
def test_bad_posts_are_one_line(board: Board, change: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(UserError) as e:
        post(board, **change)
    assert_one_line(e, *needles)
    assert board.candidates() == []


def test_bad_worker_calls_are_one_line(board: Board) -> None:
    cid = post(board)
    with pytest.raises(UserError) as e:
        board.claim("w", lease_s=0)
    assert_one_line(e, "lease_s", "> 0")
    board.claim("w", 30)
    with pytest.raises(UserError) as e:
        board.post_result(cid, "w", True, "", {"spread_s": 1.0}, {})
    assert_one_line(e, "median_s")
    with pytest.raises(UserError) as e:
        board.post_result(cid, "w", False, "", {}, {})
    assert_one_line(e, "needs its cause")
    with pytest.raises(UserError) as e:
        board.wait(cid, timeout=-1)
    assert_one_line(e, "timeout")


def test_a_file_that_is_not_a_board_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(UserError) as e:
        Board(path)
    assert_one_line(e, str(path), "not a SQLite file")
    with pytest.raises(UserError) as e:
        Board(tmp_path / "missing" / "board.sqlite")
    assert_one_line(e, "does not exist")


# --- several processes -------------------------------------------------------------------------------


def test_two_processes_never_claim_the_same_candidate(board: Board) -> None:
    posted = [post(board, n=i) for i in range(100)]
    ids, start = SPAWN.Queue(), SPAWN.Barrier(2)
    workers = [
        SPAWN.Process(target=board_processes.drain, args=(board.path, f"worker-{k}", start, ids))
        for k in range(2)
    ]
    for p in workers:
        p.start()
    got = dict(ids.get(timeout=120) for _ in workers)
    for p in workers:
        p.join(timeout=30)
        assert p.exitcode == 0
    a, b = got["worker-0"], got["worker-1"]
    assert not set(a) & set(b)
    assert sorted(a + b) == posted
    # Both did work (each claim is its own transaction), and the parent's own connection, opened
    # before they started, still works.
    assert a and b, got
    results = board.results()
    assert [r.candidate for r in results] == posted
    assert all(r.worker == ("worker-0" if r.candidate in a else "worker-1") for r in results)
    assert all(r.attempts == 1 for r in results)


def test_a_killed_workers_claim_is_retried_by_another(board: Board) -> None:
    cid = post(board)
    claimed = SPAWN.Queue()
    board.show(cid)  # the parent's connection is open while the worker claims
    p = SPAWN.Process(target=board_processes.claim_and_hang, args=(board.path, claimed))
    p.start()
    assert claimed.get(timeout=120) == cid
    os.kill(p.pid, signal.SIGKILL)
    p.join(timeout=10)
    assert p.exitcode == -signal.SIGKILL
    held = board.show(cid)
    assert (held.state, held.worker, held.attempts) == ("claimed", "doomed", 1)
    # The dead worker's lease still runs: nobody may take the candidate yet.
    if time.time() < held.lease_until - 0.2:
        assert board.claim("rescuer", lease_s=30) is None
    time.sleep(max(0.0, held.lease_until - time.time()) + 0.05)
    c = board.claim("rescuer", lease_s=30)
    assert c is not None and (c.id, c.worker, c.attempts) == (cid, "rescuer", 2)
    assert board.post_result(cid, "rescuer", True, "", {"median_s": 3e-4}, {"numerics": "ok"})
    r = board.wait(cid, timeout=0)
    assert r is not None and (r.ok, r.worker, r.attempts, r.group) == (
        True,
        "rescuer",
        2,
        "layers.0.attn.norm",
    )


def test_wait_sees_a_result_from_another_process(board: Board) -> None:
    cid = post(board)
    p = SPAWN.Process(target=board_processes.post_result_later, args=(board.path, cid))
    p.start()
    r = board.wait(cid, timeout=120)
    p.join(timeout=10)
    assert r is not None and (r.worker, r.measurements) == ("slow", {"median_s": 5e-4})


FORKED = textwrap.dedent("""
    import os, sys
    from polymorph.search.board import Board
    assert "jax" not in sys.modules  # a fork is safe here: no JAX threads
    board, cid = Board(sys.argv[1]), int(sys.argv[2])
    board.show(cid)  # the parent's connection is open when it forks
    pid = os.fork()
    if pid == 0:  # the inherited Board object must open a connection of its own
        c = board.claim("child", lease_s=60)
        os._exit(0 if c is not None and c.id == cid else 3)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    held = board.show(cid)  # the parent's connection still works, its locks intact
    assert (held.state, held.worker) == ("claimed", "child"), held
    print("inherited", held.id)
""")


def test_a_board_inherited_through_fork_opens_its_own_connection(board: Board) -> None:
    """Forking with a board open: in a fresh interpreter, not this one, which may hold JAX (whose
    threads make a fork deadlock-prone) by the time this runs."""
    cid = post(board)
    done = subprocess.run([sys.executable, "-c", FORKED, str(board.path), str(cid)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["inherited", str(cid)], done.stderr
    assert (board.show(cid).state, board.show(cid).worker) == ("claimed", "child")


def test_threads_sharing_one_board_object_never_claim_the_same_candidate(board: Board) -> None:
    posted = [post(board, n=i) for i in range(40)]
    claims: dict[str, list[int]] = {}

    def drain(worker: str) -> None:
        mine = claims.setdefault(worker, [])
        while (c := board.claim(worker, lease_s=60)) is not None:
            mine.append(c.id)
            time.sleep(0.002)
            board.post_result(c.id, worker, True, "", {"median_s": 1e-3}, {})

    threads = [threading.Thread(target=drain, args=(f"thread-{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    everything = [i for ids in claims.values() for i in ids]
    assert sorted(everything) == posted  # each candidate claimed exactly once
    assert [r.candidate for r in board.results()] == posted
