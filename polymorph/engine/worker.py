"""The engine worker: one persistent process per device that runs candidate code, and so is hostile.

    python -m polymorph.engine.worker --fd N [--preload BACKEND]

The controller starts it inside the sandbox (`polymorph.engine.sandbox`: its own namespaces, Landlock,
seccomp) with one end of a socketpair as fd N, its only channel, and serves the JSON-lines protocol of
`polymorph.engine.protocol` on it until the other end closes. It holds the loaded executable (weights
mapped read-only from the controller's arena on cpu, the KV cache allocated once per `load`) and
swaps candidate kernels into it: `load_kernel` on the candidate's path (a fresh module every time) ->
`build(spec, config, target)` -> `executable.swap`.

Nothing it says is a verdict or a time. It never holds reference outputs: `verify` returns the
logits of the steps it is given, `run_group` writes one group's outputs on the controller's inputs
into the controller's arena, and `measure` runs whole steps on the controller's tokens; the
controller times each request with its own clock, freezes this process's tree when the answer comes,
and compares (`polymorph.engine.gates`). A candidate that raises is reported with its cause; a
candidate that hangs or kills the process is the controller's to handle. With --preload it does the
backend's slow imports before it answers: the controller keeps such a worker, loaded, as the standby
that replaces the one a candidate ran in.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np

from polymorph.engine import protocol
from polymorph.engine.arena import Arena, slots_digest
from polymorph.engine.windows import ReleasedBlocks, cache_windows
from polymorph.errors import UserError
from polymorph.pipeline.backend import Artifact, Executable, registry
from polymorph.pipeline.kernel_files import KernelSpec, Launch, load_choice, load_kernel
from polymorph.pipeline.lowering import kernel_spec
from polymorph.pipeline.plan import PlanGroup
from polymorph.serving.kvcache import GUARD_BLOCK, PagedKVCache

# The verify scenarios the controller sends (up to VERIFY_SEQS sequences, the longest reaching the
# bucket's context) must fit the cache allocated at load: it is never reallocated for them.
VERIFY_SEQS = 3
VERIFY_CTX = 64  # the context a scenario may reach where the bucket's is shorter


class CandidateError(Exception):
    """A candidate kernel failed; `kind` is a protocol error kind, the message names the cause."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _cause(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Worker:
    """The protocol's ops on one loaded executable. `handle(message) -> response` never raises."""

    def __init__(self) -> None:
        self.exe: Executable | None = None
        self.artifact: Artifact | None = None
        self.info: dict[str, Any] = {}
        self.weight_loads = 0
        self.cache_allocations = 0
        self.swaps = 0
        self.cache_blocks = 0
        self.block_size = 0
        self.bucket = (1, 1)  # (batch, ctx) of the loaded bucket
        self.current: dict[str, dict[str, Any]] = {}  # group id -> {kernel, sha256, candidate}
        self.stock: dict[str, Launch] = {}  # stock launches, built on first restore
        self.plan_groups: list[dict[str, Any]] = []  # what the controller needs to gate a group
        self.verify_cache: PagedKVCache | None = None  # the sequences of the last verify (fresh=false)
        self.released: ReleasedBlocks | None = None  # its blocks slid out of a window (engine.windows)
        self.arenas: dict[str, Arena] = {}  # the controller's io arenas, by path
        self.views: dict[int, dict[str, Any]] = {}  # torch tensors on their slots, by arena
        self.weights_arena: Arena | None = None
        self.stop = False

    # --- dispatch ------------------------------------------------------------------------------------

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        rid = message.get("id")
        op = message.get("op")
        if op not in protocol.OPS:
            return protocol.error(rid, "bad_request", f"unknown op {op!r}; ops: {', '.join(protocol.OPS)}")
        if op not in ("load", "status", "shutdown") and self.exe is None:
            return protocol.error(rid, "not_loaded", "no model is loaded; send `load` first")
        t0 = time.perf_counter()
        try:
            result = getattr(self, f"op_{op}")(message)
        except CandidateError as e:
            return protocol.error(rid, e.kind, str(e))
        except UserError as e:
            return protocol.error(rid, "user", str(e))
        except (KeyError, TypeError, ValueError) as e:
            return protocol.error(rid, "bad_request", f"bad `{op}` request: {_cause(e)}")
        except Exception as e:  # a worker bug: report it, keep serving
            return protocol.error(rid, "internal", f"{_cause(e)}\n{traceback.format_exc()}")
        return protocol.ok(rid, result, time.perf_counter() - t0)

    # --- ops -----------------------------------------------------------------------------------------

    def op_load(self, m: dict[str, Any]) -> dict[str, Any]:
        """`graph` (an IR JSON file the controller wrote) and `weights` (the manifest of its weights
        arena, mapped read-only), or `model` (a name or path the worker loads itself: in-process use
        only; a sandboxed worker cannot read the user's files)."""
        from polymorph import api
        from polymorph.ir import serialize
        from polymorph.models import Model, load_model
        from polymorph.passes import bucket_bindings

        t0 = time.perf_counter()
        if m.get("graph") is not None:
            graph = serialize.load(m["graph"])
            model = Model(name=graph.name, graph=graph, source=str(m.get("source") or m["graph"]))
            if self.weights_arena is not None:
                self.weights_arena.close()
            self.weights_arena = Arena.open(m["weights"], writable=False)
            weights = self.weights_arena.arrays
        else:
            options = {k: m[k] for k in ("dtype", "block_size") if m.get(k) is not None}
            model = load_model(m["model"], **options)
            weights = model.weights()
        backend = m.get("backend") or "cpu"
        require_engine(backend)
        # The plan only: the executable builds (JIT-compiles) its kernels on load.
        artifact = api.lower(
            model, backend, m.get("target"), batch=m.get("batch"), ctx=m.get("ctx"), traffic=m.get("traffic")
        )
        exe = registry.get(artifact.plan.backend).load(artifact, weights)
        self.weight_loads += 1
        bindings = artifact.plan.bindings or bucket_bindings(model.graph, batch=1, ctx=1024)
        batch = int(bindings.get("batch", 1))
        self.block_size = int(model.graph.meta.get("block_size", 16))
        ctx_blocks = int(bindings.get("ctx_blocks", 1))
        verify_blocks = VERIFY_SEQS * max(ctx_blocks, -(-VERIFY_CTX // self.block_size)) + 1
        self.cache_blocks = max(int(bindings.get("cache_blocks", 1)), verify_blocks)
        exe.allocate_state(self.cache_blocks)
        self.cache_allocations += 1
        self.exe, self.artifact = exe, artifact
        self.bucket = (batch, ctx_blocks * self.block_size)
        self.stock.clear()
        self.verify_cache = None
        self.current = {
            g.id: {"kernel": g.kernel.file, "sha256": g.kernel.sha256, "candidate": False}
            for g in artifact.plan.groups
        }
        self.info = {
            "model": model.source,
            "backend": artifact.plan.backend,
            "target": artifact.plan.target,
            "graph_hash": serialize.content_hash(model.graph),
            "dtype": str(model.graph.meta.get("dtype", "f32")),
            "block_size": self.block_size,
            "bucket": {"batch": batch, "ctx": self.bucket[1]},
            "bindings": dict(bindings),
            "cache_blocks": self.cache_blocks,
            "profile": artifact.plan.profile,
        }
        self.plan_groups = [
            {
                "id": g.id,
                "pattern": g.pattern,
                "kernel": g.kernel.file,
                "nodes": list(g.nodes),
                "inputs": list(g.inputs),
                "outputs": list(g.outputs),
            }
            for g in artifact.plan.groups
        ]
        return {**self.info, "groups": self.plan_groups, "load_s": time.perf_counter() - t0,
                "watched": watched_digest()}  # fmt: skip

    def op_swap(self, m: dict[str, Any]) -> dict[str, Any]:
        group = self._group(m["group"])
        path = m.get("path")
        if path is None:
            t0 = time.perf_counter()
            launch = self._stock_launch(group)
            t1 = time.perf_counter()
            if self._per_bucket():
                self.exe.swap_kernel(group.id, None, None)  # type: ignore[union-attr]
            else:
                self.exe.swap(group.id, launch)  # type: ignore[union-attr]
            self.current[group.id] = {
                "kernel": group.kernel.file,
                "sha256": group.kernel.sha256,
                "candidate": False,
            }
            return {
                "group": group.id,
                "sha256": group.kernel.sha256,
                "build_s": t1 - t0,
                "swap_s": time.perf_counter() - t1,
            }
        t0 = time.perf_counter()
        try:
            kernel = load_kernel(path)
        except UserError as e:
            raise CandidateError("candidate_build", str(e)) from None
        target = self.artifact.plan.kernel_target()  # type: ignore[union-attr]  # the chip's traits
        spec = self._spec(group, target)
        try:
            if not kernel.supports(spec):
                raise CandidateError(
                    "candidate_build",
                    f"{path}: does not support group `{group.id}` (pattern {group.pattern}; "
                    f"the file implements {', '.join(kernel.implements)})",
                )
            config = m.get("config")
            config = dict(kernel.configs_for(target)[0] if config is None else config)
            launch = kernel.build(spec, config, target)
        except CandidateError:
            raise
        except Exception as e:  # the candidate's own code raised
            raise CandidateError("candidate_build", f"{path}: build raised {_cause(e)}") from None
        if not callable(launch):
            raise CandidateError(
                "candidate_build", f"{path}: build returned {type(launch).__name__}, not a launch"
            )
        t1 = time.perf_counter()
        if self._per_bucket():  # built again per shape bucket from that bucket's spec (GPU executables)
            self.exe.swap_kernel(group.id, kernel, config)  # type: ignore[union-attr]
        else:
            self.exe.swap(group.id, launch)  # type: ignore[union-attr]
        t2 = time.perf_counter()
        self.swaps += 1
        self.current[group.id] = {
            "kernel": str(path),
            "sha256": kernel.sha256,
            "candidate": True,
            "config": m.get("config"),
        }
        return {"group": group.id, "sha256": kernel.sha256, "build_s": t1 - t0, "swap_s": t2 - t1}

    def op_verify(self, m: dict[str, Any]) -> dict[str, Any]:
        steps = m["steps"]
        max_ctx = int(m.get("max_ctx", VERIFY_CTX))
        if m.get("fresh", True):
            self.verify_cache = self._fresh_cache(max_ctx)
            windows = cache_windows(self.artifact.plan.graph)  # type: ignore[union-attr]
            self.released = ReleasedBlocks(windows, self.block_size)
        elif self.verify_cache is None:
            raise UserError(
                "`verify` with fresh=false needs an earlier verify since the last load, measure or reset"
            )
        cache = self.verify_cache
        exe = self.exe
        poison = exe.poison  # type: ignore[union-attr]
        exe.poison = True  # type: ignore[union-attr]  # a kernel that skips a write shows NaN
        logits: list[np.ndarray] = []
        # `stock_groups`: the stock plan's run of the same steps, those groups' candidates held aside
        # (built, not reloaded) and put back after.
        held = [self._hold_stock(self._group(g)) for g in m.get("stock_groups") or ()]
        try:
            for i, step in enumerate(steps):
                seqs = [int(s) for s in step["seqs"]]
                tokens = np.asarray(step["tokens"], dtype=np.int32)
                if self.released is not None:  # blocks outside every window: NaN, never to be read
                    self.released.before_step(cache, seqs, exe.state)  # type: ignore[union-attr]
                positions = np.stack([cache.reserve(s, tokens.shape[1]) for s in seqs])
                inputs = {"tokens": tokens, "positions": positions, "block_table": cache.block_table(seqs)}
                try:
                    out = exe.run(inputs)["logits"]  # type: ignore[union-attr]
                except Exception as e:  # the candidate raised mid-step
                    return {
                        "logits": logits,
                        "failed_step": i,
                        "cause": _cause(e),
                        "guard_nonzero": self._guard_nonzero(),
                    }
                logits.append(np.asarray(out))
        finally:
            exe.poison = poison  # type: ignore[union-attr]
            for put_back in held:
                put_back()
        return {"logits": logits, "guard_nonzero": self._guard_nonzero()}

    def _hold_stock(self, group: PlanGroup) -> Any:
        """Run `group`'s stock kernel in the slow engine until the returned function puts back what
        ran there before (the same built candidate: nothing is loaded again)."""
        exe = self.exe
        if self._per_bucket():
            was = exe.candidate_of(group.id)  # type: ignore[union-attr]
            exe.swap_kernel(group.id, None, None)  # type: ignore[union-attr]
            return lambda: exe.swap_kernel(group.id, *was) if was else None  # type: ignore[union-attr]
        launch = self._current_launch(group)
        exe.swap(group.id, self._stock_launch(group))  # type: ignore[union-attr]
        return lambda: exe.swap(group.id, launch)  # type: ignore[union-attr]

    def op_run_group(self, m: dict[str, Any]) -> dict[str, Any]:
        """`calls` launches of one group, back to back, on inputs the controller wrote into an arena
        (`io`), into output slots of the same arena (prefilled by the controller); weights are the
        engine's own tensors. Gates (one call) and timing (many) take this same path: the controller
        times the request with its own clock and reads the outputs after it froze this process."""
        import torch

        group = self._group(m["group"])
        calls = m["calls"]
        bindings = {str(k): int(v) for k, v in m["bindings"].items()}
        launch = _noop if m.get("noop") else self._launch_at(group, bindings, stock=bool(m.get("stock")))
        arena = self._arena(m["io"])
        device = self.exe.device  # type: ignore[union-attr]
        on_host = device.type == "cpu"
        params = self.exe.params  # type: ignore[union-attr]
        graph = self.artifact.plan.graph  # type: ignore[union-attr]
        producer = {v: n for n in graph.nodes if n.name in group.nodes for v in n.outputs}
        alias = self.exe.alias  # type: ignore[union-attr]
        staged: list[tuple[list[Any], list[Any]]] = []
        for call in calls:
            if len(call["inputs"]) != len(group.inputs) or len(call["outputs"]) != len(group.outputs):
                raise ValueError(f"group `{group.id}` takes {len(group.inputs)} inputs and "
                                 f"{len(group.outputs)} outputs")  # fmt: skip
            ins = []
            for v, name in zip(group.inputs, call["inputs"], strict=True):
                if name is None:
                    if v not in params:
                        raise ValueError(
                            f"input `{v}` of group `{group.id}` is not a weight: send its values"
                        )
                    ins.append(params[v])
                else:
                    ins.append(self._view(arena, name, device))
            outs = []
            for v, name in zip(group.outputs, call["outputs"], strict=True):
                if v in alias:  # a cache write: its output is the cache it was given, written in place
                    outs.append(ins[group.inputs.index(producer[v].inputs[0])])
                else:
                    outs.append(self._view(arena, name, device))
            staged.append((ins, outs))
        try:
            with torch.inference_mode():
                for ins, outs in staged:
                    launch(ins, outs, None)
                self._sync()
        except Exception as e:  # the candidate raised
            raise CandidateError("candidate_run", f"group `{group.id}` raised {_cause(e)}") from None
        if not on_host:  # device buffers back into the arena (host views need no copy)
            for call, (ins, outs) in zip(calls, staged, strict=True):
                for name, t in [*zip(call["inputs"], ins), *zip(call["outputs"], outs)]:
                    if name is not None:
                        arena.arrays[name][...] = _numpy(t)
        slots = [(call["outputs"], call["inputs"]) for call in calls]
        return {"calls": len(calls), "watched": watched_digest(), "slots": slots_digest(arena.arrays, slots)}

    def _view(self, arena: Arena, name: str, device: Any) -> Any:
        """A torch tensor on arena slot `name`, made once per mapping (host: the shared pages
        themselves; a device: a buffer of its own, filled from the slot at every call)."""
        views = self.views.setdefault(id(arena), {})
        t = views.get(name)
        if t is None:
            t = views[name] = _tensor(arena.arrays[name], device)
        elif device is not None and getattr(device, "type", "cpu") != "cpu":
            t.copy_(_tensor(arena.arrays[name], None), non_blocking=True)
        return t

    def _arena(self, io: dict[str, Any]) -> Arena:
        """The io arena a request names: one the controller handed over (`map`, by id), or a file by
        its manifest's path (in-process use)."""
        if "id" in io:
            arena = self.arenas.get(str(io["id"]))
            if arena is None:
                raise UserError(f"io arena {io['id']!r} was not mapped here (send `map` first)")
            return arena
        path = str(io["path"])
        arena = self.arenas.get(path)
        if arena is None or arena.entries != io["entries"]:
            if arena is not None:
                self.views.pop(id(arena), None)
                arena.close()
            arena = self.arenas[path] = Arena.open(io, writable=True)
        return arena

    def map_arena(self, key: str, fd: int, entries: list[dict[str, Any]], size: int) -> None:
        old = self.arenas.pop(key, None)
        if old is not None:
            self.views.pop(id(old), None)
            old.close()
        self.arenas[key] = Arena.from_fd(fd, entries, size)

    def op_measure(self, m: dict[str, Any]) -> dict[str, Any]:
        """Whole decode steps at the loaded bucket (batch, its longest ctx) on the tokens the
        controller wrote into `io` (`tokens`: [trials, batch, 1]); each step's logits into `logits`
        [trials, batch, vocab]. The cache is restored afterwards. The controller times the request."""
        io = self._arena(m["io"])
        tokens, out = io.arrays["tokens"], io.arrays["logits"]
        batch, ctx = self.bucket
        self.verify_cache = None
        positions, table = self._fresh_cache(ctx).decode_step(batch, ctx)  # at the bucket's longest context
        saved = self._save_state()
        try:
            for i in range(tokens.shape[0]):
                inputs = {"tokens": np.asarray(tokens[i]), "positions": positions, "block_table": table}
                try:
                    logits = self.exe.run(inputs)["logits"]  # type: ignore[union-attr]
                except Exception as e:
                    raise CandidateError("candidate_run", f"step {i} raised {_cause(e)}") from None
                out[i] = np.asarray(logits).reshape(out.shape[1:])
            self._sync()
        finally:
            self._restore_state(saved)
        slots = slots_digest(io.arrays, [(["logits"], ["tokens"])])
        return {"trials": int(tokens.shape[0]), "watched": watched_digest(), "slots": slots}

    def op_status(self, m: dict[str, Any]) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "loaded": self.exe is not None,
            **self.info,
            "weight_loads": self.weight_loads,
            "cache_allocations": self.cache_allocations,
            "swaps": self.swaps,
            "groups": self.current,
            "plan": self.plan_groups,
        }

    def op_canary(self, m: dict[str, Any]) -> dict[str, Any]:
        """A fixed computation on the engine's device whose answer the controller knows (`canary_value`),
        and the fingerprint of the first weight (the controller knows it from load): a device context
        that a candidate broke (an illegal address on a GPU) fails here, where `status` still answers."""
        import torch

        device = self.exe.device  # type: ignore[union-attr]
        a = (torch.arange(CANARY_N * CANARY_N, device=device) % 7 - 3).float().reshape(CANARY_N, CANARY_N)
        value = float((a @ a.T).sum().item())
        params = self.exe.params  # type: ignore[union-attr]
        first = next(iter(sorted(params)), None)
        return {"value": value, "weight": None if first is None else _fingerprint(params[first])}

    def op_fingerprints(self, m: dict[str, Any]) -> dict[str, Any]:
        """Every weight's fingerprint, read where it lives (evidence for the controller, which compares
        them with the values a worker no candidate touched gave at load)."""
        params = self.exe.params  # type: ignore[union-attr]
        return {"weights": {name: _fingerprint(params[name]) for name in sorted(params)}}

    def op_reset(self, m: dict[str, Any]) -> dict[str, Any]:
        restored = []
        for gid, entry in list(self.current.items()):
            if entry["candidate"]:
                self.op_swap({"group": gid, "path": None})
                restored.append(gid)
        self.verify_cache = None
        self._zero_state()
        return {"restored": restored}

    def op_map(self, m: dict[str, Any]) -> dict[str, Any]:
        raise UserError("`map` hands over a descriptor: it is answered on the worker's socket only")

    def op_fork(self, m: dict[str, Any]) -> dict[str, Any]:
        raise UserError("`fork` is answered by a zygote worker (--zygote) only")

    def op_shutdown(self, m: dict[str, Any]) -> dict[str, Any]:
        self.stop = True
        return {}

    # --- internals -----------------------------------------------------------------------------------

    def _group(self, group_id: str) -> PlanGroup:
        for g in self.artifact.plan.groups:  # type: ignore[union-attr]
            if g.id == group_id:
                return g
        raise UserError(f"no node group `{group_id}` in this plan")

    def _per_bucket(self) -> bool:
        """GPU executables build a swapped kernel per shape bucket (swap_kernel); cpu ones take one launch."""
        return bool(self.exe.bucketed)  # type: ignore[union-attr]

    def _device_timer(self) -> bool:
        return self.exe is not None and self.exe.device.type == "cuda"

    def _launch_at(self, group: PlanGroup, bindings: Mapping[str, int], *, stock: bool) -> Launch:
        """The launch a step at `bindings` runs for `group` (the stock one with `stock`)."""
        if not self._per_bucket():
            return self._stock_launch(group) if stock else self._current_launch(group)
        launches = {g.id: (g, launch) for g, launch in self.exe.launches_for(bindings)}  # type: ignore[union-attr]
        if group.id not in launches:
            raise UserError(
                f"group `{group.id}` is not in the plan at {dict(bindings)} (lowered differently there)"
            )
        g, base = launches[group.id]
        return base if stock else self.exe.launch_of(g, bindings, base)  # type: ignore[union-attr]

    def _current_launch(self, group: PlanGroup) -> Launch:
        for g, launch in self.exe.launches:  # type: ignore[union-attr]
            if g.id == group.id:
                return launch
        raise UserError(f"no node group `{group.id}` in this executable")

    def _stock_launch(self, group: PlanGroup) -> Launch:
        if group.id not in self.stock:
            plan = self.artifact.plan  # type: ignore[union-attr]
            target = plan.kernel_target()
            kernel = load_choice(group.kernel.file, group.kernel.sha256, self.artifact.out_dir)  # type: ignore[union-attr]
            spec = self._spec(group, target)
            self.stock[group.id] = kernel.build(spec, group.kernel.config, target)
        return self.stock[group.id]

    def _spec(self, group: PlanGroup, target: Any) -> KernelSpec:
        """The spec a group's kernel is built for, as the backend's executable builds it: one that is
        not `bucketed` (cpu) builds on the symbolic graph; a bucketed one (the GPU executable) on the
        graph specialized to the plan's bucket (GpuExecutable._build; not yet run here, no GPU)."""
        plan = self.artifact.plan  # type: ignore[union-attr]
        if getattr(self.exe, "bucketed", False) and plan.bindings:
            graph, types = plan.concrete()  # made once per plan, not per candidate built
        else:
            graph, types = plan.graph, plan.graph.types()
        return kernel_spec(graph, group, types, target)

    def _fresh_cache(self, max_ctx: int) -> PagedKVCache:
        """Block bookkeeping over the cache allocated at load (zeroed in place, never reallocated)."""
        ctx_blocks = -(-max_ctx // self.block_size)
        if ctx_blocks > self.cache_blocks - 1:
            raise UserError(
                f"max_ctx {max_ctx} needs {ctx_blocks} blocks; the engine holds {self.cache_blocks - 1}"
            )
        self._zero_state()
        return PagedKVCache(self.block_size, self.cache_blocks, ctx_blocks)

    def _guard_nonzero(self) -> int:
        """Elements of the guard regions, over every cache tensor, that are not zero (NaN counts): the
        guard block, the blocks no sequence of the last verify owns, and the slots past each one's
        last token (`PagedKVCache.written_slots`; only the guard block without a verify cache)."""
        import torch

        state = self.exe.state  # type: ignore[union-attr]
        cache = self.verify_cache
        guard = None if cache is None else torch.from_numpy(~cache.written_slots())  # [blocks, block_size]
        count = 0
        for t in state.values():
            if guard is None or tuple(t.shape[:2]) != tuple(guard.shape):
                count += int((t[GUARD_BLOCK] != 0).sum())
                continue
            guard = guard.to(t.device)  # once: every cache tensor lives on the engine's device
            nonzero = (t != 0).reshape(*t.shape[:2], -1).sum(-1)  # per slot
            count += int(nonzero[guard].sum())
        if cache is not None and self.released is not None:  # a write into a block a window released
            count += self.released.written(state)
        return count

    def _zero_state(self) -> None:
        for t in self.exe.state.values():  # type: ignore[union-attr]
            t.zero_()

    def _save_state(self) -> dict[str, Any]:
        return {k: v.clone() for k, v in self.exe.state.items()}  # type: ignore[union-attr]

    def _restore_state(self, saved: Mapping[str, Any]) -> None:
        state = self.exe.state  # type: ignore[union-attr]
        for k, v in saved.items():
            state[k].copy_(v)

    def _sync(self) -> None:
        # GPU executables queue work asynchronously: the host timer must wait for the device (not
        # under Triton's interpreter, where the "GPU" executable runs on the host).
        if self._device_timer():
            import torch

            torch.cuda.synchronize()


CANARY_N = 64  # the canary's matrix: (i % 7) - 3 over CANARY_N x CANARY_N, exact in f32 (and tf32)


def require_engine(backend: str) -> None:
    """UserError unless `backend` declares the engine's runtime contract (Feature.ENGINE)."""
    from polymorph.pipeline.backend import Feature

    if Feature.ENGINE not in registry.get(backend).features:
        raise UserError(
            f"the persistent engine runs on backends whose executables speak its runtime contract "
            f"(Feature.ENGINE: {', '.join(registry.with_feature(Feature.ENGINE))}), not `{backend}`, "
            "which does not declare it"
        )


_FINGERPRINT_CHUNK = 1 << 22  # words per pass: a few 32 MB int64 temporaries, never a weight's copy


def _fingerprint(t: Any) -> str:
    """Every bit of tensor `t`, folded where it lives: the sum of its words, and the sum of each word
    times a hashed multiplier of its position (int64, wrapping). A plain position weight missed two
    swapped rows of equal sums (CI caught it); with hashed multipliers a change of one word always
    shows and any other change hides only by a 2**-64-scale coincidence or by a candidate that knows
    the hash. It replaced a sha256 over a host copy, which cost 0.1 s or more per 32 MB weight and ran
    twice per `run_group`: most of a Llama-3.2-1B candidate's gates."""
    import torch

    flat = t.detach().contiguous().view(-1)
    size = flat.element_size()
    # 8- and 16-byte elements as 4-byte words: folded whole, two sign flips of 8-byte words could cancel.
    words = flat.view({1: torch.uint8, 2: torch.int16}.get(size, torch.int32))
    total = weighted = 0
    for start in range(0, words.numel(), _FINGERPRINT_CHUNK):
        w = words[start : start + _FINGERPRINT_CHUNK].to(torch.int64)
        at = torch.arange(start + 1, start + 1 + w.numel(), device=w.device, dtype=torch.int64)
        total += int(w.sum())
        weighted += int((w * _position_hash(at)).sum())
    mask = (1 << 64) - 1
    return f"{flat.dtype}:{list(t.shape)}:{total & mask:016x}:{weighted & mask:016x}"


def _position_hash(at: Any) -> Any:
    """An odd, well-mixed int64 per position (splitmix64's finaliser, in wrapping int64 arithmetic;
    the shifts are arithmetic on negative values, which only changes which mix, not its quality)."""
    h = at * _MIX_GOLDEN
    h = (h ^ (h >> 30)) * _MIX_A
    h = (h ^ (h >> 27)) * _MIX_B
    return (h ^ (h >> 31)) | 1


def _signed64(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_MIX_GOLDEN = _signed64(0x9E3779B97F4A7C15)
_MIX_A = _signed64(0xBF58476D1CE4E5B9)
_MIX_B = _signed64(0x94D049BB133111EB)


def _noop(inputs: Any, outputs: Any, scratch: Any) -> None:
    """The empty launch: what the harness costs per call, measured on a worker no candidate touched."""


def _tensor(a: np.ndarray, device: Any) -> Any:
    """A torch view of arena array `a` (on the host), or its copy on the engine's device."""
    from polymorph.backends.torch_bridge import share_torch

    t = share_torch(a)
    return t if device is None or getattr(device, "type", "cpu") == "cpu" else t.to(device)


def _numpy(t: Any) -> np.ndarray:
    from polymorph.backends.torch_bridge import to_numpy

    return to_numpy(t)


# What a candidate might rebind to change what other code computes or measures: the clocks, and the
# functions of torch and numpy that kernels and the worker call. Their identities at the first answer
# (the load's, before any candidate ran) are the baseline; every answer carries the digest over the
# same names, and the controller rejects a candidate under which it changed. Evidence only (candidate
# code could patch this too): what counts is the controller's clock and its own comparison of the
# outputs, and a worker is retired after every candidate.
_WATCHED: list[tuple[Any, str]] = []


def watched_digest() -> str:
    import hashlib

    import torch

    if not _WATCHED:
        spaces = [time, os, np, np.linalg, torch, torch.Tensor, torch.nn.functional, torch.linalg]
        _WATCHED.extend(
            (space, name) for space in spaces for name in sorted(vars(space)) if not name.startswith("_")
        )
    ids = [
        f"{getattr(space, '__name__', '?')}.{name}={id(vars(space).get(name))}" for space, name in _WATCHED
    ]
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


# --- the process -------------------------------------------------------------------------------------


def serve(sock: socket.socket, worker: Worker, *, zygote: bool = False) -> None:
    """Answer requests on `sock` until the controller closes its end (or sends `shutdown`). A zygote
    answers `fork` too: a copy of itself, loaded, serving the socket the controller passes."""
    with sock, sock.makefile("rb") as reader:
        for line in reader:
            if not line.strip():
                continue
            try:
                message = protocol.decode(line)
            except protocol.ProtocolError as e:
                response = protocol.error(None, "bad_request", str(e))
            else:
                if zygote and message.get("op") == "fork":
                    _fork(sock, reader, worker, message)
                    continue
                if message.get("op") == "map":
                    _map(sock, worker, message)
                    continue
                response = worker.handle(message)
            sock.sendall(protocol.encode(response))
            if worker.stop:
                return


def _map(sock: socket.socket, worker: Worker, message: dict[str, Any]) -> None:
    """`map` {id, entries, size}: take the io arena's descriptor the controller sends next."""
    rid = message.get("id")
    sock.sendall(protocol.encode(protocol.ok(rid, {"await_fd": True})))
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    try:
        if len(fds) != 1:
            raise ValueError("expected one descriptor")
        worker.map_arena(str(message["arena"]), fds[0], list(message["entries"]), int(message["size"]))
        response = protocol.ok(rid, {})
    except (KeyError, TypeError, ValueError, OSError) as e:
        response = protocol.error(rid, "bad_request", f"map: {_cause(e)}")
    sock.sendall(protocol.encode(response))


def _fork(sock: socket.socket, reader: Any, worker: Worker, message: dict[str, Any]) -> None:
    """`fork` {threads, load?, private_shm?}: take the socket the controller sends next (SCM_RIGHTS),
    fork, and in the child serve it as a worker of its own (`threads` torch threads; `load`: load
    first, for the backends whose device context cannot cross a fork; `private_shm`: the sandbox's
    /dev/shm is the zygote's own, emptied before the copy serves). The zygote never runs candidate code and
    never starts a thread pool (one torch thread), so every copy starts from a clean, loaded state."""
    import signal
    import uuid

    rid = message.get("id")
    sock.sendall(protocol.encode(protocol.ok(rid, {"await_fd": True})))
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        sock.sendall(protocol.encode(protocol.error(rid, "bad_request", "fork: expected one socket")))
        return
    pid = os.fork()
    if pid == 0:
        try:
            reader.close()
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own children are its own to wait for
            # A folder of its own (the controller wipes it at retirement), a compile cache in it: no
            # earlier copy could have planted anything it reads.
            home = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fork-{uuid.uuid4().hex[:12]}")
            os.makedirs(os.path.join(home, "triton"))
            os.chdir(home)
            # polymorph's own compile cache (the NEFF cache on neuron) too: the zygote's, which outlives
            # every copy, is never written by one (it holds what the zygote built, read by none)
            os.environ.update(HOME=home, TMPDIR=home, TRITON_CACHE_DIR=os.path.join(home, "triton"),
                              TORCHINDUCTOR_CACHE_DIR=os.path.join(home, "inductor"),
                              POLYMORPH_CACHE_DIR=os.path.join(home, "cache"))  # fmt: skip
            tempfile.tempdir = None  # gettempdir() cached the template's folder: this copy's from now on
            if message.get("private_shm"):
                _wipe_shm()
            import torch

            torch.set_num_threads(int(message.get("threads") or 1))
            if message.get("load"):
                loaded = worker.handle({"id": 0, "op": "load", **message["load"]})
                if not loaded.get("ok"):
                    print(f"error: {loaded['error']['message']}", file=sys.stderr, flush=True)
            serve(socket.socket(fileno=fds[0]), worker)
        finally:
            os._exit(0)
    os.close(fds[0])
    sock.sendall(protocol.encode(protocol.ok(rid, {"pid": pid})))


def _wipe_shm() -> None:
    """Empty /dev/shm before this copy serves: the zygote's sandbox mounts it private to the zygote and
    its copies, not to each copy, so a file an earlier copy's candidate left there would be there for
    this one. Only called where the controller says the sandbox's private /dev/shm is on (never the
    host's own)."""
    import shutil

    for entry in os.scandir("/dev/shm"):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _nondumpable() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def _preload(backend: str) -> None:
    """Do the slow imports (torch, the compile path) before the first answer, so that a worker
    started ahead of need answers `load` at once. A failure here is left for `load` to report."""
    import importlib

    for module in ("polymorph.api", "polymorph.models", f"polymorph.backends.{backend}.runtime"):
        try:
            importlib.import_module(module)
        except Exception:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polymorph.engine.worker", description=__doc__.splitlines()[0])
    p.add_argument("--fd", type=int, required=True, help="the inherited socket to serve (a socketpair end)")
    p.add_argument(
        "--preload", metavar="BACKEND", help="import the backend's runtime before serving (a standby worker)"
    )
    p.add_argument("--zygote", action="store_true", help="serve `fork`: copies of this worker, loaded")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    # Nothing goes to stdout: a candidate's prints go to stderr (the worker's log).
    os.dup2(2, 1)
    if args.zygote:
        import signal

        import torch

        torch.set_num_threads(1)  # an OpenMP pool does not survive a fork: the copies start their own
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # copies are reaped as they end
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # pid 1 of its namespace: only handled signals reach it
        _nondumpable()  # its copies inherit it: none can read another's (or its) memory through /proc
    if args.preload:
        _preload(args.preload)
    sock.sendall(protocol.encode({"ready": os.getpid()}))
    serve(sock, Worker(), zygote=args.zygote)
    return 0


if __name__ == "__main__":
    sys.exit(main())
