"""The message board: candidates that agents post, claims that workers take, results that workers post.

One SQLite file shared by any number of processes on one machine (or one shared filesystem that
honours POSIX locks): WAL journal, a busy timeout, one connection per process and thread, and every
read-modify-write inside `BEGIN IMMEDIATE`, so two workers never hold the same claim.

A candidate is what an agent proposes for one node group of a plan, on one backend and target chip:
either a kernel file (its source, stored once by content hash, with an optional config) or a config
for the group's current kernel. Posting a candidate that is already on the board (same source hash,
config, group, backend and target) returns the existing id, so it is measured once.

A claim is a lease: the worker renews it with `heartbeat`; a claim whose lease ran out (the worker
died or hung) is claimable again, and after `max_attempts` claims the candidate is recorded as
failed with cause "worker lost". Times are `time.time()` seconds; ids are integers.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.pipeline.kernel_files import source_hash

BUSY_TIMEOUT_S = 30.0
DEFAULT_MAX_ATTEMPTS = 3
WORKER_LOST = "worker lost"

# Connections a forked child inherited from its parent. SQLite must not use them in the child, and
# closing one there would drop the child's own POSIX locks on the file, so they are kept open, unused.
_INHERITED: list[sqlite3.Connection] = []


class SqliteFile:
    """One SQLite file that several processes share, holding one polymorph component's tables.

    WAL journal, `busy_timeout`, one connection per process and thread (a connection is never used
    across a fork). `component` and `version` are recorded in a `polymorph_schema` table; opening a
    file whose component has another version is a UserError, so two components (board, registry)
    may share one file."""

    def __init__(self, path: str | Path, component: str, version: int, schema: str, what: str) -> None:
        self.path = Path(path)
        self.what = what  # "board", "registry": how messages name the file
        self._local = threading.local()
        if not self.path.parent.is_dir():
            from polymorph.knobs import knobs

            if self.path.parent != knobs.data_dir:
                raise UserError(
                    f"{what} {self.path}: directory {self.path.parent} does not exist; create it first"
                )
            try:  # polymorph's own data directory (the default place): made on first use, as XDG says
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(
                    f"{what} {self.path}: cannot create {self.path.parent} ({e.strerror or e}); "
                    f"pass --{what} FILE or set POLYMORPH_{what.upper()}"
                ) from None
        with self.write() as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS polymorph_schema (component TEXT PRIMARY KEY, version INTEGER)"
            )
            row = c.execute(
                "SELECT version FROM polymorph_schema WHERE component = ?", (component,)
            ).fetchone()
            if row is None:
                for statement in schema.split(";"):
                    if statement.strip():
                        c.execute(statement)
                c.execute("INSERT INTO polymorph_schema VALUES (?, ?)", (component, version))
            elif row[0] != version:
                raise UserError(
                    f"{what} {self.path} has {component} schema version {row[0]}, this polymorph reads "
                    f"{version}; use another file"
                )

    def connection(self) -> sqlite3.Connection:
        """This process's and thread's connection, opened on first use."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if conn is not None:
            _INHERITED.append(conn)
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.DatabaseError as e:
            raise self._error(e) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.DatabaseError as e:
            conn.close()
            raise self._error(e) from None
        if mode != "wal":
            conn.close()
            raise UserError(f"{self.what} {self.path}: SQLite refused WAL mode (journal mode {mode})")
        conn.row_factory = sqlite3.Row
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A `BEGIN IMMEDIATE` transaction: the write lock is taken first, so a read-then-write in it is
        atomic against every other process. Commits on exit, rolls back on an exception."""
        conn = self.connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise self._error(e) from None
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back already (a full disk, an I/O error)
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self._error(e) from None

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query in it sees one snapshot of the file."""
        conn = self.connection()
        try:
            conn.execute("BEGIN")
        except sqlite3.DatabaseError as e:
            raise self._error(e) from None
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def close(self) -> None:
        """Close this thread's connection (a later call opens a new one)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        elif conn is not None:
            _INHERITED.append(conn)
        self._local.conn = None

    def _error(self, e: sqlite3.DatabaseError) -> UserError:
        text = str(e)
        if "not a database" in text:
            return UserError(f"{self.what} {self.path} is not a SQLite file; pass another path")
        if "locked" in text or "busy" in text:
            return UserError(
                f"{self.what} {self.path} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s; "
                "is a process stuck holding it?"
            )
        return UserError(f"{self.what} {self.path}: SQLite error: {text}")


def canonical_json(value: Any, what: str) -> str:
    """`value` as compact JSON with sorted keys (equal dicts give equal text); UserError if it is not JSON."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UserError(f"{what} is not plain JSON ({e})") from None


