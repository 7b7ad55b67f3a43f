"""A detached engine: the trusted host of one engine's workers, at an address of its own.

    python -m polymorph.engine.host (--port N | --unix PATH) --load JSON

`polymorph engine start` runs it (`start_detached`). It loads the model, starts the zygote in the
sandbox and the first worker (`polymorph.engine.pool`), prints its address, and serves one
connection at a time: requests of the worker protocol are relayed to the current worker (frozen after
every `run_group` and `measure` answer, thawed at the next request, as the in-process controller
does), and `host_*` requests are its own. The host owns the address: the sandboxed workers have no
network, and a worker lost to a candidate is replaced by the host, at the same address. Controllers
attach to it (`Controller.attach`); the judging stays theirs.

Host requests (the calls on shared memory are made by the host, as `LocalLink` makes them, so the
clock, the freezing and the copies of what came out stay on a trusted side): host_status -> {pid,
layers}; host_stage {path} -> {path}; host_retire {candidates} -> the fresh worker's load answer;
host_run_calls {layout, calls, fields, fill, budget, accepted} -> {response, wall_s, outputs,
inputs_after}; host_clean_call {of, candidates, fields, budget} -> {response}; host_run_steps {tokens,
vocab, budget} -> {response, wall_s, logits}; host_harness {layout, calls, fields, budget, accepted} ->
{wall_s}; host_settle {seconds} -> {outputs}; host_quiet; host_processes -> {extra}; host_shutdown.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polymorph.engine import protocol
from polymorph.engine.link import Layout, LocalLink
from polymorph.engine.wire import EngineError, WorkerLost
from polymorph.errors import UserError

LOAD_BUDGET_S = 600.0


class Host:
    def __init__(self, tmp: Path) -> None:
        self.link = LocalLink(tmp, load_budget_s=LOAD_BUDGET_S)
        self.stop = False

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        rid = message.get("id")
        op = str(message.get("op"))
        fields = {k: v for k, v in message.items() if k not in ("id", "op", "_budget_s")}
        budget = float(message.get("_budget_s") or 30.0)
        try:
            if op.startswith("host_"):
                return protocol.ok(rid, self.host_op(op, fields, budget))
            if self.link.pool.current is None or not self.link.worker.alive():
                raise WorkerLost("crash", "the worker is gone; the controller replaces it (host_retire)")
            response, _ = self.link.call(op, budget, **fields)
            return {**response, "id": rid}
        except WorkerLost as lost:
            if self.link.pool.current is not None:
                self.link.pool.current.kill()
            return {
                "id": rid,
                "ok": False,
                "error": {"kind": "worker_lost", "how": lost.how, "message": str(lost)},
            }
        except (UserError, OSError, KeyError, TypeError, ValueError) as e:
            return protocol.error(rid, "user", f"{type(e).__name__}: {e}")

    def host_op(self, op: str, fields: dict[str, Any], budget: float) -> dict[str, Any]:
        link = self.link
        if op == "host_status":
            return {"pid": os.getpid(), "layers": link.layers}
        if op == "host_stage":
            return {"path": link.stage(fields["path"])}
        if op == "host_retire":
            return link.retire(_candidates(fields.get("candidates")) or {})
        if op == "host_quiet":
            link.quiet()
            return {}
        if op == "host_run_calls":
            response, done = link.run_calls(
                Layout.from_json(fields["layout"]), fields["calls"], dict(fields["fields"]), fill=fields["fill"],
                timeout=float(fields["budget"]), clean=_candidates(fields.get("accepted")),
            )  # fmt: skip
            if done is None:
                return {"response": response, "outputs": None}
            return {"response": response, "wall_s": done.wall_s, "outputs": done.outputs,
                    "inputs_after": done.inputs_after}  # fmt: skip
        if op == "host_clean_call":
            response, _ = link.call(fields["of"], float(fields["budget"]), clean=_candidates(fields["candidates"]),
                                    **dict(fields["fields"]))  # fmt: skip
            return {"response": response}
        if op == "host_run_steps":
            response, wall, logits = link.run_steps(
                fields["tokens"], int(fields["vocab"]), float(fields["budget"])
            )
            return {"response": response, "wall_s": wall, "logits": logits}
        if op == "host_harness":
            wall = link.harness(Layout.from_json(fields["layout"]), fields["calls"], dict(fields["fields"]),
                                float(fields["budget"]), _candidates(fields["accepted"]) or {})  # fmt: skip
            return {"wall_s": wall}
        if op == "host_settle":
            return {"outputs": link.settle(float(fields["seconds"]))}
        if op == "host_processes":
            return {"extra": link.processes()}
        if op == "host_shutdown":
            self.stop = True
            return {}
        raise UserError(f"unknown host request {op!r}")

    def serve(self, listener: socket.socket) -> None:
        """One connection at a time; a client that went away (it timed out) costs its connection only."""
        while not self.stop:
            conn, _ = listener.accept()
            try:
                self._serve(conn)
            except OSError:
                pass
            finally:
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        with conn.makefile("rb") as reader:
            for line in reader:
                if not line.strip():
                    continue
                try:
                    message = protocol.decode(line)
                except protocol.ProtocolError as e:
                    response = protocol.error(None, "bad_request", str(e))
                else:
                    response = self.handle(message)
                conn.sendall(protocol.encode(response))
                if self.stop:
                    return


def _candidates(value: Any) -> dict[str, tuple[str, Any]] | None:
    """Candidates as JSON carried them (lists for tuples), or None."""
    if value is None:
        return None
    return {str(g): (str(p), c) for g, (p, c) in dict(value).items()}


def main(argv: list[str] | None = None) -> int:
    from polymorph.engine.sandbox import harden_self
    from polymorph.models import load_model

    p = argparse.ArgumentParser(prog="python -m polymorph.engine.host", description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    where.add_argument("--unix", type=Path, help="a unix socket path instead of TCP")
    p.add_argument("--load", required=True, help="the load arguments, as JSON")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port}: expected 0-65535")
    harden_self()
    load_args = json.loads(args.load)
    options = {k: load_args[k] for k in ("dtype", "block_size") if load_args.get(k) is not None}
    with tempfile.TemporaryDirectory(prefix="polymorph-host-") as tmp:
        host = Host(Path(tmp))
        try:
            try:
                if load_args.get("traffic"):
                    from polymorph.api import pick_bucket

                    bucket = pick_bucket(load_args.get("batch"), load_args.get("ctx"), load_args["traffic"])
                    load_args.update(batch=bucket.batch, ctx=bucket.ctx, traffic=None)
                host.link.start(load_model(load_args["model"], **options), load_args, {})
            except (UserError, EngineError) as e:
                print(f"error: {e}", flush=True)
                return 2
            if args.unix is not None:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                if args.unix.is_socket():  # a stale one (start_detached checked none listens); never a file
                    args.unix.unlink()
                listener.bind(str(args.unix))
                address = protocol.format_address("unix", str(args.unix))
            else:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                # A replacement host binds its lost predecessor's port, still in TIME_WAIT.
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", args.port))
                address = protocol.format_address("tcp", f"127.0.0.1:{listener.getsockname()[1]}")
            listener.listen(1)
            print(address, flush=True)
            os.dup2(2, 1)
            try:
                host.serve(listener)
            finally:
                listener.close()
                if args.unix is not None:
                    args.unix.unlink(missing_ok=True)
        finally:
            host.link.close()
    return 0


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
    load_budget_s: float = LOAD_BUDGET_S,
) -> tuple[str, int]:
    """Start an engine host that outlives this process (`polymorph engine start`), with `model`
    loaded, and return (address, pid). Drive it with `Controller.attach(address)`; stop it with
    `Controller.shutdown`. It listens on `unix`, else on TCP `port` of 127.0.0.1 (0: any free one).
    Its stderr goes to `log` (default: <cache dir>/engine/host-<time>.log)."""
    from polymorph.knobs import knobs

    if unix is not None:
        unix = _unix_path(unix)
    elif isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise UserError(f"engine port {port!r}: expected an integer 0-65535 (0: any free port)")
    if log is None:
        log = Path(knobs.cache_dir) / "engine" / f"host-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    load = {"model": str(Path(model).resolve()) if Path(str(model)).exists() else str(model), "backend": backend,
            "target": target, "batch": batch, "ctx": ctx,
            "traffic": None if traffic is None else str(Path(traffic).resolve()),
            "dtype": dtype, "block_size": block_size}  # fmt: skip
    cmd = [sys.executable, "-m", "polymorph.engine.host", "--load", json.dumps(load)]
    cmd += ["--unix", str(unix)] if unix is not None else ["--port", str(port)]
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=knobs.child_environ(),
            start_new_session=True,  # a Ctrl-C in the starting shell does not reach the engine
        )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], load_budget_s)
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if not line or line.startswith("error: "):
        proc.kill()
        proc.wait()
        if line.startswith("error: "):
            raise UserError(f"the engine could not load {model}: {line[len('error: ') :]}")
        raise EngineError(f"the engine host did not start; see {log}")
    return line, proc.pid


def _unix_path(unix: str | Path) -> Path:
    """The absolute socket path an engine may listen on (its address then works from any directory);
    UserError, one line, for a path that cannot be one or where something already listens."""
    text = str(unix)
    if not text.strip() or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise UserError(
            f"--unix {text!r}: not a usable socket path; give a file path such as /tmp/engine.sock"
        )
    path = Path(text).expanduser().absolute()
    if not path.parent.is_dir():
        raise UserError(
            f"--unix {path}: directory {path.parent} does not exist; create it or pick another path"
        )
    if len(os.fsencode(path)) > 107:  # sun_path holds 108 bytes with its NUL
        raise UserError(f"--unix {path}: a unix socket path is at most 107 bytes, this one is "
                        f"{len(os.fsencode(path))}; pick a shorter path")  # fmt: skip
    if path.is_socket():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(5.0)  # a busy listener (its backlog full) counts as one that listens
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # stale: nothing listens, the host replaces it
        except OSError:
            raise UserError(f"--unix {path}: a socket there does not take connections but may be in use; "
                            "remove it if it is stale, or pick another path") from None  # fmt: skip
        else:
            raise UserError(f"--unix {path}: something already listens there (an engine? `polymorph engine "
                            f"stop --engine {path}`); stop it or pick another path")  # fmt: skip
        finally:
            probe.close()
    elif path.exists() or path.is_symlink():
        raise UserError(f"--unix {path}: a file that is not a socket is there; pick another path")
    return path


if __name__ == "__main__":
    sys.exit(main())
