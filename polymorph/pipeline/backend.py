"""The backend contract, and the registry that finds backends.

A backend is one package under `backends/` (installed as `polymorph.backends.<name>`) exposing one
`Backend` subclass as `BACKEND`, or a third-party package registered in the entry-point group
`polymorph.backends`. Required of every backend, all without the device:
  `targets`  the hardware-profile ids it serves
  `probe()`  what works on this machine (compile, run, measure) and, for what does not, why
  `lower(graph, profile) -> Plan`     node groups with their kernel choices
  `compile(plan, out_dir) -> Artifact` device code and per-kernel resource report
Required with the device: `load(artifact, weights) -> Executable` and `Executable.run`; timing with
device events through `Executable.time`. Everything else is a `Feature` a backend declares.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from polymorph.errors import UserError
from polymorph.hardware.profile import Profile
from polymorph.ir.graph import Graph
from polymorph.pipeline.plan import Plan, Report


class Feature(str, Enum):
    """Optional abilities. A backend lists the ones it has; nothing optional is a stub that raises."""

    RUN = "run"  # load and run plans on this backend's device
    MEASURE = "measure"  # time kernels and steps with device events
    HOT_RELOAD = "hot_reload"  # swap one group's kernel in a loaded executable
    GRAPH_CAPTURE = "graph_capture"  # whole-step capture and replay (CUDA/HIP graphs)
    AOT_COMPILE = "aot_compile"  # compile device code for a target without its device
    ENGINE = "engine"  # its executables speak the persistent engine's runtime contract (EngineRuntime)
    FORK_LOADED = "fork_loaded"  # a loaded executable survives os.fork (no device context to lose)


@dataclass(frozen=True)
class Capability:
    ok: bool
    reason: str = ""  # why not (and how to fix it), or what it runs on


@dataclass(frozen=True)
class Probe:
    """What works on this machine for one backend. Cheap, no side effects, never lies."""

    backend: str
    compile: Capability
    run: Capability
    measure: Capability
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Artifact:
    plan: Plan
    report: Report
    out_dir: Path | None = None
    files: list[str] = field(default_factory=list)  # written device code, relative to out_dir


class Executable(ABC):
    """A loaded plan: weights and state (the KV cache) on the device, ready to run steps."""

    plan: Plan

    @abstractmethod
    def allocate_state(self, cache_blocks: int) -> None:
        """(Re)allocate the KV cache with `cache_blocks` blocks, zero-filled."""

    @abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One step: inputs as numpy arrays in, outputs as numpy arrays out; state updated in place."""

    @abstractmethod
    def read_state(self, name: str) -> np.ndarray:
        """A copy of one state tensor (for the isolation gate and tests)."""

    @abstractmethod
    def weight(self, name: str) -> Any:
        """The executable's own copy of one weight (a device tensor), for tests that corrupt it."""


class EngineRuntime(Executable):
    """The runtime contract the persistent engine's worker speaks to (a backend with Feature.ENGINE).

    Attributes, read and used as they are:
      graph   the plan's graph; `launches`: [(PlanGroup, Launch)] in plan order
      device  the torch device its tensors live on
      params  weight name -> its tensor (the engine fingerprints and passes them; never writes them)
      state   state name -> its tensor (the KV cache; zeroed, saved and restored by the engine)
      alias   output value -> the state it writes in place (cache writes)
      poison  when true, every output is filled with NaN before its kernel runs (verify mode)
      bucketed  false: one launch per group serves every shape (`swap`); true: a group's kernel is
              built per shape bucket (`swap_kernel`, `launches_for`, `launch_of`, `candidate_of`)
    """

    graph: Any
    device: Any
    params: Mapping[str, Any]
    state: Mapping[str, Any]
    alias: Mapping[str, str]
    poison: bool
    bucketed: ClassVar[bool] = False

    @abstractmethod
    def swap(self, group_id: str, launch: Any) -> None:
        """Put `launch` in `group_id`'s place (hot reload); weights and state stay as they are."""


