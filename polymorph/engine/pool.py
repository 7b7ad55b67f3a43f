"""The trusted side's workers for one loaded model: a zygote, and the copies of it that run candidates.

The pool writes what every worker loads once, where a sandboxed worker can read it and nothing else
of the user's: the model's graph as IR JSON and its weights in a shared-memory arena (mapped read-only
by the workers). It starts one zygote in the sandbox, which loads the model (on cpu: weights mapped,
plan lowered, stock kernels built, cache allocated) and never runs candidate code; every worker is a
fork of it, made in milliseconds, serving a socketpair of its own. A worker that imported candidate
code is retired: killed with its whole tree, and with it every process a candidate left in the
sandbox, before the next fork. So the replacement of a worker never overlaps a timed window and
costs a fork and the accepted candidates' swaps, not a start-up and a load.

On GPU backends the device context cannot cross a fork: the zygote holds only the imports, and each
fork loads the model itself (its weights from the arena; unmeasured here, no GPU).

The pool is used by the in-process `Controller` (`LocalLink`) and by the detached engine host.
"""

from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

from polymorph.engine.arena import Arena
from polymorph.engine.wire import (
    EngineError,
    ForkedProc,
    WorkerLost,
    WorkerProcess,
    descendants,
    host_pid_of,
    start_worker,
)

Candidates = dict[str, tuple[str, dict[str, Any] | None]]


