"""The Triton lowering and ahead-of-time compile shared by the cuda and rocm backends."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polymorph.backends import device_probe
from polymorph.cli import console
from polymorph.cost.model import plan_report
from polymorph.errors import UserError
from polymorph.hardware.target import Target
from polymorph.pipeline.backend import Artifact, Capability, Feature, Probe
from polymorph.pipeline.kernel_files import KernelFile, copy_kernel_sources, load_choice
from polymorph.pipeline.lowering import KernelLibraryBackend, kernel_spec
from polymorph.pipeline.plan import Plan

# The fusions kernels/triton/ has kernels for, in match order: the norm folded into the q/k/v GEMV
# with rope and the cache write in its epilogue; the norm folded into the gate/up GEMV with SwiGLU;
# the residual add in the o/down projection's epilogue; a norm with the projections that read it;
# the SwiGLU product in one pass where the gate/up GEMMs run plain (above FUSED_NORM_MAX_ROWS).
GPU_PATTERNS = (
    "rmsnorm+qkv+rope+kv_write",
    "rmsnorm+linear+silu*mul",
    "qkv+qk_norm+rope+kv_write",
    "linear+residual",
    "rmsnorm+linear",
    "silu*mul",
)
# The norm-folded projections scale each A tile by w_norm in registers before the MMA, which starves
# the tensor cores once the step is compute-bound: on an H200 at a 2048-token Llama-3.2-1B prefill the
# folded gate/up ran at 206 TFLOP/s and the folded q/k/v at 96, against 593 for the plain GEMM of the
# down projection. Above this many rows a step runs the norm as its own kernel and plain projections.
FUSED_NORM_MAX_ROWS = 64
# Kernel files that call a library instead of launching a Triton kernel of ours (the report says so).
LIBRARY_CALLS = {"layout": "torch"}


@dataclass(frozen=True)
class DeviceFacts:
    """What a Triton backend's probe needs to know about its vendor, in words for the user."""

    extra: str  # the pip extra that brings Triton for this vendor
    compiles: str  # what AOT compilation produces
    device_present: bool
    device_missing: str  # why no device was found
    runs_with: str  # what runs a plan there
    timer: str  # what times it
    details: Mapping[str, str]


def triton_probe(name: str, facts: DeviceFacts) -> Probe:
    """The probe every Triton backend gives: compile needs Triton only; run and measure need the device."""
    triton = device_probe.has_module("triton")
    install = f"Triton is not installed: pip install 'polymorph[{facts.extra}]'"
    details = {"triton": "installed" if triton else f"missing (pip install 'polymorph[{facts.extra}]')",
               **facts.details}  # fmt: skip
    compile_cap = (
        Capability(True, f"Triton AOT: {facts.compiles} without a GPU")
        if triton
        else Capability(False, install)
    )
    if not facts.device_present:
        run = Capability(False, facts.device_missing)
    elif not triton:
        run = Capability(False, install)
    else:
        run = Capability(True, facts.runs_with)
    measure = Capability(run.ok, facts.timer if run.ok else run.reason)
    return Probe(name, compile_cap, run, measure, details)


