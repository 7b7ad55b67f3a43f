"""The calibrated cost model (polymorph/cost/model.py) on fixed calibration numbers: efficiency curves,
per-kernel rows, the footprint, and refine(). Nothing here is timed; every number comes from the
calibration file written below or from the vendor profile."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

from polymorph.backends.cpu.microbench import write_calibration
from polymorph.cost import model as costmodel
from polymorph.errors import UserError
from polymorph.hardware.microbench import CurveMeasurement, Measurement, SuiteResult
from polymorph.hardware.profile import Profile, load_profile
from polymorph.models import load_model
from polymorph.passes import bucket_bindings
from polymorph.pipeline.backend import registry
from polymorph.pipeline.plan import Plan

GB = 1e9
MIB = 1 << 20


# A cpu calibration with round numbers, written by the cpu suite's own writer: 20 GB/s sustained, reads
# at 40 GB/s in 1 MiB falling to 20 GB/s at 16 MiB; f32 peak 0.1 TFLOP/s; matmul curves for M = 1 and
# M = 16; 2 us per call.
def fixed(name: str, value: float, unit: str) -> Measurement:
    return Measurement(name, value, unit, "fixed test number")


SUITE = SuiteResult(
    [fixed("figures.memory_bandwidth", 20, "GB/s"), fixed("peak.f32", 0.1, "TFLOP/s")],
    fixed("launch_overhead", 2, "us"),
    [
        CurveMeasurement(
            "read_bandwidth", "GB/s", "fixed test numbers", (MIB, 16 * MIB), (40, 20), (0.0, 0.0)
        ),
        CurveMeasurement(
            "matmul.f32",
            "TFLOP/s",
            "fixed test numbers",
            ((1, 256, 256), (1, 4096, 4096), (16, 256, 256), (16, 4096, 4096)),
            (0.01, 0.05, 0.02, 0.08),
            (0.1,) * 4,
        ),
    ],
)


def calibrated(folder: Path, suite: SuiteResult = SUITE) -> Profile:
    write_calibration(folder, suite)
    return load_profile("cpu", folder)


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    return calibrated(tmp_path_factory.mktemp("calibration"))


def lower(model: str, profile: Profile, batch: int = 1, ctx: int = 64) -> Plan:
    m = load_model(model)
    plan = registry.get(profile.backend).lower(
        m.graph, profile, bucket_bindings(m.graph, batch=batch, ctx=ctx)
    )
    plan.model = m.name
    return plan


@pytest.fixture(scope="module")
def tiny_plan(cpu_profile: Profile) -> Plan:
    return lower("llama-tiny", cpu_profile)


def test_bandwidth_efficiency_is_piecewise_linear_in_log_size_and_flat_beyond(cpu_profile: Profile) -> None:
    hw = costmodel.HardwareModel(cpu_profile)
    assert hw.eff_bw(MIB) == pytest.approx(40 / 20)
    assert hw.eff_bw(4 * MIB) == pytest.approx(30 / 20)  # halfway between 1 and 16 MiB in log
    assert hw.eff_bw(1024) == pytest.approx(2.0)  # below the first point: the first point's value
    assert hw.eff_bw(1 << 30) == pytest.approx(1.0)


def test_matmul_efficiency_uses_the_rows_nearest_the_calls_m(cpu_profile: Profile) -> None:
    hw = costmodel.HardwareModel(cpu_profile)
    small, large = 2.0 * 256 * 256, 2.0 * 4096 * 4096
    assert hw.eff_flops(small, "f32", (1, 256, 256)) == pytest.approx(0.01 / 0.1)
    # A K the suite did not measure: every point of the nearest M, interpolated on FLOPs.
    assert hw.eff_flops(small * 2, "f32", (2, 1024, 256)) == pytest.approx(
        (0.01 + (0.05 - 0.01) * math.log(2) / math.log(large / small)) / 0.1
    )
    # A measured K: that K's points alone, even at another size.
    assert hw.eff_flops(small * 2, "f32", (2, 256, 512)) == pytest.approx(0.01 / 0.1)
    assert hw.eff_flops(small, "f32", (1, 4096, 64)) == pytest.approx(0.05 / 0.1)
    assert hw.eff_flops(large * 16, "f32", (12, 4096, 4096)) == pytest.approx(0.08 / 0.1)  # M=16 rows
    assert hw.eff_flops(small, "f32", None) == pytest.approx(0.01 / 0.1)  # no shape: the M=1 points
    assert hw.eff_flops(small, "bf16", (1, 256, 256)) == 1.0  # no bf16 curve: efficiency 1


def test_every_group_has_one_row_whose_time_follows_the_formula(
    tiny_plan: Plan, cpu_profile: Profile
) -> None:
    p = costmodel.predict(tiny_plan, cpu_profile)
    assert [k.group for k in p.kernels] == [g.id for g in tiny_plan.groups]
    assert p.calibrated and "calibrated" in p.basis and "uncalibrated" not in p.basis
    hw = costmodel.HardwareModel(cpu_profile)
    graph = tiny_plan.graph
    by_name = {n.name: n for n in graph.nodes}
    types, bindings = graph.types(), dict(tiny_plan.bindings)
    for k, group in zip(p.kernels, tiny_plan.groups, strict=True):
        assert k.overhead_s == pytest.approx(2e-6)
        gemm = costmodel._matmul_shape(group, by_name, types, bindings)
        if gemm is None:  # memory or compute bound, whichever is slower
            want_memory = k.bytes / (20 * GB * hw.eff_bw(k.bytes)) if k.bytes else 0.0
            assert k.memory_s == pytest.approx(want_memory)
            assert k.predicted_s == pytest.approx(max(k.memory_s, k.compute_s) + 2e-6)
        else:  # the measured matmul time, plus the traffic beyond the GEMM's own operands
            rest = max(k.bytes - gemm[1], 0.0)
            assert rest < k.bytes
            assert k.memory_s == pytest.approx(rest / (20 * GB * hw.eff_bw(rest)) if rest else 0.0)
            assert k.predicted_s == pytest.approx(k.compute_s + k.memory_s + 2e-6)
        assert k.bound in ("memory", "compute", "overhead")
    assert p.step_s == pytest.approx(sum(k.predicted_s for k in p.kernels))
    lm_head = p.row("lm_head")  # x[1, 64] @ w[256, 64]^T: the M=1 points, 32768 FLOPs, below the first
    assert lm_head.compute_s == pytest.approx(32768 / (0.1e12 * 0.01 / 0.1))
    assert lm_head.bound == "compute"


def test_grouped_query_attention_runs_at_the_rate_of_the_rows_sharing_a_kv_head(cpu_profile: Profile) -> None:
    """Decode attention of llama-tiny (4 query heads over 2 KV heads): each K and V row serves 2 query
    rows, so its rate is the matmul curve's nearest M to 2, not the matrix-vector one."""
    plan = lower("llama-tiny", cpu_profile, batch=3, ctx=64)
    graph = plan.graph
    by_name = {n.name: n for n in graph.nodes}
    (sdpa,) = [g for g in plan.groups if g.id == "layers.0.attn.sdpa"]
    shape = costmodel._attention_shape(sdpa, by_name, graph.types(), dict(plan.bindings))
    cfg = load_model("llama-tiny").config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    assert shape == (heads // kv, cfg.hidden_size // heads, 64)
    assert costmodel._matmul_shape(sdpa, by_name, graph.types(), dict(plan.bindings)) is None


def test_each_host_op_beyond_a_kernels_first_costs_the_calibrated_op_overhead(
    tiny_plan: Plan, tmp_path: Path
) -> None:
    profile = calibrated(tmp_path, dataclasses.replace(SUITE, op_overhead=fixed("op_overhead", 3, "us")))
    norm = "layers.0.attn.norm"
    plain = costmodel.predict(tiny_plan, profile)
    counted = costmodel.predict(tiny_plan, profile, host_ops={norm: 9, "lm_head": 1})
    assert counted.row(norm).overhead_s == pytest.approx(2e-6 + 8 * 3e-6)
    assert counted.row("lm_head").overhead_s == pytest.approx(2e-6)  # one op: the launch overhead holds it
    assert counted.row("embed").overhead_s == plain.row("embed").overhead_s  # not counted: as before
    assert counted.step_s == pytest.approx(plain.step_s + 24e-6)
    assert "3 us per host op" in counted.basis
    # Without the calibrated figure a count changes nothing.
    cpu_profile = calibrated(tmp_path / "plain")
    assert costmodel.predict(tiny_plan, cpu_profile, host_ops={norm: 9}).step_s == pytest.approx(
        costmodel.predict(tiny_plan, cpu_profile).step_s
    )


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="lowering for cuda imports triton, not installed"
)
def test_uncalibrated_prediction_says_so_and_uses_the_vendor_roofline(tmp_path: Path) -> None:
    h200 = load_profile("h200", tmp_path)  # an empty calibration directory: vendor figures only
    p = costmodel.predict(lower("llama-tiny", h200), h200)
    assert not p.calibrated and p.basis.startswith("uncalibrated")
    views = [k for k in p.kernels if k.bound == "view"]
    assert views and all(k.pattern in ("reshape", "slice") and k.predicted_s == 0 for k in views)
    for k in p.kernels:
        if k.bound == "view":  # the GPU runtime binds a reshape or a contiguous slice as a view
            continue
        assert k.overhead_s == costmodel.DEFAULT_LAUNCH_OVERHEAD_S
        assert k.memory_s == pytest.approx(k.bytes / 4.8e12)
        assert k.compute_s == pytest.approx(k.flops / h200.peak_flops(k.dtype))


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="lowering for cuda imports triton, not installed"
)
def test_a_slice_is_a_view_only_where_the_runtime_binds_one(tmp_path: Path) -> None:
    h200 = load_profile("h200", tmp_path)
    decode = costmodel.predict(lower("llama-tiny", h200, batch=4, ctx=64), h200)
    assert decode.row("last_token").bound == "view"  # [4, 1, D] of [4, 1, D]: the whole axis
    m = load_model("llama-tiny")
    prefill = registry.get("cuda").lower(m.graph, h200, bucket_bindings(m.graph, batch=4, ctx=64, seq=8))
    assert costmodel.predict(prefill, h200).row("last_token").bound != "view"  # rows 8 apart: a copy
    one = registry.get("cuda").lower(m.graph, h200, bucket_bindings(m.graph, batch=1, ctx=64, seq=8))
    assert costmodel.predict(one, h200).row("last_token").bound == "view"  # one sequence: contiguous


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="lowering for cuda imports triton, not installed"
)
def test_each_kernel_a_group_launches_pays_the_launch_overhead(tmp_path: Path) -> None:
    from polymorph.backends.gpu.backend import launch_counts

    h200 = load_profile("h200", tmp_path)
    plan = lower("llama-tiny", h200, ctx=1024)
    counts = launch_counts(plan)
    attention = [g.id for g in plan.groups if g.pattern == "cache_attention"]
    assert attention and all(counts[g] == 2 for g in attention)  # split over the context, then reduce
    assert all(n == 1 for g, n in counts.items() if g not in attention)
    counted = costmodel.predict(plan, h200, launches=counts)
    plain = costmodel.predict(plan, h200)
    for g in attention:
        assert counted.row(g).overhead_s == pytest.approx(2 * plain.row(g).overhead_s)
    assert counted.step_s == pytest.approx(
        plain.step_s + len(attention) * costmodel.DEFAULT_LAUNCH_OVERHEAD_S
    )


