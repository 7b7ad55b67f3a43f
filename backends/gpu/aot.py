"""Ahead-of-time compilation of Triton kernels for a named target, with no device present.

Triton's compiler runs its stages (ttir -> ttgir -> llir -> ptx -> cubin on NVIDIA, -> amdgcn ->
hsaco on AMD) for an explicit `GPUTarget`; every stage's output is kept. Resources are read from the
compiled code and from what Triton launches it with:
- shared memory / LDS: Triton allocates it dynamically (`metadata.shared`, passed at launch), on top of
  any static segment the binary declares (the cubin's SHARED, which holds the 1 KB per block CUDA
  reserves once a kernel touches shared memory; the HSACO kernel descriptor's group segment).
- NVIDIA registers, stack frame and spill stores/loads: from ptxas' `-v` log of the cubin Triton built
  (captured while Triton assembles it, or ptxas run again through Triton's own `make_cubin` when the
  cubin came from Triton's cache), cross-checked against `cuobjdump -res-usage` of the cubin.
- AMD VGPRs/AGPRs/SGPRs, spills and scratch: the AMDGCN metadata notes; the VGPRs a wave is allocated
  (granulated, padded for `waves_per_eu`) from the HSACO's kernel descriptor. SGPR spills go to VGPR
  lanes (no memory traffic); VGPR spills go to scratch (per-lane private memory).
Occupancy comes from every per-unit limit of the target's traits (polymorph/hardware/traits.py):
registers, shared memory/LDS, warps/waves and blocks, and the report says which one bounds it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import struct
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

from polymorph.errors import MissingDependency, UserError
from polymorph.hardware.target import Target
from polymorph.hardware.traits import Traits, traits_for
from polymorph.pipeline.kernel_files import CompileUnit

# The arch-specific Triton options a profile's `[compiler] launch_options` may list.
_LAUNCH_OPTIONS = frozenset({"waves_per_eu"})


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


def gpu_target(target: Target, traits: Traits | None = None) -> Any:
    """Triton's GPUTarget for `target`, from its traits (the profile's `[compiler]` backend name, the
    arch, the warp width)."""
    try:
        from triton.backends.compiler import GPUTarget
    except ImportError:
        extra = "rocm" if target.family == "rocm" else "cuda"  # the pip extra's name, not a hardware fact
        raise MissingDependency("triton", extra, f"compiling for {target}") from None
    traits = traits or traits_for(target)
    return GPUTarget(traits.triton_backend, traits.triton_arch, traits.warp_size)


def compile_unit(unit: CompileUnit, target: Target, traits: Traits | None = None) -> CompiledUnit:
    """Compile one unit for `target` and read its resources; occupancy uses `traits` (default: the
    target's, from its profiles)."""
    import triton
    from triton.compiler import ASTSource

    traits = traits or traits_for(target)
    options = dict(unit.options)
    for option in _LAUNCH_OPTIONS - traits.launch_options:
        options.pop(option, None)  # an option of another arch's compiler (waves_per_eu: AMD's)
    # Pointers are 16-byte aligned, as Triton's JIT assumes for torch tensors at launch: without this
    # attribute the AOT build would use narrower loads than the code that runs, and report on it.
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, t in enumerate(unit.signature.values()) if t.startswith("*")
    }
    src = ASTSource(unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs), attrs=attrs)
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), _ptxas_log_to(log):
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")  # Triton 3.9's notice
            compiled = triton.compile(src, target=gpu_target(target, traits), options=options)
    except Exception as e:  # the compiler's own error, with the unit it was compiling
        raise UserError(
            f"Triton failed to compile `{unit.name}` for {target}: {type(e).__name__}: {e}"
        ) from None
    asm = dict(compiled.asm)
    meta = compiled.metadata
    num_warps = int(getattr(meta, "num_warps", options.get("num_warps", 4)))
    dynamic = int(getattr(meta, "shared", 0) or 0)
    if target.family == "cuda":
        ptxas = _ptxas_log(log.getvalue(), str(asm.get("ptx", "")), meta, target, options)
        resources = _cuda_resources(asm.get("cubin", b""), meta.name, dynamic, ptxas)
    else:
        hsaco = asm.get("hsaco", b"")
        resources = _rocm_resources(str(asm.get("amdgcn", "")), hsaco, meta.name, dynamic, traits)
    resources.update(num_warps=num_warps, num_stages=int(getattr(meta, "num_stages", 0)))
    scratch = int(getattr(meta, "global_scratch_size", 0) or 0)
    if scratch:
        resources["global_scratch_bytes"] = scratch  # Triton's own global scratch buffer per program
    resources.update(occupancy_of(resources, num_warps, traits))
    return CompiledUnit(unit.name, meta.name, str(target), asm, resources)


