"""Parallelism planning: tensor-parallel (and, for MoE, expert-parallel) degree for N devices.

Each option is predicted from the graph one device runs, lowered by the backend and priced by the cost
model (model.py):
- TP=t (Megatron style): attention heads, kv heads (and gpt-oss's per-head sinks) and the MLP's (or
  each expert's) intermediate width are split t ways, so a device runs the decoder built from a config
  with those sizes divided by t. Norms, residuals, the embedding, lm_head, the router and gpt-oss's
  o-projection and expert down-projection biases (added once, after the reduction) are replicated
  (vocab-parallel lm_head is not modeled). t must divide N, the heads, the kv heads and the widths.
- Latent attention (MLA: DeepSeek-V3, Kimi-K2, DeepSeek-V3.2, GLM-5) under TP=t: the query heads are
  split (q_b_proj's rows, the absorbed w_uk [H, r, nope] and w_uv [H, v, r], o_proj's columns), while
  q_a_proj, kv_a_proj_with_mqa, the latent norms and the latent cache [blocks, block, 1, r + rope] are
  whole on every device: the cache has one head shared by all query heads, which cannot be split, so
  each device holds the whole latent cache of its batch ((r + rope) x dtype bytes x layers per token,
  far less than a GQA cache; `latent_cache_bytes_per_token`). `num_key_value_heads` means nothing to
  MLA and is not checked. The lightning indexer (DeepSeek-V3.2, GLM-5) is replicated too, its cache
  [blocks, block, 1, index_head_dim] whole: its top-k ranks every cached position by a score summed
  over all indexer heads, so splitting its heads would add a per-layer all-reduce of [batch, ctx] f32
  scores before the top-k (growing with the context), to save a replica of ~14M parameters a layer.
- EP=e (MoE only; e divides t): attention as TP=t, and the experts split whole across e of the t
  devices, E/e each, every expert's width split t/e ways (EP=t: whole experts; EP=1: TP of every expert).
  e must divide the expert count. What is not a routed expert stays TP=t like a dense model: the shared
  experts (GLM-4.5) are TP-split like a dense MLP, and so are the dense layers of an MoE model
  (GLM-4.5's first layers, Qwen3-MoE's `mlp_only_layers`). The router is replicated: every device
  scores all E experts. The device's graph routes over its E/e experts only (its router holds E/e
  rows), so the rows it lacks are added to the device's memory (`router_rows_bytes`). A device's expert
  work assumes uniform routing: of the bucket's tokens x top-k assignments it serves 1/e, over
  E/e (1 - (1 - k/E)^tokens) expected active experts, each expert's GEMMs priced at the rate of its rows
  (model.py, `expert_parallel`). The dispatch to the experts' devices is priced as the all-reduce after
  the experts (each device sums its experts' part of every token), not as an all-to-all.
- Communication: two all-reduces per layer (after the o-projection and after the MLP or experts) of
  the step's activations [batch, seq, hidden], and, where q/k RMSNorm spans the whole projection (OLMoE,
  MiniMax-M2) that TP splits, a third of each token's f32 sums of squares of q and k; a ring all-reduce moves 2 (t-1)/t of them per device, at
  the profile's `interconnect_bandwidth` figure (every profile states it per device and per direction:
  a ring sends and receives at once), plus a fixed cost each: the calibration's `allreduce_latency`
  (the GPU suite measures it over every device of its host, in a loop of back-to-back calls; charged
  as it is at any TP degree, though more ranks cost more), else an assumed ASSUMED_ALLREDUCE_LATENCY_S
  (one launch overhead was far too little: two H200s ran TP=2 of Llama-3.2-1B slower than one GPU
  where launches alone predicted it faster), and the option says it is assumed.
  Without the bandwidth figure the communication time is unknown and the option says so.
- N / t replicas of the model serve independent batches of the bucket; throughput is replicas x batch
  per step.
- Memory per device: the cost model's footprint of the device's graph (weights, KV cache, activations),
  plus the replicated router rows under EP, against the profile's `memory_capacity`.
An option whose device graph the backend cannot lower (a kernel's limit, e.g. the router's expert
count) is not offered, with the lowering's message.
The choice: among options that fit (or whose fit is unknown) and meet the latency target, the highest
throughput when a target is given, else the lowest step time; fewer devices per replica break ties.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from polymorph.cli import console
from polymorph.cost.model import HardwareModel, KernelRow, Prediction, group_cost, predict
from polymorph.errors import UserError
from polymorph.hardware.profile import Profile, load_profile
from polymorph.hardware.target import Target
from polymorph.ir.dtypes import DType
from polymorph.ir.ops import Cost, node_cost
from polymorph.ir.shapes import numel
from polymorph.models import Model, load_model
from polymorph.models.config import ModelConfig
from polymorph.models.decoder import DEFAULT_BLOCK_SIZE, build_decoder
from polymorph.passes import bucket_bindings
from polymorph.pipeline.backend import registry
from polymorph.pipeline.plan import Plan


@dataclass(frozen=True)
class ParallelOption:
    """One way to spread the model over the devices, predicted per device at the bucket."""

    tp: int
    ep: int
    replicas: int  # devices // tp copies of the model
    compute_s: float  # the device's kernels, communication excluded
    allreduce_s: float | None  # None: the profile has no interconnect figure
    memory_bytes: float  # per device
    capacity_bytes: float | None
    fits: bool | None  # None: the profile has no memory capacity
    meets_target: bool | None  # None: no latency target
    tokens_per_s: float  # replicas x batch / step, decode tokens across all devices
    reasons: tuple[str, ...]
    prediction: Prediction  # the device's rows, all-reduces included when known
    chosen: bool = False

    @property
    def step_s(self) -> float:
        return self.compute_s + (self.allreduce_s or 0.0)


@dataclass(frozen=True)
class Rejected:
    tp: int
    ep: int
    reason: str


@dataclass(frozen=True)
class ParallelPlan:
    model: str
    profile: str
    backend: str
    devices: int
    batch: int
    ctx: int
    latency_target_s: float | None
    interconnect: str  # the figure used, or why there is none
    basis: str  # the cost model's calibration basis
    options: tuple[ParallelOption, ...]
    rejected: tuple[Rejected, ...]
    weights_bytes: float = 0.0  # the whole model's weights at the plan's dtype
    memory_note: str | None = None  # why nothing fits, where the weights alone exceed the devices

    @property
    def choice(self) -> ParallelOption | None:
        return next((o for o in self.options if o.chosen), None)


def plan_parallel(
    model: str | Path | Model,
    devices: int,
    *,
    backend: str | None = None,
    target: str | None = None,
    batch: int | None = None,
    ctx: int | None = None,
    traffic: str | Path | None = None,
    latency_s: float | None = None,
    dtype: str | None = None,
    calibration_dir: Path | None = None,
) -> ParallelPlan:
    """Options for running `model` on `devices` chips of `target` (a profile id; default the backend's
    first) at a traffic bucket (--batch/--ctx, or the heaviest bucket of `traffic`). UserError for bad
    devices, an unknown backend or chip, a model without a config, or a bad latency target."""
    from polymorph.api import pick_bucket
    from polymorph.knobs import knobs

    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise UserError(f"--devices must be a positive whole number of chips; got {devices!r}")
    if latency_s is not None and not latency_s > 0:
        raise UserError(f"--latency-ms must be a positive number of milliseconds; got {latency_s * 1e3:g}")
    b = registry.get(backend or knobs.backend)
    profile = load_profile(target or b.targets[0], calibration_dir or knobs.calibration_dir)
    if profile.id not in b.targets:
        raise UserError(f"backend `{b.name}` does not run `{profile.id}`; its chips: {', '.join(b.targets)}")
    dt = dtype or ("f32" if b.name == "cpu" else "bf16")
    m = model if isinstance(model, Model) else load_model(model, dtype=dt)
    if m.config is None:
        raise UserError(
            f"model `{m.name}` is an IR file; planning parallelism needs its config (a zoo name or HF dir)"
        )
    bucket = pick_bucket(batch, ctx, traffic)
    link = profile.figure("interconnect_bandwidth")
    interconnect = (
        f"{link.value:g} {link.unit} ({link.source}{'; ' + link.note if link.note else ''})"
        if link is not None
        else f"unknown: profile `{profile.id}` has no figures.interconnect_bandwidth"
    )
    options, rejected = [], []
    for tp, ep in _candidates(m.config, devices):
        why = _unsplittable(m.config, tp, ep)
        if why:
            rejected.append(Rejected(tp, ep, why))
            continue
        try:
            options.append(_option(m, profile, b.name, tp, ep, devices, bucket.batch, bucket.ctx, latency_s))
        except UserError as e:  # the device's graph does not lower (a kernel's limit): not offered
            rejected.append(Rejected(tp, ep, f"its device graph does not lower: {e}"))
    options = _choose(options, latency_s is not None)
    weights = float(m.config.weight_bytes(m.dtype.itemsize))
    return ParallelPlan(
        model=m.name,
        profile=profile.id,
        backend=b.name,
        devices=devices,
        batch=bucket.batch,
        ctx=bucket.ctx,
        latency_target_s=latency_s,
        interconnect=interconnect,
        basis=HardwareModel(profile).basis(),
        options=tuple(options),
        rejected=tuple(rejected),
        weights_bytes=weights,
        memory_note=_memory_note(weights, devices, profile, m.dtype.value, options),
    )


def _memory_note(
    weights: float, devices: int, profile: Profile, dtype: str, options: list[ParallelOption]
) -> str | None:
    """Where no option fits and the weights alone exceed every device's memory together: by how much,
    and how many devices the weights need at the least."""
    capacity = profile.memory_bytes()
    if capacity is None or any(o.fits is not False for o in options) or weights <= devices * capacity:
        return None
    least = math.ceil(weights / capacity)
    return (
        f"the weights alone take {_size(weights)} in {dtype}, more than {devices} x {profile.id} hold "
        f"({devices} x {_size(capacity)} = {_size(devices * capacity)}): no split fits; the weights need "
        f"{least} devices at the least, before the caches and activations"
    )


def device_config(cfg: ModelConfig, tp: int, ep: int) -> ModelConfig:
    """The config whose decoder is what one device runs under TP=tp, EP=ep (see the module docstring);
    `_unsplittable` says first whether the sizes divide."""
    fields: dict[str, object] = {
        "num_attention_heads": cfg.num_attention_heads // tp,
        # MLA has no kv heads (its latent cache is one head, whole on every device): the field follows
        # the query heads, as the hub configs write it
        "num_key_value_heads": cfg.num_attention_heads // tp if cfg.is_mla else cfg.num_key_value_heads // tp,
    }
    if not cfg.is_moe:
        fields["intermediate_size"] = cfg.intermediate_size // tp
        return dataclasses.replace(cfg, **fields)
    experts, width = cfg.num_experts or 0, cfg.expert_intermediate_size or 0
    # moe_intermediate_size is set whatever the family, so that `intermediate_size` is left to the dense
    # layers (Mixtral, OLMoE, MiniMax-M2 and gpt-oss give the experts' width there)
    fields.update(num_experts=experts // ep, moe_intermediate_size=width // (tp // ep))
    if cfg.dense_layers:
        fields["intermediate_size"] = cfg.intermediate_size // tp
    if cfg.shared_expert_size:
        fields["shared_expert_size"] = cfg.shared_expert_size // tp
    if ep > 1 and cfg.router_groups > 1:
        # The device routes over its own experts only (a cost proxy: the router's work is the
        # experts' fraction); its groups are the whole groups it holds, at least one.
        groups = cfg.router_groups // ep if cfg.router_groups % ep == 0 else 1
        fields.update(router_groups=groups, router_topk_groups=min(cfg.router_topk_groups, groups))
    return dataclasses.replace(cfg, **fields)


def router_rows_bytes(cfg: ModelConfig, ep: int, itemsize: int) -> int:
    """Bytes of the router rows (gate weight, router bias, correction bias) one device holds beyond its
    graph's under EP=ep: the router is replicated, the device graph's covers its E/ep experts."""
    if not cfg.is_moe or ep == 1:
        return 0
    missing = (cfg.num_experts or 0) - (cfg.num_experts or 0) // ep
    per_expert = cfg.hidden_size + cfg.router_bias + cfg.selection_bias
    moe_layers = sum(cfg.layer_is_moe(i) for i in range(cfg.num_hidden_layers))
    return missing * per_expert * moe_layers * itemsize


def _candidates(cfg: ModelConfig, devices: int) -> list[tuple[int, int]]:
    """(TP, EP) pairs: TP divides the devices, EP (MoE only) divides TP."""
    divisors = [t for t in range(1, devices + 1) if devices % t == 0]
    out = [(t, 1) for t in divisors]
    if cfg.is_moe:
        out += [(t, e) for t in divisors for e in divisors if 1 < e <= t and t % e == 0]
    return out


def latent_cache_bytes_per_token(cfg: ModelConfig, itemsize: int) -> int:
    """Bytes one token's latent state takes on each device of an MLA model, whatever the TP degree:
    the latent cache's (kv_lora_rank + qk_rope_head_dim) and the indexer cache's index_head_dim (the
    layers with an indexer of their own), times the dtype's bytes; 0 for other models."""
    if not cfg.is_mla:
        return 0
    layers = cfg.num_hidden_layers
    latent = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * layers
    indexer = cfg.index_head_dim * (layers - len(cfg.indexer_shared_layers)) if cfg.index_topk else 0
    return (latent + indexer) * itemsize


