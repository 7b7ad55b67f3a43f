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
    # The launch figure is the profile's own, with its source (a captured graph's per-kernel gap).
    assert p.launch_overhead_s == h200.figure("launch_overhead").si == pytest.approx(0.93e-6)
    assert "figures.launch_overhead" in p.launch_source and "figures.launch_overhead" in p.basis
    views = [k for k in p.kernels if k.bound == "view"]
    assert views and all(k.pattern in ("reshape", "slice") and k.predicted_s == 0 for k in views)
    for k in p.kernels:
        if k.bound == "view":  # the GPU runtime binds a reshape or a contiguous slice as a view
            continue
        assert k.overhead_s == p.launch_overhead_s
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
    assert counted.step_s == pytest.approx(plain.step_s + len(attention) * plain.launch_overhead_s)


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


# --- the model reads the plan: expert GEMMs per expert, the profile's launch figure, occupancy


def moe_tiny() -> tuple[int, int, int, int]:
    cfg = load_model("moe-tiny").config
    assert cfg is not None
    return cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.expert_intermediate_size


@pytest.mark.parametrize("batch", [2, 32])
def test_expert_gemms_are_priced_at_the_rows_per_expert(cpu_profile: Profile, batch: int) -> None:
    """moe-tiny (E = 4 experts, top-2, D = 64, F = 96, f32) at a decode step of `batch` tokens, by hand:
    uniform routing picks an expert with probability k/E per token, so A = E (1 - (1 - k/E)^batch)
    experts are active, each with batch k / A rows; every active expert runs a gate+up GEMM
    [rows, 64] x [192, 64]^T and a down GEMM [rows, 96] x [64, 96]^T at the fixed curve's rate for the
    nearest measured M. Both GEMMs are below the curve's first size at either M, so they run at the
    first point's rate: 0.01 TFLOP/s at M = 1, 0.02 at M = 16."""
    e, k, d, f = moe_tiny()
    assert (e, k, d, f) == (4, 2, 64, 96)
    plan = lower("moe-tiny", cpu_profile, batch=batch, ctx=64)
    row = costmodel.predict(plan, cpu_profile).row("layers.0.moe.experts")
    active = e * (1 - (1 - k / e) ** batch)  # batch 2: 3 experts; batch 32: 4 (to 1e-9)
    rows = batch * k / active  # batch 2: 4/3 rows each, nearest measured M = 1; batch 32: 16 rows, M = 16
    rate = {2: 0.01e12, 32: 0.02e12}[batch]
    expert_s = active * (2 * rows * d * 2 * f + 2 * rows * f * d) / rate
    # The rest of the group's traffic: x [B, 1, 64] f32, routing weights and indices [B, 1, 2], out.
    rest = batch * (64 * 4 + 2 * 4 + 2 * 4 + 64 * 4)
    rest_s = rest / (20 * GB * (40 / 20))  # below 1 MiB: the read curve's first point, 40 GB/s
    assert row.predicted_s == pytest.approx(expert_s + rest_s + 2e-6, rel=1e-9)
    assert row.compute_s + row.memory_s == pytest.approx(expert_s + rest_s, rel=1e-9)
    assert f"{active:.4g} of 4 experts active" in row.note and f"M = {rows:.4g}" in row.note
    if batch == 32:
        # The one-row rate (what the model charged before) would be twice this time.
        assert active * (2 * rows * d * 2 * f + 2 * rows * f * d) / 0.01e12 > 1.9 * expert_s


