"""Compile as an ordered table of named stages, the same table for every backend.

    graph → verified → specialized → fused → plan → device_code → report

Each stage runs once per compile and reads only what the stages before it made (a `Compilation`);
with a dump folder, each writes what it made there, numbered in order (`polymorph compile ...
--stages DIR`):

- graph:       the model's graph as built (IR JSON).
- verified:    the graph checked once against every invariant, then dead code removed (dce); the
               types of every value (IR JSON plus a types listing).
- specialized: the graph at the bucket's sizes (batch, seq, context blocks), shape-inferred; a
               symbolic compile (no bindings) keeps the verified graph.
- fused:       the node groups the backend's fusion patterns make (JSON). A backend that is not a
               kernel-library backend fuses inside its own `lower`; the stage then says so.
- plan:        a kernel (file, hash, config) for every group: plan.json.
- device_code: the backend's compile: PTX/cubin, AMDGCN/HSACO, HLO, or the kernel sources on cpu.
- report:      report.json: resources, predicted time and warnings per kernel.

The profile is loaded once (by the caller, into the Compilation) and travels with the plan
(`Plan.lowered_profile`); the specialization travels with it too (`Plan.keep_concrete`), so the
backend's compile neither reloads nor re-specializes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polymorph.errors import UserError
from polymorph.hardware.profile import Profile
from polymorph.ir import serialize
from polymorph.ir.graph import Graph, TensorType
from polymorph.ir.spec import infer_types, verify
from polymorph.passes import NodeGroup, dce, fuse, select_patterns, specialize
from polymorph.pipeline.backend import Artifact, Backend
from polymorph.pipeline.plan import Plan


@dataclass
class Compilation:
    """What flows through the stages: the inputs, then each stage's product."""

    backend: Backend
    profile: Profile
    graph: Graph
    bindings: dict[str, int]
    model: str = ""
    unfused: Collection[str] = ()  # fusion patterns to leave out (the tuner's variants)
    out_dir: Path | None = None
    # products, in stage order
    types: dict[str, TensorType] = field(default_factory=dict)  # of the verified (symbolic) graph
    concrete: Graph | None = None
    concrete_types: dict[str, TensorType] = field(default_factory=dict)
    groups: list[NodeGroup] | None = None  # None: the backend fuses inside its own lower
    plan: Plan | None = None
    artifact: Artifact | None = None
    done: list[str] = field(default_factory=list)


def _graph(c: Compilation) -> None:
    pass  # the model's graph as it was built: the stage exists so that it is dumped first


def _verified(c: Compilation) -> None:
    verify(c.graph)
    c.graph = dce(c.graph, verified=True)
    c.types = c.graph.types() if c.graph.nodes else {}


def _specialized(c: Compilation) -> None:
    if not c.bindings:
        c.concrete, c.concrete_types = c.graph, c.types
        return
    c.concrete = specialize(c.graph, c.bindings, verified=True)
    c.concrete_types = infer_types(c.concrete)


def _fused(c: Compilation) -> None:
    from polymorph.pipeline.lowering import KernelLibraryBackend

    if isinstance(c.backend, KernelLibraryBackend):
        patterns = c.backend.fusion_patterns(c.bindings or None)
        c.groups = fuse(c.graph, select_patterns(p for p in patterns if p not in c.unfused), verified=True)


def _plan(c: Compilation) -> None:
    from polymorph.pipeline.lowering import KernelLibraryBackend, choose_kernels

    if c.groups is not None:
        assert isinstance(c.backend, KernelLibraryBackend)
        plan = choose_kernels(
            c.backend.name,
            c.backend.language,
            c.graph,
            c.concrete_types,
            c.groups,
            c.profile,
            library_call=c.backend.library_calls,
            bindings=c.bindings,
        )
    else:
        plan = c.backend.lower(c.graph, c.profile, c.bindings or None)
    plan.model = c.model or plan.model
    plan.lowered_profile = c.profile
    if c.concrete is not None:
        plan.keep_concrete(c.concrete, c.concrete_types)
    c.plan = plan


def _device_code(c: Compilation) -> None:
    assert c.plan is not None
    c.artifact = c.backend.compile(c.plan, c.out_dir)


