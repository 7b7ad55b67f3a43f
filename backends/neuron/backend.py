"""AWS Trainium2 (trn2) through JAX/XLA: HLO everywhere, a NEFF where neuronx-cc is installed.

lower    the graph is cut into node groups (the fusions kernels/xla/ has files for) and each group
         gets a kernel file from kernels/xla/, as on every backend.
compile  named stages, each output inspectable (`STAGES`):
           jax        the plan at its bucket as one JAX function of one step (step.py): weights,
                      KV cache and inputs are its arguments, so they are HLO parameters
           stablehlo  model.stablehlo.mlir
           hlo        model.hlo.txt and model.hlo.pb (serialized HloModuleProto, what neuronx-cc reads)
           check      no custom calls neuronx-cc cannot compile, no host callbacks or transfers, no
                      constant over 1 KiB, and exactly one parameter per graph param, state tensor
                      and input (hlo.py); every group's own module is checked the same way
           neff       `neuronx-cc compile ... --target trn2` (neuronxcc.py) on the step and on each
                      group, through the content-hashed cache; skipped, with one warning line in the
                      report, where neuronx-cc is not installed
         and writes manifest.json (parameters in order with their polymorph names, results, the
         JAX version, the neuronx-cc command line), plan.json, graph.json and report.json (a roofline
         prediction from hwprofiles/trn2.toml, stated as such).
load     a NeuronExecutable (runtime.py): on a NeuronCore through jax-neuronx where one is present,
         else on XLA's CPU backend (numerics only).

Proven on every machine (JAX 0.10 and 0.11 on XLA's CPU backend): the lowering, the HLO and its
checks, and the numerics against the reference engine. Written against AWS's documentation and
UNPROVEN here (no Trainium device, no Neuron toolchain reachable): the NEFF compile, loading and
running on a NeuronCore, and device timing.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from polymorph.backends import device_probe
from polymorph.backends.neuron import neuronxcc
from polymorph.cost.model import plan_report
from polymorph.errors import MissingDependency, UserError
from polymorph.hardware.profile import load_profile
from polymorph.ir.graph import Graph
from polymorph.ir.ops import normalize_attrs, op_def
from polymorph.ir.shapes import numel
from polymorph.pipeline.backend import Artifact, Capability, Feature, Probe
from polymorph.pipeline.lowering import KernelLibraryBackend
from polymorph.pipeline.plan import Plan, PlanGroup, Report

# The fusions kernels/xla/ has files for. XLA fuses elementwise work on its own; these groups are
# the units of the per-group compile cache (hot reload) and of the report.
NEURON_PATTERNS = ("linear+silu*mul", "linear+residual")
STAGES = ("jax", "stablehlo", "hlo", "check", "neff")
JAX_NEURONX_INSTALL = (
    f"pip install 'jax-neuronx[stable]' --extra-index-url={neuronxcc.NEURON_PIP_INDEX} "
    "(on a trn2 instance with the Neuron driver and runtime)"
)
MANIFEST_VERSION = 1


class NeuronBackend(KernelLibraryBackend):
    name: ClassVar[str] = "neuron"
    language: ClassVar[str] = "xla"
    targets: ClassVar[tuple[str, ...]] = ("trn2",)
    features: ClassVar[frozenset[Feature]] = frozenset(
        {Feature.RUN, Feature.MEASURE, Feature.HOT_RELOAD, Feature.AOT_COMPILE}
    )
    patterns: ClassVar[tuple[str, ...]] = NEURON_PATTERNS

    def probe(self) -> Probe:
        has_jax = device_probe.has_module("jax")
        has_cc = device_probe.executable(neuronxcc.EXECUTABLE)
        has_plugin = device_probe.has_module("jax_neuronx")
        has_device = device_probe.neuron_device()
        details = {
            "jax": _version("jax") if has_jax else "missing: pip install 'polymorph[neuron]'",
            "neuronx-cc": "on PATH" if has_cc else f"missing: {neuronxcc.INSTALL_NEURONX_CC}",
            "jax-neuronx": _version("jax-neuronx") if has_plugin else f"missing: {JAX_NEURONX_INSTALL}",
            "neuron device": "present (/dev/neuron0)" if has_device else "absent (/dev/neuron0)",
        }
        if not has_jax:
            no_jax = Capability(
                False, "jax is not installed; install it with `pip install 'polymorph[neuron]'`"
            )
            return Probe(self.name, no_jax, no_jax, no_jax, details)
        neff = "and the NEFF" if has_cc else f"(NEFF: needs neuronx-cc: {neuronxcc.INSTALL_NEURONX_CC})"
        compile_ok = Capability(True, f"JAX -> StableHLO/HLO for trn2 {neff}")
        if has_device and has_plugin and has_cc:
            on_device = "a NeuronCore through jax-neuronx (written against AWS's docs, unproven here)"
            return Probe(
                self.name, compile_ok, Capability(True, on_device), Capability(True, on_device), details
            )
        missing = [] if has_device else ["a Neuron device (/dev/neuron0 is absent: a trn2 instance)"]
        packages = [p for p, ok in (("jax-neuronx", has_plugin), ("neuronx-cc", has_cc)) if not ok]
        if packages:
            args = " ".join("'jax-neuronx[stable]'" if p == "jax-neuronx" else p for p in packages)
            missing.append(
                f"{' and '.join(packages)} from AWS's Neuron index: "
                f"pip install {args} --extra-index-url={neuronxcc.NEURON_PIP_INDEX}"
            )
        run = Capability(True, "JAX on XLA's CPU backend: numerics only, not Trainium")
        return Probe(self.name, compile_ok, run, Capability(False, "needs " + "; ".join(missing)), details)

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        """Lower the plan's step at its bucket to StableHLO and HLO, check it, and (with `out_dir`)
        write it, its manifest and each group's module to the compile cache; build the NEFFs where
        neuronx-cc is installed. A plan without concrete dims (no bucket) is checked kernel by
        kernel at load time instead; writing one out is refused."""
        if not device_probe.has_module("jax"):
            raise MissingDependency("jax", "neuron", "compiling for trn2")
        missing = sorted(plan.graph.symbols() - set(plan.bindings))
        if missing and out_dir is not None:
            raise UserError(
                f"compiling for {plan.target} needs concrete dims; {', '.join(missing)} have none "
                "(give --batch/--ctx or --traffic)"
            )
        compiled = None if missing else compile_modules(plan, groups=out_dir is not None)
        report = plan_report(plan, resources_of=lambda g: compiled.resources(g) if compiled else {})
        _describe_prediction(report, plan)
        if not neuronxcc.installed():
            report.warnings.append(neuronxcc.NEFF_NOT_BUILT)
        artifact = Artifact(plan, report, out_dir)
        if out_dir is not None:
            assert compiled is not None
            write_artifact(artifact, compiled, out_dir)
        return artifact

    def load(self, artifact: Artifact, weights):  # type: ignore[override]
        from polymorph.backends.neuron.runtime import NeuronExecutable

        return NeuronExecutable(artifact.plan, weights, artifact_dir=artifact.out_dir)


# --- compile ----------------------------------------------------------------------------------------


@dataclass
class GroupModule:
    """One distinct group module (identical layers share one): its HLO, check and cache key."""

    module: Any  # hlo.HloModule
    check: Any  # hlo.HloCheck
    key: str
    groups: list[str] = field(default_factory=list)
    neff: str = "not built"


@dataclass
class CompiledModules:
    plan: Plan
    step: Any  # step.StepFunction
    module: Any  # hlo.HloModule of the whole step
    check: Any  # hlo.HloCheck of it
    groups: dict[str, GroupModule]  # by signature
    group_of: dict[str, str]  # group id -> signature
    working_set: dict[str, int]  # group id -> bytes of its inputs and outputs at the bucket
    sbuf_bytes: float | None
    step_neff: str = "not built"

    def resources(self, group: PlanGroup) -> dict[str, Any]:
        out: dict[str, Any] = {"working_set_bytes": self.working_set[group.id]}
        if group.id in self.group_of:
            g = self.groups[self.group_of[group.id]]
            out.update(
                hlo_cache_key=g.key,
                hlo_instructions=g.check.instructions,
                custom_calls=sorted(set(g.check.custom_calls)),
                largest_constant_bytes=g.check.largest_constant_bytes,
                neff=g.neff,
            )
        if self.sbuf_bytes:
            # Whether the group's operands fit one NeuronCore's SBUF at once; a larger one streams
            # its weights from HBM (the normal case for a projection), which the roofline assumes.
            out["sbuf_bytes_per_core"] = int(self.sbuf_bytes)
            out["fits_sbuf"] = self.working_set[group.id] <= self.sbuf_bytes
        return out


def compile_modules(plan: Plan, *, groups: bool = True) -> CompiledModules:
    """Stages jax, stablehlo, hlo and check for the whole step and, with `groups`, for every
    distinct group (the units of the compile cache, which only a compile that writes needs)."""
    from polymorph.backends.neuron import hlo
    from polymorph.backends.neuron.step import Leaf, step_function

    step = step_function(plan, plan.bindings)  # stage: jax
    signature = step.signature
    from polymorph.backends.neuron.runtime import platform_here

    platform = None if platform_here() == "neuron" else "cpu"
    module = hlo.lower(step.fn, signature.abstract_args(), donate=signature.state_argnums, platform=platform)
    check = hlo.check_hlo(module.hlo_text)
    where = f"{plan.model or plan.graph.name} on {plan.target}"
    hlo.require_ok(check, where)
    if len(check.parameters) != len(signature.leaves):
        raise UserError(
            f"{where}: the HLO module has {len(check.parameters)} parameters; the graph has "
            f"{len(signature.leaves)} params, state tensors and inputs (weights must be parameters)"
        )
    types = step.graph.types()
    cache = neuronxcc.CompileCache(target=_chip(plan))
    modules: dict[str, GroupModule] = {}
    group_of: dict[str, str] = {}
    working_set: dict[str, int] = {}
    for group, launch in step.launches:
        values = dict.fromkeys((*group.inputs, *group.outputs))
        working_set[group.id] = sum(numel(types[v].shape) * types[v].dtype.itemsize for v in values)
        if not groups:
            continue
        sig = group_signature(step.graph, group)
        group_of[group.id] = sig
        if sig not in modules:
            gm = hlo.lower(
                launch, [Leaf(v, "input", types[v]).abstract() for v in group.inputs], platform=platform
            )
            gcheck = hlo.check_hlo(gm.hlo_text)
            hlo.require_ok(gcheck, f"group `{group.id}` ({group.kernel.file})")
            modules[sig] = GroupModule(gm, gcheck, cache.key(gm.hlo_text))
        modules[sig].groups.append(group.id)
    sbuf = load_profile(plan.profile).figure("sbuf_per_unit")
    return CompiledModules(
        plan, step, module, check, modules, group_of, working_set, sbuf.si if sbuf else None
    )


def group_signature(graph: Graph, group: PlanGroup) -> str:
    """What a group's module depends on: kernel file and config, and the group's wiring, ops,
    attributes and concrete types. Groups with one signature (the same layer repeated) share one
    module and one cache entry."""
    types = graph.types()
    by_name = {n.name: n for n in graph.nodes}
    local = {v: f"in{i}" for i, v in enumerate(group.inputs)}
    nodes = []
    for j, name in enumerate(group.nodes):
        node = by_name[name]
        attrs = normalize_attrs(op_def(node.op), node.attrs)
        nodes.append([node.op, [local[v] for v in node.inputs], attrs])
        for k, value in enumerate(node.outputs):
            local[value] = f"n{j}.{k}"
    record = {
        "kernel": [group.kernel.sha256, group.kernel.config],
        "pattern": group.pattern,
        "inputs": [str(types[v]) for v in group.inputs],
        "nodes": nodes,
        "outputs": [local[v] for v in group.outputs],
    }
    return json.dumps(record, sort_keys=True, default=str)


def write_artifact(artifact: Artifact, compiled: CompiledModules, out_dir: Path) -> None:
    """Write the step's modules, each group's module, the manifest, the kernel sources, plan.json
    and report.json; fill the compile cache and build NEFFs where neuronx-cc is installed."""
    import jax

    from polymorph.pipeline.kernel_files import kernels_root

    plan = artifact.plan
    out_dir.mkdir(parents=True, exist_ok=True)
    files = artifact.files
    module = compiled.module

    def write(rel: str, data: str | bytes) -> None:
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        files.append(rel)

    write("model.stablehlo.mlir", module.stablehlo)  # stage: stablehlo
    write("model.hlo.txt", module.hlo_text)  # stage: hlo
    write("model.hlo.pb", module.hlo_proto)
    target = _chip(plan)
    cache = neuronxcc.CompileCache(target=target)
    group_files = {}
    for gm in compiled.groups.values():
        entry = cache.put(gm.module.hlo_text, gm.module.hlo_proto, {"kind": "group", "groups": gm.groups})
        write(f"groups/{gm.key[:16]}.hlo.txt", gm.module.hlo_text)
        write(f"groups/{gm.key[:16]}.hlo.pb", gm.module.hlo_proto)
        group_files[gm.key] = entry
    step_entry = cache.put(module.hlo_text, module.hlo_proto, {"kind": "step", "model": plan.model})
    kernel_dir = out_dir / "kernels"  # the sources the plan names, so the directory loads by itself
    kernel_dir.mkdir(exist_ok=True)
    for group in plan.groups:
        dest = kernel_dir / f"{group.kernel.sha256}.py"
        if not dest.exists():
            src = Path(group.kernel.file)
            shutil.copyfile(src if src.is_absolute() else kernels_root() / src, dest)
            files.append(str(dest.relative_to(out_dir)))
    if neuronxcc.installed():  # stage: neff
        for gm in compiled.groups.values():
            ran = cache.build_neff(group_files[gm.key], f"group `{gm.groups[0]}`")
            gm.neff = f"{'built' if ran else 'cached'}: {group_files[gm.key].neff}"
        ran = cache.build_neff(step_entry, f"{plan.model} step")
        compiled.step_neff = f"{'built' if ran else 'cached'}: {step_entry.neff}"
        shutil.copyfile(step_entry.neff, out_dir / "model.neff")
        files.append("model.neff")
        for k in artifact.report.kernels:  # the NEFF state changed after the report was made
            k.resources["neff"] = compiled.groups[compiled.group_of[k.group]].neff
    else:
        compiled.step_neff = neuronxcc.NEFF_NOT_BUILT
        for k in artifact.report.kernels:
            k.resources["neff"] = "not built: neuronx-cc is not installed"
    manifest = build_manifest(plan, compiled, step_entry, jax.__version__)
    write("manifest.json", json.dumps(manifest, indent=1) + "\n")
    plan.save(out_dir)
    artifact.report.artifacts = sorted(files)
    artifact.report.save(out_dir)


def build_manifest(
    plan: Plan, compiled: CompiledModules, step_entry: Any, jax_version: str
) -> dict[str, Any]:
    signature = compiled.step.signature
    params = []
    for leaf, p in zip(signature.leaves, compiled.check.parameters, strict=True):
        params.append(
            {
                "index": p.index,
                "name": leaf.name,
                "kind": leaf.kind,
                "dtype": leaf.type.dtype.value,
                "hlo_dtype": p.dtype,
                "shape": list(p.shape),
            }
        )
    state_params = {leaf.name: i for i, leaf in enumerate(signature.leaves) if leaf.kind == "state"}
    results = []
    for i, (name, t) in enumerate(signature.outputs):
        kind = "output" if i < signature.n_outputs else "state"
        row: dict[str, Any] = {
            "index": i,
            "name": name,
            "kind": kind,
            "dtype": t.dtype.value,
            "shape": list(t.shape),
        }
        if kind == "state":
            row["donated_parameter"] = state_params[name]
        results.append(row)
    target = _chip(plan)
    cmd = neuronxcc.command("model.hlo.pb", "model.neff", target)
    return {
        "schema_version": MANIFEST_VERSION,
        "model": plan.model,
        "target": plan.target,
        "profile": plan.profile,
        "bindings": plan.bindings,
        "jax_version": jax_version,
        "jaxlib_version": _version("jaxlib"),
        "files": {
            "stablehlo": "model.stablehlo.mlir",
            "hlo_text": "model.hlo.txt",
            "hlo_proto": "model.hlo.pb",
            "neff": "model.neff" if neuronxcc.installed() else None,
        },
        "hlo_sha256": compiled.module.sha256,
        "parameters": params,
        "results": results,
        "checks": {
            **compiled.check.to_dict(),
            "expected_parameters": len(signature.leaves),
            "graph_params": sum(1 for leaf in signature.leaves if leaf.kind == "param"),
            "graph_state": len(state_params),
            "graph_inputs": sum(1 for leaf in signature.leaves if leaf.kind == "input"),
        },
        "neuronx_cc": {
            "command": cmd,
            "command_line": " ".join(cmd),
            "why": "AWS Neuron docs (neuronx-cc CLI reference; how to generate a NEFF): XLA input, trn2, "
            "the transformer optimization profile, no auto-cast (the plan's dtypes are kept)",
            "installed": neuronxcc.installed(),
            "version": neuronxcc.version(),
            "install": neuronxcc.INSTALL_NEURONX_CC,
            "neff": compiled.step_neff,
        },
        "cache": {
            "root": str(step_entry.path.parent.parent),
            "step_key": step_entry.key,
            "groups": [
                {"key": gm.key, "file": f"groups/{gm.key[:16]}.hlo.pb", "groups": gm.groups, "neff": gm.neff}
                for gm in compiled.groups.values()
            ],
        },
    }


def _describe_prediction(report: Report, plan: Plan) -> None:
    profile = load_profile(plan.profile)
    if report.predicted_step_s is None:
        return
    source = "measured calibration" if profile.calibration is not None else "vendor figures"
    report.prediction = (
        f"prediction, not a measurement: roofline floor per kernel from {profile.path} ({source}: "
        "TensorEngine peak and HBM bandwidth of the whole chip, 8 NeuronCores); a NEFF compiled "
        "without tensor parallelism runs on one logical NeuronCore, so expect several times this"
    )


def _chip(plan: Plan) -> str:
    """The instance family neuronx-cc's --target takes: the arch of `neuron:trn2`."""
    return plan.target.partition(":")[2] or plan.profile


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "installed"
