"""Parallelism planning (polymorph/cost/parallel.py): which TP/EP degrees are offered, what each is predicted
to cost per device, and how bad input is refused. Predictions come from vendor figures (uncalibrated
h200) or a fixed cpu calibration; nothing is timed."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from polymorph.backends.cpu.microbench import write_calibration
from polymorph.cost import parallel
from polymorph.errors import UserError
from polymorph.hardware import microbench
from polymorph.hardware.microbench import Measurement, SuiteResult
from polymorph.ir.dtypes import DType
from polymorph.ir.shapes import numel
from polymorph.models import Model
from polymorph.models.config import ModelConfig
from polymorph.models.decoder import build_decoder
from polymorph.models.zoo import zoo_config

# Lowering for cuda loads the Triton kernel files, so those tests need triton (the `cuda` extra).
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="lowering for cuda imports triton, not installed"
)

# Bandwidth and an f32 peak, no interconnect figure (the cpu suite's own writer).
CPU_FIGURES = [
    Measurement("figures.memory_bandwidth", 20, "GB/s", "fixed test number"),
    Measurement("peak.f32", 0.1, "TFLOP/s", "fixed test number"),
]


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration directory with no files: predictions from vendor figures only."""
    return tmp_path_factory.mktemp("no-calibration")


@pytest.fixture(scope="module")
def llama_1b_on_two_h200(empty: Path) -> parallel.ParallelPlan:
    return parallel.plan_parallel("llama-3.2-1b", 2, backend="cuda", target="h200", calibration_dir=empty)


@needs_triton
def test_llama_1b_on_two_h200_lists_tp1_and_tp2_with_memory_and_time(
    llama_1b_on_two_h200: parallel.ParallelPlan,
) -> None:
    plan = llama_1b_on_two_h200
    by_tp = {o.tp: o for o in plan.options}
    assert sorted(by_tp) == [1, 2] and all(o.ep == 1 for o in plan.options)
    tp1, tp2 = by_tp[1], by_tp[2]
    assert tp1.replicas == 2 and tp2.replicas == 1
    assert tp1.allreduce_s == 0.0 and tp2.allreduce_s is not None and tp2.allreduce_s > 0
    # 32 all-reduces (2 per layer x 16 layers) in the TP=2 device's rows.
    assert sum(k.pattern == "all_reduce" for k in tp2.prediction.kernels) == 32
    assert 0 < tp2.compute_s < tp1.compute_s
    assert tp2.step_s == pytest.approx(tp2.compute_s + tp2.allreduce_s)
    # bf16 weights: about 2.5 GB on one device, more than half of that on each of two (lm_head replicated).
    assert 2.4e9 < tp1.memory_bytes < 2.7e9
    assert tp1.memory_bytes / 2 < tp2.memory_bytes < tp1.memory_bytes
    assert tp1.capacity_bytes == 141e9 and tp1.fits and tp2.fits
    assert sum(o.chosen for o in plan.options) == 1 and plan.choice is not None
    assert plan.choice.step_s == min(o.step_s for o in plan.options)
    assert plan.interconnect.startswith("450 GB/s")
    assert plan.basis.startswith("uncalibrated")
    table = parallel.option_table(plan)
    assert [row["tp"] for row in table] == [1, 2] and "prediction" not in table[0]
    assert json.loads(json.dumps(table))[1]["step_s"] == pytest.approx(tp2.step_s)


@needs_triton
def test_moe_lists_expert_parallel_options(empty: Path) -> None:
    plan = parallel.plan_parallel(
        "qwen3-moe-tiny", 2, backend="cuda", target="h200", batch=8, calibration_dir=empty
    )
    assert {(o.tp, o.ep) for o in plan.options} == {(1, 1), (2, 1), (2, 2)}
    ep2 = next(o for o in plan.options if o.ep == 2)
    assert "4 whole experts per device (EP=2)" in ep2.reasons[0] and ep2.step_s > 0 and ep2.memory_bytes > 0
    # Under EP the expert weights are split whole: each device holds 4 of the 8 experts.
    tp1 = next(o for o in plan.options if o.tp == 1)
    assert ep2.memory_bytes < tp1.memory_bytes


