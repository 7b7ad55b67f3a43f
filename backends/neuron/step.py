"""A plan as one JAX function of one step: the composition of its groups' XLA launches.

The step function takes every leaf of the graph as a positional argument, in a fixed order that is
also the order of the HLO module's parameters (the manifest lists it):

    params (graph.params order), state (graph.state order), inputs (graph.inputs order)

and returns a flat tuple: the graph's outputs (graph.outputs order), then the new value of every
state tensor (graph.state order; a state the step does not update is returned as it came). Weights
are arguments, so they are HLO parameters, never constants. State is threaded functionally: the
caller donates the state arguments and keeps the returned state for the next step.

The graph is specialized to concrete dims first (XLA needs static shapes), so every kernel is built
for concrete shapes; one set of dims is one function, one HLO module, one NEFF.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.errors import UserError
from polymorph.hardware.target import Target
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, TensorType
from polymorph.passes import specialize
from polymorph.pipeline.kernel_files import load_choice
from polymorph.pipeline.lowering import kernel_spec
from polymorph.pipeline.plan import Plan, PlanGroup

# The launch of an XLA kernel file: jax arrays in (spec.inputs order), a tuple of jax arrays out.
XlaLaunch = Callable[..., Sequence[Any]]


def jax_dtype(dtype: DType) -> np.dtype:
    """The dtype JAX holds an IR dtype in: its numpy dtype, except i64 as i32 unless jax_enable_x64
    is set (JAX's default; the runtime narrows i64 inputs, refusing values that do not fit)."""
    from jax import dtypes

    return np.dtype(dtypes.canonicalize_dtype(dtype.numpy))


@dataclass(frozen=True)
class Leaf:
    """One positional argument of the step function, i.e. one HLO parameter."""

    name: str
    kind: str  # param | state | input
    type: TensorType  # concrete

    def abstract(self) -> Any:
        import jax

        return jax.ShapeDtypeStruct(tuple(int(d) for d in self.type.shape), jax_dtype(self.type.dtype))


@dataclass(frozen=True)
class Signature:
    leaves: tuple[Leaf, ...]
    outputs: tuple[tuple[str, TensorType], ...]  # graph outputs, then state (its new value)
    n_outputs: int  # how many of `outputs` are graph outputs; the rest are state

    @property
    def state_argnums(self) -> tuple[int, ...]:
        return tuple(i for i, leaf in enumerate(self.leaves) if leaf.kind == "state")

    def abstract_args(self) -> list[Any]:
        return [leaf.abstract() for leaf in self.leaves]


@dataclass
class StepFunction:
    fn: Callable[..., tuple[Any, ...]]
    signature: Signature
    graph: Graph  # specialized
    launches: list[tuple[PlanGroup, XlaLaunch]]


def concrete_graph(plan: Plan, bindings: Mapping[str, int]) -> Graph:
    missing = sorted(plan.graph.symbols() - set(bindings))
    if missing:
        raise UserError(
            f"a JAX step for {plan.target} needs concrete dims; {', '.join(missing)} have none "
            "(compile with --batch/--ctx or --traffic)"
        )
    used = {k: v for k, v in bindings.items() if k in plan.graph.symbols()}
    return specialize(plan.graph, used) if used else plan.graph


def build_launches(
    plan: Plan,
    graph: Graph,
    artifact_dir: Path | None = None,
    overrides: Mapping[str, Callable[[Any], XlaLaunch]] | None = None,
) -> list[tuple[PlanGroup, XlaLaunch]]:
    """Each group's launch, built for the concrete `graph`. `overrides` maps a group id to a
    function of its (concrete) KernelSpec that builds the launch instead (a hot-swapped candidate)."""
    types = graph.types()
    target = Target.parse(plan.target)
    launches = []
    for group in plan.groups:
        spec = kernel_spec(graph, group, types, target)
        if overrides and group.id in overrides:
            launch = overrides[group.id](spec)
        else:
            kernel = load_choice(group.kernel.file, group.kernel.sha256, artifact_dir)
            launch = kernel.build(spec, group.kernel.config, target)
        launches.append((group, launch))
    return launches


def signature_of(graph: Graph) -> Signature:
    leaves = (
        *(Leaf(n, "param", t) for n, t in graph.params.items()),
        *(Leaf(n, "state", t) for n, t in graph.state.items()),
        *(Leaf(n, "input", t) for n, t in graph.inputs.items()),
    )
    types = graph.types()
    outputs = tuple((name, types[value]) for name, value in graph.outputs.items())
    state = tuple((name, t) for name, t in graph.state.items())
    return Signature(leaves, outputs + state, len(outputs))


def step_function(
    plan: Plan,
    bindings: Mapping[str, int],
    *,
    artifact_dir: Path | None = None,
    overrides: Mapping[str, Callable[[Any], XlaLaunch]] | None = None,
) -> StepFunction:
    """The plan's step at `bindings` as one pure JAX function (see the module docstring)."""
    graph = concrete_graph(plan, bindings)
    launches = build_launches(plan, graph, artifact_dir, overrides)
    signature = signature_of(graph)
    types = graph.types()
    names = [leaf.name for leaf in signature.leaves]
    outputs = list(graph.outputs.values())
    updates = [graph.state_updates.get(name, name) for name in graph.state]

    def step(*args: Any) -> tuple[Any, ...]:
        env = dict(zip(names, args, strict=True))
        for group, launch in launches:
            results = tuple(launch(*[env[v] for v in group.inputs]))
            check_results(group, results, [types[v] for v in group.outputs])
            env.update(zip(group.outputs, results, strict=True))
        return tuple(env[v] for v in outputs) + tuple(env[v] for v in updates)

    return StepFunction(step, signature, graph, launches)


def check_results(group: PlanGroup, results: Sequence[Any], want: Sequence[TensorType]) -> None:
    """A launch must return its outputs with their exact types (checked once, while tracing)."""
    where = f"group `{group.id}` ({group.kernel.file})"
    if len(results) != len(want):
        raise UserError(
            f"{where}: the launch returned {len(results)} arrays, the group has {len(want)} outputs"
        )
    for r, t in zip(results, want, strict=True):
        shape = tuple(int(d) for d in t.shape)
        if tuple(r.shape) != shape or np.dtype(r.dtype) != jax_dtype(t.dtype):
            raise UserError(
                f"{where}: the launch returned {r.dtype}{list(r.shape)} where the graph says {t}; "
                "an XLA launch must return each output with its exact dtype and shape"
            )
