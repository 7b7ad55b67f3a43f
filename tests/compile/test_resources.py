"""The compile report's resources read against the device code itself, without a GPU:
- the 2k-token prefill GEMM of Llama-3.2-1B for gfx950 takes the LDS Triton launches it with and the
  HSACO declares (more than 64 KB: only gfx950's 160 KB LDS holds it), and its VGPR allocation and
  occupancy are the kernel descriptor's and within LLVM's own bound;
- the f32 prefill attention for sm_90 reports the spill stores, spill loads, stack frame and registers
  that `ptxas -v` gives for the same PTX (run here as the oracle), and a warning that says so.
Both build the compile unit from the kernel file a one-layer Llama-3.2-1B prefill plan (seq 2048) picks.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from polymorph.backends.gpu import aot
from polymorph.backends.gpu.backend import resource_warnings
from polymorph.hardware.profile import load_profile
from polymorph.hardware.target import Target
from polymorph.hardware.traits import traits_of
from polymorph.models import load_model
from polymorph.passes import bucket_bindings
from polymorph.pipeline.backend import registry
from polymorph.pipeline.kernel_files import load_choice
from polymorph.pipeline.lowering import kernel_spec

triton = pytest.importorskip("triton")

pytestmark = pytest.mark.compile
SEQ = 2048


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-3.2-1B's config with one decoder layer: the same kernels at the same shapes, lowered fast."""
    config = json.loads(resources.files("polymorph.models").joinpath("configs/llama-3.2-1b.json").read_text())
    config["num_hidden_layers"] = 1
    d = tmp_path_factory.mktemp("llama-1layer")
    (d / "config.json").write_text(json.dumps(config))
    return d


def prefill_units(model_dir: Path, dtype: str, backend: str, chip: str, group: str) -> tuple[list, Target]:
    """The compile units of `group` in the 2k-token prefill plan (batch 1) for `chip`."""
    m = load_model(str(model_dir), dtype=dtype)
    plan = registry.get(backend).lower(
        m.graph, load_profile(chip), bucket_bindings(m.graph, batch=1, ctx=SEQ, seq=SEQ)
    )
    concrete, types = plan.concrete()
    g = plan.group(group)
    kernel = load_choice(g.kernel.file, g.kernel.sha256)
    target = Target.parse(plan.target)
    return kernel.compile_units(kernel_spec(concrete, g, types, target), g.kernel.config, target), target


def triton_metadata(unit: Any, target: Target) -> Any:
    """Triton's own metadata for the unit, compiled as the launcher would (16-byte aligned pointers)."""
    from triton.compiler import ASTSource

    attrs = {
        (i,): [["tt.divisibility", 16]] for i, t in enumerate(unit.signature.values()) if t.startswith("*")
    }
    src = ASTSource(unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs), attrs=attrs)
    options = {k: v for k, v in unit.options.items() if target.family == "rocm" or k != "waves_per_eu"}
    return triton.compile(src, target=aot.gpu_target(target), options=options).metadata


def asm_comment(amdgcn: str, key: str) -> int:
    m = re.search(rf"^;\s*{key}:\s+(\d+)", amdgcn, re.MULTILINE)
    assert m, f"no `; {key}:` in the AMDGCN"
    return int(m.group(1))


def hsaco_static_lds(hsaco: bytes, amdgcn: str, tmp_path: Path) -> int:
    """The HSACO's declared group segment: llvm-readelf's view of its metadata note where the tool is
    here, else the AMDGCN text the HSACO was assembled from."""
    readelf = shutil.which("llvm-readelf")
    if readelf:
        path = tmp_path / "kernel.hsaco"
        path.write_bytes(hsaco)
        notes = subprocess.run([readelf, "--notes", str(path)], capture_output=True, text=True).stdout
    else:
        notes = amdgcn
    found = re.findall(r"\.group_segment_fixed_size:\s+(\d+)", notes)
    assert len(found) == 1, notes[-2000:]
    return int(found[0])