# --- NVIDIA ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _ptxas_log_to(buf: io.StringIO):
    """While Triton compiles, have it print ptxas' `-v` log (TRITON_DUMP_PTXAS_LOG) into `buf`."""
    try:
        from triton import knobs
    except ImportError:  # no knobs module: nothing captured, the log is made again afterwards
        yield
        return
    nvidia = getattr(knobs, "nvidia", None)
    if nvidia is None or not hasattr(nvidia, "dump_ptxas_log") or not hasattr(nvidia, "scope"):
        yield
        return
    with nvidia.scope(), contextlib.redirect_stdout(buf):
        nvidia.dump_ptxas_log = True
        yield


_PTXAS_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_figures(log: str, name: str) -> dict[str, int] | None:
    """Registers, stack frame and spill stores/loads of kernel `name` from a ptxas `-v` log."""
    start = log.find(f"Compiling entry function '{name}'")
    if start < 0:
        return None
    block = log[start:]
    nxt = block.find("Compiling entry function", 1)
    block = block[: nxt if nxt > 0 else None]
    props, used = _PTXAS_PROPS.search(block), re.search(r"Used (\d+) registers", block)
    if props is None or used is None:
        return None
    stack, stores, loads = map(int, props.groups())
    smem = re.search(r"(\d+) bytes smem", block)
    return {
        "registers": int(used.group(1)),
        "stack_bytes": stack,
        "spill_store_bytes": stores,
        "spill_load_bytes": loads,
        "static_shared_bytes": int(smem.group(1)) if smem else 0,
    }


def _ptxas_log(
    captured: str, ptx: str, meta: Any, target: Target, options: dict[str, Any]
) -> dict[str, int] | None:
    """ptxas' figures for the cubin Triton made: from the log captured while it assembled it, else
    (the cubin came from Triton's cache) from the log kept beside it in that cache, else from ptxas run
    again through Triton's own `make_cubin`. A log read fresh is kept in Triton's cache, keyed like the
    cubin, so a warm compile does not assemble again."""
    name, key = meta.name, getattr(meta, "hash", None)
    log_file = f"{name[:150]}.ptxas-v.log"
    figures = _ptxas_figures(captured, name)
    if figures is None and key:
        kept = _triton_cache_file(key, log_file)
        figures = _ptxas_figures(kept, name) if kept else None
        if figures is not None:
            return figures
    if figures is None:
        captured = _ptxas_again(ptx, name, target, options)
        figures = _ptxas_figures(captured, name)
    if figures is not None and key:
        try:
            from triton.runtime.cache import get_cache_manager

            get_cache_manager(key).put(captured, log_file, binary=False)
        except Exception:  # a read-only or remote cache: the log is made again next time
            pass
    return figures


def _triton_cache_file(key: str, filename: str) -> str | None:
    try:
        from triton.runtime.cache import get_cache_manager

        path = get_cache_manager(key).get_file(filename)
        return open(path).read() if path else None
    except Exception:  # no such file, or a cache that does not keep files: assemble again
        return None


def _ptxas_again(ptx: str, name: str, target: Target, options: dict[str, Any]) -> str:
    """ptxas' `-v` log for `ptx`, assembled again by Triton's own `make_cubin` (so with the flags and
    the ptxas binary Triton uses for this arch); empty where that cannot run here."""
    if not ptx:
        return ""
    try:
        from triton.compiler.compiler import make_backend

        backend = make_backend(gpu_target(target))
        opts = backend.parse_options(dict(options))
        log = io.StringIO()
        with _ptxas_log_to(log), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
            backend.make_cubin(ptx, {"name": name}, opts, backend.target.arch)
    except Exception:  # an older or newer Triton's make_cubin: the report says registers only
        return ""
    return log.getvalue()


def _cuobjdump() -> str | None:
    try:
        import triton

        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(bundled):
            return bundled
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def _cubin_usage(cubin: bytes, name: str) -> dict[str, int] | None:
    """`cuobjdump -res-usage` of kernel `name` in `cubin`: REG, STACK, SHARED (static), LOCAL."""
    tool = _cuobjdump()
    if tool is None or not cubin:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [tool, "-res-usage", f.name], capture_output=True, text=True, check=False
        ).stdout
    m = re.search(
        rf"Function {re.escape(name)}:\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text
    )
    if m is None:
        return None
    reg, stack, shared, local = map(int, m.groups())
    return {"registers": reg, "stack_bytes": stack, "static_shared_bytes": shared, "local_bytes": local}


