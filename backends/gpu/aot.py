"""Ahead-of-time compilation of Triton kernels for a named target, with no device present.

Triton's compiler runs its stages (ttir -> ttgir -> llir -> ptx -> cubin on NVIDIA, -> amdgcn ->
hsaco on AMD) for an explicit `GPUTarget`; every stage's output is kept. Resources are read from the
compiled code itself: on NVIDIA from the cubin through `cuobjdump -res-usage` (Triton ships the
binary), on AMD from the AMDGCN metadata notes (.vgpr_count, .sgpr_count, spills, LDS, scratch).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

from polymorph.errors import MissingDependency, UserError
from polymorph.hardware.target import Target
from polymorph.pipeline.kernel_files import CompileUnit

# Per-SM / per-CU limits used for occupancy (sources: hwprofiles/*.toml and their vendor documents).
_CUDA_SM = {"max_warps": 64, "registers": 65536, "shared": 228 * 1024, "reg_granularity": 256}
_ROCM_CU = {
    "gfx942": {"lds": 64 * 1024, "vgprs_per_simd_lane": 512, "max_waves_per_simd": 8},
    "gfx950": {"lds": 160 * 1024, "vgprs_per_simd_lane": 512, "max_waves_per_simd": 8},
}


@dataclass(frozen=True)
class CompiledUnit:
    name: str
    kernel_name: str
    target: str
    asm: dict[str, bytes | str] = field(repr=False)
    resources: dict[str, Any]

    def device_code(self) -> dict[str, bytes | str]:
        """The stages worth keeping as files: PTX and cubin, or AMDGCN and HSACO (plus TTGIR)."""
        keep = ("ttgir", "ptx", "cubin", "amdgcn", "hsaco")
        return {k: v for k, v in self.asm.items() if k in keep}


def gpu_target(target: Target) -> Any:
    try:
        from triton.backends.compiler import GPUTarget
    except ImportError:
        extra = "rocm" if target.family == "rocm" else "cuda"
        raise MissingDependency("triton", extra, f"compiling for {target}") from None
    if target.family == "cuda":
        major, minor = target.compute_capability
        return GPUTarget("cuda", major * 10 + minor, 32)
    if target.family == "rocm":
        return GPUTarget("hip", target.gfx_arch, 64)
    raise UserError(f"Triton cannot compile for {target}")


def compile_unit(unit: CompileUnit, target: Target) -> CompiledUnit:
    import triton
    from triton.compiler import ASTSource

    options = dict(unit.options)
    if target.family != "rocm":
        options.pop("waves_per_eu", None)  # an AMD-only compile option
    # Pointers are 16-byte aligned, as Triton's JIT assumes for torch tensors at launch: without this
    # attribute the AOT build would use narrower loads than the code that runs, and report on it.
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, t in enumerate(unit.signature.values()) if t.startswith("*")
    }
    src = ASTSource(unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs), attrs=attrs)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")  # Triton 3.9's notice
            compiled = triton.compile(src, target=gpu_target(target), options=options)
    except Exception as e:  # the compiler's own error, with the unit it was compiling
        raise UserError(
            f"Triton failed to compile `{unit.name}` for {target}: {type(e).__name__}: {e}"
        ) from None
    asm = dict(compiled.asm)
    meta = compiled.metadata
    num_warps = int(getattr(meta, "num_warps", options.get("num_warps", 4)))
    shared = int(getattr(meta, "shared", 0))
    if target.family == "cuda":
        resources = _cuda_resources(asm.get("cubin", b""), meta.name, num_warps, shared)
    else:
        resources = _rocm_resources(str(asm.get("amdgcn", "")), target.gfx_arch, num_warps)
    resources.update(num_warps=num_warps, num_stages=int(getattr(meta, "num_stages", 0)))
    return CompiledUnit(unit.name, meta.name, str(target), asm, resources)


def _cuobjdump() -> str | None:
    try:
        import triton

        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(bundled):
            return bundled
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def _cuda_resources(cubin: bytes, name: str, num_warps: int, shared: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "shared_bytes": shared,
        "registers": None,
        "spill_bytes": None,
        "stack_bytes": None,
    }
    tool = _cuobjdump()
    if tool is None or not cubin:
        out["note"] = "registers unknown: no cuobjdump (Triton ships one with its NVIDIA backend)"
        return out
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [tool, "-res-usage", f.name], capture_output=True, text=True, check=False
        ).stdout
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text)
    if m:
        regs, stack, static_shared, local = map(int, m.groups())
        out.update(
            registers=regs, stack_bytes=stack, spill_bytes=local, shared_bytes=max(shared, static_shared)
        )
        out["occupancy"] = _cuda_occupancy(regs, num_warps, out["shared_bytes"])
    return out


def _cuda_occupancy(regs: int, num_warps: int, shared: int) -> float:
    """Active warps per SM over the maximum (64), from registers, shared memory and warp limits."""
    sm = _CUDA_SM
    threads = num_warps * 32
    regs_per_block = -(-max(regs, 1) * threads // sm["reg_granularity"]) * sm["reg_granularity"]
    by_regs = sm["registers"] // regs_per_block
    by_shared = sm["shared"] // shared if shared else 32
    by_warps = sm["max_warps"] // num_warps
    blocks = max(min(by_regs, by_shared, by_warps, 32), 0)
    return round(blocks * num_warps / sm["max_warps"], 3)


def _note(text: str, key: str) -> int | None:
    m = re.search(rf"^\s*\.{key}:\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def _rocm_resources(amdgcn: str, gfx: str, num_warps: int) -> dict[str, Any]:
    vgpr = _note(amdgcn, "vgpr_count")
    agpr = _note(amdgcn, "agpr_count") or 0
    out: dict[str, Any] = {
        "vgprs": vgpr,
        "agprs": agpr,
        "sgprs": _note(amdgcn, "sgpr_count"),
        "vgpr_spills": _note(amdgcn, "vgpr_spill_count"),
        "sgpr_spills": _note(amdgcn, "sgpr_spill_count"),
        "lds_bytes": _note(amdgcn, "group_segment_fixed_size"),
        "scratch_bytes": _note(amdgcn, "private_segment_fixed_size"),
    }
    out["spill_bytes"] = (out["scratch_bytes"] or 0) + 4 * (
        (out["vgpr_spills"] or 0) + (out["sgpr_spills"] or 0)
    )
    if vgpr is not None:
        cu = _ROCM_CU[gfx]
        # The unified register file: arch VGPRs and AGPRs share 512 per lane, allocated in 8s.
        used = -(-(vgpr + agpr) // 8) * 8
        by_vgpr = min(cu["max_waves_per_simd"], cu["vgprs_per_simd_lane"] // max(used, 8))
        lds = out["lds_bytes"] or 0
        # A workgroup's waves spread over the CU's 4 SIMDs.
        by_lds = (cu["lds"] // lds) * num_warps / 4 if lds else cu["max_waves_per_simd"]
        out["waves_per_simd"] = int(min(by_vgpr, by_lds, cu["max_waves_per_simd"]))
        out["occupancy"] = round(out["waves_per_simd"] / cu["max_waves_per_simd"], 3)
    return out
