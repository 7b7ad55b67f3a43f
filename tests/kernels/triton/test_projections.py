"""The projection kernels of kernels/triton/ (linear, linear+residual, rmsnorm+linear,
rmsnorm+linear+silu*mul, rmsnorm+qkv+rope+kv_write) and the simple ones every graph needs (embedding,
rmsnorm, rope, kv_write, elementwise, layout) against the reference.

Numerics run under Triton's interpreter on CPU tensors: every config of each file's cuda space (and
its rocm space for the projections), bf16 and f32, odd and round sizes (M 1 and 2 on the GEMV path, 3
on the tl.dot path; N 33 and 64; K 48 and 128), on fresh random inputs with NaN-poisoned outputs. A
fused kernel may keep its intermediates unrounded, so its tolerance grows by rtol times the largest
intermediate, as in tests/conformance. Paged caches start full of random values, use a shuffled block
table that never names block 0, and every slot a step does not write must keep its bits. A failure
names its seed; PROJECTIONS_SEED=<seed> reproduces it. The groups of the llama-tiny decode and prefill
graphs (the real patterns: llama3 rope scaling, GQA) run the same way.

The interpreter needs TRITON_INTERPRET=1 before triton is first imported, and AOT compilation needs it
unset, so unless this whole process interprets, the interpreted cases run in child processes (`python
tests/kernels/triton/test_projections.py CASE...` runs cases directly). The compile test builds the
compile units of the default config at the Llama-3.2-1B decode shapes (M=1, K=2048, N=2048/512/8192,
bf16) for cuda sm_90 and hip gfx942, without a device; the device test runs the compiled kernels.
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
from polymorph.passes.fuse import fuse, select_patterns
from polymorph.pipeline.kernel_files import KernelFile, KernelSpec
from polymorph.pipeline.lowering import kernel_spec
from polymorph.verify.tolerance import Tolerance, compare, op_tolerance
from polymorph.verify.triton_interpreter import InterpreterRun, child_main, process_interprets, selected
from polymorph.verify.triton_interpreter import load as kernel

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CUDA = Target.parse("cuda:sm_90")
ROCM = Target.parse("rocm:gfx942")
BF16, F32, I32 = DType.BF16, DType.F32, DType.I32
DTYPES = [BF16, F32]
TORCH_DTYPE = {BF16: "bfloat16", F32: "float32", DType.F16: "float16", I32: "int32", DType.I64: "int64"}
FUSED = (
    "rmsnorm+linear",
    "linear+residual",
    "rmsnorm+linear+silu*mul",
    "rmsnorm+qkv+rope+kv_write",
    "silu*mul",
)
# (M, N, K): the GEMV path (M <= GEMV_MAX_M = 2) at odd and round sizes, and the tl.dot path
SHAPES = [(1, 33, 48), (2, 64, 128), (3, 33, 48)]
ROPE = {"theta": 10000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
BLOCK_SIZE = 4


def seeded() -> tuple[int, np.random.Generator]:
    seed = int(os.environ.get("PROJECTIONS_SEED") or np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


# --- graphs ------------------------------------------------------------------------------------------


def linear_graph(dtype: DType, m: int, n: int, k: int, bias: bool) -> Graph:
    g = GraphBuilder("linear")
    x, w = g.input("x", dtype, (m, k)), g.param("w", dtype, (n, k))
    g.output("y", g.op("linear", "proj", x, w, *([g.param("b", dtype, (n,))] if bias else [])))
    return g.build()


def residual_graph(dtype: DType, m: int, n: int, k: int, bias: bool, row_residual: bool = False) -> Graph:
    g = GraphBuilder("linear_residual")
    x, w = g.input("x", dtype, (1, m, k)), g.param("w", dtype, (n, k))
    r = g.input("r", dtype, (n,) if row_residual else (1, m, n))
    proj = g.op("linear", "proj", x, w, *([g.param("b", dtype, (n,))] if bias else []))
    g.output("y", g.op("add", "residual", proj, r) if row_residual else g.op("add", "residual", r, proj))
    return g.build()


def rmsnorm_linear_graph(
    dtype: DType, m: int, n: int, k: int, bias: bool, projections: int, norm_out: bool
) -> Graph:
    g = GraphBuilder("rmsnorm_linear")
    h = g.op("rmsnorm", "norm", g.input("x", dtype, (m, k)), g.param("w_norm", dtype, (k,)), eps=1e-5)
    if norm_out:
        g.output("n", h)
    for i in range(projections):  # a second projection of another width (an lm_head and a router)
        rows = n + 7 * i
        b = [g.param(f"b{i}", dtype, (rows,))] if bias else []
        g.output(f"y{i}", g.op("linear", f"proj{i}", h, g.param(f"w{i}", dtype, (rows, k)), *b))
    return g.build()


def swiglu_graph(dtype: DType, m: int, f: int, k: int, bias: bool) -> Graph:
    g = GraphBuilder("rmsnorm_swiglu")
    h = g.op("rmsnorm", "norm", g.input("x", dtype, (1, m, k)), g.param("w_norm", dtype, (k,)), eps=1e-6)

    def proj(name: str) -> str:
        b = [g.param(f"b_{name}", dtype, (f,))] if bias else []
        return g.op("linear", name, h, g.param(f"w_{name}", dtype, (f, k)), *b)

    up = proj("up")  # up before gate, and mul(up, act): the pattern matches either order
    act = g.op("silu", "act", proj("gate"))
    g.output("y", g.op("mul", "mul", up, act))
    return g.build()


def qkv_graph(dtype: DType, batch: int, seq: int, k: int, bias: bool, heads: int = 3, kv_heads: int = 1,
              head_dim: int = 12, ctx_blocks: int = 4) -> Graph:  # fmt: skip
    g = GraphBuilder("rmsnorm_qkv_rope")
    x = g.input("h", dtype, (batch, seq, k))
    pos = g.input("positions", I32, (batch, seq))
    table = g.input("block_table", I32, (batch, ctx_blocks))
    h = g.op("rmsnorm", "norm", x, g.param("w_norm", dtype, (k,)), eps=1e-5)
    heads_of = {"q": heads, "k": kv_heads, "v": kv_heads}
    out = {}
    for name, count in heads_of.items():
        b = [g.param(f"b{name}", dtype, (count * head_dim,))] if bias else []
        y = g.op("linear", name, h, g.param(f"w{name}", dtype, (count * head_dim, k)), *b)
        out[name] = g.op("reshape", f"{name}_heads", y, shape=(batch, seq, count, head_dim))
    q = g.op("rope", "q_rope", out["q"], pos, **ROPE)
    kr = g.op("rope", "k_rope", out["k"], pos, **ROPE)
    cache_blocks = batch * ctx_blocks + 1
    for name, value in (("k", kr), ("v", out["v"])):
        cache = g.state(f"{name}_cache", dtype, (cache_blocks, BLOCK_SIZE, kv_heads, head_dim))
        g.update(cache, g.op("kv_write", f"{name}_write", cache, value, table, pos))
    g.output("q", q)
    return g.build()


def one_node(op: str, leaves: dict[str, tuple[str, DType, tuple]], **attrs: Any) -> Graph:
    g = GraphBuilder(op)
    names = []
    for name, (kind, dtype, shape) in leaves.items():
        names.append({"input": g.input, "param": g.param, "state": g.state}[kind](name, dtype, shape))
    y = g.op(op, op, *names, **attrs)
    if op == "kv_write":  # the new cache is the state update; a graph must also return something
        g.update(names[0], y)
    g.output("y", y)
    return g.build()


# --- inputs ------------------------------------------------------------------------------------------


def draw(rng: np.random.Generator, graph: Graph) -> dict[str, np.ndarray]:
    """Fresh arrays for every leaf: activations normal, weights scaled by 1/sqrt(fan-in), norm weights
    around 1, a shuffled block table that never names block 0, distinct positions per sequence."""
    arrays: dict[str, np.ndarray] = {}
    leaves = {**graph.inputs, **graph.params, **graph.state}
    table = leaves.get("block_table")
    types = graph.types()
    vocab = {n.inputs[1]: int(types[n.inputs[0]].shape[0]) for n in graph.nodes if n.op == "embedding"}
    for name, t in leaves.items():
        shape = tuple(int(d) for d in t.shape)
        if name == "block_table":
            arrays[name] = (rng.permutation(shape[0] * shape[1]) + 1).reshape(shape).astype(np.int32)
        elif name == "positions":
            ctx = int(table.shape[1]) * BLOCK_SIZE if table is not None else 64
            start = rng.integers(0, ctx - shape[1] + 1, (shape[0], 1))
            arrays[name] = (start + np.arange(shape[1])[None, :]).astype(np.int32)
        elif name in vocab:
            arrays[name] = rng.integers(0, vocab[name], shape).astype(t.dtype.numpy)
        elif not t.dtype.is_float:
            arrays[name] = rng.integers(-300, 300, shape).astype(t.dtype.numpy)
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            if name in graph.params and len(shape) == 2:
                x /= np.sqrt(shape[1])
            elif name in graph.params and name.startswith("w_norm"):
                x = 1.0 + 0.25 * x
            arrays[name] = x.astype(t.dtype.numpy)
    return arrays


def tensor(a: np.ndarray, dtype: DType, device: str) -> Any:
    if dtype == BF16:  # bf16 crosses as its bits
        return torch.from_numpy(a.view(np.uint16).astype(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def array(t: Any, dtype: DType) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if dtype == BF16:
        return t.view(torch.int16).numpy().view(np.uint16).view(dtype.numpy).copy()
    return t.numpy().copy()


# --- the check ---------------------------------------------------------------------------------------


def group_spec(graph: Graph, pattern: str, target: Target) -> tuple[KernelSpec, Any]:
    patterns = select_patterns([pattern]) if pattern in FUSED else ()
    group = next(g for g in fuse(graph, patterns) if g.pattern == pattern)
    return kernel_spec(graph, group, graph.types(), target), group


def state_alias(graph: Graph) -> dict[str, str]:
    alias: dict[str, str] = {}
    for node in graph.nodes:
        if node.op == "kv_write":
            cache = node.inputs[0]
            alias[node.outputs[0]] = cache if cache in graph.state else alias[cache]
    return alias


def reference_values(
    graph: Graph, arrays: dict[str, np.ndarray], state: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every node output of the graph, by value name (the reference writes `state` in place)."""
    probe = graph.copy()
    probe.outputs = {v: v for n in graph.nodes for v in n.outputs}
    params = {k: arrays[k] for k in graph.params}
    inputs = {k: arrays[k] for k in graph.inputs}
    with np.errstate(over="ignore"):  # exp(-x) of a large negative x is inf, and silu is then -0
        return reference.run(probe, params, inputs, state)


