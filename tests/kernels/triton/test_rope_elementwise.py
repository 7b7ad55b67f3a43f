"""kernels/triton/rope.py (every rope type, partial rotary, the attention factor, per-call frequencies)
and the unary ops of kernels/triton/elementwise.py (scale, softcap, gelu erf and tanh) against the
reference, under Triton's interpreter on CPU tensors: every config of each file for cuda (and for rocm
in bf16), f32 and bf16 (the unary ops f16 too), fresh random inputs (normal, and uniform in +-100 where an op saturates),
NaN-poisoned outputs. The rows mirror tests/conformance's (whose cuda and rocm cases need a GPU); a
failure names its seed, ROPE_ELEMENTWISE_SEED=<seed> reproduces it. `python
tests/kernels/triton/test_rope_elementwise.py CASE...` runs cases in this process (it must interpret).

A last test checks that the fused attention-input kernel refuses the rope attributes it does not
implement, and that the plan of such a layer still has a kernel for every group.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polymorph.hardware.target import Target
from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.passes.fuse import fuse
from polymorph.pipeline.lowering import kernel_spec
from polymorph.verify.tolerance import compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA, ROCM = Target.parse("cuda:sm_90"), Target.parse("rocm:gfx942")
F32, BF16, F16, I32 = DType.F32, DType.BF16, DType.F16, DType.I32
TORCH = {F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16, I32: torch.int32}

_LONGROPE = dict(
    rope_type="longrope",
    original_max_position_embeddings=2048,
    factor=16.0,
    rotary_dim=20,
    attention_factor=1.1677484162422844,  # sqrt(1 + ln 16 / ln 2048)
    short_factor=[1.0 + 0.1 * i for i in range(10)],
    long_factor=[1.0 + 3.0 * i for i in range(10)],
)
# name -> (rope attrs, positions below): x [2, 3, 5, 24] (head_dim 24, 5 heads: odd head blocks)
ROPES: dict[str, tuple[dict[str, Any], int]] = {
    "default": ({}, 4096),
    "linear": (dict(rope_type="linear", factor=4.0), 4096),
    "llama3": (dict(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64), 4096),
    "yarn": (dict(theta=1e6, rope_type="yarn", factor=4.0, original_max_position_embeddings=512), 4096),
    # attention factor: yarn's mscale 0.707 over mscale_all_dim 1 at factor 8
    "yarn.partial": (dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=256, beta_fast=16.0,
                          attention_factor=0.9495608824621653, truncate=False, rotary_dim=16), 4096),
    "longrope": (_LONGROPE, 4096),
    "longrope.short": (_LONGROPE, 2048),
    "dynamic": (dict(rope_type="dynamic", factor=2.0, max_position_embeddings=1024), 4096),
    "partial": (dict(theta=500000.0, rotary_dim=8), 4096),
    "attention_factor": (dict(rope_type="linear", factor=2.0, attention_factor=1.3, rotary_dim=18), 4096),
}  # fmt: skip
# name -> (op, attrs, `large`: the uniform distribution's bound)
UNARY: dict[str, tuple[str, dict[str, Any], float]] = {
    "scale": ("scale", {"factor": 0.37}, 100.0),
    "scale.rounded": ("scale", {"factor": 2048**0.5, "round_factor_to_dtype": True}, 100.0),
    "softcap": ("softcap", {"cap": 30.0}, 100.0),
    "gelu": ("gelu", {}, 10.0),
    "gelu.tanh": ("gelu", {"approximate": "tanh"}, 10.0),
}


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("ROPE_ELEMENTWISE_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def one_node(op: str, leaves: dict[str, tuple[DType, tuple[int, ...]]], **attrs: Any) -> Graph:
    g = GraphBuilder(op)
    names = [g.input(name, dtype, shape) for name, (dtype, shape) in leaves.items()]
    g.output("y", g.op(op, op, *names, **attrs))
    return g.build()


def tensor(a: np.ndarray, dtype: DType) -> Any:
    if dtype == BF16:  # bf16 crosses as its bits
        return torch.from_numpy(a.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def array(t: Any, dtype: DType) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if dtype == BF16:
        return t.view(torch.int16).numpy().view(np.uint16).view(dtype.numpy).copy()
    return t.numpy().copy()


def check(file: str, graph: Graph, arrays: dict[str, np.ndarray], target: Target, where: str) -> None:
    """The graph's one node by kernels/triton/<file>.py, every config, against the reference."""
    kf = kernel(file, interpret=True)
    types = graph.types()
    (group,) = fuse(graph, ())
    spec = kernel_spec(graph, group, types, target)
    assert kf.supports(spec), f"{where}: {file} does not support the node"
    with np.errstate(over="ignore"):
        want = reference.run(graph, {}, arrays, {})["y"]
    out_type = types[graph.outputs["y"]]
    for config in kf.configs_for(target):
        inputs = [tensor(arrays[v], types[v].dtype) for v in spec.inputs]
        out = torch.full([int(d) for d in out_type.shape], float("nan"), dtype=TORCH[out_type.dtype])
        kf.build(spec, config, target)([*inputs], [out], None)
        got = array(out, out_type.dtype)
        result = compare(got.astype(np.float32), want.astype(np.float32), op_tolerance(out_type.dtype))
        assert result.ok, f"{where}, config {config}: {result}"