class WorkerPool:
    """The zygote and the current worker. `load_args` as `Controller.load` takes them."""

    def __init__(self, tmp: Path, *, load_budget_s: float = 600.0) -> None:
        self.tmp = Path(tmp)
        self.load_budget_s = load_budget_s
        self.zygote: WorkerProcess | None = None
        self.current: WorkerProcess | None = None
        self.clean: WorkerProcess | None = None  # a fork no candidate touched, for the stock's runs
        self.model_dir = self.tmp / "model"  # graph and staged candidates: every worker reads them
        self.shm_dir: Path | None = None
        self.weights: Arena | None = None
        self.load_fields: dict[str, Any] = {}
        self.backend = "cpu"
        self.threads = 1
        self.fork_loaded = False
        self.layers: dict[str, str] = {}
        self._forks = 0
        self._scratch_base: set[str] = set()

    # --- what every worker loads -------------------------------------------------------------------

    def publish(self, model: Any, load_args: dict[str, Any]) -> None:
        """Write `model`'s graph and weights where the workers read them; start and load the zygote."""
        from polymorph.engine.worker import require_engine
        from polymorph.ir import serialize
        from polymorph.pipeline.backend import Feature, registry

        backend = load_args.get("backend") or "cpu"
        require_engine(backend)
        self.fork_loaded = Feature.FORK_LOADED in registry.get(backend).features
        self.close()
        self.model_dir.mkdir(parents=True, exist_ok=True)
        graph_path = self.model_dir / f"graph-{uuid.uuid4().hex[:8]}.json"
        serialize.save(model.graph, graph_path)
        # Beside the rest, not in /dev/shm: the sandbox gives each worker a private /dev/shm.
        self.shm_dir = self.tmp / f"weights-{uuid.uuid4().hex[:8]}"
        self.shm_dir.mkdir(mode=0o700)
        self.weights = Arena.of(self.shm_dir, "weights", model.weights())
        self.backend = load_args.get("backend") or "cpu"
        self.load_fields = {
            "graph": str(graph_path),
            "source": model.source,
            "weights": self.weights.manifest(),
            **{k: load_args.get(k) for k in ("backend", "target", "batch", "ctx", "traffic")},
        }
        self.threads = _threads(model)
        readable = (str(self.model_dir), str(self.shm_dir))
        z = start_worker(self.backend, self.tmp / "zygote", readable, zygote=True,
                         env={"POLYMORPH_CPU_THREADS": "1"})  # fmt: skip
        self.zygote = z
        self.layers = dict(z.layers)
        z.await_ready()
        if self._zygote_loads:
            rid = z.send("load", **self.load_fields)
            response, _ = z.receive(rid, "load", self.load_budget_s)
            if not response.get("ok"):
                raise EngineError(f"the engine could not load the model: {response['error']['message']}")
            z.loaded = response["result"]
        self._scratch_base = {p.name for p in z.scratch.iterdir()}

    @property
    def _zygote_loads(self) -> bool:
        return self.fork_loaded  # a device context (a GPU's) cannot cross a fork: each fork loads

    def unpublish(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None
        if self.shm_dir is not None:
            for p in self.shm_dir.glob("*"):
                p.unlink(missing_ok=True)
            self.shm_dir.rmdir()
            self.shm_dir = None

    # --- workers -----------------------------------------------------------------------------------

    def fork(self) -> WorkerProcess:
        """A fresh worker: a copy of the zygote, loaded, serving a socketpair of its own."""
        z = self.zygote
        if z is None or not z.alive():
            raise EngineError("the engine's zygote is gone; restart the engine")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # a /dev/shm private to the zygote's sandbox is emptied by each copy before it serves
            private_shm = self.layers.get("private_shm") == "on"
            fields: dict[str, Any] = {"threads": self.threads, "private_shm": private_shm}
            if not self._zygote_loads:
                fields["load"] = self.load_fields
            rid = z.send("fork", **fields)
            answer, _ = z.receive(rid, "fork", 30.0)
            if not answer.get("ok") or not answer["result"].get("await_fd"):
                raise EngineError(f"the zygote refused to fork: {answer}")
            socket.send_fds(z.sock, [b"s"], [theirs.fileno()])
            done, _ = z.receive(rid, "fork", 30.0)
        finally:
            theirs.close()
        if not done.get("ok"):
            ours.close()
            raise EngineError(f"the zygote could not fork: {done['error']['message']}")
        ns_pid = int(done["result"]["pid"])
        host = host_pid_of(ns_pid, descendants(self._zygote_pid()))
        if host is None:
            ours.close()
            raise EngineError(f"the zygote's fork (pid {ns_pid} inside) is not to be found")
        self._forks += 1
        w = WorkerProcess(ForkedProc(host), ours, ours.makefile("rb"), self.tmp / "zygote",
                          z.stderr_path, self.layers, ready=True)  # fmt: skip
        if self._zygote_loads:
            assert z.loaded is not None
            w.loaded = dict(z.loaded)
        else:
            rid = w.send("status")
            status, _ = w.receive(rid, "status", self.load_budget_s)
            if not status.get("ok") or not status["result"].get("loaded"):
                w.kill()
                raise EngineError(f"a fresh worker could not load the model: {w.stderr_tail(500)}")
            w.loaded = {**status["result"], "groups": status["result"]["plan"]}
        return w

    def _zygote_pid(self) -> int:
        """The zygote's own host pid (the sandbox's pid 1, below its bootstrap)."""
        z = self.zygote
        assert z is not None
        return int(getattr(z.proc, "child_pid", None) or z.proc.pid)

    def strays(self) -> list[int]:
        """Processes in the sandbox that are neither the zygote nor the current worker's own: what a
        candidate left running (a daemon reparented to the zygote, say)."""
        if self.zygote is None:
            return []
        keep = {self._zygote_pid()}
        for w in (self.current, self.clean):
            if w is not None and w.alive():
                keep.update(w.proc.tree())
        return [p for p in descendants(self._zygote_pid()) if p not in keep]

    def sweep(self) -> None:
        """Kill every process in the sandbox but the zygote and the current worker."""
        import os
        import signal

        for pid in self.strays():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def promote(self, candidates: Candidates) -> WorkerProcess:
        """Retire the current worker (its whole tree, and every stray in the sandbox, killed) and put a
        fresh fork in its place, with exactly `candidates` swapped in."""
        old, self.current = self.current, None
        for w in (old, self.clean):
            if w is not None:
                w.kill()
                try:
                    w.proc.wait(timeout=10.0)
                except subprocess.TimeoutExpired:
                    raise EngineError("a retired worker's processes would not die") from None
        self.clean = None
        self.sweep()
        self._wipe_scratch()
        w = self.fork()
        try:
            self.sync(w, candidates)
        except (EngineError, WorkerLost):
            w.kill()
            raise
        self.current = w
        return w

    def _wipe_scratch(self) -> None:
        """Everything the retired workers left in the zygote's scratch folder (each fork works in a
        folder of its own there): nothing one candidate wrote is there for the next to read."""
        import shutil

        z = self.zygote
        if z is None:
            return
        for p in z.scratch.iterdir():
            if p.name not in self._scratch_base:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def clean_worker(self, candidates: Candidates) -> WorkerProcess:
        """A fork no candidate under test touched, with `candidates` (those accepted) swapped in:
        what the stock kernel's runs and the stock plan's logits come from, never the worker a
        candidate runs in (which could make the stock look as wrong as itself)."""
        w = self.clean
        if w is None or not w.alive():
            w = self.clean = self.fork()
        self.sync(w, candidates)
        return w

    def sync(self, w: WorkerProcess, candidates: Candidates) -> None:
        """Swap into `w` what `candidates` holds and it lacks; put the stock kernel back elsewhere."""
        for group in [g for g in w.candidates if g not in candidates]:
            rid = w.send("swap", group=group, path=None)
            w.receive(rid, "swap", self.load_budget_s)
            w.candidates.pop(group)
        for group, (path, config) in candidates.items():
            if w.candidates.get(group) == (path, config):
                continue
            rid = w.send("swap", group=group, path=path, config=config)
            r, _ = w.receive(rid, "swap", self.load_budget_s)
            if not r.get("ok"):
                raise EngineError(f"a fresh worker could not take the accepted candidate of `{group}`: "
                                  f"{r['error']['message']}")  # fmt: skip
            w.candidates[group] = (path, config)

    def stage(self, path: str | Path) -> str:
        """A copy of candidate `path` (and the pinned shared modules found beside it) where the
        workers can read it: `model/candidates/<sha256>.py`. The worker loads the copy, never the
        user's file."""
        from polymorph.errors import UserError
        from polymorph.pipeline.kernel_files import pinned_sources, source_hash

        src = Path(path)
        try:
            raw = src.read_bytes()
        except OSError as e:
            raise UserError(f"{src}: cannot read the kernel file ({e.strerror})") from None
        folder = self.model_dir / "candidates"
        folder.mkdir(parents=True, exist_ok=True)
        dest = folder / f"{source_hash(raw)}.py"
        if not dest.exists():
            dest.write_bytes(raw)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return str(dest)  # the worker's load reports it
        for _name, sha, module in pinned_sources(text, beside=src.parent):
            beside = folder / f"{sha}.py"
            if not beside.exists():
                beside.write_bytes(module.encode("utf-8"))
        return str(dest)

    def close(self) -> None:
        for w in (self.current, self.clean, self.zygote):
            if w is not None:
                w.kill()
        self.current = self.clean = self.zygote = None
        self.unpublish()


def _threads(model: Any) -> int:
    """The torch threads a worker runs with: the cpu executable's own rule, applied after the fork."""
    from polymorph.backends.cpu.runtime import auto_threads

    return auto_threads(sum(int(t.size) for t in model.weights().values()))