def _cuda_resources(cubin: bytes, name: str, dynamic: int, ptxas: dict[str, int] | None) -> dict[str, Any]:
    usage = _cubin_usage(cubin, name)
    out: dict[str, Any] = {"registers": None, "spill_bytes": None, "stack_bytes": None}
    static = max((usage or {}).get("static_shared_bytes", 0), (ptxas or {}).get("static_shared_bytes", 0))
    out.update(shared_bytes=dynamic + static, shared_dynamic_bytes=dynamic, shared_static_bytes=static)
    notes = []
    if ptxas is not None:
        out.update(
            registers=ptxas["registers"],
            stack_bytes=ptxas["stack_bytes"],
            spill_store_bytes=ptxas["spill_store_bytes"],
            spill_load_bytes=ptxas["spill_load_bytes"],
            # What spilling wrote to local memory (ptxas' spill stores); reloads are spill_load_bytes.
            spill_bytes=ptxas["spill_store_bytes"],
            spill_kind="local memory",
        )
        if usage is not None and (usage["registers"], usage["stack_bytes"]) != (
            ptxas["registers"],
            ptxas["stack_bytes"],
        ):
            notes.append(
                f"ptxas -v ({ptxas['registers']} registers, {ptxas['stack_bytes']} B stack) differs from "
                f"the cubin ({usage['registers']} registers, {usage['stack_bytes']} B stack)"
            )
    elif usage is not None:
        # No ptxas log: the cubin's figures; its stack frame holds any spills, so a spill is not ruled out.
        out.update(registers=usage["registers"], stack_bytes=usage["stack_bytes"])
        notes.append("spills unknown: no ptxas -v log (the stack frame is the cubin's)")
    else:
        notes.append(
            "registers unknown: no ptxas log and no cuobjdump (Triton ships both with its NVIDIA backend)"
        )
    if usage is not None:
        out["local_bytes"] = usage["local_bytes"]
    if notes:
        out["note"] = "; ".join(notes)
    return out


# --- AMD ---------------------------------------------------------------------------------------------