def check(kf: KernelFile, graph: Graph, pattern: str, target: Target, rng: np.random.Generator, where: str,
          device: str = "cpu", configs: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
    spec, _ = group_spec(graph, pattern, target)
    assert kf.supports(spec), f"{where}: {kf.name} does not support the group"
    types = graph.types()
    arrays = draw(rng, graph)
    before = {name: arrays[name].copy() for name in graph.state}
    ref_state = {name: a.copy() for name, a in before.items()}
    want = reference_values(graph, arrays, ref_state)
    alias = state_alias(graph)
    inner = [v for n in spec.nodes for v in n.outputs if v not in spec.outputs and types[v].dtype.is_float]
    slack = max((float(np.abs(want[v].astype(np.float64)).max()) for v in inner), default=0.0)
    for config in configs if configs is not None else kf.configs_for(target):
        at = f"{where}, config {config}"
        state = {name: tensor(a, types[name].dtype, device) for name, a in before.items()}
        inputs = [state[v] if v in state else tensor(arrays[v], types[v].dtype, device) for v in spec.inputs]
        outputs = []
        for v in spec.outputs:
            if v in alias:
                outputs.append(state[alias[v]])
                continue
            t = types[v]
            fill = float("nan") if t.dtype.is_float else -(2**30)
            outputs.append(torch.full([int(d) for d in t.shape], fill, dtype=getattr(torch, TORCH_DTYPE[t.dtype]),
                                      device=device))  # fmt: skip
        kf.build(spec, config, target)(inputs, outputs, None)
        for v, out in zip(spec.outputs, outputs, strict=True):
            name = alias.get(v, v)
            dtype = types[name].dtype
            tol = op_tolerance(dtype)
            tol = Tolerance(tol.rtol, tol.atol + tol.rtol * slack)
            got = array(out, dtype)
            expected = ref_state[name] if v in alias else want[v]
            result = compare(got.astype(np.float32), expected.astype(np.float32), tol)
            assert result.ok, f"{at}: `{v}` ({dtype}): {result}"
            if v in alias:  # slots the step does not write keep their bits
                written = np.zeros(got.shape[:2], dtype=bool)
                table, pos = arrays["block_table"], arrays["positions"]
                blocks, slots = reference.cache_slots(table, pos, got.shape[1])
                written[blocks, slots] = True
                kept = ~written
                assert got[kept].tobytes() == before[name][kept].tobytes(), (
                    f"{at}: `{name}`: unwritten slots changed"
                )


# --- interpreter cases -------------------------------------------------------------------------------


def projection_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}

    def add(name: str, file: str, pattern: str, build: Callable[[DType, int, int, int, bool], Graph],
            variant: bool = False) -> None:  # fmt: skip
        # bf16 at every shape (its first also with each rocm config); f32 at M 2 (GEMV) and 3 (tl.dot);
        # a variant of the graph at bf16 only
        for dtype in DTYPES[:1] if variant else DTYPES:
            for i, (m, n, k) in enumerate(SHAPES):
                if dtype == F32 and i == 0:
                    continue
                bias = i == 1

                def case(dtype: DType = dtype, m: int = m, n: int = n, k: int = k, bias: bool = bias) -> None:
                    seed, rng = seeded()
                    kf = kernel(file, interpret=True)
                    graph = build(dtype, m, n, k, bias)
                    targets = (
                        (CUDA, ROCM) if not variant and dtype == BF16 and (m, n, k) == SHAPES[0] else (CUDA,)
                    )
                    for target in targets:
                        where = f"{name} {dtype} M={m} N={n} K={k} bias={bias} {target} (seed {seed})"
                        check(kf, graph, pattern, target, rng, where)

                cases[f"{name}-{dtype}-m{m}n{n}k{k}"] = case

    add("linear", "linear", "linear", linear_graph)
    add("linear+residual", "linear_residual", "linear+residual", residual_graph)
    add("linear+residual.row", "linear_residual", "linear+residual",
        lambda d, m, n, k, b: residual_graph(d, m, n, k, b, row_residual=True), variant=True)  # fmt: skip
    add("rmsnorm+linear", "rmsnorm_linear", "rmsnorm+linear",
        lambda d, m, n, k, b: rmsnorm_linear_graph(d, m, n, k, b, projections=1 + b, norm_out=b))  # fmt: skip
    add("rmsnorm+swiglu", "rmsnorm_swiglu", "rmsnorm+linear+silu*mul", swiglu_graph)

    def qkv_case(dtype: DType, batch: int, seq: int, k: int, bias: bool) -> None:
        seed, rng = seeded()
        graph = qkv_graph(dtype, batch, seq, k, bias)
        kf = kernel("rmsnorm_qkv_rope", interpret=True)
        for target in (CUDA, ROCM) if dtype == BF16 and batch == 1 else (CUDA,):
            where = f"qkv {dtype} B={batch} S={seq} K={k} bias={bias} {target} (seed {seed})"
            check(kf, graph, "rmsnorm+qkv+rope+kv_write", target, rng, where)

    for dtype in DTYPES:
        for batch, seq, k, bias in [(1, 1, 48, False), (2, 1, 128, True), (3, 2, 48, False)]:
            cases[f"qkv-{dtype}-b{batch}s{seq}k{k}"] = functools.partial(qkv_case, dtype, batch, seq, k, bias)
    return cases