def test_cpu_without_calibration_is_a_user_error(tmp_path: Path) -> None:
    cpu = load_profile("cpu", tmp_path)
    with pytest.raises(UserError, match="polymorph microbench --backend cpu"):
        costmodel.predict(lower("llama-tiny", cpu), cpu)


def test_footprint_counts_weights_cache_and_live_activations(tiny_plan: Plan, cpu_profile: Profile) -> None:
    fp = costmodel.predict(tiny_plan, cpu_profile).footprint
    graph = tiny_plan.graph
    weights = sum(math.prod(t.shape) * t.dtype.itemsize for t in graph.params.values())
    assert fp.weights_bytes == weights
    # 2 layers x (k, v) x cache_blocks 5 (4 blocks of 16 for ctx 64, plus the guard) x 16 x 2 heads x 16 x 4 B
    assert fp.kv_cache_bytes == 2 * 2 * 5 * 16 * 2 * 16 * 4
    hidden = 1 * 1 * 64 * 4  # one token's [1, 1, 64] f32 activation
    assert 2 * hidden <= fp.activation_bytes < 20 * hidden
    assert fp.total_bytes == fp.weights_bytes + fp.kv_cache_bytes + fp.activation_bytes
    assert "live" in fp.method


def test_refine_on_half_the_groups_corrects_the_other_half_of_the_same_pattern(
    tiny_plan: Plan, cpu_profile: Profile
) -> None:
    p = costmodel.predict(tiny_plan, cpu_profile)
    residual = [k for k in p.kernels if k.pattern == "linear+residual"]
    assert len(residual) == 4
    fit, held_out = residual[:2], residual[2:]
    truth = {k.group: 3.0 * k.predicted_s for k in residual}  # the "machine" runs them 3x slower
    refined = p.refine({k.group: truth[k.group] for k in fit})
    assert refined.scales == {"linear+residual": pytest.approx(3.0)}
    for k in held_out:
        before, after = k.predicted_s, refined.row(k.group).predicted_s
        assert abs(after - truth[k.group]) < abs(before - truth[k.group])
        assert after == pytest.approx(truth[k.group])
        assert refined.row(k.group).measured_s is None
    for k in fit:
        assert refined.row(k.group).measured_s == truth[k.group]
    others = [k for k in p.kernels if k.pattern != "linear+residual"]
    assert all(refined.row(k.group).predicted_s == k.predicted_s for k in others)
    assert refined.step_s > p.step_s


