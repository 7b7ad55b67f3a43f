"""`polymorph tune`: agents propose, engines gate and measure, winners go to the registry, and the run
ends with the tuned plan and an end-to-end A/B against the untuned plan in the same run.

A run tunes the buckets of a traffic shape (or the one --batch/--ctx bucket), heaviest first, each
with a share of the budget by weight. Per bucket: the plan `compile` makes is cut into search spaces,
one per op signature (identical layers share one); the stock kernel of each is measured first as the
baseline, the registry's champion for the same key (signature, bucket, profile, toolchain) is posted
next (warm start, re-verified here), then the built-in agents' proposals, largest predicted share
first. A bucket whose every signature already has a champion is not tuned again, only re-verified.

An imported program (a torch.export .pt2 file) has program buckets instead of traffic buckets
(`ProgramBucket`): its example inputs' shapes, and with dynamic dims every dim at its min and at its
max as well (an unbounded max clamped: polymorph/frontend/torch_export.py); each bucket's engine
loads the program at its shapes (`FILE.pt2@shape-...`) and the gates run there. A program bucket is
a registry key like a traffic bucket's, so its champions are recorded and offered back (re-verified)
to the next tune of the same ops at the same shapes. A program has no decode step to A/B whole: each
winner stands on its own gates. With `exact` (bit-exact mode) a candidate passes only where its outputs equal the stock kernel's byte
for byte (the `exact` gate); the registry's champions, measured without that bar, are not read.

Processes: this one (trusted: agents, posting, the registry, the final A/B) and `workers` worker
processes, each owning one persistent engine (polymorph.engine) loaded at the bucket. A worker claims
a candidate, swaps it into the signature's representative group, runs every gate
(Controller.try_candidate), times the group on the fast tier, posts the result and puts the stock
kernel back. A worker that dies mid-candidate loses its lease; the board hands the candidate to
another worker, and a replacement worker is started while budget remains.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polymorph.cli import console
from polymorph.cli.outdir import claim_out
from polymorph.engine.controller import EngineError
from polymorph.errors import UserError
from polymorph.knobs import knobs
from polymorph.pipeline.kernel_files import pinned_sources, store_source
from polymorph.search.ab import MIN_PAIRS, SLOWER, paired_ratio
from polymorph.search.agents import GroupSpace, Outcome, Proposal, Schedule, builtin_agents
from polymorph.search.board import Board, Result
from polymorph.search.lifetime import dead_run_worker, die_with_parent, worker_name
from polymorph.search.live_tunes import publish_tune
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry, shape_bucket
from polymorph.search.registry import program_bucket as program_bucket_id
from polymorph.search.space import buckets_of, group_spaces, library_path, predicted_times, toolchain

WIN_MARGIN = 0.02  # a candidate must beat the stock kernel's median by 2% to replace it in the plan


def parse_budget(text: str) -> float:
    """'90s', '6m', '2h' (or plain seconds) -> seconds; UserError otherwise."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = str(text).strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"--budget takes a duration such as 90s, 6m or 2h; got {text!r}")
    return value


@dataclass
class TuneOptions:
    model: str
    backend: str = "cpu"
    target: str | None = None
    traffic: str | None = None
    dtype: str | None = None  # weights and activations (default: f32 on cpu, as the zoo loads them)
    batch: int | None = None
    ctx: int | None = None
    budget_s: float = 60.0
    workers: int = 1
    out: Path = Path("polymorph-tuned")
    board: Path | None = None  # default: OUT/board.sqlite
    registry: Path | None = None  # default: OUT/registry.sqlite
    seed: int = 0
    trials: int = 10  # fast-tier trials per candidate
    # whole decode steps per round of an arm in the final A/B (fewer if time runs short); 0: as many as
    # take AB_ROUND_S by the stock kernels' times (ab_round_steps), so that one round outlasts the noise
    ab_trials: int = 0
    ab_pairs: int = MIN_PAIRS  # (untuned, tuned) pairs of the final A/B at least; more if time allows
    engine_budget_s: float = 30.0  # the most one engine call may take before the worker is replaced
    lease_s: float = 60.0  # a claim not renewed for this long is handed to another worker
    agent_command: str | None = None  # an external agent: a command, prompt on stdin, kernel on stdout
    agent_endpoint: str | None = None  # an external agent: an OpenAI-compatible base URL
    agent_model: str = ""
    agent_api_key: str | None = None
    agent_calls: int = 1  # calls per op signature and bucket for each external agent
    wait_for_posts: bool = False  # run to the budget's end for posts by agents outside (`board post`)
    force: bool = False  # write into a non-empty --out that is not a previous tune output
    exact: bool = False  # bit-exact mode: a candidate's outputs must equal the stock kernel's byte for byte
    # A started engine (polymorph.engine.Controller) loaded at this run's one bucket, model, backend,
    # chip and dtype (`polymorph demo`'s): the first worker is a thread of this process claiming on it
    # instead of a process starting an engine of its own, and the final A/B times on it too (a fresh
    # worker for every untuned arm, as with an engine of its own). It is left open, back at stock.
    engine: Any = None
    quiet: bool = False  # no progress on stderr and no "registry: ..." line (the caller shows the report)


@dataclass
class SignatureResult:
    signature: str
    groups: list[str]
    share: float
    stock_s: float | None = None
    best: dict[str, Any] | None = (
        None  # the fastest passing candidate: kernel, config, median_s, agent, reasoning
    )
    chosen: bool = False  # the tuned plan uses it (it beat stock by WIN_MARGIN and passed the final gate)

    @property
    def speedup(self) -> float | None:
        if self.stock_s is None or self.best is None:
            return None
        return self.stock_s / self.best["median_s"]


@dataclass
class BucketResult:
    bucket: str
    weight: float
    signatures: list[SignatureResult] = field(default_factory=list)
    candidates: int = 0
    passed: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # cause kind -> count
    ab: dict[str, Any] = field(default_factory=dict)  # stock_s, tuned_s, speedup, trials, gate
    plan_dir: str = ""
    skipped: str = ""  # why the bucket was not tuned (its champions were all in the registry)
    stopped: str = ""  # why the search ended: every candidate tried, or its share of the budget spent
    spent_s: dict[str, float] = field(default_factory=dict)  # where the bucket's time went, by phase
    agent_errors: list[str] = field(default_factory=list)  # external agents' failed calls
    workers_started: int = 0
    demoted: list[str] = field(default_factory=list)  # warm starts that failed re-verification: key id: cause

    def to_json(self) -> dict[str, Any]:
        sigs = [{**s.__dict__, "speedup": s.speedup} for s in self.signatures]
        return {**self.__dict__, "signatures": sigs}