def simple_cases() -> dict[str, Callable[[], None]]:
    inp = lambda d, *s: ("input", d, s)  # noqa: E731
    par = lambda d, *s: ("param", d, s)  # noqa: E731
    graphs: dict[str, tuple[str, Callable[[DType], Graph], tuple[DType, ...]]] = {
        "embedding": ("embedding", lambda d: one_node("embedding", {"table": par(d, 37, 48), "ids": inp(I32, 3, 5)}), DTYPES),
        "rmsnorm": ("rmsnorm", lambda d: one_node("rmsnorm", {"x": inp(d, 3, 4, 200), "w": par(d, 200)}, eps=1e-6), DTYPES),
        "rmsnorm.heads": ("rmsnorm", lambda d: one_node("rmsnorm", {"x": inp(d, 2, 3, 5, 16), "w": par(d, 16)}), DTYPES),
        "rope": ("rope", lambda d: one_node("rope", {"x": inp(d, 2, 3, 5, 24), "positions": inp(I32, 2, 3)}, **ROPE), DTYPES),
        "kv_write": ("kv_write", lambda d: one_node("kv_write", {
            "cache": ("state", d, (9, BLOCK_SIZE, 2, 16)), "x": inp(d, 2, 3, 2, 16),
            "block_table": inp(I32, 2, 4), "positions": inp(I32, 2, 3)}), DTYPES),
        "silu": ("elementwise", lambda d: one_node("silu", {"x": inp(d, 3, 7, 16)}), DTYPES),
        "gelu": ("elementwise", lambda d: one_node("gelu", {"x": inp(d, 3, 7, 16)}), DTYPES),
        "gelu.tanh": ("elementwise", lambda d: one_node("gelu", {"x": inp(d, 3, 7, 16)}, approximate="tanh"), DTYPES),
        "mul": ("elementwise", lambda d: one_node("mul", {"a": inp(d, 5, 33), "b": inp(d, 5, 33)}), DTYPES),
        "add.broadcast": ("elementwise", lambda d: one_node("add", {"a": inp(d, 3, 1, 16), "b": inp(d, 5, 16)}), DTYPES),
        "mul.param": ("elementwise", lambda d: one_node("mul", {"a": par(d, 16), "b": inp(d, 2, 3, 16)}), DTYPES),
        "softmax": ("elementwise", lambda d: one_node("softmax", {"x": inp(d, 3, 2, 300)}), DTYPES),
        "softmax.axis1": ("elementwise", lambda d: one_node("softmax", {"x": inp(d, 3, 70, 16)}, axis=1), DTYPES),
        "argmax": ("elementwise", lambda d: one_node("argmax", {"x": inp(d, 3, 2, 300)}), (*DTYPES, I32)),
        "argmax.axis0": ("elementwise", lambda d: one_node("argmax", {"x": inp(d, 70, 5)}, axis=0), DTYPES),
        "cast.down": ("elementwise", lambda d: one_node("cast", {"x": inp(F32, 3, 7, 16)}, dtype=d.value), (BF16, DType.F16)),
        "cast.up": ("elementwise", lambda d: one_node("cast", {"x": inp(d, 3, 7, 16)}, dtype="f32"), (BF16, DType.F16)),
        "cast.to_int": ("elementwise", lambda d: one_node("cast", {"x": inp(d, 3, 7, 16)}, dtype="i32"), DTYPES),
        "cast.from_int": ("elementwise", lambda d: one_node("cast", {"x": inp(I32, 3, 7, 16)}, dtype=d.value), DTYPES),
        "reshape": ("layout", lambda d: one_node("reshape", {"x": inp(d, 2, 3, 16)}, shape=(2, 3, 4, 4)), DTYPES),
        "transpose": ("layout", lambda d: one_node("transpose", {"x": inp(d, 2, 3, 5, 4)}, perm=(0, 2, 1, 3)), DTYPES),
        "slice.last": ("layout", lambda d: one_node("slice", {"x": inp(d, 2, 3, 16)}, axis=1, start=-1), DTYPES),
        "concat": ("layout", lambda d: one_node("concat", {"a": inp(d, 2, 3), "b": inp(d, 2, 16)}, axis=-1), DTYPES),
    }  # fmt: skip

    def case(name: str, file: str, build: Callable[[DType], Graph], dtype: DType) -> None:
        seed, rng = seeded()
        graph = build(dtype)
        for target in (CUDA, ROCM) if dtype == BF16 else (CUDA,):  # bf16 also under each rocm config
            where = f"{name} {dtype} {target} (seed {seed})"
            check(kernel(file, interpret=True), graph, graph.nodes[0].op, target, rng, where)

    def silu_mul_case(dtype: DType, up_first: bool) -> None:
        """The SwiGLU product alone (the GPU prefill's pattern), either operand order, an odd size."""
        seed, rng = seeded()
        g = GraphBuilder("silu_mul")
        gate, up = g.input("gate", dtype, (3, 7, 40)), g.input("up", dtype, (3, 7, 40))
        act = g.op("silu", "act", gate)
        g.output("y", g.op("mul", "mul", *((up, act) if up_first else (act, up))))
        where = f"silu*mul {dtype} up_first={up_first} (seed {seed})"
        check(kernel("silu_mul", interpret=True), g.build(), "silu*mul", CUDA, rng, where)

    cases = {
        f"{name}-{dtype}": functools.partial(case, name, file, build, dtype)
        for name, (file, build, dtypes) in graphs.items()
        for dtype in dtypes
    }
    for dtype in DTYPES:
        for up_first in (False, True):
            cases[f"silu_mul-{dtype}-{'up' if up_first else 'act'}_first"] = functools.partial(
                silu_mul_case, dtype, up_first
            )
    return cases


