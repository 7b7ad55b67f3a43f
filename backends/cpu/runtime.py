"""The cpu backend's executable: weights and the paged KV cache as torch tensors, one launch per group."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from polymorph.backends.torch_bridge import IR_DTYPE, TORCH_DTYPE, share_torch, to_numpy, to_torch
from polymorph.errors import UserError
from polymorph.hardware.target import Target
from polymorph.ir.graph import Graph
from polymorph.ir.reference import bind_leaf_shapes
from polymorph.ir.shapes import concrete
from polymorph.pipeline.backend import EngineRuntime
from polymorph.pipeline.kernel_files import Launch, load_choice
from polymorph.pipeline.lowering import kernel_spec
from polymorph.pipeline.plan import Plan, PlanGroup


def state_aliases(graph: Graph) -> dict[str, str]:
    """kv_write result value -> the state tensor it is (writes happen in place)."""
    alias: dict[str, str] = {}
    for node in graph.nodes:
        if node.op == "kv_write":
            cache = node.inputs[0]
            alias[node.outputs[0]] = cache if cache in graph.state else alias[cache]
    return alias


def build_launches(plan: Plan, artifact_dir: Path | None = None) -> list[tuple[PlanGroup, Launch]]:
    types = plan.graph.types()
    target = Target.parse(plan.target)
    launches = []
    for group in plan.groups:
        kernel = load_choice(group.kernel.file, group.kernel.sha256, artifact_dir)
        spec = kernel_spec(plan.graph, group, types, target)
        launches.append((group, kernel.build(spec, group.kernel.config, target)))
    return launches


class CpuExecutable(EngineRuntime):
    def __init__(
        self,
        plan: Plan,
        weights: Mapping[str, np.ndarray],
        *,
        poison: bool = False,
        artifact_dir: Path | None = None,
        threads: int | None = None,
    ) -> None:
        self.plan = plan
        self.graph = plan.graph
        self.device = torch.device("cpu")
        self.poison = poison  # fill every output with NaN before its kernel runs (verify mode)
        self.types = self.graph.types()
        self.alias = state_aliases(self.graph)
        missing = set(self.graph.params) - set(weights)
        if missing:
            raise UserError(f"weights for {len(missing)} params are missing, e.g. `{sorted(missing)[0]}`")
        # Weights mapped read-only from the engine controller's arena are used where they lie (a write
        # to them faults); any other array is copied.
        self.params = {
            name: share_torch(w) if not w.flags.writeable and w.flags.c_contiguous else to_torch(w)
            for name, w in ((n, weights[n]) for n in self.graph.params)
        }
        self.threads = threads or auto_threads(sum(p.numel() for p in self.params.values()))
        # torch's thread count is process-wide: the executable sets it once for its process.
        torch.set_num_threads(self.threads)
        self.state: dict[str, torch.Tensor] = {}
        self.allocated = not self.graph.state  # a graph without state needs no allocate_state
        self.launches = build_launches(plan, artifact_dir)
        self._bindings: dict[tuple, dict[str, int]] = {}
        self._shapes: dict[tuple, tuple[int, ...]] = {}  # (value, *bindings) -> concrete shape

    def allocate_state(self, cache_blocks: int) -> None:
        self.state = {
            name: torch.zeros(concrete(t.shape, {"cache_blocks": cache_blocks}), dtype=TORCH_DTYPE[t.dtype])
            for name, t in self.graph.state.items()
        }
        self.allocated = True
        self._bindings.clear()  # cache_blocks may have changed
        self._shapes.clear()

    def swap(self, group_id: str, launch: Launch) -> None:
        """Replace one group's launch (hot reload); weights and state stay as they are."""
        for i, (group, _) in enumerate(self.launches):
            if group.id == group_id:
                self.launches[i] = (group, launch)
                return
        raise UserError(f"no node group `{group_id}` in this plan")

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run(inputs)

    def time_in_step(
        self, inputs: Callable[[], Mapping[str, np.ndarray]], trials: int
    ) -> tuple[dict[str, float], float]:
        """(median seconds of each group inside whole steps, median seconds of a whole step), over
        `trials` pairs of steps on fresh `inputs()`: a plain step, then one that times each group (its
        output buffers, its launch, its entry in the value table). What a group costs where it runs,
        beside the fast tier's time of the group alone in a loop (where a host-bound kernel runs hotter);
        the pairs interleave, so a machine's drift shows in both alike."""
        import statistics

        seen: dict[str, list[float]] = {}
        steps = []
        for _ in range(trials):
            step_inputs = inputs()
            t0 = time.perf_counter()
            self._run(step_inputs)
            steps.append(time.perf_counter() - t0)
            self._run(inputs(), observe=lambda group, seconds: seen.setdefault(group, []).append(seconds))
        return {group: statistics.median(times) for group, times in seen.items()}, statistics.median(steps)

    def _run(
        self, inputs: Mapping[str, np.ndarray], observe: Callable[[str, float], None] | None = None
    ) -> dict[str, np.ndarray]:
        if not self.allocated:
            raise UserError("allocate_state(cache_blocks) must run before the first step")
        env: dict[str, torch.Tensor] = {**self.params, **self.state}
        env.update({k: to_torch(v) for k, v in inputs.items()})
        # Weight and cache shapes are fixed once the state is allocated: the binding is solved once per
        # input shape (solving it over every leaf each step cost more than a tiny model's kernels).
        key = tuple((k, env[k].dtype, tuple(env[k].shape)) for k in sorted(inputs))
        bindings = self._bindings.get(key)
        if bindings is None:
            bindings = bind_leaf_shapes(
                self.graph, {k: (IR_DTYPE[v.dtype], tuple(v.shape)) for k, v in env.items()}
            )
            self._bindings[key] = bindings
        with torch.inference_mode():
            for group, launch in self.launches:
                t0 = time.perf_counter() if observe is not None else 0.0
                outs = [self._output(v, bindings) for v in group.outputs]
                launch([env[v] for v in group.inputs], outs, None)
                env.update(zip(group.outputs, outs, strict=True))
                if observe is not None:
                    observe(group.id, time.perf_counter() - t0)
        return {name: to_numpy(env[v]) for name, v in self.graph.outputs.items()}

    def _output(self, value: str, bindings: dict[str, int]) -> torch.Tensor:
        if value in self.alias:
            return self.state[self.alias[value]]
        t = self.types[value]
        key = (value, *sorted(bindings.items()))
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = concrete(t.shape, bindings)
        out = torch.empty(shape, dtype=TORCH_DTYPE[t.dtype])
        if self.poison:
            out.fill_(float("nan") if t.dtype.is_float else -(2**30))
        return out

    def host_ops(self, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
        """How many torch ops each group dispatches in one step on `inputs` (counted below autograd,
        at the aten dispatcher; untimed): what the cost model charges per op beyond a kernel's first.
        The step runs for real: it writes the KV cache like any step."""
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                Count.n += 1
                return func(*args, **(kwargs or {}))

        counts: dict[str, int] = {}
        launches = self.launches
        try:
            self.launches = [(g, _counted(g.id, launch, Count, counts)) for g, launch in launches]
            self.run(inputs)
        finally:
            self.launches = launches
        return counts

    def read_state(self, name: str) -> np.ndarray:
        return to_numpy(self.state[name])

    def weight(self, name: str) -> torch.Tensor:
        return self.params[name]


def _counted(group_id: str, launch: Launch, mode: type, counts: dict[str, int]) -> Launch:
    def run(inputs: list[torch.Tensor], outputs: list[torch.Tensor], scratch: object) -> None:
        mode.n = 0
        with mode():
            launch(inputs, outputs, scratch)
        counts[group_id] = mode.n

    return run


def auto_threads(weight_elements: int) -> int:
    """One thread for small models: below ~16M weights a step is a few microseconds of GEMV per
    kernel, and waking OpenMP workers costs more than it saves (1.5 ms vs 64 ms per llama-tiny step
    on a loaded 2-core machine, measured). Larger models use every core."""
    from polymorph.knobs import knobs

    if knobs.cpu_threads:
        return knobs.cpu_threads
    return 1 if weight_elements < 16_000_000 else (os.cpu_count() or 1)
