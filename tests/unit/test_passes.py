"""polymorph.passes: dce, specialize (+ traffic-bucket bindings), fuse (pattern tables), prepare."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.ir import DType, Graph, Node, TensorType, content_hash, reference, verify
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.shapes import concrete
from polymorph.models.config import load_config
from polymorph.models.decoder import build_decoder
from polymorph.passes import (
    ANY,
    LINEAR_SILU_MUL,
    QKV_ROPE_KV_WRITE,
    RMSNORM_LINEAR,
    STANDARD_PATTERNS,
    NodeGroup,
    Pattern,
    PatternError,
    Step,
    bucket_bindings,
    dce,
    fuse,
    graph_symbols,
    prepare,
    select_patterns,
    specialize,
)

CONFIGS = Path(__file__).resolve().parents[2] / "polymorph" / "models" / "configs"
TINY = ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"]
F32 = DType.F32


def decoder(config: str, **kw: object) -> Graph:
    return build_decoder(load_config(CONFIGS / f"{config}.json"), name=config, **kw)  # type: ignore[arg-type]


def decoder_arrays(
    graph: Graph, sizes: dict[str, int], seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Random params, inputs and cache state for one decoder step at `sizes`.

    Sequences have ragged lengths; block 0 is the guard block no sequence owns.
    """
    rng = np.random.default_rng(seed)
    batch, seq, ctx_blocks, cache_blocks = (sizes[k] for k in ("batch", "seq", "ctx_blocks", "cache_blocks"))
    block_size = graph.meta["block_size"]
    params = {
        name: (0.1 * rng.standard_normal(concrete(t.shape, sizes))).astype(t.dtype.numpy)
        for name, t in graph.params.items()
    }
    vocab = graph.params["model.embed_tokens.weight"].shape[0]
    lengths = rng.integers(seq, ctx_blocks * block_size + 1, size=batch)
    positions = (lengths[:, None] - seq + np.arange(seq)[None, :]).astype(np.int32)  # [B, S]
    owned = rng.permutation(np.arange(1, cache_blocks))[: batch * ctx_blocks]
    inputs = {
        "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
        "positions": positions,
        "block_table": owned.reshape(batch, ctx_blocks).astype(np.int32),
    }
    state = {
        name: rng.standard_normal(concrete(t.shape, sizes)).astype(t.dtype.numpy)
        for name, t in graph.state.items()
    }
    return params, inputs, state