class Backend(ABC):
    name: ClassVar[str]
    language: ClassVar[str]  # the kernel language: kernels/<language>/ holds its kernel library
    targets: ClassVar[tuple[str, ...]]
    features: ClassVar[frozenset[Feature]] = frozenset()

    @abstractmethod
    def probe(self) -> Probe:
        """Report what works here; must be cheap and must not initialize a device context."""

    @abstractmethod
    def lower(
        self,
        graph: Graph,
        profile: Profile,
        bindings: Mapping[str, int] | None = None,
        *,
        unfused: Collection[str] = (),
    ) -> Plan:
        """Cut a verified graph into node groups and choose a kernel (file, hash, config) for each.

        `bindings` (a traffic bucket's dims: batch, seq, ctx_blocks, cache_blocks) are the shapes the
        plan is made and predicted for; kernels may be chosen for them. `unfused` names fusion patterns
        of the backend's table not to use (tensor parallelism keeps the residual add out of the
        row-parallel projections). The plan keeps the graph as given. An op without a kernel raises
        UserError naming the op and the backends that have one.
        """

    @abstractmethod
    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        """Build every kernel of the plan for its target without the device; write device code, plan.json
        and report.json to `out_dir` when given. The report states resources per kernel."""

    def load(self, artifact: Artifact, weights: Mapping[str, np.ndarray]) -> Executable:
        """Load a compiled plan and its weights onto the device (Feature.RUN)."""
        raise UserError(f"backend `{self.name}` cannot run plans on this machine: {self.probe().run.reason}")

    def ops(self) -> set[str]:
        """The op and pattern names its kernel library implements."""
        from polymorph.pipeline.kernel_files import kernel_library

        return {name for k in kernel_library(self.language) for name in k.implements}


# --- the registry ------------------------------------------------------------------------------------

IN_TREE = ("cpu", "cuda", "rocm", "neuron")
ENTRY_POINT_GROUP = "polymorph.backends"


class Registry:
    """Finds backends lazily; a backend that fails to import is remembered with its reason and the
    error is raised only when that backend is asked for by name. Core code asks the registry every
    time (never caches a backend object), so `reload` takes effect everywhere."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Backend]] = {}
        self._failed: dict[str, str] = {}
        self._sources: dict[str, str] = {}
        self._discovered = False

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for name in IN_TREE:
            self._sources[name] = f"polymorph.backends.{name}"
        try:
            eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception as e:  # a broken distribution must not take the in-tree backends down
            self._failed["<entry points>"] = f"{type(e).__name__}: {e}"
            eps = ()
        for ep in eps:
            self._sources.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self._discover()
        return list(self._sources)

    def _load(self, name: str) -> type[Backend]:
        if name in self._classes:
            return self._classes[name]
        source = self._sources[name]
        try:
            module_name, _, attr = source.partition(":")
            module = importlib.import_module(module_name)
            cls = getattr(module, attr or "BACKEND")
            if not (isinstance(cls, type) and issubclass(cls, Backend)):
                raise TypeError(f"{source} is not a polymorph Backend subclass")
        except Exception as e:
            self._failed[name] = f"{type(e).__name__}: {e}"
            raise
        self._classes[name] = cls
        self._failed.pop(name, None)
        return cls

    def get(self, name: str) -> Backend:
        self._discover()
        if name not in self._sources:
            raise UserError(f"unknown backend `{name}`; backends: {', '.join(self.names())}")
        try:
            return self._load(name)()
        except UserError:
            raise
        except Exception:
            raise UserError(f"backend `{name}` failed to load: {self._failed[name]}") from None

    def available(self) -> list[tuple[str, Backend | None, str]]:
        """(name, backend or None, failure reason) for every known backend; never raises."""
        out = []
        for name in self.names():
            try:
                out.append((name, self._load(name)(), ""))
            except Exception:
                out.append((name, None, self._failed.get(name, "failed to load")))
        return out

    def reload(self, name: str) -> Backend:
        """Re-import a backend's modules (hot reload of backend code) and return a fresh instance."""
        self._discover()
        prefix = self._sources[name].partition(":")[0]
        for mod in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
            del sys.modules[mod]
        self._classes.pop(name, None)
        return self.get(name)

    def supporting(self, op: str) -> list[str]:
        """Backends whose kernel library implements `op` (for error messages)."""
        return [name for name, b, _ in self.available() if b is not None and op in b.ops()]


registry = Registry()


def check_profile(backend: Backend, profile: Profile) -> None:
    if profile.id not in backend.targets:
        raise UserError(
            f"backend `{backend.name}` does not serve chip `{profile.id}`; its chips: {', '.join(backend.targets)}"
        )