def as_source_text(source: str | bytes, what: str) -> tuple[str, str]:
    """(text, sha256 of its UTF-8 bytes) of a kernel file's source; UserError if it is empty or not UTF-8."""
    if isinstance(source, bytes):
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    else:
        text = source
    if not text.strip():
        raise UserError(f"{what} is empty")
    return text, source_hash(text.encode("utf-8"))


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{what} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class Result:
    """What a worker reported for one candidate (or the board, for a lost worker)."""

    candidate: int
    group: str
    worker: str
    ok: bool
    cause: str  # why it failed ("" when ok): the gate that rejected it, "worker lost", a build error
    measurements: dict[str, Any]  # median_s, spread_s, trials, ... as the worker measured them
    gates: dict[str, Any]  # gate name -> what it reported
    finished: float
    attempts: int


@dataclass(frozen=True)
class Candidate:
    """One candidate on the board, with its state: "open", "claimed" or "done" (then `result` is set)."""

    id: int
    group: str
    kind: str  # "kernel" (a kernel file, `source` set) or "config" (a config for the group's kernel)
    backend: str
    target: str
    sha256: str | None
    source: str | None
    config: dict[str, Any]
    agent: str
    reasoning: str
    posted: float
    state: str
    worker: str | None
    lease_until: float | None
    attempts: int
    result: Result | None = None


_SCHEMA = """
CREATE TABLE sources (
    sha256 TEXT PRIMARY KEY,
    text TEXT NOT NULL
);
CREATE TABLE candidates (
    id INTEGER PRIMARY KEY,
    group_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('kernel', 'config')),
    backend TEXT NOT NULL,
    target TEXT NOT NULL,
    sha256 TEXT NOT NULL,  -- '' for a config candidate (NULLs would never be equal in the UNIQUE)
    config TEXT NOT NULL,  -- canonical JSON
    agent TEXT NOT NULL,
    reasoning TEXT NOT NULL,
    posted REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'claimed', 'done')),
    worker TEXT,
    lease_s REAL,
    lease_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    UNIQUE (sha256, config, group_id, backend, target)
);
CREATE INDEX candidates_state ON candidates (state, id);
CREATE TABLE results (
    candidate INTEGER PRIMARY KEY REFERENCES candidates (id),
    worker TEXT NOT NULL,
    ok INTEGER NOT NULL,
    cause TEXT NOT NULL,
    measurements TEXT NOT NULL,
    gates TEXT NOT NULL,
    finished REAL NOT NULL,
    attempts INTEGER NOT NULL
)
"""