# The patterns the GPU backend fuses, and which of this file's kernels takes each group of llama-tiny.
GPU_PATTERNS = ("rmsnorm+qkv+rope+kv_write", "rmsnorm+linear+silu*mul", "linear+residual", "rmsnorm+linear")
LLAMA_KERNELS = {"rmsnorm+qkv+rope+kv_write": "rmsnorm_qkv_rope", "rmsnorm+linear+silu*mul": "rmsnorm_swiglu",
                 "linear+residual": "linear_residual", "rmsnorm+linear": "rmsnorm_linear", "embedding": "embedding",
                 "slice": "layout", "cast": "elementwise", "reshape": "layout"}  # fmt: skip


def llama_tiny(batch: int, seq: int, ctx: int, dtype: DType) -> Graph:
    from polymorph.models import load_model
    from polymorph.passes import specialize
    from polymorph.passes.specialize import bucket_bindings

    graph = load_model("llama-tiny", dtype=dtype.value, block_size=BLOCK_SIZE).graph
    return specialize(graph, bucket_bindings(graph, batch, ctx, seq))


def llama_case(batch: int, seq: int, dtype: DType) -> None:
    """Every group of llama-tiny that one of these kernels takes, on the specialized graph."""
    seed, rng = seeded()
    graph = llama_tiny(batch, seq, 12, dtype)
    seen = set()
    for group in fuse(graph, select_patterns(GPU_PATTERNS)):
        file = LLAMA_KERNELS.get(group.pattern)
        if file is None or (group.pattern, group.nodes[0].split(".")[0]) in seen:
            continue
        seen.add((group.pattern, group.nodes[0].split(".")[0]))
        sub = subgraph(graph, group)
        where = f"llama-tiny B={batch} S={seq} {dtype} group `{group.id}` (seed {seed})"
        kf = kernel(file, interpret=True)
        # one config a group: the one with the most rows a GEMV program (the fewest interpreted programs)
        config = max(kf.configs, key=lambda c: c.get("gemv_block_n", 0))
        check(kf, sub, group.pattern, CUDA, rng, where, configs=[config])
    assert {p for p, _ in seen} >= {"rmsnorm+qkv+rope+kv_write", "rmsnorm+linear+silu*mul", "linear+residual"}


