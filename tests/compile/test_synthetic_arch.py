"""Hardware as data: a new chip is one profile file. A synthetic profile for an arch polymorph ships no
profile for (RDNA3 gfx1100: wave32, 64 KB of LDS a workgroup) is written to a temporary directory that
POLYMORPH_PROFILES names; llama-tiny then compiles for it with configs chosen from its traits, with no
kernel file edited. And no Triton kernel file tests the target family or names an arch or vendor."""

from __future__ import annotations

import io
import re
import tokenize
import warnings
from pathlib import Path

import pytest

from polymorph.errors import UserError
from polymorph.hardware.target import Target, known_targets
from polymorph.knobs import knobs
from polymorph.pipeline.kernel_files import kernel_library, kernels_root

pytest.importorskip("triton")

ARCH = "gfx1100"
LDS = 64 * 1024
_FIG = 'source = "synthetic test profile (tests/compile/test_synthetic_arch.py)"\nevidence = "unverified"'
PROFILE = f"""
schema_version = 1
id = "synthetic-rdna3"
name = "Synthetic RDNA3 (test)"
target = "rocm:{ARCH}"
backend = "rocm"

[peak.bf16]
value = 100
unit = "TFLOP/s"
{_FIG}

[figures.memory_bandwidth]
value = 1
unit = "TB/s"
{_FIG}

[figures.memory_capacity]
value = 24
unit = "GB"
{_FIG}

[figures.compute_units]
value = 48
{_FIG}

[figures.shared_memory_per_unit]
value = 64
unit = "KiB"
{_FIG}

[figures.shared_memory_per_block]
value = 64
unit = "KiB"
{_FIG}

[figures.register_file_per_unit]
value = 192
unit = "KiB"
{_FIG}

[figures.register_allocation_unit]
value = 8
{_FIG}

[figures.warp_size]
value = 32
{_FIG}

[figures.max_warps_per_unit]
value = 32
{_FIG}

[figures.max_blocks_per_unit]
value = 32
{_FIG}

[figures.simds_per_unit]
value = 2
{_FIG}

[compiler]
triton_backend = "hip"
matrix_instruction = "wmma"
pipeline_stages = 2
launch_options = ["waves_per_eu"]
source = "synthetic test profile: Triton's AMD backend compiles gfx11 as wave32 (HIPOptions)"
"""


@pytest.fixture
def synthetic(tmp_path: Path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "synthetic-rdna3.toml").write_text(PROFILE, encoding="utf-8")
    with knobs.scope(profile_dirs=str(folder)):
        yield folder


def test_the_arch_is_known_only_while_a_profile_names_it(synthetic: Path) -> None:
    assert f"rocm:{ARCH}" in known_targets()
    assert Target.parse(f"rocm:{ARCH}").gfx_arch == ARCH
    unknown = rf"rocm arch `{ARCH}` is not supported; accepted: rocm:gfx942"
    with knobs.scope(profile_dirs=None), pytest.raises(UserError, match=unknown):
        Target.parse(f"rocm:{ARCH}")


def test_a_profile_defined_twice_is_an_error(synthetic: Path, tmp_path: Path) -> None:
    other = tmp_path / "more"
    other.mkdir()
    (other / "synthetic-rdna3.toml").write_text(PROFILE, encoding="utf-8")
    twice = "profile `synthetic-rdna3` is defined twice"
    with knobs.scope(profile_dirs=[synthetic, other]), pytest.raises(UserError, match=twice):
        Target.parse("rocm:gfx942")


