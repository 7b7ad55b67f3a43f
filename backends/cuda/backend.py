"""NVIDIA GPUs (sm_90 H100/H200, sm_100 B200, sm_103 GB300) through the shared Triton kernel library.

Status: the contract is in place (targets, probe); lowering onto kernels/triton/ and the runtime are
the work of the NVIDIA/AMD backends issue, so `lower` refuses with that reason instead of pretending.
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

NOT_BUILT = "lowering onto kernels/triton/ is not built yet (README status table); cpu compiles today"


class CudaBackend(Backend):
    name: ClassVar[str] = "cuda"
    family: ClassVar[str] = "triton"
    targets: ClassVar[tuple[str, ...]] = ("h200", "h100", "b200", "gb300")
    features: ClassVar[frozenset[Feature]] = frozenset()

    def probe(self) -> Probe:
        triton = device_probe.has_module("triton")
        gpu = device_probe.nvidia_device()
        details = {
            "triton": "installed" if triton else "missing (pip install 'polymorph[cuda]')",
            "nvidia device": "present" if gpu else "absent",
        }
        no_gpu = "no NVIDIA GPU on this machine" if not gpu else NOT_BUILT
        return Probe(
            self.name,
            Capability(False, NOT_BUILT),
            Capability(False, no_gpu),
            Capability(False, no_gpu),
            details,
        )

    def lower(self, graph: Graph, profile: Profile, bindings: Mapping[str, int] | None = None) -> Plan:
        raise UserError(f"backend `cuda` cannot lower `{graph.name}` for {profile.id}: {NOT_BUILT}")

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        raise UserError(f"backend `cuda` cannot compile: {NOT_BUILT}")
