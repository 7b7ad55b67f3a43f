"""The engine controller: the trusted side, and the Python client of a worker.

    from polymorph.engine import Controller
    with Controller.start("llama-tiny", backend="cpu") as engine:
        swap = engine.swap("layers.0.mlp.down+residual", "my_linear_residual.py")
        gate = engine.verify()            # rejected candidates are swapped back to the stock kernel
        timing = engine.measure("slow", trials=20)
        swap, report = engine.try_candidate("layers.0.attn.o+residual", "my_linear_residual.py")

It starts the worker (`python -m polymorph.engine.worker`) as a subprocess, holds the reference engine
(`polymorph.session.ReferenceExecutable`) and compares: the gate for swapped candidates is the
teacher-forced logits of the whole model, with the candidates in place and every output poisoned,
against the reference on fresh random tokens (the scenario of `polymorph.verify.numerics`). The worker
only ever receives token ids and returns logits. NaN never passes.

`try_candidate` is the full path for a candidate: swap, every gate of `polymorph.engine.gates`
(numerics of the group on fresh random inputs, KV-cache isolation, whole-model quality, honesty), and
only then the timing, cross-checked against the host's wall clock and the profile's roofline. Each
gate's outcome is in the returned report, and each failure in `Controller.faults`.

Faults cost the candidate, not the engine: a candidate that raises at build or at run is recorded
(`Controller.faults`) with its cause and swapped out; a worker that dies, or does not answer within
`budget_s`, is killed and replaced by a fresh one that reloads the model and re-applies the
candidates that had passed the gate.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polymorph.engine import protocol
from polymorph.errors import UserError
from polymorph.hw import Profile
from polymorph.ir.dtypes import DType
from polymorph.session import ReferenceExecutable
from polymorph.tolerance import Tolerance, model_tolerance
from polymorph.verify.numerics import ScenarioStep, StepCheck, judge, judge_beside, reference_scenario

if TYPE_CHECKING:
    from polymorph.engine.gates import GateReport


class EngineError(UserError):
    """The engine itself (not a candidate) failed: the worker would not start, or answered nonsense."""


class WorkerLost(Exception):
    """The worker died or did not answer in time; `how` is "hang" or "crash"."""

    def __init__(self, how: str, detail: str) -> None:
        super().__init__(detail)
        self.how = how


@dataclass(frozen=True)
class Fault:
    """One candidate's failure. stage: build, run, numerics, hang, crash, or the name of the gate
    of `polymorph.engine.gates` that rejected it (`honesty.input_dependence`, `timing.roofline`...)."""

    group: str
    kernel: str
    stage: str
    cause: str


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


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes] | None
    sock: socket.socket
    reader: Any
    address: str
    stderr_path: Path | None

    def stderr_tail(self, chars: int = 2000) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        return self.stderr_path.read_text(errors="replace")[-chars:]


def _reap(proc: subprocess.Popen[bytes]) -> None:
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _connect(address: str, timeout: float) -> tuple[socket.socket, Any]:
    kind, where = protocol.parse_address(address)
    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(where)
    except OSError as e:
        sock.close()
        raise EngineError(f"cannot connect to the engine at {address}: {e.strerror or e}") from None
    return sock, sock.makefile("rb")


def start_detached(
    model: str | Path,
    backend: str = "cpu",
    target: str | None = None,
    *,
    batch: int | None = None,
    ctx: int | None = None,
    traffic: str | Path | None = None,
    dtype: str | None = None,
    block_size: int | None = None,
    unix: str | Path | None = None,
    port: int = 0,
    log: str | Path | None = None,
    load_budget_s: float = 600.0,
) -> tuple[str, int]:
    """Start a worker that outlives this process (`polymorph engine start`), load `model` into it and
    return (address, pid). Drive it with `Controller.attach(address)`; stop it with its `shutdown`.
    It listens on `unix`, else on TCP `port` of 127.0.0.1 (0: any free one). The worker's stderr goes
    to `log` (default: <cache dir>/engine/worker-<time>.log)."""
    from polymorph.knobs import knobs

    if log is None:
        log = Path(knobs.cache_dir) / "engine" / f"worker-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "polymorph.engine.worker"]
    cmd += ["--unix", str(unix)] if unix is not None else ["--port", str(port)]
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=knobs.child_environ(),
            start_new_session=True,  # a Ctrl-C in the starting shell does not reach the engine
        )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60.0)
    address = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if not address:
        proc.kill()
        proc.wait()
        raise EngineError(f"the engine worker did not start; see {log}")
    sock, reader = _connect(address, load_budget_s)
    try:
        fields = {
            "model": str(model),
            "backend": backend,
            "target": target,
            "batch": batch,
            "ctx": ctx,
            "traffic": None if traffic is None else str(traffic),
            "dtype": dtype,
            "block_size": block_size,
        }
        sock.sendall(protocol.encode(protocol.request(1, "load", **fields)))
        line = reader.readline()
    finally:
        reader.close()
        sock.close()
    response = (
        protocol.decode(line) if line else {"ok": False, "error": {"message": f"the worker died; see {log}"}}
    )
    if not response.get("ok"):
        proc.kill()
        proc.wait()
        raise UserError(f"the engine could not load {model}: {response['error']['message']}")
    return address, proc.pid


CANARY_BUDGET_S = 10.0  # the most a canary may take before the worker counts as lost


def canary_value(n: int = 64) -> float:
    """The worker's canary answer (`op_canary`): the sum of A A^T for A[i] = (i % 7) - 3, n x n."""
    a = (np.arange(n * n) % 7 - 3).astype(np.float64).reshape(n, n)
    return float((a @ a.T).sum())