class TritonBackend(KernelLibraryBackend):
    language: ClassVar[str] = "triton"
    features: ClassVar[frozenset[Feature]] = frozenset(
        {
            Feature.RUN,
            Feature.MEASURE,
            Feature.HOT_RELOAD,
            Feature.GRAPH_CAPTURE,
            Feature.AOT_COMPILE,
            Feature.ENGINE,
        }
    )
    patterns: ClassVar[tuple[str, ...]] = GPU_PATTERNS
    library_calls: ClassVar[Mapping[str, str]] = LIBRARY_CALLS

    def fusion_patterns(self, bindings: Mapping[str, int] | None) -> tuple[str, ...]:
        if bindings and bindings.get("batch", 1) * bindings.get("seq", 1) > FUSED_NORM_MAX_ROWS:
            return tuple(p for p in self.patterns if not p.startswith("rmsnorm+"))
        return self.patterns

    def compile(self, plan: Plan, out_dir: Path | None = None) -> Artifact:
        """Compile every kernel of the plan for its target at the plan's bucket, without the device.

        Writes `device/<kernel>-<hash>.{ptx,cubin|amdgcn,hsaco,ttgir}` per distinct specialization,
        plan.json, graph.json and report.json (registers or VGPRs/SGPRs, shared memory or LDS, spills,
        occupancy per kernel)."""
        target = Target.parse(plan.target)
        missing = sorted(plan.graph.symbols() - set(plan.bindings))
        if missing:
            raise UserError(f"compiling for {target} needs concrete dims; {', '.join(missing)} have none")
        concrete, types = plan.concrete()  # the specialized stage's, when the stages made the plan
        chip = plan.kernel_target()  # the traits of the chip it was lowered for (its loaded profile)
        compiled: dict[str, Any] = {}  # specialization key -> CompiledUnit (identical layers compile once)
        resources: dict[str, dict[str, Any]] = {}
        files: dict[str, list[str]] = {}
        what = f"compiling {len(plan.groups)} kernels for {target}"
        with console.progress(len(plan.groups), what) as advance:  # shown by the CLI only, on stderr
            for i, group in enumerate(plan.groups):
                kernel = load_choice(group.kernel.file, group.kernel.sha256)
                spec = kernel_spec(concrete, group, types, chip)
                units = kernel.compile_units(spec, group.kernel.config, chip)
                resources[group.id], files[group.id] = _compile_group(kernel, units, target, compiled, chip)
                if _spills(resources[group.id]):
                    group = plan.groups[i] = _spill_free_default(kernel, spec, group, target, compiled, chip,
                                                                 resources, files)  # fmt: skip
                resources[group.id]["launches"] = kernel.launches(spec, group.kernel.config, chip)
                advance(note=f"{len(compiled)} distinct units")
        artifact = Artifact(plan, plan_report(plan, resources_of=lambda g: resources[g.id]), out_dir)
        for k in artifact.report.kernels:
            artifact.report.warnings += resource_warnings(k.group, k.resources)
        if out_dir is not None:
            device = out_dir / "device"
            device.mkdir(parents=True, exist_ok=True)
            for key, unit in compiled.items():
                for stage, code in unit.device_code().items():
                    path = device / f"{key}.{stage}"
                    if isinstance(code, bytes):
                        path.write_bytes(code)
                    else:
                        path.write_text(code)
                    artifact.files.append(str(path.relative_to(out_dir)))
            (device / "groups.json").write_text(json.dumps(files, indent=1) + "\n")
            artifact.files += copy_kernel_sources(plan, out_dir)
            plan.save(out_dir)
            artifact.report.artifacts = sorted(artifact.files)
            artifact.report.save(out_dir)
        return artifact

    def load(self, artifact: Artifact, weights):  # type: ignore[override]
        from polymorph.backends.gpu.runtime import GpuExecutable

        return GpuExecutable(self, artifact.plan, weights, artifact_dir=artifact.out_dir)


def launch_counts(plan: Plan) -> dict[str, int]:
    """The kernels each group of `plan` launches per call at its bindings, for the cost model
    (KernelFile.launches: its compile units unless the file counts otherwise; one library call for a
    group with no kernel of ours). Each kernel file is loaded once."""
    concrete, types = plan.concrete()
    chip = plan.kernel_target()
    files: dict[str, KernelFile] = {}
    counts = {}
    for group in plan.groups:
        key = group.kernel.sha256
        if key not in files:
            files[key] = load_choice(group.kernel.file, key)
        spec = kernel_spec(concrete, group, types, chip)
        counts[group.id] = files[key].launches(spec, group.kernel.config, chip)
    return counts


def _spills(res: Mapping[str, Any]) -> bool:
    return bool(res.get("spill_bytes") or res.get("vgpr_spills"))