@dataclass(frozen=True)
class ProgramBucket:
    """A bucket of an imported program: its inputs' shapes, e.g. "shape-2x3x16x16" (a scalar input is
    "s", inputs joined by "-"; registry.program_bucket), and the model spec that loads the program at
    them. No batch or context: a program has no traffic."""

    shapes: tuple[tuple[int, ...], ...]
    model: str = ""  # what load_model takes: FILE.pt2 (the example's shapes) or FILE.pt2@<id>
    weight: float = 1.0
    batch: None = None
    ctx: None = None

    @property
    def id(self) -> str:
        return program_bucket_id(self.shapes)


def program_buckets(model: str, traffic: Any, batch: int | None, ctx: int | None,
                    dtype: str | None = None, quiet: bool = False) -> list[ProgramBucket]:  # fmt: skip
    """`model`'s buckets when it is an imported program (a .pt2 file): the example inputs' shapes,
    then each dynamic dim at its min and at its max; [] for any other model."""
    if not str(model).endswith(".pt2"):
        return []
    if traffic is not None or batch is not None or ctx is not None:
        raise UserError(
            f"{model} is an imported program: its buckets are its example inputs' shapes and its dynamic "
            "dims' ranges; --traffic, --batch and --ctx choose an LLM's decode buckets"
        )
    from polymorph.frontend import load_pt2

    program = load_pt2(model, dtype=dtype)
    buckets = []
    for i, sizes in enumerate(program.bucket_sizes()):
        shapes = tuple(program.at_sizes(sizes).input_shapes().values())
        spec = str(model) if i == 0 else f"{model}@{program_bucket_id(shapes)}"
        buckets.append(ProgramBucket(shapes, spec))
    if not quiet:
        for d in program.clamped():
            console.line(
                f"dynamic dim {d.symbol} has no declared max: gated up to {d.gate_range[1]} ({d.lo} <= {d.symbol}, "
                f"example {d.example}); export it with a max to gate at the real one"
            )
    return buckets


@dataclass
class TuneReport:
    model: str
    backend: str
    profile: str
    toolchain: str
    budget_s: float
    elapsed_s: float = 0.0
    buckets: list[BucketResult] = field(default_factory=list)
    exact: bool = False  # bit-exact mode

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "buckets"},
                "buckets": [b.to_json() for b in self.buckets]}  # fmt: skip


# --- the worker process -----------------------------------------------------------------------------


def worker_main(name: str, board_path: str, load: dict[str, Any], options: dict[str, Any],
                results: Any = None) -> None:  # fmt: skip
    """One engine claiming candidates until the stop file beside the board exists. Each verdict goes
    to the tune through `results` (this worker's end of a pipe only the tune reads) before it goes on
    the board: the board is a file agents write too, so the tune takes a pass only from the pipe."""
    import sys

    from polymorph.engine.controller import Controller

    die_with_parent(options["parent"])  # first: `kill -9` of the tune takes this worker and its engine
    log = Path(options["logs"]) / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout = sys.stderr = open(log, "a", buffering=1)  # noqa: SIM115 (the process's own log, to its end)
    engine = Controller.start(load["model"], load["backend"], load["profile"], batch=load["batch"], dtype=load["dtype"],
                              ctx=load["ctx"], budget_s=options["engine_budget_s"])  # fmt: skip
    try:
        claim_loop(engine, name, board_path, load, options, results)
    finally:
        engine.close()


def claim_loop(engine: Any, name: str, board_path: str, load: dict[str, Any], options: dict[str, Any],
               results: Any = None) -> None:  # fmt: skip
    """Claim, gate and time candidates on `engine` until the stop file exists (a worker process's loop,
    or a thread's on an engine the caller started: TuneOptions.engine); the engine stays open."""
    import traceback

    board = Board(board_path)
    stop = Path(options["stop"])
    sources = Path(options["sources"])
    try:
        while not stop.exists():
            cand = board.claim(name, options["lease_s"], backend=load["backend"], target=load["profile"],
                               group_suffix=f"@{load['scope']}")  # fmt: skip
            if cand is None:
                time.sleep(0.05)
                continue
            beat = _Heartbeat(board_path, cand.id, name, options["lease_s"])
            try:
                ok, cause, measurements, gates = run_candidate(
                    engine, cand, options["trials"], sources, exact=bool(options.get("exact"))
                )
            except Exception as e:  # the tuner's own failure on this candidate: recorded, the worker goes on
                traceback.print_exc()
                ok, cause, measurements, gates = False, f"error: {type(e).__name__}: {e}", {}, {}
            finally:
                beat.stop()
            if results is not None:
                results.send((cand.id, name, ok, cause, measurements, gates))
            board.post_result(cand.id, name, ok, cause, measurements, gates)
    finally:
        board.close()


class _Heartbeat:
    """Renews a claim from a thread while the candidate runs (a gate can take longer than a lease)."""

    def __init__(self, board_path: str, candidate: int, worker: str, lease_s: float) -> None:
        self._done = threading.Event()
        args = (board_path, candidate, worker, lease_s)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True)
        self._thread.start()

    def _run(self, board_path: str, candidate: int, worker: str, lease_s: float) -> None:
        board = Board(board_path)
        try:
            while not self._done.wait(lease_s / 3):
                if not board.heartbeat(candidate, worker):
                    return
        finally:
            board.close()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def run_candidate(
    engine: Any, cand: Any, trials: int, sources: Path, *, exact: bool = False
) -> tuple[bool, str, dict, dict]:
    """Swap, gate (the timing gates' fast-tier measurement is the one that counts; `exact`: bit-exact
    mode), put the stock kernel back: (ok, cause, measurements, gates)."""
    path = store_source(sources, cand.source)
    group = cand.group.split("@", 1)[0]  # board_group: the node group, then its scope
    swap, gate = engine.try_candidate(
        group, path, dict(cand.config) or None, **({"exact": True} if exact else {})
    )
    gates = gate_summary(gate)
    if not swap.ok:
        return False, f"{swap.fault.stage}: {swap.fault.cause}" if swap.fault else "swap failed", {}, gates
    if gate is None or not gate.ok:
        return False, gate_cause(gate), {}, gates
    try:
        m = gate.measurement or engine.measure("fast", trials, group)["groups"][group]
        return (
            True,
            "",
            {"median_s": m["median_s"], "spread_s": m["spread_s"], "trials": m.get("trials", trials)},
            gates,
        )
    finally:
        engine.restore(group)


