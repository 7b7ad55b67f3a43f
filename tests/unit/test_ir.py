"""polymorph.ir: the verifier's faults, the printer, and the JSON form (round trip, hash, bad input)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polymorph.errors import UserError
from polymorph.ir import DType, Graph, GraphError, Node, TensorType, content_hash, format_graph, verify
from polymorph.ir.serialize import GraphFormatError, from_dict, from_json, load, save, to_dict, to_json
from polymorph.models import load_model

F32, I32 = DType.F32, DType.I32
TINY = ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"]


def t(dtype: DType, *shape: int | str) -> TensorType:
    return TensorType(dtype, tuple(shape))


def one_line(message: str) -> None:
    assert message and "\n" not in message, f"error message is not one line: {message!r}"


# --- graphs the fault table starts from --------------------------------------------------------------


def mlp(*nodes: Node, outputs: dict[str, str] | None = None) -> Graph:
    """x: f32[batch, 8] and w: f32[16, 8], with `nodes`; returns the last node's first output."""
    return Graph(
        name="mlp",
        inputs={"x": t(F32, "batch", 8)},
        params={"w": t(F32, 16, 8), "w2": t(F32, 8, 16)},
        nodes=list(nodes),
        outputs={"y": nodes[-1].outputs[0]} if outputs is None else outputs,
    )


def paged(
    *nodes: Node, updates: dict[str, str] | None = None, outputs: dict[str, str] | None = None
) -> Graph:
    """One attention layer over a paged cache: q [B, S, 4, 8], k [B, S, 2, 8], cache [N, 4, 2, 8]."""
    return Graph(
        name="paged",
        inputs={
            "q": t(F32, "batch", "seq", 4, 8),
            "k": t(F32, "batch", "seq", 2, 8),
            "table": t(I32, "batch", "ctx_blocks"),
            "pos": t(I32, "batch", "seq"),
        },
        state={"kc": t(F32, "cache_blocks", 4, 2, 8), "vc": t(F32, "cache_blocks", 4, 2, 8)},
        nodes=list(nodes),
        outputs={"y": nodes[-1].outputs[0]} if outputs is None else outputs,
        state_updates={} if updates is None else updates,
    )


def write(name: str, cache: str, out: str) -> Node:
    return Node(name, "kv_write", (cache, "k", "table", "pos"), (out,))


def sdpa(name: str, kc: str, vc: str) -> Node:
    return Node(name, "cache_attention", ("q", kc, vc, "table", "pos"), (name,), {"scale": 0.35})


def lin(name: str, x: str = "x", w: str = "w", **attrs: Any) -> Node:
    return Node(name, "linear", (x, w), (name,), attrs)


