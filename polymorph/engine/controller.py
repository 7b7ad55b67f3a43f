"""The engine controller: the trusted side, and the Python client of an engine.

    from polymorph.engine import Controller
    with Controller.start("llama-tiny", backend="cpu") as engine:
        swap, report = engine.try_candidate("layers.0.attn.o+residual", "my_linear_residual.py")
        timing = engine.measure("slow", trials=20)

Trust is split by process. Candidate code runs only in workers: forks of a zygote that loaded the
model inside the sandbox (`pool`, `sandbox`), reached through a socketpair and shared memory
(`wire`, `link`, `arena`), never holding what measures or judges them. This process holds the
reference engine (`polymorph.serving.session.ReferenceExecutable`), draws every input, takes every time with
its own clock (`timing`), freezes the worker's tree when an answer comes, reads and compares the
outputs (`gates`, `polymorph.verify.numerics`), and retires the worker a candidate ran in. The stock
kernel's runs and the stock plan's logits, which set the gates' bars, come from a fork no candidate
under test touched.

`try_candidate` is the full path for a candidate: swap, every gate of `polymorph.engine.gates`, and
only then the timing; whatever the verdict, the worker is retired (killed with everything it started)
and a fresh fork with the accepted candidates takes its place. Each gate's outcome is in the returned
report, and each failure in `Controller.faults`.

Faults cost the candidate, not the engine: a candidate that raises is recorded with its cause; a
worker that dies, hangs, breaks the protocol or fails its canary is replaced by a fresh fork with
the candidates that had passed (`restarts` counts those; `retired` the retirements). A detached
engine (`polymorph engine start`) is a trusted host process with the same pool (`host`); `attach`
drives it through the same interface.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.engine.cases import GroupInfo, Undrawable
from polymorph.engine.gates import GateReport, blocked_by_sandbox, run_gates
from polymorph.engine.host import start_detached
from polymorph.engine.link import CallsResult, HostLink, Layout, LocalLink
from polymorph.engine.sandbox import harden_self
from polymorph.engine.timing import time_group
from polymorph.engine.verdict import Fault
from polymorph.engine.wire import CandidateRaised, EngineError, WorkerLost
from polymorph.errors import UserError
from polymorph.hardware.profile import Profile
from polymorph.ir.dtypes import DType
from polymorph.ir.shapes import concrete, numel
from polymorph.serving.session import ReferenceExecutable
from polymorph.verify.numerics import ScenarioStep, StepCheck, judge, judge_beside, reference_scenario
from polymorph.verify.tolerance import Tolerance, model_tolerance


@dataclass(frozen=True)
class SwapResult:
    group: str
    kernel: str
    ok: bool
    sha256: str = ""
    build_s: float = 0.0  # load the file + build the launch, in the worker
    swap_s: float = 0.0  # put the launch into the executable, in the worker
    round_trip_s: float = 0.0  # the whole request as the controller sees it
    fault: Fault | None = None


@dataclass
class GateResult:
    tolerance: Tolerance
    groups: list[str]
    steps: list[StepCheck] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults and bool(self.steps) and all(s.comparison.ok for s in self.steps)

    def first_failure(self) -> StepCheck | None:
        return next((s for s in self.steps if not s.comparison.ok), None)


CANARY_BUDGET_S = 10.0  # the most a canary may take before the worker counts as lost


def canary_value(n: int = 64) -> float:
    """The worker's canary answer (`op_canary`): the sum of A A^T for A[i] = (i % 7) - 3, n x n."""
    a = (np.arange(n * n) % 7 - 3).astype(np.float64).reshape(n, n)
    return float((a @ a.T).sum())


def scenario_ctx(steps: list[ScenarioStep]) -> int:
    """The longest context any sequence of `steps` reaches."""
    length: dict[int, int] = {}
    for step in steps:
        for seq in step.seqs:
            length[seq] = length.get(seq, 0) + int(step.tokens.shape[1])
    return max(length.values())


@dataclass
class WireTime:
    """Where the requests of one op went: round trips as the controller saw them (encode, send, the
    worker's op, the answer's transfer and decode), the time inside the worker's op, answer bytes."""

    calls: int = 0
    round_trip_s: float = 0.0
    worker_s: float = 0.0
    bytes: int = 0


def scenario_steps(scenario: list[ScenarioStep]) -> list[dict[str, Any]]:
    """A scenario as the worker's `verify` takes it: what to feed, not what the reference answered."""
    return [{"seqs": step.seqs, "tokens": step.tokens} for step in scenario]


def answer_logits(r: dict[str, Any], steps: int) -> list[Any]:
    """A `verify` answer's logits per step; where the run raised, the error text at that step."""
    got: list[Any] = [np.asarray(logits) for logits in r.get("logits", [])]
    if "failed_step" in r:
        return [*got[: r["failed_step"]], str(r["cause"])]
    if len(got) != steps:
        raise EngineError(f"the engine returned {len(got)} steps of logits for {steps}")
    return got


