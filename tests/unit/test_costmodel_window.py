"""The cost of sliding-window attention: a windowed decode step reads only the cache blocks its window
covers, so the op table's bytes and the cost model's predicted time fall with the window at long
context, and equal the full attention's where the window is longer than the context."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from polymorph.backends.cpu.microbench import write_calibration
from polymorph.cost import model as costmodel
from polymorph.hardware.microbench import CurveMeasurement, Measurement, SuiteResult
from polymorph.hardware.profile import Profile, load_profile
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, TensorType
from polymorph.ir.ops import node_cost
from polymorph.models import load_model
from polymorph.passes import bucket_bindings
from polymorph.pipeline.backend import registry

SDPA = "layers.0.attn.sdpa"


def windowed(graph: Graph, window: int) -> Graph:
    """`graph` with every cache_attention under a sliding window of `window` tokens."""
    out = graph.copy()
    out.nodes = [
        dataclasses.replace(n, attrs={**n.attrs, "window": window}) if n.op == "cache_attention" else n
        for n in out.nodes
    ]
    return out


def cache_attention_cost(window: int, ctx: int, seq: int = 1, block: int = 16) -> tuple[float, float]:
    graph = load_model("llama-tiny").graph
    node = next(n for n in windowed(graph, window).nodes if n.name == SDPA)
    types = graph.types()
    bindings = {"batch": 2, "seq": seq, "ctx_blocks": ctx // block, "cache_blocks": 2 * ctx // block + 1}
    ins = [types[v] for v in node.inputs]
    # the cache's block size is the model's; the test's contexts are in its blocks
    assert ins[1].shape[1] == block
    cost = node_cost(node, ins, [types[v] for v in node.outputs], bindings)
    return cost.flops, cost.bytes


def test_windowed_cache_attention_costs_only_the_blocks_its_window_covers() -> None:
    full_flops, full_bytes = cache_attention_cost(0, 4096)
    flops, nbytes = cache_attention_cost(256, 4096)
    # decode: 256 keys seen, 256 + one straddled block of 16 read, of 4096
    assert flops == pytest.approx(full_flops * 256 / 4096)
    batch, kv_heads, head_dim, itemsize = 2, 2, 16, 4  # llama-tiny's cache, f32
    assert full_bytes - nbytes == 2 * batch * (4096 - 272) * kv_heads * head_dim * itemsize  # K and V
    # a window longer than the context is full attention
    assert cache_attention_cost(8192, 4096) == (full_flops, full_bytes)
    # a 64-token chunk reads window + 63 positions' blocks
    chunk_full = cache_attention_cost(0, 4096, seq=64)
    chunk = cache_attention_cost(256, 4096, seq=64)
    assert chunk[0] == pytest.approx(chunk_full[0] * 256 / 4096)
    assert chunk[1] < chunk_full[1]


def test_windowed_attention_counts_the_keys_each_query_sees() -> None:
    def flops(window: int, s: int) -> float:
        q = TensorType(DType.F32, (1, s, 4, 16))
        kv = TensorType(DType.F32, (1, s, 2, 16))
        node = load_model("llama-tiny").graph.nodes[0]
        node = dataclasses.replace(
            node,
            op="attention",
            inputs=("q", "k", "v"),
            outputs=("o",),
            attrs={"scale": 0.25, "window": window},
        )
        return node_cost(node, [q, kv, kv], [q], {}).flops

    per_key = 4.0 * 4 * 16  # 4 FLOPs per head per key per head dim
    assert flops(3, 5) == per_key * (1 + 2 + 3 + 3 + 3)
    assert flops(8, 5) == per_key * (1 + 2 + 3 + 4 + 5)


def cpu_calibrated(folder: Path) -> Profile:
    """The cpu profile with a fixed calibration: 20 GB/s, reads at 40 falling to 20 GB/s, 0.1 TFLOP/s."""
    mib = 1 << 20
    figure = [Measurement("figures.memory_bandwidth", 20, "GB/s", "fixed test number"),
              Measurement("peak.f32", 0.1, "TFLOP/s", "fixed test number")]  # fmt: skip
    curve = CurveMeasurement(
        "read_bandwidth", "GB/s", "fixed test numbers", (mib, 16 * mib), (40, 20), (0, 0)
    )
    write_calibration(folder, SuiteResult(figure, Measurement("launch_overhead", 2, "us", "fixed"), [curve]))
    return load_profile("cpu", folder)


@pytest.mark.parametrize("profile_id", ["cpu", "h200", "mi300x"])
def test_windowed_decode_is_predicted_faster_at_long_context(tmp_path: Path, profile_id: str) -> None:
    """llama-tiny's decode step at batch 8 and an 8k context: with a 512-token window on every layer,
    each attention group is predicted faster, and the step too; at a context inside the window, the
    prediction is the full attention's."""
    if profile_id == "cpu":
        profile = cpu_calibrated(tmp_path)
    else:
        pytest.importorskip("triton")  # lowering for cuda and rocm imports triton
        profile = load_profile(profile_id, tmp_path)
    m = load_model("llama-tiny")
    backend = registry.get(profile.backend)

    def predict(graph: Graph, ctx: int) -> costmodel.Prediction:
        plan = backend.lower(graph, profile, bucket_bindings(graph, batch=8, ctx=ctx))
        return costmodel.predict(plan, profile)

    full, slid = predict(m.graph, 8192), predict(windowed(m.graph, 512), 8192)
    attention = [k.group for k in full.kernels if k.pattern == "cache_attention"]
    assert attention
    for group in attention:
        assert slid.row(group).predicted_s < full.row(group).predicted_s, group
    assert slid.step_s < full.step_s
    short_full, short_slid = predict(m.graph, 256), predict(windowed(m.graph, 512), 256)
    for group in attention:
        assert short_slid.row(group).predicted_s == short_full.row(group).predicted_s, group
