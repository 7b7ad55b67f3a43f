"""AWS Trainium2 (trn2) through JAX/XLA: HLO everywhere, NEFF where neuronx-cc is installed.

Status: the contract is in place (targets, probe); the JAX lowering is the work of the Trainium2
backend issue, so `lower` refuses with that reason.
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

NOT_BUILT = "the JAX/XLA lowering for trn2 is not built yet (README status table)"


class NeuronBackend(Backend):
    name: ClassVar[str] = "neuron"
    family: ClassVar[str] = "xla"
    targets: ClassVar[tuple[str, ...]] = ("trn2",)
    features: ClassVar[frozenset[Feature]] = frozenset()

    def probe(self) -> Probe:
        details = {
            "jax": "installed"
            if device_probe.has_module("jax")
            else "missing (pip install 'polymorph[neuron]')",
            "neuronx-cc": "installed"
            if device_probe.executable("neuronx-cc")
            else "missing (AWS's Neuron package index, see README)",
            "neuron device": "present (/dev/neuron0)" if device_probe.neuron_device() else "absent",
        }
        no_dev = "no Neuron device on this machine" if not device_probe.neuron_device() else NOT_BUILT
        return Probe(
            self.name,
            Capability(False, NOT_BUILT),
            Capability(False, no_dev),
            Capability(False, no_dev),
            details,
        )

    def lower(self, graph: Graph, profile: Profile, bindings: Mapping[str, int] | None = None) -> Plan:
        raise UserError(f"backend `neuron` cannot lower `{graph.name}` for {profile.id}: {NOT_BUILT}")

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        raise UserError(f"backend `neuron` cannot compile: {NOT_BUILT}")