def test_refine_takes_the_geometric_mean_and_refits_from_the_unrefined_time(
    tiny_plan: Plan, cpu_profile: Profile
) -> None:
    p = costmodel.predict(tiny_plan, cpu_profile)
    a, b = (k for k in p.kernels if k.pattern == "linear+residual" and k.group.startswith("layers.0"))
    once = p.refine({a.group: 2.0 * a.predicted_s, b.group: 8.0 * b.predicted_s})
    assert once.scales["linear+residual"] == pytest.approx(4.0)
    twice = once.refine({a.group: 0.5 * a.predicted_s})  # a second pass replaces the pattern's factor
    assert twice.row(b.group).predicted_s == pytest.approx(0.5 * b.predicted_s)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_refine_rejects_times_that_are_not_positive_and_finite(
    tiny_plan: Plan, cpu_profile: Profile, bad: float
) -> None:
    p = costmodel.predict(tiny_plan, cpu_profile)
    with pytest.raises(UserError, match="positive number of seconds"):
        p.refine({"lm_head": bad})


def test_refine_rejects_an_unknown_group(tiny_plan: Plan, cpu_profile: Profile) -> None:
    with pytest.raises(UserError, match=r"no group `layers\.9\.mlp`"):
        costmodel.predict(tiny_plan, cpu_profile).refine({"layers.9.mlp": 1e-3})


def test_a_plan_without_a_bucket_cannot_be_predicted(cpu_profile: Profile) -> None:
    m = load_model("llama-tiny")
    plan = registry.get("cpu").lower(m.graph, cpu_profile)
    with pytest.raises(UserError, match="compile it for a bucket"):
        costmodel.predict(plan, cpu_profile)


def test_to_dict_carries_the_rows_step_and_footprint(tiny_plan: Plan, cpu_profile: Profile) -> None:
    d = costmodel.predict(tiny_plan, cpu_profile).to_dict()
    assert d["step_s"] > 0 and d["footprint"]["total_bytes"] > 0
    assert {"group", "pattern", "bytes", "flops", "predicted_s", "bound"} <= set(d["kernels"][0])