def _report(c: Compilation) -> None:
    assert c.artifact is not None  # the backend's compile made the report from its device code


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Compilation], None]
    dump: Callable[[Compilation, Path], None]
    what: str


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def _dump_graph(c: Compilation, path: Path) -> None:
    _write(path.with_suffix(".json"), serialize.to_json(c.graph))


def _dump_verified(c: Compilation, path: Path) -> None:
    _dump_graph(c, path)
    _write(path.with_suffix(".types.txt"), "\n".join(f"{v}: {t}" for v, t in c.types.items()))


def _dump_specialized(c: Compilation, path: Path) -> None:
    assert c.concrete is not None
    _write(path.with_suffix(".json"), serialize.to_json(c.concrete))
    _write(path.with_suffix(".types.txt"), "\n".join(f"{v}: {t}" for v, t in c.concrete_types.items()))


def _dump_fused(c: Compilation, path: Path) -> None:
    if c.groups is None:
        text = {"note": f"backend `{c.backend.name}` fuses inside its own lower(); see the plan"}
    else:
        text = [
            {"id": g.id, "pattern": g.pattern, "nodes": list(g.nodes), "inputs": list(g.inputs),
             "outputs": list(g.outputs)}
            for g in c.groups
        ]  # fmt: skip
    _write(path.with_suffix(".json"), json.dumps(text, indent=1))


def _dump_plan(c: Compilation, path: Path) -> None:
    assert c.plan is not None
    _write(path.with_suffix(".json"), json.dumps(c.plan.to_dict(), indent=1))


def _dump_device_code(c: Compilation, path: Path) -> None:
    assert c.artifact is not None
    files = c.artifact.files
    note = "" if c.out_dir is not None else " (no --out: the device code was built in memory only)"
    _write(path.with_suffix(".txt"), "\n".join(files) if files else f"no files{note}")


def _dump_report(c: Compilation, path: Path) -> None:
    assert c.artifact is not None
    _write(path.with_suffix(".json"), json.dumps(c.artifact.report.to_dict(), indent=1))


STAGES: tuple[Stage, ...] = (
    Stage("graph", _graph, _dump_graph, "the model's graph as built"),
    Stage("verified", _verified, _dump_verified, "checked once, dead code removed, typed"),
    Stage("specialized", _specialized, _dump_specialized, "sizes of the bucket bound"),
    Stage("fused", _fused, _dump_fused, "node groups from the backend's fusion patterns"),
    Stage("plan", _plan, _dump_plan, "a kernel and config per group"),
    Stage("device_code", _device_code, _dump_device_code, "the backend's compile, no device needed"),
    Stage("report", _report, _dump_report, "resources and predicted time per kernel"),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)


def run_stages(c: Compilation, *, until: str = "report", dump: Path | None = None) -> Compilation:
    """Run the stages in order up to and including `until`, each once; with `dump`, write each
    stage's product to `dump/<NN>-<stage>.<ext>` right after it runs."""
    if until not in STAGE_NAMES:
        raise UserError(f"no compile stage `{until}`; the stages are: {', '.join(STAGE_NAMES)}")
    for i, stage in enumerate(STAGES):
        stage.run(c)
        c.done.append(stage.name)
        if dump is not None:
            stage.dump(c, dump / f"{i:02d}-{stage.name}")
        if stage.name == until:
            break
    return c


def lower_graph(
    backend: Backend,
    graph: Graph,
    profile: Profile,
    bindings: Mapping[str, int] | None = None,
    *,
    unfused: Collection[str] = (),
    model: str = "",
) -> Plan:
    """The stages up to `plan`: what `KernelLibraryBackend.lower` returns."""
    c = Compilation(backend, profile, graph, dict(bindings or {}), model=model, unfused=unfused)
    plan = run_stages(c, until="plan").plan
    assert plan is not None
    return plan


def describe() -> list[tuple[str, str]]:
    """(stage, what it makes), in order: for `polymorph compile --help` and the README."""
    return [(s.name, s.what) for s in STAGES]


def stage_dump_names() -> list[str]:
    return [f"{i:02d}-{s.name}" for i, s in enumerate(STAGES)]
