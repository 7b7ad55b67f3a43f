"""kernels/triton/topk_router.py and kernels/triton/moe_ffn.py against the reference.

Numerics run under Triton's interpreter on CPU tensors, every config of each file, on fresh random
inputs with NaN-poisoned outputs; a failure names its seed, and ROUTER_SEED / MOE_SEED reproduce it.
The interpreter needs TRITON_INTERPRET=1 before triton is first imported (triton.language's own
@jit functions, tl.max and tl.sum, are decorated then), and AOT compilation needs it unset, so unless
this whole process is interpreting, the interpreted cases run in child processes (`python
tests/kernels/triton/test_moe.py CASE...` runs cases directly). The compile tests build the files'
compile_units for cuda sm_90 and hip gfx942 at a Mixtral-style shape scaled to one GPU, without a
device; the device test runs the compiled kernels. The routers' modes and features (bias, groups,
scaling, topk_sigmoid) and the experts' (biases, swiglu_clamp, weight_input) run interpreted in f32
and bf16, and compile for sm_90, sm_100, gfx942 and gfx950 at their models' layers without spills.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from polymorph.hardware.target import Target
from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.pipeline.kernel_files import KernelFile, KernelSpec
from polymorph.verify.tolerance import compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, process_interprets, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA = Target.parse("cuda:sm_90")
ROCM = Target.parse("rocm:gfx942")
ROUTER_MODES = [("topk_softmax", False), ("softmax_topk", False), ("softmax_topk", True)]
DTYPES = [DType.BF16, DType.F32]
TORCH_DTYPE = {DType.BF16: "bfloat16", DType.F32: "float32", DType.F16: "float16"}


def seeded(var: str) -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get(var) or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def to_torch(a: np.ndarray, dtype: DType, device: str = "cpu") -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a).astype(np.float32) if dtype.is_float else a)
    return t.to(device=device, dtype=getattr(torch, TORCH_DTYPE[dtype]) if dtype.is_float else t.dtype)


# --- graphs and specs --------------------------------------------------------------------------------


def router_graph(
    tokens: int,
    experts: int,
    k: int,
    dtype: DType,
    mode: str,
    normalize: bool,
    bias: DType | None = None,
    **attrs: object,
) -> Graph:
    """`bias`: the dtype of a selection bias input (sigmoid_topk); attrs: groups, topk_groups, scaling."""
    b = GraphBuilder("router")
    b.input("logits", dtype, (tokens, experts))
    inputs = ["logits"]
    if bias is not None:
        b.input("bias", bias, (experts,))
        inputs.append("bias")
    b.op(
        "topk_router",
        "router",
        *inputs,
        outputs=("weights", "indices"),
        k=k,
        mode=mode,
        normalize=normalize,
        **attrs,
    )
    b.output("weights", "weights")
    b.output("indices", "indices")
    return b.build()


def moe_graph(
    tokens: int | str,
    experts: int,
    k: int,
    dim: int,
    ffn: int,
    dtype: DType,
    biases: bool = False,
    **attrs: object,
) -> Graph:
    """`biases`: b_gate, b_up, b_down inputs; attrs: activation, alpha, limit, weight_input."""
    b = GraphBuilder("moe")
    b.input("x", dtype, (tokens, dim))
    b.input("weights", DType.F32, (tokens, k))
    b.input("indices", DType.I32, (tokens, k))
    b.param("w_gate", dtype, (experts, ffn, dim))
    b.param("w_up", dtype, (experts, ffn, dim))
    b.param("w_down", dtype, (experts, dim, ffn))
    inputs = ["x", "weights", "indices", "w_gate", "w_up", "w_down"]
    if biases:
        b.param("b_gate", dtype, (experts, ffn))
        b.param("b_up", dtype, (experts, ffn))
        b.param("b_down", dtype, (experts, dim))
        inputs += ["b_gate", "b_up", "b_down"]
    b.op("moe_ffn", "moe", *inputs, **attrs)
    b.output("y", "moe")
    return b.build()


def spec_of(graph: Graph, target: Target) -> KernelSpec:
    (node,) = graph.nodes
    return KernelSpec(
        node.op, (node,), tuple(dict.fromkeys(node.inputs)), node.outputs, graph.types(), target
    )


# --- inputs -------------------------------------------------------------------------------------------


def router_logits(
    rng: np.random.Generator, tokens: int, experts: int, dtype: DType, ties: bool
) -> np.ndarray:
    if ties:  # small integers, and an all-equal first row: the order among equals is the test
        x = rng.integers(-2, 3, (tokens, experts)).astype(np.float32)
        x[0] = 0.0
    else:
        x = rng.standard_normal((tokens, experts)).astype(np.float32) * 4.0
    return x.astype(dtype.numpy)


def moe_inputs(rng: np.random.Generator, graph: Graph) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    types = graph.types()
    (tokens, dim), (experts, ffn, _) = types["x"].shape, types["w_gate"].shape
    k = types["weights"].shape[-1]
    dtype = types["x"].dtype.numpy
    x = rng.standard_normal((tokens, dim)).astype(np.float32)
    x.flat[rng.integers(0, x.size, 3)] *= 10.0  # a few large activations: silu's exp(-g) saturates
    inputs = {
        "x": x.astype(dtype),
        "weights": rng.random((tokens, k), dtype=np.float32),
        "indices": np.argsort(rng.random((tokens, experts)), axis=-1)[:, :k].astype(np.int32),
    }
    params = {
        "w_gate": (rng.standard_normal((experts, ffn, dim)) / np.sqrt(dim)).astype(dtype),
        "w_up": (rng.standard_normal((experts, ffn, dim)) / np.sqrt(dim)).astype(dtype),
        "w_down": (rng.standard_normal((experts, dim, ffn)) / np.sqrt(ffn)).astype(dtype),
    }
    for name in ("b_gate", "b_up", "b_down"):  # of the size of the products they are added to
        if name in types:
            params[name] = rng.standard_normal(types[name].shape).astype(np.float32).astype(dtype)
    return params, inputs


def run_reference(graph: Graph, params: dict, inputs: dict) -> dict[str, np.ndarray]:
    with np.errstate(over="ignore"):  # exp(-g) of a large negative g is inf, and silu is then -0
        return reference.run(graph, params, inputs, {})


# --- checks -------------------------------------------------------------------------------------------


def router_bias(rng: np.random.Generator, experts: int, dtype: DType, ties: bool) -> np.ndarray:
    """A selection bias of the size of the sigmoid scores' spread (quarter steps where ties matter)."""
    if ties:
        return (rng.integers(-2, 3, experts) * 0.25).astype(dtype.numpy)
    return (rng.standard_normal(experts) * 0.2).astype(np.float32).astype(dtype.numpy)


