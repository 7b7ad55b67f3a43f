"""The MoE expert FFN: out[t] = sum_j w[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]), e = idx[t, j].

The features of ops._EXPERTS, each a compile-time constant (a kernel without one compiles to the code
it had before the feature): HAS_BIAS adds b_gate, b_up (before the activation) and b_down (before the
routing weight); CLAMP is gpt-oss's swiglu_clamp with ALPHA and LIMIT; WEIGHT_INPUT (Llama 4) has the
routing weight scale the expert's input, applied to the f32 gate/up sums (w (x W^T) = (w x) W^T), and
the down kernels then take no weight. Pointers a kernel takes only for a feature are the constexpr
None without it. On the grouped paths the biases start the accumulators (no bias registers live
through the K loop); swiglu_clamp caps the gate/up N tile at 64 and weight_input the down N tile at
128, where the default tiles spilled registers (ptxas on sm_90 / sm_100; not timed).

Paths, chosen per launch from the number of token slots S = T * k (`_path`):

  GEMV (decode, S <= gemv_max_slots): `_gate_up_gemv` gives each program (slot, block of F rows) of
  both projections, silu(gate) * up in the epilogue, into an f32 scratch act[S, F]; `_down_gemv`
  gives each program (token, block of D rows) and sums that token's k slots, routing-weighted, in
  fp32 before one cast and store. No atomics: every output element has one writer.

  Grouped GEMM (S beyond that): a small torch preprocessing step sorts the slots by expert and cuts
  each expert's run into BLOCK_M-row tiles (`_route_tiles`), all in fixed-size buffers with no host
  sync, so it is CUDA-graph capturable (torch.bincount is avoided: on CUDA it reads the max back to
  the host; counts come from searchsorted on the sorted ids instead). `_gate_up_grouped` runs the
  tl.dot GEMM of each tile's gathered x rows against its expert's gate and up tiles with silu * mul
  in the epilogue; `_down_grouped` multiplies by w_down with the routing weight in the epilogue and
  writes one f32 row per slot; `_sum_slots` adds each token's k rows in a fixed order and casts
  (k = 1 skips it: the down GEMM writes the output directly). Two tile sets: `small_*` while the
  average expert has at most small_max_rows rows (decode batches: weights read once per expert,
  little M padding), the large one beyond (prefill).

Numerics follow the reference (f32 math, one rounding at the output): fp32 accumulation; act is
f32 on the GEMV path, and on the grouped path it is stored as hi + lo halves in the weights' 16-bit
type, which the down GEMM multiplies in two tensor-core dots (one bf16 rounding of act fails the op
tolerance where the output cancels; the pair keeps ~16 more bits). tl.dot runs with
input_precision="ieee", so f32 models are not demoted to tf32. An f16 model whose |act| passes
65504 overflows the hi half (the reference would not).

Constraints (supports): cuda or rocm; x and the three weights of one float dtype (bf16, f16, f32),
the output too; biases (all three or none) f32/bf16/f16; routing weights f32/bf16/f16, indices
i32/i64 (valid expert ids, as the router writes); concrete E, F, D, k; activation silu or
swiglu_clamp (finite alpha and limit). Inputs are made contiguous (a no-op for the runtime's buffers).

Config keys (one config sets every path; a launch takes one): gemv_max_slots and small_max_rows pick
the path; gemv_block_f, gemv_block_d, gemv_block_k, gemv_warps (GEMV); small_block_m, small_block_n,
small_block_k, small_warps, small_stages (the grouped GEMM's decode tile); block_m, block_n,
down_block_n, block_k, num_warps, num_stages (its prefill tile); the arch's launch options (waves_per_eu) where it takes them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "moe_ffn"

# One config carries a setting for each path (a launch takes one), so the list zips the spaces.
# gemv_*: gemv_block_f rows of F per gate/up program, gemv_block_d rows of D per down program, both
# streaming gemv_block_k of the reduction dim per step. small_*: the grouped GEMM tile while the
# average expert has at most small_max_rows rows (decode batches; its N tile serves both GEMMs).
# block_m/block_n/down_block_n/block_k/num_warps/num_stages: the grouped GEMM tile beyond (prefill).
# gemv_max_slots and small_max_rows pick the path (0: never that path).
_WARP32_CONFIGS = [
    # Hopper, measured on an H200 at Mixtral-8x7B's layer (D 4096, F 14336, E 8, k 2, bf16, in a CUDA
    # graph): GEMV to T = 2 (3.5-3.9 TB/s of weights); a 32-row mma.sync tile to 16 rows per expert
    # (T <= 64, ~3.9 TB/s); then 128-row wgmma tiles, two 128x128 fp32 accumulators (gate, up) and a
    # 128x256 one for down (~400 TFLOP/s of useful work at T = 2048 and 8192).
    {"gemv_max_slots": 4, "gemv_block_f": 16, "gemv_block_d": 4, "gemv_block_k": 512, "gemv_warps": 4,
     "small_max_rows": 16, "small_block_m": 32, "small_block_n": 64, "small_block_k": 128,
     "small_warps": 4, "small_stages": 4,
     "block_m": 128, "block_n": 128, "down_block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # always the large tile (the interpreted tests reach it through this config)
    {"gemv_max_slots": 0, "gemv_block_f": 16, "gemv_block_d": 8, "gemv_block_k": 256, "gemv_warps": 4,
     "small_max_rows": 0, "small_block_m": 16, "small_block_n": 64, "small_block_k": 128,
     "small_warps": 4, "small_stages": 4,
     "block_m": 128, "block_n": 64, "down_block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # always grouped: a 64-row wgmma small tile up to 32 rows per expert
    {"gemv_max_slots": 0, "gemv_block_f": 8, "gemv_block_d": 8, "gemv_block_k": 512, "gemv_warps": 4,
     "small_max_rows": 32, "small_block_m": 64, "small_block_n": 128, "small_block_k": 64,
     "small_warps": 4, "small_stages": 4,
     "block_m": 128, "block_n": 128, "down_block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # GEMV further into small batches; 16-row small tile
    {"gemv_max_slots": 32, "gemv_block_f": 32, "gemv_block_d": 16, "gemv_block_k": 128, "gemv_warps": 8,
     "small_max_rows": 16, "small_block_m": 16, "small_block_n": 64, "small_block_k": 256,
     "small_warps": 4, "small_stages": 3,
     "block_m": 128, "block_n": 64, "down_block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
]  # fmt: skip
# Written for 64-wide waves (CDNA3, MFMA), not yet measured on a device: the stream pipeliner wants
# num_stages 2, the 64 KB of LDS caps the tiles (every unit below compiles to <= 48 KB on gfx942),
# waves_per_eu caps occupancy.
_WAVE64_CONFIGS = [
    {"gemv_max_slots": 4, "gemv_block_f": 16, "gemv_block_d": 4, "gemv_block_k": 1024, "gemv_warps": 4,
     "small_max_rows": 16, "small_block_m": 16, "small_block_n": 64, "small_block_k": 128,
     "small_warps": 4, "small_stages": 2,
     "block_m": 128, "block_n": 64, "down_block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2,
     "waves_per_eu": 0},
    {"gemv_max_slots": 0, "gemv_block_f": 16, "gemv_block_d": 8, "gemv_block_k": 512, "gemv_warps": 4,
     "small_max_rows": 0, "small_block_m": 16, "small_block_n": 64, "small_block_k": 128,
     "small_warps": 4, "small_stages": 2,
     "block_m": 64, "block_n": 128, "down_block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 2,
     "waves_per_eu": 2},
    {"gemv_max_slots": 0, "gemv_block_f": 8, "gemv_block_d": 8, "gemv_block_k": 512, "gemv_warps": 4,
     "small_max_rows": 64, "small_block_m": 32, "small_block_n": 64, "small_block_k": 64,
     "small_warps": 4, "small_stages": 2,
     "block_m": 128, "block_n": 128, "down_block_n": 128, "block_k": 32, "num_warps": 8, "num_stages": 2,
     "waves_per_eu": 0},
    {"gemv_max_slots": 32, "gemv_block_f": 32, "gemv_block_d": 16, "gemv_block_k": 256, "gemv_warps": 4,
     "small_max_rows": 16, "small_block_m": 16, "small_block_n": 128, "small_block_k": 64,
     "small_warps": 4, "small_stages": 2,
     "block_m": 128, "block_n": 64, "down_block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2,
     "waves_per_eu": 0},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS
# Configs and launch options per chip, from its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")

_SUM_BLOCK_D = 512
_CLAMP_BLOCK_N = 64  # swiglu_clamp: the gate/up GEMM's N tile at most this
_WEIGHT_INPUT_DOWN_BLOCK_N = 128  # weight_input: the down GEMM's N tile at most this
_TRITON_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i32": "i32", "i64": "i64"}


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits)


# --- the expert's activation --------------------------------------------------------------------------


@triton.jit
def _act(g, u, CLAMP: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    """act(gate, up) in f32 (reference.expert_activation): silu(g) * u, or gpt-oss's clamped
    (clip(u, -LIMIT, LIMIT) + 1) * g' * sigmoid(ALPHA g') with g' = min(g, LIMIT)."""
    if CLAMP:
        g = tl.minimum(g, LIMIT)
        u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
        return (u + 1.0) * g * (1.0 / (1.0 + tl.exp(-(ALPHA * g))))
    return g / (1.0 + tl.exp(-g)) * u


