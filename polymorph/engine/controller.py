"""The engine controller: the trusted side, and the Python client of a worker.

    from polymorph.engine import Controller
    with Controller.start("llama-tiny", backend="cpu") as engine:
        swap = engine.swap("layers.0.mlp.down+residual", "my_linear_residual.py")
        gate = engine.verify()            # rejected candidates are swapped back to the stock kernel
        timing = engine.measure("slow", trials=20)

It starts the worker (`python -m polymorph.engine.worker`) as a subprocess, holds the reference engine
(`polymorph.session.ReferenceExecutable`) and compares: the gate for swapped candidates is the
teacher-forced logits of the whole model, with the candidates in place and every output poisoned,
against the reference on fresh random tokens (the scenario of `polymorph.verify.numerics`). The worker
only ever receives token ids and returns logits. NaN never passes.

Faults cost the candidate, not the engine: a candidate that raises at build or at run is recorded
(`Controller.faults`) with its cause and swapped out; a worker that dies, or does not answer within
`budget_s`, is killed and replaced by a fresh one that reloads the model and re-applies the
candidates that had passed the gate.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.engine import protocol
from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.session import ReferenceExecutable
from polymorph.tolerance import Tolerance, model_tolerance
from polymorph.verify.numerics import StepCheck, judge, reference_scenario


class EngineError(UserError):
    """The engine itself (not a candidate) failed: the worker would not start, or answered nonsense."""


class _WorkerLost(Exception):
    """The worker died or did not answer in time; `how` is "hang" or "crash"."""

    def __init__(self, how: str, detail: str) -> None:
        super().__init__(detail)
        self.how = how


@dataclass(frozen=True)
class Fault:
    """One candidate's failure. stage: build, run, numerics, hang or crash."""

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
    log: str | Path | None = None,
    load_budget_s: float = 600.0,
) -> tuple[str, int]:
    """Start a worker that outlives this process (`polymorph engine start`), load `model` into it and
    return (address, pid). Drive it with `Controller.attach(address)`; stop it with its `shutdown`.
    The worker's stderr goes to `log` (default: <cache dir>/engine/worker-<time>.log)."""
    from polymorph.knobs import knobs

    if log is None:
        log = Path(knobs.cache_dir) / "engine" / f"worker-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "polymorph.engine.worker"]
    cmd += ["--unix", str(unix)] if unix is not None else ["--port", "0"]
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