def check_router(
    kf: KernelFile,
    graph: Graph,
    target: Target,
    logits: np.ndarray,
    where: str,
    device: str,
    bias: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Every config's weights and indices against the reference; returns the reference's."""
    spec = spec_of(graph, target)
    assert kf.supports(spec), where
    types = graph.types()
    feeds = {"logits": logits} if bias is None else {"logits": logits, "bias": bias}
    want = run_reference(graph, {}, feeds)
    args = [to_torch(feeds[v], types[v].dtype, device) for v in spec.inputs]
    for config in kf.configs_for(target):
        weights = torch.full(types["weights"].shape, float("nan"), device=device)
        indices = torch.full(types["indices"].shape, -1, dtype=torch.int32, device=device)
        kf.build(spec, config, target)(args, [weights, indices], None)
        at = f"{where}, config {config}"
        got = indices.cpu().numpy()
        assert np.array_equal(got, want["indices"]), f"{at}: indices\n{got}\n!= reference\n{want['indices']}"
        result = compare(weights.cpu().numpy(), want["weights"], op_tolerance(DType.F32))
        assert result.ok, f"{at}: weights: {result}"
    return want


def check_moe(
    kf: KernelFile, graph: Graph, target: Target, rng: np.random.Generator, where: str, device: str
) -> None:
    spec = spec_of(graph, target)
    assert kf.supports(spec), where
    params, inputs = moe_inputs(rng, graph)
    want = run_reference(graph, params, inputs)["y"]
    dtype = graph.types()["x"].dtype
    arrays = {**inputs, **params}
    args = [to_torch(arrays[v], graph.types()[v].dtype, device) for v in spec.inputs]
    for config in kf.configs_for(target):
        out = torch.full(want.shape, float("nan"), dtype=args[0].dtype, device=device)
        kf.build(spec, config, target)(args, [out], None)
        got = out.float().cpu().numpy()
        result = compare(got, want.astype(np.float32), op_tolerance(dtype))
        assert result.ok, f"{where}, config {config}: {result}"


# --- interpreter: numerics ----------------------------------------------------------------------------


def router_case(mode: str, normalize: bool, dtype: DType) -> None:
    kf = kernel("topk_router", interpret=True)
    seed, rng = seeded("ROUTER_SEED")
    for target in (CUDA, ROCM) if dtype == DType.BF16 else (CUDA,):  # rocm's configs differ in rows only
        for experts, k in [(4, 1), (8, 2)]:
            for tokens in (1, 3, 7):
                graph = router_graph(tokens, experts, k, dtype, mode, normalize)
                logits = router_logits(rng, tokens, experts, dtype, ties=False)
                where = f"{mode} normalize={normalize} {dtype} E={experts} k={k} T={tokens} {target} (seed {seed})"
                check_router(kf, graph, target, logits, where, "cpu")


def router_ties_case(mode: str, normalize: bool) -> None:
    """Tied logits pick the lower expert index; a non-power-of-two k; E up to the limit."""
    kf = kernel("topk_router", interpret=True)
    seed, rng = seeded("ROUTER_SEED")
    for experts, k, ties in [(8, 3, True), (256, 8, True), (200, 5, False), (384, 8, True)]:  # Kimi-K2: 384
        graph = router_graph(5, experts, k, DType.BF16, mode, normalize)
        logits = router_logits(rng, 5, experts, DType.BF16, ties)
        where = f"{mode} normalize={normalize} E={experts} k={k} ties={ties} (seed {seed})"
        check_router(kf, graph, CUDA, logits, where, "cpu")


# The routers beyond the plain modes, as the models take them: (mode, normalize, has a bias, attrs).
ROUTER_VARIANTS: dict[str, tuple[str, bool, bool, dict[str, object]]] = {
    "sigmoid_topk": ("sigmoid_topk", False, False, {}),
    "sigmoid_topk_bias_norm_scaled": ("sigmoid_topk", True, True, {"scaling": 2.5}),  # GLM-4.5
    "sigmoid_topk_groups": ("sigmoid_topk", True, True, {"scaling": 2.5}),  # DeepSeek-V3, groups below
    "topk_sigmoid": ("topk_sigmoid", True, False, {}),  # Llama 4; the reference ignores normalize here
    "topk_softmax_scaled": ("topk_softmax", False, False, {"scaling": 1.5}),
    "softmax_topk_norm_scaled": ("softmax_topk", True, False, {"scaling": 0.75}),
}
# (experts, k, groups, topk_groups): powers of two and not, the group limit binding
ROUTER_GROUPS = [(32, 4, 4, 2), (64, 8, 8, 4), (48, 6, 6, 3)]


def router_variant_shapes(variant: str, ties: bool) -> list[tuple[int, int, dict[str, object]]]:
    """(experts, k, group attrs) of a variant's cases."""
    if variant == "sigmoid_topk_groups":
        if ties:
            return [(256, 8, {"groups": 8, "topk_groups": 4}), (200, 5, {"groups": 8, "topk_groups": 2})]
        return [(e, k, {"groups": g, "topk_groups": kg}) for e, k, g, kg in ROUTER_GROUPS]
    return [(8, 3, {}), (256, 8, {}), (200, 5, {})] if ties else [(4, 1, {}), (8, 2, {}), (48, 6, {})]


def router_variant_case(variant: str, dtype: DType, ties: bool) -> None:
    """Every config against the reference, the bias (when the variant has one) in the logits' dtype;
    a groups case also checks that its group limit changes the choice (else it would test nothing)."""
    kf = kernel("topk_router", interpret=True)
    seed, rng = seeded("ROUTER_SEED")
    mode, normalize, has_bias, attrs = ROUTER_VARIANTS[variant]
    for experts, k, groups in router_variant_shapes(variant, ties):
        for tokens in (5,) if ties else (1, 3, 7):
            bias = router_bias(rng, experts, dtype, ties) if has_bias else None
            bias_dtype = dtype if has_bias else None
            graph = router_graph(tokens, experts, k, dtype, mode, normalize, bias_dtype, **attrs, **groups)
            logits = router_logits(rng, tokens, experts, dtype, ties)
            where = f"{variant} {dtype} E={experts} k={k} {groups} T={tokens} ties={ties} (seed {seed})"
            want = check_router(kf, graph, CUDA, logits, where, "cpu", bias)
            if groups and tokens == 7:
                free = router_graph(tokens, experts, k, dtype, mode, normalize, bias_dtype, **attrs)
                unlimited = run_reference(free, {}, {"logits": logits, "bias": bias})["indices"]
                assert not np.array_equal(unlimited, want["indices"]), f"{where}: the group limit never binds"


def moe_case(target: Target, experts: int, k: int, dtype: DType, variant: str = "plain") -> None:
    """T 1, 3, 7 with each config: GEMV, small- or large-tile grouped GEMM by the config's limits."""
    kf = kernel("moe_ffn", interpret=True)
    seed, rng = seeded("MOE_SEED")
    biases, attrs = MOE_VARIANTS[variant]
    for tokens in (1, 3, 7):
        graph = moe_graph(tokens, experts, k, 32, 48, dtype, biases, **attrs)
        where = f"{variant} {dtype} E={experts} k={k} T={tokens} {target} (seed {seed})"
        check_moe(kf, graph, target, rng, where, "cpu")


# The expert FFNs beyond SwiGLU: (biases, attrs). limit 1 clamps a good share of g and u (both about
# unit-sized here) and alpha 1.2 differs from the default, so both are exercised.
CLAMP = {"activation": "swiglu_clamp", "alpha": 1.2, "limit": 1.0}
MOE_VARIANTS: dict[str, tuple[bool, dict[str, object]]] = {
    "plain": (False, {}),
    "bias": (True, {}),
    "swiglu_clamp": (False, CLAMP),
    "bias_swiglu_clamp": (True, CLAMP),  # gpt-oss
    "weight_input": (False, {"weight_input": True}),  # Llama 4
    "weight_input_bias_clamp": (True, {**CLAMP, "weight_input": True}),
}


def interpreter_cases() -> dict[str, Callable[[], None]]:
    modes = {"topk_softmax": ("topk_softmax", False), "softmax_topk": ("softmax_topk", False),
             "softmax_topk_norm": ("softmax_topk", True)}  # fmt: skip
    cases: dict[str, Callable[[], None]] = {}
    for name, (mode, normalize) in modes.items():
        for dtype in DTYPES:
            cases[f"router-{name}-{dtype}"] = functools.partial(router_case, mode, normalize, dtype)
        cases[f"router-{name}-ties"] = functools.partial(router_ties_case, mode, normalize)
    for variant in ROUTER_VARIANTS:
        for dtype in DTYPES:
            cases[f"router-{variant}-{dtype}"] = functools.partial(router_variant_case, variant, dtype, False)
        cases[f"router-{variant}-ties"] = functools.partial(router_variant_case, variant, DType.BF16, True)
    for target in (CUDA, ROCM):
        for experts, k in [(4, 1), (8, 2)]:
            for dtype in DTYPES if target == CUDA else (DType.BF16,):  # rocm: the same code, other tiles
                cases[f"moe-{target.family}-E{experts}-k{k}-{dtype}"] = functools.partial(
                    moe_case, target, experts, k, dtype
                )
    for variant in list(MOE_VARIANTS)[1:]:
        for dtype in DTYPES:
            cases[f"moe-{variant}-cuda-E8-k2-{dtype}"] = functools.partial(
                moe_case, CUDA, 8, 2, dtype, variant
            )
        # k = 1 (the down GEMM writes the output) on rocm's tiles
        cases[f"moe-{variant}-rocm-E4-k1-bf16"] = functools.partial(moe_case, ROCM, 4, 1, DType.BF16, variant)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def test_moe_configs_reach_every_path() -> None:
    """The interpreted cases' sizes take every path (GEMV, small and large grouped tiles) on each target."""
    kf = kernel("moe_ffn", interpret=False)
    for target in (CUDA, ROCM):
        reached = {
            kf.module._path(config, tokens * k, experts)
            for config in kf.configs_for(target)
            for experts, k in [(4, 1), (8, 2)]
            for tokens in (1, 3, 7)
        }
        assert reached == {"gemv", "small", "large"}, f"{target}: the interpreted cases reach only {reached}"


def test_launches_count_the_routing_ops_on_the_grouped_paths() -> None:
    """The cost model charges each kernel a call launches: on the grouped paths the routing's torch ops
    are kernels too (ROUTE_OPS, checked here by counting them at the dispatcher)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    kf = kernel("moe_ffn", interpret=False)

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.n += 1
            return func(*args, **(kwargs or {}))

    for slots, experts, block_m in [(8, 8, 16), (64, 8, 64), (2, 128, 16)]:
        ids = torch.randint(0, experts, (slots,), dtype=torch.int32)
        Count.n = 0
        with Count():
            kf.module._route_tiles(ids, experts, block_m)
        assert Count.n == kf.module.ROUTE_OPS, (
            f"_route_tiles dispatches {Count.n} ops, ROUTE_OPS says {kf.module.ROUTE_OPS}"
        )
    config = kf.configs_for(CUDA)[0]
    for tokens in (1, 3, 64):
        spec = spec_of(moe_graph(tokens, 8, 2, 32, 48, DType.BF16), CUDA)
        path = kf.module._path(config, tokens * 2, 8)
        extra = 0 if path == "gemv" else kf.module.ROUTE_OPS
        assert kf.launches(spec, config, CUDA) == len(kf.compile_units(spec, config, CUDA)) + extra


# --- contract -----------------------------------------------------------------------------------------


def test_supports_limits() -> None:
    router, moe = kernel("topk_router", interpret=False), kernel("moe_ffn", interpret=False)
    assert router.supports(spec_of(router_graph(2, 256, 8, DType.BF16, "topk_softmax", False), CUDA))
    too_many = router.module.MAX_EXPERTS + 1
    assert not router.supports(spec_of(router_graph(2, too_many, 2, DType.BF16, "topk_softmax", False), CUDA))
    assert not router.supports(spec_of(router_graph(2, 64, 9, DType.BF16, "topk_softmax", False), CUDA))
    assert not router.supports(
        spec_of(router_graph(2, 8, 2, DType.BF16, "topk_softmax", False), Target("cpu"))
    )
    assert moe.supports(spec_of(moe_graph(2, 8, 2, 32, 48, DType.BF16), ROCM))
    assert not moe.supports(spec_of(moe_graph(2, 8, 2, 32, 48, DType.BF16), Target("cpu")))


def test_supports_router_variants() -> None:
    """Every mode and feature the kernel implements, and none past its limits (group count, k)."""
    router = kernel("topk_router", interpret=False)
    ok = lambda *a, **kw: router.supports(spec_of(router_graph(*a, **kw), CUDA))  # noqa: E731
    for mode, normalize in [("topk_sigmoid", False), ("sigmoid_topk", True), ("topk_softmax", True)]:
        assert ok(3, 16, 2, DType.BF16, mode, normalize, scaling=2.0)
    assert ok(3, 256, 8, DType.BF16, "sigmoid_topk", True, DType.F32, groups=8, topk_groups=4, scaling=2.5)
    assert ok(3, 256, 8, DType.BF16, "sigmoid_topk", True, DType.BF16, groups=16, topk_groups=0)
    assert not ok(3, 256, 8, DType.BF16, "sigmoid_topk", True, DType.F32, groups=32, topk_groups=4)
    assert not ok(3, 256, 9, DType.BF16, "sigmoid_topk", True, DType.F32, groups=8, topk_groups=4)


def test_supports_refuses_what_it_does_not_implement() -> None:
    """Specs the op table allows past the kernels' limits, or with another input count or dtype,
    are refused (the kernels must never compute another op); specs are built directly, not inferred."""
    from dataclasses import replace

    router, moe = kernel("topk_router", interpret=False), kernel("moe_ffn", interpret=False)
    spec = spec_of(router_graph(3, 16, 2, DType.BF16, "sigmoid_topk", False), CUDA)
    node = spec.single
    for attrs in [{"scaling": 0.0}, {"scaling": float("inf")}, {"groups": 3}]:
        bad = replace(node, attrs={**node.attrs, **attrs})
        assert not router.supports(replace(spec, nodes=(bad,))), attrs
    spec = spec_of(moe_graph(2, 8, 2, 32, 48, DType.BF16), CUDA)
    node = spec.single
    for attrs in [
        {"activation": "swiglu_clamp", "limit": float("nan")},
        {"activation": "swiglu_clamp", "alpha": float("inf")},
    ]:
        bad = replace(node, attrs={**node.attrs, **attrs})
        assert not moe.supports(replace(spec, nodes=(bad,))), attrs
    seven = replace(node, inputs=(*node.inputs[:6], node.inputs[3]))  # 7 inputs: no such form
    assert not moe.supports(replace(spec, nodes=(seven,)))


def test_moe_compile_units_follow_the_path() -> None:
    """Concrete T: the kernels of the path the launch takes; symbolic T: every path of the config."""
    kf = kernel("moe_ffn", interpret=False)
    config = kf.configs_for(CUDA)[0]
    names = lambda graph: [u.name for u in kf.compile_units(spec_of(graph, CUDA), config, CUDA)]  # noqa: E731
    gemv = names(moe_graph(1, 8, 2, 64, 96, DType.BF16))
    small = names(moe_graph(8, 8, 2, 64, 96, DType.BF16))
    large = names(moe_graph(config["small_max_rows"] * 8, 8, 2, 64, 96, DType.BF16))
    assert gemv == ["gate_up_gemv", "down_gemv"]
    assert small == ["gate_up_grouped_small", "down_grouped_small", "sum_slots_small"]
    assert large == ["gate_up_grouped_large", "down_grouped_large", "sum_slots_large"]
    assert names(moe_graph(9, 8, 1, 64, 96, DType.BF16)) == small[:2]  # k = 1: no sum over slots
    assert names(moe_graph("batch", 8, 2, 64, 96, DType.BF16)) == gemv + small + large


# --- ahead-of-time compile, no device -----------------------------------------------------------------

# Mixtral-8x7B is D 4096, F 14336, E 8, k 2; this is that layer scaled to fit one GPU's memory.
MIXTRAL_SCALED = {"experts": 8, "k": 2, "dim": 2048, "ffn": 5632}


def aot_cases() -> Iterator[tuple[str, str, int]]:
    for target in ("cuda:sm_90", "rocm:gfx942"):
        for name in ("topk_router", "moe_ffn"):
            for tokens in (1, 32):
                yield target, name, tokens


@pytest.mark.compile
@pytest.mark.parametrize(("target_name", "name", "tokens"), list(aot_cases()), ids=lambda v: str(v))
def test_compile_units(target_name: str, name: str, tokens: int) -> None:
    """The default config's units compile to device code (PTX/cubin, AMDGCN/HSACO) without a device."""
    import triton
    from triton.backends.compiler import GPUTarget

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    gpu = GPUTarget("cuda", 90, 32) if target.family == "cuda" else GPUTarget("hip", "gfx942", 64)
    s = MIXTRAL_SCALED
    if name == "topk_router":
        graph = router_graph(tokens, s["experts"], s["k"], DType.BF16, "topk_softmax", False)
    else:
        graph = moe_graph(tokens, s["experts"], s["k"], s["dim"], s["ffn"], DType.BF16)
    kf = kernel(name, interpret=False)
    spec = spec_of(graph, target)
    assert kf.supports(spec)
    units = kf.compile_units(spec, kf.configs_for(target)[0], target)
    assert units
    for unit in units:
        source = triton.compiler.ASTSource(unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs))
        compiled = triton.compile(source, target=gpu, options=dict(unit.options))
        binary = "cubin" if target.family == "cuda" else "hsaco"
        assert compiled.asm.get(binary), f"{unit.name}: no {binary} for {target}"