def test_expert_gemms_without_a_matmul_curve_are_their_roofline(tmp_path: Path) -> None:
    """No matmul curve: each expert GEMM takes the larger of its FLOPs at the f32 peak and its weights'
    and rows' bytes at the bandwidth (20 GB/s, 0.1 TFLOP/s), computed here by hand at batch 32."""
    suite = dataclasses.replace(SUITE, curves=[c for c in SUITE.curves if c.name == "read_bandwidth"])
    profile = calibrated(tmp_path, suite)
    e, k, d, f = moe_tiny()
    plan = lower("moe-tiny", profile, batch=32, ctx=64)
    row = costmodel.predict(plan, profile).row("layers.1.moe.experts")
    active = e * (1 - (1 - k / e) ** 32)
    rows = 32 * k / active
    expert_s = 0.0
    for kk, n in ((d, 2 * f), (f, d)):
        stream = (kk * n + rows * (kk + n)) * 4 / (20 * GB)
        expert_s += active * max(stream, 2 * rows * kk * n / 0.1e12)
    rest_s = 32 * (64 * 4 + 16 + 64 * 4) / (40 * GB)
    assert row.predicted_s == pytest.approx(expert_s + rest_s + 2e-6, rel=1e-9)
    # 16 f32 rows do about 6 FLOP per weight byte, above this machine's ridge of 0.1 TFLOP/s / 20 GB/s = 5.
    assert row.bound == "compute"


def test_expert_parallel_spreads_the_rows_over_the_devices_experts(cpu_profile: Profile) -> None:
    """The plan of one device of EP=2 holds E/2 experts and serves half the rows: its expected active
    experts are E/2 (1 - (1 - k/E)^T), computed against the model's E, not the device's."""
    plan = lower("moe-tiny", cpu_profile, batch=2, ctx=64)
    graph = plan.graph
    by_name = {n.name: n for n in graph.nodes}
    group = plan.group("layers.0.moe.experts")
    (one,) = costmodel.expert_work(group, by_name, graph.types(), dict(plan.bindings))
    (half,) = costmodel.expert_work(group, by_name, graph.types(), dict(plan.bindings), expert_parallel=2)
    assert one.active == pytest.approx(3.0) and one.rows == pytest.approx(4 / 3)
    assert half.total_experts == 8 and half.active == pytest.approx(4 * (1 - (1 - 2 / 8) ** 2))
    assert half.rows == pytest.approx(2 * 2 / 2 / half.active)


def test_the_prediction_names_its_launch_figure_and_where_it_comes_from(
    tiny_plan: Plan, cpu_profile: Profile, tmp_path: Path
) -> None:
    p = costmodel.predict(tiny_plan, cpu_profile)
    assert p.launch_overhead_s == pytest.approx(2e-6)
    assert p.launch_source.startswith("measured (") and "fixed test number" in p.launch_source
    assert "launch overhead 2 us per kernel, measured" in p.basis
    # The H200's vendor profile without its calibration: the profile's figure, with its source.
    h200 = costmodel.HardwareModel(load_profile("h200", tmp_path))
    seconds, source = h200.launch_figure()
    assert seconds == pytest.approx(0.93e-6)
    assert "h200.toml figures.launch_overhead" in source and "evidence: derived" in source
    assert "launch overhead 0.93 us per kernel" in h200.basis()
    # With its calibration, the measured figure wins.
    measured = costmodel.HardwareModel(
        load_profile("h200", Path(__file__).parents[2] / "hwprofiles" / "measured")
    )
    assert measured.launch_figure()[1].startswith("measured (")
    # A profile with no launch figure (trn2) says the default is assumed.
    trn2 = costmodel.HardwareModel(load_profile("trn2", tmp_path))
    assert trn2.launch_figure() == (
        costmodel.DEFAULT_LAUNCH_OVERHEAD_S,
        pytest.approx(trn2.launch_figure()[1]),
    )
    assert "assumed default" in trn2.launch_figure()[1]


def test_every_gpu_profile_has_a_launch_figure_with_a_source(tmp_path: Path) -> None:
    for pid in ("h100", "h200", "b200", "gb300", "mi300x", "mi355x"):
        fig = load_profile(pid, tmp_path).figure("launch_overhead")
        assert fig is not None and fig.source and 0 < fig.si < 1e-4, pid
        assert "graph" in (fig.note or "") + fig.source, pid  # it says which gap it is


