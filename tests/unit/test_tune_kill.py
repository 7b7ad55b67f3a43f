"""`kill -9` of a running `polymorph tune` leaves no process behind (its tune workers, their engine
workers, the multiprocessing resource tracker), and a rerun with the same --out resumes: it exits 0, and
what the board and the registry held is still there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from polymorph.search.board import Board
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry
from polymorph.verify.tolerance import Tolerance

pytestmark = pytest.mark.slow

MARK = "POLYMORPH_TEST_TUNE_KILL"  # not a knob: a tag in the environment of every process of the tree
TUNE = ["-m", "polymorph", "tune", "llama-tiny", "--backend", "cpu", "--batch", "1", "--ctx", "32"]


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live descendant of `root`, by /proc ppid chains."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
            starts[pid] = st[1]
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = starts[pid]
        todo += children.get(pid, [])
    return out


def marked(token: str) -> dict[int, int]:
    """pid -> start time of every live process whose environment carries MARK=token."""
    needle = f"{MARK}={token}".encode()
    out = {}
    for pid in _pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        st = _stat(pid)
        if needle in env and st is not None:
            out[pid] = st[1]
    return out


def alive(procs: dict[int, int]) -> dict[int, str]:
    """pid -> command line of those of `procs` still running (the same process: same start time)."""
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[1] == start and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            except OSError:
                out[pid] = "?"
    return out


def wait_until_gone(procs: dict[int, int], token: str, limit_s: float = 90.0) -> dict[int, str]:
    """Poll until none of `procs` and no process tagged `token` runs; what still runs at the limit."""
    deadline = time.monotonic() + limit_s
    while True:
        left = alive({**procs, **marked(token)})
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_kill_9_of_tune_leaves_no_process_and_a_rerun_resumes(tmp_path: Path) -> None:
    out, reg_path, log = tmp_path / "run", tmp_path / "registry.sqlite", tmp_path / "tune.log"
    # what the registry already has: a champion of another bucket, which no run here may lose
    kept = ChampionKey(
        "rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])", "b8-ctx512-1024", "cpu", "t"
    )
    reg = Registry(reg_path)
    reg.offer(Champion(key=kept, source="IMPLEMENTS = 'rmsnorm'\n", config={}, reasoning="kept",
                       measurement=Measurement(1e-5, 0.0, 3), gates=("numerics",), tolerance=Tolerance(0, 0)))  # fmt: skip
    reg.close()
    token = uuid.uuid4().hex
    env = {**os.environ, MARK: token}
    argv = [sys.executable, *TUNE, "--workers", "2", "--out", str(out), "--registry", str(reg_path)]

    with open(log, "w") as f:
        tune = subprocess.Popen([*argv, "--budget", "300s"], env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        # Wait until a worker has its engine up and holds a candidate: the whole tree is there then.
        deadline = time.monotonic() + 240
        done_before: set[int] = set()
        while True:
            assert tune.poll() is None, f"the tune ended before it was killed: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no worker claimed a candidate in 240 s"
            if (out / "board.sqlite").exists():
                board = Board(out / "board.sqlite")
                states = {c.id: c.state for c in board.candidates()}
                board.close()
                if any(s in ("claimed", "done") for s in states.values()):
                    done_before = {cid for cid, s in states.items() if s == "done"}
                    break
            time.sleep(0.5)
        tree = descendants(tune.pid)
        assert len(tree) >= 3, tree  # two tune workers and at least one engine worker (and a tracker)
    finally:
        tune.send_signal(signal.SIGKILL)
        tune.wait()

    left = wait_until_gone(tree, token)
    _kill(left)  # this test's own processes: a failure here must not leave them running
    assert not left, f"processes of the killed tune still run: {left}"

    # the rerun into the same --out resumes: exit 0, the board's and the registry's records are kept
    rerun = subprocess.run([*argv, "--budget", "40s"], env=env, capture_output=True, text=True, timeout=280)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "plan written" in rerun.stdout
    board = Board(out / "board.sqlite")
    states = {c.id: c.state for c in board.candidates()}
    board.close()
    assert done_before <= {cid for cid, s in states.items() if s == "done"}
    reg = Registry(reg_path)
    assert reg.best(kept) is not None
    reg.close()
    left = wait_until_gone({}, token)
    _kill(left)
    assert not left, f"the rerun left processes behind: {left}"


def _kill(procs: dict[int, str]) -> None:
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
