"""Plans and reports: what a backend's `lower` and `compile` produce (plan.json, report.json).

A plan is the graph (specialized to a traffic bucket or still symbolic) cut into node groups, each
with the kernel that runs it: (kernel file, its content hash, config). A report says, per kernel:
group id, kernel, target, resources, whether it is a vendor-library call, predicted time (from the
profile's roofline) and measured time when there is one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.ir import serialize
from polymorph.ir.graph import Graph

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class KernelChoice:
    file: str  # path relative to the kernels root (`torch/linear.py`), or an absolute candidate path
    sha256: str
    config: dict[str, Any]
    library: str | None = None  # a vendor-library call made through this kernel (e.g. "torch"), else None


@dataclass(frozen=True)
class PlanGroup:
    id: str
    pattern: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kernel: KernelChoice
    roles: tuple[tuple[str, tuple[str, ...]], ...] = ()  # pattern step -> node names (fused groups)


@dataclass
class Plan:
    backend: str
    target: str
    profile: str
    graph: Graph
    bindings: dict[str, int]
    groups: list[PlanGroup]
    model: str = ""
    schema_version: int = SCHEMA_VERSION
    # What the compile stages already made, kept in memory so that later stages do not make it again
    # (never saved: a plan loaded from disk computes them on first use).
    lowered_profile: Any = field(default=None, repr=False, compare=False)  # the hardware Profile
    _concrete: tuple[Graph, dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    _chip: Any = field(default=None, repr=False, compare=False)  # kernel_target's traits

    def concrete(self) -> tuple[Graph, dict[str, Any]]:
        """The graph specialized to the plan's bindings, and its types: made once per plan."""
        if self._concrete is None:
            from polymorph.ir.spec import infer_types, verify
            from polymorph.passes import specialize

            types = verify(self.graph)  # once: a plan from disk has not been through the stages
            if self.bindings:
                graph = specialize(self.graph, self.bindings, verified=True)
                types = infer_types(graph)
            self._concrete = (graph if self.bindings else self.graph, types)
        return self._concrete

    def kernel_target(self) -> Any:
        """What the plan's kernel files are asked about and built for: the traits of the chip the plan
        was lowered for (polymorph/hardware/traits.py; its profile, loaded once per plan where the plan
        came from disk), or the Target itself for a chip that is not a GPU."""
        from polymorph.hardware.target import Target
        from polymorph.hardware.traits import traits_of

        target = Target.parse(self.target)
        if not target.is_gpu:
            return target
        if self._chip is None:
            profile = self.lowered_profile
            if profile is None:  # traits are vendor figures: the shipped profile, no calibration read
                from polymorph.hardware.profile import load_profile_vendor

                profile = load_profile_vendor(self.profile)
            self._chip = traits_of(profile)
        return self._chip

    def keep_concrete(self, graph: Graph, types: dict[str, Any]) -> None:
        """Record the specialization the compile stages made (so `concrete` does not redo it)."""
        self._concrete = (graph, types)

    def group(self, group_id: str) -> PlanGroup:
        for g in self.groups:
            if g.id == group_id:
                return g
        raise UserError(
            f"plan has no node group `{group_id}`; groups: {', '.join(g.id for g in self.groups[:8])}, ..."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "backend": self.backend,
            "target": self.target,
            "profile": self.profile,
            "model": self.model,
            "graph_sha256": serialize.content_hash(self.graph),
            "bindings": self.bindings,
            "groups": [
                {
                    "id": g.id,
                    "pattern": g.pattern,
                    "nodes": list(g.nodes),
                    "inputs": list(g.inputs),
                    "outputs": list(g.outputs),
                    "kernel": asdict(g.kernel),
                    "roles": {step: list(nodes) for step, nodes in g.roles},
                }
                for g in self.groups
            ],
        }

    def save(self, out_dir: Path) -> None:
        """Write plan.json and graph.json (the plan refers to the graph by content hash)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        serialize.save(self.graph, out_dir / "graph.json")
        (out_dir / "plan.json").write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, out_dir: Path) -> Plan:
        path = out_dir / "plan.json"
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(
                f"{out_dir}: no plan.json here; make one with `polymorph compile MODEL --out {out_dir}`"
            ) from None
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        except RecursionError:
            raise UserError(f"{path}: JSON nested too deeply to be a plan") from None
        if d.get("schema_version") != SCHEMA_VERSION:
            raise UserError(
                f"{path}: schema_version {d.get('schema_version')!r}, this polymorph reads {SCHEMA_VERSION}"
            )
        graph = serialize.load(out_dir / "graph.json")
        if serialize.content_hash(graph) != d["graph_sha256"]:
            raise UserError(f"{out_dir}: graph.json does not match the plan's graph_sha256; recompile")
        try:
            groups = [
                PlanGroup(
                    g["id"],
                    g["pattern"],
                    tuple(g["nodes"]),
                    tuple(g["inputs"]),
                    tuple(g["outputs"]),
                    KernelChoice(**g["kernel"]),
                    tuple((step, tuple(nodes)) for step, nodes in g.get("roles", {}).items()),
                )
                for g in d["groups"]
            ]
            return cls(
                d["backend"],
                d["target"],
                d["profile"],
                graph,
                dict(d["bindings"]),
                groups,
                d.get("model", ""),
            )
        except (KeyError, TypeError) as e:
            raise UserError(f"{path}: malformed plan ({e})") from None


@dataclass
class KernelReport:
    group: str
    kernel: str
    target: str
    library: str | None
    resources: dict[str, Any]
    flops: float
    bytes: float
    predicted_s: float | None
    bound: str | None
    measured_s: float | None = None
    note: str = ""
    floor_s: float | None = None  # the roofline floor, where predicted_s is the cost model's


@dataclass
class Report:
    backend: str
    target: str
    profile: str
    model: str
    bindings: dict[str, int]
    kernels: list[KernelReport]
    predicted_step_s: float | None
    prediction: str  # how predicted times were made, or why there are none
    artifacts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    footprint: dict[str, float] | None = None  # weights, KV cache and peak activations at the bindings
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(self.to_dict(), indent=1) + "\n")