# (id, graph, the place the message names, the fault it names)
FAULTS: list[tuple[str, Callable[[], Graph], str, str]] = [
    (
        "undefined-input",
        lambda: mlp(lin("up", x="nope")),
        "node `up` (linear)",
        "input 0 `nope` is not defined before this node",
    ),
    (
        "use-before-definition",
        lambda: mlp(Node("act", "silu", ("up",), ("act",)), lin("up")),
        "node `act` (silu)",
        "input 0 `up` is not defined",
    ),
    (
        "ssa-redefinition",
        lambda: mlp(lin("up"), Node("act", "silu", ("up",), ("up",))),
        "node `act` (silu)",
        "output `up` is already defined (values are SSA)",
    ),
    (
        "output-shadows-a-leaf",
        lambda: mlp(Node("act", "silu", ("x",), ("x",))),
        "node `act` (silu)",
        "output `x` is already defined",
    ),
    (
        "duplicate-node-name",
        lambda: mlp(lin("up"), Node("up", "silu", ("up",), ("act",))),
        "node `up` (silu)",
        "node name is used twice",
    ),
    (
        "unknown-op",
        lambda: mlp(Node("frob", "frobnicate", ("x",), ("frob",))),
        "node `frob` (frobnicate)",
        "unknown op `frobnicate`",
    ),
    (
        "bad-attr-type",
        lambda: mlp(Node("sm", "softmax", ("x",), ("sm",), {"axis": "last"})),
        "node `sm` (softmax)",
        "attribute `axis` must be int, got 'last'",
    ),
    (
        "bool-is-not-an-int-attr",
        lambda: mlp(Node("sm", "softmax", ("x",), ("sm",), {"axis": True})),
        "node `sm` (softmax)",
        "attribute `axis` must be int",
    ),
    (
        "attr-not-a-choice",
        lambda: mlp(Node("g", "gelu", ("x",), ("g",), {"approximate": "erf"})),
        "node `g` (gelu)",
        "attribute `approximate` must be one of ['none', 'tanh']",
    ),
    (
        "missing-required-attr",
        lambda: paged(Node("attn", "cache_attention", ("q", "kc", "vc", "table", "pos"), ("attn",))),
        "node `attn` (cache_attention)",
        "missing required attribute `scale`",
    ),
    (
        "unknown-attr",
        lambda: mlp(lin("up", bogus=1)),
        "node `up` (linear)",
        "unknown attribute(s) ['bogus'] for op `linear`",
    ),
    (
        "arity",
        lambda: mlp(Node("act", "silu", ("x", "x"), ("act",))),
        "node `act` (silu)",
        "takes 1 inputs, got 2",
    ),
    (
        "output-count",
        lambda: mlp(Node("r", "topk_router", ("x",), ("r",), {"k": 2})),
        "node `r` (topk_router)",
        "produces 2 outputs, the node names 1",
    ),
    (
        "linear-inner-dim",
        lambda: mlp(lin("up"), lin("down", x="up", w="w")),
        "node `down` (linear)",
        "disagree on the inner dim: 16 != 8",
    ),
    (
        "gqa-head-mismatch",
        lambda: Graph(
            "gqa",
            inputs={"q": t(F32, 1, 5, 3, 8), "k": t(F32, 1, 5, 2, 8), "v": t(F32, 1, 5, 2, 8)},
            nodes=[Node("attn", "attention", ("q", "k", "v"), ("attn",), {"scale": 0.35})],
            outputs={"y": "attn"},
        ),
        "node `attn` (attention)",
        "query heads 3 are not a multiple of kv heads 2",
    ),
    (
        "float-op-on-ints",
        lambda: Graph(
            "ints", inputs={"i": t(I32, 4)}, nodes=[Node("a", "silu", ("i",), ("a",))], outputs={"y": "a"}
        ),
        "node `a` (silu)",
        "x must be a float tensor, got i32[4]",
    ),
    (
        "stale-state-read-after-kv-write",
        lambda: paged(write("kw", "kc", "kc1"), sdpa("attn", "kc", "vc"), updates={"kc": "kc1"}),
        "node `attn` (cache_attention)",
        "reads `kc`, a stale version of state `kc`",
    ),
    (
        "stale-state-write",
        lambda: paged(
            write("kw1", "kc", "kc1"),
            write("kw2", "kc", "kc2"),
            sdpa("attn", "kc2", "vc"),
            updates={"kc": "kc2"},
        ),
        "node `kw2` (kv_write)",
        "writes a stale version of state `kc`",
    ),
    (
        "kv-write-into-a-non-state",
        lambda: paged(Node("kw", "kv_write", ("k", "k", "table", "pos"), ("kc1",))),
        "node `kw` (kv_write)",
        "writes `k`, which is neither a state tensor nor a kv_write result",
    ),
    (
        "undeclared-state-update",
        lambda: paged(write("kw", "kc", "kc1"), sdpa("attn", "kc1", "vc")),
        "state `kc`",
        "is written but its update is not declared in state_updates",
    ),
    (
        "update-is-not-the-last-write",
        lambda: paged(
            write("kw1", "kc", "kc1"),
            write("kw2", "kc1", "kc2"),
            sdpa("attn", "kc2", "vc"),
            updates={"kc": "kc1"},
        ),
        "state update `kc`",
        "`kc1` is not the last kv_write of this state",
    ),
    (
        "update-of-a-non-state",
        lambda: paged(sdpa("attn", "kc", "vc"), updates={"q": "attn"}),
        "state update `q`",
        "is not a state tensor",
    ),
    (
        "empty-outputs",
        lambda: mlp(lin("up"), outputs={}),
        "outputs",
        "the graph returns nothing",
    ),
    (
        "output-names-undefined-value",
        lambda: mlp(lin("up"), outputs={"y": "upp"}),
        "output `y`",
        "names undefined value `upp`",
    ),
    (
        "leaf-defined-twice",
        lambda: Graph(
            "twice",
            inputs={"x": t(F32, 4)},
            params={"x": t(F32, 4)},
            nodes=[Node("a", "silu", ("x",), ("a",))],
            outputs={"y": "a"},
        ),
        "param `x`",
        "name is defined twice",
    ),
    (
        "negative-leaf-dim",
        lambda: Graph(
            "neg", inputs={"x": t(F32, -1)}, nodes=[Node("a", "silu", ("x",), ("a",))], outputs={"y": "a"}
        ),
        "input `x`",
        "dimension -1 is neither a count nor a symbol name",
    ),
    (
        "leaf-dim-not-an-identifier",
        lambda: Graph(
            "sym", inputs={"x": t(F32, "n+1")}, nodes=[Node("a", "silu", ("x",), ("a",))], outputs={"y": "a"}
        ),
        "input `x`",
        "dimension 'n+1' is neither a count nor a symbol name",
    ),
]


