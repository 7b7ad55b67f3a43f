"""The champion registry: the fastest verified kernel (source and config) per op, bucket, chip and toolchain.

Key (DESIGN.md, "Plan and report"): the op signature (the group's pattern, dtypes and dims), the shape
bucket (a traffic bucket's id, or an imported program's input shapes: `program_bucket`), the hardware
profile id and the toolchain string (e.g. "triton 3.6.0, cuda 12.8"). A champion holds its kernel
file's source (stored once per content hash), its config, its timing (median and spread), the gates
it passed, the tolerance they used, and the reasoning of the agent that proposed it, so the next
model or chip can start from it.

`offer` keeps a record only when its median beats the current champion's; bundles (one JSON file,
sources included) carry champions between registries, and an import keeps the faster of the two.
Only the tune's trusted side writes a champion (`offer`, after the engine's gates passed it), and
what a bundle carries is taken as a claim: a tune re-verifies every warm start, and `demote` moves a
champion that fails there to the demoted records (kept with the cause, never again returned by
`best`, `related` or `list`, and never taken back from a bundle), so its bucket is tuned again.
The registry is a SQLite file shared by processes like the board's (it may even be the same file).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.ir.graph import TensorType
from polymorph.pipeline.kernel_files import pinned_closure
from polymorph.pipeline.plan import Plan
from polymorph.search.board import SqliteFile, as_source_text, canonical_json
from polymorph.serving.traffic import Bucket, TrafficShape
from polymorph.verify.tolerance import Tolerance

BUNDLE_FORMAT = "polymorph-registry-bundle"
BUNDLE_SCHEMA_VERSION = 1
KEY_ID_CHARS = 12
_BUCKET = re.compile(r"b([1-9][0-9]*)-ctx([0-9]+)-([1-9][0-9]*)(-seq[1-9][0-9]*)?")
# An imported program's bucket: its inputs' shapes, dims joined by "x", inputs by "-", a scalar "s".
_PROGRAM_BUCKET = re.compile(r"shape-(s|[0-9]+(x[0-9]+)*)(-(s|[0-9]+(x[0-9]+)*))*")


# --- the key -----------------------------------------------------------------------------------------


def op_signature(pattern: str, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> str:
    """The op signature of a node group: `pattern(input types)->(output types)`, each type as
    `dtype[dims]`, e.g. `rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])`.

    Pass the types of the symbolic graph (a plan keeps it): int dims (hidden size, heads, vocabulary)
    are the op's own and appear as numbers; symbolic dims (batch, seq, ctx_blocks) are set by the
    shape bucket, the key's next part, and appear by name, so one signature serves every bucket and
    every layer with the same shapes."""

    def text(t: TensorType) -> str:
        return f"{t.dtype}[{','.join(str(d) for d in t.shape)}]"

    return f"{pattern}({','.join(map(text, inputs))})->({','.join(map(text, outputs))})"


def group_signatures(plan: Plan) -> dict[str, str]:
    """Node group id -> op signature, for every group of `plan` (types from the plan's graph)."""
    types = plan.graph.types()
    return {
        g.id: op_signature(g.pattern, [types[v] for v in g.inputs], [types[v] for v in g.outputs])
        for g in plan.groups
    }


def shape_bucket(bucket: Bucket, seq: int = 1) -> str:
    """The registry's shape bucket: the traffic bucket's id (DESIGN.md: a shape bucket is a traffic
    bucket), e.g. "b8-ctx1024-2048". Traffic buckets are decode steps (seq 1); a step with `seq` > 1
    new tokens per sequence (prefill, speculative decoding) is a bucket of its own: "-seq{seq}"."""
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise UserError(f"seq must be an integer >= 1, got {seq!r}")
    return bucket.id if seq == 1 else f"{bucket.id}-seq{seq}"


def shape_bucket_at(batch: int, ctx: int, seq: int = 1) -> str:
    """The shape bucket of bindings given as `--batch N --ctx N` (the bucket `TrafficShape.single` makes:
    contexts in (the largest power of two below ctx, ctx])."""
    (bucket,) = TrafficShape.single(batch, ctx).buckets()
    return shape_bucket(bucket, seq)


def program_bucket(shapes: Sequence[Sequence[int]]) -> str:
    """The shape bucket of an imported program (a torch.export .pt2) at these input shapes, e.g.
    "shape-4x3x8-4" for inputs [4, 3, 8] and [4]: a program has no traffic, its buckets are the
    shapes the engine and the gates run it at (polymorph/frontend/torch_export.py, `bucket_sizes`)."""
    return "shape-" + "-".join("x".join(str(int(d)) for d in s) or "s" for s in shapes)


def parse_program_bucket(bucket: str) -> list[tuple[int, ...]]:
    """The input shapes of a program bucket id; UserError when it is not one."""
    if _PROGRAM_BUCKET.fullmatch(bucket) is None:
        raise UserError(
            f"{bucket!r} is not a program bucket like `shape-4x3x8-4` (each input's dims joined by x, "
            "inputs by -, a scalar input `s`)"
        )
    return [() if part == "s" else tuple(int(d) for d in part.split("x")) for part in bucket[6:].split("-")]


@dataclass(frozen=True)
class ChampionKey:
    op_signature: str
    bucket: str
    profile: str  # hardware profile id (h200, mi355x, cpu)
    toolchain: str

    def __post_init__(self) -> None:
        from polymorph.hardware.profile import list_profiles

        for name in ("op_signature", "bucket", "profile", "toolchain"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"a champion key's {name} must be a non-empty string, got {value!r}")
        m = _BUCKET.fullmatch(self.bucket)
        if (m is None or int(m.group(2)) >= int(m.group(3))) and not _PROGRAM_BUCKET.fullmatch(self.bucket):
            raise UserError(
                f"shape bucket {self.bucket!r} is not a traffic bucket id like `b8-ctx1024-2048` "
                "(batch, then the context range lo < hi) nor an imported program's like `shape-4x3x8`"
            )
        if self.profile not in list_profiles():
            raise UserError(f"unknown chip `{self.profile}`; known profiles: {', '.join(list_profiles())}")

    @property
    def id(self) -> str:
        """A short, stable id of the key (the same in every registry and bundle), for the CLI."""
        text = canonical_json([self.op_signature, self.bucket, self.profile, self.toolchain], "a key")
        return hashlib.sha256(text.encode()).hexdigest()[:KEY_ID_CHARS]


# --- the record --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """Timing of one kernel in its bucket: median and spread over `trials` timed runs, in seconds."""

    median_s: float
    spread_s: float
    trials: int

    def __post_init__(self) -> None:
        if not _number(self.median_s) or self.median_s <= 0:
            raise UserError(f"a champion's median_s must be a number of seconds > 0, got {self.median_s!r}")
        if not _number(self.spread_s) or self.spread_s < 0:
            raise UserError(f"a champion's spread_s must be a number of seconds >= 0, got {self.spread_s!r}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise UserError(f"a champion's trials must be an integer >= 1, got {self.trials!r}")


@dataclass(frozen=True)
class Champion:
    """The best verified kernel for one key."""

    key: ChampionKey
    source: str  # the kernel file's source text (a library kernel's too, for a config champion)
    config: Mapping[str, Any]
    measurement: Measurement
    gates: tuple[str, ...]  # the gates it passed
    tolerance: Tolerance  # the numerics gate's tolerance
    reasoning: str  # why the agent proposed it
    agent: str = ""
    kernel: str = ""  # where the file came from, for people (`triton/rmsnorm.py`, a candidate's name)
    created: float = field(default_factory=time.time)
    # sha256 -> text of each shared module the source pins (kernel_files.depend): a champion carries
    # every line it runs, so it loads on a machine whose library has moved on.
    shared: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        as_source_text(self.source, "a champion's kernel source")
        if not isinstance(self.config, Mapping):
            raise UserError(f"a champion's config must be a JSON object, got {type(self.config).__name__}")
        canonical_json(dict(self.config), "a champion's config")
        if not self.gates or not all(isinstance(g, str) and g for g in self.gates):
            raise UserError(f"a champion needs the names of the gates it passed, got {self.gates!r}")
        for name in ("rtol", "atol"):
            value = getattr(self.tolerance, name)
            if not _number(value) or value < 0:
                raise UserError(f"a champion's tolerance {name} must be a number >= 0, got {value!r}")
        for name in ("reasoning", "agent", "kernel"):
            if not isinstance(getattr(self, name), str):
                raise UserError(f"a champion's {name} must be text")
        if not _number(self.created):
            raise UserError(f"a champion's created time must be a number, got {self.created!r}")
        for sha, text in self.shared.items():
            if as_source_text(text, "a champion's shared module")[1] != sha:
                raise UserError(f"a champion's shared module {str(sha)[:12]} does not match its sha256")

    @property
    def sha256(self) -> str:
        return as_source_text(self.source, "a champion's kernel source")[1]

    def to_dict(self) -> dict[str, Any]:
        """The bundle form: every field but the source, which the bundle keeps by sha256."""
        return {
            "op_signature": self.key.op_signature,
            "bucket": self.key.bucket,
            "profile": self.key.profile,
            "toolchain": self.key.toolchain,
            "sha256": self.sha256,
            "kernel": self.kernel,
            "config": dict(self.config),
            "median_s": self.measurement.median_s,
            "spread_s": self.measurement.spread_s,
            "trials": self.measurement.trials,
            "gates": list(self.gates),
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "reasoning": self.reasoning,
            "agent": self.agent,
            "created": self.created,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], sources: Mapping[str, str]) -> Champion:
        """Inverse of `to_dict`, the source looked up in `sources`; KeyError, TypeError or UserError
        on a malformed entry (the caller names where it was)."""
        tolerance = d["tolerance"]
        if not isinstance(d["gates"], list):
            raise TypeError("gates must be a list")
        if d["sha256"] not in sources:
            raise UserError(f"its kernel source {d['sha256'][:12]} is not in the bundle's sources")
        return cls(
            key=ChampionKey(d["op_signature"], d["bucket"], d["profile"], d["toolchain"]),
            source=sources[d["sha256"]],
            config=d["config"],
            measurement=Measurement(d["median_s"], d["spread_s"], d["trials"]),
            gates=tuple(d["gates"]),
            tolerance=Tolerance(tolerance["rtol"], tolerance["atol"]),
            reasoning=d["reasoning"],
            agent=d["agent"],
            kernel=d["kernel"],
            created=d["created"],
            shared=_shared_in(sources[d["sha256"]], sources),
        )


@dataclass(frozen=True)
class Offer:
    """What `offer` decided: `kept` when the record is now the champion; `previous_s` is the median of
    the champion it was compared with (None: there was none)."""

    kept: bool
    key: ChampionKey
    median_s: float
    previous_s: float | None

    @property
    def speedup(self) -> float | None:
        """previous median / offered median: > 1 means the offer is faster."""
        return None if self.previous_s is None else self.previous_s / self.median_s

    def describe(self) -> str:
        if self.previous_s is None:
            return f"first champion for {self.key.id}: median {self.median_s:.4g} s"
        gain = (self.previous_s - self.median_s) / self.previous_s * 100
        verdict = "kept: faster" if self.kept else "not kept: not faster"
        return (
            f"{verdict} than the champion of {self.key.id} (median {self.median_s:.4g} s vs "
            f"{self.previous_s:.4g} s, {self.speedup:.3f}x, {gain:+.1f}%)"
        )


@dataclass(frozen=True)
class ImportSummary:
    added: int  # keys the registry did not have
    replaced: int  # keys where the bundle's champion was faster
    kept: int  # keys where the registry's own champion was as fast or faster
    refused: int = 0  # champions this registry demoted before (failed re-verification): not taken back


@dataclass(frozen=True)
class Demotion:
    """A champion that failed re-verification in a tune, kept for the record."""

    champion: Champion
    cause: str  # the gate or fault that rejected it when it was re-verified
    demoted: float  # time.time() of the demotion


# --- the store ---------------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE registry_sources (
    sha256 TEXT PRIMARY KEY,
    text TEXT NOT NULL
);
CREATE TABLE champions (
    key_id TEXT PRIMARY KEY,
    op_signature TEXT NOT NULL,
    bucket TEXT NOT NULL,
    profile TEXT NOT NULL,
    toolchain TEXT NOT NULL,
    sha256 TEXT NOT NULL REFERENCES registry_sources (sha256),
    kernel TEXT NOT NULL,
    config TEXT NOT NULL,
    median_s REAL NOT NULL,
    spread_s REAL NOT NULL,
    trials INTEGER NOT NULL,
    gates TEXT NOT NULL,
    rtol REAL NOT NULL,
    atol REAL NOT NULL,
    reasoning TEXT NOT NULL,
    agent TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (op_signature, bucket, profile, toolchain)
)
"""
# Added without a schema version change: a registry file from before gains the table on open, and an
# older polymorph, which does not read it, still never sees a demoted champion (it left `champions`).
_DEMOTED = """
CREATE TABLE IF NOT EXISTS demoted (
    id INTEGER PRIMARY KEY,
    key_id TEXT NOT NULL,
    sha256 TEXT NOT NULL REFERENCES registry_sources (sha256),
    config TEXT NOT NULL,
    record TEXT NOT NULL,  -- the champion's bundle form (Champion.to_dict)
    cause TEXT NOT NULL,
    demoted REAL NOT NULL
)
"""


class Registry:
    """The champion registry in the SQLite file at `path` (created when missing)."""

    SCHEMA_VERSION = 1

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteFile(path, "registry", self.SCHEMA_VERSION, _SCHEMA, "registry")
        with self._db.write() as c:
            c.execute(_DEMOTED)

    @property
    def path(self) -> Path:
        return self._db.path

    def close(self) -> None:
        self._db.close()

    def offer(self, champion: Champion) -> Offer:
        """Make `champion` the champion of its key if its median beats the current one's (or there is
        none). Atomic against other processes offering for the same key."""
        if not isinstance(champion, Champion):
            raise UserError(f"offer takes a Champion, got {type(champion).__name__}")
        with self._db.write() as c:
            return self._offer(c, champion)

    def demote(self, key: ChampionKey, sha256: str, config: Mapping[str, Any], cause: str) -> bool:
        """Move the champion of `key` to the demoted records if it is still the one with this source
        hash and config (the one that failed re-verification; a faster one offered since stays).
        True when it was demoted. Only the tune's trusted side calls this, on a verdict of the gates."""
        if not isinstance(cause, str) or not cause.strip():
            raise UserError("a demotion needs its cause (the gate that rejected the champion)")
        config_json = canonical_json(dict(config), "a champion's config")
        with self._db.write() as c:
            row = c.execute(
                "SELECT * FROM champions WHERE key_id = ? AND sha256 = ? AND config = ?",
                (key.id, sha256, config_json),
            ).fetchone()
            if row is None:
                return False
            record = canonical_json(self._champion(c, row).to_dict(), "a champion")
            c.execute(
                "INSERT INTO demoted (key_id, sha256, config, record, cause, demoted) VALUES (?, ?, ?, ?, ?, ?)",
                (key.id, sha256, config_json, record, cause, time.time()),
            )
            c.execute("DELETE FROM champions WHERE key_id = ?", (key.id,))
            return True

    def remeasure(
        self, key: ChampionKey, sha256: str, config: Mapping[str, Any], measurement: Measurement
    ) -> bool:
        """Record `measurement`, taken by a tune that re-verified the champion of `key` (the one with
        this source hash and config), in place of the one it came with: a time a bundle carried is a
        claim, and a faster kernel must be compared with what was measured here. True when recorded."""
        if not isinstance(measurement, Measurement):
            raise UserError(f"remeasure takes a Measurement, got {type(measurement).__name__}")
        config_json = canonical_json(dict(config), "a champion's config")
        with self._db.write() as c:
            cur = c.execute(
                "UPDATE champions SET median_s = ?, spread_s = ?, trials = ? WHERE key_id = ? AND sha256 = ? "
                "AND config = ?",
                (measurement.median_s, measurement.spread_s, measurement.trials, key.id, sha256, config_json),
            )
            return cur.rowcount == 1

    def demoted(self) -> list[Demotion]:
        """Every demotion, oldest first."""
        with self._db.read() as c:
            rows = c.execute("SELECT * FROM demoted ORDER BY id").fetchall()
            out = []
            for r in rows:
                src = c.execute(
                    "SELECT text FROM registry_sources WHERE sha256 = ?", (r["sha256"],)
                ).fetchone()
                sources = {r["sha256"]: src["text"]} if src is not None else {}
                champ = Champion.from_dict(json.loads(r["record"]), sources)
                out.append(Demotion(champ, r["cause"], r["demoted"]))
            return out

    def best(self, key: ChampionKey) -> Champion | None:
        """The champion of `key`, or None."""
        with self._db.read() as c:
            row = c.execute("SELECT * FROM champions WHERE key_id = ?", (key.id,)).fetchone()
            return None if row is None else self._champion(c, row)

    def related(self, key: ChampionKey, profiles: Sequence[str]) -> list[Champion]:
        """Champions of `key`'s op signature under other keys, on one of `profiles` (the chips whose
        kernels the caller can build): warm starts for a new chip, toolchain or bucket, each to be
        compiled and re-verified where it goes. Nearest first: the same chip, then the same bucket,
        then the fastest."""
        with self._db.read() as c:
            rows = c.execute(
                "SELECT * FROM champions WHERE op_signature = ? AND key_id != ?", (key.op_signature, key.id)
            ).fetchall()
            found = [self._champion(c, r) for r in rows if r["profile"] in profiles]
        return sorted(
            found,
            key=lambda ch: (
                ch.key.profile != key.profile,
                ch.key.bucket != key.bucket,
                ch.measurement.median_s,
            ),
        )

    def list(self) -> list[Champion]:
        """Every champion, ordered by op signature, bucket, profile, toolchain."""
        with self._db.read() as c:
            rows = c.execute(
                "SELECT * FROM champions ORDER BY op_signature, bucket, profile, toolchain"
            ).fetchall()
            return [self._champion(c, r) for r in rows]

    def find(self, key_id: str) -> Champion:
        """The champion whose key id starts with `key_id` (the id `polymorph registry list` prints)."""
        if not isinstance(key_id, str) or not re.fullmatch(r"[0-9a-f]{4,64}", key_id):
            raise UserError(f"a champion key id is 4 to {KEY_ID_CHARS} hex digits, got {key_id!r}")
        with self._db.read() as c:
            rows = c.execute("SELECT * FROM champions WHERE key_id LIKE ?", (key_id + "%",)).fetchall()
            if not rows:
                raise UserError(f"no champion with key id {key_id} in registry {self.path}")
            if len(rows) > 1:
                raise UserError(f"key id {key_id} is ambiguous in registry {self.path}: give more digits")
            return self._champion(c, rows[0])

    def export_bundle(self, path: str | Path) -> int:
        """Write every champion, with its source, to one JSON file; return how many. Refused (UserError)
        onto the registry's own SQLite file or its journal: that would destroy what it exports."""
        self._refuse_own_file(path, "export the registry onto")
        if _is_sqlite(Path(path)):  # a board or another registry: a bundle would destroy it
            raise UserError(f"{path} is a SQLite file (a board or a registry), not a bundle; give a bundle "
                            "path such as champions.json")  # fmt: skip
        champions = self.list()
        sources = {sha: text for ch in champions for sha, text in ch.shared.items()}
        sources.update({ch.sha256: ch.source for ch in champions})
        bundle = {
            "format": BUNDLE_FORMAT,
            "schema_version": BUNDLE_SCHEMA_VERSION,
            "exported": time.time(),
            "sources": sources,
            "champions": [ch.to_dict() for ch in champions],
        }
        path = Path(path)
        try:
            path.write_text(json.dumps(bundle, indent=1, sort_keys=True) + "\n")
        except OSError as e:
            raise UserError(f"cannot write the bundle {path}: {e.strerror}") from None
        return len(champions)

    def import_bundle(self, path: str | Path) -> ImportSummary:
        """Read a bundle written by `export_bundle` and keep, per key, the faster of the registry's
        champion and the bundle's. All or nothing: a malformed bundle changes nothing (UserError)."""
        self._refuse_own_file(path, "import into the registry")
        champions = read_bundle(path)
        added = replaced = kept = refused = 0
        with self._db.write() as c:
            for ch in champions:
                if self._was_demoted(c, ch):
                    refused += 1
                    continue
                offer = self._offer(c, ch)
                if offer.previous_s is None:
                    added += 1
                elif offer.kept:
                    replaced += 1
                else:
                    kept += 1
        return ImportSummary(added, replaced, kept, refused)

    # --- internals -------------------------------------------------------------------------------------

    def _refuse_own_file(self, path: str | Path, doing: str) -> None:
        own = [self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm", "-journal"))]
        if any(_same_file(Path(path), p) for p in own):
            raise UserError(
                f"{path} is the registry's own SQLite file; cannot {doing} itself: give a bundle path "
                "such as champions.json"
            )

    def _was_demoted(self, c: Any, champion: Champion) -> bool:
        config = canonical_json(dict(champion.config), "a champion's config")
        row = c.execute(
            "SELECT 1 FROM demoted WHERE key_id = ? AND sha256 = ? AND config = ?",
            (champion.key.id, champion.sha256, config),
        ).fetchone()
        return row is not None

    def _offer(self, c: Any, champion: Champion) -> Offer:
        key, m = champion.key, champion.measurement
        row = c.execute("SELECT median_s FROM champions WHERE key_id = ?", (key.id,)).fetchone()
        previous = None if row is None else float(row["median_s"])
        if previous is not None and not m.median_s < previous:
            return Offer(False, key, m.median_s, previous)
        c.execute("INSERT OR IGNORE INTO registry_sources VALUES (?, ?)", (champion.sha256, champion.source))
        for sha, text in champion.shared.items():
            c.execute("INSERT OR IGNORE INTO registry_sources VALUES (?, ?)", (sha, text))
        c.execute(
            "INSERT OR REPLACE INTO champions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key.id,
                key.op_signature,
                key.bucket,
                key.profile,
                key.toolchain,
                champion.sha256,
                champion.kernel,
                canonical_json(dict(champion.config), "a champion's config"),
                m.median_s,
                m.spread_s,
                m.trials,
                json.dumps(list(champion.gates)),
                champion.tolerance.rtol,
                champion.tolerance.atol,
                champion.reasoning,
                champion.agent,
                champion.created,
            ),
        )
        return Offer(True, key, m.median_s, previous)

    def _champion(self, c: Any, row: Any) -> Champion:
        source = c.execute("SELECT text FROM registry_sources WHERE sha256 = ?", (row["sha256"],)).fetchone()

        def stored(_name: str, sha: str) -> str | None:  # a row whose text lost its hash is left out
            row = c.execute("SELECT text FROM registry_sources WHERE sha256 = ?", (sha,)).fetchone()
            if row is None or not isinstance(row["text"], str):
                return None
            return row["text"] if hashlib.sha256(row["text"].encode()).hexdigest() == sha else None

        texts = {sha: text for _, sha, text in pinned_closure(source["text"], stored)}
        return Champion(
            key=ChampionKey(row["op_signature"], row["bucket"], row["profile"], row["toolchain"]),
            source=source["text"],
            config=json.loads(row["config"]),
            measurement=Measurement(row["median_s"], row["spread_s"], row["trials"]),
            gates=tuple(json.loads(row["gates"])),
            tolerance=Tolerance(row["rtol"], row["atol"]),
            reasoning=row["reasoning"],
            agent=row["agent"],
            kernel=row["kernel"],
            shared=texts,
            created=row["created"],
        )