def gate_summary(gate: Any) -> dict[str, Any]:
    """Gate name -> what it said, from a controller GateResult."""
    if gate is None:
        return {}
    gates = getattr(gate, "gates", None)
    if gates:
        return {g.name: {"ok": g.ok, "verdict": g.verdict, "cause": g.cause} for g in gates}
    return {"numerics": {"ok": gate.ok, "cause": "" if gate.ok else gate_cause(gate)}}


def gate_cause(gate: Any) -> str:
    if gate is None:
        return "swap failed"
    if gate.faults:
        f = gate.faults[0]
        return f"{f.stage}: {f.cause}"
    for g in getattr(gate, "gates", None) or ():
        if not g.ok:
            return f"{g.name}: {g.cause}"
    failure = gate.first_failure() if hasattr(gate, "first_failure") else None
    return f"numerics: {failure.step}: {failure.comparison}" if failure else "gate failed"


# --- the controller side -----------------------------------------------------------------------------


def tune(opts: TuneOptions, progress: Callable[[dict[str, Any]], None] | None = None) -> TuneReport:
    """Run the loop; write OUT/plan.json (the tuned plan of the heaviest bucket, usable by
    `polymorph run OUT`), OUT/<bucket>/ for the others, and OUT/tune-report.json."""
    from polymorph.hardware.profile import load_profile
    from polymorph.pipeline.backend import registry as backends

    if opts.workers < 1:
        raise UserError("--workers must be at least 1")
    backend = backends.get(opts.backend)
    profile = load_profile(opts.target or backend.targets[0]).id
    if profile not in backend.targets:
        raise UserError(
            f"backend `{opts.backend}` does not serve chip `{profile}`; its chips: {', '.join(backend.targets)}"
        )
    probe = backend.probe()
    if not probe.measure.ok:
        raise UserError(
            f"`tune` measures on the device, and backend `{opts.backend}` cannot here: {probe.measure.reason}"
        )
    programs = program_buckets(opts.model, opts.traffic, opts.batch, opts.ctx, opts.dtype, opts.quiet)
    buckets = programs or buckets_of(opts.traffic, opts.batch, opts.ctx)
    claim_out(opts.out, "tune", force=opts.force)  # a previous tune's folder: this run resumes from it
    if opts.wait_for_posts:
        console.line(
            f"agents take part with: polymorph board post --board {opts.board or opts.out / 'board.sqlite'} "
            f"--backend {opts.backend} --target {profile} --kernel FILE [--config JSON] --reasoning TEXT GROUP; "
            f"then: polymorph board wait ID"
        )
    reg = Registry(opts.registry or opts.out / "registry.sqlite")
    if not opts.quiet:
        console.line(f"registry: {reg.path}; board: {opts.board or opts.out / 'board.sqlite'}")
    report = TuneReport(
        opts.model, opts.backend, profile, toolchain(opts.backend), opts.budget_s, exact=opts.exact
    )
    started = time.monotonic()
    try:
        with _host_calibration(opts, backend, profile):
            for i, bucket in enumerate(buckets):
                left = opts.budget_s - (time.monotonic() - started)
                share = left * bucket.weight / sum(b.weight for b in buckets[i:])
                out_dir = opts.out if i == 0 else opts.out / bucket.id
                report.buckets.append(
                    _tune_bucket(
                        opts, backend, profile, bucket, reg, share, out_dir, report.toolchain, progress
                    )
                )
    finally:
        reg.close()
    report.elapsed_s = time.monotonic() - started
    (opts.out / "tune-report.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
    return report


@contextmanager
def _host_calibration(opts: TuneOptions, backend: Any, profile: str) -> Iterator[None]:
    """A cpu tune on a host with no calibration calibrates it first (`polymorph microbench --backend cpu
    --quick`, a few seconds of the budget, written into OUT/calibration/ and used by this run only), so
    that its report's predictions, each group's floor and roofline gap (what `polymorph mcp` shows an
    agent) rest on this host's measured rates rather than being absent. A calibration already there
    (POLYMORPH_CALIBRATION_DIR or hwprofiles/measured) is used as it is."""
    from polymorph.hardware.profile import load_profile

    if backend.name != "cpu" or load_profile(profile, knobs.calibration_dir).calibration is not None:
        yield
        return
    from polymorph.backends.cpu.microbench import run_suite, write_calibration

    folder = opts.out / "calibration"
    if not (folder / f"{profile}.toml").is_file():  # a resumed run keeps the first run's
        write_calibration(folder, run_suite(quick=True, threads=1))
    if not opts.quiet:
        console.line(f"calibrated this host for the run's predictions (quick suite): {folder}")
    with knobs.scope(calibration_dir=folder):
        yield


RELATED_WARM_STARTS = 2  # champions of other chips, toolchains or buckets posted per op signature


def kin_profiles(backend: Any) -> list[str]:
    """The chips whose kernels `backend` can build: those of every backend of its kernel language (cuda
    and rocm share the Triton library)."""
    from polymorph.pipeline.backend import registry as backends

    return [t for name in backends.names() if backends.get(name).language == backend.language
            for t in backends.get(name).targets]  # fmt: skip


def _stored(folder: Path, champ: Champion) -> Path:
    """A champion's kernel file under `folder`, the files it depends on beside it (where
    kernel_files.depend looks first)."""
    for text in champ.shared.values():
        store_source(folder, text)
    return store_source(folder, champ.source)


def board_group(group: str, scope: str) -> str:
    """The board's group field: the node group qualified by `scope` (the bucket it is measured at and
    the model's graph hash), so the same kernel for the same group name at another bucket or in another
    model is another candidate (the board's dedup key), and a worker claims only its own scope's."""
    return f"{group}@{scope}"


def run_scope(bucket: str, graph_hash: str) -> str:
    return f"{bucket}@{graph_hash[:12]}"


class _Run:
    """The posting side of one bucket's run: what was posted, what came back."""

    def __init__(self, board: Board, backend: str, profile: str, scope: str) -> None:
        self.board, self.backend, self.profile, self.scope = board, backend, profile, scope
        self.posted: dict[int, Proposal] = {}
        self.tried: dict[tuple, Outcome | None] = {}
        self.seen: set[int] = set()
        self.channels: list[Any] = []  # the read ends of the workers' result pipes
        self.trusted: dict[int, Result] = {}  # verdicts this run's workers sent, by candidate id
        self.reopened: set[int] = set()

    def pending(self) -> list[int]:
        return [cid for cid in self.posted if cid not in self.seen]

    def post(self, p: Proposal) -> int:
        cid = self.board.post(group=board_group(p.group, self.scope), backend=self.backend, target=self.profile,
                              source=p.kernel.read_text(), config=dict(p.config), agent=p.agent,
                              reasoning=p.reasoning)  # fmt: skip
        self.posted.setdefault(cid, p)
        self.tried.setdefault(p.key, None)
        return cid

    def receive(self) -> None:
        """Take in what the workers sent on their pipes (a dead worker's pipe is dropped)."""
        for conn in list(self.channels):
            try:
                while conn.poll():
                    cid, worker, ok, cause, measurements, gates = conn.recv()
                    self.trusted.setdefault(cid, Result(cid, "", worker, bool(ok), cause, dict(measurements),
                                                        dict(gates), time.time(), 0))  # fmt: skip
            except (EOFError, OSError, ValueError, TypeError):
                self.channels.remove(conn)
                conn.close()

    def collect(self) -> list[tuple[Proposal, Any]]:
        """The verdicts that came in since the last call. A pass counts only as this run's own workers
        sent it on their pipes; a passing result on the board that did not come that way (a previous
        run's, when a rerun resumes, or one written into the file by anyone else) is measured again.
        A failure is taken from the board too: the board itself records lost workers and duplicates."""
        self.receive()  # first: a worker sends on its pipe before it posts on the board
        news = []
        # Not `after=`: a candidate retried after its worker died finishes after later ids have.
        for r in self.board.results(after=min(self.pending(), default=1 << 62) - 1):
            p = self.posted.get(r.candidate)
            if p is None or r.candidate in self.seen:  # another run's candidate, or already counted
                continue
            if r.ok:
                if r.candidate not in self.trusted:
                    if r.candidate not in self.reopened:
                        self.reopened.add(r.candidate)
                        self.board.reopen(r.candidate)
                    continue
                r = self.trusted[r.candidate]
            self.seen.add(r.candidate)
            median = r.measurements.get("median_s") if r.ok else None
            self.tried[p.key] = Outcome(r.ok, median, r.cause)
            news.append((p, r))
        return news

    def adopt_posts(self, by_group: Mapping[str, GroupSpace], sources: Path) -> int:
        """Take in candidates posted to the board from outside (`polymorph board post GROUP KERNEL`,
        any agent) for a bare node group of this plan, on this run's backend and chip: each is
        re-addressed into this run's scope at its signature's representative group and measured as
        the built-in agents' proposals are. A config-only post is for the plan's stock kernel.
        Returns how many were taken."""
        taken = 0
        for c in self.board.candidates("open", bare=True):  # not the scoped ones: every run's own posts
            space = by_group.get(c.group)
            if space is None or c.backend != self.backend or c.target != self.profile:
                continue  # not for this plan
            stock = space.stock_kernel.read_text() if c.source is None else None
            kernel = store_source(sources, c.source) if c.source is not None else space.stock_kernel
            p = Proposal(space.signature, space.group, kernel, dict(c.config), c.agent or "external",
                         c.reasoning or "posted to the board from outside the tune")  # fmt: skip
            cid = self.board.adopt(c.id, board_group(space.group, self.scope), source=stock)
            self.posted.setdefault(cid, p)
            self.tried.setdefault(p.key, None)
            taken += 1
        return taken

    @property
    def inflight(self) -> int:
        return sum(1 for p in self.posted.values() if self.tried.get(p.key) is None)


def _tune_bucket(opts: TuneOptions, backend: Any, profile: str, bucket: Any, reg: Registry, budget_s: float,
                 out_dir: Path, tc: str, progress: Callable | None) -> BucketResult:  # fmt: skip
    from polymorph import api

    t0 = time.monotonic()
    from polymorph.models import load_model

    program = isinstance(bucket, ProgramBucket)
    spec = bucket.model if program else opts.model  # a program at this bucket's shapes
    model = load_model(spec, **({"dtype": opts.dtype} if opts.dtype else {}))
    artifact = api.compile(model, opts.backend, profile, batch=bucket.batch, ctx=bucket.ctx)
    plan = artifact.plan
    spaces = group_spaces(plan, backend.language, predicted_times(artifact.report))
    bucket_key = bucket.id if program else shape_bucket(bucket)
    keyed = not opts.exact  # this run's champions are the registry's to warm-start from
    result = BucketResult(bucket_key, bucket.weight)
    by_sig = {s.signature: SignatureResult(s.signature, list(s.groups), s.share) for s in spaces.spaces}
    result.signatures = list(by_sig.values())

    board = Board(opts.board or opts.out / "board.sqlite")
    board.release(dead_run_worker)  # a killed run's claims (a rerun resumes): claimable now, not in a lease
    from polymorph.ir import serialize

    scope = run_scope(bucket_key, serialize.content_hash(plan.graph))
    run = _Run(board, opts.backend, profile, scope)
    publish_tune(
        board, opts, profile, bucket_key, scope, spaces, artifact.report, budget_s, tc
    )  # for `polymorph mcp`
    stock_ids: dict[int, str] = {}
    champions = {
        s.signature: reg.best(ChampionKey(s.signature, bucket_key, profile, tc)) if keyed else None
        for s in spaces.spaces
    }
    # warm-start candidate id -> (the registry champion it re-verifies, whether it is this key's own)
    warm: dict[int, tuple[Champion, bool]] = {}
    for space in spaces.spaces:
        stock = Proposal(space.signature, space.group, space.stock_kernel, space.stock_config, "baseline",
                         "the stock kernel and config of the plan `compile` makes, measured the same way")  # fmt: skip
        stock_ids[run.post(stock)] = space.signature
        champ = champions[space.signature]
        if champ is not None:
            path = _stored(opts.out / "sources", champ)
            space.champion = (path, dict(champ.config))
            warm[run.post(Proposal(space.signature, space.group, path, champ.config, "registry",
                              f"warm start: the registry's champion for this key ({champ.measurement.median_s * 1e6:.1f} us "
                              f"when recorded), re-verified here; it came from {champ.agent}: {champ.reasoning}"))] = (champ, True)  # fmt: skip
            continue
        if not keyed:
            continue
        key = ChampionKey(space.signature, bucket_key, profile, tc)
        for other in reg.related(key, kin_profiles(backend))[:RELATED_WARM_STARTS]:
            k = other.key
            warm[run.post(Proposal(space.signature, space.group, _stored(opts.out / "sources", other), other.config,
                              "registry", f"warm start from the champion of the same op on {k.profile} at {k.bucket} "
                              f"({k.toolchain}; {other.measurement.median_s * 1e6:.1f} us there), compiled and "
                              f"re-verified here; it came from {other.agent}: {other.reasoning}"))] = (other, False)  # fmt: skip
    covered = spaces.spaces and all(champions[s.signature] is not None for s in spaces.spaces)
    if covered:
        result.skipped = (
            "every op signature has a champion in the registry for this bucket, profile and toolchain"
        )

    load = {"model": spec, "backend": opts.backend, "profile": profile, "batch": bucket.batch,
            "ctx": bucket.ctx, "scope": scope, "dtype": opts.dtype}  # fmt: skip
    stop = opts.out / f".stop-{bucket.id}"
    stop.unlink(missing_ok=True)
    options = {"stop": str(stop), "sources": str(opts.out / "sources"), "logs": str(opts.out / "logs"),
               "trials": opts.trials, "parent": os.getpid(),
               "lease_s": opts.lease_s, "engine_budget_s": opts.engine_budget_s, "exact": opts.exact}  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    shared = opts.engine if engine_fits(opts.engine, load) else None

    def start_worker() -> None:
        name = worker_name(bucket.id, result.workers_started)
        receive, send = ctx.Pipe(
            duplex=False
        )  # one pipe per worker: a worker killed mid-send spoils only its own
        if shared is not None and not any(isinstance(p, threading.Thread) for p in procs):
            # The caller's engine, already loaded: no process and no engine start. Should this thread
            # end early, its replacement is a worker process with an engine of its own.
            p: Any = threading.Thread(target=claim_loop, args=(shared, name, str(board.path), load, options, send),
                                      name=name, daemon=True)  # fmt: skip
            p.start()
        else:
            p = ctx.Process(
                target=worker_main, args=(name, str(board.path), load, options, send), name=name, daemon=True
            )
            p.start()
            send.close()
        run.channels.append(receive)
        procs.append(p)
        result.workers_started += 1

    for _ in range(opts.workers):
        start_worker()
    externals = _external_agents(opts, spaces.spaces, by_sig, artifact.report, profile)
    schedule = Schedule(spaces.spaces, [*externals, *builtin_agents(opts.seed)])
    # The final A/B: a fresh engine's start, one gate, then MIN_PAIRS pairs or more of whole steps. Its
    # share (a quarter of the budget, 120 s at most) grows past 120 s, to a quarter at most, when an engine
    # start seen here says it needs to; within its share it times fewer steps per arm, never fewer pairs.
    # It is set aside only while some candidate beats stock: with none, there is nothing to A/B (both
    # arms would run the same plan) and the search runs to the budget's end.
    ab_reserve = 0.0 if program else min(0.25 * budget_s, 120.0)  # a program has no final A/B
    deadline = t0 + budget_s
    ready_s: float | None = None  # the first worker's start, until its first claim
    by_group = {g: space for space in spaces.spaces for g in space.groups}
    searching = time.monotonic()  # progress (the CLI's, on stderr) over the search's share of the budget
    shown = ExitStack()
    shown_s = deadline - ab_reserve - searching
    advance = (
        _no_progress
        if opts.quiet
        else shown.enter_context(console.progress(shown_s, f"tuning {result.bucket}", " s"))
    )
    try:
        while time.monotonic() < deadline:
            run.adopt_posts(by_group, opts.out / "sources")
            collected = run.collect()
            for p, r in collected:
                _record(result, by_sig, stock_ids, run, p, r)
                demoted = _demote_if_failed(reg, result, warm, r)
                if demoted is not None and warm[r.candidate][1]:
                    # This bucket's own champion failed: its signature is searched again, in this run.
                    champions[demoted.key.op_signature] = None
                    for space in spaces.spaces:
                        if space.signature == demoted.key.op_signature:
                            space.champion = None
                    covered, result.skipped = False, ""
            if collected:
                _measured_shares(spaces.spaces, by_sig)
            alive = [p for p in procs if p.is_alive()]
            if len(alive) < opts.workers and result.workers_started >= 3 * opts.workers + 3:
                raise UserError(
                    f"the tune workers keep dying ({result.workers_started} started); see {opts.out / 'logs'}"
                )
            for _ in range(opts.workers - len(alive)):  # a worker died: its claim will expire; replace it
                start_worker()
            if not covered and run.inflight < 2 * opts.workers:
                for p in schedule.next_batch(run.tried, 2 * opts.workers - run.inflight):
                    run.post(p)
            if (
                run.inflight == 0
                and not schedule.waiting
                and not opts.wait_for_posts
                and (covered or not schedule.next_batch(run.tried, 1))
            ):
                result.stopped = (
                    "early: every op signature has a champion in the registry (re-verified, not searched)"
                    if covered
                    else f"early: every candidate the agents proposed was tried ({len(run.posted)} posted)"
                )
                break
            if ready_s is None and (run.trusted or board.candidates("claimed")):
                ready_s = time.monotonic() - searching
            need = _ab_need(opts, result, 0.0 if shared else ready_s)  # a shared engine: no start
            ab_reserve = 0.0 if program else max(ab_reserve, min(0.25 * budget_s, need))
            deadline = t0 + budget_s - (ab_reserve if _winners(spaces.spaces, by_sig) else 0.0)
            if progress is not None:
                progress(_progress(result, run, procs, deadline))
            advance(at=time.monotonic() - searching, note=f"{result.candidates} done, {result.passed} passed")
            time.sleep(0.1)
    finally:
        result.spent_s["search"] = time.monotonic() - t0  # the compile and the workers' start included
        shown.close()
        for agent in externals:
            agent.close()
        try:
            stop.touch()
        except OSError:
            pass  # the workers are killed below if they do not stop
        # A worker process that never claimed a candidate is idle (it stops within a poll) or still
        # starting its engine: it has nothing to finish, and would see the stop file only once its
        # engine had loaded, so it gets a moment to close its engine, not the engine's budget.
        engaged = {c.worker for c in board.candidates() if c.worker}
        for p in procs:
            if isinstance(p, threading.Thread):
                p.join(timeout=opts.engine_budget_s)  # the engine's own budget bounds the candidate it runs
                continue
            p.join(timeout=opts.engine_budget_s if p.name in engaged else 2.0)
            if p.is_alive():
                p.kill()
                p.join()
        stop.unlink(missing_ok=True)
    result.spent_s["workers_stop"] = time.monotonic() - t0 - result.spent_s["search"]
    if not result.stopped:
        left = len(run.pending())
        share = (
            f"the search's share of the budget ({budget_s - ab_reserve:.0f} s of {budget_s:.0f} s; the rest "
            "is the final A/B's) was spent"
            if _winners(spaces.spaces, by_sig)
            else f"the budget ({budget_s:.0f} s) was spent, with no time set aside for a final A/B (no "
            "candidate beat stock)"
        )
        result.stopped = (
            share
            + (f", {left} candidates still in flight" if left else "")
            + ("; it waited for posts from outside agents" if opts.wait_for_posts else "")
        )
    for p, r in run.collect():
        _record(result, by_sig, stock_ids, run, p, r)
        _demote_if_failed(reg, result, warm, r)
    board.close()
    result.agent_errors = [e for a in externals for e in a.errors]
    try:
        ab_began = time.monotonic()
        if program:
            result.ab = _program_ab(spaces.spaces, by_sig)
        else:
            result.ab = _final_ab(opts, profile, bucket, spaces.spaces, by_sig, run, deadline=t0 + budget_s,
                                  engine=shared)  # fmt: skip
        result.spent_s["final_ab"] = time.monotonic() - ab_began
    except (UserError, EngineError) as e:  # a champion hung or crashed the engine in whole steps
        if shared is not None:
            _back_to_stock(shared)
        for sig in by_sig.values():
            sig.chosen = False
        result.ab = {"error": str(e), "plan": "untuned: the final A/B failed", "speedup": None,
                     "stock_s": [], "tuned_s": [], "pairs": 0, "rounds": 0, "trials": 0, "gate": "not run"}  # fmt: skip
        result.plan_dir = str(_write_plan(backend, plan, spaces.spaces, by_sig, out_dir))
        return result
    # Per-op champions go to the registry unless the final gate rejected them together.
    # A skipped A/B (a program's) leaves each to its own gates.
    if result.ab["gate"] == "passed" or result.ab.get("skipped"):
        _offer(reg, result, spaces.spaces, run, bucket_key, profile, tc, plan)
    if result.ab.get("verdict") == SLOWER and any(s.chosen for s in by_sig.values()):
        # Faster kernel by kernel, slower end to end in the same run (the whole interval above 1): the
        # untuned plan is the one written.
        for sig in by_sig.values():
            sig.chosen = False
        result.ab["plan"] = "untuned: the tuned plan was slower end to end"
    elif any(s.chosen for s in by_sig.values()):
        # No difference above noise end to end still leaves each chosen kernel's own win (>= WIN_MARGIN).
        result.ab["plan"] = "tuned"
    else:
        result.ab["plan"] = "untuned: no champion beat stock"
    result.plan_dir = str(_write_plan(backend, plan, spaces.spaces, by_sig, out_dir))
    result.spent_s["total"] = time.monotonic() - t0
    return result


def _external_agents(opts: TuneOptions, spaces: list[GroupSpace], by_sig: dict, report: Any,
                     profile: str) -> list[Any]:  # fmt: skip
    """The external agents the options name, each told the chip's figures and each space's measured
    stock time and roofline floor as the run learns them."""
    from polymorph.hardware.profile import load_profile
    from polymorph.search.external import CommandAgent, EndpointAgent

    prof = load_profile(profile)
    figures = []
    for label, value in (
        ("memory bandwidth", prof.memory_bandwidth()),
        ("bf16 peak", prof.peak_flops("bf16")),
    ):
        if value:
            figures.append(f"{label} {value / 1e12:.3g} {'TB/s' if 'bandwidth' in label else 'TFLOP/s'}")
    floors = {k.group: k.floor_s if k.floor_s is not None else k.predicted_s for k in report.kernels}

    def context_of(space: GroupSpace) -> dict[str, Any]:
        return {"backend": opts.backend, "target": profile, "profile": ", ".join(figures) or "no figures",
                "stock_s": by_sig[space.signature].stock_s, "floor_s": floors.get(space.group)}  # fmt: skip

    sources = opts.out / "sources"
    agents: list[Any] = []
    if opts.agent_command:
        agents.append(
            CommandAgent("command", sources, context_of, opts.agent_calls, command=opts.agent_command)
        )
    if opts.agent_endpoint:
        agents.append(EndpointAgent("endpoint", sources, context_of, opts.agent_calls, base_url=opts.agent_endpoint,
                                    model=opts.agent_model, api_key=opts.agent_api_key))  # fmt: skip
    return agents


def _record(result: BucketResult, by_sig: dict, stock_ids: dict, run: _Run, p: Proposal, r: Any) -> None:
    result.candidates += 1
    sig = by_sig[p.signature]
    if not r.ok:
        kind = r.cause.split(":", 1)[0] or "failed"
        result.failed[kind] = result.failed.get(kind, 0) + 1
        return
    result.passed += 1
    median = float(r.measurements["median_s"])
    if r.candidate in stock_ids:
        sig.stock_s = median
    if sig.best is None or median < sig.best["median_s"]:
        sig.best = {"kernel": library_path(p.kernel), "path": str(p.kernel), "config": dict(p.config),
                    "median_s": median, "spread_s": r.measurements.get("spread_s"), "agent": p.agent,
                    "reasoning": p.reasoning, "gates": r.gates, "candidate": r.candidate,
                    "trials": r.measurements.get("trials")}  # fmt: skip


def _measured_shares(spaces: list[GroupSpace], by_sig: dict) -> None:
    """Each space's share of the step from its stock kernel's measured time (times its groups), once
    every space's stock kernel has been measured: the schedule then works on the groups that take the
    time, not on those the compile's prediction favoured (on a cpu without a calibration the prediction
    is bytes moved, which put rope and the norms at 0% of a step they took a third of)."""
    times = {s.signature: by_sig[s.signature].stock_s for s in spaces}
    if not times or any(t is None for t in times.values()):
        return
    total = sum(t * len(s.groups) for s, t in ((s, times[s.signature]) for s in spaces)) or 1.0
    for space in spaces:
        space.share = times[space.signature] * len(space.groups) / total
        by_sig[space.signature].share = space.share


def _demote_if_failed(reg: Registry, result: BucketResult, warm: Mapping[int, tuple[Champion, bool]],
                      r: Any) -> Champion | None:  # fmt: skip
    """Demote the registry champion that candidate `r` re-verified, when it failed here; return it
    (a pass instead replaces this key's champion's recorded time by the one measured here).
    This key's own champion is demoted on any failure (it was recorded as passing at exactly these
    shapes); a champion of another key (chip, bucket, toolchain) only when a gate rejected it, not when
    it could not be built or run here (its shapes or toolchain may not be this one's)."""
    if r.candidate not in warm:
        return None
    champ, here = warm[r.candidate]
    if r.ok:  # re-verified: what it is worth is what was measured here, not what it came with
        if here:
            m = r.measurements
            trials = m.get("trials")
            measured = Measurement(float(m["median_s"]), float(m.get("spread_s") or 0.0),
                                   trials if isinstance(trials, int) and trials >= 1 else 1)  # fmt: skip
            reg.remeasure(champ.key, champ.sha256, champ.config, measured)
        return None
    gate_rejected = any(isinstance(g, Mapping) and g.get("ok") is False for g in (r.gates or {}).values())
    if not (here or gate_rejected):
        return None
    cause = f"failed re-verification in a tune at {result.bucket}: {r.cause}"
    if not reg.demote(champ.key, champ.sha256, champ.config, cause):
        return None
    result.demoted.append(f"{champ.key.id}: {r.cause}")
    return champ


def _offer(reg: Registry, result: BucketResult, spaces: list[GroupSpace], run: _Run, bucket_key: str,
           profile: str, tc: str, plan: Any) -> None:  # fmt: skip
    from polymorph.ir.dtypes import DType
    from polymorph.verify.tolerance import model_tolerance

    tol = model_tolerance(DType.parse(plan.graph.meta.get("dtype", "f32")))
    for sig in result.signatures:
        if sig.best is None:
            continue
        b = sig.best
        gates = tuple(name for name, g in (b["gates"] or {}).items() if g.get("ok")) or ("numerics",)
        source = Path(b["path"]).read_text()
        shared = {sha: text for _, sha, text in pinned_sources(source, Path(b["path"]).parent)}
        reg.offer(Champion(key=ChampionKey(sig.signature, bucket_key, profile, tc), shared=shared,
                           source=source, config=b["config"],
                           measurement=Measurement(b["median_s"], b["spread_s"] or 0.0, int(b["trials"] or 1)),
                           gates=gates, tolerance=tol, reasoning=b["reasoning"], agent=b["agent"],
                           kernel=b["kernel"]))  # fmt: skip


def _winners(spaces: list[GroupSpace], by_sig: dict) -> dict[str, tuple[GroupSpace, dict]]:
    out = {}
    for space in spaces:
        sig = by_sig[space.signature]
        if sig.best is None or sig.stock_s is None:
            continue
        stock = (str(space.stock_kernel.resolve()), json.dumps(dict(space.stock_config), sort_keys=True))
        best = (str(Path(sig.best["path"]).resolve()), json.dumps(sig.best["config"], sort_keys=True))
        if best != stock and sig.best["median_s"] < sig.stock_s * (1 - WIN_MARGIN):
            out[space.signature] = (space, sig.best)
    return out


AB_MAX_PAIRS = 60  # the final A/B stops here even with time left
AB_ROUND_S = 0.03  # an A/B round of an arm lasts about this long when ab_trials is 0
AB_MIN_STEPS, AB_MAX_STEPS = 3, 40


def _step_estimate(signatures: Iterable[SignatureResult]) -> float:
    """A whole decode step's seconds, roughly: three times the stock kernels' measured times (the host's
    own work per step besides), 1 ms at least."""
    kernels_s = sum(s.stock_s * len(s.groups) for s in signatures if s.stock_s is not None)
    return max(3.0 * kernels_s, 1e-3)


def ab_round_steps(opts: TuneOptions, signatures: Iterable[SignatureResult]) -> int:
    """Steps per round of an arm in the final A/B: `opts.ab_trials` when set, else enough that a round
    lasts AB_ROUND_S by the step estimate, between AB_MIN_STEPS and AB_MAX_STEPS. A step's time is the
    difference of a long and a short request over the round's steps, so a round of three millisecond
    steps carries the whole request's jitter into each step; on the 2-core box three steps an arm left a
    60 s tune's interval wider than its kernels' gain."""
    if opts.ab_trials > 0:
        return opts.ab_trials
    return int(min(AB_MAX_STEPS, max(AB_MIN_STEPS, math.ceil(AB_ROUND_S / _step_estimate(signatures)))))


def _ab_need(opts: TuneOptions, result: BucketResult, ready_s: float | None) -> float:
    """Seconds the final A/B will take, roughly: an engine start as long as the search worker's was
    (to its first claim), one gate, and `ab_pairs` pairs of whole steps at the step estimate."""
    step_s = _step_estimate(result.signatures)
    # Controller.measure("slow"): a warm-up and two short requests, then three rounds
    steps_per_arm = 3 + 3 * (ab_round_steps(opts, result.signatures) + 1)
    pair_s = 2 * steps_per_arm * step_s + 0.2  # 0.2 s: a swap, or a fresh worker for the untuned arm
    pairs_s = max(opts.ab_pairs, MIN_PAIRS) * pair_s
    return 1.1 * (ready_s if ready_s is not None else 10.0) + 2.0 + pairs_s


def _final_ab(opts: TuneOptions, profile: str, bucket: Any, spaces: list[GroupSpace], by_sig: dict,
              run: _Run, deadline: float | None = None, engine: Any = None) -> dict[str, Any]:  # fmt: skip
    """Untuned against tuned, whole decode steps (slow tier), in one fresh engine: `opts.ab_pairs`
    pairs or more (up to AB_MAX_PAIRS while `deadline`, a time.monotonic() instant, allows), each pair
    one untuned and one tuned timing back to back, the order alternating (tuned first in even pairs,
    untuned first in odd ones) so that drift on a shared machine and the order itself hit both arms.
    The winners are gated once, first, over every group they go into. Every untuned timing runs on a
    fresh worker no candidate touched. Should the pairs not fit before `deadline` at `opts.ab_trials`
    steps per arm, fewer steps are timed per arm, never fewer pairs. The verdict is the bootstrap
    interval's (polymorph.search.ab), seeded with `opts.seed`.

    With no winner there is nothing to compare (both arms would run the same plan): no engine starts,
    and the answer says why it was skipped. `engine`: the caller's engine at this bucket (the search's,
    TuneOptions.engine) instead of a fresh one; every untuned timing still runs on a fresh worker, and
    the engine is handed back at stock, open."""
    from polymorph.engine.controller import Controller

    winners = _winners(spaces, by_sig)
    if not winners:
        return {"skipped": f"no candidate beat its stock kernel by {WIN_MARGIN:.0%}, so both arms would run "
                           "the same plan", "gate": "not run", "speedup": None, "stock_s": [], "tuned_s": [],
                "pairs": 0, "rounds": 0, "trials": 0, "same_plan": True}  # fmt: skip
    t0 = time.perf_counter()
    own = engine is None
    if own:
        engine = Controller.start(opts.model, opts.backend, profile, batch=bucket.batch, ctx=bucket.ctx,
                                  dtype=opts.dtype, budget_s=opts.engine_budget_s)  # fmt: skip
    else:
        _back_to_stock(engine)  # whatever the search left: stock kernels, a fresh worker
    stock: list[float] = []
    tuned: list[float] = []
    gate, swapped, trials = None, 0, ab_round_steps(opts, by_sig.values())
    fewest = min(trials, 2)  # a time per step is the difference of two runs: fewer steps, more noise
    want = max(2, opts.ab_pairs)

    def put_tuned(first: bool) -> int:
        n = 0
        for sig, (space, best) in list(winners.items()):
            ok = [engine.swap(group, best["path"], best["config"]).ok for group in space.groups]
            if all(ok):
                n += len(ok)
                continue
            if not first:
                raise UserError(f"the final A/B could not swap the champion of {sig} in again")
            for group in space.groups:  # a winner goes into every group of its signature, or into none
                engine.restore(group)
            del winners[sig]
        return n

    def put_stock() -> None:
        engine.reset()
        engine.replace_worker(())  # a fresh worker: nothing a candidate did while it ran stays for stock

    state = "unknown"  # which arm the engine holds (unknown until the first swap: not stock)
    try:
        start_s = time.perf_counter() - t0
        if winners:
            swapped = put_tuned(True)
            if swapped:
                gate = engine.verify()
                if not gate.ok:  # the champions together fail where each passed alone: keep none
                    winners, swapped = {}, 0
            if not winners:
                put_stock()
        state = "tuned" if winners else "stock"
        while True:
            began = time.monotonic()
            got = {}
            for arm in ("tuned", "stock") if len(stock) % 2 == 0 else ("stock", "tuned"):
                if winners and arm != state:
                    if arm == "stock":
                        put_stock()
                    else:
                        put_tuned(False)
                    state = arm
                got[arm] = _slow(engine, trials)["min_s"]  # the fastest of its rounds
            stock.append(got["stock"])
            tuned.append(got["tuned"])
            took = time.monotonic() - began
            left = float("inf") if deadline is None else deadline - time.monotonic()
            if len(stock) < want:
                need = (want - len(stock)) * took
                if need > left and trials > fewest:  # fewer steps per arm rather than fewer pairs
                    trials = max(fewest, int(trials * left / need))
                continue
            if deadline is None or len(stock) >= AB_MAX_PAIRS or took > left:
                break
    finally:
        if own:
            engine.close()
        elif state != "stock":
            _back_to_stock(engine)
    for sig in winners:
        by_sig[sig].chosen = True
    interval = paired_ratio(stock, tuned, seed=opts.seed)
    return {"engine_start_s": start_s, "stock_s": stock, "tuned_s": tuned, **interval.to_json(),
            "speedup": 1.0 / interval.ratio, "rounds": len(stock), "trials": trials,
            "order": "alternating: tuned first in even pairs, untuned first in odd ones",
            "same_plan": not winners, "swapped_groups": swapped, "elapsed_s": time.perf_counter() - t0,
            "engine": "fresh" if own else "the search's",
            "gate": "passed" if gate is None or gate.ok else gate_cause(gate)}  # fmt: skip


def _program_ab(spaces: list[GroupSpace], by_sig: dict) -> dict[str, Any]:
    """An imported program's final A/B: none (no decode step to time whole, no scenario to gate the
    winners together on); each winner passed its own gates at the program's shapes and is chosen."""
    winners = _winners(spaces, by_sig)
    for sig in winners:
        by_sig[sig].chosen = True
    return {"skipped": "an imported program has no decode step to time whole; each winner passed its own "
                       "gates at the program's shapes", "gate": "not run", "speedup": None, "stock_s": [],
            "tuned_s": [], "pairs": 0, "rounds": 0, "trials": 0, "same_plan": not winners}  # fmt: skip


def engine_fits(engine: Any, load: Mapping[str, Any]) -> bool:
    """Whether `engine` (a started Controller) holds what a worker would load for `load`: the same
    model, backend, chip, bucket and dtype."""
    if engine is None:
        return False
    from polymorph.pipeline.backend import registry as backends

    args = engine.load_args
    target = args.get("target") or backends.get(args["backend"]).targets[0]
    bucket = engine.loaded.get("bucket") or {}
    # A program (no batch, no context: its shapes are in its model spec) fits an engine started without.
    program = (load["batch"], load["ctx"]) == (None, None) == (args.get("batch"), args.get("ctx"))
    return (str(args["model"]) == str(load["model"]) and args["backend"] == load["backend"]
            and target == load["profile"] and args.get("dtype") == load["dtype"]
            and (program or (bucket.get("batch"), bucket.get("ctx")) == (load["batch"], load["ctx"])))  # fmt: skip


def _back_to_stock(engine: Any) -> None:
    engine.reset()
    engine.replace_worker(())  # a fresh worker: nothing a candidate did stays


def _no_progress(n: float = 1, note: str = "", at: float | None = None) -> None:
    return None


def _slow(engine: Any, trials: int) -> dict[str, Any]:
    m = engine.measure("slow", trials)
    if "fault" in m:
        raise UserError(f"the final A/B lost its engine while timing whole steps: {m['fault']}")
    return m


def _write_plan(backend: Any, plan: Any, spaces: list[GroupSpace], by_sig: dict, out_dir: Path) -> Path:
    """The tuned plan: each chosen champion in every group of its signature; compiled into out_dir."""
    from polymorph.pipeline.kernel_files import load_kernel
    from polymorph.pipeline.plan import KernelChoice

    choice: dict[str, KernelChoice] = {}
    for space in spaces:
        sig = by_sig[space.signature]
        if not sig.chosen:
            continue
        kernel = load_kernel(sig.best["path"])
        for g in space.groups:
            choice[g] = KernelChoice(library_path(kernel.path), kernel.sha256, dict(sig.best["config"]))
    tuned = replace(plan, groups=[replace(g, kernel=choice.get(g.id, g.kernel)) for g in plan.groups])
    out_dir.mkdir(parents=True, exist_ok=True)
    backend.compile(tuned, out_dir)
    return out_dir


def _progress(result: BucketResult, run: _Run, procs: list, deadline: float) -> dict[str, Any]:
    return {"bucket": result.bucket, "posted": len(run.posted), "done": result.candidates, "passed": result.passed,
            "failed": dict(result.failed), "workers": [p.pid for p in procs if p.is_alive() and hasattr(p, "pid")],
            "threads": sum(1 for p in procs if p.is_alive() and not hasattr(p, "pid")),  # on the caller's engine
            "left_s": max(0.0, deadline - time.monotonic()),
            "best": {s.signature: s.speedup for s in result.signatures if s.speedup}}  # fmt: skip
