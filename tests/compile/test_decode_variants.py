"""The decode variants bench/h200_variants.py times, compiled without a device (Triton AOT) at the
Llama-3.2-1B shapes: the GEMV weight prefetch (`gemv_prefetch`) of every projection file on sm_90 and
sm_100, where PDL is on, issues global loads (the weights) before griddepcontrol.wait and spills
nothing; decode attention's variants (the general split kernel at S = 1, more programs, shorter tiles,
deeper pipelining) and the windowed, soft-capped decode and prefill attention compile without spills
for sm_90, sm_100, gfx942 and gfx950."""

from __future__ import annotations

import re
from typing import Any

import pytest

from polymorph.hardware.profile import load_profile
from polymorph.hardware.target import Target
from polymorph.hardware.traits import traits_for
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.models import load_model
from polymorph.pipeline.backend import registry
from polymorph.pipeline.kernel_files import KernelSpec, kernels_root, load_choice, load_kernel
from polymorph.pipeline.lowering import kernel_spec
from polymorph.verify.triton_interpreter import process_interprets

pytest.importorskip("triton")

TARGETS = {"cuda:sm_90": ("cuda", "h200"), "cuda:sm_100": ("cuda", "b200"), "rocm:gfx942": ("rocm", "mi300x"),
           "rocm:gfx950": ("rocm", "mi355x")}  # fmt: skip
PROJECTION_FILES = ("triton/rmsnorm_qkv_rope.py", "triton/linear_residual.py", "triton/rmsnorm_swiglu.py",
                    "triton/rmsnorm_linear.py")  # fmt: skip
ATTENTION_VARIANTS = [{"one_kernel": False}, {"ctas_per_cu": 4, "one_block_n": 128, "num_stages": 3},
                      {"ctas_per_cu": 8, "one_block_n": 128}, {"one_kernel": False, "ctas_per_cu": 4, "num_stages": 3}]  # fmt: skip


@pytest.fixture(autouse=True)
def _compiled_kernels() -> None:
    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")


def compiled(unit: Any, target: Target) -> Any:
    from polymorph.backends.gpu.aot import compile_unit

    return compile_unit(unit, target)


def no_spills(c: Any, where: str) -> None:
    assert c.resources.get("spill_bytes") == 0, f"{where}: spills {c.resources.get('spill_bytes')} bytes"


