"""The cpu backend's lowering and compile: plan onto kernels/torch/, copy the kernel sources out."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from polymorph.cost.model import plan_report
from polymorph.pipeline.backend import Artifact, Capability, Feature, Probe
from polymorph.pipeline.kernel_files import copy_kernel_sources
from polymorph.pipeline.lowering import KernelLibraryBackend
from polymorph.pipeline.plan import Plan

# The fusions kernels/torch/ has kernels for: one less round trip through memory per pattern.
CPU_PATTERNS = ("linear+silu*mul", "linear+residual")


class CpuBackend(KernelLibraryBackend):
    name: ClassVar[str] = "cpu"
    language: ClassVar[str] = "torch"
    targets: ClassVar[tuple[str, ...]] = ("cpu",)
    features: ClassVar[frozenset[Feature]] = frozenset(
        {Feature.RUN, Feature.MEASURE, Feature.HOT_RELOAD, Feature.ENGINE, Feature.FORK_LOADED}
    )
    patterns: ClassVar[tuple[str, ...]] = CPU_PATTERNS
    default_dtype: ClassVar[str] = "f32"  # what `compile`/`run`/`verify` load a model in without --dtype
    library_calls: ClassVar[Mapping[str, str]] = dict.fromkeys(
        ("linear", "attention", "moe", "swiglu", "linear_residual"), "torch"
    )

    def probe(self) -> Probe:
        # find_spec, not import: probing must stay cheap and side-effect free.
        if importlib.util.find_spec("torch") is None:
            missing = Capability(False, "torch is not installed; `pip install polymorph` brings it")
            return Probe(self.name, missing, missing, missing)
        ok = Capability(True, "torch on the host CPU")
        return Probe(self.name, ok, ok, Capability(True, "host wall clock (perf_counter_ns)"))

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