def subgraph(graph: Graph, group: Any) -> Graph:
    """The group's nodes as a graph of their own: its inputs as leaves, its outputs as outputs."""
    types = graph.types()
    g = GraphBuilder(group.id)
    by_name = {n.name: n for n in graph.nodes}
    for v in group.inputs:
        if v in graph.state:
            g.state(v, types[v].dtype, types[v].shape)
        elif v in graph.params:
            g.param(v, types[v].dtype, types[v].shape)
        else:
            g.input(v, types[v].dtype, types[v].shape)
    for name in group.nodes:
        g.graph.nodes.append(by_name[name])
    alias = state_alias(graph)
    for v in group.outputs:
        if v in alias:
            g.update(alias[v], v)
        else:
            g.output(v.replace(".", "_"), v)
    return g.build()


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases = {**projection_cases(), **simple_cases()}
    for batch, seq in [(2, 1), (1, 9)]:  # decode on the GEMV, a prefill on tl.dot tiles
        cases[f"llama-tiny-b{batch}s{seq}"] = functools.partial(llama_case, batch, seq, BF16)
    return cases


CASES = interpreter_cases()


@pytest.fixture(scope="module")
def interpreter_run(request: pytest.FixtureRequest) -> Iterator[InterpreterRun]:
    run = InterpreterRun(Path(__file__).resolve(), CASES, selected(request))
    yield run
    run.stop()