def test_lower_occupancy_predicts_a_longer_time(tiny_plan: Plan, cpu_profile: Profile) -> None:
    """Memory time scales by min(1, occupancy / SATURATING_OCCUPANCY); compute time does not."""
    sat = costmodel.SATURATING_OCCUPANCY
    plain = costmodel.predict(tiny_plan, cpu_profile)
    groups = [k.group for k in plain.kernels]
    full = costmodel.predict(tiny_plan, cpu_profile, occupancy={g: 1.0 for g in groups})
    assert full.step_s == pytest.approx(plain.step_s)  # at or above saturation: no change
    low = costmodel.predict(tiny_plan, cpu_profile, occupancy={g: (sat / 4, "registers") for g in groups})
    assert low.step_s > plain.step_s
    norm = "layers.0.attn.norm"  # a norm: memory-bound, no matmul
    assert low.row(norm).bandwidth_factor == pytest.approx(0.25)
    assert low.row(norm).memory_s == pytest.approx(4 * plain.row(norm).memory_s)
    assert low.row(norm).compute_s == plain.row(norm).compute_s
    assert "limited by registers" in low.row(norm).note
    # A projection priced by its measured rate: its operands stream no faster than the lowered bandwidth.
    graph = tiny_plan.graph
    by_name = {n.name: n for n in graph.nodes}
    for group in tiny_plan.groups:
        gemm = costmodel._matmul_shape(group, by_name, graph.types(), dict(tiny_plan.bindings))
        if gemm is not None:
            row = low.row(group.id)
            assert row.predicted_s - row.overhead_s >= gemm[1] / (20 * GB * 0.25) * (1 - 1e-9)
            assert row.predicted_s >= plain.row(group.id).predicted_s


def test_the_report_reads_occupancy_from_the_compiled_resources(
    tiny_plan: Plan, cpu_profile: Profile
) -> None:
    """plan_report prices each kernel from its resources: the same plan with its kernels resident at a
    low occupancy is predicted slower, and the row says why."""
    sat = costmodel.SATURATING_OCCUPANCY
    high = costmodel.plan_report(tiny_plan, lambda g: {"occupancy": 1.0}, profile=cpu_profile)
    low = costmodel.plan_report(
        tiny_plan, lambda g: {"occupancy": sat / 2, "limited_by": "shared memory"}, profile=cpu_profile
    )
    none = costmodel.plan_report(tiny_plan, lambda g: {}, profile=cpu_profile)
    assert high.predicted_step_s == pytest.approx(none.predicted_step_s)
    assert low.predicted_step_s > high.predicted_step_s
    norm = next(k for k in low.kernels if k.group == "layers.0.attn.norm")
    assert "occupancy" in norm.note and "limited by shared memory" in norm.note
    assert "launch overhead 2 us per kernel, measured" in low.prediction


def test_a_pipelined_kernel_with_enough_bytes_staged_counts_as_saturated(tmp_path: Path) -> None:
    """Little's law with the report's units, on the H200's vendor figures (4.8 TB/s, 132 SMs): a unit at
    one block per SM whose staged tiles hold at least bw x latency / SMs bytes keeps its bandwidth; the
    same unit without a pipeline does not."""
    hw = costmodel.HardwareModel(load_profile("h200", tmp_path))
    need = 4.8e12 * costmodel.ASSUMED_MEMORY_LATENCY_S / 132
    low = costmodel.SATURATING_OCCUPANCY / 2
    unit = {"unit": "gemm", "occupancy": low, "limited_by": "shared memory", "num_stages": 4,
            "blocks_per_unit": 1, "shared_dynamic_bytes": int(need * 4 / 3) + 64}  # fmt: skip
    staged = costmodel.streaming_occupancy({"units": [unit]}, hw)
    flat = costmodel.streaming_occupancy({"units": [{**unit, "num_stages": 1}]}, hw)
    assert staged is not None and flat is not None
    assert costmodel.occupancy_factor(staged[0]) == 1.0
    assert flat == (low, "shared memory (gemm)") and costmodel.occupancy_factor(flat[0]) == pytest.approx(0.5)
    assert costmodel.streaming_occupancy({}, hw) is None
