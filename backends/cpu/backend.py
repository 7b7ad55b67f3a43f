"""The cpu backend's lowering and compile: plan onto kernels/torch/, copy the kernel sources out."""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import ClassVar

from polymorph.backend import Artifact, Backend, Capability, Feature, Probe, check_profile
from polymorph.hw import Profile
from polymorph.ir.graph import Graph
from polymorph.kernel_files import copy_kernel_sources
from polymorph.lowering import lower_onto_library
from polymorph.passes import select_patterns
from polymorph.plan import Plan
from polymorph.predict import plan_report

# The fusions kernels/torch/ has kernels for: one less round trip through memory per pattern.
CPU_PATTERNS = ("linear+silu*mul", "linear+residual")


class CpuBackend(Backend):
    name: ClassVar[str] = "cpu"
    family: ClassVar[str] = "torch"
    targets: ClassVar[tuple[str, ...]] = ("cpu",)
    features: ClassVar[frozenset[Feature]] = frozenset({Feature.RUN, Feature.MEASURE, Feature.HOT_RELOAD})

    def probe(self) -> Probe:
        # find_spec, not import: probing must stay cheap and side-effect free.
        if importlib.util.find_spec("torch") is None:
            missing = Capability(False, "torch is not installed; `pip install polymorph` brings it")
            return Probe(self.name, missing, missing, missing)
        ok = Capability(True, "torch on the host CPU")
        return Probe(self.name, ok, ok, Capability(True, "host wall clock (perf_counter_ns)"))

    def lower(
        self,
        graph: Graph,
        profile: Profile,
        bindings: Mapping[str, int] | None = None,
        *,
        unfused: Collection[str] = (),
    ) -> Plan:
        check_profile(self, profile)
        library_call = {name: "torch" for name in ("linear", "attention", "moe", "swiglu", "linear_residual")}
        return lower_onto_library(
            self.name,
            self.family,
            graph,
            profile,
            select_patterns(p for p in CPU_PATTERNS if p not in unfused),
            library_call=library_call,
            bindings=bindings,
        )

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        """The cpu 'device code' is the kernel sources themselves: each one is built once here (so a
        broken kernel fails at compile, not at run) and copied into `out_dir/kernels/<sha256>.py`."""
        from polymorph.backends.cpu.runtime import build_launches

        build_launches(plan)
        report = plan_report(plan, resources_of=lambda group: {})
        artifact = Artifact(plan, report, out_dir)
        if out_dir is not None:
            artifact.files += copy_kernel_sources(plan, out_dir)
            plan.save(out_dir)
            report.artifacts = sorted(artifact.files)
            report.save(out_dir)
        return artifact

    def load(self, artifact: Artifact, weights):  # type: ignore[override]
        from polymorph.backends.cpu.runtime import CpuExecutable

        return CpuExecutable(artifact.plan, weights, artifact_dir=artifact.out_dir)
