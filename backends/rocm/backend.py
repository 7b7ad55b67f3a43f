"""AMD Instinct GPUs (gfx942 MI300X, gfx950 MI355X) through the shared Triton kernel library.

Status: the contract is in place (targets, probe); lowering, AMDGCN/HSACO compile and the HIP
runtime are the work of the NVIDIA/AMD backends issue, so `lower` refuses with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from polymorph.backend import Artifact, Backend, Capability, Feature, Probe
from polymorph.backends import device_probe
from polymorph.errors import UserError
from polymorph.hw import Profile
from polymorph.ir.graph import Graph
from polymorph.plan import Plan

NOT_BUILT = "lowering onto kernels/triton/ for gfx942/gfx950 is not built yet (README status table)"


class RocmBackend(Backend):
    name: ClassVar[str] = "rocm"
    family: ClassVar[str] = "triton"
    targets: ClassVar[tuple[str, ...]] = ("mi355x", "mi300x")
    features: ClassVar[frozenset[Feature]] = frozenset()

    def probe(self) -> Probe:
        gpu = device_probe.amd_device()
        details = {
            "triton": "installed"
            if device_probe.has_module("triton")
            else "missing (pip install 'polymorph[rocm]')",
            "hip-python": "installed" if device_probe.has_module("hip") else "missing",
            "amd device": "present (/dev/kfd)" if gpu else "absent",
        }
        no_gpu = "no AMD GPU on this machine (/dev/kfd absent)" if not gpu else NOT_BUILT
        return Probe(
            self.name,
            Capability(False, NOT_BUILT),
            Capability(False, no_gpu),
            Capability(False, no_gpu),
            details,
        )

    def lower(self, graph: Graph, profile: Profile, bindings: Mapping[str, int] | None = None) -> Plan:
        raise UserError(f"backend `rocm` cannot lower `{graph.name}` for {profile.id}: {NOT_BUILT}")

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        raise UserError(f"backend `rocm` cannot compile: {NOT_BUILT}")