# --- contract ----------------------------------------------------------------------------------------


def test_supports_limits() -> None:
    lin, qkv = kernel("linear", interpret=False), kernel("rmsnorm_qkv_rope", interpret=False)
    spec = lambda graph, pattern, target=CUDA: group_spec(graph, pattern, target)[0]  # noqa: E731
    assert lin.supports(spec(linear_graph(BF16, 1, 64, 48, True), "linear"))
    assert not lin.supports(spec(linear_graph(BF16, 1, 64, 48, True), "linear", Target("cpu")))
    assert not lin.supports(spec(linear_graph(DType.F8E4M3, 1, 64, 48, False), "linear"))
    assert qkv.supports(spec(qkv_graph(BF16, 2, 1, 64, True), "rmsnorm+qkv+rope+kv_write", ROCM))
    # a projection that the residual add broadcasts up is refused (the lowering then splits the group)
    g = GraphBuilder("broadcast_proj")
    proj = g.op("linear", "proj", g.input("x", BF16, (1, 24)), g.param("w", BF16, (16, 24)))
    g.output("y", g.op("add", "residual", g.input("r", BF16, (3, 16)), proj))
    assert not kernel("linear_residual", interpret=False).supports(spec(g.build(), "linear+residual"))


def test_configs_reach_both_paths() -> None:
    """The interpreted shapes take the GEMV (M <= GEMV_MAX_M) and the tl.dot path; split-K is exercised."""
    from polymorph.hardware.traits import traits_for

    lin = kernel("linear", interpret=False)
    assert max(m for m, _, _ in SHAPES) > lin.module.GEMV_MAX_M >= min(m for m, _, _ in SHAPES)
    assert any(c["split_k"] > 1 for c in lin.configs_for(CUDA))
    for target in (CUDA, ROCM):
        for c in lin.configs_for(target):
            _, consts = lin.module._plan(33, 48, 1, c, 2, traits_for(target).warp_size)
            assert consts["SPLIT_K"] == (c["split_k"] if 48 % c["split_k"] == 0 else 1)


def test_launches_count_every_projection_of_a_shared_norm() -> None:
    """Three projections of one width share a compile unit but launch three times (and the norm's row
    kernel once more where a config runs it first): the cost model charges launches, not units."""
    kf = kernel("rmsnorm_linear", interpret=False)
    g = GraphBuilder("qkv_unfused")
    h = g.op("rmsnorm", "norm", g.input("x", BF16, (1, 64)), g.param("w_norm", BF16, (64,)), eps=1e-5)
    for i in range(3):
        g.output(f"y{i}", g.op("linear", f"proj{i}", h, g.param(f"w{i}", BF16, (96, 64))))
    spec = group_spec(g.build(), "rmsnorm+linear", CUDA)[0]
    config = kf.configs_for(CUDA)[0]
    assert len(kf.compile_units(spec, config, CUDA)) == 1
    assert kf.launches(spec, config, CUDA) == 3
    prologue = next(c for c in kf.configs_for(CUDA) if c.get("norm_prologue"))
    wide = group_spec(rmsnorm_linear_graph(BF16, 32, 96, 64, False, 1, False), "rmsnorm+linear", CUDA)[0]
    assert kf.launches(wide, prologue, CUDA) == 2  # at 32 rows: the row kernel, then the projection


def test_compile_units_follow_the_path() -> None:
    """Concrete M picks the path; the units' constexprs are the tiles build launches."""
    lin = kernel("linear", interpret=False)
    config = lin.configs_for(CUDA)[0]

    def units(m: int) -> list[Any]:
        spec = group_spec(linear_graph(BF16, m, 2048, 2048, False), "linear", CUDA)[0]
        return lin.compile_units(spec, config, CUDA)

    (gemv,) = units(1)
    (gemm,) = units(64)
    assert gemv.name == "linear_gemv" and gemv.constexprs["BLOCK_M"] == 1 and gemv.constexprs["HINT"]
    assert gemm.name == "linear_gemm" and gemm.constexprs["BLOCK_M"] == 64
    split = next(c for c in lin.configs_for(CUDA) if c["split_k"] > 1)
    names = [u.name for u in lin.compile_units(group_spec(linear_graph(BF16, 1, 512, 2048, False), "linear", CUDA)[0],
                                               split, CUDA)]  # fmt: skip
    assert names == ["linear_gemv_splitk", "linear_splitk_reduce"]