def _spill_free_default(kernel: KernelFile, spec: Any, group: Any, target: Target, compiled: dict[str, Any],
                        chip: Any, resources: dict[str, dict[str, Any]], files: dict[str, list[str]]) -> Any:  # fmt: skip
    """A group whose config is its file's default for the chip, and whose compile spills registers at
    this shape: the first config of the file's space that compiles without spills takes its place (the
    plan records it, the report says why). A config chosen on purpose (a registry champion, a swap) is
    kept as it is: its spills are reported, not changed behind the chooser's back."""
    space = kernel.configs_for(chip)
    if not space or dict(group.kernel.config) != dict(space[0]):
        return group
    spilled = resources[group.id].get("spill_bytes") or resources[group.id].get("vgpr_spills")
    for n, config in enumerate(space[1:], start=2):
        try:
            units = kernel.compile_units(spec, config, chip)
        except (UserError, ValueError, KeyError):  # a config this shape cannot take
            continue
        trial: dict[str, Any] = dict(compiled)
        res, keys = _compile_group(kernel, units, target, trial, chip)
        if _spills(res):
            continue
        compiled.update({k: trial[k] for k in keys})
        res["config_note"] = (f"the file's default config spilled ({spilled}) at this shape; config {n} of "
                              f"its {len(space)} compiles without spills")  # fmt: skip
        resources[group.id], files[group.id] = res, keys
        return dataclasses.replace(group, kernel=dataclasses.replace(group.kernel, config=dict(config)))
    return group


def _compile_group(
    kernel: KernelFile, units: list, target: Target, compiled: dict[str, Any], traits: Any = None
) -> tuple[dict[str, Any], list[str]]:
    """Compile a group's units (reusing identical ones); merge their resources for the report."""
    from polymorph.backends.gpu.aot import compile_unit

    if not units:
        return {"device_code": False, "note": "library call: no kernel of ours"}, []
    keys = []
    merged: dict[str, Any] = {"units": []}
    for unit in units:
        sig = json.dumps([unit.name, sorted(unit.signature.items()), sorted(unit.constexprs.items()),
                          sorted(unit.options.items())], default=str)  # fmt: skip
        key = f"{re.sub(r'[^A-Za-z0-9_]', '_', kernel.name)}-{unit.name}-{_short_hash(kernel.sha256 + sig)}"
        if key not in compiled:
            compiled[key] = compile_unit(unit, target, traits)
        keys.append(key)
        merged["units"].append({"unit": unit.name, **compiled[key].resources})
    for field in _MERGED_MAX:
        values = [u.get(field) for u in merged["units"] if u.get(field) is not None]
        if values:
            merged[field] = max(values)
    kinds = sorted({u["spill_kind"] for u in merged["units"] if u.get("spill_kind")})
    if kinds:
        merged["spill_kind"] = ", ".join(kinds)
    known = [u for u in merged["units"] if u.get("occupancy") is not None]
    if known:  # the group's occupancy is its least occupied unit's, with that unit's binding limit
        worst = min(known, key=lambda u: u["occupancy"])
        for field in ("occupancy", "limited_by", "blocks_per_unit", "waves_per_simd"):
            if field in worst:
                merged[field] = worst[field]
    return merged, keys


# Resources a group reports as the largest of its units'.
_MERGED_MAX = ("registers", "vgprs", "vgprs_allocated", "agprs", "sgprs", "shared_bytes", "lds_bytes",
               "spill_bytes", "spill_store_bytes", "spill_load_bytes", "stack_bytes", "scratch_bytes",
               "vgpr_spills", "sgpr_spills")  # fmt: skip


def resource_warnings(group: str, res: dict[str, Any]) -> list[str]:
    """The report's warnings for one group's resources, each spill named as what it is: NVIDIA
    register spills to local memory (ptxas' spill stores), AMD VGPR spills to scratch memory, AMD SGPR
    spills to VGPR lanes (no memory traffic); and shared memory/LDS more than a block may take."""
    out = []
    if res.get("spill_store_bytes"):
        out.append(f"{group}: ptxas spills registers to local memory: {res['spill_store_bytes']} B of spill "
                   f"stores, {res.get('spill_load_bytes', 0)} B of spill loads, "
                   f"{res.get('stack_bytes', 0)} B stack frame")  # fmt: skip
    if res.get("vgpr_spills"):
        out.append(f"{group}: {res['vgpr_spills']} VGPRs spilled to scratch memory "
                   f"({res.get('scratch_bytes') or 0} B of scratch per lane)")  # fmt: skip
    if res.get("sgpr_spills"):
        out.append(f"{group}: {res['sgpr_spills']} SGPRs spilled to VGPR lanes (no memory traffic)")
    for u in res.get("units", ()):
        if u.get("blocks_per_unit") == 0:  # no block fits on a unit: the launch would fail
            out.append(f"{group} ({u['unit']}) cannot launch: {u.get('note') or u.get('limited_by')}")
    return out


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]
