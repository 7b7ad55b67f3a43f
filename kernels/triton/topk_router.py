"""The MoE router: logits[*, E] (, bias[E]) -> weights[*, k] f32, indices[*, k] i32, one row of experts
in registers.

Each program holds ROWS tokens' logits ([ROWS, BLOCK_E], E <= 512) and picks the top k by k rounds of
argmax, the lowest index winning a tie (the reference's stable descending sort). The modes of
ops._ROUTER, each a compile-time branch (a mode's code carries nothing of the others):
- `topk_softmax` (Mixtral, gpt-oss) softmaxes the k chosen logits;
- `softmax_topk` (Qwen3-MoE) softmaxes all E first and picks the top k probabilities;
- `sigmoid_topk` (GLM-4.5, DeepSeek-V3) chooses by sigmoid(logit) + bias (HAS_BIAS) and weights by the
  sigmoid; with GROUPS > 1 (and TOPK_GROUPS < GROUPS) each group of E / GROUPS experts is scored by
  the sum of its two best choice scores (GROUPS rounds over the row), the TOPK_GROUPS best groups are
  kept (the lower group winning a tie), and only their experts are candidates;
- `topk_sigmoid` (Llama 4) picks the k largest logits and weights each by its sigmoid.
`normalize` divides by the sum of the k weights (softmax_topk and sigmoid_topk, as the reference);
SCALING (routed_scaling_factor) multiplies the weights last, and 1.0 compiles to no multiply. All
math is float32.

Constraints (supports): cuda or rocm; one topk_router node of one of the four modes; logits (and a
bias, sigmoid_topk only) f32, bf16 or f16 with a concrete expert count E <= 256; weights out f32,
indices out i32 or i64; 1 <= k <= min(8, E); groups (sigmoid_topk only) <= 16, dividing E into groups
of >= 2 experts; scaling > 0.

Config keys: rows (tokens per program), num_warps; the arch's launch options (waves_per_eu).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "topk_router"

MAX_EXPERTS = 512  # Kimi-K2 routes over 384
MAX_K = 8
MAX_GROUPS = 16  # the group scoring unrolls one pass over the row per group
MODES = ("topk_softmax", "softmax_topk", "sigmoid_topk", "topk_sigmoid")
_FLOATS = ("f32", "bf16", "f16")

# ROWS tokens per program: 1 for few tokens; more when E is small, so a warp's lanes all hold logits.
_WARP32_CONFIGS = [
    {"rows": 1, "num_warps": 1},
    {"rows": 4, "num_warps": 1},
    {"rows": 16, "num_warps": 4},
]
# wave64: one wavefront already spans 64 lanes, so more rows per wave before adding waves.
# CDNA: one wave64 holds a row of up to 64 experts; waves_per_eu 0 leaves occupancy to the compiler
# (a few KB of registers a program), not measured on a device.
_WAVE64_CONFIGS = [  # written for 64-wide waves
    {"rows": 1, "num_warps": 1, "waves_per_eu": 0},
    {"rows": 8, "num_warps": 1, "waves_per_eu": 0},
    {"rows": 32, "num_warps": 4, "waves_per_eu": 2},
]
CONFIGS = _WARP32_CONFIGS
# Configs and launch options per chip, from its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")

_TRITON_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i32": "i32", "i64": "i64"}


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))  # the reference's form: exp(-x) = inf gives 0


@triton.jit
def _kept_groups(
    sel,  # [ROWS, BLOCK_E] choice scores
    cols,  # [BLOCK_E]
    free,  # [ROWS, BLOCK_E] the row's real experts
    GROUP: tl.constexpr,  # experts per group
    GROUPS: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """free narrowed to the experts of the TOPK_GROUPS best groups, a group scored by the sum of its
    two best choice scores (padding experts, cols >= E, fall in no group)."""
    gid = cols // GROUP  # [BLOCK_E]
    score = tl.where(free, sel, 0.0)  # [ROWS, BLOCK_E]: each expert's group score, below
    for g in tl.static_range(GROUPS):
        mine = (gid == g)[None, :]  # [1, BLOCK_E]
        c = tl.where(mine, sel, float("-inf"))
        best = tl.max(c, axis=1)  # [ROWS]
        arg = tl.min(tl.where(mine & (c == best[:, None]), cols[None, :], BLOCK_E), axis=1)
        second = tl.max(tl.where(cols[None, :] == arg[:, None], float("-inf"), c), axis=1)
        score = tl.where(mine, (best + second)[:, None], score)
    keep = free & (cols < 0)[None, :]  # [ROWS, BLOCK_E] all False
    open_ = free
    for _ in tl.static_range(TOPK_GROUPS):
        cand = tl.where(open_, score, float("-inf"))
        best = tl.max(cand, axis=1)
        pick = tl.min(tl.where(open_ & (cand == best[:, None]), gid[None, :], GROUPS), axis=1)  # [ROWS]
        chosen = gid[None, :] == pick[:, None]
        keep = keep | chosen
        open_ = open_ & (gid[None, :] != pick[:, None])
    return free & keep


@triton.jit
def _topk_router_kernel(
    logits_ptr,  # [n_rows, E]
    bias_ptr,  # [E] selection bias (HAS_BIAS), else None
    weights_ptr,  # [n_rows, K] f32
    indices_ptr,  # [n_rows, K] int
    n_rows,
    E: tl.constexpr,
    K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,
    SOFTMAX_FIRST: tl.constexpr,
    NORMALIZE: tl.constexpr,
    SIGMOID_FIRST: tl.constexpr,  # sigmoid_topk
    SIGMOID_AFTER: tl.constexpr,  # topk_sigmoid
    HAS_BIAS: tl.constexpr,
    GROUPS: tl.constexpr,  # 1: no group limit
    TOPK_GROUPS: tl.constexpr,
    SCALING: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_E)  # [BLOCK_E]
    is_expert = (cols < E)[None, :]  # [1, BLOCK_E]
    valid = row_ok[:, None] & is_expert  # [ROWS, BLOCK_E]
    x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * E + cols[None, :], mask=valid, other=0.0)
    # padding experts never win; padding rows read zeros (finite, so their softmax stays finite)
    x = tl.where(is_expert, x.to(tl.float32), float("-inf"))  # [ROWS, BLOCK_E]
    if SOFTMAX_FIRST:
        p = tl.where(is_expert, tl.exp(x - tl.max(x, axis=1)[:, None]), 0.0)
        x = p / tl.sum(p, axis=1)[:, None]

    free = is_expert & (rows >= 0)[:, None]  # [ROWS, BLOCK_E]: not yet chosen
    sel = x  # [ROWS, BLOCK_E]: what the experts are chosen by
    if SIGMOID_FIRST:
        x = _sigmoid(x)  # the weights
        sel = x
        if HAS_BIAS:
            sel = x + tl.load(bias_ptr + cols, mask=cols < E, other=0.0).to(tl.float32)[None, :]
        if GROUPS > 1:
            free = _kept_groups(sel, cols, free, E // GROUPS, GROUPS, TOPK_GROUPS, BLOCK_E)

    ks = tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]
    vals = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    idxs = tl.zeros([ROWS, BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(K):
        cand = tl.where(free, sel, float("-inf"))
        best = tl.max(cand, axis=1)  # [ROWS]
        hit = free & (cand == best[:, None])
        arg = tl.min(tl.where(hit, cols[None, :], BLOCK_E), axis=1)  # [ROWS]: lowest index of the max
        if HAS_BIAS:  # chosen by score + bias, weighted by the score
            best = tl.sum(tl.where(cols[None, :] == arg[:, None], x, 0.0), axis=1)
        vals = tl.where(ks == j, best[:, None], vals)
        idxs = tl.where(ks == j, arg[:, None], idxs)
        free = free & (cols[None, :] != arg[:, None])

    in_k = ks < K
    if SOFTMAX_FIRST or SIGMOID_FIRST:
        w = vals
        if NORMALIZE:
            w = vals / tl.sum(tl.where(in_k, vals, 0.0), axis=1)[:, None]
    elif SIGMOID_AFTER:
        w = _sigmoid(vals)
    else:
        # vals[:, 0] is the largest chosen logit, so this is softmax over the k chosen
        z = tl.where(in_k, tl.exp(vals - tl.max(tl.where(in_k, vals, float("-inf")), axis=1)[:, None]), 0.0)
        w = z / tl.sum(z, axis=1)[:, None]
    if SCALING != 1.0:
        w = w * SCALING
    out = rows[:, None].to(tl.int64) * K + ks
    out_mask = row_ok[:, None] & in_k
    tl.store(weights_ptr + out, w, mask=out_mask)
    tl.store(indices_ptr + out, idxs.to(indices_ptr.dtype.element_ty), mask=out_mask)


def supports(spec: Any) -> bool:
    if len(spec.nodes) != 1 or spec.single.op != "topk_router" or not spec.target.is_gpu:
        return False
    node = spec.single
    if len(node.inputs) not in (1, 2) or len(node.outputs) != 2:
        return False
    logits = spec.types[node.inputs[0]]
    weights, indices = (spec.types[v] for v in node.outputs)
    attrs = spec.attrs()
    experts, k, mode = logits.shape[-1], attrs["k"], attrs["mode"]
    groups, topk_groups, scaling = attrs["groups"], attrs["topk_groups"], attrs["scaling"]
    if not (
        mode in MODES
        and str(logits.dtype) in _FLOATS
        and str(weights.dtype) == "f32"
        and str(indices.dtype) in ("i32", "i64")
        and isinstance(experts, int)
        and experts <= MAX_EXPERTS
        and 1 <= k <= min(MAX_K, experts)
        and attrs["normalize"] in (False, True)
        and isinstance(scaling, int | float)
        and math.isfinite(scaling)
        and scaling > 0
    ):
        return False
    if len(node.inputs) == 2:  # the selection bias: sigmoid_topk's only
        bias = spec.types[node.inputs[1]]
        if mode != "sigmoid_topk" or str(bias.dtype) not in _FLOATS or tuple(bias.shape) != (experts,):
            return False
    if groups == 1:
        return topk_groups in (0, 1)
    return (
        mode == "sigmoid_topk"
        and 1 < groups <= MAX_GROUPS
        and experts % groups == 0
        and experts // groups >= 2
        and 0 <= topk_groups <= groups
        and k <= (topk_groups or groups) * (experts // groups)
    )


def _constexprs(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    attrs = spec.attrs()
    experts, k, mode = spec.types[spec.single.inputs[0]].shape[-1], attrs["k"], attrs["mode"]
    groups = attrs["groups"]
    kept = attrs["topk_groups"] or groups
    if kept == groups:  # every group kept: no group limit
        groups = kept = 1
    return {
        "E": experts,
        "K": k,
        "BLOCK_E": triton.next_power_of_2(experts),
        "BLOCK_K": triton.next_power_of_2(k),
        "ROWS": config["rows"],
        "SOFTMAX_FIRST": mode == "softmax_topk",
        "NORMALIZE": bool(attrs["normalize"]) and mode in ("softmax_topk", "sigmoid_topk"),
        "SIGMOID_FIRST": mode == "sigmoid_topk",
        "SIGMOID_AFTER": mode == "topk_sigmoid",
        "HAS_BIAS": len(spec.single.inputs) == 2,
        "GROUPS": groups,
        "TOPK_GROUPS": kept,
        "SCALING": float(attrs["scaling"]),
    }


def _options(config: dict[str, Any], traits: Any) -> dict[str, Any]:
    return {"num_warps": config["num_warps"], "num_stages": 1, **_t.extra_options(config, traits)}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    args = spec.args(spec.single)  # logits (, bias)
    consts = _constexprs(spec, config)
    options = _options(config, traits)
    experts, rows = consts["E"], consts["ROWS"]

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        logits = inputs[args[0]].contiguous()  # [*, E]
        bias = inputs[args[1]].contiguous() if len(args) > 1 else None  # [E]
        weights, indices = outputs  # [*, k] f32, [*, k] int
        n_rows = logits.numel() // experts
        if n_rows == 0:
            return
        w = (
            weights
            if weights.is_contiguous()
            else torch.empty_like(weights, memory_format=torch.contiguous_format)
        )
        i = (
            indices
            if indices.is_contiguous()
            else torch.empty_like(indices, memory_format=torch.contiguous_format)
        )
        _topk_router_kernel[(triton.cdiv(n_rows, rows),)](logits, bias, w, i, n_rows, **consts, **options)
        if w is not weights:
            weights.copy_(w)
        if i is not indices:
            indices.copy_(i)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    node = spec.single
    logits = spec.types[node.inputs[0]]
    weights, indices = (spec.types[v] for v in node.outputs)
    consts = _constexprs(spec, config)
    bias = {}  # no bias: the pointer is the constexpr None
    if len(node.inputs) > 1:
        bias["bias_ptr"] = "*" + _TRITON_DTYPE[str(spec.types[node.inputs[1]].dtype)]
    else:
        consts = {"bias_ptr": None, **consts}
    signature = {
        "logits_ptr": "*" + _TRITON_DTYPE[str(logits.dtype)],
        "bias_ptr": bias.get("bias_ptr", "constexpr"),
        "weights_ptr": "*" + _TRITON_DTYPE[str(weights.dtype)],
        "indices_ptr": "*" + _TRITON_DTYPE[str(indices.dtype)],
        "n_rows": "i32",
        **{name: "constexpr" for name in consts if name != "bias_ptr"},
    }
    return [CompileUnit("topk_router", _topk_router_kernel, signature, consts, _options(config, traits))]