# --- ahead-of-time compile, no device ----------------------------------------------------------------

# Llama-3.2-1B: hidden 2048, 32 query heads and 8 kv heads of 64, ffn 8192, vocab 128256.
LLAMA_1B = {"k": 2048, "heads": 32, "kv_heads": 8, "head_dim": 64, "ffn": 8192}


def llama_1b_specs(target: Target) -> dict[str, tuple[KernelSpec, str]]:
    """The decode (M=1) groups of Llama-3.2-1B that each file takes: N 2048 (q, o), 512 (k, v), 8192
    (gate, up) on K 2048; down_proj is N 2048 on K 8192."""
    k, ffn = LLAMA_1B["k"], LLAMA_1B["ffn"]
    qkv = qkv_graph(BF16, 1, 1, k, False, LLAMA_1B["heads"], LLAMA_1B["kv_heads"], LLAMA_1B["head_dim"], 8)
    out = {
        "linear-n2048": (group_spec(linear_graph(BF16, 1, 2048, k, False), "linear", target)[0], "linear"),
        "linear-n512": (group_spec(linear_graph(BF16, 1, 512, k, False), "linear", target)[0], "linear"),
        "linear-n8192": (group_spec(linear_graph(BF16, 1, 8192, k, False), "linear", target)[0], "linear"),
        "linear+residual-o": (group_spec(residual_graph(BF16, 1, 2048, k, False), "linear+residual", target)[0], "linear_residual"),
        "linear+residual-down": (group_spec(residual_graph(BF16, 1, 2048, ffn, False), "linear+residual", target)[0], "linear_residual"),
        "rmsnorm+linear": (group_spec(rmsnorm_linear_graph(BF16, 1, 2048, k, False, 1, True), "rmsnorm+linear", target)[0], "rmsnorm_linear"),
        "rmsnorm+swiglu": (group_spec(swiglu_graph(BF16, 1, ffn, k, False), "rmsnorm+linear+silu*mul", target)[0], "rmsnorm_swiglu"),
        "rmsnorm+qkv+rope": (group_spec(qkv, "rmsnorm+qkv+rope+kv_write", target)[0], "rmsnorm_qkv_rope"),
        "embedding": (group_spec(one_node("embedding", {"table": ("param", BF16, (4096, k)), "ids": ("input", I32, (1, 1))}), "embedding", target)[0], "embedding"),
        "rmsnorm": (group_spec(one_node("rmsnorm", {"x": ("input", BF16, (1, 1, k)), "w": ("param", BF16, (k,))}), "rmsnorm", target)[0], "rmsnorm"),
        "rope": (group_spec(one_node("rope", {"x": ("input", BF16, (1, 1, 32, 64)), "positions": ("input", I32, (1, 1))}, **ROPE), "rope", target)[0], "rope"),
        "kv_write": (group_spec(one_node("kv_write", {"cache": ("state", BF16, (17, 16, 8, 64)), "x": ("input", BF16, (1, 1, 8, 64)),
                                                      "block_table": ("input", I32, (1, 16)), "positions": ("input", I32, (1, 1))}), "kv_write", target)[0], "kv_write"),
        "softmax": (group_spec(one_node("softmax", {"x": ("input", BF16, (1, 1, 4096))}), "softmax", target)[0], "elementwise"),
        "argmax": (group_spec(one_node("argmax", {"x": ("input", F32, (1, 1, 4096))}), "argmax", target)[0], "elementwise"),
        "add": (group_spec(one_node("add", {"a": ("input", BF16, (1, 1, k)), "b": ("input", BF16, (1, 1, k))}), "add", target)[0], "elementwise"),
        "cast": (group_spec(one_node("cast", {"x": ("input", BF16, (1, 1, 4096))}, dtype="f32"), "cast", target)[0], "elementwise"),
    }  # fmt: skip
    return out


