"""The MoE router: logits[*, E] -> weights[*, k] f32, indices[*, k] i32, one row of experts in registers.

Each program holds ROWS tokens' logits ([ROWS, BLOCK_E], E <= 256) and picks the top k by k rounds of
argmax, the lowest index winning a tie (the reference's stable descending sort). `topk_softmax`
(Mixtral) softmaxes the k chosen logits; `softmax_topk` (Qwen3-MoE) softmaxes all E first, picks the
top k probabilities, and divides by their sum when `normalize` is set. All math is float32.

Constraints (supports): cuda or rocm; one topk_router node; logits f32, bf16 or f16 with a concrete
expert count E <= 256; weights out f32, indices out i32 or i64; 1 <= k <= min(8, E).

Config keys: rows (tokens per program), num_warps; the arch's launch options (waves_per_eu).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "topk_router"

MAX_EXPERTS = 256
MAX_K = 8

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
def _topk_router_kernel(
    logits_ptr,  # [n_rows, E]
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

    ks = tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]
    vals = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    idxs = tl.zeros([ROWS, BLOCK_K], dtype=tl.int32)
    free = is_expert & (rows >= 0)[:, None]  # [ROWS, BLOCK_E]: not yet chosen
    for j in tl.static_range(K):
        cand = tl.where(free, x, float("-inf"))
        best = tl.max(cand, axis=1)  # [ROWS]
        hit = free & (cand == best[:, None])
        arg = tl.min(tl.where(hit, cols[None, :], BLOCK_E), axis=1)  # [ROWS]: lowest index of the max
        vals = tl.where(ks == j, best[:, None], vals)
        idxs = tl.where(ks == j, arg[:, None], idxs)
        free = free & (cols[None, :] != arg[:, None])

    in_k = ks < K
    if SOFTMAX_FIRST:
        w = vals
        if NORMALIZE:
            w = vals / tl.sum(tl.where(in_k, vals, 0.0), axis=1)[:, None]
    else:
        # vals[:, 0] is the largest chosen logit, so this is softmax over the k chosen
        z = tl.where(in_k, tl.exp(vals - tl.max(tl.where(in_k, vals, float("-inf")), axis=1)[:, None]), 0.0)
        w = z / tl.sum(z, axis=1)[:, None]
    out = rows[:, None].to(tl.int64) * K + ks
    out_mask = row_ok[:, None] & in_k
    tl.store(weights_ptr + out, w, mask=out_mask)
    tl.store(indices_ptr + out, idxs.to(indices_ptr.dtype.element_ty), mask=out_mask)


def supports(spec: Any) -> bool:
    if len(spec.nodes) != 1 or spec.single.op != "topk_router" or not spec.target.is_gpu:
        return False
    node = spec.single
    logits = spec.types[node.inputs[0]]
    weights, indices = (spec.types[v] for v in node.outputs)
    experts, k = logits.shape[-1], spec.attrs()["k"]
    return (
        str(logits.dtype) in ("f32", "bf16", "f16")
        and str(weights.dtype) == "f32"
        and str(indices.dtype) in ("i32", "i64")
        and isinstance(experts, int)
        and experts <= MAX_EXPERTS
        and 1 <= k <= min(MAX_K, experts)
    )


def _constexprs(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    attrs = spec.attrs()
    experts, k = spec.types[spec.single.inputs[0]].shape[-1], attrs["k"]
    return {
        "E": experts,
        "K": k,
        "BLOCK_E": triton.next_power_of_2(experts),
        "BLOCK_K": triton.next_power_of_2(k),
        "ROWS": config["rows"],
        "SOFTMAX_FIRST": attrs["mode"] == "softmax_topk",
        "NORMALIZE": bool(attrs["normalize"]),
    }


def _options(config: dict[str, Any], traits: Any) -> dict[str, Any]:
    return {"num_warps": config["num_warps"], "num_stages": 1, **_t.extra_options(config, traits)}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    (arg,) = spec.args(spec.single)
    consts = _constexprs(spec, config)
    options = _options(config, traits)
    experts, rows = consts["E"], consts["ROWS"]

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        logits = inputs[arg].contiguous()  # [*, E]
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
        _topk_router_kernel[(triton.cdiv(n_rows, rows),)](logits, w, i, n_rows, **consts, **options)
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
    signature = {
        "logits_ptr": "*" + _TRITON_DTYPE[str(logits.dtype)],
        "weights_ptr": "*" + _TRITON_DTYPE[str(weights.dtype)],
        "indices_ptr": "*" + _TRITON_DTYPE[str(indices.dtype)],
        "n_rows": "i32",
        **{name: "constexpr" for name in consts},
    }
    return [CompileUnit("topk_router", _topk_router_kernel, signature, consts, _options(config, traits))]
