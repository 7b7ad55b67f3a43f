"""toy-chip: a polymorph backend from outside the tree, as a third party writes one for a chip whose
kernels are an existing language's (here kernels/torch/, the cpu backend's library, on the host CPU).

tests/unit/test_toy_backend.py installs it from a temporary folder through the `polymorph.backends`
entry point, with its profile (toy1.toml, in this folder) in a POLYMORPH_PROFILES directory, and
compiles, runs and verifies llama-tiny with it; README.md "Adding a chip" walks through the same files.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np

from polymorph.cost.model import plan_report
from polymorph.pipeline.backend import Artifact, Capability, Executable, Feature, Probe
from polymorph.pipeline.kernel_files import copy_kernel_sources
from polymorph.pipeline.lowering import KernelLibraryBackend
from polymorph.pipeline.plan import Plan


class ToyChipBackend(KernelLibraryBackend):
    name: ClassVar[str] = "toy-chip"  # the entry point's name
    language: ClassVar[str] = "torch"  # kernels/torch/: its plans name those kernel files
    targets: ClassVar[tuple[str, ...]] = ("toy1",)  # profile ids: toy1.toml names target `cpu`
    features: ClassVar[frozenset[Feature]] = frozenset({Feature.RUN})
    # One of the two fusions kernels/torch/ has kernels for: conformance holds it to this one only.
    patterns: ClassVar[tuple[str, ...]] = ("linear+residual",)
    default_dtype: ClassVar[str] = "f32"

    def probe(self) -> Probe:
        if importlib.util.find_spec("torch") is None:  # find_spec, not import: a probe stays cheap
            missing = Capability(False, "torch is not installed; `pip install torch`")
            return Probe(self.name, missing, missing, missing)
        ok = Capability(True, "torch on the host CPU")
        return Probe(self.name, ok, ok, Capability(False, "toy-chip has no timer (Feature.MEASURE)"))

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        """Build every kernel once (a broken one fails here, not at run); write the kernel sources,
        plan.json and report.json to `out_dir` when given."""
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

    def load(self, artifact: Artifact, weights: Mapping[str, np.ndarray]) -> Executable:
        from polymorph.backends.cpu.runtime import CpuExecutable

        return CpuExecutable(artifact.plan, weights, artifact_dir=artifact.out_dir)


BACKEND = ToyChipBackend
