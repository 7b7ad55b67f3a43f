"""One engine worker's process and wire, as the trusted side sees them.

`start_worker` starts `python -m polymorph.engine.worker --fd N` inside the sandbox
(`polymorph.engine.sandbox`) with one end of a socketpair as its only channel, in a scratch folder of
its own; `WorkerProcess` sends requests and reads answers with a deadline, freezes and thaws the
worker's whole process tree, and kills it. Anything that comes back on the wire is only what the
worker says: a protocol violation (a forged or out-of-order answer) is the candidate's fault.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polymorph.engine import protocol
from polymorph.errors import UserError

READY_S = 120.0  # the most a worker may take to import its backend and say it is ready
WORKER_MEMORY_SHARE = 0.8  # of the memory available at start: the sandbox's cgroup limit, where one is had


class EngineError(UserError):
    """The engine itself (not a candidate) failed: the worker would not start, or answered nonsense."""


class CandidateRaised(Exception):
    """The candidate raised inside the worker (a `candidate_run` or `candidate_build` error)."""


class WorkerLost(Exception):
    """The worker died, did not answer in time, or broke the protocol; `how` is "hang", "crash" or
    "sandbox" (it made a system call the sandbox kills for, or answered out of turn)."""

    def __init__(self, how: str, detail: str) -> None:
        super().__init__(detail)
        self.how = how


# The environment a worker sees: what the interpreter, torch, Triton and the device runtimes read, and
# the knobs that change what a model computes; never the board's, registry's or an agent's key.
_ENV_PREFIXES = ("LC_", "TRITON_", "CUDA_", "HIP_", "ROCM_", "HSA_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_")
_ENV_NAMES = ("PATH", "LANG", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED", "TRITON_INTERPRET")
_ENV_KNOBS = (
    "POLYMORPH_SEED",
    "POLYMORPH_KV_BLOCK_SIZE",
    "POLYMORPH_CPU_THREADS",
    "POLYMORPH_MEMORY_LIMIT_GB",
)


# An output prefill of different numbers throughout, drawn anew by the controller each time
# (engine/link.py's _prefill), beside the NaN poison and single values.
VARIED = "varied"


def worker_environ(scratch: Path) -> dict[str, str]:
    from polymorph.knobs import knobs

    base = knobs.child_environ()
    env = {k: v for k, v in base.items() if k in _ENV_NAMES or k in _ENV_KNOBS or k.startswith(_ENV_PREFIXES)}
    env.update(
        HOME=str(scratch),
        TMPDIR=str(scratch),
        POLYMORPH_CACHE_DIR=str(scratch / "cache"),  # a compile cache of its own: no other worker reads it
        TRITON_CACHE_DIR=str(scratch / "triton"),
        # Inductor's (torch.compile's) on-disk caches too: a candidate that compiles must not plant a
        # cached kernel that a later worker's stock kernel would load
        TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
    )
    return env


@dataclass
class WorkerProcess:
    """A started worker: its process handle (sandboxed or plain), its end of the socketpair, the
    scratch folder it may write, and what the controller knows it holds."""

    proc: Any  # polymorph.engine.sandbox.Sandboxed, or subprocess.Popen where the sandbox is off
    sock: socket.socket
    reader: Any
    scratch: Path
    stderr_path: Path
    layers: dict[str, str]
    ready: bool = False
    candidates: dict[str, tuple[str, dict[str, Any] | None]] = field(default_factory=dict)
    watched: str | None = None  # the watched-functions digest at load, before any candidate
    loaded: dict[str, Any] | None = None
    touched: bool = False  # candidate code was imported here: retire before the next verdict
    mapped: set[str] = field(default_factory=set)  # io arenas handed over (`map`)
    next_id: int = 0
    frozen: bool = False

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def await_ready(self, timeout: float = READY_S) -> None:
        if self.ready:
            return
        self.sock.settimeout(timeout)
        try:
            line = self.reader.readline()
        except (TimeoutError, OSError):
            line = b""
        if not line:
            self.kill()
            raise EngineError(f"the engine worker did not start: {self.stderr_tail(1000) or 'no answer'}")
        self.ready = True

    def send(self, op: str, **fields: Any) -> int:
        self.next_id += 1
        try:
            self.sock.sendall(protocol.encode(protocol.request(self.next_id, op, **fields)))
        except OSError as e:
            raise WorkerLost("crash", f"the worker died before `{op}` (connection lost: {e})") from None
        return self.next_id

    def receive(self, rid: int, op: str, timeout: float) -> tuple[dict[str, Any], int]:
        """The answer to request `rid` and its size; WorkerLost when none comes in time, the worker
        died, or what came is not that answer."""
        try:
            self.sock.settimeout(timeout)
            line = self.reader.readline()
        except TimeoutError:
            raise WorkerLost("hang", f"no answer to `{op}` within {timeout:g} s") from None
        except OSError as e:
            raise WorkerLost("crash", f"the worker died during `{op}` (connection lost: {e})") from None
        if not line:
            raise self.death(op)
        try:
            response = protocol.decode(line)
        except protocol.ProtocolError as e:
            raise WorkerLost("sandbox", f"the worker broke the protocol during `{op}`: {e}") from None
        if response.get("id") != rid:
            raise WorkerLost(
                "sandbox", f"the worker answered request {response.get('id')!r} to request {rid} (`{op}`)"
            )
        return response, len(line)

    def death(self, op: str) -> WorkerLost:
        code = None
        try:
            code = self.proc.wait(timeout=2.0)  # the socket closes a moment before the exit code
        except subprocess.TimeoutExpired:
            pass
        if code is not None and code in (-signal.SIGSYS, 128 + signal.SIGSYS):
            return WorkerLost(
                "sandbox", f"the worker was killed for a system call the sandbox forbids during `{op}`"
            )
        how = "" if isinstance(self.proc, ForkedProc) else f" (exit code {code})"
        return WorkerLost("crash", f"the worker died during `{op}`{how} {self.stderr_tail(500)}".rstrip())

    def freeze(self) -> None:
        """Stop every process and thread of the worker's tree (at clock stop, before outputs are read)."""
        if self.frozen or not self.alive():
            return
        if hasattr(self.proc, "freeze"):
            self.proc.freeze()
        else:
            os.kill(self.proc.pid, signal.SIGSTOP)
            _wait_stopped(self.proc.pid)
        self.frozen = True

    def thaw(self) -> None:
        if not self.frozen:
            return
        self.frozen = False
        if not self.alive():
            return
        if hasattr(self.proc, "thaw"):
            self.proc.thaw()
        else:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """Kill the worker's whole tree and reap it; close the wire."""
        for closeable in (self.reader, self.sock):
            try:
                closeable.close()
            except OSError:
                pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (getattr(self.proc, "stdin", None), getattr(self.proc, "stdout", None)):
            if pipe is not None:
                pipe.close()

    def stderr_tail(self, chars: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def descendants(pid: int) -> list[int]:
    """Processes below `pid` (children, theirs...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def host_pid_of(ns_pid: int, among: list[int]) -> int | None:
    """The host pid of the process that is `ns_pid` in its own pid namespace (the last NSpid field),
    among `among`; a process in no namespace of its own is its host pid."""
    for pid in among:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return pid
        except (OSError, ValueError):
            continue
    return None


class Freezer:
    """A cgroup-v1 freezer group of one worker (root, where /sys/fs/cgroup/freezer is writable): every
    process the worker starts is in it too, even one reparented away from it, so listing its whole
    tree is a file read, not a scan of /proc. (Its own freezing is not used for the worker: see
    ForkedProc.freeze.)"""

    ROOT = Path("/sys/fs/cgroup/freezer")

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, pid: int) -> Freezer | None:
        try:
            path = cls.ROOT / f"polymorph-worker-{uuid.uuid4().hex[:12]}"
            path.mkdir()
        except OSError:
            return None
        try:
            (path / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            path.rmdir()
            return None
        return cls(path)

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def freeze(self, budget_s: float = 5.0) -> None:
        if not self.path.exists():
            return  # removed with the worker's last process
        (self.path / "freezer.state").write_text("FROZEN\n")
        deadline = time.monotonic() + budget_s
        while (self.path / "freezer.state").read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                raise EngineError(f"the worker's freezer group {self.path} did not freeze")
            time.sleep(0.0002)

    def thaw(self) -> None:
        try:
            (self.path / "freezer.state").write_text("THAWED\n")
        except FileNotFoundError:
            pass  # removed with the worker's last process

    def remove(self) -> None:
        for _ in range(500):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # busy for a moment after its last task exits
                time.sleep(0.002)


class ForkedProc:
    """A worker the zygote forked: Popen-like on its host pid (not this process's child: the zygote
    reaps it, so no exit code is known here beyond "gone"). Its tree is its freezer group where one
    could be made, else found by scanning /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.freezer = Freezer.create(pid)

    def _gone(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("Z", "X")

    def poll(self) -> int | None:
        if self.returncode is None and self._gone():
            self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.002)
        if self.freezer is not None:
            while self.freezer.pids():  # what it started dies with it (kill() killed them all)
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
                time.sleep(0.002)
            self.freezer.remove()
        return int(self.returncode or 0)

    def tree(self) -> list[int]:
        """The worker and every process it started (reparented ones too, where a freezer group holds them)."""
        if self.freezer is not None:
            return self.freezer.pids()
        return [self.pid, *descendants(self.pid)]

    def _signal_all(self, sig: int) -> list[int]:
        """`sig` to every process of the tree, again until no new one shows (one that forked while
        being stopped or killed); the processes signalled."""
        done: set[int] = set()
        for _ in range(100):
            fresh = [p for p in self.tree() if p not in done]
            if not fresh:
                break
            for pid in fresh:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            done.update(fresh)
        return sorted(done)

    def kill(self) -> None:
        """SIGKILL every process of the tree, including those it starts while being killed (a stopped
        process dies of SIGKILL too), until the tree is empty."""
        for _ in range(100):
            if not self._signal_all(signal.SIGKILL) or self.freezer is None:
                return
            time.sleep(0.001)

    def freeze(self) -> None:
        """SIGSTOP the whole tree and wait until every process of it is stopped. Not the cgroup
        freezer: a task frozen there cannot die until thawed, so a controller killed while its worker
        was frozen would leave the worker behind; a stopped one dies with its namespace."""
        for pid in self._signal_all(signal.SIGSTOP):
            _wait_stopped(pid)

    def thaw(self) -> None:
        self._signal_all(signal.SIGCONT)


def _wait_stopped(pid: int, budget_s: float = 2.0) -> None:
    """Until /proc says `pid` is stopped (SIGSTOP is asynchronous)."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.0005)


def start_worker(
    backend: str,
    scratch: Path,
    readable: tuple[str, ...],
    writable: tuple[str, ...] = (),
    *,
    zygote: bool = False,
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    """Start a worker (its imports begin at once; `await_ready` waits for them) in the sandbox, or as a
    plain child where POLYMORPH_SANDBOX is off: it may read `readable` besides the interpreter and
    polymorph, and write only `scratch` and `writable`."""
    from polymorph.knobs import knobs

    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "cache").mkdir(exist_ok=True)
    (scratch / "triton").mkdir(exist_ok=True)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    argv = [
        sys.executable,
        "-m",
        "polymorph.engine.worker",
        "--fd",
        str(theirs.fileno()),
        "--preload",
        backend,
    ]
    if zygote:
        argv.append("--zygote")
    stderr_path = scratch.parent / f"{scratch.name}.stderr"
    env = {**worker_environ(scratch), **(env or {})}
    try:
        with open(stderr_path, "wb") as err:
            if knobs.sandbox:
                from polymorph.engine import sandbox
                from polymorph.models.zoo import available_memory_bytes

                policy = sandbox.default_policy(scratch, extra_read=readable, extra_write=writable)
                # A worker that takes the machine's memory is killed in its own cgroup, not the
                # controller by the kernel's OOM killer.
                memory = int(available_memory_bytes() * WORKER_MEMORY_SHARE)
                proc = sandbox.launch(argv, policy, pass_fds=(theirs.fileno(),), env=env, stderr=err,
                                      memory_bytes=memory)  # fmt: skip
                layers = dict(proc.layers)
            else:
                proc = subprocess.Popen(
                    argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err, env=env, start_new_session=True,
                )  # fmt: skip
                layers = {"sandbox": "off: POLYMORPH_SANDBOX=0"}
    finally:
        theirs.close()
    return WorkerProcess(proc, ours, ours.makefile("rb"), scratch, stderr_path, layers)
