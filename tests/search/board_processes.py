"""What the board and registry tests run in other processes, started with the `spawn` method.

Not `fork`: the test process may hold JAX (multithreaded: it warns that a fork will likely deadlock)
or torch threads by the time these run. A spawned child imports this module by name (the tests put
its folder on sys.path, which a spawned child inherits), so it stays small: the board, the registry,
and nothing the tests themselves import.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from polymorph.search.board import Board
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry
from polymorph.verify.tolerance import Tolerance

SPAWN = multiprocessing.get_context("spawn")


def drain(path: Path, worker: str, start: multiprocessing.Barrier, ids: multiprocessing.Queue) -> None:
    board = Board(path)
    claimed = []
    start.wait(timeout=60)  # both claim from the start, so their transactions interleave
    while (c := board.claim(worker, lease_s=60)) is not None:
        claimed.append(c.id)
        time.sleep(0.005)  # the measurement (SQLite's lock is not fair: without a pause one worker
        # could take every claim while the other backs off, and the test would prove less)
        assert board.post_result(c.id, worker, True, "", {"median_s": 1e-3 * c.id}, {"numerics": "ok"})
    ids.put((worker, claimed))


def claim_and_hang(path: Path, claimed: multiprocessing.Queue) -> None:
    c = Board(path).claim("doomed", lease_s=1.0)
    claimed.put(None if c is None else c.id)
    time.sleep(120)


def post_result_later(path: Path, cid: int) -> None:
    board = Board(path)
    c = board.claim("slow", lease_s=30)
    assert c is not None and c.id == cid
    time.sleep(0.3)
    board.post_result(cid, "slow", True, "", {"median_s": 5e-4}, {})


def offer_many(path: Path, key: ChampionKey, source: str, medians: list[float]) -> None:
    reg = Registry(path)
    for m in medians:
        reg.offer(
            Champion(key=key, source=f"{source}# {m}\n", config={"block": 128},
                     measurement=Measurement(m, m / 50, 20), gates=("numerics", "kv-isolation"),
                     tolerance=Tolerance(1e-4, 1e-5), reasoning="one program per row keeps the row in registers",
                     agent="rmsnorm-agent", kernel="torch/rmsnorm.py", created=1.8e9)
        )  # fmt: skip
