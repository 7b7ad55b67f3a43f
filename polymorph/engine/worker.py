"""The engine worker: one persistent process per device that runs candidate code.

    python -m polymorph.engine.worker [--port 0 | --unix PATH] [--watch-stdin] [--preload BACKEND]

It prints its address as the first line of stdout, then serves the JSON-lines protocol of
`polymorph.engine.protocol`, one connection at a time. It holds the loaded executable (weights and
KV cache, allocated once per `load`) and swaps candidate kernels into it: `load_kernel` on the
candidate's path (a fresh module every time) -> `build(spec, config, target)` -> `executable.swap`.
It never holds reference outputs: `verify` returns the logits of the steps it is given, `run_group`
the outputs of one group on the controller's inputs (with input checksums around the launch), and
the controller compares them (`polymorph.engine.gates`). A candidate that raises is reported with its cause and the worker goes on;
a candidate that hangs or kills the process is the controller's to handle (it restarts the worker).

With --watch-stdin the worker exits when its stdin closes, so it never outlives the controller that
started it (a detached engine, started by `polymorph engine start`, runs without it). With --preload
it does the backend's slow imports before printing its address: the controller keeps such a standby
worker to replace a lost one quickly.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.backend import Artifact, Executable, registry
from polymorph.engine import protocol
from polymorph.errors import UserError
from polymorph.ir.shapes import concrete
from polymorph.kernel_files import KernelSpec, Launch, load_choice, load_kernel
from polymorph.kvcache import GUARD_BLOCK, PagedKVCache
from polymorph.lowering import kernel_spec
from polymorph.plan import PlanGroup
from polymorph.target import Target

# The verify scenario the controller sends (two sequences, a few decode steps) must fit the cache
# allocated at load, whatever the bucket: the cache is never reallocated for it.
VERIFY_BATCH = 4
VERIFY_CTX = 64
# The fast tier's engine: the first layers of the model on the same weights (and the embedding and
# head), for cheap, low-variance timing of the groups it has; the slow tier runs every layer.
FAST_LAYERS = 2

# The host clock as the worker found it. A candidate may replace `time.perf_counter_ns` (the timer
# `measure` reads); every swap puts this one back before it builds, so such a patch lives only as
# long as the candidate that made it, and `measure` says whether it is in force. The controller's
# wall-clock cross-check is what catches it; this only tells it whom to blame.
_HOST_CLOCK = time.perf_counter_ns


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
        self.fast: Executable | None = None  # the fast tier's few-layer engine, where the model has more
        self.fast_groups: set[str] = set()
        self.artifact: Artifact | None = None
        self.info: dict[str, Any] = {}
        self.weight_loads = 0
        self.cache_allocations = 0
        self.swaps = 0
        self.cache_blocks = 0
        self.block_size = 0
        self.bucket = (1, 1)  # (batch, ctx) of the slow tier
        self.current: dict[str, dict[str, Any]] = {}  # group id -> {kernel, sha256, candidate}
        self.stock: dict[str, Launch] = {}  # stock launches, built on first restore
        self.plan_groups: list[dict[str, Any]] = []  # what the controller needs to gate a group
        self.verify_cache: PagedKVCache | None = None  # the sequences of the last verify (fresh=false)
        self.types: dict[str, Any] | None = None  # the plan graph's value types, once per load
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
        from polymorph import api
        from polymorph.ir import serialize
        from polymorph.models import load_model
        from polymorph.passes import bucket_bindings

        t0 = time.perf_counter()
        options = {k: m[k] for k in ("dtype", "block_size") if m.get(k) is not None}
        model = load_model(m["model"], **options)
        backend = m.get("backend") or "cpu"
        if backend not in ENGINE_BACKENDS:
            raise UserError(
                f"the persistent engine runs on the cpu, cuda and rocm backends, not {backend}: its hot "
                "reload (recompiling one group's HLO through the content-hashed cache) is not built"
            )
        # The plan only: the executable builds (JIT-compiles) its kernels on load.
        artifact = api.lower(
            model, backend, m.get("target"), batch=m.get("batch"), ctx=m.get("ctx"), traffic=m.get("traffic")
        )
        exe = registry.get(artifact.plan.backend).load(artifact, model.weights())
        self.weight_loads += 1
        bindings = artifact.plan.bindings or bucket_bindings(model.graph, batch=1, ctx=1024)
        batch = int(bindings.get("batch", 1))
        self.block_size = int(model.graph.meta.get("block_size", 16))
        ctx_blocks = int(bindings.get("ctx_blocks", 1))
        verify_blocks = VERIFY_BATCH * -(-VERIFY_CTX // self.block_size) + 1
        self.cache_blocks = max(int(bindings.get("cache_blocks", 1)), verify_blocks)
        exe.allocate_state(self.cache_blocks)
        self.cache_allocations += 1
        self.exe, self.artifact = exe, artifact
        self.fast_groups = set()
        self.fast = self._load_fast(model, backend, m, exe)
        self.bucket = (batch, ctx_blocks * self.block_size)
        self.stock.clear()
        self.verify_cache = None
        self.types = None
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
            "profile": artifact.plan.profile,
            "fast_tier": f"{FAST_LAYERS}-layer engine" if self.fast is not None else "the full engine",
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
        return {**self.info, "groups": self.plan_groups, "load_s": time.perf_counter() - t0}

    def _load_fast(self, model: Any, backend: str, m: dict[str, Any], exe: Any) -> Any:
        """The few-layer engine of the fast tier on the full engine's weights (GPU tensors shared), or
        None where the model has no more layers than that or no config to rebuild it from."""
        from polymorph import api
        from polymorph.models import Model

        cfg = model.config
        if cfg is None or cfg.num_hidden_layers <= FAST_LAYERS:
            return None
        graph = model.rebuild(num_layers=FAST_LAYERS)
        few = Model(name=f"{model.name}-{FAST_LAYERS}l", graph=graph, source=model.source, config=cfg)
        art = api.lower(
            few, backend, m.get("target"), batch=m.get("batch"), ctx=m.get("ctx"), traffic=m.get("traffic")
        )
        params = getattr(exe, "params", {})
        on_device = getattr(getattr(exe, "device", None), "type", "cpu") != "cpu"
        weights = {n: params[n] if on_device else model.weights()[n] for n in graph.params}
        fast = registry.get(art.plan.backend).load(art, weights)
        fast.allocate_state(self.cache_blocks)
        self.fast_groups = {g.id for g in art.plan.groups}
        return fast

    def _swap_fast(self, group: PlanGroup, launch: Launch | None, kernel: Any, config: Any) -> None:
        """The same swap in the fast tier's engine, where it has the group."""
        fast = self.fast
        if fast is None or group.id not in self.fast_groups:
            return
        if callable(getattr(fast, "swap_kernel", None)):
            fast.swap_kernel(group.id, kernel, config)
        elif launch is not None:
            fast.swap(group.id, launch)

    def op_swap(self, m: dict[str, Any]) -> dict[str, Any]:
        group = self._group(m["group"])
        if not callable(getattr(self.exe, "swap", None)):
            raise UserError(
                f"backend `{self.info['backend']}` cannot hot-swap kernels (no Feature.HOT_RELOAD)"
            )
        time.perf_counter_ns = _HOST_CLOCK  # whatever an earlier candidate did to it
        path = m.get("path")
        if path is None:
            t0 = time.perf_counter()
            launch = self._stock_launch(group)
            t1 = time.perf_counter()
            if self._per_bucket():
                self.exe.swap_kernel(group.id, None, None)  # type: ignore[union-attr]
            else:
                self.exe.swap(group.id, launch)  # type: ignore[union-attr]
            self._swap_fast(group, launch, None, None)
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
        target = Target.parse(self.artifact.plan.target)  # type: ignore[union-attr]
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
        self._swap_fast(group, launch, kernel, config)
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
        elif self.verify_cache is None:
            raise UserError(
                "`verify` with fresh=false needs an earlier verify since the last load, measure or reset"
            )
        cache = self.verify_cache
        exe = self.exe
        poison = getattr(exe, "poison", None)
        if poison is not None:
            exe.poison = True  # type: ignore[union-attr]  # a kernel that skips a write shows NaN
        logits: list[np.ndarray] = []
        # `stock_groups`: the stock plan's run of the same steps, those groups' candidates held aside
        # (built, not reloaded) and put back after.
        held = [self._hold_stock(self._group(g)) for g in m.get("stock_groups") or ()]
        try:
            for i, step in enumerate(steps):
                seqs = [int(s) for s in step["seqs"]]
                tokens = np.asarray(step["tokens"], dtype=np.int32)
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
            if poison is not None:
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
        """One group's launch alone on the caller's inputs, into fresh output buffers prefilled with
        `fill`; outputs copied the moment the launch returns (cpu executable)."""
        import torch

        from polymorph.backends.torch_bridge import TORCH_DTYPE, to_numpy, to_torch

        group = self._group(m["group"])
        arrays = m["inputs"]
        if len(arrays) != len(group.inputs):
            raise ValueError(f"group `{group.id}` takes {len(group.inputs)} inputs, got {len(arrays)}")
        params = getattr(self.exe, "params", {})
        for v, a in zip(group.inputs, arrays, strict=True):
            if a is None and v not in params:
                raise ValueError(f"input `{v}` of group `{group.id}` is not a weight: send its values")
        bindings = {str(k): int(v) for k, v in m["bindings"].items()}
        launch = self._launch_at(group, bindings, stock=bool(m.get("stock")))
        device = getattr(self.exe, "device", None)
        fill = m.get("fill", "nan")
        graph = self.artifact.plan.graph  # type: ignore[union-attr]
        types = self._types()
        producer = {v: n for n in graph.nodes if n.name in group.nodes for v in n.outputs}
        alias = getattr(self.exe, "alias", {})
        # Weights are the engine's own persistent tensors (a kernel may prepack them once); every
        # other input is a copy in the worker's own memory, never the wire buffer.
        ins = [
            params[v] if a is None else to_torch(np.asarray(a), device).clone()
            for v, a in zip(group.inputs, arrays, strict=True)
        ]
        outs: list[Any] = []
        in_place: list[int] = []
        for v in group.outputs:
            if v in alias:  # a cache write: its output is the cache tensor it was given, written in place
                i = group.inputs.index(producer[v].inputs[0])
                outs.append(ins[i])
                in_place.append(i)
                continue
            t = types[v]
            out = torch.empty(concrete(t.shape, bindings), dtype=TORCH_DTYPE[t.dtype], device=device)
            out.fill_(_fill_value(fill, t.dtype.is_float))
            outs.append(out)
        before = [_fingerprint(x) for x in ins]
        try:
            with torch.inference_mode():
                launch(ins, outs, None)
        except Exception as e:  # the candidate raised
            raise CandidateError("candidate_run", f"group `{group.id}` raised {_cause(e)}") from None
        # As they were when the launch returned; on a GPU the copy waits for the current stream only,
        # so work a candidate pushed to another stream or thread shows up as a late change below.
        got = [to_numpy(o).copy() for o in outs]
        after = [_fingerprint(x) for x in ins]
        late: list[bool] = []
        settle_s = float(m.get("settle_s", 0.0))
        if settle_s > 0:
            time.sleep(settle_s)
            self._sync()
            late = [to_numpy(o).tobytes() != g.tobytes() for o, g in zip(outs, got, strict=True)]
        return {
            "outputs": got,
            "checksums_before": before,
            "checksums_after": after,
            "in_place": in_place,
            "late": late,
        }

    def op_measure(self, m: dict[str, Any]) -> dict[str, Any]:
        tier = m.get("tier", "fast")
        trials = int(m.get("trials", 20))
        if tier not in protocol.TIERS or trials < 1:
            raise ValueError(f"tier must be one of {protocol.TIERS} and trials >= 1")
        batch, ctx = self.bucket
        self.verify_cache = None
        positions, table = self._fresh_cache(ctx).decode_step(batch, ctx)  # at the bucket's longest context
        vocab = int(self.artifact.plan.graph.params["model.embed_tokens.weight"].shape[0])  # type: ignore[union-attr]
        rng = np.random.default_rng()

        def inputs() -> dict[str, np.ndarray]:
            tokens = rng.integers(0, vocab, size=(batch, 1), dtype=np.int32)  # fresh content per call
            return {"tokens": tokens, "positions": positions, "block_table": table}

        timer = "host perf_counter_ns"
        if time.perf_counter_ns is not _HOST_CLOCK:
            timer += " (replaced by a candidate)"
        saved = self._save_state()
        try:
            if tier == "slow":
                times = _time(lambda: self.exe.run(inputs()), trials, self._sync)  # type: ignore[union-attr]
                return {"tier": tier, "timer": timer, "trials": trials, **_stats(times)}
            only = m.get("group")
            fast = self.fast
            engine = fast if fast is not None and (only is None or only in self.fast_groups) else self.exe
            if self._device_timer():
                groups, bindings = _time_groups_on_device(engine, inputs(), trials, only)
                timer = "device events around CUDA/HIP graph replays, operands cold in L2"
            else:
                groups, bindings = _time_groups(engine, inputs(), trials, only, self._sync)
            where = f"{FAST_LAYERS}-layer engine" if engine is fast else "full engine"
            return {"tier": tier, "timer": timer, "trials": trials, "groups": groups, "bindings": bindings,
                    "engine": where}  # fmt: skip
        finally:
            self._restore_state(saved)

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

        device = getattr(self.exe, "device", None) or "cpu"
        a = (torch.arange(CANARY_N * CANARY_N, device=device) % 7 - 3).float().reshape(CANARY_N, CANARY_N)
        value = float((a @ a.T).sum().item())
        params = getattr(self.exe, "params", {})
        first = next(iter(sorted(params)), None)
        return {"value": value, "weight": None if first is None else _fingerprint(params[first])}

    def op_reset(self, m: dict[str, Any]) -> dict[str, Any]:
        restored = []
        for gid, entry in list(self.current.items()):
            if entry["candidate"]:
                self.op_swap({"group": gid, "path": None})
                restored.append(gid)
        self.verify_cache = None
        self._zero_state()
        return {"restored": restored}

    def op_shutdown(self, m: dict[str, Any]) -> dict[str, Any]:
        self.stop = True
        return {}

    # --- internals -----------------------------------------------------------------------------------

    def _group(self, group_id: str) -> PlanGroup:
        for g in self.artifact.plan.groups:  # type: ignore[union-attr]
            if g.id == group_id:
                return g
        raise UserError(f"no node group `{group_id}` in this plan")

    def _types(self) -> dict[str, Any]:
        if self.types is None:
            self.types = self.artifact.plan.graph.types()  # type: ignore[union-attr]
        return self.types

    def _per_bucket(self) -> bool:
        """GPU executables build a swapped kernel per shape bucket (swap_kernel); cpu ones take one launch."""
        return callable(getattr(self.exe, "swap_kernel", None))

    def _device_timer(self) -> bool:
        device = getattr(self.exe, "device", None)
        return device is not None and getattr(device, "type", "cpu") == "cuda"

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
            target = Target.parse(plan.target)
            kernel = load_choice(group.kernel.file, group.kernel.sha256, self.artifact.out_dir)  # type: ignore[union-attr]
            spec = self._spec(group, target)
            self.stock[group.id] = kernel.build(spec, group.kernel.config, target)
        return self.stock[group.id]

    def _spec(self, group: PlanGroup, target: Target) -> KernelSpec:
        """The spec a group's kernel is built for, as the backend's executable builds it: the cpu
        executable builds on the symbolic graph; the GPU executable on the graph specialized to the
        plan's bucket (GpuExecutable._build; not yet run here, no GPU)."""
        plan = self.artifact.plan  # type: ignore[union-attr]
        graph = plan.graph
        if plan.backend != "cpu" and plan.bindings:
            from polymorph.passes import specialize

            graph = specialize(graph, plan.bindings)
        return kernel_spec(graph, group, graph.types(), target)

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

        state = getattr(self.exe, "state", {})
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
        return count

    def _zero_state(self) -> None:
        for t in getattr(self.exe, "state", {}).values():
            t.zero_()

    def _save_state(self) -> dict[str, Any]:
        return {k: v.clone() for k, v in getattr(self.exe, "state", {}).items()}

    def _restore_state(self, saved: Mapping[str, Any]) -> None:
        state = getattr(self.exe, "state", {})
        for k, v in saved.items():
            state[k].copy_(v)

    def _sync(self) -> None:
        # GPU executables queue work asynchronously: the host timer must wait for the device (not
        # under Triton's interpreter, where the "GPU" executable runs on the host).
        if self._device_timer():
            import torch

            torch.cuda.synchronize()