class Controller:
    """Drives one worker; holds the reference engine, the fault record and the accepted candidates."""

    def __init__(self, *, budget_s: float = 30.0, load_budget_s: float = 600.0, unix: bool = False) -> None:
        self.budget_s = budget_s  # the most a swap, verify or measure may take before the worker is replaced
        self.load_budget_s = load_budget_s
        self.unix = unix
        self.faults: list[Fault] = []
        self.restarts = 0
        self.accepted: dict[str, tuple[str, dict[str, Any] | None]] = {}  # passed the gate
        self.pending: dict[str, tuple[str, dict[str, Any] | None]] = {}  # swapped in, not yet gated
        self.load_args: dict[str, Any] = {}
        self.loaded: dict[str, Any] = {}
        self._worker: _Worker | None = None
        self._next_id = 0
        self._model: Any = None
        self._reference: ReferenceExecutable | None = None
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
    ) -> Controller:
        """Start a worker and load `model` into it (weights, KV cache and stock kernels, once)."""
        engine = cls(budget_s=budget_s, unix=unix)
        try:
            engine._spawn()
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
        except BaseException:
            engine.close()
            raise
        return engine

    @classmethod
    def attach(cls, address: str, *, budget_s: float = 30.0) -> Controller:
        """Drive a worker someone else started (`polymorph engine start`). It cannot be restarted from
        here: a candidate that hangs or kills it is recorded and the engine is reported lost."""
        engine = cls(budget_s=budget_s)
        sock, reader = _connect(address, budget_s)
        engine._worker = _Worker(None, sock, reader, address, None)
        status = engine.status()
        if not status.get("loaded"):
            raise EngineError(f"the engine at {address} has no model loaded")
        engine.loaded = status
        engine.load_args = {
            "model": status["model"],
            "dtype": status["dtype"],
            "block_size": status["block_size"],
        }
        engine._build_reference()
        engine.pending = {g: (e["kernel"], None) for g, e in status["groups"].items() if e["candidate"]}
        return engine

    @property
    def address(self) -> str:
        return self._alive().address

    @property
    def pid(self) -> int | None:
        w = self._alive()
        return w.proc.pid if w.proc is not None else None

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "polymorph.engine.worker", "--watch-stdin"]
        if self.unix:
            cmd += ["--unix", os.path.join(self._tmp.name, f"worker-{self.restarts}.sock")]
        else:
            cmd += ["--port", "0"]
        from polymorph.knobs import knobs

        stderr_path = Path(self._tmp.name) / f"worker-{self.restarts}.stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=knobs.child_environ()
            )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line:
            proc.kill()
            proc.wait()
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
            w.proc.wait()
            for pipe in (w.proc.stdin, w.proc.stdout):
                if pipe is not None:
                    pipe.close()

    def _restart(self, blamed: Collection[str] = ()) -> None:
        """A fresh worker with the same model and every candidate but the blamed groups' (those that
        passed the gate, and those swapped in but not gated yet)."""
        if self._worker is not None and self._worker.proc is None:
            self._kill()
            raise EngineError("the attached engine was lost; start a new one with `polymorph engine start`")
        self._kill()
        self.restarts += 1
        for group in blamed:
            self.pending.pop(group, None)
            self.accepted.pop(group, None)
        self._spawn()
        self._call("load", self.load_budget_s, **self.load_args)
        for group, (path, config) in [*self.accepted.items(), *self.pending.items()]:
            self._call("swap", self.budget_s, group=group, path=path, config=config)

    def shutdown(self) -> None:
        """Stop the worker and wait for it; leaves no process behind."""
        w = self._worker
        if w is not None:
            try:
                self._call("shutdown", 10.0)
            except (_WorkerLost, EngineError, OSError):
                pass
            if w.proc is not None:
                try:
                    w.proc.wait(timeout=10.0)
                except subprocess.TimeoutExpired:
                    pass
        self._kill()

    def close(self) -> None:
        """Stop a worker this controller started; only disconnect from an attached one."""
        if self._worker is not None and self._worker.proc is None:
            self._kill()
        else:
            self.shutdown()
        self._tmp.cleanup()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_worker", None) is not None and self._worker.proc is not None:
            self._kill()

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
        try:
            w.sock.settimeout(timeout)
            w.sock.sendall(protocol.encode(protocol.request(rid, op, **fields)))
            line = w.reader.readline()
        except TimeoutError:
            raise _WorkerLost("hang", f"no answer to `{op}` within {timeout:g} s") from None
        except OSError as e:
            raise _WorkerLost("crash", f"connection lost during `{op}`: {e}") from None
        if not line:
            code = w.proc.poll() if w.proc is not None else None
            raise _WorkerLost(
                "crash", f"the worker died during `{op}` (exit code {code}) {w.stderr_tail(500)}"
            )
        response = protocol.decode(line)
        if response.get("id") != rid:
            raise EngineError(f"the engine answered request {response.get('id')} to request {rid}")
        if response.get("ok"):
            return response["result"]
        err = response["error"]
        if err["kind"] in ("candidate_build", "candidate_run"):
            return {"__error__": err}
        if err["kind"] == "user":
            raise UserError(err["message"])
        raise EngineError(f"engine error ({err['kind']}) on `{op}`: {err['message']}")

    def _lost(self, lost: _WorkerLost, blame: dict[str, str]) -> list[Fault]:
        """Record the fault against the candidates in `blame` (group -> kernel), then restart."""
        faults = [Fault(g, k, lost.how, str(lost)) for g, k in blame.items()]
        self.faults += faults
        self._restart(set(blame))
        return faults

    def _call_engine(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request that runs no new candidate code (status, reset, restore). If the worker is lost
        anyway (a candidate left something behind), the candidates not yet gated take the blame, the
        worker is replaced and the request is sent once more."""
        try:
            return self._call(op, self.budget_s, **fields)
        except _WorkerLost as lost:
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
        self._build_reference()
        return self.loaded

    def _build_reference(self) -> None:
        from polymorph.ir import serialize
        from polymorph.models import load_model

        options = {k: self.load_args[k] for k in ("dtype", "block_size") if self.load_args.get(k) is not None}
        self._model = load_model(self.load_args["model"], **options)
        if serialize.content_hash(self._model.graph) != self.loaded["graph_hash"]:
            raise EngineError("the worker built a different graph than the controller for the same model")
        self._reference = ReferenceExecutable(self._model.graph, self._model.weights())

    def groups(self) -> list[str]:
        return list(self.status()["groups"])

    def swap(self, group: str, path: str | Path, config: dict[str, Any] | None = None) -> SwapResult:
        """Build candidate `path` for `group` in the worker and swap it in (weights and cache stay).
        It counts only after `verify` passes; a build failure is recorded and the stock kernel stays."""
        path = str(Path(path).resolve())
        t0 = time.perf_counter()
        try:
            r = self._call("swap", self.budget_s, group=group, path=path, config=config)
        except _WorkerLost as lost:
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
        assert self._model is not None and self._reference is not None
        under_test = (
            dict(self.pending)
            if group is None
            else {group: self.pending[group]}
            if group in self.pending
            else {}
        )
        graph = self._model.graph
        dtype = DType.parse(graph.meta.get("dtype", "f32"))
        tol = model_tolerance(dtype)
        scenario = reference_scenario(
            self._reference, graph, prompt_lens=prompt_lens, decode_steps=decode_steps, seed=seed
        )
        steps = [{"seqs": step.seqs, "tokens": step.tokens} for step in scenario]
        blame = {g: p for g, (p, _) in under_test.items()}
        try:
            r = self._call(
                "verify",
                self.budget_s,
                steps=steps,
                max_ctx=max(prompt_lens) + decode_steps,
                group=group,
            )
        except _WorkerLost as lost:
            result = GateResult(tol, list(under_test))
            result.faults = self._lost(lost, blame)
            return result
        got: list[Any] = [np.asarray(logits) for logits in r.get("logits", [])]
        if "failed_step" in r:
            got = [*got[: r["failed_step"]], str(r["cause"])]
        elif len(got) != len(scenario):
            raise EngineError(f"the engine returned {len(got)} steps of logits for {len(scenario)}")
        judged = judge(scenario, got, dtype, tol)
        result = GateResult(tol, list(under_test), steps=judged.steps)
        if "failed_step" in r:
            result.faults = [Fault(g, p, "run", r["cause"]) for g, p in blame.items()]
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

    def try_candidate(
        self, group: str, path: str | Path, config: dict[str, Any] | None = None, *, seed: int | None = None
    ) -> tuple[SwapResult, GateResult | None]:
        """Swap, then gate: the candidate stays in only when both pass."""
        swap = self.swap(group, path, config)
        if not swap.ok:
            return swap, None
        return swap, self.verify(group, seed=seed)

    def measure(self, tier: str = "fast", trials: int = 20, group: str | None = None) -> dict[str, Any]:
        """Time the engine as it stands (tier "slow": whole decode steps at the loaded bucket; "fast":
        each group's launch alone, or `group`'s). A candidate that hangs here is recorded and the
        worker replaced; the result then carries `fault`."""
        try:
            return self._call("measure", self.budget_s, tier=tier, trials=trials, group=group)
        except _WorkerLost as lost:
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
