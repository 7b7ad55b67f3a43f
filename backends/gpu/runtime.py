"""The GPU executable: weights and the paged KV cache in device memory, Triton launches per node
group, and each decode step's launches captured once in a CUDA graph (a HIP graph on ROCm, through
the same torch API) and replayed. Inside a captured graph the kernels that take programmatic dependent
launch (decode attention, the projections: kernels/triton/_pdl.py) are captured with launch_pdl=True
where the profile and the installed Triton allow it, chosen when each kernel is built, so a kernel's
launch and prologue overlap the tail of the one before and it waits (griddepcontrol.wait) before it
reads what that one wrote; the interpreter path runs them without.

Kernels are chosen per shape bucket: a step with new dims (batch, seq, ctx_blocks) is lowered for
those dims the first time it is seen (decode and prefill pick different attention kernels). On a
machine without a GPU the same executable runs on "cpu" tensors with TRITON_INTERPRET=1 set before
the kernels load: Triton's interpreter, for numerics checks, with no graph capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polymorph.backends.cpu.runtime import state_aliases
from polymorph.backends.torch_bridge import IR_DTYPE, TORCH_DTYPE, to_numpy, to_torch
from polymorph.errors import UserError
from polymorph.hardware.profile import load_profile
from polymorph.hardware.target import Target
from polymorph.ir.reference import bind_leaf_shapes
from polymorph.ir.shapes import concrete
from polymorph.passes import specialize
from polymorph.pipeline.backend import EngineRuntime
from polymorph.pipeline.kernel_files import Launch, load_choice
from polymorph.pipeline.lowering import kernel_spec
from polymorph.pipeline.plan import Plan, PlanGroup


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


class GpuExecutable(EngineRuntime):
    bucketed = True  # a swapped kernel is built again per shape bucket (swap_kernel)

    def __init__(self, backend: Any, plan: Plan, weights: Mapping[str, np.ndarray], *, device: str | None = None,
                 capture: bool = True, poison: bool = False, artifact_dir: Any = None) -> None:  # fmt: skip
        self.backend = backend
        self.plan = plan
        self.graph = plan.graph
        self.target = Target.parse(plan.target)
        self.chip = plan.kernel_target()  # the traits kernels are built for, as at compile
        self.profile = load_profile(plan.profile)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cpu":
            import os

            if os.environ.get("TRITON_INTERPRET") != "1":
                raise UserError(
                    f"backend `{backend.name}` runs on a GPU; none is visible here ({backend.probe().run.reason})"
                )
        self.capture = capture and self.device.type == "cuda"
        self.poison = poison
        self.artifact_dir = artifact_dir
        self.alias = state_aliases(self.graph)
        self._nodes = {n.name: n for n in self.graph.nodes}  # by name: a prefill step looks up every view
        missing = set(self.graph.params) - set(weights)
        if missing:
            raise UserError(f"weights for {len(missing)} params are missing, e.g. `{sorted(missing)[0]}`")
        # Weights may come as numpy arrays or as torch tensors already made on the device (benchmarks).
        self.params = {
            name: w.to(self.device) if isinstance(w, torch.Tensor) else to_torch(w, self.device)
            for name, w in ((n, weights[n]) for n in self.graph.params)
        }
        self.state: dict[str, torch.Tensor] = {}
        self.allocated = not self.graph.state
        self._launches: dict[tuple, tuple[dict[str, Any], list[tuple[PlanGroup, Launch]]]] = {}
        self._captured: dict[tuple, _Captured] = {}
        self._overrides: dict[str, Launch] = {}
        self._candidates: dict[str, tuple[Any, dict[str, Any]]] = {}  # group id -> (KernelFile, config)
        self._candidate_launches: dict[tuple, Launch | None] = {}  # (group id, bucket) -> launch
        self.fallbacks: dict[str, str] = {}  # "group @ bucket" -> why the stock kernel ran there
        self.collectives: dict[str, Any] = {}  # group id -> run on its outputs after it (tensor_parallel.py)
        self.lower = backend.lower  # how a new shape bucket is lowered (tensor_parallel.py replaces it)
        self._bindings: dict[tuple, dict[str, int]] = {}
        key = _key(plan.bindings)
        if plan.bindings:
            self._launches[key] = (self._types(plan.bindings), self._build(plan))

    # --- building --------------------------------------------------------------------------------------

    def _types(self, bindings: Mapping[str, int]) -> dict[str, Any]:
        return specialize(self.graph, bindings).types()

    def _build(self, plan: Plan) -> list[tuple[PlanGroup, Launch]]:
        concrete_graph, types = plan.concrete()
        out = []
        for group in plan.groups:
            kernel = load_choice(group.kernel.file, group.kernel.sha256, self.artifact_dir)
            spec = kernel_spec(concrete_graph, group, types, self.chip)
            out.append((group, kernel.build(spec, group.kernel.config, self.chip)))
        return out

    def launches_for(self, bindings: Mapping[str, int]) -> list[tuple[PlanGroup, Launch]]:
        key = _key(bindings)
        if key not in self._launches:
            plan = self.lower(self.graph, self.profile, dict(bindings))
            missing = set(self.collectives) - {g.id for g in plan.groups}
            if missing:
                raise UserError(
                    f"the plan at {dict(bindings)} lacks the collective groups {sorted(missing)[:3]}"
                )
            self._launches[key] = (self._types(bindings), self._build(plan))
        return self._launches[key][1]

    def swap(self, group_id: str, launch: Launch) -> None:
        """Use `launch` for `group_id` in every bucket; captured graphs are re-captured on next use."""
        self._overrides[group_id] = launch
        self._captured.clear()

    def swap_kernel(self, group_id: str, kernel: Any, config: Mapping[str, Any] | None) -> None:
        """Hot reload: use kernel file `kernel` with `config` for `group_id`, built per shape bucket
        from that bucket's spec (Triton kernels take their shapes as constexprs), or the stock kernel
        again with `kernel=None`. Weights and the KV cache stay; captured graphs are re-captured on
        their next replay. Where the candidate does not support a bucket's spec (a decode kernel at
        prefill) the stock kernel runs there, and `fallbacks` says so."""
        self._overrides.pop(group_id, None)
        if kernel is None:
            self._candidates.pop(group_id, None)
        else:
            self._candidates[group_id] = (kernel, dict(config or {}))
        self._candidate_launches = {k: v for k, v in self._candidate_launches.items() if k[0] != group_id}
        self.fallbacks = {k: v for k, v in self.fallbacks.items() if not k.startswith(f"{group_id} @ ")}
        self._captured.clear()

    def candidate_of(self, group_id: str) -> tuple[Any, dict[str, Any]] | None:
        """(kernel file, config) swapped into `group_id` by swap_kernel, or None for the stock kernel."""
        return self._candidates.get(group_id)

    def launch_of(self, group: PlanGroup, bindings: Mapping[str, int], stock: Launch) -> Launch:
        """The launch a step at `bindings` runs for `group`: a swapped-in launch, else the candidate
        kernel built for this bucket, else `stock`."""
        if group.id in self._overrides:
            return self._overrides[group.id]
        if group.id not in self._candidates:
            return stock
        key = (group.id, _key(bindings))
        if key not in self._candidate_launches:
            kernel, config = self._candidates[group.id]
            graph = specialize(self.graph, bindings)
            spec = kernel_spec(graph, group, graph.types(), self.chip)
            if kernel.supports(spec):
                self._candidate_launches[key] = kernel.build(spec, config, self.chip)
            else:
                self._candidate_launches[key] = None
                self.fallbacks[f"{group.id} @ {dict(bindings)}"] = (
                    f"{kernel.name} does not support the group's spec here; the stock kernel runs"
                )
        return self._candidate_launches[key] or stock

    # --- state -----------------------------------------------------------------------------------------

    def allocate_state(self, cache_blocks: int) -> None:
        self.state = {
            name: torch.zeros(
                concrete(t.shape, {"cache_blocks": cache_blocks}),
                dtype=TORCH_DTYPE[t.dtype],
                device=self.device,
            )
            for name, t in self.graph.state.items()
        }
        self.allocated = True
        self._captured.clear()  # captured graphs point at the old cache
        self._bindings.clear()  # cache_blocks may have changed

    def read_state(self, name: str) -> np.ndarray:
        return to_numpy(self.state[name])

    def weight(self, name: str) -> torch.Tensor:
        return self.params[name]

    # --- running ---------------------------------------------------------------------------------------

    def bindings_of(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """The symbol bindings of a step on `inputs`. Weights and cache shapes are fixed once the state
        is allocated, so the binding is memoized on the inputs' dtypes and shapes: solving it over
        every leaf costs ~0.2 ms of host time, which a replayed decode step cannot hide."""
        key = tuple((k, v.dtype, tuple(v.shape)) for k, v in sorted(inputs.items()))
        found = self._bindings.get(key)
        if found is None:
            env = {**self.params, **self.state, **inputs}
            found = bind_leaf_shapes(
                self.graph, {k: (IR_DTYPE[v.dtype], tuple(v.shape)) for k, v in env.items()}
            )
            self._bindings[key] = found
        return dict(found)

    def _forward(
        self, inputs: Mapping[str, torch.Tensor], bindings: Mapping[str, int]
    ) -> dict[str, torch.Tensor]:
        launches = self.launches_for(bindings)
        types = self._launches[_key(bindings)][0]
        env: dict[str, torch.Tensor] = {**self.params, **self.state, **inputs}
        for group, launch in launches:
            view = self._view(group, env, types)
            if view is not None:
                env[group.outputs[0]] = view
                continue
            launch = self.launch_of(group, bindings, launch)
            outs = []
            for value in group.outputs:
                if value in self.alias:
                    outs.append(self.state[self.alias[value]])
                    continue
                t = types[value]
                buf = torch.empty(concrete(t.shape), dtype=TORCH_DTYPE[t.dtype], device=self.device)
                if self.poison:
                    buf.fill_(float("nan") if t.dtype.is_float else -(2**30))
                outs.append(buf)
            launch([env[v] for v in group.inputs], outs, None)
            if group.id in self.collectives:
                self.collectives[group.id](outs)
            env.update(zip(group.outputs, outs, strict=True))
        return {name: env[v] for name, v in self.graph.outputs.items()}

    def _view(
        self, group: PlanGroup, env: Mapping[str, torch.Tensor], types: Mapping[str, Any]
    ) -> torch.Tensor | None:
        """A reshape, or a slice whose result is contiguous, as a view of its input: no launch, no copy
        (at decode the head merge and the last-token slice are both). None where a copy is needed or the
        group is swapped for a candidate."""
        if (
            group.pattern not in ("reshape", "slice")
            or group.id in self._overrides
            or group.id in self._candidates
            or group.outputs[0] in self.alias
        ):
            return None
        x = env[group.inputs[0]]
        node = self._nodes[group.nodes[0]]
        if group.pattern == "reshape":
            return x.view(concrete(types[group.outputs[0]].shape)) if x.is_contiguous() else None
        axis = node.attrs["axis"] % x.dim()
        index = [slice(None)] * x.dim()
        index[axis] = slice(node.attrs["start"], node.attrs["end"])
        y = x[tuple(index)]
        return y if y.is_contiguous() else None

    def run_device(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step on device tensors, no host copies: replays a captured graph for decode steps."""
        if not self.allocated:
            raise UserError("allocate_state(cache_blocks) must run before the first step")
        bindings = self.bindings_of(inputs)
        if not self.capture or bindings.get("seq", 1) != 1:
            return self._forward(inputs, bindings)
        key = (_key(bindings), self.poison)  # a graph captured poisoned fills its buffers with NaN
        cap = self._captured.get(key)
        if cap is None:
            cap = self._capture(inputs, bindings)
            self._captured[key] = cap
        for name, t in inputs.items():
            cap.inputs[name].copy_(t, non_blocking=True)
        cap.graph.replay()
        return cap.outputs

    def _capture(self, inputs: Mapping[str, torch.Tensor], bindings: Mapping[str, int]) -> _Captured:
        static = {k: v.clone() for k, v in inputs.items()}
        saved = {k: v.clone() for k, v in self.state.items()}  # warm-up steps must not change the cache
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile every kernel and settle the allocator before capture
                self._forward(static, bindings)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self._forward(static, bindings)
        for k, v in saved.items():
            self.state[k].copy_(v)
        return _Captured(graph, static, outputs)

    def _operands(self, inputs: Mapping[str, torch.Tensor]):
        """Yield (group, launch, ins, outs) of one step on `inputs`, each group run before the next is
        yielded so every group sees the values a step gives it. The caller restores the KV cache."""
        bindings = self.bindings_of(inputs)
        types = self._types(bindings)
        env: dict[str, torch.Tensor] = {**self.params, **self.state, **inputs}
        for g, launch in self.launches_for(bindings):
            view = self._view(g, env, types)
            if view is not None:  # no launch in a step: nothing to time
                env[g.outputs[0]] = view
                continue
            launch = self.launch_of(g, bindings, launch)
            ins = [env[v] for v in g.inputs]
            outs = [
                self.state[self.alias[v]]
                if v in self.alias
                else torch.empty(
                    concrete(types[v].shape), dtype=TORCH_DTYPE[types[v].dtype], device=self.device
                )
                for v in g.outputs
            ]
            launch(ins, outs, None)  # this group's outputs feed the next group's inputs
            env.update(zip(g.outputs, outs, strict=True))
            yield g, launch, ins, outs

    def _l2_bytes(self) -> int:
        return int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 64 << 20))

    def time_groups(
        self, inputs: Mapping[str, torch.Tensor], group: str | None = None, reps: int = 48, trials: int = 7
    ) -> list[tuple[PlanGroup, float, float, float]]:
        """(group, median seconds, spread, total seconds timed) of each group's launch (or only `group`) on the inputs one
        step of `inputs` gives it: graph replay with operands cold in L2 (backends/gpu/timing.py); the
        KV cache is restored afterwards. For per-kernel bandwidth, the cost model and the engine."""
        from polymorph.backends.gpu.timing import time_launch

        saved = {k: v.clone() for k, v in self.state.items()}
        out = []
        try:
            for g, launch, ins, outs in self._operands(inputs):
                if group is None or g.id == group:
                    timed = time_launch(
                        launch, ins, outs, l2_bytes=self._l2_bytes(), reps=reps, trials=trials
                    )
                    out.append((g, *timed))
        finally:
            for k, v in saved.items():
                self.state[k].copy_(v)
        return out

    def time_configs(
        self, inputs: Mapping[str, torch.Tensor], group: str, reps: int = 48
    ) -> list[tuple[dict[str, Any], float, float]]:
        """(config, median seconds, spread) of `group`'s kernel under every config its file declares
        for this target, on the operands a step of `inputs` gives it (the autotuner's measurement)."""
        from polymorph.backends.gpu.timing import time_launch

        bindings = self.bindings_of(inputs)
        concrete_graph = specialize(self.graph, bindings)
        types = concrete_graph.types()
        saved = {k: v.clone() for k, v in self.state.items()}
        out = []
        try:
            for g, _launch, ins, outs in self._operands(inputs):
                if g.id != group:
                    continue
                kernel = load_choice(g.kernel.file, g.kernel.sha256, self.artifact_dir)
                spec = kernel_spec(concrete_graph, g, types, self.chip)
                for config in kernel.configs_for(self.chip):
                    launch = kernel.build(spec, config, self.chip)
                    med, spread, _ = time_launch(launch, ins, outs, l2_bytes=self._l2_bytes(), reps=reps)
                    out.append((config, med, spread))
                break
        finally:
            for k, v in saved.items():
                self.state[k].copy_(v)
        if not out:
            raise UserError(f"no node group `{group}` in this plan")
        return out

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {k: to_torch(v, self.device) for k, v in inputs.items()}
        return {k: to_numpy(v) for k, v in self.run_device(tensors).items()}


def _key(bindings: Mapping[str, int]) -> tuple:
    return tuple(sorted(bindings.items()))
