"""The backend contract, and the registry that finds backends.

A backend is one package under `backends/` (installed as `polymorph.backends.<name>`) exposing one
`Backend` subclass as `BACKEND`, found by reading that folder (no list of names), or a third-party
package registered in the entry-point group `polymorph.backends` (any name, hyphens too). Required of
every backend, all without the device:
  `targets`  the hardware-profile ids it serves
  `probe()`  what works on this machine (compile, run, measure) and, for what does not, why
  `lower(graph, profile) -> Plan`     node groups with their kernel choices
  `compile(plan, out_dir) -> Artifact` device code and per-kernel resource report
Required with the device: `load(artifact, weights) -> Executable` and `Executable.run`; timing with
device events through `Executable.time`. Everything else is a `Feature` a backend declares.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
import sys
import threading
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
    name: ClassVar[str]  # as registered: its package's folder name, or its entry point's name
    language: ClassVar[str]  # the kernel language: kernels/<language>/ holds its kernel library
    targets: ClassVar[tuple[str, ...]]
    features: ClassVar[frozenset[Feature]] = frozenset()
    patterns: ClassVar[tuple[str, ...]] = ()  # the fusion patterns it opts into (polymorph.passes)
    default_dtype: ClassVar[str] = "bf16"  # the dtype commands load a model in when given no --dtype

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
        row-parallel projections). The plan keeps the graph symbolic (a kernel-library backend's, after the
        compile stages' dce: polymorph/pipeline/stages.py). An op without a kernel raises UserError
        naming the op and the backends that have one.
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

IN_TREE_PACKAGE = "polymorph.backends"  # its folder (backends/ in a checkout) holds the in-tree backends
ENTRY_POINT_GROUP = "polymorph.backends"
# A backend's name is a CLI argument, a plan field and part of registry keys: letters, digits, `-`, `_`, `.`.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Source:
    """Where a backend comes from: `module` (and `attr` in it, default BACKEND), found in `origin`."""

    module: str
    attr: str
    origin: str  # "in-tree" or "entry point <value> of <distribution>"


def binds_backend(init: Path) -> bool:
    """Whether a package's `__init__.py` binds `BACKEND` at top level, read (not imported): so that
    finding backends imports none of them, and shared glue (backends/gpu/) is passed over quietly. A
    file that does not parse counts as a backend, so that importing it reports the error by name."""
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    except (OSError, UnicodeDecodeError):
        return False
    except SyntaxError:
        return True
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BACKEND" for t in node.targets
        ):
            return True
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "BACKEND"
        ):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "BACKEND" for a in node.names):
            return True
    return False


def in_tree_sources(locations: Collection[str] | None = None) -> dict[str, Source]:
    """The packages in the folder of `polymorph.backends` (or in `locations`) whose `__init__.py` binds
    BACKEND, by folder name, sorted. Modules (device_probe.py, torch_bridge.py) and packages without
    BACKEND (gpu/) are not backends."""
    if locations is None:
        spec = importlib.util.find_spec(IN_TREE_PACKAGE)
        locations = (spec.submodule_search_locations or []) if spec is not None else []
    found: dict[str, Source] = {}
    for location in locations:
        for info in sorted(pkgutil.iter_modules([location]), key=lambda i: i.name):
            init = Path(location) / info.name / "__init__.py"
            if info.ispkg and info.name not in found and binds_backend(init):
                found[info.name] = Source(f"{IN_TREE_PACKAGE}.{info.name}", "BACKEND", "in-tree")
    return found


class Registry:
    """Finds backends lazily: the folder of `polymorph.backends` is read and the entry-point group is
    listed, but no backend is imported until it is asked for. A backend that fails to import is
    remembered with its reason, and the error is raised only when that backend is asked for by name.
    Core code asks the registry every time (never caches a backend object), so `reload` takes effect
    everywhere."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Backend]] = {}
        self._failed: dict[str, str] = {}
        self._sources: dict[str, Source] = {}
        self._unlisted: list[tuple[str, str]] = []  # (what, why): entry points that are not backends here
        self._discovered = False
        self._lock = threading.Lock()  # threads ask at once (the demo loads an engine in one)

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if not self._discovered:
                self._discover_now()
                self._discovered = True  # only once every source is in: another thread reads them

    def _discover_now(self) -> None:
        try:
            self._sources.update(in_tree_sources())
        except Exception as e:  # an unreadable install must not take the entry points down
            self._unlisted.append(("<in-tree backends>", f"{type(e).__name__}: {e}"))
        try:
            eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
        except Exception as e:  # a broken distribution must not take the in-tree backends down
            self._unlisted.append(("<entry points>", f"{type(e).__name__}: {e}"))
            eps = []
        for ep in eps:
            dist = getattr(getattr(ep, "dist", None), "name", None) or "an unnamed distribution"
            source = Source(ep.module, ep.attr or "BACKEND", f"entry point `{ep.value}` of {dist}")
            known = self._sources.get(ep.name)
            if not _NAME.fullmatch(ep.name):
                self._unlisted.append(
                    (ep.name, f"{source.origin}: not a backend name (letters, digits, -_.)")
                )
            elif known is None:
                self._sources[ep.name] = source
            elif (known.module, known.attr) != (source.module, source.attr):
                self._unlisted.append((ep.name, f"{source.origin}: shadowed by the {known.origin} backend"))

    def names(self) -> list[str]:
        self._discover()
        return list(self._sources)

    def source(self, name: str) -> Source:
        self._discover()
        return self._sources[name]

    def _load(self, name: str) -> type[Backend]:
        if name in self._classes:
            return self._classes[name]
        source = self._sources[name]
        try:
            obj: Any = importlib.import_module(source.module)
            for part in source.attr.split("."):
                obj = getattr(obj, part)
            if not (isinstance(obj, type) and issubclass(obj, Backend)):
                raise TypeError(f"{source.module}:{source.attr} is not a polymorph Backend subclass")
            if getattr(obj, "name", None) != name:
                raise TypeError(
                    f"{source.module}:{source.attr} calls itself `{getattr(obj, 'name', None)}`, but it is "
                    f"registered as `{name}` ({source.origin}); the two names must be the same"
                )
        except Exception as e:
            self._failed[name] = f"{type(e).__name__}: {e}"
            raise
        self._classes[name] = obj
        self._failed.pop(name, None)
        return obj

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
        """(name, backend or None, failure reason) for every known backend, then every entry point
        that is not one (shadowed, misnamed); never raises."""
        out: list[tuple[str, Backend | None, str]] = []
        for name in self.names():
            try:
                out.append((name, self._load(name)(), ""))
            except Exception:
                out.append((name, None, self._failed.get(name, "failed to load")))
        return out + [(what, None, why) for what, why in self._unlisted]

    def reload(self, name: str) -> Backend:
        """Re-import a backend's modules (hot reload of backend code) and return a fresh instance."""
        self._discover()
        prefix = self._sources[name].module
        for mod in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
            del sys.modules[mod]
        self._classes.pop(name, None)
        return self.get(name)

    def with_feature(self, feature: Feature) -> list[str]:
        """Backends that declare `feature` (for error messages); those that fail to load are left out."""
        return [name for name, b, _ in self.available() if b is not None and feature in b.features]

    def supporting(self, op: str) -> list[str]:
        """Backends whose kernel library implements `op` (for error messages)."""
        return [name for name, b, _ in self.available() if b is not None and op in b.ops()]


registry = Registry()


def check_profile(backend: Backend, profile: Profile) -> None:
    # A chip is served when the backend lists it or its profile names the backend (a new chip is one
    # profile file, hwprofiles/ or POLYMORPH_PROFILES).
    if profile.id not in backend.targets and profile.backend != backend.name:
        raise UserError(
            f"backend `{backend.name}` does not serve chip `{profile.id}`; its chips: {', '.join(backend.targets)}"
        )