def read_bundle(path: str | Path) -> list[Champion]:
    """The champions of a bundle file; UserError naming the file and the fault for anything malformed:
    not JSON, another format or schema version, a source whose text does not match its sha256, a
    champion entry with a missing or bad field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"cannot read the bundle {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"bundle {path} is not UTF-8 text; is it a registry bundle?") from None
    except json.JSONDecodeError as e:
        raise UserError(f"bundle {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:  # `[[[[...]]]]` thousands deep: no bundle nests like that
        raise UserError(f"bundle {path} is JSON nested too deeply to be a registry bundle") from None
    if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
        raise UserError(f'{path} is not a polymorph registry bundle (no "format": "{BUNDLE_FORMAT}")')
    if data.get("schema_version") != BUNDLE_SCHEMA_VERSION:
        raise UserError(
            f"bundle {path} has schema_version {data.get('schema_version')!r}, this polymorph reads "
            f"{BUNDLE_SCHEMA_VERSION}; export it again with a matching polymorph"
        )
    sources, entries = data.get("sources"), data.get("champions")
    if not isinstance(sources, dict) or not isinstance(entries, list):
        raise UserError(f'bundle {path} needs a "sources" object and a "champions" list')
    for sha, text in sources.items():
        if not isinstance(text, str) or as_source_text(text, f"bundle {path}: source {sha[:12]}")[1] != sha:
            raise UserError(
                f"bundle {path}: source {sha[:12]} does not match its sha256; the file is corrupt"
            )
    champions = []
    for i, entry in enumerate(entries):
        try:
            if not isinstance(entry, dict):
                raise TypeError("not a JSON object")
            champions.append(Champion.from_dict(entry, sources))
        except KeyError as e:
            raise UserError(f"bundle {path}: champion {i} has no field {e}") from None
        except (TypeError, AttributeError) as e:
            raise UserError(f"bundle {path}: champion {i} is malformed ({e})") from None
        except UserError as e:
            raise UserError(f"bundle {path}: champion {i}: {e}") from None
    return champions


def _shared_in(source: str, texts: Mapping[str, str]) -> dict[str, str]:
    """sha256 -> text of each shared module `source` runs (its pins, theirs) that `texts` holds."""
    return {sha: text for _, sha, text in pinned_closure(source, lambda _name, sha: texts.get(sha))}


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