@pytest.mark.compile
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")  # triton 3.9 announces a default change
@pytest.mark.parametrize("target_name", ["cuda:sm_90", "rocm:gfx942"])
def test_compile_units(target_name: str, interpreter_run: InterpreterRun) -> None:
    """Each file's default-config units compile to device code (cubin, HSACO) without a device, and
    the projections' weight streams are 16-byte vector loads. (It asks for `interpreter_run` only to
    start the interpreted cases' children first, so that they run while this compiles.)"""
    import triton
    from triton.backends.compiler import GPUTarget

    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    target = Target.parse(target_name)
    gpu = GPUTarget("cuda", 90, 32) if target.family == "cuda" else GPUTarget("hip", "gfx942", 64)
    vector_load = "ld.global.v4" if target.family == "cuda" else "global_load_dwordx4"
    seen: dict[str, Any] = {}
    for label, (spec, file) in llama_1b_specs(target).items():
        kf = kernel(file, interpret=False)
        assert kf.supports(spec), f"{label}: {file} does not support it"
        units = kf.compile_units(spec, kf.configs_for(target)[0], target)
        assert units, f"{label}: no compile units"
        for unit in units:
            key = repr((unit.name, sorted(unit.signature.items()), sorted(unit.constexprs.items())))
            if key in seen:
                continue
            options = {
                k: v for k, v in unit.options.items() if target.family == "rocm" or k != "waves_per_eu"
            }
            source = triton.compiler.ASTSource(
                unit.fn, dict(unit.signature), constexprs=dict(unit.constexprs)
            )
            compiled = seen[key] = triton.compile(source, target=gpu, options=options)
            binary = "cubin" if target.family == "cuda" else "hsaco"
            assert compiled.asm.get(binary), f"{label} {unit.name}: no {binary} for {target}"
            if (
                file not in ("embedding", "kv_write", "rmsnorm", "rope", "elementwise")
                and "reduce" not in unit.name
            ):
                code = compiled.asm["ptx" if target.family == "cuda" else "amdgcn"]
                assert vector_load in code, (
                    f"{label} {unit.name}: no 16-byte loads ({vector_load}) on {target}"
                )


# --- interpreter: numerics (after the compile test, which runs while the children interpret) ---------


@pytest.mark.parametrize("case", list(CASES))
def test_interpreted(case: str, interpreter_run: InterpreterRun) -> None:
    interpreter_run.check(case)


# --- on a device -------------------------------------------------------------------------------------


def device_target() -> Target:
    if torch.version.hip:
        return Target("rocm", torch.cuda.get_device_properties(0).gcnArchName.split(":")[0])
    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", f"sm_{major}{minor}")


@pytest.mark.parametrize(
    "family", [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("rocm", marks=pytest.mark.rocm)]
)
def test_on_device(family: str) -> None:
    """Compiled kernels on the GPU at sizes past the interpreter's: every config in bf16 on the GEMV
    (M=1, 3) and the tl.dot path (M=40, 300), the default config in f32."""
    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; the device test runs compiled kernels")
    target = device_target()
    seed, rng = seeded()
    cases = {
        "linear": ("linear", lambda d, m, n, k, b: linear_graph(d, m, n, k, b)),
        "linear+residual": ("linear_residual", lambda d, m, n, k, b: residual_graph(d, m, n, k, b)),
        "rmsnorm+linear": ("rmsnorm_linear", lambda d, m, n, k, b: rmsnorm_linear_graph(d, m, n, k, b, 2, b)),
        "rmsnorm+linear+silu*mul": ("rmsnorm_swiglu", lambda d, m, n, k, b: swiglu_graph(d, m, n, k, b)),
    }
    for pattern, (file, build) in cases.items():
        kf = kernel(file, interpret=False)
        for dtype in DTYPES:
            configs = kf.configs_for(target) if dtype == BF16 else kf.configs_for(target)[:1]
            for m, n, k in [(1, 2048, 2048), (3, 1000, 520), (40, 512, 1024), (300, 264, 200)]:
                where = f"{pattern} {dtype} M={m} N={n} K={k} (seed {seed})"
                check(kf, build(dtype, m, n, k, m == 3), pattern, target, rng, where, "cuda", configs)
    kf = kernel("rmsnorm_qkv_rope", interpret=False)
    for dtype in DTYPES:
        configs = kf.configs_for(target) if dtype == BF16 else kf.configs_for(target)[:1]
        for batch, seq in [(1, 1), (5, 1), (2, 40)]:
            graph = qkv_graph(dtype, batch, seq, 256, batch == 5, 8, 2, 64, 16)
            where = f"qkv {dtype} B={batch} S={seq} (seed {seed})"
            check(kf, graph, "rmsnorm+qkv+rope+kv_write", target, rng, where, "cuda", configs)
    kf = kernel("silu_mul", interpret=False)
    for dtype in DTYPES:  # a 2048-token Llama-3.2-1B prefill's SwiGLU product, and an odd size
        for shape in [(1, 2048, 8192), (3, 37, 1001)]:
            g = GraphBuilder("silu_mul")
            gate, up = g.input("gate", dtype, shape), g.input("up", dtype, shape)
            g.output("y", g.op("mul", "mul", g.op("silu", "act", gate), up))
            where = f"silu*mul {dtype} {shape} (seed {seed})"
            check(kf, g.build(), "silu*mul", target, rng, where, "cuda", kf.configs_for(target))


if __name__ == "__main__":
    child_main(CASES)