class Controller:
    """Drives one engine's workers; holds the reference engine, the fault record and the accepted
    candidates. Every worker that imported a candidate is retired after that candidate's verdict."""

    def __init__(
        self,
        *,
        budget_s: float = 30.0,
        load_budget_s: float = 600.0,
    ) -> None:
        self.budget_s = budget_s  # the most a swap, verify or measure may take before the worker is replaced
        self.load_budget_s = load_budget_s
        self._tmp = tempfile.TemporaryDirectory(prefix="polymorph-engine-")
        self.link: LocalLink | HostLink = LocalLink(Path(self._tmp.name), load_budget_s=load_budget_s)
        self.faults: list[Fault] = []
        self.restarts = 0  # workers replaced because one was lost or could no longer be trusted
        self.retired = 0  # workers retired after a candidate's verdict
        self.accepted: dict[str, tuple[str, dict[str, Any] | None]] = {}  # passed the gate
        self.pending: dict[str, tuple[str, dict[str, Any] | None]] = {}  # swapped in, not yet gated
        self.load_args: dict[str, Any] = {}
        self.loaded: dict[str, Any] = {}
        # The roofline the timing gate holds measurements to; None: the loaded plan's profile, with
        # the calibration POLYMORPH_CALIBRATION_DIR points at (read when a gate needs it).
        self.profile: Profile | None = None
        self.tampered: str | None = None  # what changed the worker's watched functions, since load
        self._touched: set[str] = set()  # candidate files the current worker imported
        self._staged: dict[str, str] = {}  # the worker's copy of a candidate -> the file it came from
        self._model: Any = None
        self._reference: ReferenceExecutable | None = None
        self._whole_graph: Any = None  # the model with every position's logits (scenarios), or None
        self._canary_weight: str | None = None  # the canary's weight fingerprint at load
        self._weight_print: str | None = None  # the controller's own fingerprint of the weights
        self._harness: dict[tuple, float] = {}  # (group, shapes, calls) -> the empty launch's seconds
        self.round_sizes: dict[tuple, int] = {}  # (group, bindings) -> calls a timed round makes
        self.wire: dict[str, WireTime] = {}  # per op, since the caller last cleared it
        # The reference's scenarios since the caller last cleared them: how long each draw took (in
        # the background or not), and how long the gates waited for one.
        self.reference_draws_s: list[float] = []
        self.reference_wait_s = 0.0
        # The next fresh scenario per (prompt_lens, decode_steps), drawn on the reference while the
        # current candidate runs its gates (numpy releases the GIL in its matmuls).
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="polymorph-scenario")
        self._next_scenario: dict[tuple, Future[list[ScenarioStep]]] = {}

    # --- lifecycle -----------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        model: str | Path,
        backend: str = "cpu",
        target: str | None = None,
        *,
        batch: int | None = None,
        ctx: int | None = None,
        traffic: str | Path | None = None,
        dtype: str | None = None,
        block_size: int | None = None,
        budget_s: float = 30.0,
    ) -> Controller:
        """Start the sandboxed zygote, load `model` into it (weights, KV cache and stock kernels, once),
        and fork the first worker from it."""
        harden_self()
        engine = cls(budget_s=budget_s)
        try:
            engine.load(model, backend, target, batch=batch, ctx=ctx, traffic=traffic, dtype=dtype,
                        block_size=block_size)  # fmt: skip
        except BaseException:
            engine.close()
            raise
        return engine

    @classmethod
    def attach(cls, address: str, *, budget_s: float = 30.0) -> Controller:
        """Drive an engine someone else started (`polymorph engine start`, a detached host) on this
        machine. A candidate that hangs or kills its worker is recorded, and the host replaces the
        worker with a fresh one (same model, plan bucket and candidates but the blamed one's)."""
        engine = cls(budget_s=budget_s)
        engine.link.close()
        engine.link = HostLink(address, budget_s)
        try:
            status = engine.status()
            if not status.get("loaded"):
                raise EngineError(f"the engine at {address} has no model loaded")
            engine._adopt(status)
            engine._canary_weight = engine._call("canary", budget_s)["weight"]
        except BaseException:
            engine.close()
            raise
        return engine

    def _adopt(self, status: dict[str, Any]) -> None:
        """Take over what an attached engine holds: its plan, load arguments and candidates."""
        self.loaded = {**status, "groups": status["plan"]}
        bucket = status.get("bucket") or {}
        self.load_args = {
            "model": status["model"],
            "backend": status["backend"],
            "target": status["target"],
            "batch": bucket.get("batch"),
            "ctx": bucket.get("ctx"),
            "dtype": status["dtype"],
            "block_size": status["block_size"],
        }
        self._build_reference(self._resolve_model())
        self.pending = {
            g: (e["kernel"], e.get("config")) for g, e in status["groups"].items() if e["candidate"]
        }
        self._watch(status.get("watched"), baseline=True)

    @property
    def address(self) -> str:
        return self.link.address if isinstance(self.link, HostLink) else "local"

    @property
    def pid(self) -> int | None:
        """The current worker's pid (a detached engine's: its host's)."""
        return self.link.pid

    @property
    def layers(self) -> dict[str, str]:
        """The sandbox's layers in force for the workers: name -> "on" or "off: why"."""
        return self.link.layers

    def _restart(self, blamed: Collection[str] = ()) -> None:
        """A fresh worker with the same model and every candidate but the blamed groups' (those that
        passed the gate, and those swapped in but not gated yet)."""
        self.restarts += 1
        for group in blamed:
            self.pending.pop(group, None)
            self.accepted.pop(group, None)
        self._retire()
        if not self.healthy():
            raise EngineError("a fresh engine worker failed its canary: the device does not compute right")

    def _retire(self) -> None:
        """The current worker killed with its whole tree; a loaded one with the candidates in place."""
        keep = {**self.accepted, **self.pending}
        staged = {g: (self.link.stage(p), c) for g, (p, c) in keep.items()}
        self._staged.update({s: p for (s, _), (p, _) in zip(staged.values(), keep.values(), strict=True)})
        loaded = self.link.retire(staged)
        self._touched = set()
        self.tampered = None
        self._watch(loaded.get("watched"), baseline=True)

    def shutdown(self) -> None:
        """Stop the engine's workers (a detached engine's host too) and wait for them."""
        if isinstance(self.link, HostLink):
            try:
                self.link.host_call("host_shutdown", 10.0)
            except (WorkerLost, EngineError, OSError):
                pass
        self.link.close()

    def close(self) -> None:
        """Stop the workers this controller started; only disconnect from a detached engine."""
        self.link.close()
        self._prefetch.shutdown(wait=False, cancel_futures=True)
        self._tmp.cleanup()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        link = getattr(self, "link", None)
        if isinstance(link, LocalLink):
            link.close()

    # --- the wire ------------------------------------------------------------------------------------

    def _call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """One request; the response's result, or UserError/EngineError for an engine-level error.
        Candidate errors come back as the raw error object under the key `__error__`."""
        t0 = time.perf_counter()
        response, size = self.link.call(op, timeout, **fields)
        spent = self.wire.setdefault(op, WireTime())
        spent.calls += 1
        spent.round_trip_s += time.perf_counter() - t0
        spent.worker_s += float(response.get("worker_s") or 0.0)
        spent.bytes += size
        if response.get("ok"):
            result = response["result"]
            if isinstance(result, dict):
                self._watch(result.get("watched"))
            return result
        err = response["error"]
        if err["kind"] in ("candidate_build", "candidate_run"):
            return {"__error__": err}
        if err["kind"] == "user":
            raise UserError(err["message"])
        raise EngineError(f"engine error ({err['kind']}) on `{op}`: {err['message']}")

    def _watch(self, digest: str | None, *, baseline: bool = False) -> None:
        """The worker's digest of the functions a candidate might rebind (the clocks, torch's and
        numpy's): a change since load is tampering, evidence the gates act on."""
        if digest is None:
            return
        if baseline or self._watched is None:
            self._watched = digest
        elif digest != self._watched and self.tampered is None:
            self.tampered = "functions of the worker's interpreter were rebound (clock, torch or numpy)"

    _watched: str | None = None

    def _lost(self, lost: WorkerLost, blame: dict[str, str]) -> list[Fault]:
        """Record the fault against the candidates in `blame` (group -> kernel), then restart."""
        faults = [Fault(g, k, lost.how, str(lost)) for g, k in blame.items()]
        self.faults += faults
        self._restart(set(blame))
        return faults

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request that runs candidate code (the gates' wire): the result, the candidate's error
        under `__error__`, or WorkerLost for the caller to record against the candidate."""
        if op == "swap" and fields.get("path") is not None:
            fields = {**fields, "path": self.link.stage(fields["path"])}
        return self._call(op, self.budget_s, **fields)

    def replace_worker(self, blamed: Collection[str]) -> None:
        """A fresh worker without the blamed groups' candidates: for a worker lost to a candidate, or
        one that still answers but can no longer be trusted."""
        self._restart(blamed)

    def _call_engine(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request that runs no new candidate code (status, reset, restore). If the worker is lost
        anyway (a candidate left something behind), the candidates not yet gated take the blame, the
        worker is replaced and the request is sent once more."""
        try:
            return self._call(op, self.budget_s, **fields)
        except WorkerLost as lost:
            self._lost(lost, {g: p for g, (p, _) in self.pending.items()})
            return self._call(op, self.budget_s, **fields)

    # --- calls on shared memory ----------------------------------------------------------------------

    def output_bytes(self, group: GroupInfo, bindings: dict[str, int]) -> int:
        alias = self._aliases()
        return sum(
            numel(concrete(group.types[v].shape, bindings)) * group.types[v].dtype.itemsize
            for v in group.outputs
            if v not in alias
        )

    def _aliases(self) -> dict[str, str]:
        from polymorph.backends.cpu.runtime import state_aliases

        if getattr(self, "_alias", None) is None:
            self._alias = state_aliases(self.graph)
        return self._alias

    def in_place(self, group: GroupInfo) -> dict[int, int]:
        """Output index -> input index, for the group's cache writes (written in place)."""
        alias = self._aliases()
        producer = {v: n for n in self.graph.nodes if n.name in group.nodes for v in n.outputs}
        return {
            j: group.inputs.index(producer[v].inputs[0]) for j, v in enumerate(group.outputs) if v in alias
        }

    def _layout(
        self, group: GroupInfo, calls: list[list[np.ndarray | None]], bindings: dict[str, int]
    ) -> Layout:
        aliased = self.in_place(group)
        specs: list[tuple[str, str, tuple[int, ...]]] = []
        in_slots: list[list[str | None]] = []
        out_slots: list[list[str | None]] = []
        for i, call in enumerate(calls):
            names: list[str | None] = []
            for j, a in enumerate(call):
                if a is None:
                    names.append(None)
                else:
                    names.append(f"c{i}.in{j}")
                    specs.append((f"c{i}.in{j}", a.dtype.str if a.dtype.kind != "V" else a.dtype.name,
                                  tuple(a.shape)))  # fmt: skip
            in_slots.append(names)
            outs: list[str | None] = []
            for j, v in enumerate(group.outputs):
                if j in aliased:
                    outs.append(None)
                    continue
                t = group.types[v]
                dt = np.dtype(t.dtype.numpy)
                outs.append(f"c{i}.out{j}")
                specs.append((f"c{i}.out{j}", dt.str if dt.kind != "V" else dt.name,
                              tuple(concrete(t.shape, bindings))))  # fmt: skip
            out_slots.append(outs)
        return Layout(specs, in_slots, out_slots, aliased)

    def _accepted_staged(self) -> dict[str, tuple[str, dict[str, Any] | None]]:
        return {g: (self.link.stage(p), c) for g, (p, c) in self.accepted.items()}

    def run_calls(
        self,
        group: GroupInfo,
        calls: list[list[np.ndarray | None]],
        bindings: dict[str, int],
        *,
        fill: Any = "nan",
        stock: bool = False,
        clean: bool = False,
    ) -> CallsResult:
        """`calls` launches of `group` in one request: gates send one, timing many (the same path).
        The outputs are poisoned with `fill` first, the inputs written inside the clock, and what came
        out copied while the worker was frozen. With `clean` the request goes to a fork no candidate
        under test touched (where the stock kernel's runs come from). WorkerLost propagates; the
        candidate raising is CandidateRaised."""
        layout = self._layout(group, calls, bindings)
        fields = {"group": group.id, "calls": [{"inputs": i, "outputs": o} for i, o in
                  zip(layout.in_slots, layout.out_slots, strict=True)], "bindings": bindings, "stock": stock}  # fmt: skip
        response, done = self.link.run_calls(layout, calls, fields, fill=fill, timeout=self.budget_s,
                                             clean=self._accepted_staged() if clean else None)  # fmt: skip
        self._count("run_group", response)
        if done is None:
            err = response["error"]
            if err["kind"] in ("candidate_build", "candidate_run"):
                raise CandidateRaised(err["message"])
            if err["kind"] == "user":
                raise UserError(err["message"])
            raise EngineError(f"engine error ({err['kind']}) on `run_group`: {err['message']}")
        return done

    def stock_calls(self, group: GroupInfo, calls: list[list[np.ndarray | None]], bindings: dict[str, int],
                    **fields: Any) -> CallsResult:  # fmt: skip
        """The stock kernel on `calls`, on a fork no candidate under test touched."""
        return self.run_calls(group, calls, bindings, stock=True, clean=True, **fields)

    def settle(self, seconds: float) -> list[np.ndarray]:
        """The last request's last outputs again, `seconds` after its answer, the worker running
        meanwhile (work left running after return shows as a change)."""
        return self.link.settle(seconds)

    def _count(self, op: str, response: dict[str, Any]) -> None:
        spent = self.wire.setdefault(op, WireTime())
        spent.calls += 1
        spent.worker_s += float(response.get("worker_s") or 0.0)
        result = response.get("result")
        if isinstance(result, dict):
            self._watch(result.get("watched"))

    def harness_cost(
        self, group: GroupInfo, base: list[np.ndarray | None], bindings: dict[str, int], k: int
    ) -> float:
        """Seconds one request of `k` empty launches takes on a worker no candidate touched (inputs
        written inside the clock, as a timed round's): what `timing` takes off. 0 where it could not be
        measured (said so in the timing's `harness_s`)."""
        key = (group.id, tuple((a.dtype.str, a.shape) if a is not None else None for a in base), k)
        if key not in self._harness:
            calls = [[None if a is None else a.copy() for a in base] for _ in range(k)]
            layout = self._layout(group, calls, bindings)
            fields = {"group": group.id, "calls": [{"inputs": i, "outputs": o} for i, o in
                      zip(layout.in_slots, layout.out_slots, strict=True)], "bindings": bindings, "stock": True}  # fmt: skip
            wall = self.link.harness(layout, calls, fields, self.budget_s, self._accepted_staged())
            if wall is None:
                return 0.0
            self._harness[key] = wall
        return self._harness[key]

    # --- ops -----------------------------------------------------------------------------------------

    def _resolve_model(self) -> Any:
        from polymorph.models import load_model

        options = {k: self.load_args[k] for k in ("dtype", "block_size") if self.load_args.get(k) is not None}
        return load_model(self.load_args["model"], **options)

    def load(
        self,
        model: str | Path,
        backend: str = "cpu",
        target: str | None = None,
        *,
        batch: int | None = None,
        ctx: int | None = None,
        traffic: str | Path | None = None,
        dtype: str | None = None,
        block_size: int | None = None,
    ) -> dict[str, Any]:
        """Load `model` here (the reference's copy; its weights go into the shared arena the workers
        map) and into a fresh worker. The workers never read the user's files."""
        if isinstance(self.link, HostLink):
            raise UserError("a detached engine loads its model when it starts (`polymorph engine start`)")
        self.load_args = {
            "model": str(model),
            "backend": backend,
            "target": target,
            "batch": batch,
            "ctx": ctx,
            "traffic": None if traffic is None else str(traffic),
            "dtype": dtype,
            "block_size": block_size,
        }
        if traffic is not None:  # the worker cannot read the user's traffic file: its bucket, resolved here
            from polymorph.serving.traffic import pick_bucket

            bucket = pick_bucket(batch, ctx, traffic)
            self.load_args.update(batch=bucket.batch, ctx=bucket.ctx, traffic=None)
        m = self._resolve_model()
        self.accepted.clear()
        self.pending.clear()
        self.loaded = self.link.start(m, self.load_args, {})
        self._touched = set()
        self.tampered = None
        self._watch(self.loaded.get("watched"), baseline=True)
        self._canary_weight = self._call("canary", self.budget_s)["weight"]  # as loaded, before any candidate
        self._build_reference(m)
        return self.loaded

    def healthy(self) -> bool:
        """The worker's canary (a fixed computation on its device and its first weight's fingerprint)
        gives the known answer: the device context computes right, beyond the process answering. A
        worker lost on the way is not healthy."""
        try:
            r = self._call("canary", min(self.budget_s, CANARY_BUDGET_S))
        except (WorkerLost, EngineError):
            return False
        return r.get("value") == canary_value() and r.get("weight") == self._canary_weight

    def weights_intact(self) -> str | None:
        """None when every weight holds what it held at load, else which: the worker's fingerprints of
        its own tensors (evidence: on a GPU they live in its memory), and on cpu the controller's own
        fingerprint of the shared arena the workers map read-only."""
        try:
            r = self._call("fingerprints", self.budget_s)
        except WorkerLost:
            return "the worker was lost reading its weights"
        changed = [n for n, f in r["weights"].items() if f != self._fingerprints.get(n)]
        if changed:
            return f"the engine's weight `{changed[0]}` changed ({len(changed)} weights)"
        if self._weight_print is not None and self._weight_print != _arena_print(self.weights):
            return "the shared weights changed"
        return None

    _fingerprints: dict[str, str] = {}

    def _build_reference(self, model: Any) -> None:
        from polymorph.ir import serialize

        self._model = model
        if serialize.content_hash(model.graph) != self.loaded["graph_hash"]:
            raise EngineError("the worker built a different graph than the controller for the same model")
        weights = model.weights()
        pool = self.link.pool if isinstance(self.link, LocalLink) else None
        if pool is not None and pool.weights is not None:
            weights = pool.weights.arrays  # the same bytes the workers map, read here in place
            self._weight_print = _arena_print(weights)
        self._reference = ReferenceExecutable(model.graph, weights)
        # Every position's logits: the scenario's reference reads the weights once per sequence.
        self._whole_graph = model.rebuild(all_logits=True) if model.config is not None else None
        self._next_scenario.clear()  # drawn on the model loaded before
        self._alias = None
        self._fingerprints = dict(self._call("fingerprints", self.budget_s)["weights"])

    def groups(self) -> list[str]:
        return list(self.status()["groups"])

    @property
    def graph(self) -> Any:
        assert self._model is not None
        return self._model.graph

    @property
    def weights(self) -> Mapping[str, np.ndarray]:
        """The model's weights as the reference holds them (on a local engine: the shared arena the
        workers map read-only, this process's own writable mapping of it)."""
        assert self._reference is not None
        return self._reference.weights

    @property
    def wide_weights(self) -> dict[str, np.ndarray]:
        """float32 copies of the low-precision projection weights the reference keeps."""
        assert self._reference is not None
        return self._reference.wide

    @property
    def vocab(self) -> int:
        if self.program:
            return 1  # no tokens: the draws' token ids, which no input of a program takes, need one value
        return int(self.graph.params["model.embed_tokens.weight"].shape[0])

    @property
    def program(self) -> bool:
        """Whether the loaded model is an imported program (torch.export): no tokens, no cache, no
        logits; its one bucket is its example inputs' shapes."""
        return self.graph.meta.get("source") == "torch.export"

    def plan_group(self, group: str) -> dict[str, Any]:
        """{id, pattern, kernel, nodes, inputs, outputs} of a group of the loaded plan."""
        for g in self.loaded["groups"]:
            if g["id"] == group:
                return g
        raise UserError(f"no node group `{group}` in this plan")

    def group_info(self, group: str) -> GroupInfo:
        return GroupInfo.of(self.plan_group(group), self.graph, self.graph.types())

    def gate_profile(self) -> Profile:
        if self.profile is None:
            from polymorph.hardware.profile import load_profile
            from polymorph.knobs import knobs

            self.profile = load_profile(self.loaded["profile"], knobs.calibration_dir)
        return self.profile

    def default_prompts(self, decode_steps: int = 4, seed: int | None = None) -> tuple[int, ...]:
        """The scenario's prompts: one as long as the bucket's context allows (up to LONG_PROMPT), and
        two short ones of lengths drawn here (from `seed`, else afresh); all decode together (batch 3,
        ragged)."""
        ctx = int(self.loaded.get("bucket", {}).get("ctx", 0) or 0)
        longest = max(min(max(ctx, 16), LONG_PROMPT) - decode_steps, 11)
        rng = np.random.default_rng(seed)
        return (longest, int(rng.integers(5, 11)), int(rng.integers(2, 5)))

    def scenario(
        self, prompt_lens: tuple[int, ...] | None = None, decode_steps: int = 4, seed: int | None = None
    ) -> list[ScenarioStep]:
        """The teacher-forced scenario with the reference's logits (`polymorph.verify.numerics`). With
        no seed, one drawn fresh in the background since the last call (and the next one started), so
        a candidate's gates do not wait for the reference."""
        assert self._reference is not None
        if seed is not None:
            lens = tuple(prompt_lens or self.default_prompts(decode_steps, seed))
            return self._draw(self._reference, lens, decode_steps, seed)
        # The default prompts are drawn afresh by each draw (the key says "default", not the lengths).
        key = (tuple(prompt_lens) if prompt_lens else None, decode_steps)
        ready = self._next_scenario.pop(key, None)
        self._next_scenario[key] = self._prefetch.submit(self._draw, self._reference, key[0], decode_steps)
        t0 = time.perf_counter()
        try:
            return ready.result() if ready is not None else self._draw(self._reference, key[0], decode_steps)
        finally:
            self.reference_wait_s += time.perf_counter() - t0

    def quiet(self) -> None:
        """Wait for the scenario drawn in the background (and, on a detached engine, for its host), so
        that nothing takes host time from a measurement (the timing gates call it first). Errors
        surface where the scenario is used."""
        for ready in list(self._next_scenario.values()):
            ready.exception()
        self.link.quiet()

    def _draw(
        self,
        ref: ReferenceExecutable,
        prompt_lens: tuple[int, ...] | None,
        decode_steps: int,
        seed: int | None = None,
    ) -> list[ScenarioStep]:
        """A fresh scenario on a reference of its own (the cache is per executable), sharing `ref`'s
        weights and their f32 copies: one all-logits prefill per sequence where the model has a
        builder, else step by step."""
        t0 = time.perf_counter()
        prompt_lens = prompt_lens or self.default_prompts(decode_steps)
        own = ReferenceExecutable(ref.graph, ref.weights, wide=ref.wide)
        whole = None
        if self._whole_graph is not None:
            whole = ReferenceExecutable(self._whole_graph, ref.weights, wide=ref.wide)
        scenario = reference_scenario(
            own, ref.graph, prompt_lens=prompt_lens, decode_steps=decode_steps, seed=seed, whole=whole
        )
        self.reference_draws_s.append(time.perf_counter() - t0)
        return scenario

    def swap(self, group: str, path: str | Path, config: dict[str, Any] | None = None) -> SwapResult:
        """Build candidate `path` for `group` in the worker and swap it in (weights and cache stay).
        It counts only after `verify` passes; a build failure is recorded and the stock kernel stays.
        A worker that imported a candidate which is no longer in is retired first."""
        path = str(Path(path).resolve())
        in_plan = {p for p, _ in [*self.accepted.values(), *self.pending.values()]}
        if self._touched - in_plan:
            self.retired += 1
            self._retire()
        t0 = time.perf_counter()
        try:
            staged = self.link.stage(path)
            self._staged[staged] = path
        except UserError as e:
            fault = Fault(group, path, "build", str(e))
            self.faults.append(fault)
            return SwapResult(group, path, False, fault=fault)
        self._touched.add(path)
        try:
            r = self._call("swap", self.budget_s, group=group, path=staged, config=config)
        except WorkerLost as lost:
            (fault,) = self._lost(lost, {group: path})
            return SwapResult(group, path, False, round_trip_s=time.perf_counter() - t0, fault=fault)
        rtt = time.perf_counter() - t0
        if "__error__" in r:
            cause = r["__error__"]["message"]
            fault = Fault(group, path, "sandbox" if blocked_by_sandbox(cause) else "build", cause)
            self.faults.append(fault)
            return SwapResult(group, path, False, round_trip_s=rtt, fault=fault)
        self.accepted.pop(group, None)
        self.pending[group] = (path, config)
        return SwapResult(group, path, True, r["sha256"], r["build_s"], r["swap_s"], rtt)

    def restore(self, group: str) -> None:
        """Put the stock kernel back in `group`."""
        self._call_engine("swap", group=group, path=None)
        self.pending.pop(group, None)
        self.accepted.pop(group, None)

    def verify(
        self,
        group: str | None = None,
        *,
        prompt_lens: tuple[int, ...] | None = None,
        decode_steps: int = 4,
        seed: int | None = None,
    ) -> GateResult:
        """The numerics gate for the candidates swapped in since the last verify (all of them, or
        `group` only when given): teacher-forced logits of the whole model against the reference.
        On failure the candidates under test are swapped back to the stock kernel and recorded."""
        under_test = (
            dict(self.pending)
            if group is None
            else {group: self.pending[group]}
            if group in self.pending
            else {}
        )
        scenario = self.scenario(prompt_lens, decode_steps, seed)
        blame = {g: p for g, (p, _) in under_test.items()}
        try:
            result, _ = self.judge_scenario(scenario, blame, group=group, swapped=list(under_test))
        except WorkerLost as lost:
            result = GateResult(model_tolerance(self._dtype()), list(under_test))
            result.faults = self._lost(lost, blame)
            return result
        result.groups = list(under_test)
        if result.ok:
            for g in under_test:
                self.accepted[g] = self.pending.pop(g)
            return result
        if not result.faults:
            failure = result.first_failure()
            cause = f"{failure.step}: {failure.comparison}" if failure else "no steps"
            result.faults = [Fault(g, p, "numerics", cause) for g, p in blame.items()]
        self.faults += result.faults
        for g in under_test:
            self.restore(g)
        return result

    def _dtype(self) -> DType:
        return DType.parse(self.graph.meta.get("dtype", "f32"))

    def judge_scenario(
        self,
        scenario: list[ScenarioStep],
        blame: dict[str, str],
        *,
        group: str | None = None,
        swapped: Collection[str] = (),
    ) -> tuple[GateResult, dict[str, Any]]:
        """Run `scenario` in the worker (fresh cache, outputs poisoned) and judge its logits against
        the reference's; no swap back, no record. Also the worker's raw answer (`guard_nonzero`...).
        Where a step misses the tolerance and `swapped` names groups whose candidates are under test,
        the same scenario runs with those groups on their stock kernels (`stock_logits`; candidates
        accepted earlier stay in: "stock" is the plan without the ones under test) and sets the bar at
        the steps it misses too (`judge_beside`); those logits come back in the raw answer as
        `stock_logits`. WorkerLost propagates to the caller, who knows whom to blame."""
        dtype = self._dtype()
        tol = model_tolerance(dtype)
        r = self._call(
            "verify",
            self.budget_s,
            steps=scenario_steps(scenario),
            max_ctx=scenario_ctx(scenario),
            group=group,
        )
        if "__error__" in r:
            raise CandidateRaised(r["__error__"]["message"])
        got = answer_logits(r, len(scenario))
        verdict = judge(scenario, got, dtype, tol)
        if not verdict.ok and swapped and "failed_step" not in r:
            r["stock_logits"] = self.stock_logits(scenario, swapped)
            verdict = judge_beside(scenario, got, r["stock_logits"], dtype, tol)
        result = GateResult(tol, list(blame), steps=verdict.steps)
        if "failed_step" in r:
            result.faults = [Fault(g, p, "run", r["cause"]) for g, p in blame.items()]
        return result, r

    def stock_logits(self, scenario: list[ScenarioStep], groups: Collection[str]) -> list[Any]:
        """The stock plan's logits over `scenario` (the plan without the candidates under test in
        `groups`; those accepted stay in), from a fork none of them touched: a candidate cannot make
        the stock plan look as wrong as itself. WorkerLost propagates to the caller."""
        steps, ctx = scenario_steps(scenario), scenario_ctx(scenario)
        accepted = {g: c for g, c in self._accepted_staged().items() if g not in set(groups)}
        response, _ = self.link.call("verify", self.budget_s, clean=accepted, steps=steps, max_ctx=ctx)
        if not response.get("ok"):
            raise EngineError(f"the stock plan's run failed: {response['error']['message']}")
        r = response["result"]
        if "__error__" in r:
            raise EngineError(f"the stock plan's run failed: {r['__error__']['message']}")
        return answer_logits(r, len(scenario))

    def try_candidate(
        self,
        group: str,
        path: str | Path,
        config: dict[str, Any] | None = None,
        *,
        seed: int | None = None,
        exact: bool = False,
    ) -> tuple[SwapResult, GateReport | None]:
        """Swap, run every gate of `polymorph.engine.gates` (each outcome recorded in the report, each
        failure in `faults`), and only then time the group with the timing gates. The candidate stays
        in only when all pass; the report's `measurement` is the timing that counts. Whatever the
        verdict, the worker it ran in is retired afterwards (a fresh fork of the loaded zygote takes its
        place with the accepted candidates). `exact`: bit-exact mode, the `exact` gate too (outputs
        byte for byte the stock kernel's)."""
        swap = self.swap(group, path, config)
        if not swap.ok:
            self._retire_touched()
            return swap, None
        report = run_gates(self, group, swap.kernel, config, seed=seed, exact=exact)
        self.faults += report.faults
        if report.ok:
            self.accepted[group] = self.pending.pop(group)
        else:
            self.pending.pop(group, None)
            self.accepted.pop(group, None)
        self._retire_touched()
        return swap, report

    def _retire_touched(self) -> None:
        if self._touched:
            self.retired += 1
            self._retire()

    def measure(self, tier: str = "fast", trials: int = 20, group: str | None = None) -> dict[str, Any]:
        """Time the engine as it stands, by this process's clock (tier "slow": whole decode steps at the
        loaded bucket on fresh tokens; "fast": each group's launch alone, or `group`'s, on fresh
        inputs at the bucket's decode step; `polymorph.engine.timing`). A candidate that hangs here is
        recorded and the worker replaced; the result then carries `fault`."""
        if tier not in ("fast", "slow") or trials < 1:
            raise UserError(f"tier must be fast or slow (not {tier!r}) and trials >= 1")
        self.quiet()
        try:
            if tier == "slow":
                return self._measure_steps(trials)
            ids = (
                [g["id"] for g in self.loaded["groups"]] if group is None else [self.plan_group(group)["id"]]
            )
            rng = np.random.default_rng()
            groups: dict[str, Any] = {}
            bindings: dict[str, int] = {}
            for gid in ids:
                try:
                    t = time_group(self, self.group_info(gid), rng, trials=trials)
                except Undrawable as e:
                    groups[gid] = {"skipped": str(e)}
                    continue
                except CandidateRaised as e:
                    groups[gid] = {"error": str(e)}
                    continue
                groups[gid] = {**t.to_json(), "failures": t.failures}
                bindings = t.bindings
            return {"tier": tier, "timer": TIMER, "trials": trials, "groups": groups, "bindings": bindings,
                    "engine": "full engine"}  # fmt: skip
        except WorkerLost as lost:
            # Which one hung is unknown (an accepted candidate may hang only at the bucket's shapes):
            # every candidate in place takes the blame and none is re-applied.
            blame = {g: p for g, (p, _) in {**self.accepted, **self.pending}.items()}
            return {"tier": tier, "fault": [f.__dict__ for f in self._lost(lost, blame)]}

    def _measure_steps(self, trials: int) -> dict[str, Any]:
        """Whole decode steps on fresh tokens this process drew, timed by its own clock over rounds of
        `trials` steps (fixed costs of a request taken off by a second, shorter request)."""
        batch = int(self.loaded["bucket"]["batch"])
        rng = np.random.default_rng()

        def round_s(n: int) -> float:
            tokens = rng.integers(0, self.vocab, size=(n, batch, 1), dtype=np.int32)
            response, wall, logits = self.link.run_steps(tokens, self.vocab, self.budget_s)
            self._count("measure", response)
            if not response.get("ok"):
                raise CandidateRaised(response["error"]["message"])
            if not np.isfinite(logits).all():
                raise CandidateRaised("whole steps left logits unwritten or not finite")
            return wall

        round_s(1)  # the arena mapped, the first step's costs paid
        short = min(round_s(1) for _ in range(2))
        times = [max((round_s(trials + 1) - short) / trials, 1e-9) for _ in range(3)]
        # min_s: the fastest round. Another process on the machine only ever adds time to a round, so
        # where two plans are compared on a shared host (a tune's final A/B) the fastest of each
        # arm's rounds is the steadier estimate of what each costs alone.
        return {"tier": "slow", "timer": TIMER, "trials": trials, "median_s": float(np.median(times)),
                "min_s": float(min(times)), "spread_s": float(max(times) - min(times)),
                "total_s": float(sum(times) * trials)}  # fmt: skip

    def status(self) -> dict[str, Any]:
        """The worker's status, its candidates named by the files they were swapped in from (the
        worker loads staged copies), and the sandbox's layers."""
        status = self._call_engine("status")
        for entry in status.get("groups", {}).values():
            entry["kernel"] = self._staged.get(entry["kernel"], entry["kernel"])
        return {**status, "sandbox": dict(self.layers)}

    def reset(self) -> list[str]:
        """Stock kernels everywhere and a zeroed cache."""
        restored = self._call_engine("reset")["restored"]
        self.accepted.clear()
        self.pending.clear()
        return restored


__all__ = ["Controller", "EngineError", "Fault", "SwapResult", "WorkerLost", "start_detached"]

TIMER = "the controller's perf_counter around batches of checked calls (polymorph.engine.timing)"
LONG_PROMPT = 256  # the longest prompt of the model-level scenario (group cases reach the full context)


def _arena_print(weights: Mapping[str, np.ndarray]) -> str:
    """A fingerprint of every byte of the weights (per array: its sum and its xor as 64-bit words)."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name]).view(np.uint8).reshape(-1)
        pad = (-a.size) % 8
        words = np.concatenate([a, np.zeros(pad, np.uint8)]).view(np.uint64) if pad else a.view(np.uint64)
        h.update(f"{name}:{int(words.sum(dtype=np.uint64))}:{int(np.bitwise_xor.reduce(words))}".encode())
    return h.hexdigest()