@needs_triton
def test_expert_parallel_work_is_balanced_over_the_devices(empty: Path) -> None:
    cfg = zoo_config("qwen3-moe-tiny")
    device = parallel.device_config(cfg, 2, 2)
    assert (device.num_experts, device.num_attention_heads, device.num_key_value_heads) == (4, 2, 1)
    assert device.moe_intermediate_size == cfg.moe_intermediate_size  # whole experts
    plan = parallel.plan_parallel(
        "qwen3-moe-tiny", 2, backend="cuda", target="h200", batch=8, calibration_dir=empty
    )
    ep2 = next(o for o in plan.options if o.ep == 2)
    tp2 = next(o for o in plan.options if (o.tp, o.ep) == (2, 1))
    experts = [k for k in ep2.prediction.kernels if k.pattern == "moe_ffn"]
    sharded = [k for k in tp2.prediction.kernels if k.pattern == "moe_ffn"]
    assert len(experts) == len(sharded) == cfg.num_hidden_layers
    # Same FLOPs per device either way: half the assignments at full width, or all at half width.
    for e, s in zip(experts, sharded, strict=True):
        assert e.flops == pytest.approx(s.flops)


@needs_triton
def test_a_tp_that_does_not_divide_the_heads_is_never_offered(empty: Path) -> None:
    cfg = zoo_config("llama-tiny")  # 4 heads, 2 kv heads
    plan = parallel.plan_parallel("llama-tiny", 8, backend="cuda", target="h200", calibration_dir=empty)
    assert sorted(o.tp for o in plan.options) == [1, 2]
    for o in plan.options:
        assert cfg.num_attention_heads % o.tp == 0 and cfg.num_key_value_heads % o.tp == 0
    assert {r.tp for r in plan.rejected} == {4, 8}
    assert any(r.reason == "kv heads (2) do not divide by TP=4" for r in plan.rejected)


@pytest.mark.parametrize("devices", [0, -2, True, 1.5])
def test_bad_devices_is_a_user_error(devices: object) -> None:
    with pytest.raises(UserError, match="--devices must be a positive whole number"):
        parallel.plan_parallel("llama-tiny", devices, backend="cuda", target="h200")  # type: ignore[arg-type]


@needs_triton
def test_the_cli_command_refuses_bad_devices_and_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="polymorph")
    parallel.add_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", "llama-tiny", "--backend", "cuda", "--devices", "0"])
    with pytest.raises(UserError, match="--devices"):
        args.fn(args)
    args = parser.parse_args(
        ["plan", "llama-tiny", "--backend", "cuda", "--target", "h200", "--devices", "2"]
    )
    assert args.fn(args) == 0
    out = capsys.readouterr().out
    assert "TP" in out and "memory/device" in out and "interconnect: 450 GB/s" in out


@needs_triton
def test_a_latency_target_filters_and_a_missed_target_is_explained(empty: Path) -> None:
    plan = parallel.plan_parallel(
        "llama-tiny", 2, backend="cuda", target="h200", latency_s=1e-9, calibration_dir=empty
    )
    assert plan.choice is None
    assert all(o.meets_target is False and any("misses" in r for r in o.reasons) for o in plan.options)
    loose = parallel.plan_parallel(
        "llama-tiny", 2, backend="cuda", target="h200", latency_s=10.0, calibration_dir=empty
    )
    assert loose.choice is not None
    assert loose.choice.tokens_per_s == max(o.tokens_per_s for o in loose.options)