# The new routers and experts at their models' layers (bf16; moe_ffn at symbolic T: every path's
# kernels), compiled with their default config for each chip and read back: no register spills.
VARIANT_GRAPHS: dict[str, Callable[[], Graph]] = {
    "router-deepseek-v3": lambda: router_graph(
        32, 256, 8, DType.BF16, "sigmoid_topk", True, DType.F32, groups=8, topk_groups=4, scaling=2.5
    ),
    "router-glm-4.5": lambda: router_graph(
        32, 128, 8, DType.BF16, "sigmoid_topk", True, DType.F32, scaling=2.5
    ),
    "router-llama-4": lambda: router_graph(32, 16, 1, DType.BF16, "topk_sigmoid", False),
    "moe-gpt-oss": lambda: moe_graph("batch", 32, 4, 2880, 2880, DType.BF16, True, activation="swiglu_clamp"),
    # Llama-4-Scout is D 5120, F 8192, E 16, k 1; scaled as Mixtral's is above
    "moe-llama-4": lambda: moe_graph("batch", 16, 1, 2560, 4096, DType.BF16, weight_input=True),
}
VARIANT_TARGETS = ("cuda:sm_90", "cuda:sm_100", "rocm:gfx942", "rocm:gfx950")


@pytest.mark.compile
@pytest.mark.parametrize("target_name", VARIANT_TARGETS)
@pytest.mark.parametrize("variant", list(VARIANT_GRAPHS))
def test_compile_variants_without_spills(variant: str, target_name: str) -> None:
    """Device code for every unit, and ptxas' spill stores / the AMDGCN's VGPR spills both zero."""
    from polymorph.backends.gpu import aot

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    graph = VARIANT_GRAPHS[variant]()
    kf = kernel(
        variant.split("-")[0].replace("router", "topk_router").replace("moe", "moe_ffn"), interpret=False
    )
    spec = spec_of(graph, target)
    assert kf.supports(spec), variant
    units = kf.compile_units(spec, kf.configs_for(target)[0], target)
    assert units
    for unit in units:
        compiled = aot.compile_unit(unit, target)
        binary = "cubin" if target.family == "cuda" else "hsaco"
        assert compiled.asm.get(binary), f"{unit.name}: no {binary} for {target}"
        res = compiled.resources
        assert res.get("spill_bytes") == 0, f"{variant} {unit.name} on {target}: spills ({res})"