def _kill_pid(pid: int, wait_s: float = 10.0) -> None:
    """SIGKILL a process this one may not have started, and wait until it is gone (reaped by us if it
    is our child, else by its parent or init)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not ours: gone once signal 0 finds nothing
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.02)
    raise EngineError(f"the lost engine worker (pid {pid}) did not exit after SIGKILL")


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
    """Drives one worker; holds the reference engine, the fault record and the accepted candidates."""

    def __init__(
        self,
        *,
        budget_s: float = 30.0,
        load_budget_s: float = 600.0,
        unix: bool = False,
        standby: int = 1,
    ) -> None:
        self.budget_s = budget_s  # the most a swap, verify or measure may take before the worker is replaced
        self.load_budget_s = load_budget_s
        self.unix = unix
        # Worker processes started ahead, their imports done, that replace a lost worker: a restart
        # then costs a load, not a Python and torch start-up. They hold no model (and no device
        # context) until one is used. `standby` is how many to keep (0: none).
        self.standby = standby
        self._standby: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._launches = 0
        self.faults: list[Fault] = []
        self.restarts = 0
        self.accepted: dict[str, tuple[str, dict[str, Any] | None]] = {}  # passed the gate
        self.pending: dict[str, tuple[str, dict[str, Any] | None]] = {}  # swapped in, not yet gated
        self.load_args: dict[str, Any] = {}
        self.loaded: dict[str, Any] = {}
        # The roofline the timing gate holds measurements to; None: the loaded plan's profile, with
        # the calibration POLYMORPH_CALIBRATION_DIR points at (read when a gate needs it).
        self.profile: Profile | None = None
        self._worker: _Worker | None = None
        self._next_id = 0
        self._model: Any = None
        self._reference: ReferenceExecutable | None = None
        self._whole_graph: Any = None  # the model with every position's logits (scenarios), or None
        self._attached_pid: int | None = None  # the worker's pid when attached (`attach`), not started
        self._canary_weight: str | None = None  # the canary's weight fingerprint at load
        self.wire: dict[str, WireTime] = {}  # per op, since the caller last cleared it
        # The reference's scenarios since the caller last cleared them: how long each draw took (in
        # the background or not), and how long the gates waited for one.
        self.reference_draws_s: list[float] = []
        self.reference_wait_s = 0.0
        # The next fresh scenario per (prompt_lens, decode_steps), drawn on the reference while the
        # current candidate runs its gates (numpy releases the GIL in its matmuls).
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="polymorph-scenario")
        self._next_scenario: dict[tuple, Future[list[ScenarioStep]]] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="polymorph-engine-")

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
        unix: bool = False,
        standby: int = 1,
    ) -> Controller:
        """Start a worker and load `model` into it (weights, KV cache and stock kernels, once)."""
        engine = cls(budget_s=budget_s, unix=unix, standby=standby)
        try:
            engine._spawn(backend)
            engine.load(
                model,
                backend,
                target,
                batch=batch,
                ctx=ctx,
                traffic=traffic,
                dtype=dtype,
                block_size=block_size,
            )
            engine._launch_standby()
        except BaseException:
            engine.close()
            raise
        return engine

    @classmethod
    def attach(cls, address: str, *, budget_s: float = 30.0) -> Controller:
        """Drive a worker someone else started (`polymorph engine start`) on this machine. A candidate
        that hangs or kills it is recorded, and the worker is replaced by a fresh one at the same
        address (`start_detached`, same model, plan bucket and candidates but the blamed one's)."""
        engine = cls(budget_s=budget_s)
        sock, reader = _connect(address, budget_s)
        engine._worker = _Worker(None, sock, reader, address, None)
        status = engine.status()
        if not status.get("loaded"):
            raise EngineError(f"the engine at {address} has no model loaded")
        engine._attached_pid = int(status["pid"])
        engine._adopt(status)
        engine._canary_weight = engine._call("canary", budget_s)["weight"]
        return engine

    def _adopt(self, status: dict[str, Any]) -> None:
        """Take over what an attached worker holds: its plan, load arguments and candidates."""
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
        self._build_reference()
        self.pending = {
            g: (e["kernel"], e.get("config")) for g, e in status["groups"].items() if e["candidate"]
        }

    @property
    def address(self) -> str:
        return self._alive().address

    @property
    def pid(self) -> int | None:
        w = self._alive()
        return w.proc.pid if w.proc is not None else None

    def _launch(self, backend: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a worker process (its imports done before it prints its address); no model yet."""
        from polymorph.knobs import knobs

        n = self._launches
        self._launches += 1
        cmd = [sys.executable, "-m", "polymorph.engine.worker", "--watch-stdin", "--preload", backend]
        if self.unix:
            cmd += ["--unix", os.path.join(self._tmp.name, f"worker-{n}.sock")]
        else:
            cmd += ["--port", "0"]
        stderr_path = Path(self._tmp.name) / f"worker-{n}.stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=knobs.child_environ()
            )
        return proc, stderr_path

    def _launch_standby(self) -> None:
        while len(self._standby) < self.standby:
            self._standby.append(self._launch(self.load_args.get("backend") or "cpu"))

    def _spawn(self, backend: str = "cpu") -> None:
        """Connect to a new worker: the oldest live standby, else a process started now."""
        standby = None
        while self._standby and standby is None:
            standby = self._standby.pop(0)
            if standby[0].poll() is not None:  # it died waiting
                _reap(standby[0])
                standby = None
        proc, stderr_path = standby or self._launch(backend)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line:
            proc.kill()
            _reap(proc)
            tail = stderr_path.read_text(errors="replace")[-1000:]
            raise EngineError(f"the engine worker did not start: {tail or 'no address printed within 60 s'}")
        sock, reader = _connect(line, self.budget_s)
        self._worker = _Worker(proc, sock, reader, line, stderr_path)

    def _kill(self) -> None:
        w, self._worker = self._worker, None
        if w is None:
            return
        for closeable in (w.reader, w.sock):
            try:
                closeable.close()
            except OSError:
                pass
        if w.proc is not None:
            if w.proc.poll() is None:
                w.proc.kill()
            _reap(w.proc)

    def _kill_standby(self) -> None:
        standby, self._standby = self._standby, []
        for proc, _ in standby:
            if proc.poll() is None:
                proc.kill()
            _reap(proc)

    def _restart(self, blamed: Collection[str] = ()) -> None:
        """A fresh worker with the same model and every candidate but the blamed groups' (those that
        passed the gate, and those swapped in but not gated yet)."""
        attached = self._worker is not None and self._worker.proc is None
        address = self._worker.address if self._worker is not None else ""
        self._kill()
        self.restarts += 1
        for group in blamed:
            self.pending.pop(group, None)
            self.accepted.pop(group, None)
        if attached:
            self._replace_attached(address)
        else:
            self._spawn(self.load_args.get("backend") or "cpu")
            self._call("load", self.load_budget_s, **self.load_args)
        if not self.healthy():
            raise EngineError("a fresh engine worker failed its canary: the device does not compute right")
        for group, (path, config) in [*self.accepted.items(), *self.pending.items()]:
            self._call("swap", self.budget_s, group=group, path=path, config=config)
        if not attached:
            self._launch_standby()

    def _replace_attached(self, address: str) -> None:
        """Kill an attached worker (by the pid it reported) and start its replacement, detached too,
        at the same address, so that whoever drives it next finds it where it was."""
        if self._attached_pid is not None:
            _kill_pid(self._attached_pid)
        kind, where = protocol.parse_address(address)
        args = {k: v for k, v in self.load_args.items() if k not in ("model", "backend", "target")}
        place = {"unix": where} if kind == "unix" else {"port": int(where[1])}
        try:
            address, pid = start_detached(
                self.load_args["model"], self.load_args["backend"], self.load_args["target"],
                load_budget_s=self.load_budget_s, **args, **place,
            )  # fmt: skip
        except (EngineError, UserError) as e:
            raise EngineError(f"the attached engine was lost and could not be replaced: {e}") from None
        self._attached_pid = pid
        sock, reader = _connect(address, self.budget_s)
        self._worker = _Worker(None, sock, reader, address, None)

    def shutdown(self) -> None:
        """Stop the worker and wait for it; leaves no process behind."""
        w = self._worker
        if w is not None:
            try:
                self._call("shutdown", 10.0)
            except (WorkerLost, EngineError, OSError):
                pass
            if w.proc is not None:
                try:
                    w.proc.wait(timeout=10.0)
                except subprocess.TimeoutExpired:
                    pass
        self._kill()
        self._kill_standby()

    def close(self) -> None:
        """Stop a worker this controller started; only disconnect from an attached one."""
        if self._worker is not None and self._worker.proc is None:
            self._kill()
        else:
            self.shutdown()
        self._kill_standby()
        self._prefetch.shutdown(wait=False, cancel_futures=True)
        self._tmp.cleanup()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_worker", None) is not None and self._worker.proc is not None:
            self._kill()
        if getattr(self, "_standby", None):
            self._kill_standby()

    # --- the wire ------------------------------------------------------------------------------------

    def _alive(self) -> _Worker:
        if self._worker is None:
            raise EngineError("the engine is not running; start it with Controller.start(...)")
        return self._worker

    def _call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """One request; the response's result, or UserError/EngineError for an engine-level error.
        Candidate errors come back as the raw error object under the key `__error__`."""
        w = self._alive()
        self._next_id += 1
        rid = self._next_id
        t0 = time.perf_counter()
        try:
            w.sock.settimeout(timeout)
            w.sock.sendall(protocol.encode(protocol.request(rid, op, **fields)))
            line = w.reader.readline()
        except TimeoutError:
            raise WorkerLost("hang", f"no answer to `{op}` within {timeout:g} s") from None
        except OSError as e:
            raise WorkerLost("crash", f"connection lost during `{op}`: {e}") from None
        if not line:
            code = None
            if w.proc is not None:
                try:
                    code = w.proc.wait(timeout=2.0)  # the socket closes a moment before the exit code
                except subprocess.TimeoutExpired:
                    pass
            raise WorkerLost(
                "crash", f"the worker died during `{op}` (exit code {code}) {w.stderr_tail(500)}"
            )
        response = protocol.decode(line)
        if response.get("id") != rid:
            raise EngineError(f"the engine answered request {response.get('id')} to request {rid}")
        spent = self.wire.setdefault(op, WireTime())
        spent.calls += 1
        spent.round_trip_s += time.perf_counter() - t0
        spent.worker_s += float(response.get("worker_s") or 0.0)
        spent.bytes += len(line)
        if response.get("ok"):
            return response["result"]
        err = response["error"]
        if err["kind"] in ("candidate_build", "candidate_run"):
            return {"__error__": err}
        if err["kind"] == "user":
            raise UserError(err["message"])
        raise EngineError(f"engine error ({err['kind']}) on `{op}`: {err['message']}")

    def _lost(self, lost: WorkerLost, blame: dict[str, str]) -> list[Fault]:
        """Record the fault against the candidates in `blame` (group -> kernel), then restart."""
        faults = [Fault(g, k, lost.how, str(lost)) for g, k in blame.items()]
        self.faults += faults
        self._restart(set(blame))
        return faults

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request that runs candidate code (the gates' wire): the result, the candidate's error
        under `__error__`, or WorkerLost for the caller to record against the candidate."""
        return self._call(op, self.budget_s, **fields)

    def replace_worker(self, blamed: Collection[str]) -> None:
        """A fresh worker without the blamed groups' candidates: for a worker lost to a candidate, or
        one that still answers but can no longer be trusted (a candidate patched its timer)."""
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

    # --- ops -----------------------------------------------------------------------------------------

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
        self.loaded = self._call("load", self.load_budget_s, **self.load_args)
        self.accepted.clear()
        self.pending.clear()
        self._canary_weight = self._call("canary", self.budget_s)["weight"]  # as loaded, before any candidate
        self._build_reference()
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

    def _build_reference(self) -> None:
        from polymorph.ir import serialize
        from polymorph.models import load_model

        options = {k: self.load_args[k] for k in ("dtype", "block_size") if self.load_args.get(k) is not None}
        self._model = load_model(self.load_args["model"], **options)
        if serialize.content_hash(self._model.graph) != self.loaded["graph_hash"]:
            raise EngineError("the worker built a different graph than the controller for the same model")
        self._reference = ReferenceExecutable(self._model.graph, self._model.weights())
        # Every position's logits: the scenario's reference reads the weights once per sequence.
        self._whole_graph = self._model.rebuild(all_logits=True) if self._model.config is not None else None
        self._next_scenario.clear()  # drawn on the model loaded before

    def groups(self) -> list[str]:
        return list(self.status()["groups"])

    @property
    def graph(self) -> Any:
        assert self._model is not None
        return self._model.graph

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The model's weights as the reference holds them (the worker holds its own copy)."""
        assert self._reference is not None
        return self._reference.weights

    @property
    def wide_weights(self) -> dict[str, np.ndarray]:
        """float32 copies of the low-precision projection weights the reference keeps."""
        assert self._reference is not None
        return self._reference.wide

    @property
    def vocab(self) -> int:
        return int(self.graph.params["model.embed_tokens.weight"].shape[0])

    def plan_group(self, group: str) -> dict[str, Any]:
        """{id, pattern, kernel, nodes, inputs, outputs} of a group of the loaded plan."""
        for g in self.loaded["groups"]:
            if g["id"] == group:
                return g
        raise UserError(f"no node group `{group}` in this plan")

    def gate_profile(self) -> Profile:
        if self.profile is None:
            from polymorph.hw import load_profile
            from polymorph.knobs import knobs

            self.profile = load_profile(self.loaded["profile"], knobs.calibration_dir)
        return self.profile

    def scenario(
        self, prompt_lens: tuple[int, ...] = (7, 3), decode_steps: int = 4, seed: int | None = None
    ) -> list[ScenarioStep]:
        """The teacher-forced scenario with the reference's logits (`polymorph.verify.numerics`). With
        no seed, one drawn fresh in the background since the last call (and the next one started), so
        a candidate's gates do not wait for the reference."""
        assert self._reference is not None
        if seed is not None:
            return self._draw(self._reference, prompt_lens, decode_steps, seed)
        key = (tuple(prompt_lens), decode_steps)
        ready = self._next_scenario.pop(key, None)
        self._next_scenario[key] = self._prefetch.submit(
            self._draw, self._reference, prompt_lens, decode_steps
        )
        t0 = time.perf_counter()
        try:
            return (
                ready.result()
                if ready is not None
                else self._draw(self._reference, prompt_lens, decode_steps)
            )
        finally:
            self.reference_wait_s += time.perf_counter() - t0

    def quiet(self) -> None:
        """Wait for the scenario drawn in the background, so that it takes no host time from a
        measurement (the timing gates call it first). Its errors surface where it is used."""
        for ready in list(self._next_scenario.values()):
            ready.exception()

    def _draw(
        self,
        ref: ReferenceExecutable,
        prompt_lens: tuple[int, ...],
        decode_steps: int,
        seed: int | None = None,
    ) -> list[ScenarioStep]:
        """A fresh scenario on a reference of its own (the cache is per executable), sharing `ref`'s
        weights and their f32 copies: one all-logits prefill per sequence where the model has a
        builder, else step by step."""
        t0 = time.perf_counter()
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
        It counts only after `verify` passes; a build failure is recorded and the stock kernel stays."""
        path = str(Path(path).resolve())
        t0 = time.perf_counter()
        try:
            r = self._call("swap", self.budget_s, group=group, path=path, config=config)
        except WorkerLost as lost:
            (fault,) = self._lost(lost, {group: path})
            return SwapResult(group, path, False, round_trip_s=time.perf_counter() - t0, fault=fault)
        rtt = time.perf_counter() - t0
        if "__error__" in r:
            fault = Fault(group, path, "build", r["__error__"]["message"])
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
        prompt_lens: tuple[int, ...] = (7, 3),
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
        """The stock plan's logits over `scenario`: one `verify` in which `groups` run their stock
        kernels, their candidates held aside in the worker and put back after (not loaded again).
        WorkerLost propagates to the caller, who knows whom to blame."""
        steps, ctx = scenario_steps(scenario), scenario_ctx(scenario)
        r = self._call("verify", self.budget_s, steps=steps, max_ctx=ctx, stock_groups=sorted(groups))
        if "__error__" in r:
            raise EngineError(f"the stock plan's run failed: {r['__error__']['message']}")
        return answer_logits(r, len(scenario))

    def try_candidate(
        self, group: str, path: str | Path, config: dict[str, Any] | None = None, *, seed: int | None = None
    ) -> tuple[SwapResult, GateReport | None]:
        """Swap, run every gate of `polymorph.engine.gates` (each outcome recorded in the report, each
        failure in `faults`), and only then measure the group (fast tier) with the timing gates. The
        candidate stays in only when all pass; the report's `measurement` is the timing that counts."""
        from polymorph.engine.gates import run_gates

        swap = self.swap(group, path, config)
        if not swap.ok:
            return swap, None
        report = run_gates(self, group, swap.kernel, config, seed=seed)
        self.faults += report.faults
        if report.ok:
            self.accepted[group] = self.pending.pop(group)
        elif group in self.pending:  # still in the worker (a lost worker came back without it)
            self.restore(group)
        return swap, report

    def measure(self, tier: str = "fast", trials: int = 20, group: str | None = None) -> dict[str, Any]:
        """Time the engine as it stands (tier "slow": whole decode steps at the loaded bucket; "fast":
        each group's launch alone, or `group`'s). A candidate that hangs here is recorded and the
        worker replaced; the result then carries `fault`."""
        try:
            return self._call("measure", self.budget_s, tier=tier, trials=trials, group=group)
        except WorkerLost as lost:
            # Which one hung is unknown (an accepted candidate may hang only at the bucket's shapes):
            # every candidate in place takes the blame and none is re-applied.
            blame = {g: p for g, (p, _) in {**self.accepted, **self.pending}.items()}
            return {"tier": tier, "fault": [f.__dict__ for f in self._lost(lost, blame)]}

    def status(self) -> dict[str, Any]:
        return self._call_engine("status")

    def reset(self) -> list[str]:
        """Stock kernels everywhere and a zeroed cache."""
        restored = self._call_engine("reset")["restored"]
        self.accepted.clear()
        self.pending.clear()
        return restored