def test_the_2k_prefill_gemm_on_gfx950_takes_the_lds_triton_launches_it_with(
    one_layer: Path, tmp_path: Path
) -> None:
    (unit,) = prefill_units(one_layer, "bf16", "rocm", "mi355x", "layers.0.mlp.gate")[0]
    target = Target.parse("rocm:gfx950")
    c = unit.constexprs
    assert (unit.name, c["N"], c["K"]) == ("linear_gemm", 8192, 2048), (unit.name, c)
    compiled = aot.compile_unit(unit, target)
    res = compiled.resources
    hsaco, amdgcn = compiled.asm["hsaco"], compiled.asm["amdgcn"]
    dynamic = triton_metadata(unit, target).shared  # what Triton's launcher passes as dynamic LDS
    static = hsaco_static_lds(hsaco, amdgcn, tmp_path)
    assert res["lds_bytes"] == dynamic + static, res
    assert (res["lds_dynamic_bytes"], res["lds_static_bytes"]) == (dynamic, static)
    # The software pipeline holds num_stages A and B tiles of bf16 in LDS at least.
    tiles = unit.options["num_stages"] * (c["BLOCK_M"] * c["BLOCK_K"] + c["BLOCK_K"] * c["BLOCK_N"]) * 2
    assert res["lds_bytes"] >= tiles
    assert res["lds_bytes"] > 64 * 1024, "the 2k prefill GEMM is the one only gfx950's LDS holds"
    # The VGPRs a wave is allocated: the descriptor's granulated count, as LLVM's kernel info states it.
    assert res["vgprs_allocated"] == (asm_comment(amdgcn, "VGPRBlocks") + 1) * 8
    assert res["vgprs_allocated"] >= asm_comment(amdgcn, "NumVGPRsForWavesPerEU")
    assert res["vgprs"] == asm_comment(amdgcn, "TotalNumVgprs")
    # Occupancy from every limit: never above LLVM's own (VGPR/SGPR) bound, nor above what LDS allows.
    traits = traits_of(load_profile("mi355x"))
    assert res["waves_per_simd"] <= asm_comment(amdgcn, "Occupancy")
    assert res["blocks_per_unit"] <= traits.shared_per_unit // res["lds_bytes"]
    assert res["blocks_per_unit"] * res["num_warps"] <= traits.max_warps_per_unit
    assert res["occupancy"] == round(res["blocks_per_unit"] * res["num_warps"] / traits.max_warps_per_unit, 3)
    assert res["limited_by"] in ("registers", "lds", "waves", "workgroups", "compiler (LLVM)")
    assert res["vgpr_spills"] == res["sgpr_spills"] == res["spill_bytes"] == 0


def _ptxas() -> str:
    """The ptxas Triton assembles sm_90 with (its bundled ptxas-blackwell since 3.9, ptxas before)."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in ("ptxas-blackwell", "ptxas"):
        if os.access(bin_dir / name, os.X_OK):
            return str(bin_dir / name)
    pytest.skip("Triton's NVIDIA backend ships no ptxas here")


# f32 flash attention with IEEE dots is ~16k FMAs a thread: over a minute to compile cold on 2 cores
# (2.5 min measured), then ~25 s warm (the oracle's own ptxas run is most of it).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_f32_prefill_attention_on_sm90_reports_what_ptxas_reports(
    one_layer: Path, tmp_path: Path
) -> None:
    from triton.backends.nvidia.compiler import CUDABackend, sm_arch_from_capability

    (unit,) = prefill_units(one_layer, "f32", "cuda", "h200", "layers.0.attn.sdpa")[0]
    assert unit.constexprs["S"] == SEQ and unit.constexprs["D"] == 64
    target = Target.parse("cuda:sm_90")
    compiled = aot.compile_unit(unit, target)
    res = compiled.resources
    # The oracle: ptxas -v on the same PTX, with the flags Triton's make_cubin gives it.
    ptx = tmp_path / "kernel.ptx"
    ptx.write_text(compiled.asm["ptx"])
    flags = ["-lineinfo", "-v", f"--gpu-name={sm_arch_from_capability(90)}"]
    if "regAllocOptLevel" in inspect.getsource(CUDABackend.make_cubin):
        flags.append("--regAllocOptLevel=2")
    log = subprocess.run(
        [_ptxas(), *flags, str(ptx), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    stack, stores, loads = map(
        int,
        re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log
        ).groups(),
    )
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    assert stores > 0, f"this f32 attention no longer spills (ptxas: {log})"
    assert (res["spill_store_bytes"], res["spill_load_bytes"], res["stack_bytes"], res["registers"]) == (
        stores,
        loads,
        stack,
        regs,
    ), res
    assert res["spill_bytes"] == stores > 0
    assert "note" not in res, res["note"]  # ptxas and the cubin agree on registers and stack
    # The shared memory it launches with: Triton's dynamic figure plus the cubin's static segment.
    assert res["shared_bytes"] == triton_metadata(unit, target).shared + res["shared_static_bytes"]
    traits = traits_of(load_profile("h200"))
    assert res["blocks_per_unit"] * res["num_warps"] <= traits.max_warps_per_unit
    assert res["occupancy"] == round(res["blocks_per_unit"] * res["num_warps"] / traits.max_warps_per_unit, 3)
    (warning,) = resource_warnings("layers.0.attn.sdpa", res)
    assert "local memory" in warning and f"{stores} B of spill stores" in warning


def test_amd_spills_are_named_by_where_they_go() -> None:
    """SGPR spills land in VGPR lanes (no memory traffic), VGPR spills in scratch memory."""
    sgpr_only = resource_warnings("g", {"vgprs": 100, "vgpr_spills": 0, "sgpr_spills": 6, "scratch_bytes": 0})
    assert sgpr_only == ["g: 6 SGPRs spilled to VGPR lanes (no memory traffic)"]
    both = resource_warnings("g", {"vgprs": 256, "vgpr_spills": 9, "sgpr_spills": 2, "scratch_bytes": 36})
    assert both[0] == "g: 9 VGPRs spilled to scratch memory (36 B of scratch per lane)"
    assert not any("local memory" in w for w in both)