@needs_triton
def test_a_measured_allreduce_latency_is_each_all_reduces_fixed_cost(tmp_path: Path) -> None:
    """The GPU suite on several devices writes `allreduce_latency`; TP=2 charges it per all-reduce
    instead of a kernel launch."""
    suite = SuiteResult(
        [Measurement("figures.memory_bandwidth", 4000, "GB/s", "fixed test number")],
        Measurement("launch_overhead", 1, "us", "fixed test number"),
        allreduce_latency=Measurement("allreduce_latency", 15, "us", "fixed test number"),
    )
    microbench.write_calibration(tmp_path, "h200", suite, device="test", driver="test",
                                 toolchain={"python": "3"}, command="test")  # fmt: skip
    plan = parallel.plan_parallel("llama-3.2-1b", 2, backend="cuda", target="h200", calibration_dir=tmp_path)
    tp2 = next(o for o in plan.options if o.tp == 2)
    rows = [k for k in tp2.prediction.kernels if k.pattern == "all_reduce"]
    assert len(rows) == 32 and all(k.overhead_s == pytest.approx(15e-6) for k in rows)
    wire = 2 * 0.5 * 2048 * 2 / 450e9  # [1, 2048] bf16 over 450 GB/s, half of it each way
    assert tp2.allreduce_s == pytest.approx(32 * (15e-6 + wire))
    assert any("measured" in r for r in tp2.reasons)


def test_without_a_measured_latency_each_all_reduce_costs_the_assumed_figure(
    llama_1b_on_two_h200: parallel.ParallelPlan,
) -> None:
    """No calibration measured an all-reduce: each costs ASSUMED_ALLREDUCE_LATENCY_S and the option says
    so. Llama-3.2-1B at batch 1 then stays on one GPU per replica, as two H200s measured it."""
    tp2 = next(o for o in llama_1b_on_two_h200.options if o.tp == 2)
    rows = [k for k in tp2.prediction.kernels if k.pattern == "all_reduce"]
    assert all(k.overhead_s == parallel.ASSUMED_ALLREDUCE_LATENCY_S for k in rows)
    assert any("assumed: no calibration measured it" in r for r in tp2.reasons)
    assert llama_1b_on_two_h200.choice is not None and llama_1b_on_two_h200.choice.tp == 1


def test_without_an_interconnect_figure_the_all_reduce_is_unknown(tmp_path: Path) -> None:
    write_calibration(tmp_path, CPU_FIGURES)
    plan = parallel.plan_parallel("llama-tiny", 2, backend="cpu", calibration_dir=tmp_path)
    tp2 = next(o for o in plan.options if o.tp == 2)
    assert tp2.allreduce_s is None and any("all-reduce time unknown" in r for r in tp2.reasons)
    assert tp2.fits is None and tp2.capacity_bytes is None
    assert plan.interconnect.startswith("unknown")


def test_a_bad_latency_target_is_a_user_error() -> None:
    with pytest.raises(UserError, match="--latency-ms"):
        parallel.plan_parallel("llama-tiny", 2, backend="cuda", target="h200", latency_s=-1.0)


@needs_triton
def test_a_traffic_file_picks_its_heaviest_bucket(empty: Path) -> None:
    from polymorph.api import pick_bucket

    traffic = Path(__file__).parents[2] / "examples" / "traffic" / "chat.toml"
    want = pick_bucket(None, None, traffic)
    plan = parallel.plan_parallel(
        "llama-tiny", 2, backend="cuda", target="h200", traffic=traffic, calibration_dir=empty
    )
    assert (plan.batch, plan.ctx) == (want.batch, want.ctx)
    with pytest.raises(UserError, match="either --traffic or --batch/--ctx"):
        parallel.plan_parallel("llama-tiny", 2, backend="cuda", target="h200", traffic=traffic, batch=4)


# --- MoE families: how one device's share of the weights is cut (device_config), and the plans of the
# zoo's large MoE models on 8 x H200.

