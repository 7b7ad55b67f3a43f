"""How a controller reaches its workers: a pool of its own (`LocalLink`), or the pool of a detached
engine host (`HostLink`, `polymorph engine start`), through one interface.

Either way the worker's process tree is frozen the moment the answer to a `run_group` or `measure`
arrives (before the controller reads any output from the arena) and thawed when the next request is
sent; the harness's cost is measured on the standby, a worker no candidate has touched, with the
current one frozen so that it cannot slow the measurement down.
"""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.engine import protocol
from polymorph.engine.arena import Arena, slots_digest
from polymorph.engine.pool import WorkerPool
from polymorph.engine.wire import VARIED, EngineError, WorkerLost, WorkerProcess

Candidates = dict[str, tuple[str, dict[str, Any] | None]]
Spec = tuple[str, str, tuple[int, ...]]  # (slot name, numpy dtype string, shape)


@dataclass
class Layout:
    """Where one request's calls live in an io arena: per call, the slot of each input (None: a
    weight) and of each output (None: a cache written in place into input slot `aliased[j]`)."""

    specs: list[Spec]
    in_slots: list[list[str | None]]
    out_slots: list[list[str | None]]
    aliased: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {"specs": [list(s) for s in self.specs], "in_slots": self.in_slots, "out_slots": self.out_slots,
                "aliased": {str(k): v for k, v in self.aliased.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Layout:
        return cls([(n, t, tuple(shape)) for n, t, shape in d["specs"]], d["in_slots"], d["out_slots"],
                   {int(k): int(v) for k, v in d["aliased"].items()})  # fmt: skip


@dataclass
class CallsResult:
    """One request's answer: the controller's clock, and copies of every call's outputs and inputs
    taken while the worker was frozen (the worker is thawed again before this is returned)."""

    wall_s: float
    outputs: list[list[np.ndarray]]
    inputs_after: list[list[np.ndarray | None]]
    calls: int = 0

    def output(self, i: int) -> list[np.ndarray]:
        return self.outputs[i]


# A candidate whose outputs (or in-place inputs) changed between the worker's answer and the freeze.
LATE_WRITE = ("the outputs changed after the worker answered (work finished after the answer, outside the "
              "controller's clock: a child process, a thread, queued device work)")  # fmt: skip


def _fill(dtype: np.dtype, fill: Any) -> Any:
    is_float = dtype.kind in "fV"
    if fill == "nan":
        return float("nan") if is_float else -(2**30)
    return float(fill) if is_float else int(fill)


def _prefill(a: np.ndarray, fill: Any) -> None:
    """Fill an output slot before a call: one value throughout (`_fill`), or with VARIED different
    numbers drawn by this process at a scale drawn too (1e-3 to 1e3), as a serving step's buffers hold
    the last step's varied numbers: a kernel cannot tell a judged call by its buffers being uniform."""
    if fill != VARIED:
        a[...] = _fill(a.dtype, fill)
        return
    rng = np.random.default_rng()
    if a.dtype.kind in "fV":
        a[...] = (rng.standard_normal(a.shape) * 10 ** rng.uniform(-3, 3)).astype(a.dtype)
    elif a.dtype.kind == "b":
        a[...] = rng.random(a.shape) < 0.5
    elif a.dtype.kind == "c":
        a[...] = rng.standard_normal(a.shape) + 1j * rng.standard_normal(a.shape)
    else:
        info = np.iinfo(a.dtype)
        a[...] = rng.integers(max(info.min, -(2**20)), min(info.max, 2**20), a.shape, dtype=a.dtype)


class LocalLink:
    """A pool of this process's own."""

    def __init__(self, tmp: Path, *, load_budget_s: float) -> None:
        self.pool = WorkerPool(tmp, load_budget_s=load_budget_s)
        self._arenas: dict[tuple, Arena] = {}
        self._last: tuple[WorkerProcess, Arena, Layout] | None = None  # for `settle`

    @property
    def worker(self) -> WorkerProcess:
        if self.pool.current is None:
            raise EngineError("the engine is not running; start it with Controller.start(...)")
        return self.pool.current

    @property
    def layers(self) -> dict[str, str]:
        return self.pool.layers

    @property
    def pid(self) -> int | None:
        return self.pool.current.pid if self.pool.current is not None else None

    def start(self, model: Any, load_args: dict[str, Any], candidates: Candidates) -> dict[str, Any]:
        self.pool.publish(model, load_args)
        w = self.pool.promote(candidates)
        assert w.loaded is not None
        return w.loaded

    def call(
        self, op: str, timeout: float, *, clean: Candidates | None = None, **fields: Any
    ) -> tuple[dict[str, Any], int]:
        """One request to the current worker (with `clean`: to a fork no candidate under test touched,
        holding those accepted candidates, the current one frozen meanwhile)."""
        current = self.pool.current
        w = self.pool.clean_worker(clean) if clean is not None else self.worker
        if clean is not None and current is not None:
            current.freeze()
        try:
            try:
                rid = w.send(op, **fields)
            except OSError as e:
                raise WorkerLost("crash", f"connection lost sending `{op}`: {e}") from None
            return w.receive(rid, op, timeout)
        finally:
            if clean is not None and current is not None:
                current.thaw()

    def stage(self, path: str | Path) -> str:
        return self.pool.stage(path)

    # --- calls on shared memory ----------------------------------------------------------------------

    def _arena(self, specs: list[Spec]) -> Arena:
        key = tuple(specs)
        arena = self._arenas.get(key)
        if arena is None:
            while len(self._arenas) >= 8:  # a few shapes in use at a time
                self._arenas.pop(next(iter(self._arenas))).close()
            arena = Arena.sealed(f"io-{uuid.uuid4().hex[:8]}", [(n, np.dtype(t), s) for n, t, s in specs])
            self._arenas[key] = arena
        return arena

    def _mapped(self, w: WorkerProcess, arena: Arena, timeout: float) -> dict[str, Any]:
        """`arena` handed to `w` (once per worker): the io field its requests name it by."""
        key = str(arena.path)
        if key not in w.mapped:
            assert arena.fd is not None
            rid = w.send("map", arena=key, entries=arena.entries, size=arena.size)
            answer, _ = w.receive(rid, "map", timeout)
            if not answer.get("ok") or not answer["result"].get("await_fd"):
                raise WorkerLost("sandbox", f"the worker would not take an io arena: {answer}")
            try:
                socket.send_fds(w.sock, [b"a"], [arena.fd])
            except OSError as e:
                raise WorkerLost("crash", f"the worker died taking an io arena ({e})") from None
            done, _ = w.receive(rid, "map", timeout)
            if not done.get("ok"):
                raise WorkerLost("sandbox", f"the worker could not map an io arena: {done}")
            w.mapped.add(key)
        return {"id": key}

    def run_calls(
        self, layout: Layout, calls: list[list[np.ndarray | None]], fields: dict[str, Any], *, fill: Any,
        timeout: float, clean: Candidates | None = None, quiet: bool = False,
    ) -> tuple[dict[str, Any], CallsResult | None]:  # fmt: skip
        """One `run_group` request of `calls` (outputs poisoned with `fill`, inputs written inside the
        clock) on the current worker, or with `clean` on a fork no candidate touched (`clean` names the
        accepted candidates it holds; with `quiet` the current worker is frozen meanwhile, so that it
        cannot take the host's time from a measurement). The worker's answer, and what came out,
        copied while it was frozen."""
        arena = self._arena(layout.specs)
        current = self.pool.current if quiet else None
        w = self.pool.clean_worker(clean) if clean is not None else self.worker
        if clean is not None and current is not None:
            current.freeze()
        try:
            w.thaw()
            io = self._mapped(w, arena, timeout)
            for outs in layout.out_slots:
                for name in outs:
                    if name is not None:
                        _prefill(arena.arrays[name], fill)
            t0 = time.perf_counter()
            for call, names in zip(calls, layout.in_slots, strict=True):
                for a, name in zip(call, names, strict=True):
                    if name is not None:
                        arena.arrays[name][...] = a
            rid = w.send("run_group", **fields, io=io)
            response, _ = w.receive(rid, "run_group", timeout)
            wall = time.perf_counter() - t0
            w.freeze()
            try:
                if not response.get("ok"):
                    return response, None
                result = CallsResult(wall, *_copies(arena, layout), calls=len(calls))
                slots = list(zip(layout.out_slots, layout.in_slots, strict=True))
                if response["result"].get("slots") != slots_digest(arena.arrays, slots):
                    return {"ok": False, "error": {"kind": "candidate_run", "message": LATE_WRITE}}, None
            finally:
                w.thaw()
            self._last = (w, arena, layout)
            return response, result
        finally:
            if clean is not None and current is not None:
                current.thaw()

    def settle(self, seconds: float) -> list[np.ndarray]:
        """The last request's last outputs again, `seconds` after its answer (the worker running
        meanwhile, frozen while they are read)."""
        assert self._last is not None
        w, arena, layout = self._last
        time.sleep(seconds)
        w.freeze()
        try:
            outs, _ = _copies(arena, layout, only=len(layout.out_slots) - 1)
        finally:
            w.thaw()
        return outs[0]

    def run_steps(
        self, tokens: np.ndarray, vocab: int, timeout: float
    ) -> tuple[dict[str, Any], float, np.ndarray]:
        """Whole decode steps on `tokens` [n, batch, 1] (op `measure`): the answer, the clock, the logits."""
        n, batch, _ = tokens.shape
        arena = self._arena([("tokens", "<i4", (n, batch, 1)), ("logits", "<f4", (n, batch, vocab))])
        w = self.worker
        io = self._mapped(w, arena, timeout)
        arena.arrays["logits"][...] = np.nan
        t0 = time.perf_counter()
        arena.arrays["tokens"][...] = tokens
        rid = w.send("measure", io=io)
        response, _ = w.receive(rid, "measure", timeout)
        wall = time.perf_counter() - t0
        w.freeze()
        try:
            logits = np.array(arena.arrays["logits"])
            late = response.get("ok") and response["result"].get("slots") != slots_digest(
                arena.arrays, [(["logits"], ["tokens"])]
            )
        finally:
            w.thaw()
        if late:
            return {"ok": False, "error": {"kind": "candidate_run", "message": LATE_WRITE}}, wall, logits
        return response, wall, logits

    def retire(self, candidates: Candidates) -> dict[str, Any]:
        """The current worker killed with its tree (and every stray in the sandbox); a fresh fork with
        `candidates` in its place."""
        w = self.pool.promote(candidates)
        assert w.loaded is not None
        return w.loaded

    def quiet(self) -> None:
        """Nothing loads in the background: a fork is made when it is needed."""

    def harness(self, layout: Layout, calls: list[list[np.ndarray | None]], fields: dict[str, Any],
                timeout: float, clean: Candidates) -> float | None:  # fmt: skip
        """Seconds of one `run_group` request of `calls` with the empty launch on a fork no candidate
        touched, the current worker frozen meanwhile so that it cannot slow it down. The first request
        maps the arena; the quicker of the next two counts. None: it failed."""
        walls = []
        for _ in range(3):
            response, done = self.run_calls(layout, calls, {**fields, "noop": True}, fill="nan",
                                            timeout=timeout, clean=clean, quiet=True)  # fmt: skip
            if done is None:
                return None
            walls.append(done.wall_s)
        return min(walls[1:])

    def processes(self) -> int:
        """Processes in the sandbox beyond the zygote and the current worker: its children, and what
        it left behind (a daemon reparented to the zygote)."""
        w = self.pool.current
        own = w.proc.tree() if w is not None and w.alive() else []
        return max(len(own) - 1, 0) + len(self.pool.strays())

    def close(self) -> None:
        for arena in self._arenas.values():
            arena.close()
        self._arenas.clear()
        self.pool.close()


class HostLink:
    """The pool of a detached engine host, over its address; the host relays to its worker."""

    def __init__(self, address: str, budget_s: float) -> None:
        self.address = address
        self.next_id = 0
        self._connect(budget_s)
        try:  # the handshake: whatever else listens at a wrong address fails here, in one line
            self.host: dict[str, Any] = self.host_call("host_status", budget_s)
        except (protocol.ProtocolError, WorkerLost, KeyError, TypeError, AttributeError) as e:
            self.close()
            why = (f"no answer within {budget_s:g} s" if isinstance(e, WorkerLost) else f"it answered {e}"
                   if isinstance(e, protocol.ProtocolError) else "its answer is not an engine's")  # fmt: skip
            raise EngineError(
                f"{address} is not a polymorph engine ({why}); give the address `polymorph engine start` "
                "printed"
            ) from None
        except BaseException:
            self.close()
            raise

    def _connect(self, budget_s: float) -> None:
        if getattr(self, "sock", None) is not None:
            self.close()
        kind, where = protocol.parse_address(self.address)  # UserError: one line naming the fault
        try:
            if kind == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(budget_s)
                try:
                    sock.connect(where)
                except BaseException:
                    sock.close()
                    raise
            else:  # a name or an IPv4/IPv6 address: each address it resolves to is tried in turn
                sock = socket.create_connection(where, timeout=budget_s)
        except (OSError, UnicodeError, OverflowError) as e:  # refused, no such socket, unknown host...
            reason = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
            raise EngineError(
                f"cannot connect to the engine at {self.address}: {reason}; is an engine running there? "
                "`polymorph engine start MODEL` starts one and prints its address"
            ) from None
        self.sock = sock
        self.reader = self.sock.makefile("rb")

    @property
    def layers(self) -> dict[str, str]:
        return dict(self.host.get("layers") or {})

    @property
    def pid(self) -> int | None:
        return int(self.host["pid"])

    def call(
        self, op: str, timeout: float, *, clean: Candidates | None = None, **fields: Any
    ) -> tuple[dict[str, Any], int]:
        if clean is not None:
            r = self.host_call(
                "host_clean_call", timeout + 30.0, of=op, candidates=clean, fields=fields, budget=timeout
            )
            return r["response"], 0
        self.next_id += 1
        rid = self.next_id
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(protocol.encode(protocol.request(rid, op, **fields, _budget_s=timeout)))
            line = self.reader.readline()
        except TimeoutError:
            # This connection is spent (a socket file that timed out cannot be read again); the host
            # answers a new one once its own wait for the worker ends (it waits as long as we did).
            self._connect(max(timeout, 30.0))
            raise WorkerLost(
                "hang", f"no answer to `{op}` from the engine host within {timeout:g} s"
            ) from None
        except OSError as e:
            raise EngineError(f"the engine host at {self.address} was lost during `{op}`: {e}") from None
        if not line:
            raise EngineError(f"the engine host at {self.address} closed the connection during `{op}`")
        response = protocol.decode(line)
        if response.get("id") != rid:
            raise EngineError(f"the engine host answered request {response.get('id')} to request {rid}")
        err = response.get("error") or {}
        if not response.get("ok") and err.get("kind") == "worker_lost":
            raise WorkerLost(str(err.get("how", "crash")), str(err.get("message")))
        return response, len(line)

    def host_call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        response, _ = self.call(op, timeout, **fields)
        if not response.get("ok"):
            raise EngineError(f"the engine host refused `{op}`: {response['error']['message']}")
        return response["result"]

    def stage(self, path: str | Path) -> str:
        return str(self.host_call("host_stage", 30.0, path=str(Path(path).resolve()))["path"])

    def retire(self, candidates: Candidates) -> dict[str, Any]:
        loaded = self.host_call("host_retire", 600.0, candidates=candidates)
        self.host = self.host_call("host_status", 30.0)
        return loaded

    def quiet(self) -> None:
        self.host_call("host_quiet", 600.0)

    def run_calls(
        self, layout: Layout, calls: list[list[np.ndarray | None]], fields: dict[str, Any], *, fill: Any,
        timeout: float, clean: Candidates | None = None,
    ) -> tuple[dict[str, Any], CallsResult | None]:  # fmt: skip
        """As LocalLink.run_calls, by the host (trusted): its clock, its freezing, its copies."""
        r = self.host_call("host_run_calls", timeout + 30.0, layout=layout.to_json(), calls=calls, fields=fields,
                           fill=fill, budget=timeout, accepted=clean)  # fmt: skip
        if r.get("outputs") is None:
            return r["response"], None
        return r["response"], CallsResult(float(r["wall_s"]), r["outputs"], r["inputs_after"], len(calls))

    def settle(self, seconds: float) -> list[np.ndarray]:
        return list(self.host_call("host_settle", 30.0 + seconds, seconds=seconds)["outputs"])

    def run_steps(
        self, tokens: np.ndarray, vocab: int, timeout: float
    ) -> tuple[dict[str, Any], float, np.ndarray]:
        r = self.host_call("host_run_steps", timeout + 30.0, tokens=tokens, vocab=vocab, budget=timeout)
        return r["response"], float(r["wall_s"]), np.asarray(r["logits"])

    def harness(self, layout: Layout, calls: list[list[np.ndarray | None]], fields: dict[str, Any],
                timeout: float, clean: Candidates) -> float | None:  # fmt: skip
        r = self.host_call("host_harness", timeout + 60.0, layout=layout.to_json(), calls=calls, fields=fields,
                           budget=timeout, accepted=clean)  # fmt: skip
        return r.get("wall_s")

    def processes(self) -> int:
        return int(self.host_call("host_processes", 30.0)["extra"])

    def close(self) -> None:
        for closeable in (self.reader, self.sock):
            try:
                closeable.close()
            except OSError:
                pass


def _copies(arena: Arena, layout: Layout, only: int | None = None) -> tuple[list, list]:
    """Copies of every call's outputs and inputs (or call `only`'s outputs), out of the arena."""
    calls = range(len(layout.out_slots)) if only is None else [only]
    outs, ins = [], []
    for i in calls:
        row = []
        for j, name in enumerate(layout.out_slots[i]):
            slot = name if name is not None else layout.in_slots[i][layout.aliased[j]]
            row.append(np.array(arena.arrays[slot]))
        outs.append(row)
        if only is None:
            ins.append([None if n is None else np.array(arena.arrays[n]) for n in layout.in_slots[i]])
    return outs, ins