class Board:
    """The message board in the SQLite file at `path` (created when missing).

    `max_attempts`: how many claims a candidate gets before a lost worker counts as its failure
    (a setting of this object, not of the file: processes sharing a board should agree on it)."""

    SCHEMA_VERSION = 1

    def __init__(self, path: str | Path, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise UserError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self._db = SqliteFile(path, "board", self.SCHEMA_VERSION, _SCHEMA, "board")

    @property
    def path(self) -> Path:
        return self._db.path

    def close(self) -> None:
        self._db.close()

    # --- agents ----------------------------------------------------------------------------------------

    def post(
        self,
        *,
        group: str,
        backend: str,
        target: str,
        source: str | bytes | None = None,
        config: Mapping[str, Any] | None = None,
        agent: str = "",
        reasoning: str = "",
    ) -> int:
        """Post a candidate for node group `group` on `backend` and chip `target` (a profile id); return
        its id. With `source` it is a kernel file (and `config` one of its configs, default {}: the
        file's first); without, a config for the group's current kernel. A candidate already on the
        board (same source hash, config, group, backend, target) is not posted again: its id returns."""
        from polymorph.hardware.profile import list_profiles
        from polymorph.pipeline.backend import registry

        group = _name(group, "the node group id")
        if backend not in registry.names():
            raise UserError(f"unknown backend `{backend}`; backends: {', '.join(registry.names())}")
        if target not in list_profiles():
            raise UserError(f"unknown chip `{target}`; known profiles: {', '.join(list_profiles())}")
        if config is not None and not isinstance(config, Mapping):
            raise UserError(f"a candidate's config must be a JSON object, got {type(config).__name__}")
        config_json = canonical_json(dict(config or {}), "the candidate's config")
        if source is None:
            if not config:
                raise UserError("a candidate needs a kernel file's source, a config, or both")
            kind, text, sha = "config", None, ""
        else:
            kind = "kernel"
            text, sha = as_source_text(source, "the candidate's kernel source")
        if not isinstance(agent, str) or not isinstance(reasoning, str):
            raise UserError("a candidate's agent and reasoning must be text")
        with self._db.write() as c:
            if text is not None:
                c.execute("INSERT OR IGNORE INTO sources VALUES (?, ?)", (sha, text))
            c.execute(
                "INSERT INTO candidates (group_id, kind, backend, target, sha256, config, agent, reasoning, "
                "posted, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'open') ON CONFLICT DO NOTHING",
                (group, kind, backend, target, sha, config_json, agent, reasoning, time.time()),
            )
            row = c.execute(
                "SELECT id FROM candidates WHERE sha256 = ? AND config = ? AND group_id = ? AND backend = ? "
                "AND target = ?",
                (sha, config_json, group, backend, target),
            ).fetchone()
        return int(row["id"])

    def adopt(self, candidate: int, group: str, source: str | None = None) -> int:
        """Re-address an open candidate to node group `group`: a tune run takes a post for a bare
        group into its scope (`tune.board_group`), so that its workers claim it and the poster's
        `wait` sees the result. `source`: the kernel file a config-only candidate's config is for
        (the plan's stock kernel); the candidate becomes that file with that config. Returns
        `candidate`, or, where the same candidate is on the board at `group` already, that one's id:
        the posted one is then done, failed, its cause naming the other."""
        group = _name(group, "the node group id")
        with self._db.write() as c:
            row = self._require(c, candidate)
            if row["state"] != "open":
                raise UserError(
                    f"candidate {candidate} is {row['state']}, not open: it cannot be re-addressed"
                )
            kind, sha = row["kind"], row["sha256"]
            if kind == "config" and source is not None:
                text, sha = as_source_text(source, "the stock kernel's source")
                c.execute("INSERT OR IGNORE INTO sources VALUES (?, ?)", (sha, text))
                kind = "kernel"
            same = c.execute(
                "SELECT id FROM candidates WHERE sha256 = ? AND config = ? AND group_id = ? AND backend = ? "
                "AND target = ?",
                (sha, row["config"], group, row["backend"], row["target"]),
            ).fetchone()
            if same is not None:
                cause = f"the same kernel and config as candidate {same['id']}, measured there"
                c.execute(
                    "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (candidate, "board", 0, cause, "{}", "{}", time.time(), row["attempts"]),
                )
                c.execute("UPDATE candidates SET state = 'done' WHERE id = ?", (candidate,))
                return int(same["id"])
            c.execute(
                "UPDATE candidates SET group_id = ?, kind = ?, sha256 = ? WHERE id = ?",
                (group, kind, sha, candidate),
            )
            return candidate

    # --- workers ---------------------------------------------------------------------------------------

    def claim(
        self,
        worker: str,
        lease_s: float,
        *,
        backend: str | None = None,
        target: str | None = None,
        group_suffix: str | None = None,
    ) -> Candidate | None:
        """Take the oldest claimable candidate (open, or claimed under a lease that ran out) for
        `lease_s` seconds, or None when there is none. Only candidates for `backend` and `target`, and
        whose group ends with `group_suffix` (tune's `@bucket@model` qualifier), when given. Atomic: no
        other process can claim the same candidate until the lease runs out."""
        worker = _name(worker, "the worker name")
        lease_s = _positive(lease_s, "lease_s")
        query = "SELECT * FROM candidates WHERE (state = 'open' OR (state = 'claimed' AND lease_until < ?))"
        params: list[Any] = []
        if backend is not None:
            query += " AND backend = ?"
            params.append(backend)
        if target is not None:
            query += " AND target = ?"
            params.append(target)
        if group_suffix is not None:
            query += " AND substr(group_id, -?) = ?"
            params += [len(group_suffix), group_suffix]
        query += " ORDER BY id LIMIT 1"
        with self._db.write() as c:
            now = time.time()
            self._reap(c, now)
            row = c.execute(query, [now, *params]).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE candidates SET state = 'claimed', worker = ?, lease_s = ?, lease_until = ?, "
                "attempts = attempts + 1 WHERE id = ?",
                (worker, lease_s, now + lease_s, row["id"]),
            )
            return self._candidate(c, row["id"])

    def heartbeat(self, candidate: int, worker: str) -> bool:
        """Renew `worker`'s lease on `candidate` for another lease period. False when the worker no
        longer holds it (it ran out and another worker claimed it, or it is done): stop working on it."""
        with self._db.write() as c:
            self._require(c, candidate)
            now = time.time()
            cur = c.execute(
                "UPDATE candidates SET lease_until = ? + lease_s WHERE id = ? AND state = 'claimed' "
                "AND worker = ?",
                (now, candidate, worker),
            )
            return cur.rowcount == 1

    def release(self, lost: Callable[[str], bool]) -> int:
        """Hand back every claim whose worker `lost(worker)` says is gone (a killed tune's worker), so
        another worker may claim it now instead of when its lease runs out; the claims it used count.
        Returns how many were handed back."""
        with self._db.write() as c:
            rows = c.execute("SELECT id, worker FROM candidates WHERE state = 'claimed'").fetchall()
            ids = [r["id"] for r in rows if lost(r["worker"])]
            for cid in ids:
                c.execute(
                    "UPDATE candidates SET state = 'open', worker = NULL, lease_until = NULL WHERE id = ?",
                    (cid,),
                )
            return len(ids)

    def reopen(self, candidate: int) -> bool:
        """Drop the passing result of a done candidate and make it open again, to be measured anew
        (a tune does this to a pass it did not see its own workers measure). False when it is not
        done with a passing result."""
        with self._db.write() as c:
            row = c.execute(
                "SELECT c.state, r.ok FROM candidates c JOIN results r ON r.candidate = c.id WHERE c.id = ?",
                (candidate,),
            ).fetchone()
            if row is None or row["state"] != "done" or not row["ok"]:
                return False
            c.execute("DELETE FROM results WHERE candidate = ?", (candidate,))
            c.execute(
                "UPDATE candidates SET state = 'open', worker = NULL, lease_until = NULL, attempts = 0 "
                "WHERE id = ?",
                (candidate,),
            )
            return True

    def post_result(
        self,
        candidate: int,
        worker: str,
        ok: bool,
        cause: str,
        measurements: Mapping[str, Any],
        gates: Mapping[str, Any],
    ) -> bool:
        """Record `worker`'s result for `candidate`. `ok`: it passed every gate and was measured, and
        then `measurements` holds `median_s` (seconds); otherwise `cause` says why not. A lease that ran
        out still counts while no other worker has claimed the candidate. False (and nothing recorded)
        when the worker no longer holds the claim: another worker's result counts."""
        if not isinstance(ok, bool):
            raise UserError(f"ok must be True or False, got {ok!r}")
        if ok:
            _positive(measurements.get("median_s") if isinstance(measurements, Mapping) else None, "median_s")
        elif not isinstance(cause, str) or not cause.strip():
            raise UserError("a failed result needs its cause (the gate that rejected it, or the error)")
        m_json = canonical_json(dict(measurements), "the measurements")
        g_json = canonical_json(dict(gates), "the gates")
        with self._db.write() as c:
            row = self._require(c, candidate)
            if row["state"] != "claimed" or row["worker"] != worker:
                return False
            c.execute(
                "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (candidate, worker, int(ok), cause or "", m_json, g_json, time.time(), row["attempts"]),
            )
            c.execute("UPDATE candidates SET state = 'done', lease_until = NULL WHERE id = ?", (candidate,))
            return True

    # --- everyone --------------------------------------------------------------------------------------

    def show(self, candidate: int) -> Candidate:
        """The candidate with its state and result; UserError for an id that is not on the board."""
        with self._db.read() as c:
            self._require(c, candidate)
            return self._candidate(c, candidate)

    def results(self, *, group: str | None = None, ok: bool | None = None, after: int = 0) -> list[Result]:
        """Results in candidate order: of node group `group`, only passing (`ok=True`) or failing ones,
        of candidates with id > `after` (an agent polling for news passes the last id it saw)."""
        query = "SELECT r.*, c.group_id FROM results r JOIN candidates c ON c.id = r.candidate WHERE r.candidate > ?"
        params: list[Any] = [after]
        if group is not None:
            query += " AND c.group_id = ?"
            params.append(group)
        if ok is not None:
            query += " AND r.ok = ?"
            params.append(int(ok))
        with self._db.read() as c:
            return [_result(r) for r in c.execute(query + " ORDER BY r.candidate", params)]

    def candidates(self, state: str | None = None, *, bare: bool = False) -> list[Candidate]:
        """Every candidate (with state `state`, when given; with `bare`, only those posted for a bare
        node group, which no tune run has taken into its scope yet), in id order."""
        query, params = "SELECT id FROM candidates WHERE 1", []
        if state is not None:
            query += " AND state = ?"
            params.append(state)
        if bare:
            query += " AND instr(group_id, '@') = 0"
        with self._db.read() as c:
            ids = c.execute(query + " ORDER BY id", params).fetchall()
            return [self._candidate(c, r["id"]) for r in ids]

    def wait(self, candidate: int, timeout: float) -> Result | None:
        """Block until `candidate` has a result and return it; None after `timeout` seconds without."""
        timeout = _non_negative(timeout, "timeout")
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            with self._db.read() as c:
                row = self._require(c, candidate)
                expired = row["state"] == "claimed" and row["lease_until"] < time.time()
                result = c.execute(_RESULT, (candidate,)).fetchone()
            if result is not None:
                return _result(result)
            if expired and row["attempts"] >= self.max_attempts:
                with self._db.write() as c:
                    self._reap(c, time.time())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)

    # --- internals -------------------------------------------------------------------------------------

    def _reap(self, c: sqlite3.Connection, now: float) -> None:
        """Record every candidate whose last allowed claim ran out as failed: worker lost."""
        lost = c.execute(
            "SELECT id, worker, attempts FROM candidates WHERE state = 'claimed' AND lease_until < ? "
            "AND attempts >= ?",
            (now, self.max_attempts),
        ).fetchall()
        for row in lost:
            cause = f"{WORKER_LOST}: {row['attempts']} claims ran out of lease, the last by {row['worker']}"
            c.execute(
                "INSERT INTO results VALUES (?, ?, 0, ?, '{}', '{}', ?, ?)",
                (row["id"], row["worker"], cause, now, row["attempts"]),
            )
            c.execute("UPDATE candidates SET state = 'done', lease_until = NULL WHERE id = ?", (row["id"],))

    def _require(self, c: sqlite3.Connection, candidate: int) -> sqlite3.Row:
        if isinstance(candidate, bool) or not isinstance(candidate, int):
            raise UserError(f"a candidate id is an integer, got {candidate!r}")
        row = c.execute("SELECT * FROM candidates WHERE id = ?", (candidate,)).fetchone()
        if row is None:
            last = c.execute("SELECT max(id) FROM candidates").fetchone()[0]
            have = f"ids run 1..{last}" if last else "it is empty"
            raise UserError(f"no candidate {candidate} on board {self.path} ({have})")
        return row

    def _candidate(self, c: sqlite3.Connection, candidate: int) -> Candidate:
        row = c.execute("SELECT * FROM candidates WHERE id = ?", (candidate,)).fetchone()
        source = None
        if row["sha256"]:
            source = c.execute("SELECT text FROM sources WHERE sha256 = ?", (row["sha256"],)).fetchone()[0]
        result = c.execute(_RESULT, (candidate,)).fetchone()
        return Candidate(
            id=row["id"],
            group=row["group_id"],
            kind=row["kind"],
            backend=row["backend"],
            target=row["target"],
            sha256=row["sha256"] or None,
            source=source,
            config=json.loads(row["config"]),
            agent=row["agent"],
            reasoning=row["reasoning"],
            posted=row["posted"],
            state=row["state"],
            worker=row["worker"],
            lease_until=row["lease_until"],
            attempts=row["attempts"],
            result=None if result is None else _result(result),
        )


_RESULT = (
    "SELECT r.*, c.group_id FROM results r JOIN candidates c ON c.id = r.candidate WHERE r.candidate = ?"
)


def _result(row: sqlite3.Row) -> Result:
    return Result(
        candidate=row["candidate"],
        group=row["group_id"],
        worker=row["worker"],
        ok=bool(row["ok"]),
        cause=row["cause"],
        measurements=json.loads(row["measurements"]),
        gates=json.loads(row["gates"]),
        finished=row["finished"],
        attempts=row["attempts"],
    )


def _positive(value: object, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UserError(f"{what} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _non_negative(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UserError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)