# Weights every device holds whole (norms, embeddings, the biases added once after a reduction); the
# per-head q/k norms of Qwen3-style attention are [head_dim], the same on every device.
REPLICATED = ("layernorm.weight", "model.norm.weight", "embed_tokens.weight", "lm_head.weight",
              "o_proj.bias")  # fmt: skip
# The router: replicated in fact; the device's graph holds E / EP of its rows (router_rows_bytes adds
# the rest to the device's memory).
ROUTER = ("mlp.gate.weight", "mlp.router.weight", "mlp.router.bias", "e_score_correction_bias",
          "block_sparse_moe.gate.weight")  # fmt: skip


def _fewer_layers(cfg: ModelConfig, n: int) -> ModelConfig:
    """`cfg` cut to its first n layers (its layer types and dense layers with it): the same tensors per
    layer, a graph quick to build."""
    return dataclasses.replace(
        cfg,
        num_hidden_layers=n,
        layer_types=cfg.layer_types[:n],
        dense_layers=tuple(i for i in cfg.dense_layers if i < n),
        indexer_shared_layers=tuple(i for i in cfg.indexer_shared_layers if i < n),
    )


def _qwen3_moe_with_dense_layers() -> ModelConfig:
    return dataclasses.replace(zoo_config("qwen3-30b-a3b"), dense_layers=(0, 2))


SPLITS = [
    ("gpt-oss-20b", 8, 1), ("gpt-oss-20b", 8, 8), ("gpt-oss-120b", 8, 4), ("gpt-oss-120b", 4, 2),
    ("glm-4.5-air", 8, 8), ("glm-4.5-air", 8, 2), ("glm-4.5-air", 2, 1), ("olmoe-1b-7b", 8, 8),
    ("olmoe-1b-7b", 4, 1), ("minimax-m2", 8, 8), ("minimax-m2", 8, 4), ("qwen3-moe-dense", 4, 4),
    ("qwen3-moe-dense", 4, 1), ("mixtral-8x7b", 8, 1), ("deepseek-v3", 8, 8), ("deepseek-v3", 16, 4),
    ("kimi-k2", 16, 16), ("kimi-k2", 8, 1), ("deepseek-v3.2", 8, 4), ("glm-5", 16, 16),
]  # fmt: skip
# Latent attention: the q latent (q_a_proj, its norm), the kv latent and shared rope key
# (kv_a_proj_with_mqa, its norm) are whole on every device, and so is the lightning indexer; the query
# heads' q_b_proj, w_uk, w_uv and o_proj are split.
MLA_REPLICATED = ("q_a_proj.weight", "kv_a_proj_with_mqa.weight")