def test_fault_table_starts_from_valid_graphs() -> None:
    verify(mlp(lin("up"), Node("act", "silu", ("up",), ("act",)), lin("down", x="act", w="w2")))
    verify(
        paged(
            write("kw", "kc", "kc1"),
            Node("vw", "kv_write", ("vc", "k", "table", "pos"), ("vc1",)),
            sdpa("attn", "kc1", "vc1"),
            updates={"kc": "kc1", "vc": "vc1"},
        )
    )


@pytest.mark.parametrize(("build", "where", "fault"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_verifier_names_the_node_and_the_fault(build: Callable[[], Graph], where: str, fault: str) -> None:
    graph = build()
    with pytest.raises(GraphError) as info:
        verify(graph)
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert message.startswith(f"graph `{graph.name}`: {where}: "), message
    assert fault in message, message
    one_line(message)


@pytest.mark.parametrize("model", TINY)
def test_verifier_rejects_a_decoder_that_forgets_a_cache_update(model: str) -> None:
    graph = load_model(model).graph
    verify(graph)
    broken = graph.copy()
    del broken.state_updates["layers.1.v_cache"]
    with pytest.raises(
        GraphError, match=r"state `layers\.1\.v_cache`: is written but its update is not declared"
    ):
        verify(broken)


@pytest.mark.parametrize("model", TINY)
def test_verifier_rejects_a_decoder_reading_the_cache_before_its_write(model: str) -> None:
    graph = load_model(model).graph
    broken = graph.copy()
    i = next(i for i, n in enumerate(broken.nodes) if n.name == "layers.0.attn.sdpa")
    sdpa_node = broken.nodes[i]
    broken.nodes[i] = dataclasses.replace(
        sdpa_node, inputs=(sdpa_node.inputs[0], "layers.0.k_cache", *sdpa_node.inputs[2:])
    )
    with pytest.raises(
        GraphError,
        match=r"node `layers\.0\.attn\.sdpa` \(cache_attention\): reads `layers\.0\.k_cache`, a stale",
    ):
        verify(broken)


def test_verify_returns_every_type() -> None:
    graph = load_model("llama-tiny").graph
    types = verify(graph)
    assert set(types) == set(graph.leaves()) | {v for n in graph.nodes for v in n.outputs}
    assert types == graph.types()
    assert types["embed"] == t(F32, "batch", "seq", 64)
    assert types["lm_head"] == t(F32, "batch", 1, 256)


# --- printer -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", TINY)
def test_printer_shows_every_node_value_and_type(model: str) -> None:
    graph = load_model(model).graph
    text = format_graph(graph)
    types = graph.types()
    assert text.splitlines()[0] == f"graph {graph.name}"
    for kind, table in (("input", graph.inputs), ("param", graph.params), ("state", graph.state)):
        for name, tt in table.items():
            assert f"{kind:<5} {name}: {tt}" in text
    for n in graph.nodes:
        assert n.name in text
        assert f"= {n.op}(" in text
        for out in n.outputs:
            assert f"%{out}: {types[out]}" in text
    for name, value in graph.outputs.items():
        assert f"output {name} = %{value}" in text
    for name, value in graph.state_updates.items():
        assert f"update {name} = %{value}" in text


def test_printer_types_and_attrs() -> None:
    text = format_graph(load_model("llama-tiny").graph)
    assert "%embed: f32[batch, seq, 64] = embedding(model.embed_tokens.weight, tokens)" in text
    assert "{shape=[batch, seq, 4, 16]}" in text  # dims print as a list
    assert "scale=0.25" in text  # a required attr is always shown
    assert "rope_type='llama3'" in text
    assert "causal" not in text  # defaults are not shown


def test_printer_names_a_node_whose_name_differs_from_its_value() -> None:
    graph = mlp(lin("up"), Node("layers.0.mlp.act", "silu", ("up",), ("h",)))
    verify(graph)
    assert "layers.0.mlp.act" in format_graph(graph)


# --- JSON form: round trip and content hash ----------------------------------------------------------


@pytest.mark.parametrize("model", TINY)
def test_json_round_trip_is_exact(model: str, tmp_path: Path) -> None:
    graph = load_model(model).graph
    text = to_json(graph)
    back = from_json(text, "mem")
    assert back == graph
    assert content_hash(back) == content_hash(graph)
    assert to_json(back) == text, "the JSON form is canonical"
    verify(back)

    path = tmp_path / f"{model}.json"
    save(graph, path)
    assert load(path) == graph
    assert json.loads(path.read_text())["schema_version"] == 1


def test_hash_differs_between_models() -> None:
    hashes = {content_hash(load_model(m).graph) for m in TINY}
    assert len(hashes) == len(TINY)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in hashes)


@pytest.mark.parametrize(
    ("node", "attr", "value"),
    [
        ("layers.0.attn.norm", "eps", 1e-6),
        ("layers.1.attn.q_rope", "theta", 500000.0),
        ("layers.0.attn.sdpa", "scale", 0.5),
        ("last_token", "start", -2),
    ],
)
def test_hash_changes_with_one_attr(node: str, attr: str, value: Any) -> None:
    graph = load_model("llama-tiny").graph
    changed = graph.copy()
    i = next(i for i, n in enumerate(changed.nodes) if n.name == node)
    old = changed.nodes[i]
    assert old.attrs[attr] != value
    changed.nodes[i] = dataclasses.replace(old, attrs={**old.attrs, attr: value})
    verify(changed)
    assert content_hash(changed) != content_hash(graph)
    assert content_hash(graph) == content_hash(load_model("llama-tiny").graph), "the hash is deterministic"


def test_hash_changes_with_a_shape_or_dtype() -> None:
    graph = load_model("llama-tiny").graph
    h = content_hash(graph)
    other = graph.copy()
    other.inputs["tokens"] = t(DType.I64, "batch", "seq")
    assert content_hash(other) != h
    other = graph.copy()
    other.state["layers.0.k_cache"] = t(F32, "cache_blocks", 8, 2, 16)
    assert content_hash(other) != h


def test_hash_ignores_meta() -> None:
    graph = load_model("llama-tiny").graph
    other = graph.copy()
    other.meta = {"family": "somewhere else", "note": [1, 2, 3]}
    assert content_hash(other) == content_hash(graph)
    assert to_json(other) != to_json(graph), "meta still travels in the JSON"
    assert from_json(to_json(other)).meta == other.meta


# --- JSON form: malformed input ----------------------------------------------------------------------


def _llama_dict() -> dict[str, Any]:
    return to_dict(load_model("llama-tiny").graph)


def _edit(change: Callable[[dict[str, Any]], None]) -> str:
    d = _llama_dict()
    change(d)
    return json.dumps(d)


def _node(d: dict[str, Any], op: str) -> dict[str, Any]:
    return next(n for n in d["nodes"] if n["op"] == op)


MALFORMED: list[tuple[str, Callable[[], str], str]] = [
    ("not-json", lambda: "{this is not json", "not valid JSON"),
    ("empty-text", lambda: "", "not valid JSON"),
    ("truncated", lambda: to_json(load_model("llama-tiny").graph)[:500], "not valid JSON"),
    ("top-level-list", lambda: "[1, 2]", "top level: expected a JSON object"),
    (
        "wrong-schema-version",
        lambda: _edit(lambda d: d.update(schema_version=2)),
        "schema_version: expected 1, got 2",
    ),
    (
        "no-schema-version",
        lambda: _edit(lambda d: d.pop("schema_version")),
        "schema_version: expected 1, got None",
    ),
    ("missing-nodes", lambda: _edit(lambda d: d.pop("nodes")), "nodes: missing"),
    ("missing-name", lambda: _edit(lambda d: d.pop("name")), "name: missing"),
    ("missing-outputs", lambda: _edit(lambda d: d.pop("outputs")), "outputs: missing"),
    ("nodes-not-a-list", lambda: _edit(lambda d: d.update(nodes={})), "nodes: expected a list"),
    ("node-missing-op", lambda: _edit(lambda d: d["nodes"][0].pop("op")), "nodes[0]: expected {name, op"),
    (
        "bad-dtype",
        lambda: _edit(lambda d: d["inputs"]["tokens"].update(dtype="int3")),
        "unknown dtype `int3`",
    ),
    (
        "type-extra-key",
        lambda: _edit(lambda d: d["params"]["model.norm.weight"].update(layout="row")),
        "expected {dtype, shape}",
    ),
    (
        "bad-shape-entry-float",
        lambda: _edit(lambda d: d["inputs"]["tokens"].update(shape=["batch", 1.5])),
        "inputs.tokens: shape entries must be ints or symbol names",
    ),
    (
        "bad-shape-entry-bool",
        lambda: _edit(lambda d: d["state"]["layers.0.k_cache"].update(shape=[True, 16, 2, 16])),
        "state.layers.0.k_cache: shape entries must be ints or symbol names",
    ),
    (
        "bad-shape-entry-null",
        lambda: _edit(lambda d: d["params"]["model.norm.weight"].update(shape=[None])),
        "params.model.norm.weight: shape entries must be ints or symbol names",
    ),
    (
        "shape-not-a-list",
        lambda: _edit(lambda d: d["inputs"]["tokens"].update(shape="batch")),
        "expected {dtype, shape}",
    ),
    (
        "unknown-op",
        lambda: _edit(lambda d: _node(d, "silu").update(op="swish")),
        "node `layers.0.mlp.silu`: unknown op `swish`",
    ),
    (
        "bad-attr",
        lambda: _edit(lambda d: _node(d, "rmsnorm")["attrs"].update(eps="small")),
        "node `layers.0.attn.norm`: attribute `eps` must be float",
    ),
    (
        "attrs-not-an-object",
        lambda: _edit(lambda d: _node(d, "silu").update(attrs=[])),
        "attrs must be an object",
    ),
    (
        "input-not-a-name",
        lambda: _edit(lambda d: _node(d, "silu").update(inputs=[3])),
        "node `layers.0.mlp.silu`: inputs and outputs must be lists of value names",
    ),
    (
        "outputs-not-an-object",
        lambda: _edit(lambda d: d.update(outputs=["logits"])),
        "outputs: expected an object",
    ),
    ("name-not-a-string", lambda: _edit(lambda d: d.update(name=7)), "name: expected a string"),
]


@pytest.mark.parametrize(("text", "fault"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_json_names_the_source_in_one_line(text: Callable[[], str], fault: str) -> None:
    with pytest.raises(GraphFormatError) as info:
        from_json(text(), "graphs/bad.json")
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert message.startswith("graphs/bad.json: "), message
    assert fault in message, message
    one_line(message)


def test_load_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(GraphFormatError, match=r"missing\.json: cannot read the IR file") as info:
        load(missing)
    one_line(str(info.value))
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    with pytest.raises(GraphFormatError, match=f"^{bad}: name: missing$"):
        load(bad)


def test_structurally_valid_json_still_needs_verify() -> None:
    """from_json reads structure; a dangling input is the verifier's to report."""
    graph = from_json(_edit(lambda d: _node(d, "silu").update(inputs=["nowhere"])), "mem")
    with pytest.raises(
        GraphError, match=r"node `layers\.0\.mlp\.silu` \(silu\): input 0 `nowhere` is not defined"
    ):
        verify(graph)


# --- known bugs (non-test code): each names file and line in its reason ------------------------------


@pytest.mark.parametrize("meta", [[1, 2], "ab", 3])
def test_meta_that_is_not_an_object_is_a_format_error(meta: Any) -> None:
    with pytest.raises(GraphFormatError):
        from_dict({**_llama_dict(), "meta": meta}, "bad.json")


@pytest.mark.parametrize("value", [None, 5])
def test_node_inputs_that_are_not_a_list_are_a_format_error(value: Any) -> None:
    d = _llama_dict()
    d["nodes"][0]["inputs"] = value
    with pytest.raises(GraphFormatError):
        from_dict(d, "bad.json")


def test_node_inputs_given_as_a_string_are_a_format_error() -> None:
    d = _llama_dict()
    silu = _node(d, "silu")
    silu["inputs"] = "up"  # not ["up"]
    with pytest.raises(GraphFormatError):
        from_dict(d, "bad.json")


def test_load_of_a_binary_file_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "weights.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(GraphFormatError, match=r"weights\.json"):
        load(path)


def test_deeply_nested_json_is_a_format_error() -> None:
    with pytest.raises(GraphFormatError):
        from_json("[" * 100_000 + "]" * 100_000, "deep.json")


def _scalar_graph(op: str, *inputs: TensorType, n_out: int = 1, **attrs: Any) -> Graph:
    names = [f"in{i}" for i in range(len(inputs))]
    outs = tuple(f"out{i}" for i in range(n_out))
    return Graph(
        "scalar",
        inputs=dict(zip(names, inputs)),
        nodes=[Node("n", op, tuple(names), outs, attrs)],
        outputs={"y": outs[0]},
    )


@pytest.mark.parametrize(
    "graph",
    [
        _scalar_graph("rmsnorm", t(F32), t(F32, 1)),
        _scalar_graph("layernorm", t(F32), t(F32, 1), t(F32, 1)),
        _scalar_graph("topk_router", t(F32), n_out=2, k=1),
        _scalar_graph(
            "moe_ffn", t(F32), t(F32, 2), t(I32, 2), t(F32, 2, 3, 4), t(F32, 2, 3, 4), t(F32, 2, 4, 3)
        ),
    ],
    ids=["rmsnorm", "layernorm", "topk_router", "moe_ffn"],
)
def test_rank0_activation_is_a_graph_error(graph: Graph) -> None:
    with pytest.raises(GraphError, match="node `n`"):
        verify(graph)


@pytest.mark.parametrize("op", ["attention", "cache_attention"])
def test_zero_kv_heads_is_a_graph_error(op: str) -> None:
    if op == "attention":
        graph = _scalar_graph(op, t(F32, 1, 2, 4, 8), t(F32, 1, 2, 0, 8), t(F32, 1, 2, 0, 8), scale=1.0)
    else:
        kv = t(F32, 3, 4, 0, 8)
        graph = _scalar_graph(op, t(F32, 1, 2, 4, 8), kv, kv, t(I32, 1, 2), t(I32, 1, 2), scale=1.0)
    with pytest.raises(GraphError, match="node `n`"):
        verify(graph)


@pytest.mark.parametrize("where", ["from_dict", "verify"])
def test_error_about_a_name_with_a_newline_is_one_line(where: str) -> None:
    d = _llama_dict()
    d["inputs"]["bad\nname"] = None
    graph = mlp(lin("up", x="line one\nline two"))
    with pytest.raises(UserError) as info:
        if where == "from_dict":
            from_dict(d, "bad.json")
        else:
            verify(graph)
    one_line(str(info.value))


def test_output_naming_a_stale_state_version_is_a_graph_error() -> None:
    graph = paged(
        write("kw", "kc", "kc1"),
        sdpa("attn", "kc1", "vc"),
        updates={"kc": "kc1"},
        outputs={"y": "attn", "old_cache": "kc"},
    )
    with pytest.raises(GraphError, match="kc"):
        verify(graph)
