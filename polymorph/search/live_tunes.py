"""What a running tune tells agents outside it: its node groups, their specs, stock kernels, configs,
shares of the step and roofline floors, kept in the board's own SQLite file (component "tunes").

`polymorph tune` publishes one row per bucket it tunes (`publish_tune`), before its workers start;
`polymorph mcp` reads them (`LiveTunes.list`) so that an agent can see what it may post to without
compiling the model itself. The row is information only: the tune never reads it back, and nothing
in it decides a verdict (a forged row can only mislead the agent that reads it, as a forged board
result could). Measured times are not here: they are the board's results for the tune's baseline.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.search.board import SqliteFile, canonical_json

_SCHEMA = """
CREATE TABLE tunes (
    scope TEXT PRIMARY KEY,   -- bucket@graph-hash: the suffix of the board groups of this run
    model TEXT NOT NULL,
    backend TEXT NOT NULL,
    profile TEXT NOT NULL,
    bucket TEXT NOT NULL,
    toolchain TEXT NOT NULL,
    pid INTEGER NOT NULL,     -- the tune process: running while it lives and the budget lasts
    started REAL NOT NULL,
    ends_by REAL NOT NULL,
    waits_for_posts INTEGER NOT NULL,
    spaces TEXT NOT NULL      -- JSON: one object per op signature (see `space_record`)
)
"""


@dataclass(frozen=True)
class LiveTune:
    scope: str
    model: str
    backend: str
    profile: str
    bucket: str
    toolchain: str
    pid: int
    started: float
    ends_by: float
    waits_for_posts: bool
    spaces: list[dict[str, Any]]

    @property
    def running(self) -> bool:
        """The tune's process lives and its budget has not run out (a reused pid only misleads until
        `ends_by`)."""
        if time.time() > self.ends_by:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class LiveTunes:
    """The tunes published in the board file at `path`."""

    VERSION = 1

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteFile(path, "tunes", self.VERSION, _SCHEMA, "board")

    def publish(self, tune: LiveTune) -> None:
        row = (tune.scope, tune.model, tune.backend, tune.profile, tune.bucket, tune.toolchain, tune.pid,
               tune.started, tune.ends_by, int(tune.waits_for_posts), canonical_json(tune.spaces, "the spaces"))  # fmt: skip
        with self._db.write() as c:
            c.execute("INSERT OR REPLACE INTO tunes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def list(self) -> list[LiveTune]:
        """Every published tune, the latest started first."""
        with self._db.read() as c:
            rows = c.execute("SELECT * FROM tunes ORDER BY started DESC").fetchall()
        return [
            LiveTune(
                r["scope"],
                r["model"],
                r["backend"],
                r["profile"],
                r["bucket"],
                r["toolchain"],
                r["pid"],
                r["started"],
                r["ends_by"],
                bool(r["waits_for_posts"]),
                json.loads(r["spaces"]),
            )
            for r in rows
        ]

    def close(self) -> None:
        self._db.close()


def spec_record(spec: Any) -> dict[str, Any]:
    """A KernelSpec as plain JSON: the pattern, each node (op, inputs, outputs, attrs), and the shape
    and dtype of every value it reads or writes, in the order `launch(inputs, outputs, scratch)` gets."""

    def tensor(name: str) -> dict[str, Any]:
        t = spec.types[name]
        return {
            "name": name,
            "shape": [d if isinstance(d, int) else str(d) for d in t.shape],
            "dtype": str(t.dtype),
        }

    nodes = [{"name": n.name, "op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
              "attrs": {k: _plain(v) for k, v in dict(n.attrs).items()}} for n in spec.nodes]  # fmt: skip
    inner = sorted({v for n in spec.nodes for v in n.outputs} - set(spec.outputs))
    return {"pattern": spec.pattern, "target": str(spec.target), "nodes": nodes,
            "inputs": [tensor(v) for v in spec.inputs], "outputs": [tensor(v) for v in spec.outputs],
            "intermediates": [tensor(v) for v in inner if v in spec.types],
            "roles": {step: list(names) for step, names in spec.roles}}  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def publish_tune(board: Any, opts: Any, profile: str, bucket: str, scope: str, spaces: Any, report: Any,
                 budget_s: float, toolchain: str) -> None:  # fmt: skip
    """Record what the tune of `bucket` searches (`spaces`, a search.space.PlanSpaces) in `board`'s file.
    A failure to record is one warning line: agents outside then see no groups, the tune goes on."""
    from polymorph.cli import console
    from polymorph.pipeline.lowering import kernel_spec
    from polymorph.search.space import library_path

    try:
        graph, types = spaces.plan.concrete()
        by_id = {g.id: g for g in spaces.plan.groups}
        kernels = {k.group: k for k in report.kernels}
        target = spaces.plan.kernel_target()
        records = []
        for s in spaces.spaces:
            k = kernels.get(s.group)
            floor = None if k is None else k.floor_s if k.floor_s is not None else k.predicted_s
            records.append({
                "signature": s.signature, "group": s.group, "groups": list(s.groups), "pattern": s.pattern,
                "share": s.share, "stock_kernel": library_path(s.stock_kernel), "stock_config": dict(s.stock_config),
                "configs": [dict(c) for c in s.configs], "alternatives": [library_path(p) for p, _ in s.alternatives],
                "floor_s": floor, "bound": None if k is None else k.bound,
                "flops": None if k is None else k.flops, "bytes": None if k is None else k.bytes,
                "spec": spec_record(kernel_spec(graph, by_id[s.group], types, target)),
            })  # fmt: skip
        now = time.time()
        live = LiveTunes(board.path)
        live.publish(LiveTune(scope, opts.model, opts.backend, profile, bucket, toolchain, os.getpid(), now,
                              now + budget_s, bool(opts.wait_for_posts), records))  # fmt: skip
        live.close()
    except (UserError, OSError, sqlite3.Error, TypeError, ValueError, KeyError) as e:
        console.line(f"warning: the tune's groups were not published for agents outside ({e})")