@pytest.mark.parametrize(("name", "tp", "ep"), SPLITS, ids=[f"{n}-tp{t}-ep{e}" for n, t, e in SPLITS])
def test_each_devices_share_adds_up_to_the_models_parameters(name: str, tp: int, ep: int) -> None:
    """Every tensor of the device's graph is the model's, whole (replicated) or cut TP ways (attention,
    sinks, whole-projection q/k norms, dense and shared-expert MLPs; experts E/EP each at width F/(TP/EP));
    the router and gpt-oss's expert down biases E/EP rows. The shares then add up to the model's parameter count (config.param_count,
    a formula independent of the graph)."""
    full_cfg = _qwen3_moe_with_dense_layers() if name == "qwen3-moe-dense" else zoo_config(name)
    cfg = _fewer_layers(full_cfg, 4)
    assert parallel._unsplittable(cfg, tp, ep) is None
    device = parallel.device_config(cfg, tp, ep)
    full = build_decoder(cfg, name="full").params
    mine = build_decoder(device, name="device").params
    assert set(mine) == set(full)
    replicated = sharded = router = 0
    for param, t in full.items():
        whole, part = numel(t.shape), numel(mine[param].shape)
        if param.endswith(ROUTER):
            factor = ep
            router += whole
        elif param.endswith("experts.b_down"):  # [E, D]: each device its experts', added after the sum
            factor = ep
            replicated += whole
        elif (
            param.endswith(REPLICATED + MLA_REPLICATED)
            or ".self_attn.indexer." in param
            or (param.endswith("_norm.weight") and not cfg.qk_norm_full)
        ):
            factor = 1
            replicated += whole
        else:
            factor = tp
            sharded += part
        assert whole == factor * part, f"{param}: {t.shape} on one device as {mine[param].shape}"
        if param.endswith("experts.w_gate"):
            e, f, d = t.shape
            assert mine[param].shape == (e // ep, f // (tp // ep), d)
    assert tp * sharded + replicated + router == cfg.param_count()
    # What one device holds: its graph's tensors plus the router rows its graph lacks.
    held = sum(numel(t.shape) for t in mine.values()) + parallel.router_rows_bytes(cfg, ep, 1)
    b_down = [numel(t.shape) for p, t in full.items() if p.endswith("experts.b_down")]
    assert held == sharded + replicated + router - sum(b_down) * (ep - 1) // ep


def test_an_expert_parallel_degree_the_sizes_do_not_allow_is_not_offered() -> None:
    mixtral = zoo_config("mixtral-8x7b")  # 8 experts, top-2
    assert (8, 8) in parallel._candidates(mixtral, 8) and (8, 4) in parallel._candidates(mixtral, 8)
    assert "top-k (2) exceeds the 1 experts per device" in (parallel._unsplittable(mixtral, 8, 8) or "")
    assert parallel._unsplittable(mixtral, 8, 4) is None
    glm = dataclasses.replace(zoo_config("glm-4.5-air"), shared_expert_size=1400)  # 1400 % 16 != 0
    assert parallel._unsplittable(glm, 8, 8) is None  # 1400 / 8 = 175
    glm = dataclasses.replace(glm, shared_expert_size=1404)
    assert "shared experts' width (1404)" in (parallel._unsplittable(glm, 8, 8) or "")
    dense = dataclasses.replace(_qwen3_moe_with_dense_layers(), intermediate_size=6150)
    assert "dense layers' width (6150)" in (parallel._unsplittable(dense, 4, 4) or "")
    assert parallel._unsplittable(dataclasses.replace(dense, dense_layers=()), 4, 4) is None  # unused


@pytest.fixture(scope="module")
def big_moe_on_eight_h200(empty: Path) -> dict[str, parallel.ParallelPlan]:
    return {
        name: parallel.plan_parallel(name, 8, backend="cuda", target="h200", calibration_dir=empty)
        for name in ("gpt-oss-120b", "minimax-m2")
    }


EIGHT_WAYS = {(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8)}


@needs_triton
@pytest.mark.parametrize("name", ["gpt-oss-120b", "minimax-m2"])
def test_a_big_moe_on_eight_h200s_lists_ep_by_tp_with_memory_and_picks_one_that_fits(
    big_moe_on_eight_h200: dict[str, parallel.ParallelPlan], name: str
) -> None:
    plan = big_moe_on_eight_h200[name]
    cfg = zoo_config(name)
    assert {(o.tp, o.ep) for o in plan.options} == EIGHT_WAYS and not plan.rejected
    for o in plan.options:
        # bf16 weights of one device's share (its graph's and the router rows it lacks), and no more
        # than a few GB on top for the KV cache and activations of batch 1 at 1024 tokens
        weights = 2 * (parallel.device_config(cfg, o.tp, o.ep).param_count())
        weights += parallel.router_rows_bytes(cfg, o.ep, 2)
        assert weights < o.memory_bytes < weights + 3e9, (o.tp, o.ep)
        assert o.capacity_bytes == 141e9 and o.fits == (o.memory_bytes <= 141e9)
        assert any(("fits:" if o.fits else "needs") in r for r in o.reasons)
    by = {(o.tp, o.ep): o for o in plan.options}
    assert by[1, 1].fits is False and by[8, 8].fits is True  # 234 / 458 GB whole; an eighth of it
    assert by[1, 1].memory_bytes > 2 * cfg.param_count()
    assert plan.choice is not None and plan.choice.fits
    assert plan.choice.step_s == min(o.step_s for o in plan.options if o.fits)
    assert "chosen: lowest step time that fits" in plan.choice.reasons
    # TP=k EP=e with the same k hold about the same share: E/e experts at width F/(k/e) (what differs:
    # gpt-oss's expert down biases, tens of MB)
    for tp in (4, 8):
        same = [o.memory_bytes for o in plan.options if o.tp == tp]
        assert same == pytest.approx([same[0]] * len(same), rel=1e-3)


@needs_triton
def test_minimax_needs_four_devices_and_an_all_reduce_for_its_whole_projection_qk_norm(
    big_moe_on_eight_h200: dict[str, parallel.ParallelPlan],
) -> None:
    by = {(o.tp, o.ep): o for o in big_moe_on_eight_h200["minimax-m2"].options}
    assert by[2, 1].fits is False and by[2, 2].fits is False and by[4, 4].fits is True
    rows = [k for k in by[8, 8].prediction.kernels if k.pattern == "all_reduce"]
    assert len(rows) == 3 * 62 and sum(".attn.qk_norm." in k.group for k in rows) == 62
    gpt = {(o.tp, o.ep): o for o in big_moe_on_eight_h200["gpt-oss-120b"].options}
    assert sum(k.pattern == "all_reduce" for k in gpt[8, 8].prediction.kernels) == 2 * 36


@needs_triton
def test_expert_tensor_parallel_keeps_the_expert_flops_per_device(empty: Path) -> None:
    """TP=4 of olmoe's experts in three ways (EP 1, 2, 4): each device does a quarter of the expert FLOPs
    either way, so the moe_ffn rows agree."""
    cfg = _fewer_layers(zoo_config("olmoe-1b-7b"), 2)
    model = Model(name="olmoe-2", graph=build_decoder(cfg, name="olmoe-2", dtype=DType.BF16), source="",
                  config=cfg)  # fmt: skip
    plan = parallel.plan_parallel(model, 4, backend="cuda", target="h200", batch=64, calibration_dir=empty)
    flops = {
        (o.tp, o.ep): [k.flops for k in o.prediction.kernels if k.pattern == "moe_ffn"]
        for o in plan.options
        if o.tp == 4
    }
    assert set(flops) == {(4, 1), (4, 2), (4, 4)}
    for ep in (2, 4):
        assert flops[4, ep] == pytest.approx(flops[4, 1])


# --- Latent attention (MLA): the query heads split, the one-head latent cache whole on every device.


def test_the_latent_and_indexer_caches_are_not_divided_by_tp() -> None:
    """The device graph's latent cache (and DeepSeek-V3.2's indexer cache) has the model's shape at any
    TP: one head of kv_lora_rank + qk_rope_head_dim (index_head_dim), which TP cannot split; the query
    heads' tensors are what shrink."""
    cfg = _fewer_layers(zoo_config("deepseek-v3.2"), 4)
    full = build_decoder(cfg, name="full")
    for tp, ep in ((8, 8), (16, 4)):
        device = build_decoder(parallel.device_config(cfg, tp, ep), name="device")
        assert set(device.state) == set(full.state) and len(full.state) == 2 * 4
        for name, t in full.state.items():
            assert device.state[name].shape == t.shape, name
        assert device.state["layers.0.latent_cache"].shape[2:] == (1, 512 + 64)
        assert device.state["layers.0.indexer_cache"].shape[2:] == (1, 128)
        w_uk = "model.layers.0.self_attn.w_uk"
        assert device.params[w_uk].shape == (128 // tp, 512, 128) and full.params[w_uk].shape[0] == 128
    # Per token: (512 + 64) + 128 values a layer, in bf16, on every device.
    assert parallel.latent_cache_bytes_per_token(cfg, 2) == (576 + 128) * 2 * 4
    assert parallel.latent_cache_bytes_per_token(zoo_config("llama-3.2-1b"), 2) == 0


def test_mla_needs_no_kv_head_split() -> None:
    """num_key_value_heads does not limit MLA's TP: its cache is one head, replicated."""
    cfg = dataclasses.replace(zoo_config("deepseek-v3"), num_key_value_heads=3)
    assert parallel._unsplittable(cfg, 16, 16) is None
    assert parallel.device_config(cfg, 16, 16).num_key_value_heads == 128 // 16
    assert "attention heads (128) do not divide by TP=3" in (parallel._unsplittable(cfg, 3, 1) or "")


@pytest.fixture(scope="module")
def deepseek_v3_on_h200(empty: Path) -> dict[int, parallel.ParallelPlan]:
    return {
        n: parallel.plan_parallel("deepseek-v3", n, backend="cuda", target="h200", calibration_dir=empty)
        for n in (8, 16)
    }


@needs_triton
def test_eight_h200s_cannot_hold_deepseek_v3_in_bf16_and_sixteen_can(
    deepseek_v3_on_h200: dict[int, parallel.ParallelPlan],
) -> None:
    cfg = zoo_config("deepseek-v3")
    eight, sixteen = deepseek_v3_on_h200[8], deepseek_v3_on_h200[16]
    # 671B parameters x 2 bytes = 1.34 TB > 8 x 141 GB = 1.13 TB
    assert eight.weights_bytes == 2 * cfg.param_count() > 8 * 141e9
    assert eight.options and all(o.fits is False for o in eight.options) and eight.choice is None
    assert eight.memory_note is not None and "the weights alone take 1.34 TB in bf16" in eight.memory_note
    assert "8 x 141 GB = 1.13 TB" in eight.memory_note and "10 devices at the least" in eight.memory_note
    assert {o.tp for o in sixteen.options} == {1, 2, 4, 8, 16} and not sixteen.rejected
    choice = sixteen.choice
    assert choice is not None and choice.fits and choice.tp == 16 and sixteen.memory_note is None
    assert "chosen: lowest step time that fits" in choice.reasons
    assert all(o.fits is (o.tp == 16) for o in sixteen.options)  # TP=8 needs ~173 GB a device
    for plan in (eight, sixteen):
        for o in plan.options:
            # the device's bf16 share and router rows, plus its whole latent cache and activations
            weights = 2 * parallel.device_config(cfg, o.tp, o.ep).param_count()
            weights += parallel.router_rows_bytes(cfg, o.ep, 2)
            assert weights < o.memory_bytes < weights + 3e9, (o.tp, o.ep)


@needs_triton
def test_every_device_holds_the_whole_latent_cache_and_it_is_small(
    deepseek_v3_on_h200: dict[int, parallel.ParallelPlan],
) -> None:
    """Batch 1 at 1024 tokens: 65 blocks of 16 slots (one spare) of 576 bf16 values in 61 layers, the
    same on a device of TP=1 as of TP=16; a GQA-style cache of 128 heads' keys (192) and values (128)
    would be 71 times it."""
    cfg = zoo_config("deepseek-v3")
    per_token = parallel.latent_cache_bytes_per_token(cfg, 2)
    assert per_token == (512 + 64) * 2 * 61
    slots = (1024 // 16 + 1) * 16
    for o in deepseek_v3_on_h200[16].options:
        assert o.prediction.footprint.kv_cache_bytes == slots * per_token, (o.tp, o.ep)
        assert any("latent cache 73.1 MB whole on each device" in r for r in o.reasons)
    gqa = 128 * (192 + 128) * 2 * 61
    assert gqa > 70 * per_token
