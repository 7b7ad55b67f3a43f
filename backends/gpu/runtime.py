"""The GPU executable: weights and the paged KV cache in device memory, Triton launches per node
group, and each decode step's launches captured once in a CUDA graph (a HIP graph on ROCm, through
the same torch API) and replayed.

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

from polymorph.backend import Executable
from polymorph.backends.cpu.runtime import state_aliases
from polymorph.backends.torch_bridge import IR_DTYPE, TORCH_DTYPE, to_numpy, to_torch
from polymorph.errors import UserError
from polymorph.hw import load_profile
from polymorph.ir.shapes import concrete
from polymorph.kernel_files import Launch, load_choice
from polymorph.lowering import kernel_spec
from polymorph.passes import specialize
from polymorph.plan import Plan, PlanGroup
from polymorph.reference import bind_leaf_shapes
from polymorph.target import Target


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


class GpuExecutable(Executable):
    def __init__(self, backend: Any, plan: Plan, weights: Mapping[str, np.ndarray], *, device: str | None = None,
                 capture: bool = True, poison: bool = False, artifact_dir: Any = None) -> None:  # fmt: skip
        self.backend = backend
        self.plan = plan
        self.graph = plan.graph
        self.target = Target.parse(plan.target)
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
        key = _key(plan.bindings)
        if plan.bindings:
            self._launches[key] = (self._types(plan.bindings), self._build(plan))

    # --- building --------------------------------------------------------------------------------------

    def _types(self, bindings: Mapping[str, int]) -> dict[str, Any]:
        return specialize(self.graph, bindings).types()

    def _build(self, plan: Plan) -> list[tuple[PlanGroup, Launch]]:
        concrete_graph = specialize(plan.graph, plan.bindings)
        types = concrete_graph.types()
        out = []
        for group in plan.groups:
            kernel = load_choice(group.kernel.file, group.kernel.sha256, self.artifact_dir)
            spec = kernel_spec(concrete_graph, group, types, self.target)
            out.append((group, kernel.build(spec, group.kernel.config, self.target)))
        return out

    def launches_for(self, bindings: Mapping[str, int]) -> list[tuple[PlanGroup, Launch]]:
        key = _key(bindings)
        if key not in self._launches:
            plan = self.backend.lower(self.graph, self.profile, dict(bindings))
            self._launches[key] = (self._types(bindings), self._build(plan))
        return self._launches[key][1]

    def swap(self, group_id: str, launch: Launch) -> None:
        """Use `launch` for `group_id` in every bucket; captured graphs are re-captured on next use."""
        self._overrides[group_id] = launch
        self._captured.clear()

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

    def read_state(self, name: str) -> np.ndarray:
        return to_numpy(self.state[name])

    def weight(self, name: str) -> torch.Tensor:
        return self.params[name]

    # --- running ---------------------------------------------------------------------------------------

    def bindings_of(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        env = {**self.params, **self.state, **inputs}
        return bind_leaf_shapes(self.graph, {k: (IR_DTYPE[v.dtype], tuple(v.shape)) for k, v in env.items()})

    def _forward(
        self, inputs: Mapping[str, torch.Tensor], bindings: Mapping[str, int]
    ) -> dict[str, torch.Tensor]:
        launches = self.launches_for(bindings)
        types = self._launches[_key(bindings)][0]
        env: dict[str, torch.Tensor] = {**self.params, **self.state, **inputs}
        for group, launch in launches:
            launch = self._overrides.get(group.id, launch)
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
            env.update(zip(group.outputs, outs, strict=True))
        return {name: env[v] for name, v in self.graph.outputs.items()}

    def run_device(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step on device tensors, no host copies: replays a captured graph for decode steps."""
        if not self.allocated:
            raise UserError("allocate_state(cache_blocks) must run before the first step")
        bindings = self.bindings_of(inputs)
        if not self.capture or bindings.get("seq", 1) != 1:
            return self._forward(inputs, bindings)
        key = _key(bindings)
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

    def time_groups(
        self, inputs: Mapping[str, torch.Tensor], iters: int = 50
    ) -> list[tuple[PlanGroup, float]]:
        """Median seconds of each group's launch alone, on the inputs one step of `inputs` gives it
        (device events; state is restored afterwards). For per-kernel bandwidth and the cost model."""
        bindings = self.bindings_of(inputs)
        saved = {k: v.clone() for k, v in self.state.items()}
        types = self._types(bindings)
        env: dict[str, torch.Tensor] = {**self.params, **self.state, **inputs}
        out = []
        for group, launch in self.launches_for(bindings):
            ins = [env[v] for v in group.inputs]
            outs = [
                self.state[self.alias[v]]
                if v in self.alias
                else torch.empty(
                    concrete(types[v].shape), dtype=TORCH_DTYPE[types[v].dtype], device=self.device
                )
                for v in group.outputs
            ]
            launch(ins, outs, None)
            torch.cuda.synchronize()
            times = []
            for _ in range(iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launch(ins, outs, None)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            env.update(zip(group.outputs, outs, strict=True))
            out.append((group, sorted(times)[len(times) // 2]))
        for k, v in saved.items():
            self.state[k].copy_(v)
        return out

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {k: to_torch(v, self.device) for k, v in inputs.items()}
        return {k: to_numpy(v) for k, v in self.run_device(tensors).items()}


def _key(bindings: Mapping[str, int]) -> tuple:
    return tuple(sorted(bindings.items()))