def _time(fn: Any, trials: int, sync: Any, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(trials):
        t0 = time.perf_counter_ns()
        fn()
        sync()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    return times


def _stats(times: list[float]) -> dict[str, float]:
    return {
        "median_s": float(np.median(times)),
        "spread_s": float(max(times) - min(times)),
        "total_s": float(sum(times)),  # the controller checks it against its own wall clock
    }


CANARY_N = 64  # the canary's matrix: (i % 7) - 3 over CANARY_N x CANARY_N, exact in f32 (and tf32)
ENGINE_BACKENDS = ("cpu", "cuda", "rocm")  # the backends with a hot-reload shim in the worker
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


def _fill_value(fill: Any, is_float: bool) -> float:
    if fill == "nan":
        return float("nan") if is_float else -(2**30)
    return float(fill) if is_float else int(fill)


def _time_groups_on_device(
    exe: Any, inputs: Mapping[str, np.ndarray], trials: int, only: str | None
) -> tuple[dict, dict[str, int]]:
    """The fast tier on a GPU: each group's launch alone by graph replay with its operands cold in L2
    (GpuExecutable.time_groups), `trials` timed replays each."""
    from polymorph.backends.torch_bridge import to_torch

    device_inputs = {k: to_torch(v, exe.device) for k, v in inputs.items()}
    bindings = exe.bindings_of(device_inputs)
    out = {
        g.id: {"median_s": med, "spread_s": spread * med, "total_s": total}
        for g, med, spread, total in exe.time_groups(device_inputs, only, trials=trials)
    }
    if only is not None and only not in out:
        raise UserError(f"no node group `{only}` in this plan")
    return out, {k: int(v) for k, v in bindings.items()}


def _time_groups(
    exe: Any, inputs: Mapping[str, np.ndarray], trials: int, only: str | None, sync: Any
) -> tuple[dict, dict[str, int]]:
    """Each group's launch alone, on the inputs one step of `inputs` gives it (cpu executable); also
    the symbol bindings of that step (the controller's roofline check needs the shapes)."""
    import torch

    from polymorph.backends.torch_bridge import IR_DTYPE, to_torch
    from polymorph.reference import bind_leaf_shapes

    out: dict[str, dict[str, float]] = {}
    if hasattr(exe, "_operands"):  # a GPU executable without its GPU (Triton's interpreter): host clock
        device_inputs = {k: to_torch(v, exe.device) for k, v in inputs.items()}
        for g, launch, ins, outs in exe._operands(device_inputs):
            if only is None or g.id == only:
                out[g.id] = _stats(_time_rotating(launch, _fresh_sets(ins, set()), outs, trials, sync))
        if only is not None and only not in out:
            raise UserError(f"no node group `{only}` in this plan")
        return out, {k: int(v) for k, v in exe.bindings_of(device_inputs).items()}
    env: dict[str, Any] = {**exe.params, **exe.state}
    env.update({k: to_torch(v) for k, v in inputs.items()})
    bindings = bind_leaf_shapes(exe.graph, {k: (IR_DTYPE[v.dtype], tuple(v.shape)) for k, v in env.items()})
    with torch.inference_mode():
        for group, launch in exe.launches:
            ins = [env[v] for v in group.inputs]
            outs = [exe._output(v, bindings) for v in group.outputs]
            if only is None or group.id == only:
                sets = _fresh_sets(ins, {i for i, v in enumerate(group.inputs) if v in exe.params})
                out[group.id] = _stats(_time_rotating(launch, sets, outs, trials, sync))
            else:
                launch(ins, outs, None)
            env.update(zip(group.outputs, outs, strict=True))
    if only is not None and only not in out:
        raise UserError(f"no node group `{only}` in this plan")
    return out, {k: int(v) for k, v in bindings.items()}


FRESH_SETS = 4  # input sets the cpu fast tier rotates over, so that no two calls in a row see the same


def _fresh_sets(ins: list[Any], weights: set[int]) -> list[list[Any]]:
    """`ins` and FRESH_SETS - 1 variants whose float activations are scaled a little (weights, the
    indices in `weights`, and integer inputs stay as they are): every timed call sees other content
    than the one before, so a kernel that memoizes its last answer gains nothing."""
    from polymorph.backends.gpu.timing import fresh_clone

    return [[t if j in weights else fresh_clone(t, i) for j, t in enumerate(ins)] for i in range(FRESH_SETS)]


def _time_rotating(
    launch: Any, sets: list[list[Any]], outs: list[Any], trials: int, sync: Any
) -> list[float]:
    calls = iter(range(1 << 62))
    return _time(lambda: launch(sets[next(calls) % len(sets)], outs, None), trials, sync)


# --- the process -------------------------------------------------------------------------------------


def serve(listener: socket.socket, worker: Worker) -> None:
    while not worker.stop:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as reader:
            for line in reader:
                if not line.strip():
                    continue
                try:
                    message = protocol.decode(line)
                except protocol.ProtocolError as e:
                    response = protocol.error(None, "bad_request", str(e))
                else:
                    response = worker.handle(message)
                conn.sendall(protocol.encode(response))
                if worker.stop:
                    return


def _watch_stdin() -> None:
    sys.stdin.buffer.read()  # returns at EOF: the controller is gone
    os._exit(0)


def _preload(backend: str) -> None:
    """Do the slow imports (torch, the compile path) before the address is printed, so that a worker
    started ahead of need answers `load` at once. A failure here is left for `load` to report."""
    import importlib

    for module in ("polymorph.api", "polymorph.models", f"polymorph.backends.{backend}.runtime"):
        try:
            importlib.import_module(module)
        except Exception:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polymorph.engine.worker", description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    where.add_argument("--unix", type=Path, help="a unix socket path instead of TCP")
    p.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes")
    p.add_argument(
        "--preload", metavar="BACKEND", help="import the backend's runtime before serving (a standby worker)"
    )
    args = p.parse_args(argv)
    if args.preload:
        _preload(args.preload)
    if args.unix is not None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        args.unix.unlink(missing_ok=True)
        listener.bind(str(args.unix))
        address = protocol.format_address("unix", str(args.unix))
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A replacement worker binds its lost predecessor's port (Controller._restart of an attached
        # engine), which the predecessor's closed connections still hold in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", args.port))
        address = protocol.format_address("tcp", f"127.0.0.1:{listener.getsockname()[1]}")
    listener.listen(1)
    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, daemon=True).start()
    print(address, flush=True)
    # Nothing else goes to stdout: a candidate's prints would fill a pipe nobody reads and hang the
    # worker, or break a detached engine's closed pipe. They go to stderr (the worker's log).
    os.dup2(2, 1)
    try:
        serve(listener, Worker())
    finally:
        listener.close()
        if args.unix is not None:
            args.unix.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