# --- decode: GEMV per slot -------------------------------------------------------------------------


@triton.jit
def _gate_up_gemv(
    x_ptr,  # [T, D]
    idx_ptr,  # [S] expert of each slot (S = T * K)
    wg_ptr,  # [E, F, D]
    wu_ptr,  # [E, F, D]
    act_ptr,  # [S, F] f32: act(gate x, up x)
    bg_ptr,  # [E, F] b_gate (HAS_BIAS), else None
    bu_ptr,  # [E, F] b_up (HAS_BIAS), else None
    rw_ptr,  # [S] routing weights (WEIGHT_INPUT: they scale x), else None
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WEIGHT_INPUT: tl.constexpr,
    CLAMP: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
):
    slot = tl.program_id(0)
    token = slot // K
    expert = tl.load(idx_ptr + slot).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)  # [BLOCK_F]
    f_ok = offs_f < F
    rows = expert * F * D + offs_f[:, None].to(tl.int64) * D  # [BLOCK_F, 1]
    acc_g = tl.zeros([BLOCK_F, BLOCK_D], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_F, BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)  # [BLOCK_D]
        d_ok = offs_d < D
        xv = tl.load(x_ptr + token.to(tl.int64) * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        m = f_ok[:, None] & d_ok[None, :]
        wg = tl.load(wg_ptr + rows + offs_d[None, :], mask=m, other=0.0)
        wu = tl.load(wu_ptr + rows + offs_d[None, :], mask=m, other=0.0)
        acc_g += wg.to(tl.float32) * xv[None, :]
        acc_u += wu.to(tl.float32) * xv[None, :]
    g = tl.sum(acc_g, axis=1)  # [BLOCK_F]
    u = tl.sum(acc_u, axis=1)
    if WEIGHT_INPUT:  # (w x) W^T = w (x W^T): the weight applied to the f32 sums
        weight = tl.load(rw_ptr + slot).to(tl.float32)
        g, u = g * weight, u * weight
    if HAS_BIAS:
        g += tl.load(bg_ptr + expert * F + offs_f, mask=f_ok, other=0.0).to(tl.float32)
        u += tl.load(bu_ptr + expert * F + offs_f, mask=f_ok, other=0.0).to(tl.float32)
    h = _act(g, u, CLAMP, ALPHA, LIMIT)
    tl.store(act_ptr + slot.to(tl.int64) * F + offs_f, h, mask=f_ok)


@triton.jit
def _down_gemv(
    act_ptr,  # [S, F] f32
    rw_ptr,  # [S] routing weights (None with WEIGHT_INPUT: the gate/up kernel took them)
    idx_ptr,  # [S]
    wd_ptr,  # [E, D, F]
    out_ptr,  # [T, D]
    bd_ptr,  # [E, D] b_down (HAS_BIAS), else None
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WEIGHT_INPUT: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_ok = offs_d < D
    out = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(K):  # the token's k slots, summed here in a fixed order: no atomics
        slot = token * K + j
        expert = tl.load(idx_ptr + slot).to(tl.int64)
        if not WEIGHT_INPUT:
            weight = tl.load(rw_ptr + slot).to(tl.float32)
        rows = expert * D * F + offs_d[:, None].to(tl.int64) * F  # [BLOCK_D, 1]
        acc = tl.zeros([BLOCK_D, BLOCK_F], dtype=tl.float32)
        for f0 in range(0, F, BLOCK_F):
            offs_f = f0 + tl.arange(0, BLOCK_F)
            f_ok = offs_f < F
            a = tl.load(act_ptr + slot * F + offs_f, mask=f_ok, other=0.0)
            w = tl.load(wd_ptr + rows + offs_f[None, :], mask=d_ok[:, None] & f_ok[None, :], other=0.0)
            acc += w.to(tl.float32) * a[None, :]
        y = tl.sum(acc, axis=1)  # [BLOCK_D]
        if HAS_BIAS:
            y += tl.load(bd_ptr + expert * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        if WEIGHT_INPUT:
            out += y
        else:
            out += weight * y
    tl.store(out_ptr + token * D + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


# --- prefill: grouped GEMM over expert-sorted slots ------------------------------------------------


@triton.jit
def _gate_up_grouped(
    x_ptr,  # [T, D]
    wg_ptr,  # [E, F, D]
    wu_ptr,  # [E, F, D]
    act_ptr,  # [S, F] rows in expert-sorted order: f32, or the high half in the weights' 16-bit type
    act_lo_ptr,  # [S, F] the low half (16-bit weights only; else unused)
    order_ptr,  # [S] i32: the slot at each sorted position
    tiles_ptr,  # [3, n_tiles] i32: expert, first and end sorted position of each M tile
    bg_ptr,  # [E, F] b_gate (HAS_BIAS), else None
    bu_ptr,  # [E, F] b_up (HAS_BIAS), else None
    rw_ptr,  # [S] routing weights by slot (WEIGHT_INPUT), else None
    n_tiles,
    D: tl.constexpr,
    F: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WEIGHT_INPUT: tl.constexpr,
    CLAMP: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
):
    tile = tl.program_id(0)
    row0 = tl.load(tiles_ptr + n_tiles + tile)
    row1 = tl.load(tiles_ptr + 2 * n_tiles + tile)
    if row0 >= row1:  # a spare tile of the fixed-size grid
        return
    expert = tl.load(tiles_ptr + tile).to(tl.int64)
    offs_m = row0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] sorted positions
    m_ok = offs_m < row1
    slot = tl.load(order_ptr + offs_m, mask=m_ok, other=0)  # [BLOCK_M]
    token = (slot // K).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] rows of F
    n_ok = offs_n < F
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + token[:, None] * D + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    b_off = expert * F * D + offs_n[None, :].to(tl.int64) * D + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if HAS_BIAS and not WEIGHT_INPUT:
        # the biases start the accumulators: no bias registers held through the loop or the epilogue
        acc_g += tl.load(bg_ptr + expert * F + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bu_ptr + expert * F + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    for k0 in range(0, D, BLOCK_K):
        k_ok = offs_k + k0 < D
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b_mask = k_ok[:, None] & n_ok[None, :]
        bg = tl.load(wg_ptr + b_off, mask=b_mask, other=0.0)
        bu = tl.load(wu_ptr + b_off, mask=b_mask, other=0.0)
        if _DOT_IN_F32:
            a, bg, bu = a.to(tl.float32), bg.to(tl.float32), bu.to(tl.float32)
        acc_g = tl.dot(a, bg, acc_g, input_precision="ieee")
        acc_u = tl.dot(a, bu, acc_u, input_precision="ieee")
        a_ptrs += BLOCK_K
        b_off += BLOCK_K
    if WEIGHT_INPUT:  # (w x) W^T = w (x W^T): the weight applied to the f32 accumulators
        weight = tl.load(rw_ptr + slot, mask=m_ok, other=0.0).to(tl.float32)[:, None]  # [BLOCK_M, 1]
        acc_g, acc_u = acc_g * weight, acc_u * weight
    if HAS_BIAS and WEIGHT_INPUT:  # the weight scales x, not the bias: added after it
        acc_g += tl.load(bg_ptr + expert * F + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bu_ptr + expert * F + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    h = _act(acc_g, acc_u, CLAMP, ALPHA, LIMIT)  # [BLOCK_M, BLOCK_N] f32
    out = offs_m[:, None].to(tl.int64) * F + offs_n[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if act_ptr.dtype.element_ty != tl.float32:
        # h = hi + lo in the weights' 16-bit type: the down GEMM's two tensor-core dots then see
        # ~16 more bits of act than one rounding would keep (the reference keeps act in f32)
        hi = h.to(act_ptr.dtype.element_ty)
        tl.store(act_ptr + out, hi, mask=mask)
        tl.store(act_lo_ptr + out, (h - hi.to(tl.float32)).to(act_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(act_ptr + out, h, mask=mask)


@triton.jit
def _down_grouped(
    act_ptr,  # [S, F] expert-sorted rows: f32, or the high half in the weights' 16-bit type
    act_lo_ptr,  # [S, F] the low half (16-bit weights only)
    wd_ptr,  # [E, D, F]
    rw_ptr,  # [S] routing weights, by slot (None with WEIGHT_INPUT: the gate/up GEMM took them)
    order_ptr,  # [S] i32
    tiles_ptr,  # [3, n_tiles] i32
    y_ptr,  # [S, D] f32 by slot (or the [T, D] output itself when k = 1)
    bd_ptr,  # [E, D] b_down (HAS_BIAS), else None
    n_tiles,
    D: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WEIGHT_INPUT: tl.constexpr,
):
    tile = tl.program_id(0)
    row0 = tl.load(tiles_ptr + n_tiles + tile)
    row1 = tl.load(tiles_ptr + 2 * n_tiles + tile)
    if row0 >= row1:
        return
    expert = tl.load(tiles_ptr + tile).to(tl.int64)
    offs_m = row0 + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    m_ok = offs_m < row1
    slot = tl.load(order_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] rows of D
    n_ok = offs_n < D
    offs_k = tl.arange(0, BLOCK_K)
    a_off = offs_m[:, None].to(tl.int64) * F + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    b_off = expert * D * F + offs_n[None, :].to(tl.int64) * F + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if HAS_BIAS:  # the bias starts the accumulator (the routing weight multiplies both, after)
        acc += tl.load(bd_ptr + expert * D + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    for k0 in range(0, F, BLOCK_K):
        k_ok = offs_k + k0 < F
        a_mask = m_ok[:, None] & k_ok[None, :]
        b = tl.load(wd_ptr + b_off, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        a = tl.load(act_ptr + a_off, mask=a_mask, other=0.0)
        if _DOT_IN_F32:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        if act_ptr.dtype.element_ty != tl.float32:
            lo = tl.load(act_lo_ptr + a_off, mask=a_mask, other=0.0)
            if _DOT_IN_F32:
                lo = lo.to(tl.float32)
            acc = tl.dot(lo, b, acc, input_precision="ieee")
        a_off += BLOCK_K
        b_off += BLOCK_K
    if not WEIGHT_INPUT:
        acc *= tl.load(rw_ptr + slot, mask=m_ok, other=0.0).to(tl.float32)[:, None]
    out = y_ptr + slot[:, None] * D + offs_n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_slots(
    y_ptr,  # [T * K, D] f32
    out_ptr,  # [T, D]
    D: tl.constexpr,
    K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(K):
        acc += tl.load(y_ptr + (token * K + j) * D + offs_d, mask=d_ok, other=0.0)
    tl.store(out_ptr + token * D + offs_d, acc.to(out_ptr.dtype.element_ty), mask=d_ok)


# Triton's interpreter (3.9) multiplies bf16 operands of tl.dot as their raw uint16 storage; under it
# the grouped GEMMs widen to f32 first, which is exact (an f32 product of bf16 values, f32 accumulate).
# Compiled kernels keep the 16-bit operands for the tensor cores.
_DOT_IN_F32 = tl.constexpr(not isinstance(_gate_up_grouped, triton.runtime.JITFunction))


def _route_tiles(ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sort slots by expert and cut each expert's run into BLOCK_M tiles, on the device, without a
    host sync: every buffer's size depends only on S, E and BLOCK_M, so a CUDA graph can capture it.

    ids: [S] expert of each slot. Returns order [S] i32 (the slot at each sorted position), tiles
    [3, n_tiles] i32 (per tile: expert, first sorted position, end sorted position; spare tiles are
    empty) and n_tiles = ceil(S / BLOCK_M) + min(E, S), an upper bound on the tiles needed."""
    slots = ids.numel()
    sorted_ids, order = torch.sort(ids, stable=True)  # [S]: ties keep slot order (deterministic)
    expert_ids = torch.arange(experts, device=ids.device, dtype=ids.dtype)
    starts = torch.searchsorted(sorted_ids, expert_ids)  # [E] first sorted position of each expert
    ends = torch.searchsorted(sorted_ids, expert_ids, right=True)  # [E]
    per_expert = (ends - starts + block_m - 1) // block_m  # [E] tiles of each expert
    tile_end = torch.cumsum(per_expert, 0)  # [E]
    n_tiles = triton.cdiv(slots, block_m) + min(experts, slots)
    tile = torch.arange(n_tiles, device=ids.device)  # [n_tiles]
    owner = torch.searchsorted(tile_end, tile, right=True).clamp_(max=experts - 1)  # [n_tiles]
    row0 = starts[owner] + (tile - (tile_end - per_expert)[owner]) * block_m
    row1 = torch.where(tile < tile_end[-1], ends[owner], row0)
    tiles = torch.stack([owner, row0, row1]).to(torch.int32)  # [3, n_tiles]
    return order.to(torch.int32), tiles, n_tiles


# --- the contract ----------------------------------------------------------------------------------


def _shapes(spec: Any) -> dict[str, Any]:
    x, rw, idx, wg, wu, wd = (spec.types[v] for v in spec.single.inputs[:6])
    experts, ffn, dim = wg.shape
    lead = x.shape[:-1]
    tokens = math.prod(lead) if all(isinstance(d, int) for d in lead) else None
    attrs = spec.attrs()
    biases = [str(spec.types[v].dtype) for v in spec.single.inputs[6:]]  # b_gate, b_up, b_down
    return {
        "x": str(x.dtype), "rw": str(rw.dtype), "idx": str(idx.dtype), "w": str(wg.dtype),
        "b": biases[0] if biases else None, "biases": biases,
        "E": experts, "F": ffn, "D": dim, "K": rw.shape[-1], "T": tokens,
        "HAS_BIAS": bool(biases), "WEIGHT_INPUT": attrs["weight_input"] is True,
        "CLAMP": attrs["activation"] == "swiglu_clamp",
        "ALPHA": float(attrs["alpha"]), "LIMIT": float(attrs["limit"]),
    }  # fmt: skip


def supports(spec: Any) -> bool:
    if len(spec.nodes) != 1 or spec.single.op != "moe_ffn" or not spec.target.is_gpu:
        return False
    node = spec.single
    if len(node.inputs) not in (6, 9) or len(node.outputs) != 1:
        return False
    attrs = spec.attrs()
    if attrs["activation"] not in ("silu", "swiglu_clamp") or attrs["weight_input"] not in (False, True):
        return False
    if attrs["activation"] == "swiglu_clamp" and not all(
        isinstance(attrs[a], int | float) and math.isfinite(attrs[a]) for a in ("alpha", "limit")
    ):
        return False
    s = _shapes(spec)
    types = [spec.types[v] for v in node.inputs]
    return (
        s["x"] in ("f32", "bf16", "f16")
        and all(str(t.dtype) == s["x"] for t in (types[3], types[4], types[5]))
        and s["rw"] in ("f32", "bf16", "f16")
        and s["idx"] in ("i32", "i64")
        and all(b in ("f32", "bf16", "f16") for b in s["biases"])
        and all(isinstance(s[d], int) for d in ("E", "F", "D", "K"))
        and str(spec.types[node.outputs[0]].dtype) == s["x"]
    )


def _path(config: dict[str, Any], slots: int, experts: int) -> str:
    """gemv for few slots; grouped GEMM with the small tile while the average expert has at most
    small_max_rows rows; grouped GEMM with the large tile beyond."""
    if slots <= config["gemv_max_slots"]:
        return "gemv"
    return "small" if slots <= config["small_max_rows"] * experts else "large"


def _tile(config: dict[str, Any], path: str) -> dict[str, int]:
    """The grouped GEMM tile of a path: the small one shares its N tile between gate/up and down."""
    if path == "small":
        n = config["small_block_n"]
        return {"block_m": config["small_block_m"], "block_n": n, "down_block_n": n,
                "block_k": config["small_block_k"], "num_warps": config["small_warps"],
                "num_stages": config["small_stages"]}  # fmt: skip
    keys = ("block_m", "block_n", "down_block_n", "block_k", "num_warps", "num_stages")
    return {key: config[key] for key in keys}


def _options(config: dict[str, Any], traits: Any, path: str) -> dict[str, Any]:
    if path == "gemv":
        options = {"num_warps": config["gemv_warps"], "num_stages": 1}
    else:
        tile = _tile(config, path)
        options = {"num_warps": tile["num_warps"], "num_stages": tile["num_stages"]}
    return {**options, **_t.extra_options(config, traits)}


def _sum_options(traits: Any) -> dict[str, Any]:
    return {"num_warps": 4, "num_stages": 1, **_t.extra_options(_t.LAUNCH_DEFAULTS, traits)}


# The pointer arguments each kernel takes only for a feature: None (a constexpr) without it, so a
# kernel without biases or weight_input compiles as if they were not there.
def _absent(s: dict[str, Any], fn: Any) -> dict[str, None]:
    """The optional pointers `fn` is launched with as None for the features of `s`."""
    absent: list[str] = []
    if not s["HAS_BIAS"]:
        absent += {_gate_up_gemv: ["bg_ptr", "bu_ptr"], _gate_up_grouped: ["bg_ptr", "bu_ptr"],
                   _down_gemv: ["bd_ptr"], _down_grouped: ["bd_ptr"]}.get(fn, [])  # fmt: skip
    if fn in (_gate_up_gemv, _gate_up_grouped) and not s["WEIGHT_INPUT"]:
        absent.append("rw_ptr")
    if fn in (_down_gemv, _down_grouped) and s["WEIGHT_INPUT"]:
        absent.append("rw_ptr")
    return dict.fromkeys(absent)


def _kernels(s: dict[str, Any], config: dict[str, Any], path: str) -> list[tuple[Any, dict[str, Any]]]:
    """The kernels one path launches, in order, with their constexprs (the absent pointers too)."""
    d, f, k = s["D"], s["F"], s["K"]
    act = {"HAS_BIAS": s["HAS_BIAS"], "WEIGHT_INPUT": s["WEIGHT_INPUT"], "CLAMP": s["CLAMP"],
           "ALPHA": s["ALPHA"], "LIMIT": s["LIMIT"]}  # fmt: skip
    down = {"HAS_BIAS": s["HAS_BIAS"], "WEIGHT_INPUT": s["WEIGHT_INPUT"]}
    if path == "gemv":
        red = config["gemv_block_k"]
        units = [
            (
                _gate_up_gemv,
                {"D": d, "F": f, "K": k, "BLOCK_F": config["gemv_block_f"], "BLOCK_D": red, **act},
            ),
            (_down_gemv, {"D": d, "F": f, "K": k, "BLOCK_D": config["gemv_block_d"], "BLOCK_F": red, **down}),
        ]
        return [(fn, {**_absent(s, fn), **consts}) for fn, consts in units]
    t = _tile(config, path)
    # The features' epilogues hold more live registers next to the accumulators: where the default
    # tiles' kernels then spilled (ptxas, sm_90 and sm_100), their N tiles are capped (not timed).
    if s["CLAMP"]:
        t["block_n"] = min(t["block_n"], _CLAMP_BLOCK_N)
    if s["WEIGHT_INPUT"]:
        t["down_block_n"] = min(t["down_block_n"], _WEIGHT_INPUT_DOWN_BLOCK_N)
    # 4-byte operands: half the K step keeps each pipeline stage's shared memory at the 16-bit size
    m, kk = t["block_m"], max(16, t["block_k"] // (2 if s["w"] == "f32" else 1))
    units = [
        (_gate_up_grouped,
         {"D": d, "F": f, "K": k, "BLOCK_M": m, "BLOCK_N": t["block_n"], "BLOCK_K": kk, **act}),
        (_down_grouped, {"D": d, "F": f, "BLOCK_M": m, "BLOCK_N": t["down_block_n"], "BLOCK_K": kk, **down}),
    ]  # fmt: skip
    units = [(fn, {**_absent(s, fn), **consts}) for fn, consts in units]
    if k > 1:
        units.append((_sum_slots, {"D": d, "K": k, "BLOCK_D": _SUM_BLOCK_D}))
    return units


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    args = spec.args(spec.single)
    s = _shapes(spec)
    experts, ffn, dim, k = s["E"], s["F"], s["D"], s["K"]
    kernels = {path: _kernels(s, config, path) for path in ("gemv", "small", "large")}
    options = {path: _options(config, traits, path) for path in ("gemv", "small", "large")}
    tiles = {path: _tile(config, path) for path in ("small", "large")}
    sum_options = _sum_options(traits)
    gemv_f, gemv_d = config["gemv_block_f"], config["gemv_block_d"]
    split_act = s["w"] != "f32"  # 16-bit weights: act as hi + lo halves of their type
    act_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[s["w"]]

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        # Scratch (act, per-slot rows, routing tables) is allocated here from torch's caching
        # allocator, which a CUDA graph capture serves from its private pool.
        x, rw, idx, wg, wu, wd, *biases = (inputs[i].contiguous() for i in args)
        bg, bu, bd = biases or (None, None, None)  # [E, F], [E, F], [E, D]
        (result,) = outputs
        tokens = x.numel() // dim
        slots = tokens * k
        xt = x.view(tokens, dim)  # [T, D]
        out = (
            result
            if result.is_contiguous()
            else torch.empty_like(result, memory_format=torch.contiguous_format)
        )
        if slots == 0:
            return
        rw, idx = rw.view(slots), idx.view(slots)  # [S]
        path = _path(config, slots, experts)
        opts = options[path]
        if path == "gemv":
            (gate_up, gu_consts), (down, dn_consts) = kernels[path]
            act = torch.empty((slots, ffn), device=x.device, dtype=torch.float32)  # [S, F]
            gate_up[(slots, triton.cdiv(ffn, gemv_f))](
                xt, idx, wg, wu, act, **{"bg_ptr": bg, "bu_ptr": bu, "rw_ptr": rw, **gu_consts}, **opts
            )
            down[(tokens, triton.cdiv(dim, gemv_d))](
                act, **{"rw_ptr": rw, "idx_ptr": idx, "wd_ptr": wd, "out_ptr": out, "bd_ptr": bd, **dn_consts},
                **opts,
            )  # fmt: skip
        else:
            tile = tiles[path]
            order, route, n_tiles = _route_tiles(idx, experts, tile["block_m"])
            (gate_up, gu_consts), (down, dn_consts) = kernels[path][:2]
            act = torch.empty((1 + split_act, slots, ffn), device=x.device, dtype=act_dtype)  # [hi/lo, S, F]
            act_hi, act_lo = act[0], act[-1]  # sorted rows
            gate_up[(n_tiles, triton.cdiv(ffn, gu_consts["BLOCK_N"]))](
                xt, wg, wu, act_hi, act_lo, order, route, n_tiles=n_tiles,
                **{"bg_ptr": bg, "bu_ptr": bu, "rw_ptr": rw, **gu_consts}, **opts,
            )  # fmt: skip
            y = out if k == 1 else torch.empty((slots, dim), device=x.device, dtype=torch.float32)  # [S, D]
            down[(n_tiles, triton.cdiv(dim, dn_consts["BLOCK_N"]))](
                act_hi, act_lo, wd, order_ptr=order, tiles_ptr=route, y_ptr=y, n_tiles=n_tiles,
                **{"rw_ptr": rw, "bd_ptr": bd, **dn_consts}, **opts,
            )  # fmt: skip
            if k > 1:
                sum_slots, sum_consts = kernels[path][2]
                sum_slots[(tokens, triton.cdiv(dim, _SUM_BLOCK_D))](y, out, **sum_consts, **sum_options)
        if out is not result:
            result.copy_(out)

    return launch


# Torch ops `_route_tiles` dispatches (each a small kernel on the device), counted under a dispatch
# counter (tests/kernels/triton/test_moe.py checks the count).
ROUTE_OPS = 25


def launches(spec: Any, config: dict[str, Any], traits: Any) -> int:
    """Kernels one call launches at the spec's token count: the path's Triton kernels, plus the routing
    ops on the grouped paths (the cost model charges each a launch)."""
    s = _shapes(spec)
    if s["T"] is None:
        return len(compile_units(spec, config, traits))
    path = _path(config, s["T"] * s["K"], s["E"])
    return len(_kernels(s, config, path)) + (0 if path == "gemv" else ROUTE_OPS)


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    """The kernels the launch runs for the spec's token count (every path the config can take when
    T is symbolic: no kernel takes T as a constexpr, so the same units serve every T on a path)."""
    from polymorph.pipeline.kernel_files import CompileUnit

    s = _shapes(spec)
    ptr = {name: "*" + _TRITON_DTYPE[s[name]] for name in ("x", "rw", "idx", "w")}
    y = "*fp32" if s["K"] > 1 else ptr["x"]
    pointer_types = {
        "x_ptr": ptr["x"], "idx_ptr": ptr["idx"], "wg_ptr": ptr["w"], "wu_ptr": ptr["w"],
        "wd_ptr": ptr["w"], "rw_ptr": ptr["rw"], "out_ptr": ptr["x"], "order_ptr": "*i32",
        "tiles_ptr": "*i32", "n_tiles": "i32",
    }  # fmt: skip
    for name, dtype in zip(("bg_ptr", "bu_ptr", "bd_ptr"), s["biases"], strict=False):
        pointer_types[name] = "*" + _TRITON_DTYPE[dtype]
    if s["T"] is None:  # every path this config can take
        paths = [p for p, on in (("gemv", config["gemv_max_slots"] > 0), ("small", config["small_max_rows"] > 0),
                                 ("large", True)) if on]  # fmt: skip
    else:
        paths = [_path(config, s["T"] * s["K"], s["E"])]
    units = []
    for path in paths:
        for fn, consts in _kernels(s, config, path):
            types = dict(pointer_types)
            types["act_ptr"] = types["act_lo_ptr"] = "*fp32" if path == "gemv" else ptr["w"]
            types["y_ptr"] = "*fp32" if fn is _sum_slots else y
            signature = {name: "constexpr" if name in consts else types[name] for name in fn.arg_names}
            options = _sum_options(traits) if fn is _sum_slots else _options(config, traits, path)
            name = fn.__name__.lstrip("_") + ("" if path == "gemv" else f"_{path}")
            units.append(CompileUnit(name, fn, signature, consts, options))
    return units
