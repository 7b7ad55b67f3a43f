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
from pathlib import Path
from typing import Any

from polymorph.engine import protocol
from polymorph.engine.pool import WorkerPool
from polymorph.engine.wire import EngineError, WorkerLost, WorkerProcess

FREEZE_OPS = ("run_group", "measure")  # answers after which the outputs are read from shared memory
Candidates = dict[str, tuple[str, dict[str, Any] | None]]


class LocalLink:
    """A pool of this process's own."""

    def __init__(self, tmp: Path, *, load_budget_s: float) -> None:
        self.pool = WorkerPool(tmp, load_budget_s=load_budget_s)

    @property
    def worker(self) -> WorkerProcess:
        if self.pool.current is None:
            raise EngineError("the engine is not running; start it with Controller.start(...)")
        return self.pool.current

    @property
    def io_dir(self) -> Path:
        return self.pool.io_dir

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

    def call(self, op: str, timeout: float, **fields: Any) -> tuple[dict[str, Any], int]:
        w = self.worker
        w.thaw()
        try:
            rid = w.send(op, **fields)
        except OSError as e:
            raise WorkerLost("crash", f"connection lost sending `{op}`: {e}") from None
        response, size = w.receive(rid, op, timeout)
        if op in FREEZE_OPS:
            w.freeze()
        return response, size

    def stage(self, path: str | Path) -> str:
        return self.pool.stage(path)

    def retire(self, candidates: Candidates) -> dict[str, Any]:
        """The current worker killed with its tree (and every stray in the sandbox); a fresh fork with
        `candidates` in its place."""
        w = self.pool.promote(candidates)
        assert w.loaded is not None
        return w.loaded

    def quiet(self) -> None:
        """Nothing loads in the background: a fork is made when it is needed."""

    def harness(self, fields: dict[str, Any], timeout: float) -> float | None:
        """Seconds of one `run_group` request with the empty launch on a fresh fork (a worker no
        candidate touched), the current worker frozen meanwhile so that it cannot slow it down. The
        first request maps the arena; the quicker of the next two counts."""
        current = self.pool.current
        if current is not None:
            current.freeze()
        clean = self.pool.fork()
        try:
            walls = []
            for _ in range(3):
                t0 = time.perf_counter()
                rid = clean.send("run_group", **fields, noop=True)
                response, _ = clean.receive(rid, "run_group", timeout)
                walls.append(time.perf_counter() - t0)
                if not response.get("ok"):
                    return None
        finally:
            clean.kill()
            clean.proc.wait(timeout=10.0)
            if current is not None:
                current.thaw()
        return min(walls[1:])

    def settle(self, seconds: float) -> None:
        """Let the current worker run `seconds`, then freeze it again."""
        w = self.worker
        w.thaw()
        time.sleep(seconds)
        w.freeze()

    def processes(self) -> int:
        """Processes in the sandbox beyond the zygote and the current worker: its children, and what
        it left behind (a daemon reparented to the zygote)."""
        w = self.pool.current
        own = w.proc.tree() if w is not None and w.alive() else []
        return max(len(own) - 1, 0) + len(self.pool.strays())

    def close(self) -> None:
        self.pool.close()


class HostLink:
    """The pool of a detached engine host, over its address; the host relays to its worker."""

    def __init__(self, address: str, budget_s: float) -> None:
        self.address = address
        self.next_id = 0
        self._connect(budget_s)
        self.host: dict[str, Any] = self.host_call("host_status", budget_s)

    def _connect(self, budget_s: float) -> None:
        if getattr(self, "sock", None) is not None:
            self.close()
        kind, where = protocol.parse_address(self.address)
        family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(budget_s)
        try:
            self.sock.connect(where)
        except OSError as e:
            self.sock.close()
            raise EngineError(f"cannot connect to the engine at {self.address}: {e.strerror or e}") from None
        self.reader = self.sock.makefile("rb")

    @property
    def io_dir(self) -> Path:
        return Path(self.host["io_dir"])

    @property
    def layers(self) -> dict[str, str]:
        return dict(self.host.get("layers") or {})

    @property
    def pid(self) -> int | None:
        return int(self.host["pid"])

    def call(self, op: str, timeout: float, **fields: Any) -> tuple[dict[str, Any], int]:
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
            raise WorkerLost("hang", f"no answer to `{op}` from the engine host within {timeout:g} s") from None
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

    def harness(self, fields: dict[str, Any], timeout: float) -> float | None:
        r = self.host_call("host_harness", timeout, fields=fields)
        return r.get("wall_s")

    def settle(self, seconds: float) -> None:
        self.host_call("host_settle", 30.0 + seconds, seconds=seconds)

    def processes(self) -> int:
        return int(self.host_call("host_processes", 30.0)["extra"])

    def close(self) -> None:
        for closeable in (self.reader, self.sock):
            try:
                closeable.close()
            except OSError:
                pass