def decode_groups(target: str, batch: int, ctx: int) -> tuple[Any, list[tuple[Any, Any]]]:
    """The Llama-3.2-1B decode plan's layer-0 and final groups with their kernel specs."""
    backend, chip = TARGETS[target]
    model = load_model("llama-3.2-1b", dtype="bf16")
    ctx_blocks = -(-(ctx + 16) // 16)
    bindings = {"batch": batch, "seq": 1, "ctx_blocks": ctx_blocks, "cache_blocks": batch * ctx_blocks + 1}
    plan = registry.get(backend).lower(model.graph, load_profile(chip), bindings)
    graph, types = plan.concrete()
    chip_traits = plan.kernel_target()
    groups = [g for g in plan.groups if g.id.startswith("layers.0.") or not g.id.startswith("layers.")]
    return chip_traits, [(g, kernel_spec(graph, g, types, chip_traits)) for g in groups]


@pytest.mark.parametrize("target", ["cuda:sm_90", "cuda:sm_100"])
def test_gemv_prefetch_loads_weights_before_the_wait(target: str) -> None:
    traits, groups = decode_groups(target, 1, 1024)
    seen = set()
    for g, spec in groups:
        if g.kernel.file not in PROJECTION_FILES:
            continue
        kf = load_choice(g.kernel.file, g.kernel.sha256)
        config = {**g.kernel.config, "gemv_prefetch": True}
        for unit in kf.compile_units(spec, config, traits):
            if unit.constexprs.get("USE_DOT", True):  # the norm's row kernel
                continue
            assert unit.constexprs["PREFETCH"] and unit.constexprs["USE_GDC"], (g.id, unit.constexprs)
            c = compiled(unit, Target.parse(target))
            no_spills(c, f"{g.id} {unit.name} on {target}")
            ptx = str(c.asm["ptx"])
            # one wait a program; the q/k/v kernel inlines one tile per projection (a branch each)
            assert ptx.count("griddepcontrol.wait") >= 1, f"{g.id}: no griddepcontrol.wait"
            before = ptx[: ptx.index("griddepcontrol.wait")]
            assert re.search(r"\bld\.global", before), f"{g.id} {unit.name}: no weight load before the wait"
            seen.add(g.kernel.file)
    assert seen == set(PROJECTION_FILES), seen


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize(("batch", "ctx"), [(1, 1024), (32, 8192)])
def test_attention_variants_compile_without_spills(target: str, batch: int, ctx: int) -> None:
    traits, groups = decode_groups(target, batch, ctx)
    ((g, spec),) = [(g, s) for g, s in groups if g.kernel.file == "triton/decode_attention.py"]
    kf = load_choice(g.kernel.file, g.kernel.sha256)
    for keys in ATTENTION_VARIANTS:
        for unit in kf.compile_units(spec, {**g.kernel.config, **keys}, traits):
            no_spills(
                compiled(unit, Target.parse(target)), f"{unit.name} {keys} at {batch}x{ctx} on {target}"
            )


def cache_attention_spec(target: Target, seq: int, window: int, softcap: float) -> KernelSpec:
    g = GraphBuilder("windowed")
    q = g.input("q", DType.BF16, (1, seq, 32, 64))
    kc = g.state("k_cache", DType.BF16, (600, 16, 8, 64))
    vc = g.state("v_cache", DType.BF16, (600, 16, 8, 64))
    table = g.input("block_table", DType.I32, (1, 520))
    pos = g.input("positions", DType.I32, (1, seq))
    out = g.op("cache_attention", "attn", q, kc, vc, table, pos, scale=0.125, window=window, softcap=softcap)
    g.output("out", out)
    graph = g.build()
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


def prefill_spec(target: Target, window: int, softcap: float) -> KernelSpec:
    g = GraphBuilder("windowed-prefill")
    q = g.input("q", DType.BF16, (1, 2048, 32, 64))
    k = g.input("k", DType.BF16, (1, 2048, 8, 64))
    v = g.input("v", DType.BF16, (1, 2048, 8, 64))
    g.output(
        "out", g.op("attention", "attn", q, k, v, scale=0.125, causal=True, window=window, softcap=softcap)
    )
    graph = g.build()
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


@pytest.mark.parametrize("target", list(TARGETS))
def test_windowed_softcapped_attention_compiles_without_spills(target: str) -> None:
    t = Target.parse(target)
    traits = traits_for(t)
    decode = load_kernel(kernels_root() / "triton/decode_attention.py")
    prefill = load_kernel(kernels_root() / "triton/prefill_attention.py")
    cases = [
        (decode, cache_attention_spec(t, 1, 4096, 50.0), {}),
        (decode, cache_attention_spec(t, 1, 4096, 0.0), {"one_kernel": False}),
        (decode, cache_attention_spec(t, 3, 512, 30.0), {}),
        (prefill, cache_attention_spec(t, 512, 4096, 50.0), {}),
        (prefill, prefill_spec(t, 512, 50.0), {}),
    ]
    for kf, spec, keys in cases:
        assert kf.supports(spec), spec
        for unit in kf.compile_units(spec, {**kf.configs_for(traits)[0], **keys}, traits):
            assert unit.constexprs["WINDOW"] > 0
            no_spills(compiled(unit, t), f"{unit.name} {keys} on {target}")


def test_every_variant_reaches_only_its_groups() -> None:
    """bench/h200_variants.py's variants as config keys over the sm_90 plan at batch 1 (bench/decode.py
    `with_overrides`): each changes the groups its keys name and no other, and every key it sets is one
    the kernel file's default config has or its docstring lists."""
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("h200_variants", bench / "h200_variants.py")
        variants = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(variants)
        from decode import with_overrides
    finally:
        sys.path.remove(str(bench))
    model = load_model("llama-3.2-1b", dtype="bf16")
    bindings = {"batch": 1, "seq": 1, "ctx_blocks": 65, "cache_blocks": 66}
    plan = registry.get("cuda").lower(model.graph, load_profile("h200"), bindings)
    for name, (_, overrides) in variants.VARIANTS.items():
        varied = with_overrides(plan, overrides)
        for g, h in zip(plan.groups, varied.groups, strict=True):
            named = [keys for key, keys in overrides.items() if g.kernel.file == key.partition("@")[0]
                     and key.partition("@")[2] in g.id]  # fmt: skip
            want = dict(g.kernel.config)
            for keys in named:
                want.update(keys)
            assert h.kernel.config == want, (name, g.id)
            doc = load_choice(g.kernel.file, g.kernel.sha256).module.__doc__ or ""
            for keys in named:
                for key in keys:
                    assert key in g.kernel.config or f"`{key}`" in doc or key in doc, (
                        name,
                        g.kernel.file,
                        key,
                    )
        assert name == "default" or varied.groups != plan.groups, f"{name} changes no group"