def test_configs_follow_the_traits(synthetic: Path) -> None:
    from polymorph.hardware.profile import load_profile
    from polymorph.hardware.traits import traits_of

    traits = traits_of(load_profile("synthetic-rdna3"))
    assert (traits.warp_size, traits.shared_per_block, traits.pipeline_stages) == (32, LDS, 2)
    gfx950 = traits_of(load_profile("mi355x"))
    by_name = {k.name: k for k in kernel_library("triton")}
    for kernel in by_name.values():
        if not hasattr(kernel.module, "configs"):
            continue  # one config for every chip (layout copies)
        for config in kernel.configs_for(traits):
            assert config.get("num_stages", 1) <= 2 and config.get("skinny_stages", 1) <= 2, kernel.name
            assert "waves_per_eu" in config, kernel.name  # the profile lists the launch option
    # A wave32 chip takes the lists written for 32-wide warps (the H200's), stages capped at 2.
    h200 = load_profile("h200")
    assert [c["num_warps"] for c in by_name["rmsnorm"].configs_for(traits)] == [
        c["num_warps"] for c in by_name["rmsnorm"].configs_for(traits_of(h200))
    ]
    # No GEMM tile beyond the synthetic chip's 64 KB; gfx950's 160 KB keeps a larger one first.
    from_lds = by_name["linear"].module._p.shared
    assert all(from_lds(c) <= LDS for c in by_name["linear"].configs_for(traits))
    big = by_name["linear"].configs_for(gfx950)[0]
    assert from_lds(big) > LDS and big["block_m"] * big["block_n"] > 128 * 128
    assert all(from_lds(c) <= LDS for c in by_name["linear"].configs_for(traits_of(load_profile("mi300x"))))


def test_llama_tiny_compiles_for_the_synthetic_arch(synthetic: Path, tmp_path: Path) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from polymorph import api
    from polymorph.ir.spec import verify
    from polymorph.passes.specialize import specialize
    from polymorph.pipeline.kernel_files import load_choice
    from polymorph.pipeline.lowering import kernel_spec

    artifact = api.compile(model="llama-tiny", backend="rocm", target="synthetic-rdna3", out=tmp_path / "out")
    plan = artifact.plan
    assert plan.target == f"rocm:{ARCH}" and plan.profile == "synthetic-rdna3"
    graph = specialize(plan.graph, plan.bindings)
    types = verify(graph)
    target = Target.parse(plan.target)
    compiled = 0
    for group in plan.groups:
        kernel = load_choice(group.kernel.file, group.kernel.sha256)
        config = group.kernel.config
        if "num_stages" in config:
            assert config["num_stages"] <= 2
        for unit in kernel.compile_units(kernel_spec(graph, group, types, target), config, target):
            assert unit.options["num_warps"] >= 1
            attrs = {
                (i,): [["tt.divisibility", 16]]
                for i, t in enumerate(unit.signature.values())
                if t.startswith("*")
            }
            src = ASTSource(unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs), attrs=attrs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = triton.compile(src, target=GPUTarget("hip", ARCH, 32), options=dict(unit.options))
            assert out.metadata.warp_size == 32  # wave32 device code
            assert out.metadata.shared <= LDS, (unit.name, out.metadata.shared)
            compiled += 1
    assert compiled >= 5
    assert (tmp_path / "out").is_dir()


# Tokens that would pick code by the target's family or name a vendor or an arch in code (comments and
# docstrings may cite where a figure was measured; code may not branch on it).
_ARCHY = re.compile(
    r"^(rocm|cuda|hip|nvidia|amd|cdna\d?|rdna\d?|hopper|blackwell|gfx[0-9a-f]+|sm_?\d+)$", re.I
)


def _code_tokens(source: str) -> list[tokenize.TokenInfo]:
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    out = []
    prev = None
    for tok in tokens:
        is_docstring = tok.type == tokenize.STRING and (
            prev is None or prev.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
        )
        if tok.type in (tokenize.NAME, tokenize.STRING) and not is_docstring:
            out.append(tok)
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok
    return out


def test_no_triton_kernel_file_tests_the_family_or_names_an_arch() -> None:
    files = sorted((kernels_root() / "triton").glob("*.py"))
    assert len(files) > 10
    for path in files:
        source = path.read_text(encoding="utf-8")
        assert "family" not in source, f"{path.name} mentions the target family"
        for tok in _code_tokens(source):
            text = tok.string.strip("\"'") if tok.type == tokenize.STRING else tok.string
            assert not _ARCHY.match(text), f"{path.name}:{tok.start[0]} names `{text}` in code"
