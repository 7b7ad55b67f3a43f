"""The engine's wire protocol: JSON lines between the trusted controller and one worker.

Transport: a local stream socket, TCP on 127.0.0.1 or a unix socket. The worker prints its address
as the first line of its stdout (`tcp://127.0.0.1:PORT` or `unix:///path/to.sock`) and then serves
one connection at a time. Every message is one JSON object on one line (UTF-8, `\\n`-terminated).

Request:   {"id": <int>, "op": <op>, ...op fields}
Response:  {"id": <same int>, "ok": true,  "result": {...}, "worker_s": <seconds the op took inside>}
       or  {"id": <same int>, "ok": false, "error": {"kind": <kind>, "message": <text>}}

Arrays (token ids in, logits out) travel as {"__ndarray__": <base64 of the C-ordered bytes>,
"dtype": <numpy dtype str, or the ml_dtypes name: "bfloat16", "float8_e4m3fn">, "shape": [...]};
`encode`/`decode` convert them both ways.

Ops (fields after the op name; every field not marked required has a default):
  load      model (required: a model name, config.json or checkpoint directory), backend ("cpu"),
            target (the backend's first chip), batch, ctx, traffic (a traffic TOML; not with
            batch/ctx), dtype, block_size.
            Loads weights, allocates the KV cache once and builds every stock kernel.
            -> {model, backend, target, graph_hash, dtype, block_size, bucket: {batch, ctx}, bindings,
                profile, groups: [{id, pattern, kernel, nodes, inputs, outputs}], load_s}
  swap      group (required), path (required: a kernel file), config (the file's first config).
            `path: null` puts the stock kernel back. Loads the file as a fresh module, builds it for
            the group's spec and swaps the launch in; weights and KV cache stay as they are.
            -> {group, sha256, build_s, swap_s}
  verify    steps (required: [{"seqs": [...], "tokens": int32 [len(seqs), S]}]), batch, max_ctx,
            group (informational: the group under test, or null for all), fresh (true),
            stock_groups ([]: these groups run their stock kernel for these steps, and get the
            candidate they held back afterwards, as built: the stock plan's run of a scenario).
            Runs the steps teacher-forced by the caller with outputs poisoned (NaN before every
            kernel); returns the logits of each step. fresh: on a zeroed cache with new sequences;
            false: on the cache and sequences the previous verify left (across a swap: blocks
            written by one kernel, decoded by the next; an error after load, measure or reset).
            The worker never sees the expected logits: the controller compares.
            -> {logits: [array per step], guard_nonzero: elements of the caches' guard regions
               (the guard block 0, blocks no sequence owns, slots past each sequence's last token)
               that are not zero after the steps}; a step that raises ends the list, with
               {failed_step, cause} added.
  run_group group (required), inputs (required: one array per group input, in the group's input
            order; null for a weight: the engine's own weight tensor is used), bindings (required: {symbol: int} for the output shapes), fill ("nan" or a
            number: what the fresh output buffers hold before the launch), stock (false: run the
            stock kernel instead of the one swapped in), settle_s (0: wait this long after the
            launch returned and report which outputs changed meanwhile).
            Runs that one group's launch alone (cpu so far). A group output that is a cache
            written in place is the input cache tensor itself, not a fresh buffer.
            -> {outputs: [array per group output, copied the moment the launch returned],
                checksums_before, checksums_after: [hex digest per input, around the launch],
                in_place: [input indices written in place by design], late: [bool per output]}
  measure   tier ("fast" | "slow"), trials (20), group (fast tier: the group to time; null: all).
            slow: whole decode steps at the loaded bucket (batch, ctx), fresh tokens for every call,
            the cache restored afterwards. fast: each group's launch alone on one step's inputs
            (rotated with copies whose float activations are scaled a little: no two timed calls in
            a row see the same content), in
            the fast tier's engine (the model's first FAST_LAYERS layers on the same weights, loaded
            beside the full one when the model has more; swaps reach both) where it has the group,
            else in the full engine; `engine` says which. On a GPU: graph replay, device events.
            Times with the backend's timer (cpu: the host's perf_counter_ns; `timer` says
            "(replaced by a candidate)" when a candidate swapped in since the last swap replaced it:
            every swap puts the host's clock back before it builds).
            -> {tier, timer, median_s, spread_s (max - min), total_s (sum of trials), trials} (slow)
               {tier, timer, engine, groups: {id: {median_s, spread_s, total_s}}, bindings, trials}
               (fast)
  status    -> {pid, loaded, model, backend, target, graph_hash, weight_loads, cache_allocations,
                swaps, groups: {id: {kernel, sha256, candidate, config}}, plan: [as `load`'s groups]}
  canary    a small fixed computation on the engine's device (a matmul and a reduction of known
            values, and a read of the first weight's fingerprint): proves the device context still
            computes right after a candidate raised, not just that the process answers.
            -> {value: float, weight: fingerprint of the engine's first weight}
  reset     stock kernel back in every group, cache zeroed. -> {restored: [group ids]}
  shutdown  answers {} and the worker exits.

Error kinds: `bad_request` (malformed or unknown op), `not_loaded`, `user` (a UserError: bad model,
unknown group...), `candidate_build` (the candidate failed to import, does not support the group, or
raised in build), `candidate_run` (raised while running steps or `run_group`), `internal` (a worker
bug).
"""

from __future__ import annotations

import base64
import json
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


def parse_address(address: str) -> tuple[str, Any]:
    """("tcp", (host, port)) or ("unix", path); ValueError naming the accepted forms."""
    if address.startswith("unix://"):
        return "unix", address[len("unix://") :]
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        if host and port.isdigit():
            return "tcp", (host, int(port))
    raise ValueError(f"engine address {address!r}: expected tcp://HOST:PORT or unix:///PATH")
