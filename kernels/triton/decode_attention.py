"""Decode attention over the paged KV cache: flash-decoding, split over the context.

cache_attention for S <= 4 new tokens per sequence (decode, or a few speculative tokens), each query row
independent: token (b, s) attends to logical positions 0..positions[b, s] of sequence b, whose cache
blocks are block_table[b, :] (shuffled, shared or not: only the table says where a block lives).

The kernels:
  split   grid (batch, kv_heads, splits). A program holds every query row of one kv head group (the
          S x H/Hkv rows that share it, padded to a tl.dot tile), so K and V are read once per group,
          and walks its share of the sequence's logical tokens BLOCK_N at a time, gathering each
          token's cache row through block_table. Online softmax in fp32 (exp2, scale folded with
          log2 e); writes the unnormalised partial (acc, max, sumexp) per split. A split past the end
          of its sequence (ragged contexts: length = max_s positions[b, s] + 1) exits at once.
  reduce  grid (batch * S * H,): merges a row's valid splits and writes q.dtype output.
  one     S = 1 (plain decode) takes `_decode_one_kernel` in place of split, grid (kv_heads, splits,
          batch): the same partials, but a static tile loop (SPLIT_TOKENS / BLOCK_N tiles), so a
          split's table and cache loads are addressed from static bounds and issued with the position
          load rather than after it (only their masks wait on it), and a split is one tile where it
          fits (`_one_plan`: the tile the power of two at or above the tokens a split takes, up to
          `one_block_n`; on an H200 at batch 1, 16 splits of 64 tokens at 1k and 32 of 256 at 8k).
With a single split the split (or one) kernel writes the output itself and there is no reduce launch.
Where the target takes programmatic dependent launch (_pdl.py) every kernel here waits for its
predecessor (griddepcontrol.wait) in every program before any read, then lets its dependents launch,
and is launched with launch_pdl; under the interpreter, or on a target without it, neither.

Splits are chosen at build/launch from ctx_blocks (the table's width, the longest context the step may
have) so that batch x kv_heads x splits is about `ctas_per_cu` programs per SM/CU of the target,
never shorter than `min_split_tokens` tokens, BLOCK_N lowered to a split shorter than the config's:
see `_split_plan` (and `occupancy` for what it gives at a shape).

Every shape is a constexpr (the spec is concrete per traffic bucket) and the tensors are contiguous, so
the only launch-time specialization Triton adds is the 16-byte alignment of the pointers.

Constraints (supports): cuda or rocm; one cache_attention node; q and both caches of one float dtype
(f32, bf16, f16); sinks (where given) [H] of a float dtype; block table and positions i32 or i64; 1 <= S <= MAX_SEQ (4) query tokens per
sequence; concrete heads, kv heads and block size; head dim a power of two in [16, 256].

Config keys: block_n (cache tokens per step of a split), one_block_n (the largest tile of the one-token
kernel, block_n where absent), min_split_tokens (the shortest split; the smallest one-token tile),
ctas_per_cu (programs aimed at per SM/CU when choosing splits), num_warps, num_stages, `one_kernel`
(default on: S = 1 takes the one-token kernel; off: the split kernel, as at S > 1); the arch's launch
options (waves_per_eu) where it takes them.

Sliding window and soft-capping (the op's `window` and `softcap` attrs; 0: none). Under a window the
query at p sees p - window < t <= p, and the splits start at the cache block holding the earliest
row's first visible key, so no block wholly outside the window is read; at S = 1 they are sized for
window + BS - 1 tokens instead of the table (`_span`), so a long context with a short window launches
only the programs its window needs. Slots before the window within its first block are masked out of
the loads too. Softcap: scores = softcap * tanh(q.k * scale / softcap) after the scale and before the
mask, tanh from exp2 (no overflow, on every backend).

Chunked attention (the `chunk` attr; 0: none; Llama 4): the query at p sees p // chunk * chunk <= t <= p,
handled as a window whose first key is its chunk's first: the splits start at the block holding the
earliest row's chunk start, and at S = 1 they are sized for chunk + BS - 1 tokens (`_span`). Sinks (the
optional sixth input, [H]; gpt-oss): split 0 starts each row's running max at its head's sink (log2
domain) and its sum of exp2 at 1, so the sink joins the softmax once however many splits there are
(split 0 always holds a key of every row, and the reduce merges partials as before). Both are
constexpr features (CHUNK, SINKS): without them the kernels compile as before (the sinks pointer is
then q, never read).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "cache_attention"

MAX_SEQ = 4  # query tokens per sequence handled here; prefill_attention.py takes S > 4

# block_n: the most tokens per loop iteration (a power of two; a tile may span cache blocks or part of
# one), lowered for a split shorter than that; min_split_tokens: the least work a split is given;
# ctas_per_cu: programs per SM/CU to aim for (2: enough loads in flight per SM to stream HBM at
# decode's tiny arithmetic intensity; more where batch x kv_heads alone leaves SMs idle). one_block_n:
# the largest tile of the one-token path (S = 1; block_n where absent). The first config is the
# `attn-c8-t128` variant of bench/h200_variants.py: on an H200 (2026-12-02, Triton 3.6, Llama-3.2-1B,
# bf16, whole decode steps) it took batch 32 at 8k from 0.99x to 1.05x torch.compile and batch 64 at
# 1k from 1.13x to 1.18x, equal at batch 1 and 8 at 1k, 0.8% slower at batch 1 at 8k (one run each,
# BENCHMARKS.md). The second is the default before it (ctas_per_cu 2, one_block_n 256).
_WARP32_CONFIGS = [
    {"block_n": 128, "one_block_n": 128, "min_split_tokens": 64, "ctas_per_cu": 8, "num_warps": 4, "num_stages": 2},
    {"block_n": 128, "one_block_n": 256, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 2},
    {"block_n": 128, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 3},
    {"block_n": 64, "min_split_tokens": 128, "ctas_per_cu": 4, "num_warps": 4, "num_stages": 2},
    {"block_n": 256, "min_split_tokens": 256, "ctas_per_cu": 2, "num_warps": 8, "num_stages": 2},
    {"block_n": 32, "min_split_tokens": 32, "ctas_per_cu": 4, "num_warps": 4, "num_stages": 3},
]  # fmt: skip
# Written for 64-wide waves (CDNA; not measured): 4 warps are 256 lanes; waves_per_eu trades VGPRs
# for occupancy.
_WAVE64_CONFIGS = [
    {"block_n": 64, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2},
    {"block_n": 32, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 2, "waves_per_eu": 4},
    {"block_n": 128, "min_split_tokens": 256, "ctas_per_cu": 1, "num_warps": 8, "num_stages": 1, "waves_per_eu": 1},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS

_TRITON_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i32": "i32", "i64": "i64"}
_FLOATS = ("f32", "bf16", "f16")
_LOG2E = 1.4426950408889634


# Triton's interpreter multiplies bfloat16 bit patterns in tl.dot (triton-lang/triton#11584, not
# supported upstream): there, and only there, the dots run on operands upcast to fp32 (exact: bf16
# products fit fp32). Read when the module is loaded, as Triton reads it when the kernels are decorated.
# The dots are written out in the kernels, not in a helper: each @jit call costs the interpreter ~5 ms.
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_UPCAST_DOT = _i.INTERPRETED
# Configs and launch options per chip, from its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
# Programmatic dependent launch where the arch and the installed Triton take it (see _pdl.py).
_g = depend("triton/_pdl.py", "7809e3ede67d44565604f0e698b9a8bf3482361de988ea8e9015fe96a0627986")


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits)


# A power of two >= MAX_SEQ: the reduce loads one sequence's positions (a constexpr for @jit code).
_SEQ_P2 = tl.constexpr(4)


@triton.jit
def _window_base(pos, WINDOW: tl.constexpr, BS: tl.constexpr):
    """The first token of the cache block holding position pos's first visible key under a window
    (callers without a window start at 0 and never call this, so their loads wait on no position)."""
    return (tl.maximum(pos - WINDOW + 1, 0) // BS) * BS


@triton.jit
def _first_key(pos, WINDOW: tl.constexpr, CHUNK: tl.constexpr):
    """The first key position pos sees under a window or a chunk (one of them is set)."""
    if WINDOW > 0:
        return tl.maximum(pos - WINDOW + 1, 0)
    return pos // CHUNK * CHUNK


@triton.jit
def _softcap(qk, CAP_IN: tl.constexpr, CAP_OUT: tl.constexpr):
    """CAP_OUT * tanh(qk * CAP_IN) as CAP_OUT - 2 CAP_OUT / (exp(2 qk CAP_IN) + 1): exp2 on every backend,
    +-CAP_OUT where exp2 over- or underflows, an absolute error near 0 of a few f32 ulps of CAP_OUT,
    and few live values (the one-token tile spilled on sm_100 with a longer form)."""
    return CAP_OUT - (2.0 * CAP_OUT) / (tl.exp2(qk * (2.8853900817779268 * CAP_IN)) + 1.0)


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [B, S, H, D]
    k_ptr,  # [cache_blocks, BS, HKV, D]
    v_ptr,  # [cache_blocks, BS, HKV, D]
    table_ptr,  # [B, CTX_BLOCKS] int
    pos_ptr,  # [B, S] int
    out_ptr,  # [B, S, H, D], written when NUM_SPLITS == 1
    part_acc_ptr,  # [B * S * H, NUM_SPLITS, D] f32 unnormalised sum p v, when NUM_SPLITS > 1
    part_m_ptr,  # [B * S * H, NUM_SPLITS] f32 running max (log2 domain)
    part_l_ptr,  # [B * S * H, NUM_SPLITS] f32 sum of exp2
    sinks_ptr,  # [H] float when SINKS, else unused
    SCALE: tl.constexpr,  # softmax scale * log2(e)
    S: tl.constexpr,
    H: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,  # S * H / HKV query rows, padded to a power of two >= 16
    IEEE: tl.constexpr,  # f32 inputs: full-precision dots, not tf32
    USE_GDC: tl.constexpr,  # launched with PDL: wait for the previous kernel before reading q or the cache
    WINDOW: tl.constexpr = 0,  # > 0: token p sees p - WINDOW < t <= p; splits start at the window's block
    SOFTCAP: tl.constexpr = 0.0,  # > 0: scores = SOFTCAP * tanh(q.k * scale / SOFTCAP)
    CAP_IN: tl.constexpr = 1.0,  # scale / SOFTCAP (raw q.k to tanh's argument)
    CHUNK: tl.constexpr = 0,  # > 0: token p sees p // CHUNK * CHUNK <= t <= p; splits start at its block
    SINKS: tl.constexpr = False,  # sinks_ptr holds one logit per query head (split 0 adds it)
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    sp = tl.program_id(2)
    if USE_GDC:  # every program, before any read or early exit (_pdl.py)
        _g.gdc_wait()
        _g.gdc_launch_dependents()
    REP = H // HKV

    r = tl.arange(0, ROWS)
    row_ok = r < S * REP
    s = r // REP  # [ROWS] query token of the row
    h = g * REP + r % REP  # [ROWS] query head of the row
    pos = tl.load(pos_ptr + b * S + s, mask=row_ok, other=-1).to(tl.int32)  # [ROWS]
    n_tok = tl.minimum(tl.max(pos, axis=0) + 1, CTX_BLOCKS * BS)  # tokens this group's rows may see
    # splits cover the blocks from the one holding the earliest row's first visible token (0 without
    # a window), so no block wholly before every row's window is read (_window_base)
    start = sp * SPLIT_TOKENS
    lo = 0  # no row sees a key before lo
    if WINDOW > 0 or CHUNK > 0:
        first = tl.min(tl.where(row_ok, pos, 2**30), axis=0)  # the earliest row's position
        lo = _first_key(first, WINDOW, CHUNK)
        start += lo // BS * BS
    if NUM_SPLITS > 1:  # noqa: SIM102 (a constexpr test apart from the runtime one)
        if start >= n_tok:  # past the end of this sequence: nothing to contribute
            return
    end = tl.minimum(start + SPLIT_TOKENS, n_tok)

    d = tl.arange(0, D)
    row = (b * S + s) * H + h  # [ROWS] index of (b, s, h)
    q = tl.load(q_ptr + row[:, None].to(tl.int64) * D + d[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    if SINKS:  # split 0 starts from the sink: exp2(sink - m) is then in l_i, once
        sink = tl.load(sinks_ptr + h, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        m_i = tl.where(sp == 0, sink, m_i)
        l_i = tl.where(sp == 0, 1.0, l_i)
    acc = tl.zeros([ROWS, D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + n  # [BLOCK_N] logical token
        t_ok = t < end
        if WINDOW > 0 or CHUNK > 0:  # a slot before every row's window (chunk) is never read (NaN)
            t_ok = t_ok & (t >= lo)
        blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS, mask=t_ok, other=0)
        kv = (blk.to(tl.int64) * BS + t % BS) * (HKV * D) + g * D  # [BLOCK_N] cache row offset
        k = tl.load(k_ptr + kv[:, None] + d[None, :], mask=t_ok[:, None], other=0.0)  # [BLOCK_N, D]
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")  # [ROWS, BLOCK_N] f32
        elif _UPCAST_DOT:
            qk = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32))
        else:
            qk = tl.dot(q, tl.trans(k))
        visible = t_ok[None, :] & (t[None, :] <= pos[:, None])  # [ROWS, BLOCK_N]
        if WINDOW > 0:
            visible = visible & (t[None, :] > pos[:, None] - WINDOW)
        if CHUNK > 0:
            visible = visible & (t[None, :] >= pos[:, None] // CHUNK * CHUNK)
        if SOFTCAP > 0:
            qk = _softcap(qk, CAP_IN, SOFTCAP * 1.4426950408889634)  # log2 domain, as SCALE is
        else:
            qk = qk * SCALE
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv[:, None] + d[None, :], mask=t_ok[:, None], other=0.0)  # [BLOCK_N, D]
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        elif _UPCAST_DOT:
            if v.dtype == tl.bfloat16:  # round p to nearest even, as compiled code does
                pb = p.to(tl.uint32, bitcast=True).to(tl.int64)  # (the interpreter truncates)
                p = (
                    (((pb + 0x7FFF + ((pb >> 16) & 1)) >> 16) << 16)
                    .to(tl.uint32)
                    .to(tl.float32, bitcast=True)
                )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + row[:, None].to(tl.int64) * D + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        part = row.to(tl.int64) * NUM_SPLITS + sp  # [ROWS]
        tl.store(part_acc_ptr + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)


@triton.jit
def _decode_one_kernel(
    q_ptr,  # [B, 1, H, D]
    k_ptr,  # [cache_blocks, BS, HKV, D]
    v_ptr,  # [cache_blocks, BS, HKV, D]
    table_ptr,  # [B, CTX_BLOCKS] int
    pos_ptr,  # [B, 1] int
    out_ptr,  # [B, 1, H, D], written when NUM_SPLITS == 1
    part_acc_ptr,  # [B * H, NUM_SPLITS, D] f32 unnormalised sum p v, when NUM_SPLITS > 1
    part_m_ptr,  # [B * H, NUM_SPLITS] f32 running max (log2 domain)
    part_l_ptr,  # [B * H, NUM_SPLITS] f32 sum of exp2
    sinks_ptr,  # [H] float when SINKS, else unused
    SCALE: tl.constexpr,  # softmax scale * log2(e)
    H: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,  # a whole number of BLOCK_N tiles
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,  # H / HKV query rows, padded to a power of two >= 16
    IEEE: tl.constexpr,  # f32 inputs: full-precision dots, not tf32
    USE_GDC: tl.constexpr,  # launched with PDL: wait for the previous kernel before reading q or the cache
    WINDOW: tl.constexpr = 0,  # > 0: the query at p sees p - WINDOW < t <= p; splits start at its block
    SOFTCAP: tl.constexpr = 0.0,  # > 0: scores = SOFTCAP * tanh(q.k * scale / SOFTCAP)
    CAP_IN: tl.constexpr = 1.0,  # scale / SOFTCAP
    CHUNK: tl.constexpr = 0,  # > 0: the query at p sees p // CHUNK * CHUNK <= t <= p; splits start there
    SINKS: tl.constexpr = False,  # sinks_ptr holds one logit per query head (split 0 adds it)
):
    """Split-K over the context for one query token per sequence: grid (kv_heads, splits, batch). The
    tile loop has a static trip count (SPLIT_TOKENS / BLOCK_N), so the table and cache loads of a split
    are addressed from its static bounds and issued with the position load, not after it; only their
    masks (tokens 0..pos) wait on it. A split wholly past its sequence's end exits after the wait."""
    g = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2)
    if USE_GDC:  # every program, before any read or early exit (_pdl.py)
        _g.gdc_wait()
        _g.gdc_launch_dependents()
    REP = H // HKV
    r = tl.arange(0, ROWS)
    row_ok = r < REP
    h = g * REP + tl.minimum(r, REP - 1)  # [ROWS] query head (padding rows repeat the last)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    pos = tl.load(pos_ptr + b).to(tl.int32)
    n_tok = tl.minimum(pos + 1, CTX_BLOCKS * BS)  # tokens this sequence's query sees
    start = sp * SPLIT_TOKENS
    if WINDOW > 0:  # from the window's first block
        start += _window_base(pos, WINDOW, BS)
    if CHUNK > 0:  # from the chunk's first block
        start += pos // CHUNK * CHUNK // BS * BS
    if NUM_SPLITS > 1:  # noqa: SIM102 (a constexpr test apart from the runtime one)
        if start >= n_tok:  # past the end of this sequence: the reduce reads no partial of it
            return
    row = b * H + h  # [ROWS]
    q = tl.load(q_ptr + row[:, None].to(tl.int64) * D + d[None, :])  # [ROWS, D]
    q = tl.where(row_ok[:, None], q, 0.0)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    if SINKS:  # split 0 starts from the sink: exp2(sink - m) is then in l_i, once
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_i = tl.where(sp == 0, sink, m_i)
        l_i = tl.where(sp == 0, 1.0, l_i)
    acc = tl.zeros([ROWS, D], tl.float32)
    for i in range(0, SPLIT_TOKENS, BLOCK_N):
        t = start + i + n  # [BLOCK_N] logical token
        in_table = t < CTX_BLOCKS * BS
        blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS, mask=in_table, other=0)
        seen = in_table & (t < n_tok)  # [BLOCK_N] a slot past the end is never read (it may hold NaN)
        if WINDOW > 0:  # nor one before the window (the split starts at its block, not at its token)
            seen = seen & (t > pos - WINDOW)
        if CHUNK > 0:  # nor one before the chunk
            seen = seen & (t >= pos // CHUNK * CHUNK)
        kv = (blk.to(tl.int64) * BS + t % BS) * (HKV * D) + g * D  # [BLOCK_N] cache row offset
        k = tl.load(k_ptr + kv[:, None] + d[None, :], mask=seen[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(v_ptr + kv[:, None] + d[None, :], mask=seen[:, None], other=0.0)  # [BLOCK_N, D]
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")  # [ROWS, BLOCK_N] f32
        elif _UPCAST_DOT:
            qk = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32))
        else:
            qk = tl.dot(q, tl.trans(k))
        if SOFTCAP > 0:
            qk = _softcap(qk, CAP_IN, SOFTCAP * 1.4426950408889634)  # log2 domain, as SCALE is
        else:
            qk = qk * SCALE
        qk = tl.where(seen[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a tile with nothing visible
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        elif _UPCAST_DOT:
            if v.dtype == tl.bfloat16:  # round p to nearest even, as compiled code does
                pb = p.to(tl.uint32, bitcast=True).to(tl.int64)  # (the interpreter truncates)
                p = (
                    (((pb + 0x7FFF + ((pb >> 16) & 1)) >> 16) << 16)
                    .to(tl.uint32)
                    .to(tl.float32, bitcast=True)
                )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + row[:, None].to(tl.int64) * D + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        part = row.to(tl.int64) * NUM_SPLITS + sp  # [ROWS]
        tl.store(part_acc_ptr + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr,  # [B * S * H, NUM_SPLITS, D] f32
    part_m_ptr,  # [B * S * H, NUM_SPLITS] f32
    part_l_ptr,  # [B * S * H, NUM_SPLITS] f32
    pos_ptr,  # [B, S] int
    out_ptr,  # [B, S, H, D]
    H: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,
    USE_GDC: tl.constexpr,  # launched with PDL: wait for the split kernel before reading its partials
    S: tl.constexpr = 1,  # query tokens per sequence
    WINDOW: tl.constexpr = 0,
    CHUNK: tl.constexpr = 0,
):
    row = tl.program_id(0)  # (b * S + s) * H + h
    if USE_GDC:
        _g.gdc_wait()
        _g.gdc_launch_dependents()
    pos = tl.load(pos_ptr + row // H).to(tl.int32)
    n_tok = tl.minimum(pos + 1, CTX_BLOCKS * BS)
    base = 0
    if WINDOW > 0 or CHUNK > 0:  # the split kernel's first block: from the sequence's earliest row
        first = tl.load(pos_ptr + (row // H // S) * S + tl.arange(0, _SEQ_P2), mask=tl.arange(0, _SEQ_P2) < S,
                        other=2**30)  # fmt: skip
        base = _first_key(tl.min(first.to(tl.int32), axis=0), WINDOW, CHUNK) // BS * BS
    n_valid = (n_tok - base + SPLIT_TOKENS - 1) // SPLIT_TOKENS  # splits that saw a token of this row
    j = tl.arange(0, SPLITS_P2)
    ok = j < n_valid
    part = row.to(tl.int64) * NUM_SPLITS + j
    m = tl.load(part_m_ptr + part, mask=ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=ok, other=0.0)
    w = tl.where(ok, tl.exp2(m - tl.max(m, axis=0)), 0.0)  # [SPLITS_P2]
    d = tl.arange(0, D)
    acc = tl.load(part_acc_ptr + part[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out_ptr + row.to(tl.int64) * D + d, out.to(out_ptr.dtype.element_ty))


# --- choosing the work split -------------------------------------------------------------------------


def _split_plan(
    batch: int, hkv: int, ctx_tokens: int, config: dict[str, Any], units: int
) -> tuple[int, int, int]:
    """(splits, tokens per split, BLOCK_N): enough programs to put `ctas_per_cu` on every SM/CU, no
    split shorter than `min_split_tokens`, BLOCK_N the config's or the split's length if that is
    shorter (at least 16, a tl.dot tile), each split a whole number of BLOCK_N tiles."""
    want = triton.cdiv(config["ctas_per_cu"] * units, batch * hkv)
    most = triton.cdiv(ctx_tokens, config["min_split_tokens"])
    splits = max(1, min(want, most))
    tokens = triton.cdiv(ctx_tokens, splits)
    block_n = min(config["block_n"], max(16, 1 << (tokens.bit_length() - 1)))  # largest power of 2 <= tokens
    split_tokens = triton.cdiv(tokens, block_n) * block_n
    return triton.cdiv(ctx_tokens, split_tokens), split_tokens, block_n


def _one_plan(
    batch: int, hkv: int, ctx_tokens: int, config: dict[str, Any], units: int
) -> tuple[int, int, int]:
    """(splits, tokens per split, BLOCK_N) of the one-token path: `ctas_per_cu` programs on every
    SM/CU where the context allows, one tile a split where it fits: the tile the power of two at or
    above the tokens each wanted split would take, in [min_split_tokens, one_block_n (else block_n)] and no longer than the
    context (at least 16, a tl.dot tile). On an H200 at batch 1 (8 kv heads, 132 SMs, the first
    config): 16 splits of 64 tokens at 1k, 32 of 256 at 8k (bench/h200_decode_kernels_results.json)."""
    want = triton.cdiv(config["ctas_per_cu"] * units, batch * hkv)
    tokens = triton.cdiv(ctx_tokens, want)
    low = max(16, triton.next_power_of_2(config["min_split_tokens"]))
    tile = min(
        max(triton.next_power_of_2(tokens), low), max(low, config.get("one_block_n", config["block_n"]))
    )
    tile = max(16, min(tile, triton.next_power_of_2(ctx_tokens)))
    split_tokens = triton.cdiv(tokens, tile) * tile
    return triton.cdiv(ctx_tokens, split_tokens), split_tokens, tile


def _one_warps(config: dict[str, Any], block_n: int, warp_size: int) -> int:
    """Warps of the one-token kernel: the config's, or one lane per token of a wider tile."""
    return max(config["num_warps"], block_n // warp_size)


# --- the contract -------------------------------------------------------------------------------------


def _is_pow2(x: Any) -> bool:
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def supports(spec: Any) -> bool:
    if len(spec.nodes) != 1 or spec.single.op != "cache_attention" or not spec.target.is_gpu:
        return False
    q, kc, vc, table, pos = (spec.types[v] for v in spec.single.inputs[:5])
    sinks = [spec.types[v] for v in spec.single.inputs[5:]]
    _, s, h, d = q.shape
    _, bs, hkv, _ = kc.shape
    attrs = spec.attrs()
    return (
        len(sinks) <= 1
        and all(str(x.dtype) in _FLOATS and x.shape == (h,) for x in sinks)
        and set(attrs) <= {"scale", "window", "softcap", "chunk"}
        and not (attrs.get("window") and attrs.get("chunk"))
        and str(q.dtype) in _FLOATS
        and kc.dtype == q.dtype
        and vc.dtype == q.dtype
        and str(table.dtype) in ("i32", "i64")
        and str(pos.dtype) in ("i32", "i64")
        and isinstance(s, int)
        and 1 <= s <= MAX_SEQ
        and isinstance(h, int)
        and isinstance(hkv, int)
        and isinstance(bs, int)
        and bs >= 1
        and _is_pow2(d)
        and 16 <= d <= 256
    )


def _params(
    s: int,
    h: int,
    hkv: int,
    d: int,
    bs: int,
    batch: int,
    ctx_blocks: int,
    scale: float,
    dtype: str,
    config: dict[str, Any],
    traits: Any,
    window: int = 0,
    softcap: float = 0.0,
    chunk: int = 0,
    sinks: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The split (S = 1: one-token, unless the config's `one_kernel` is off) and reduce kernels'
    constexprs for one concrete shape."""
    gdc = _g.enabled(traits)
    one = s == 1 and config.get("one_kernel", True)
    plan = _one_plan if one else _split_plan
    splits, split_tokens, block_n = plan(
        batch, hkv, _span(s, ctx_blocks * bs, bs, window or chunk), config, traits.units
    )
    split = {
        "SCALE": float(scale) * _LOG2E,
        **({} if one else {"S": s}),
        "H": h,
        "HKV": hkv,
        "D": d,
        "BS": bs,
        "CTX_BLOCKS": ctx_blocks,
        "NUM_SPLITS": splits,
        "SPLIT_TOKENS": split_tokens,
        "BLOCK_N": block_n,
        "ROWS": max(16, triton.next_power_of_2(s * (h // hkv))),
        "IEEE": dtype == "f32",
        "USE_GDC": gdc,
        "WINDOW": int(window),
        "SOFTCAP": float(softcap),
        "CAP_IN": float(scale) / float(softcap) if softcap else 1.0,
        "CHUNK": int(chunk),  # 0 and False: the code of the kernel without them
        "SINKS": bool(sinks),
    }
    reduce = {
        "H": h,
        "D": d,
        "BS": bs,
        "CTX_BLOCKS": ctx_blocks,
        "NUM_SPLITS": splits,
        "SPLITS_P2": triton.next_power_of_2(splits),
        "SPLIT_TOKENS": split_tokens,
        "USE_GDC": gdc,
        "S": s,
        "WINDOW": int(window),
        "CHUNK": int(chunk),
    }
    return split, reduce


def _span(s: int, ctx_tokens: int, bs: int, window: int) -> int:
    """Cache tokens the splits of one sequence must cover: the table's, or under a window (or a chunk:
    `window` is then the chunk size, the most keys a query sees) at S = 1 the window from the start of
    the block holding its first key (window + bs - 1 at most); at S > 1 the table's (rows need not be
    consecutive), starting at the earliest row's window block."""
    if not window or s > 1:
        return ctx_tokens
    return min(ctx_tokens, window + bs - 1)


def _window_softcap(spec: Any) -> tuple[int, float]:
    attrs = spec.attrs()
    return int(attrs.get("window", 0) or 0), float(attrs.get("softcap", 0.0) or 0.0)


def _chunk_sinks(spec: Any) -> tuple[int, bool]:
    return int(spec.attrs().get("chunk", 0) or 0), len(spec.single.inputs) > 5


def _split_kernel(split: dict[str, Any]) -> Any:
    return _decode_split_kernel if "S" in split else _decode_one_kernel


def _grid(split: dict[str, Any], batch: int) -> tuple[int, int, int]:
    if "S" in split:
        return (batch, split["HKV"], split["NUM_SPLITS"])
    return (split["HKV"], split["NUM_SPLITS"], batch)


def _options(config: dict[str, Any], traits: Any, split: dict[str, Any]) -> dict[str, Any]:
    warps = config["num_warps"]
    if "S" not in split:
        warps = _one_warps(config, split["BLOCK_N"], traits.warp_size)
    return {
        "num_warps": warps,
        "num_stages": config["num_stages"],
        **_t.extra_options(config, traits),
        **_g.launch_options(traits),
    }


def _reduce_options(reduce: dict[str, Any], traits: Any) -> dict[str, Any]:
    # the [SPLITS_P2, D] fp32 partials in registers: about 32 values a lane
    warps = max(1, min(8, reduce["SPLITS_P2"] * reduce["D"] // 1024))
    return {"num_warps": warps, "num_stages": 1, **_g.launch_options(traits)}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    node = spec.single
    args = spec.args(node)
    scale = spec.attrs()["scale"]
    q_t, kc_t = spec.types[node.inputs[0]], spec.types[node.inputs[1]]
    _, s, h, d = q_t.shape
    _, bs, hkv, _ = kc_t.shape
    dtype = str(q_t.dtype)
    window, softcap = _window_softcap(spec)
    chunk, has_sinks = _chunk_sinks(spec)
    cache: dict[
        tuple[int, int], tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]
    ] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        q, kc, vc, table, pos = (x.contiguous() for x in (q, kc, vc, table, pos))
        sinks = inputs[args[5]].contiguous() if has_sinks else q  # q: never read without SINKS
        out = outputs[0]
        batch, ctx_blocks = table.shape
        if batch == 0 or ctx_blocks == 0:
            return
        key = (batch, ctx_blocks)
        if key not in cache:
            split, reduce = _params(
                s, h, hkv, d, bs, batch, ctx_blocks, scale, dtype, config, traits, window, softcap, chunk,
                has_sinks,
            )  # fmt: skip
            cache[key] = (
                _split_kernel(split), split, _options(config, traits, split), reduce,
                _reduce_options(reduce, traits),
            )  # fmt: skip
        kernel, split, options, reduce, reduce_options = cache[key]
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        splits = split["NUM_SPLITS"]
        if splits == 1:
            part_acc = part_m = part_l = o  # never touched: the kernel writes o directly
        else:
            part_acc = torch.empty((batch * s * h, splits, d), dtype=torch.float32, device=q.device)
            part_m = torch.empty((batch * s * h, splits), dtype=torch.float32, device=q.device)
            part_l = torch.empty((batch * s * h, splits), dtype=torch.float32, device=q.device)
        kernel[_grid(split, batch)](
            q, kc, vc, table, pos, o, part_acc, part_m, part_l, sinks, **split, **options
        )  # fmt: skip
        if splits > 1:
            _decode_reduce_kernel[(batch * s * h,)](
                part_acc, part_m, part_l, pos, o, **reduce, **reduce_options
            )
        if o is not out:
            out.copy_(o)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    node = spec.single
    q_t, kc_t, _, table_t, pos_t = (spec.types[v] for v in node.inputs[:5])
    batch, s, h, d = q_t.shape
    _, bs, hkv, _ = kc_t.shape
    ctx_blocks = table_t.shape[1]
    if not (isinstance(batch, int) and isinstance(ctx_blocks, int)):
        raise ValueError(
            f"decode_attention compiles for a concrete batch and ctx_blocks; got q {q_t}, block_table "
            f"{table_t} (specialize the graph to a traffic bucket first)"
        )
    dtype = str(q_t.dtype)
    window, softcap = _window_softcap(spec)
    chunk, has_sinks = _chunk_sinks(spec)
    split, reduce = _params(
        s, h, hkv, d, bs, batch, ctx_blocks, spec.attrs()["scale"], dtype, config, traits, window, softcap,
        chunk, has_sinks,
    )  # fmt: skip
    data, table, pos = (
        "*" + _TRITON_DTYPE[dtype],
        "*" + _TRITON_DTYPE[str(table_t.dtype)],
        "*" + _TRITON_DTYPE[str(pos_t.dtype)],
    )
    partial = "*fp32" if split["NUM_SPLITS"] > 1 else data
    sinks = "*" + _TRITON_DTYPE[str(spec.types[node.inputs[5]].dtype)] if has_sinks else data
    split_sig = {
        "q_ptr": data,
        "k_ptr": data,
        "v_ptr": data,
        "table_ptr": table,
        "pos_ptr": pos,
        "out_ptr": data,
        "part_acc_ptr": partial,
        "part_m_ptr": partial,
        "part_l_ptr": partial,
        "sinks_ptr": sinks,
        **{name: "constexpr" for name in split},
    }
    units = [
        CompileUnit(
            "decode_attention.split", _split_kernel(split), split_sig, split, _options(config, traits, split)
        )
    ]
    if split["NUM_SPLITS"] > 1:
        reduce_sig = {
            "part_acc_ptr": "*fp32",
            "part_m_ptr": "*fp32",
            "part_l_ptr": "*fp32",
            "pos_ptr": pos,
            "out_ptr": data,
            **{name: "constexpr" for name in reduce},
        }
        units.append(
            CompileUnit(
                "decode_attention.reduce",
                _decode_reduce_kernel,
                reduce_sig,
                reduce,
                _reduce_options(reduce, traits),
            )
        )
    return units


def occupancy(
    batch: int,
    hkv: int,
    ctx_tokens: int,
    config: dict[str, Any],
    traits: Any,
    seq: int = 1,
    window: int = 0,
    block_size: int = 16,
    chunk: int = 0,
) -> dict[str, Any]:
    """How the split heuristic fills the chip `traits` describes at one shape, `seq` query tokens per
    sequence (for reports and the tuner's notes); `traits.units` is the smallest chip of its arch
    (traits_for)."""
    units = traits.units
    plan = _one_plan if seq == 1 and config.get("one_kernel", True) else _split_plan
    span = _span(seq, ctx_tokens, block_size, window or chunk)
    splits, split_tokens, block_n = plan(batch, hkv, span, config, units)
    ctas = batch * hkv * splits
    return {
        "splits": splits,
        "split_tokens": split_tokens,
        "block_n": block_n,
        "ctas": ctas,
        "compute_units": units,
        "ctas_per_unit": ctas / units,
        "waves": math.ceil(ctas / units),
    }