def run(graph: Graph, arrays: tuple[dict, dict, dict]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    params, inputs, state = arrays
    state = {k: v.copy() for k, v in state.items()}
    return reference.run(graph, params, inputs, state), state


def tiny_graph(build: Callable[[GraphBuilder, str, str], None]) -> Graph:
    """A graph over inputs x, y: f32[4] that `build` fills in."""
    g = GraphBuilder("tiny")
    build(g, g.input("x", F32, (4,)), g.input("y", F32, (4,)))
    return g.build()


def execution_order(groups: list[NodeGroup]) -> list[str]:
    return [name for group in groups for name in group.nodes]


def assert_partition(graph: Graph, groups: list[NodeGroup]) -> None:
    """Every node in exactly one group; ids unique; group order is a topological order."""
    order = execution_order(groups)
    assert sorted(order) == sorted(n.name for n in graph.nodes)
    assert len({g.id for g in groups}) == len(groups)
    defined = set(graph.leaves())
    for name in order:
        node = graph.node(name)
        missing = [v for v in node.inputs if v not in defined]
        assert not missing, f"{name} runs before {missing} are defined"
        defined.update(node.outputs)
    producer = {v: g.id for g in groups for n in g.nodes for v in graph.node(n).outputs}
    sinks = set(graph.outputs.values()) | set(graph.state_updates.values())
    for g in groups:
        inside = {v for n in g.nodes for v in graph.node(n).outputs}
        reads = {v for n in g.nodes for v in graph.node(n).inputs}
        assert set(g.inputs) == reads - inside
        read_outside = {v for other in groups if other is not g for v in other.inputs}
        assert set(g.outputs) == {v for v in inside if v in sinks or v in read_outside}
        assert all(producer.get(v) != g.id for v in g.inputs)


# --- dce ---------------------------------------------------------------------------------------------


def test_dce_removes_a_dead_branch_and_its_params() -> None:
    g = decoder("llama-tiny")
    h = g.copy()
    h.params["dead.weight"] = TensorType(F32, (8, 64))
    h.nodes.insert(20, Node("dead.act", "silu", ("layers.0.attn.norm",), ("dead.act",)))
    h.nodes.append(Node("dead.proj", "linear", ("dead.act", "dead.weight"), ("dead.proj",)))
    verify(h)
    out = dce(h)
    assert [n.name for n in out.nodes] == [n.name for n in g.nodes]
    assert "dead.weight" not in out.params
    assert content_hash(out) == content_hash(g)
    assert len(h.nodes) == len(g.nodes) + 2, "the input graph is unchanged"
    assert content_hash(dce(g)) == content_hash(g), "a graph without dead code is kept as it is"


def test_dce_keeps_kv_writes_whose_attention_is_dead() -> None:
    g = decoder("llama-tiny")
    g.outputs = {"embedded": "embed"}  # nothing reads the logits now
    out = dce(g)
    names = {n.name for n in out.nodes}
    writes = {n.name for n in g.nodes if n.op == "kv_write"}
    assert writes <= names
    assert out.state_updates == g.state_updates
    assert out.state == g.state
    # Layer 1's cache writes need layer 0 whole; layer 1's attention output and MLP are dead.
    assert "layers.0.attn.sdpa" in names and "layers.0.mlp.residual" in names
    assert not {"layers.1.attn.sdpa", "layers.1.mlp.down", "final_norm", "lm_head"} & names
    assert "model.norm.weight" not in out.params
    assert "model.layers.1.mlp.down_proj.weight" not in out.params
    assert "model.layers.1.self_attn.k_proj.weight" in out.params


def test_dce_keeps_unread_inputs_and_drops_unread_params() -> None:
    g = GraphBuilder("g")
    x, y = g.input("x", F32, ("n",)), g.input("y", F32, ("n",))
    w = g.param("w", F32, ("n",))
    g.op("mul", "dead", y, w)
    g.output("out", g.op("silu", "act", x))
    out = dce(g.build())
    assert [n.name for n in out.nodes] == ["act"]
    assert set(out.inputs) == {"x", "y"}
    assert out.params == {}


# --- specialize --------------------------------------------------------------------------------------


def test_bucket_bindings() -> None:
    g = decoder("llama-tiny", block_size=4)
    assert bucket_bindings(g, batch=2, ctx=10, seq=3) == {
        "batch": 2,
        "seq": 3,
        "ctx_blocks": 3,
        "cache_blocks": 7,
    }
    assert bucket_bindings(g, batch=8, ctx=16) == {"batch": 8, "seq": 1, "ctx_blocks": 4, "cache_blocks": 33}
    g.meta.pop("block_size")  # read from the k cache instead
    assert bucket_bindings(g, batch=1, ctx=5)["ctx_blocks"] == 2
    with pytest.raises(UserError, match="ctx=2 cannot hold seq=3"):
        bucket_bindings(g, batch=1, ctx=2, seq=3)
    with pytest.raises(UserError, match="batch must be >= 1"):
        bucket_bindings(g, batch=0, ctx=2)


@pytest.mark.parametrize("config", TINY)
def test_specialize_runs_like_the_symbolic_graph(config: str) -> None:
    g = decoder(config, block_size=4)
    sizes = bucket_bindings(g, batch=2, ctx=10, seq=3)
    s = specialize(g, sizes)
    assert graph_symbols(s) == set()
    assert all(isinstance(d, int) for t in s.types().values() for d in t.shape)
    assert all(isinstance(d, int) for n in s.nodes if n.op == "reshape" for d in n.attrs["shape"])
    assert s.meta["bindings"] == sizes
    assert graph_symbols(g) == {"batch", "seq", "ctx_blocks", "cache_blocks"}, "the input graph is unchanged"

    arrays = decoder_arrays(g, sizes)
    want, want_state = run(g, arrays)
    got, got_state = run(s, arrays)
    assert want.keys() == got.keys() == {"logits"}
    np.testing.assert_array_equal(got["logits"], want["logits"])
    for name in g.state:
        np.testing.assert_array_equal(got_state[name], want_state[name])
        # the spare block is a guard that no sequence owns: untouched by the step
        np.testing.assert_array_equal(got_state[name][0], arrays[2][name][0])
    assert any(not np.array_equal(got_state[n], arrays[2][n]) for n in g.state), "the step wrote the cache"


def test_specialize_in_steps_and_bad_bindings() -> None:
    g = decoder("llama-tiny")
    partial = specialize(g, {"batch": 4, "cache_blocks": np.int64(9)})
    assert graph_symbols(partial) == {"seq", "ctx_blocks"}
    assert partial.inputs["tokens"].shape == (4, "seq")
    assert all(type(d) is int for t in partial.state.values() for d in t.shape)
    full = specialize(partial, {"seq": 1, "ctx_blocks": 2})
    assert graph_symbols(full) == set()
    assert full.meta["bindings"] == {"batch": 4, "cache_blocks": 9, "seq": 1, "ctx_blocks": 2}
    with pytest.raises(
        UserError, match=r"no symbol `ctx`; its symbols are: batch, cache_blocks, ctx_blocks, seq"
    ):
        specialize(g, {"ctx": 128})
    with pytest.raises(UserError, match="symbol `batch` must be >= 1"):
        specialize(g, {"batch": 0})
    with pytest.raises(UserError, match="must be an integer"):
        specialize(g, {"batch": 2.5})


# --- fuse --------------------------------------------------------------------------------------------

# (config, build kwargs) -> fused groups per pattern with the standard table.
# rmsnorm+linear: the MoE routers with their norms, and the final norm with lm_head (the last-token
# slice comes before the final norm, so the norm feeds lm_head directly).
EXPECTED = {
    "llama-tiny": {"qkv+rope+kv_write": 2, "linear+silu*mul": 2, "linear+residual": 4, "rmsnorm+linear": 1},
    "moe-tiny": {"qkv+rope+kv_write": 2, "linear+residual": 2, "rmsnorm+linear": 3},
    "qwen3-moe-tiny": {"qkv+qk_norm+rope+kv_write": 2, "linear+residual": 2, "rmsnorm+linear": 3},
}


def fused_counts(groups: list[NodeGroup]) -> dict[str, int]:
    return dict(Counter(g.pattern for g in groups if g.roles))


@pytest.mark.parametrize("config", TINY)
def test_standard_fusion_partitions_the_decoder(config: str) -> None:
    g = decoder(config)
    groups = fuse(g, STANDARD_PATTERNS)
    assert_partition(g, groups)
    assert fused_counts(groups) == EXPECTED[config]
    ids = [x.id for x in groups]
    assert "layers.1.attn.o+residual" in ids
    singles = [x for x in groups if not x.roles]
    assert all(
        len(x.nodes) == 1 and x.pattern == g.node(x.nodes[0]).op and x.id == x.nodes[0] for x in singles
    )
    again = fuse(decoder(config), STANDARD_PATTERNS)
    assert again == groups, "group ids and contents are stable across builds"


def test_fusion_groups_of_llama() -> None:
    g = decoder("llama-tiny")
    groups = {x.id: x for x in fuse(g, STANDARD_PATTERNS)}
    down = groups["layers.1.mlp.down+residual"]
    assert down.pattern == "linear+residual"
    assert down.nodes == ("layers.1.mlp.down", "layers.1.mlp.residual")
    assert down.inputs == (
        "layers.1.mlp.swiglu",
        "model.layers.1.mlp.down_proj.weight",
        "layers.1.attn.residual",
    )
    assert down.outputs == ("layers.1.mlp.residual",)
    swiglu = groups["layers.0.mlp.gate+up+silu+swiglu"]
    assert swiglu.role("gate") == ("layers.0.mlp.gate",) and swiglu.role("up") == ("layers.0.mlp.up",)
    qkv = groups["layers.0.attn.q+k+v+q_heads+k_heads+v_heads+q_rope+k_rope+k_write+v_write"]
    assert qkv.outputs == ("layers.0.attn.q_rope", "layers.0.attn.k_write", "layers.0.attn.v_write")
    assert {"layers.0.k_cache", "layers.0.v_cache", "block_table", "positions"} <= set(qkv.inputs)


@pytest.mark.parametrize("config", TINY)
def test_running_groups_in_order_matches_the_reference(config: str) -> None:
    g = decoder(config, block_size=4)
    groups = fuse(g, STANDARD_PATTERNS)
    reordered = g.copy()
    reordered.nodes = [g.node(n) for n in execution_order(groups)]
    verify(reordered)
    arrays = decoder_arrays(g, bucket_bindings(g, batch=2, ctx=9, seq=2), seed=1)
    (want, _), (got, _) = run(g, arrays), run(reordered, arrays)
    np.testing.assert_array_equal(got["logits"], want["logits"])


def test_table_order_decides_overlaps() -> None:
    g = decoder("llama-tiny")
    norm_first = fuse(g, [RMSNORM_LINEAR, QKV_ROPE_KV_WRITE, LINEAR_SILU_MUL])
    assert_partition(g, norm_first)
    assert fused_counts(norm_first) == {"rmsnorm+linear": 5}  # 2 layers x (attn, mlp) + final norm
    ids = {x.id for x in norm_first}
    assert {"layers.0.attn.norm+q+k+v", "layers.0.mlp.norm+gate+up"} <= ids
    qkv_first = fuse(g, [QKV_ROPE_KV_WRITE, RMSNORM_LINEAR])
    # mlp.norm+gate+up twice, final_norm+lm_head once
    assert fused_counts(qkv_first) == {"qkv+rope+kv_write": 2, "rmsnorm+linear": 3}
    all_logits = fuse(decoder("llama-tiny", all_logits=True), STANDARD_PATTERNS)
    assert "final_norm+lm_head" in {x.id for x in all_logits}
    assert select_patterns(["rmsnorm+linear", "linear+residual"])[0] is RMSNORM_LINEAR
    with pytest.raises(UserError, match="no fusion pattern `gemm`; the table has: qkv"):
        select_patterns(["gemm"])


def test_no_patterns_gives_one_group_per_node() -> None:
    g = decoder("moe-tiny")
    groups = fuse(g, ())
    assert [x.id for x in groups] == [n.name for n in g.nodes]
    assert [x.pattern for x in groups] == [n.op for n in g.nodes]


def test_an_intermediate_read_outside_blocks_a_match() -> None:
    g = decoder("llama-tiny")
    g.outputs["probe"] = "layers.0.mlp.silu"  # a graph output reads layer 0's silu
    g.nodes.append(Node("probe1", "add", ("layers.1.mlp.silu", "layers.1.mlp.silu"), ("probe1",)))
    g.outputs["probe1"] = "probe1"  # a node outside reads layer 1's silu
    g.nodes.append(Node("probe2", "silu", ("layers.1.attn.o",), ("probe2",)))
    g.outputs["probe2"] = "probe2"  # and layer 1's o-proj, which must feed only its residual add
    verify(g)
    groups = fuse(g, STANDARD_PATTERNS)
    assert_partition(g, groups)
    counts = fused_counts(groups)
    assert "linear+silu*mul" not in counts
    assert counts["linear+residual"] == 3
    assert "layers.1.attn.o" in {x.id for x in groups}


# A pattern written by a third party: a silu and an add that reads it; both values may leave the group.
SILU_ADD = Pattern(
    "silu+add",
    (Step("act", "silu", ("$x",)), Step("sum", "add", ("act", ANY))),
    outputs=("act", "sum"),
)


def test_a_pattern_that_would_create_a_cycle_is_rejected() -> None:
    def direct(g: GraphBuilder, x: str, y: str) -> None:
        a = g.op("silu", "a", x)
        b = g.op("mul", "b", a, a)
        g.output("c", g.op("add", "c", a, b))  # a -> b -> c: {a, c} would wait on b, which waits on a

    groups = fuse(tiny_graph(direct), [SILU_ADD])
    assert [x.id for x in groups] == ["a", "b", "c"]

    def no_cycle(g: GraphBuilder, x: str, y: str) -> None:
        b = g.op("mul", "b", y, y)
        g.output("c", g.op("add", "c", b, g.op("silu", "a", x)))

    groups = fuse(tiny_graph(no_cycle), [SILU_ADD])
    assert [(x.id, x.pattern) for x in groups] == [("b", "mul"), ("a+c", "silu+add")]


def test_a_cycle_through_another_group_is_rejected() -> None:
    def crossed(g: GraphBuilder, x: str, y: str) -> None:
        a = g.op("silu", "a", x)
        b = g.op("silu", "b", y)
        g.output("c", g.op("add", "c", b, a))
        g.output("d", g.op("add", "d", a, b))

    graph = tiny_graph(crossed)
    groups = fuse(graph, [SILU_ADD])
    # {a, c} forms first; {b, d} alone has no outside path back into it, but b -> c is inside {a, c},
    # and {a, c} feeds d: the two groups would wait on each other.
    assert [x.id for x in groups] == ["b", "a+c", "d"]
    assert_partition(graph, groups)


def test_pattern_templates_are_checked() -> None:
    cases = [
        ((Step("a", "nope", ("$x",)),), ("a",), "unknown op `nope`"),
        (
            (Step("a", "silu", ("$x",)), Step("b", "add", ("c", ANY))),
            ("b",),
            "input `c` names no earlier step",
        ),
        ((Step("a", "silu", ("$x",)), Step("b", "silu", ("$y",))), ("b",), "nothing anchors it"),
        ((Step("a", "silu", ("$x",), many=True),), ("a",), "cannot be many=True"),
        (
            (Step("a", "silu", ("$x",)), Step("b", "silu", ("a",), many=True), Step("c", "silu", ("b",))),
            ("c",),
            "refers to a many=True step",
        ),
        ((Step("a", "silu", ("$x",)), Step("a", "silu", ("a",))), ("a",), "used twice"),
        ((Step("a", "silu", ("$x",)),), ("z",), "output `z`: names no step"),
        ((Step("a", "silu", ("$x", ANY)),), ("a",), "takes at most 1"),
        (
            (Step("a", "silu", ("$x",)), Step("b", "add", ("a:x", ANY))),
            ("b",),
            "expected `step`, `step:<int>`",
        ),
    ]
    for steps, outputs, message in cases:
        with pytest.raises(PatternError, match=message):
            Pattern("p", steps, outputs)


def test_multi_output_steps_and_commuted_inputs() -> None:
    # A router pattern reaching the second output (indices) of topk_router, on the MoE decoder.
    router = Pattern(
        "topk+moe_ffn",
        (
            Step("topk", "topk_router", (ANY,)),
            Step("ffn", "moe_ffn", ("$x", "topk:0", "topk:1")),
        ),
        outputs=("ffn",),
    )
    g = decoder("moe-tiny")
    groups = fuse(g, [router, *STANDARD_PATTERNS])
    assert_partition(g, groups)
    assert "layers.0.moe.topk+experts" in {x.id for x in groups}
    # The residual add reads (x, proj); a template written add(proj, $residual) matches it too.
    flipped = Pattern(
        "residual",
        (Step("proj", "linear", (ANY, ANY)), Step("add", "add", ("proj", "$res"))),
        outputs=("add",),
    )
    assert fused_counts(fuse(decoder("llama-tiny"), [flipped])) == {"residual": 4}


# --- the pipeline ------------------------------------------------------------------------------------


def test_prepare_runs_every_pass() -> None:
    g = decoder("qwen3-moe-tiny")
    g.params["unused.weight"] = TensorType(F32, (3,))
    sizes = bucket_bindings(g, batch=4, ctx=64)
    out, groups = prepare(g, sizes, STANDARD_PATTERNS)
    assert "unused.weight" not in out.params
    assert graph_symbols(out) == set()
    assert_partition(out, groups)
    assert fused_counts(groups) == EXPECTED["qwen3-moe-tiny"]
    plain, singles = prepare(g)
    assert graph_symbols(plain) == graph_symbols(g)
    assert len(singles) == len(plain.nodes)