def _note(text: str, key: str) -> int | None:
    m = re.search(rf"^\s*\.{key}:\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def _comment(text: str, key: str) -> int | None:
    """A figure of the AMDGPU asm printer's `; Kernel info` comments (`; Occupancy: 2`)."""
    m = re.search(rf"^;\s*{key}:\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def kernel_descriptor(hsaco: bytes, name: str) -> dict[str, int] | None:
    """The fields of kernel `name`'s descriptor (the 64-byte `<name>.kd` object of an HSACO, LLVM
    AMDGPUUsage "Kernel Descriptor"): static LDS, scratch per lane, and the granulated VGPRs (from
    COMPUTE_PGM_RSRC1) and AGPR offset (COMPUTE_PGM_RSRC3 on gfx90a and later)."""
    data = bytes(hsaco)
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None  # not a little-endian ELF64
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    symtab = next((s for s in sections if s[1] == 2), None)  # SHT_SYMTAB
    if symtab is None:
        return None
    strtab = sections[symtab[6]]  # sh_link
    want = f"{name}.kd".encode()
    for off in range(symtab[4], symtab[4] + symtab[5], symtab[9] or 24):
        st_name, _, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, off)
        end = data.index(b"\0", strtab[4] + st_name)
        if data[strtab[4] + st_name : end] != want or st_size < 64 or st_shndx >= len(sections):
            continue
        sec = sections[st_shndx]
        at = sec[4] + (st_value - sec[3])  # sh_offset + (value - sh_addr)
        group, private = struct.unpack_from("<II", data, at)
        rsrc3, rsrc1 = struct.unpack_from("<II", data, at + 44)
        return {
            "group_segment_fixed_size": group,
            "private_segment_fixed_size": private,
            "granulated_vgprs": rsrc1 & 0x3F,
            "accum_offset": ((rsrc3 & 0x3F) + 1) * 4,
        }
    return None


def _rocm_resources(
    amdgcn: str, hsaco: bytes | str, name: str, dynamic: int, traits: Traits
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "vgprs": _note(amdgcn, "vgpr_count"),
        "agprs": _note(amdgcn, "agpr_count") or 0,
        "sgprs": _note(amdgcn, "sgpr_count"),
        "vgpr_spills": _note(amdgcn, "vgpr_spill_count"),  # to scratch memory
        "sgpr_spills": _note(amdgcn, "sgpr_spill_count"),  # to VGPR lanes: no memory traffic
        "scratch_bytes": _note(amdgcn, "private_segment_fixed_size"),  # per lane
    }
    static = _note(amdgcn, "group_segment_fixed_size") or 0
    notes = []
    kd = kernel_descriptor(hsaco, name) if isinstance(hsaco, bytes) and hsaco else None
    if kd is not None:
        if kd["group_segment_fixed_size"] != static:
            notes.append(f"static LDS: HSACO descriptor {kd['group_segment_fixed_size']} B, notes {static} B")
        static = kd["group_segment_fixed_size"]
        out["scratch_bytes"] = kd["private_segment_fixed_size"]
    # What a workgroup holds at launch: the static group segment plus the dynamic LDS Triton passes.
    out.update(lds_bytes=static + dynamic, lds_dynamic_bytes=dynamic, lds_static_bytes=static)
    out["spill_bytes"] = 4 * (out["vgpr_spills"] or 0)  # per lane, to scratch
    if out["vgpr_spills"]:
        out["spill_kind"] = "scratch memory"
    llvm_occupancy = _comment(amdgcn, "Occupancy")
    if llvm_occupancy is not None:
        out["compiler_waves_per_simd"] = llvm_occupancy  # LLVM's figure (static LDS only)
    granule = traits.register_granule
    if kd is not None:  # what a wave is allocated: padded for waves_per_eu, AGPRs included
        out["vgprs_allocated"] = (kd["granulated_vgprs"] + 1) * granule
    elif out["vgprs"] is not None:
        out["vgprs_allocated"] = -(-max(out["vgprs"] + out["agprs"], 1) // granule) * granule
    if notes:
        out["note"] = "; ".join(notes)
    return out


# --- occupancy ---------------------------------------------------------------------------------------


def occupancy_of(resources: dict[str, Any], num_warps: int, traits: Traits) -> dict[str, Any]:
    """Resident blocks (workgroups) per SM (CU) from each limit of `traits`, the one that binds, and the
    occupancy: resident warps over the most a unit holds. Registers are allocated per warp sub-partition
    (NVIDIA, in `register_granule`s per warp) or per SIMD (AMD, in granules per lane); a block's warps
    spread over the unit's `simds_per_unit`. Returns {} where the registers are unknown."""
    amd = traits.triton_backend == "hip"
    per_simd_regs = traits.registers_per_unit // traits.simds_per_unit
    if amd:
        lane_regs = resources.get("vgprs_allocated")
        if lane_regs is None:
            return {}
        warp_regs = lane_regs * traits.warp_size
    else:
        regs = resources.get("registers")
        if regs is None:
            return {}
        granule = traits.register_granule
        warp_regs = -(-max(regs, 1) * traits.warp_size // granule) * granule
    warps_by_regs = (per_simd_regs // warp_regs) * traits.simds_per_unit  # the warp slots cap it apart
    shared = resources.get("lds_bytes" if amd else "shared_bytes") or 0
    if not shared:
        by_shared = traits.max_blocks_per_unit
    elif shared <= traits.shared_per_block:
        by_shared = traits.shared_per_unit // shared
    else:
        by_shared = 0  # the launch fails: more than a block may take
    limits = {
        "registers": warps_by_regs // num_warps,
        "lds" if amd else "shared memory": by_shared,
        "waves" if amd else "warps": traits.max_warps_per_unit // num_warps,
        "workgroups" if amd else "blocks": traits.max_blocks_per_unit,
    }
    compiler = resources.get("compiler_waves_per_simd")
    if compiler is not None:  # LLVM's own bound (VGPRs and SGPRs, waves_per_eu; not the dynamic LDS)
        limits["compiler (LLVM)"] = compiler * traits.simds_per_unit // num_warps
    limited_by = min(limits, key=lambda k: limits[k])  # first of equals: registers before the rest
    blocks = max(limits[limited_by], 0)
    out: dict[str, Any] = {
        "blocks_per_unit": blocks,
        "occupancy": round(blocks * num_warps / traits.max_warps_per_unit, 3),
        "limited_by": limited_by,
    }
    if amd:
        out["waves_per_simd"] = blocks * num_warps // traits.simds_per_unit
    if by_shared == 0:
        too_big = (
            f"{shared} B of shared memory/LDS is more than the {traits.shared_per_block} B a block may take"
        )
        out["note"] = "; ".join(filter(None, [resources.get("note"), f"{too_big} on {traits.profile}"]))
    return out