def _unsplittable(cfg: ModelConfig, tp: int, ep: int) -> str | None:
    heads = [("attention heads", cfg.num_attention_heads)]
    if not cfg.is_mla:  # MLA's one-head latent cache is replicated, never split
        heads.append(("kv heads", cfg.num_key_value_heads))
    for what, n in heads:
        if n % tp:
            return f"{what} ({n}) do not divide by TP={tp}"
    if not cfg.is_moe:
        if cfg.intermediate_size % tp:
            return f"intermediate width ({cfg.intermediate_size}) does not divide by TP={tp}"
        return None
    experts, k = cfg.num_experts or 0, cfg.num_experts_per_tok or 0
    if experts % ep:
        return f"experts ({experts}) do not divide by EP={ep}"
    if k > experts // ep:
        return (
            f"top-k ({k}) exceeds the {experts // ep} experts per device at EP={ep}: the device graph "
            "routes over its own experts"
        )
    width = cfg.expert_intermediate_size or 0
    if width % (tp // ep):
        how = f"TP={tp}" if ep == 1 else f"TP={tp} / EP={ep}"
        return f"each expert's width ({width}) does not divide by {how}"
    if cfg.shared_expert_size % tp:
        return f"shared experts' width ({cfg.shared_expert_size}) does not divide by TP={tp}"
    if cfg.dense_layers and cfg.intermediate_size % tp:
        return f"dense layers' width ({cfg.intermediate_size}) does not divide by TP={tp}"
    return None


def _option(
    m: Model,
    profile: Profile,
    backend: str,
    tp: int,
    ep: int,
    devices: int,
    batch: int,
    ctx: int,
    latency_s: float | None,
) -> ParallelOption:
    assert m.config is not None
    graph = build_decoder(
        device_config(m.config, tp, ep),
        name=f"{m.name}-tp{tp}-ep{ep}",
        dtype=m.dtype,
        block_size=int(m.graph.meta.get("block_size", DEFAULT_BLOCK_SIZE)),
    )
    plan = registry.get(backend).lower(graph, profile, bucket_bindings(graph, batch=batch, ctx=ctx))
    plan.model = m.name
    launches = None
    if Target.parse(plan.target).is_gpu:  # kernels per group, as the compile report counts them
        from polymorph.backends.gpu.backend import launch_counts

        launches = launch_counts(plan)
    base = predict(
        plan,
        profile,
        costs=_expert_parallel_costs(plan, ep) if ep > 1 else None,
        launches=launches,
        expert_parallel=ep,
    )
    compute_s = base.step_s
    rows = _allreduce_rows(m.config, profile, tp, batch, m.dtype)
    allreduce_s = None if rows is None else sum(r.predicted_s for r in rows)
    prediction = dataclasses.replace(base, kernels=base.kernels + tuple(rows or ()))
    capacity = profile.memory_bytes()
    memory = base.footprint.total_bytes + router_rows_bytes(m.config, ep, m.dtype.itemsize)
    fits = None if capacity is None else memory <= capacity
    step = compute_s + (allreduce_s or 0.0)
    meets = None if latency_s is None else step <= latency_s
    reasons = [_layout(m.config, tp, ep, devices)]
    if m.config.is_mla:
        reasons.append(_latent_cache(m.config, base.footprint.kv_cache_bytes, m.dtype.itemsize))
    if tp > 1 and rows is None:
        reasons.append("all-reduce time unknown (no interconnect figure): the step leaves it out")
    elif tp > 1:
        basis = allreduce_latency(profile)[1]
        reasons.append(f"{len(rows or ())} all-reduces take {console.seconds(allreduce_s)} ({basis})")
    if fits is None:
        reasons.append(f"memory capacity of `{profile.id}` unknown")
    elif not fits:
        reasons.append(f"needs {_size(memory)} per device, the chip has {_size(capacity)}")
    else:
        reasons.append(f"fits: {_size(memory)} of {_size(capacity)} per device")
    if meets is False:
        reasons.append(f"step {console.seconds(step)} misses the {console.seconds(latency_s)} target")
    return ParallelOption(
        tp=tp,
        ep=ep,
        replicas=devices // tp,
        compute_s=compute_s,
        allreduce_s=allreduce_s if tp > 1 else 0.0,
        memory_bytes=memory,
        capacity_bytes=float(capacity) if capacity is not None else None,
        fits=fits,
        meets_target=meets,
        tokens_per_s=(devices // tp) * batch / step,
        reasons=tuple(reasons),
        prediction=prediction,
    )


def _size(nbytes: float) -> str:
    return console.quantity(nbytes, "B")


def _layout(cfg: ModelConfig, tp: int, ep: int, devices: int) -> str:
    replicas = devices // tp
    copies = f"; {replicas} replicas serve separate batches" if replicas > 1 else ""
    if tp == 1:
        return f"whole model on each device{copies}"
    rest = [
        what
        for what, present in (
            ("the shared experts", cfg.shared_expert_size > 0),
            (_dense_layers(len(cfg.dense_layers)), bool(cfg.dense_layers)),
        )
        if present
    ]
    also = f" ({' and '.join(rest)} split {tp} ways too)" if rest else ""
    if ep > 1:
        per = (cfg.num_experts or 0) // ep
        experts = (
            f"{per} whole experts per device (EP={ep})"
            if ep == tp
            else f"{per} experts per device (EP={ep}), each's width split {tp // ep} ways"
        )
        attention = "attention's query heads" if cfg.is_mla else "attention"
        return f"{attention} split {tp} ways, {experts}{also}{copies}"
    width = "each expert's width" if cfg.is_moe else "MLP width"
    heads = "query heads" if cfg.is_mla else "heads, kv heads"
    return f"{heads} and {width} split {tp} ways (TP={tp}){also}{copies}"


def _latent_cache(cfg: ModelConfig, nbytes: float, itemsize: int) -> str:
    per_token = latent_cache_bytes_per_token(cfg, itemsize)
    what = "latent and indexer caches" if cfg.index_topk else "latent cache"
    return (
        f"{what} {_size(nbytes)} whole on each device ({_size(per_token)} a token over "
        f"{cfg.num_hidden_layers} layers: one head, not split by TP)"
    )


def _dense_layers(n: int) -> str:
    return "the dense layer's MLP" if n == 1 else f"the {n} dense layers' MLPs"


# The fixed cost of one small all-reduce where no calibration measured it. From the 2 x H200 run of
# BENCHMARKS.md (470d4a1, bench/tp_check.py, batch 1): TP=2 graph replay 1.87 ms against 1.72 ms on one
# GPU, both host-timed with ~0.7 ms of copies (one GPU's device time was 1.01 ms); TP=2's kernels
# predicted at 0.71x one GPU's leave ~0.45 ms for its 32 all-reduces: ~14 us each. A derived figure,
# not a measurement of the all-reduce itself.
ASSUMED_ALLREDUCE_LATENCY_S = 15e-6


def _allreduce_rows(
    cfg: ModelConfig, profile: Profile, tp: int, batch: int, dtype: DType
) -> list[KernelRow] | None:
    """Two ring all-reduces per layer of [batch, 1, hidden] activations, and a third of [batch, 2] f32
    sums of squares where q/k RMSNorm spans the whole (split) projection; [] for TP=1, None when
    unknown."""
    if tp == 1:
        return []
    link = profile.figure("interconnect_bandwidth")
    if link is None:
        return None
    # A measured small all-reduce (the suite on several devices) is its fixed cost: launch, the
    # handshake between devices, the sync. Without one, the assumed figure.
    overhead = allreduce_latency(profile)[0]
    sizes = [
        ("attn.o", batch * cfg.hidden_size * dtype.itemsize),
        ("mlp.down", batch * cfg.hidden_size * dtype.itemsize),
    ]
    if cfg.qk_norm_full:  # OLMoE, MiniMax-M2: the norm's mean square is over all heads' q (and k)
        sizes.insert(0, ("attn.qk_norm", batch * 2 * DType.F32.itemsize))
    rows = []
    for layer in range(cfg.num_hidden_layers):
        for where, nbytes in sizes:
            moved = 2.0 * (tp - 1) / tp * nbytes
            wire = moved / link.si
            rows.append(
                KernelRow(
                    group=f"layers.{layer}.{where}.allreduce",
                    pattern="all_reduce",
                    bytes=moved,
                    flops=0.0,
                    dtype=dtype.value,
                    memory_s=wire,
                    compute_s=0.0,
                    overhead_s=overhead,
                    predicted_s=wire + overhead,
                    bound="interconnect" if wire > overhead else "overhead",
                )
            )
    return rows


def _expert_parallel_costs(plan: Plan, ep: int) -> dict[str, Cost]:
    """Per-device cost of each group holding a moe_ffn node, under balanced routing over `ep` devices."""
    graph, bindings = plan.graph, dict(plan.bindings)
    types = graph.types()
    by_name = {n.name: n for n in graph.nodes}
    out: dict[str, Cost] = {}
    for group in plan.groups:
        moe = [by_name[n] for n in group.nodes if by_name[n].op == "moe_ffn"]
        if not moe:
            continue
        cost = group_cost(graph, group, types, bindings)
        flops, nbytes = cost.flops, cost.bytes
        for node in moe:
            naive = node_cost(
                node, [types[v] for v in node.inputs], [types[v] for v in node.outputs], bindings
            )
            x, routing, w_gate = (types[v] for v in node.inputs[:2] + node.inputs[3:4])
            tokens = numel(x.shape[:-1], bindings)
            k = numel(routing.shape[-1:], bindings)
            experts, ffn, dim = (numel((d,), bindings) for d in w_gate.shape)
            served = tokens * k / ep  # assignments this device serves
            touched_naive = min(experts, tokens * k)
            touched = min(experts, served)
            weight_bytes = 3.0 * ffn * dim * w_gate.dtype.itemsize
            flops += 6.0 * served * ffn * dim - naive.flops
            nbytes += (touched - touched_naive) * weight_bytes
        out[group.id] = Cost(flops, max(nbytes, 0.0))
    return out


def allreduce_latency(profile: Profile) -> tuple[float, str]:
    """(seconds, where the figure comes from) of one small all-reduce's fixed cost on `profile`."""
    cal = profile.calibration
    measured = cal.allreduce_latency if cal is not None else None
    if measured is not None:
        return measured.si, f"{console.seconds(measured.si)} latency each, measured"
    return ASSUMED_ALLREDUCE_LATENCY_S, (
        f"{console.seconds(ASSUMED_ALLREDUCE_LATENCY_S)} latency each, assumed: no calibration measured it"
    )


def _choose(options: list[ParallelOption], by_throughput: bool) -> list[ParallelOption]:
    feasible = [o for o in options if o.fits is not False and o.meets_target is not False]
    if not feasible:
        return options
    if by_throughput:
        best = max(feasible, key=lambda o: (o.tokens_per_s, -o.tp))
        why = "chosen: highest throughput that fits and meets the target"
    else:
        best = min(feasible, key=lambda o: (o.step_s, o.tp))
        why = (
            "chosen: lowest step time that fits" if best.fits else "chosen: lowest step time (fit unchecked)"
        )
    return [
        dataclasses.replace(o, chosen=True, reasons=(*o.reasons, why)) if o is best else o for o in options
    ]


def print_plan(plan: ParallelPlan) -> None:
    """The options as a table, then the bucket, interconnect, cost basis and rejected degrees."""
    rows = []
    for o in plan.options:
        rows.append(
            (
                "*" if o.chosen else "",
                o.tp,
                o.ep,
                o.replicas,
                console.seconds(o.compute_s),
                "-"
                if o.tp == 1
                else console.seconds(o.allreduce_s)
                if o.allreduce_s is not None
                else "unknown",
                console.seconds(o.step_s),
                f"{o.tokens_per_s:,.0f}",
                console.quantity(o.memory_bytes, "B"),
                console.quantity(o.capacity_bytes, "B") if o.capacity_bytes is not None else "unknown",
                "; ".join(o.reasons),
            )
        )
    console.table(
        f"{plan.model} on {plan.devices} x {plan.profile} ({plan.backend}), batch {plan.batch}, ctx {plan.ctx}",
        [
            "",
            "TP",
            "EP",
            "replicas",
            "kernels",
            "all-reduce",
            "step",
            "tokens/s",
            "memory/device",
            "capacity",
            "why",
        ],
        rows,
    )
    if plan.latency_target_s is not None:
        console.line(f"latency target: {plan.latency_target_s * 1e3:g} ms per step")
    console.line(f"interconnect: {plan.interconnect}")
    console.line(f"cost model: {plan.basis}")
    for r in plan.rejected:
        console.line(f"not offered: TP={r.tp}" + (f", EP={r.ep}" if r.ep > 1 else "") + f": {r.reason}")
    if plan.memory_note is not None:
        console.warn(plan.memory_note)
    if plan.choice is None:
        console.warn("no option fits the devices' memory and the latency target")


def cmd_plan(args: argparse.Namespace) -> int:
    """`polymorph plan`: exit 0 with a choice, 1 when no option fits memory and the latency target."""
    latency = None if args.latency_ms is None else args.latency_ms * 1e-3
    plan = plan_parallel(
        args.model,
        args.devices,
        backend=args.backend,
        target=args.target,
        batch=args.batch,
        ctx=args.ctx,
        traffic=args.traffic,
        latency_s=latency,
        dtype=args.dtype,
    )
    print_plan(plan)
    return 0 if plan.choice is not None else 1


def add_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `polymorph plan` on the CLI's subparsers (cli.build_parser's `sub`)."""
    help = "choose tensor/expert-parallel degrees for N devices from the cost model"
    c = subparsers.add_parser("plan", help=help, description=help)
    c.set_defaults(fn=cmd_plan)
    c.add_argument("model", help="zoo name or Hugging Face model directory")
    c.add_argument("--backend", help="backend name (default: POLYMORPH_BACKEND or cpu)")
    c.add_argument("--devices", type=int, required=True, help="number of chips")
    c.add_argument("--target", help="chip profile id (default: the backend's first)")
    c.add_argument("--traffic", help="traffic shape TOML; planned for its heaviest bucket")
    c.add_argument("--batch", type=int)
    c.add_argument("--ctx", type=int)
    c.add_argument("--latency-ms", type=float, help="per-step latency target in milliseconds")
    c.add_argument("--dtype", help="weight dtype (default f32 on cpu, bf16 elsewhere)")
    return c


def option_table(plan: ParallelPlan) -> list[Mapping[str, object]]:
    """The options as plain dicts (for JSON and agents), per-kernel rows left out."""
    return [
        {k: v for k, v in dataclasses.asdict(o).items() if k != "prediction"} | {"step_s": o.step_s}
        for o in plan.options
    ]
