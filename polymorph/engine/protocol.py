"""The engine's wire protocol: JSON lines between the trusted side and one sandboxed worker.

Transport: one end of a socketpair the worker inherits (its only channel; `polymorph.engine.wire`).
Every message is one JSON object on one line (UTF-8, `\\n`-terminated). Arrays travel as
{"__ndarray__": <base64 of the C-ordered bytes>, "dtype": <numpy dtype str, or the ml_dtypes name:
"bfloat16", "float8_e4m3fn">, "shape": [...]}; `encode`/`decode` convert them both ways. Bulk inputs and
outputs do not travel on the wire: they live in io arenas (`polymorph.engine.arena`), sealed memfds the
controller hands over once per worker with `map`.

Request:   {"id": <int>, "op": <op>, ...op fields}
Response:  {"id": <same int>, "ok": true,  "result": {...}, "worker_s": <seconds the op took inside>}
       or  {"id": <same int>, "ok": false, "error": {"kind": <kind>, "message": <text>}}

Nothing in a response is a verdict or a time: the controller takes its own clock around requests,
freezes the worker's tree when an answer comes, reads the arena, and compares.

Ops:
  load      graph (an IR JSON file the controller wrote), weights (the weights arena's manifest,
            mapped read-only), backend, target, batch, ctx; or model (a name the worker loads itself,
            in-process use only). Builds every stock kernel and allocates the KV cache once.
            -> {model, backend, target, graph_hash, dtype, block_size, bucket, bindings, cache_blocks,
                profile, groups: [{id, pattern, kernel, nodes, inputs, outputs}], load_s, watched}
  swap      group, path (a staged copy of the candidate; null: the stock kernel back), config.
            -> {group, sha256, build_s, swap_s}
  verify    steps ([{"seqs", "tokens"}]), max_ctx, fresh (true), stock_groups ([]). Teacher-forced
            steps with outputs poisoned; -> {logits: [per step], guard_nonzero}; a step that raises
            ends the list with {failed_step, cause}.
  map       arena (an id), entries, size; the worker answers {"await_fd": true}, the controller sends
            the memfd (SCM_RIGHTS), the worker maps it and answers {}.
  run_group group, io ({"id": <arena>}), calls ([{"inputs": [slot or null for a weight],
            "outputs": [slot or null for a cache written in place]}]), bindings, stock, noop.
            The calls' launches back to back on the arena's slots. -> {calls, watched}
  measure   io ({"id"}: slots `tokens` [n, batch, 1] and `logits` [n, batch, vocab]). Whole decode
            steps at the loaded bucket's longest context on the controller's tokens, the cache
            restored afterwards. -> {trials, watched}
  fingerprints -> {weights: {name: fingerprint}} (evidence: where a weight lives on a device)
  status    -> {pid, loaded, model, ..., swaps, groups: {id: {kernel, sha256, candidate, config}}, plan}
  canary    -> {value, weight}: a fixed computation on the device and the first weight's fingerprint
  reset     stock kernels everywhere, cache zeroed. -> {restored}
  fork      (the zygote only) threads, load?: answers {"await_fd": true}, takes a socket (SCM_RIGHTS),
            forks a copy of itself serving it. -> {pid} (its pid in the sandbox's namespace)
  shutdown  answers {} and the worker exits.

`watched` is a digest of the functions a candidate might rebind (clocks, torch, numpy): evidence the
controller compares with the load's. Error kinds: `bad_request`, `not_loaded`, `user`,
`candidate_build`, `candidate_run`, `internal`, and `worker_lost` (an engine host's answer when the
worker it relays to died or hung).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

OPS = (
    "load",
    "swap",
    "verify",
    "run_group",
    "measure",
    "status",
    "canary",
    "fingerprints",
    "reset",
    "shutdown",
    "fork",
    "map",
)
ERROR_KINDS = (
    "bad_request",
    "not_loaded",
    "user",
    "candidate_build",
    "candidate_run",
    "internal",
    "worker_lost",
)
TIERS = ("fast", "slow")


class ProtocolError(Exception):
    """A message that is not a valid protocol line."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {
            "__ndarray__": base64.b64encode(arr.tobytes()).decode("ascii"),
            # bfloat16 and the fp8 formats (ml_dtypes) have no numpy type string of their own ("|V2"):
            # they travel by name.
            "dtype": arr.dtype.name if arr.dtype.kind == "V" else arr.dtype.str,
            "shape": list(arr.shape),
        }
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def _hook(obj: dict[str, Any]) -> Any:
    if "__ndarray__" in obj:
        raw = base64.b64decode(obj["__ndarray__"])
        return np.frombuffer(raw, dtype=_dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    return obj


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line of bytes (newline included)."""
    return (json.dumps(message, default=_default, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    """One line back into a message (arrays restored); ProtocolError when it is not an object."""
    try:
        message = json.loads(line, object_hook=_hook)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"not a JSON line: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    return message


def request(id: int, op: str, **fields: Any) -> dict[str, Any]:
    return {"id": id, "op": op, **fields}


def ok(id: Any, result: dict[str, Any], worker_s: float | None = None) -> dict[str, Any]:
    response = {"id": id, "ok": True, "result": result}
    if worker_s is not None:
        response["worker_s"] = worker_s
    return response


def error(id: Any, kind: str, message: str) -> dict[str, Any]:
    assert kind in ERROR_KINDS, kind
    return {"id": id, "ok": False, "error": {"kind": kind, "message": message}}


def format_address(kind: str, where: str) -> str:
    """`tcp://127.0.0.1:PORT` or `unix:///path`."""
    return f"{kind}://{where}"


ADDRESS_FORMS = "HOST:PORT, tcp://HOST:PORT ([::1]:PORT for IPv6), unix:///PATH or a socket PATH with a /"


def parse_address(address: str, what: str = "engine address") -> tuple[str, Any]:
    """("tcp", (host, port)) or ("unix", path) from `HOST:PORT`, `tcp://HOST:PORT`, `unix:///PATH` or a
    bare path holding a `/`. A malformed address is a UserError (one line: `what`, the address, what is
    wrong, the accepted forms); whether anything listens there is the connect's business."""
    from polymorph.errors import UserError

    def bad(why: str) -> UserError:
        return UserError(f"{what} {address!r}: {why}; expected {ADDRESS_FORMS}")

    text = address.strip()
    if not text:
        raise bad("it is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise bad("it holds a control character")
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme == "unix":
            if not rest:
                raise bad("no socket path after unix://")
            return "unix", rest
        if scheme != "tcp":
            raise bad(f"unknown scheme {scheme + '://'!r}")
        if not rest:
            raise bad("no HOST:PORT after tcp://")
    elif text.startswith(("tcp:", "unix:")):
        raise bad(f"{text.split(':', 1)[0]}: must be followed by //")
    elif "/" in text:  # a host has no slash: this is a socket path (`engine start --unix PATH`)
        return "unix", str(Path(text).expanduser())
    else:
        rest = text
    host, sep, port = rest.rpartition(":")
    if not sep:
        raise bad("no port (HOST:PORT)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise bad("no host between the brackets")
    elif ":" in host:
        raise bad("an IPv6 host goes in brackets, as in [::1]:PORT")
    if not host:
        raise bad("no host before the port")
    if any(c.isspace() or c in "[]/@" for c in host):
        raise bad(f"{host!r} is not a host name or IP address")
    if not port:
        raise bad("no port after the host")
    if not (port.isascii() and port.isdigit()):
        raise bad(f"port {port!r} is not a number")
    if not 1 <= int(port) <= 65535:
        raise bad(f"port {int(port)} is out of range (1-65535)")
    return "tcp", (host, int(port))