# --- on a device ----------------------------------------------------------------------------------------


def device_target() -> Target:
    if torch.version.hip:
        return Target("rocm", torch.cuda.get_device_properties(0).gcnArchName.split(":")[0])
    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", f"sm_{major}{minor}")


@pytest.mark.parametrize(
    "family", [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("rocm", marks=pytest.mark.rocm)]
)
def test_on_device(family: str) -> None:
    """Compiled kernels on the GPU, every config, every path (T*k from 2 to 200), and the router."""
    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; the device test runs compiled kernels")
    target = device_target()
    seed, rng = seeded("MOE_SEED")
    router, moe = kernel("topk_router", interpret=False), kernel("moe_ffn", interpret=False)
    for mode, normalize in ROUTER_MODES:
        for experts, k, ties in [(8, 2, False), (64, 8, True), (128, 8, False)]:
            graph = router_graph(37, experts, k, DType.BF16, mode, normalize)
            logits = router_logits(rng, 37, experts, DType.BF16, ties)
            check_router(router, graph, target, logits, f"{mode} E={experts} k={k} (seed {seed})", "cuda")
    for dtype in (DType.BF16, DType.F32):
        for tokens, experts, k in [(1, 8, 2), (5, 8, 2), (33, 16, 1), (100, 8, 2)]:
            graph = moe_graph(tokens, experts, k, 256, 320, dtype)
            check_moe(moe, graph, target, rng, f"{dtype} T={tokens} E={experts} k={k} (seed {seed})", "cuda")


if __name__ == "__main__":
    child_main(CASES)
