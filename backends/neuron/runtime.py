"""The neuron executable: the plan's step as one jitted JAX function, weights and KV cache as jax
arrays on one device, the cache threaded from step to step (donated, so XLA updates it in place).

Where it runs:
  "neuron"  a NeuronCore through jax-neuronx (AWS's PJRT plugin, libneuronxla), when /dev/neuron0
            exists and jax_neuronx is installed: the plugin compiles each step's module with
            neuronx-cc (flags through NEURON_CC_FLAGS). Written against AWS's documentation;
            UNPROVEN here: no Trainium device or Neuron toolchain is reachable from our machines.
  "cpu"     XLA's CPU backend, everywhere else: the same functions, the same lowering, for numerics
            (what the tests check against the reference engine); its times are CPU times, not trn2's.

Each set of dims (batch, seq, ctx_blocks, cache_blocks) is one jitted function, built the first time
a step with those dims runs (a prefill and a decode are two), as each Neuron bucket is one NEFF.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.backends import device_probe
from polymorph.backends.neuron.neuronxcc import flags
from polymorph.backends.neuron.step import Signature, jax_dtype, step_function
from polymorph.errors import UserError
from polymorph.ir import serialize
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.ir.reference import bind_leaf_shapes
from polymorph.ir.shapes import concrete
from polymorph.pipeline.backend import Executable
from polymorph.pipeline.plan import Plan

# Jitted steps shared by executables of the same plan (the conformance tests load one per sample):
# key = (graph hash, kernels and configs, dims, platform). Hot-swapped executables keep their own.
_SHARED_STEPS: OrderedDict[tuple, tuple[Callable[..., Any], Signature]] = OrderedDict()
_SHARED_LIMIT = 128


def platform_here() -> str:
    """ "neuron" where a Neuron device and jax-neuronx are both present, else "cpu"."""
    if device_probe.neuron_device() and device_probe.has_module("jax_neuronx"):
        return "neuron"
    return "cpu"


def jax_device(platform: str) -> Any:
    import jax

    if platform == "neuron":
        # NEURON_CC_FLAGS is how the Neuron PJRT plugin takes compiler flags (Neuron docs); a
        # value the user set wins.
        os.environ.setdefault("NEURON_CC_FLAGS", " ".join(flags()[4:]))  # model type, no auto-cast
        try:
            import jax_neuronx  # noqa: F401  (registers Neuron features; the plugin is libneuronxla)

            return jax.devices("neuron")[0]
        except Exception as e:  # the plugin failed to start: say so, in one line
            raise UserError(
                f"the Neuron device cannot be used through JAX: {type(e).__name__}: {e}"
            ) from None
    return jax.devices("cpu")[0]


class NeuronExecutable(Executable):
    def __init__(
        self,
        plan: Plan,
        weights: Mapping[str, np.ndarray],
        *,
        platform: str | None = None,
        artifact_dir: Path | None = None,
        poison: bool = False,
    ) -> None:
        import jax

        self.plan = plan
        self.graph: Graph = plan.graph
        self.platform = platform or platform_here()
        self.device = jax_device(self.platform)
        self.artifact_dir = artifact_dir
        # Verify mode flag, accepted for the common contract: an XLA launch returns fresh arrays and
        # cannot leave an output unwritten, so there is nothing to poison; a kv_write that skips
        # rows is caught by comparing the whole cache.
        self.poison = poison
        missing = set(self.graph.params) - set(weights)
        if missing:
            raise UserError(f"weights for {len(missing)} params are missing, e.g. `{sorted(missing)[0]}`")
        self.params = {
            name: jax.device_put(_to_jax(name, weights[name]), self.device) for name in self.graph.params
        }
        self.state: dict[str, Any] = {}
        self._allocated = False
        self._overrides: dict[str, Callable[[Any], Any]] = {}
        self._steps: dict[tuple, tuple[Callable[..., Any], Signature]] = {}
        self._addresses = cache_addresses(self.graph)
        self._plan_key = (
            serialize.content_hash(self.graph),
            tuple((g.id, g.kernel.sha256, repr(sorted(g.kernel.config.items()))) for g in plan.groups),
        )

    # --- the Executable contract ---------------------------------------------------------------------

    def allocate_state(self, cache_blocks: int) -> None:
        import jax

        # Zeros made on the host and copied over: no device computation to compile (on a NeuronCore
        # every distinct computation is a neuronx-cc run).
        self.state = {
            name: jax.device_put(
                np.zeros(concrete(t.shape, {"cache_blocks": cache_blocks}), dtype=jax_dtype(t.dtype)),
                self.device,
            )
            for name, t in self.graph.state.items()
        }
        self._allocated = True

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        fn, signature, args = self._prepare(inputs)
        results = fn(*args)
        return self._finish(signature, results)

    def read_state(self, name: str) -> np.ndarray:
        return _to_numpy(self.state[name], self.graph.state[name].dtype)

    def weight(self, name: str) -> Any:
        """The executable's jax array for param `name`. JAX arrays are immutable: replace one with
        `set_weight` (what a test that corrupts a weight does)."""
        return self.params[name]

    def set_weight(self, name: str, value: np.ndarray) -> None:
        import jax

        if name not in self.params:
            raise UserError(f"no param `{name}` in this plan")
        self.params[name] = jax.device_put(_to_jax(name, value), self.device)

    # --- hot reload and timing -----------------------------------------------------------------------

    def swap(self, group_id: str, build: Callable[[Any], Any]) -> None:
        """Replace one group's kernel: `build(spec)` returns its XLA launch for a concrete KernelSpec.
        Weights and state stay; every jitted step is rebuilt on its next run (XLA recompiles the
        step; the per-group compile cache is what keeps NEFF rebuilds to the changed group)."""
        self.plan.group(group_id)  # UserError for an unknown id
        self._overrides[group_id] = build
        self._steps.clear()

    def time_step(self, inputs: Mapping[str, np.ndarray], iters: int = 20) -> dict[str, Any]:
        """Median wall time of one step on this executable's device, after one untimed run that
        compiles it; the state is restored afterwards. On "cpu" this is a CPU time, not a trn2 time."""
        import jax
        import jax.numpy as jnp

        if iters < 1:
            raise UserError("iters must be at least 1")
        saved = {k: jnp.array(v, copy=True) for k, v in self.state.items()}
        fn, signature, args = self._prepare(inputs)
        times = []
        for i in range(iters + 1):
            if i:
                args = self._args(signature, inputs)  # the state was donated to the previous call
            t0 = time.perf_counter()
            results = jax.block_until_ready(fn(*args))
            if i:
                times.append(time.perf_counter() - t0)
            self.state = dict(zip(self.graph.state, results[signature.n_outputs :], strict=True))
        self.state = saved
        return {"median_s": statistics.median(times), "iters": iters, "platform": self.platform}

    # --- internals -----------------------------------------------------------------------------------

    def _prepare(self, inputs: Mapping[str, np.ndarray]) -> tuple[Callable[..., Any], Signature, list[Any]]:
        if self.graph.state and not self._allocated:
            raise UserError("allocate_state(cache_blocks) must run before the first step")
        leaves = {
            name: (t.dtype, tuple(int(d) for d in self.params[name].shape))
            for name, t in self.graph.params.items()
        }
        leaves.update(
            {name: (self.graph.state[name].dtype, tuple(v.shape)) for name, v in self.state.items()}
        )
        for name, arr in inputs.items():
            try:
                leaves[name] = (DType.of(np.asarray(arr)), tuple(np.shape(arr)))
            except ValueError:
                raise UserError(f"`{name}` is {np.asarray(arr).dtype}, which no IR dtype stores") from None
        bindings = bind_leaf_shapes(self.graph, leaves)
        check_cache_addresses(self._addresses, inputs)
        fn, signature = self._step(bindings)
        return fn, signature, self._args(signature, inputs)

    def _args(self, signature: Signature, inputs: Mapping[str, np.ndarray]) -> list[Any]:
        import jax

        args = []
        for leaf in signature.leaves:
            if leaf.kind == "param":
                args.append(self.params[leaf.name])
            elif leaf.kind == "state":
                args.append(self.state[leaf.name])
            else:
                args.append(jax.device_put(_to_jax(leaf.name, np.asarray(inputs[leaf.name])), self.device))
        return args

    def _finish(self, signature: Signature, results: tuple[Any, ...]) -> dict[str, np.ndarray]:
        outs = {}
        for (name, t), value in zip(signature.outputs[: signature.n_outputs], results, strict=False):
            outs[name] = _to_numpy(value, t.dtype)
        self.state = dict(zip(self.graph.state, results[signature.n_outputs :], strict=True))
        return outs

    def _step(self, bindings: Mapping[str, int]) -> tuple[Callable[..., Any], Signature]:
        import jax

        dims = tuple(sorted(bindings.items()))
        if dims in self._steps:
            return self._steps[dims]
        shared_key = (*self._plan_key, dims, self.platform)
        if not self._overrides and shared_key in _SHARED_STEPS:
            _SHARED_STEPS.move_to_end(shared_key)
            self._steps[dims] = _SHARED_STEPS[shared_key]
            return self._steps[dims]
        step = step_function(self.plan, bindings, artifact_dir=self.artifact_dir, overrides=self._overrides)
        # On XLA's CPU backend (numerics, not speed) LLVM runs unoptimized: the same HLO, compiled
        # in about half the time; its GEMMs and convolutions are library calls either way.
        options = {"xla_backend_optimization_level": 0} if self.platform == "cpu" else None
        jitted = jax.jit(
            step.fn, keep_unused=True, donate_argnums=step.signature.state_argnums, compiler_options=options
        )
        self._steps[dims] = (jitted, step.signature)
        if not self._overrides:
            _SHARED_STEPS[shared_key] = self._steps[dims]
            while len(_SHARED_STEPS) > _SHARED_LIMIT:
                _SHARED_STEPS.popitem(last=False)
        return self._steps[dims]


def cache_addresses(graph: Graph) -> list[tuple[str, str, int]]:
    """(block_table input, positions input, block size) of every paged-cache op that reads inputs."""
    types = graph.types()
    out = []
    for node in graph.nodes:
        if node.op == "kv_write":
            cache, table, pos = node.inputs[0], node.inputs[2], node.inputs[3]
        elif node.op == "cache_attention":
            cache, table, pos = node.inputs[1], node.inputs[3], node.inputs[4]
        else:
            continue
        block_size = types[cache].shape[1]
        if table in graph.inputs and pos in graph.inputs and isinstance(block_size, int):
            out.append((table, pos, block_size))
    return list(dict.fromkeys(out))


def check_cache_addresses(addresses: list[tuple[str, str, int]], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse, on the host, a step whose positions fall outside its block table (the reference
    raises; a device kernel cannot, and would clamp or drop the write silently)."""
    for table, pos, block_size in addresses:
        positions, blocks = np.asarray(inputs[pos]), np.shape(inputs[table])[1]
        if positions.size and (positions.min() < 0 or (positions // block_size).max() >= blocks):
            raise UserError(
                f"a position is outside the block table (positions {positions.min()}..{positions.max()}, "
                f"{blocks} blocks of {block_size})"
            )


def _to_jax(name: str, arr: np.ndarray) -> np.ndarray:
    """A host array in the dtype JAX holds it in (i64 narrowed to i32 unless x64 is on)."""
    arr = np.asarray(arr)
    try:
        want = jax_dtype(DType.of(arr))
    except ValueError:
        raise UserError(f"`{name}` is {arr.dtype}, which no IR dtype stores") from None
    if arr.dtype == want:
        return arr
    info = np.iinfo(want)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise UserError(f"`{name}` has values outside {want} (JAX runs without 64-bit integers)")
    return arr.astype(want)


def _to_numpy(value: Any, dtype: DType) -> np.ndarray:
    arr = np.array(value)  # a copy, writable, bf16 and fp8 as ml_dtypes arrays
    return arr if arr.dtype == dtype.numpy else arr.astype(dtype.numpy)
