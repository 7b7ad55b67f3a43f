"""Lowering onto a kernel library: the part of `Backend.lower` that every kernel-file backend shares.

The graph is cut into node groups by the fusion patterns the backend opts into; each group gets the
first kernel of the backend's library that implements its pattern and supports its shapes. A fused
group that no kernel takes is split into single-op groups; an op that no kernel takes is an error
naming the op and the backends that have one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from polymorph.errors import UserError
from polymorph.hardware.profile import Profile
from polymorph.hardware.target import Target
from polymorph.hardware.traits import Traits, kernel_traits, traits_of
from polymorph.ir.graph import Graph, TensorType
from polymorph.passes import NodeGroup
from polymorph.pipeline.backend import Backend, check_profile
from polymorph.pipeline.kernel_files import KernelFile, KernelSpec, kernel_library, kernels_root
from polymorph.pipeline.plan import KernelChoice, Plan, PlanGroup


def kernel_spec(
    graph: Graph, group: NodeGroup | PlanGroup, types: Mapping[str, TensorType], target: Target | Traits
) -> KernelSpec:
    """The spec a kernel file is asked about: `target` a Target (its traits read from the profiles that
    name it) or a chip's Traits."""
    by_name = {n.name: n for n in graph.nodes}
    traits = kernel_traits(target)
    return KernelSpec(
        pattern=group.pattern,
        nodes=tuple(by_name[n] for n in group.nodes),
        inputs=tuple(group.inputs),
        outputs=tuple(group.outputs),
        types=types,
        target=target if traits is None else traits.target,
        roles=tuple(getattr(group, "roles", ())),
        traits=traits,
    )


def single_groups(graph: Graph, group: NodeGroup) -> list[NodeGroup]:
    """A fused group cut back into one group per node (when no kernel takes the fused pattern)."""
    by_name = {n.name: n for n in graph.nodes}
    return [
        NodeGroup(
            name, by_name[name].op, (name,), tuple(dict.fromkeys(by_name[name].inputs)), by_name[name].outputs
        )
        for name in group.nodes
    ]


def kernel_path(kernel: KernelFile) -> str:
    root = kernels_root()
    try:
        return str(kernel.path.relative_to(root))
    except ValueError:
        return str(kernel.path)  # a candidate outside the library keeps its absolute path


def choose_kernel(library: Sequence[KernelFile], spec: KernelSpec) -> KernelFile | None:
    for kernel in library:
        if kernel.supports(spec):
            return kernel
    return None


def choose_kernels(
    backend_name: str,
    language: str,
    graph: Graph,
    types: Mapping[str, TensorType],
    groups: Sequence[NodeGroup],
    profile: Profile,
    *,
    library: Sequence[KernelFile] | None = None,
    library_call: Mapping[str, str] | None = None,
    model: str = "",
    bindings: Mapping[str, int] | None = None,
) -> Plan:
    """The plan stage: a kernel of `language` (or of `library`) for each of `groups` (the fused stage's
    node groups of the verified `graph`), chosen for `types` (the specialized stage's: the concrete
    shapes at `bindings`, or the symbolic ones without). `library_call` maps a kernel file name to
    the vendor library it calls, for the report. The plan keeps the symbolic graph and records the
    bindings."""
    library = list(kernel_library(language) if library is None else library)
    library_call = dict(library_call or {})
    chosen: list[PlanGroup] = []

    # The chip's own traits (not only its arch's): configs are chosen from them, and kernels asked
    # about them; the compile and the runtime build from the same (Plan.kernel_target).
    chip = traits_of(profile) if profile.target.is_gpu else profile.target

    def plan_group(group: NodeGroup, kernel: KernelFile) -> PlanGroup:
        config: dict[str, Any] = dict(kernel.configs_for(chip)[0])
        choice = KernelChoice(kernel_path(kernel), kernel.sha256, config, library_call.get(kernel.name))
        return PlanGroup(
            group.id,
            group.pattern,
            tuple(group.nodes),
            tuple(group.inputs),
            tuple(group.outputs),
            choice,
            tuple(group.roles),
        )

    for group in groups:
        kernel = choose_kernel(library, kernel_spec(graph, group, types, chip))
        if kernel is not None:
            chosen.append(plan_group(group, kernel))
            continue
        for single in single_groups(graph, group):
            kernel = choose_kernel(library, kernel_spec(graph, single, types, chip))
            if kernel is None:
                from polymorph.pipeline.backend import registry

                op = single.pattern
                others = [b for b in registry.supporting(op) if b != backend_name]
                where = ", ".join(others) if others else "none yet"
                node = graph.node(single.nodes[0])
                shapes = ", ".join(str(types[v]) for v in node.inputs)
                raise UserError(
                    f"op `{op}` (node `{node.name}`, inputs {shapes}) has no kernel for {backend_name} "
                    f"on {profile.target}; backends that support it: {where}"
                )
            chosen.append(plan_group(single, kernel))
    return Plan(
        backend_name,
        str(profile.target),
        profile.id,
        graph,
        dict(bindings or {}),
        chosen,
        model=model or graph.name,
    )


class KernelLibraryBackend(Backend):
    """A backend whose plans are its kernel language's files (cpu, cuda and rocm, neuron): `lower` fuses
    by the backend's patterns and picks a kernel file for each group (the compile stages up to the
    plan: polymorph/pipeline/stages.py)."""

    library_calls: ClassVar[Mapping[str, str]] = {}  # kernel file name -> the library it calls

    def fusion_patterns(self, bindings: Mapping[str, int] | None) -> Sequence[str]:
        """The fusion patterns a plan at `bindings` uses (default: all of `patterns`)."""
        return self.patterns

    def lower(
        self,
        graph: Graph,
        profile: Profile,
        bindings: Mapping[str, int] | None = None,
        *,
        unfused: Collection[str] = (),
    ) -> Plan:
        from polymorph.pipeline.stages import lower_graph

        check_profile(self, profile)
        return lower_graph(self, graph, profile, bindings, unfused=unfused)