def rope_case(name: str, dtype: DType, target: Target) -> None:
    attrs, below = ROPES[name]
    seed, rng = seeded()
    graph = one_node("rope", {"x": (dtype, (2, 3, 5, 24)), "positions": (I32, (2, 3))}, **attrs)
    for dist in ("normal", "uniform"):
        x = rng.standard_normal((2, 3, 5, 24)) if dist == "normal" else rng.uniform(-100, 100, (2, 3, 5, 24))
        positions = rng.integers(0, below, (2, 3)).astype(np.int32)
        arrays = {"x": x.astype(np.float32).astype(dtype.numpy), "positions": positions}
        check("rope", graph, arrays, target, f"rope.{name} {dtype} {target} {dist} (seed {seed})")


def unary_case(name: str, dtype: DType, target: Target) -> None:
    op, attrs, large = UNARY[name]
    seed, rng = seeded()
    graph = one_node(op, {"x": (dtype, (3, 7, 37))}, **attrs)
    for dist in ("normal", "uniform"):
        x = rng.standard_normal((3, 7, 37)) if dist == "normal" else rng.uniform(-large, large, (3, 7, 37))
        x.flat[:3] = (0.0, 1e-4, -3e-3)  # tiny values: softcap's series branch, near-identity
        arrays = {"x": x.astype(np.float32).astype(dtype.numpy)}
        check("elementwise", graph, arrays, target, f"{name} {dtype} {target} {dist} (seed {seed})")


def interpreter_cases() -> dict[str, Callable[[], None]]:
    """f32 and bf16 on cuda, bf16 on rocm (its configs); the unary ops in f16 too."""
    cases: dict[str, Callable[[], None]] = {}
    for dtype, target in ((F32, CUDA), (BF16, CUDA), (BF16, ROCM), (F16, CUDA)):
        suffix = f"{dtype}-{target.family}"
        if dtype != F16:
            for name in ROPES:
                cases[f"rope.{name}-{suffix}"] = functools.partial(rope_case, name, dtype, target)
        for name in UNARY:
            cases[f"{name}-{suffix}"] = functools.partial(unary_case, name, dtype, target)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


def qkv_layer(rope: dict[str, Any]) -> Graph:
    """One attention input (norm, q/k/v, rope, cache writes) as the decoder builds it: 4 query heads
    and 2 kv heads of 16 dims, model dim 64, a decode step of 2 sequences."""
    g = GraphBuilder("qkv_layer")
    h = g.input("h", BF16, (2, 1, 64))
    pos = g.input("positions", I32, (2, 1))
    table = g.input("block_table", I32, (2, 3))
    kc, vc = (g.state(name, BF16, (7, 4, 2, 16)) for name in ("k_cache", "v_cache"))
    n = g.op("rmsnorm", "norm", h, g.param("w_norm", BF16, (64,)))
    heads = {}
    for name, count in (("q", 4), ("k", 2), ("v", 2)):
        proj = g.op("linear", name, n, g.param(f"w_{name}", BF16, (count * 16, 64)))
        heads[name] = g.op("reshape", f"{name}_heads", proj, shape=(2, 1, count, 16))
    q = g.op("rope", "q_rope", heads["q"], pos, **rope)
    k = g.op("rope", "k_rope", heads["k"], pos, **rope)
    g.update("k_cache", g.op("kv_write", "k_write", kc, k, table, pos))
    g.update("v_cache", g.op("kv_write", "v_write", vc, heads["v"], table, pos))
    g.output("q", q)
    return g.build()


@pytest.mark.parametrize(
    ("rope", "fused"),
    [
        ({}, True),
        (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512), True),
        (dict(rope_type="linear", factor=8.0, attention_factor=0.9), True),
        (dict(rotary_dim=8), False),
        (dict(rope_type="dynamic", factor=2.0, max_position_embeddings=1024), False),
        (_LONGROPE | {"rotary_dim": 0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}, False),
    ],
    ids=["default", "yarn", "attention_factor", "partial", "dynamic", "longrope"],
)
def test_fused_attention_input_falls_back_where_it_must(rope: dict[str, Any], fused: bool) -> None:
    from polymorph.hardware.profile import load_profile
    from polymorph.pipeline.backend import registry

    backend = registry.get("cuda")
    plan = backend.lower(qkv_layer(rope), load_profile("h200"))
    patterns = [g.pattern for g in plan.groups]
    assert ("rmsnorm+qkv+rope+kv_write" in patterns) == fused, patterns
    assert all(g.kernel.file for g in plan.groups), "every group has a kernel"
    if not fused:
        assert patterns.count("rope") == 2, patterns


if __name__ == "__main__":
    child_main(CASES)
