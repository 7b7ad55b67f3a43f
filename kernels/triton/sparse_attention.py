"""DeepSeek-V3.2's sparse attention over the paged cache: the indexer's top-k and attention over the
positions it selected.

indexer_topk(q[B, S, H, D], cache[blocks, bs, 1, D], weights[B, S, H], block_table, positions), attrs k,
scale -> i32 [B, S, k]: two kernels.
  scores  grid (B * S, T / BLOCK_T), T = the table's width in tokens. A program holds one query row's
          H heads (padded to a tl.dot tile) and BLOCK_T cache rows gathered through block_table, and
          writes the f32 score sum_h w_h * relu(scale q_h . k_t) of each position t <= p into a
          scratch [B * S, T]; a tile wholly past p exits at once (its slots are never read).
  select  grid (B * S,). Scores map to order-preserving 32-bit keys u; the k-th largest u of the row's
          visible positions is found bit by bit (32 counting passes over the row's scores, high bit
          first), then one pass writes every position with u above it, and the lowest positions with
          u equal to it until k are taken, into a scratch row as 64-bit keys u * 2^31 + (2^31 - 1 - t)
          (all distinct: larger u first, the lower position on ties); one tl.sort of those KP keys
          (KP the power of two >= k) orders them best first, and the positions are read back out of
          the keys. Slots past the row's visible count are -1. Exact: no score is compared except as
          its f32 bits.
index_attention(q[B, S, H, Dk], k_cache, v_cache, block_table, positions, selected[B, S, k]), attr scale ->
[B, S, H, Dv]: flash-decoding over the selected entries.
  attend  grid (B * S, kv_heads * row blocks, splits). A program holds ROWS query heads of one kv head
          (the config's `rows`; H / Hkv heads a group) of one query row and walks its split's share
          of the row's `selected` entries BLOCK_N at a time, gathering each entry's cache row through
          block_table (an entry of -1, past the query's position or past the table is masked out of
          the loads and the softmax). Online softmax in f32 (exp2, scale folded with log2 e). A head
          dim that is not a power of two is split as D = R + P, R and P powers of two (DeepSeek's
          latent 576 = 512 + 64): two dots for q.k, two accumulators for p.v. Where k_cache and
          v_cache are the same value (DeepSeek's latent cache) the k tile is the v tile: one load.
          With one split it writes the output; else the unnormalised partials (acc, max, sumexp).
  reduce  grid (B * S * H,): merges a row's splits and writes q.dtype output.
  dedup   grid (B * S,), before attend: a row of `selected` may name a position twice (the reference
          sees it once): one tl.sort of the row's entries (position, then entry) keeps each position's
          first entry and writes -1 for every repeat (and every entry outside the table) into a
          scratch copy of the row, which attend reads.
Splits are chosen so that the attend grid is about `ctas_per_cu` programs per SM/CU, no split shorter
than `min_split` entries.

Constraints (supports): cuda or rocm; one node; q and caches of one float dtype (f32, bf16, f16), the
indexer's weights any float dtype; block table, positions and selected i32 or i64; concrete S, H,
kv heads, block size and head dims. indexer_topk: D a power of two in [16, 256], H <= 256, 1 <= k <=
4096 (the sorted keys held in registers). index_attention: Dk and Dv each a power of two in [16, 512] or
R + P with 16 <= P < R <= 512 powers of two; 1 <= selected entries a row <= 4096 (dedup sorts them).

Config keys: score_block_t (cache rows per scoring program), score_warps, select_block (scores per
counting step), select_warps; rows (query heads per attend program), block_n (entries per attend
step), min_split, ctas_per_cu, num_warps, num_stages (attend); the arch's launch options (waves_per_eu)
where it takes them. Not measured on any device.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = ("indexer_topk", "index_attention")

MAX_K = 4096  # the most selected positions a row of indexer_topk sorts in registers

_WARP32_CONFIGS = [
    {"score_block_t": 64, "score_warps": 4, "select_block": 1024, "select_warps": 8, "rows": 16,
     "block_n": 32, "min_split": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 2},
    {"score_block_t": 128, "score_warps": 8, "select_block": 2048, "select_warps": 8, "rows": 32,
     "block_n": 32, "min_split": 128, "ctas_per_cu": 2, "num_warps": 8, "num_stages": 2},
    {"score_block_t": 32, "score_warps": 4, "select_block": 512, "select_warps": 4, "rows": 16,
     "block_n": 16, "min_split": 64, "ctas_per_cu": 4, "num_warps": 4, "num_stages": 1},
]  # fmt: skip
# Written for 64-wide waves (CDNA; not measured).
_WAVE64_CONFIGS = [
    {"score_block_t": 64, "score_warps": 4, "select_block": 1024, "select_warps": 4, "rows": 16,
     "block_n": 32, "min_split": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 1, "waves_per_eu": 0},
    {"score_block_t": 32, "score_warps": 2, "select_block": 512, "select_warps": 4, "rows": 16,
     "block_n": 16, "min_split": 64, "ctas_per_cu": 4, "num_warps": 2, "num_stages": 1, "waves_per_eu": 2},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS

_TRITON_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i32": "i32", "i64": "i64"}
_FLOATS = ("f32", "bf16", "f16")
_INTS = ("i32", "i64")
_LOG2E = 1.4426950408889634

# Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584): there, and only
# there, the dots run on operands upcast to f32 (exact: bf16 products fit f32); round_to rounds p to
# bf16 as compiled code does.
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_UPCAST_DOT = _i.INTERPRETED
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits)


# --- indexer_topk ----------------------------------------------------------------------------------------


@triton.jit
def _index_score_kernel(
    q_ptr,  # [B, S, H, D]
    k_ptr,  # [cache_blocks, BS, 1, D]
    w_ptr,  # [B, S, H] float
    table_ptr,  # [B, CTX_BLOCKS] int
    pos_ptr,  # [B, S] int
    score_ptr,  # [B * S, T] f32 scratch, written at t <= p
    SCALE: tl.constexpr,
    S: tl.constexpr,
    H: tl.constexpr,
    HP: tl.constexpr,  # H padded to a power of two >= 16
    D: tl.constexpr,
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,  # f32 inputs: full-precision dots, not tf32
):
    row = tl.program_id(0)  # b * S + s
    t0 = tl.program_id(1) * BLOCK_T
    b = row // S
    pos = tl.load(pos_ptr + row).to(tl.int32)
    if t0 > pos:  # nothing this query sees
        return
    T: tl.constexpr = CTX_BLOCKS * BS
    t = t0 + tl.arange(0, BLOCK_T)
    t_ok = (t <= pos) & (t < T)
    d = tl.arange(0, D)
    blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS, mask=t_ok, other=0)
    kv = (blk.to(tl.int64) * BS + t % BS) * D  # [BLOCK_T] cache row offset
    k = tl.load(k_ptr + kv[:, None] + d[None, :], mask=t_ok[:, None], other=0.0)  # [BLOCK_T, D]
    h = tl.arange(0, HP)
    h_ok = h < H
    qrow = (row * H + h).to(tl.int64)
    q = tl.load(q_ptr + qrow[:, None] * D + d[None, :], mask=h_ok[:, None], other=0.0)  # [HP, D]
    if IEEE:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")  # [HP, BLOCK_T] f32
    elif _UPCAST_DOT:
        qk = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32))
    else:
        qk = tl.dot(q, tl.trans(k))
    w = tl.load(w_ptr + row * H + h, mask=h_ok, other=0.0).to(tl.float32)  # [HP]
    score = tl.sum(w[:, None] * tl.maximum(qk * SCALE, 0.0), axis=0)  # [BLOCK_T]
    tl.store(score_ptr + row.to(tl.int64) * T + t, score, mask=t_ok)


@triton.jit
def _ordered(score):
    """f32 -> int64 in [0, 2^32), in the order of the floats (larger float, larger key); -0.0 is +0.0
    (a zero score's sign depends on the order of summation; the reference ties them)."""
    score = tl.where(score == 0.0, 0.0, score)
    bits = score.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0, bits + 2147483648, -1 - bits)


@triton.jit
def _topk_select_kernel(
    score_ptr,  # [B * S, T] f32, valid at t <= p
    pos_ptr,  # [B, S] int
    key_ptr,  # [B * S, KP] int64 scratch: the chosen positions' keys, unordered
    out_ptr,  # [B, S, K] i32
    T: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,  # K padded to a power of two
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    pos = tl.load(pos_ptr + row).to(tl.int32)
    n = tl.minimum(pos + 1, T)  # visible positions 0..n-1
    srow = score_ptr + row.to(tl.int64) * T
    c = tl.arange(0, BLOCK)
    # the K-th largest key of the row, high bit first (0 where fewer than K are visible: all taken)
    thr = tl.zeros([], tl.int64)
    step = tl.full([], 2147483648, tl.int64)
    for _ in range(32):
        cand = thr + step
        cnt = 0
        for t0 in range(0, n, BLOCK):
            t = t0 + c
            ok = t < n
            u = _ordered(tl.load(srow + t, mask=ok, other=0.0))
            cnt += tl.sum((ok & (u >= cand)).to(tl.int32), axis=0)
        thr = tl.where(cnt >= K, cand, thr)
        step = step // 2
    above = 0
    for t0 in range(0, n, BLOCK):
        t = t0 + c
        ok = t < n
        u = _ordered(tl.load(srow + t, mask=ok, other=0.0))
        above += tl.sum((ok & (u > thr)).to(tl.int32), axis=0)
    need = K - above  # positions with key thr to take, lowest first
    taken = 0
    equal = 0
    krow = key_ptr + row.to(tl.int64) * KP
    for t0 in range(0, n, BLOCK):
        t = t0 + c
        ok = t < n
        u = _ordered(tl.load(srow + t, mask=ok, other=0.0))
        eq = ok & (u == thr)
        eq_rank = equal + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        chosen = (ok & (u > thr)) | (eq & (eq_rank < need))
        slot = taken + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        key = u * 2147483648 + (2147483647 - t.to(tl.int64))  # distinct; larger u, then lower t, first
        tl.store(krow + slot, key, mask=chosen)
        taken += tl.sum(chosen.to(tl.int32), axis=0)
        equal += tl.sum(eq.to(tl.int32), axis=0)
    tl.debug_barrier()  # the keys other threads of this program stored
    j = tl.arange(0, KP)
    key = tl.load(krow + j, mask=j < taken, other=0)
    key = tl.sort(key, descending=True)  # [KP] best first; 0 (nothing) last
    best = tl.where(key > 0, 2147483647 - (key & 2147483647), -1).to(tl.int32)
    tl.store(out_ptr + row.to(tl.int64) * K + j, best, mask=j < K)


# --- index_attention --------------------------------------------------------------------------------------


@triton.jit
def _dedup_kernel(
    sel_ptr,  # [B, S, KSEL] int, -1: none
    key_ptr,  # [B * S, KSP] int64 scratch: the row's entries, sorted
    out_ptr,  # [B * S, KSEL] i32: the row with every repeat of an earlier entry, and out-of-range ones, -1
    T: tl.constexpr,
    KSEL: tl.constexpr,
    KSP: tl.constexpr,  # KSEL padded to a power of two
):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, KSP)
    ok = j < KSEL
    t = tl.load(sel_ptr + row * KSEL + j, mask=ok, other=-1).to(tl.int64)
    valid = ok & (t >= 0) & (t < T)
    key = tl.sort(tl.where(valid, t, T) * KSP + j)  # by position, then by entry; nothing last
    krow = key_ptr + row * KSP
    tl.store(krow + j, key)
    tl.debug_barrier()  # the keys other threads of this program stored
    prev = tl.load(krow + j - 1, mask=j > 0, other=0) // KSP  # the position sorted before
    prev = tl.where(j > 0, prev, -1)  # (integer division truncates: -1 // KSP would be 0)
    ts = key // KSP
    js = key % KSP
    first = (ts < T) & (prev != ts)
    tl.store(out_ptr + row * KSEL + js, tl.where(first, ts, -1).to(tl.int32), mask=js < KSEL)


@triton.jit
def _index_attn_kernel(
    q_ptr,  # [B, S, H, DK]
    k_ptr,  # [cache_blocks, BS, HKV, DK]
    v_ptr,  # [cache_blocks, BS, HKV, DV] (k_ptr, never read, when SAME_KV)
    table_ptr,  # [B, CTX_BLOCKS] int
    pos_ptr,  # [B, S] int
    sel_ptr,  # [B * S, KSEL] i32, distinct positions (the dedup kernel's), -1: none
    out_ptr,  # [B, S, H, DV], written when NUM_SPLITS == 1
    part_acc_ptr,  # [B * S * H, NUM_SPLITS, DV] f32 unnormalised sum p v, when NUM_SPLITS > 1
    part_m_ptr,  # [B * S * H, NUM_SPLITS] f32 running max (log2 domain)
    part_l_ptr,  # [B * S * H, NUM_SPLITS] f32 sum of exp2
    SCALE: tl.constexpr,  # softmax scale * log2(e)
    S: tl.constexpr,
    H: tl.constexpr,
    HKV: tl.constexpr,
    DK: tl.constexpr,
    RK: tl.constexpr,  # DK = RK + PK, RK a power of two, PK 0 or one
    PK: tl.constexpr,
    DV: tl.constexpr,
    RV: tl.constexpr,
    PV: tl.constexpr,
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    KSEL: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,  # query heads a program holds (a power of two >= 16)
    ROW_BLOCKS: tl.constexpr,  # programs per kv head group
    SAME_KV: tl.constexpr,  # k_cache is v_cache: the v tile is the k tile
    IEEE: tl.constexpr,
):
    qr = tl.program_id(0)  # b * S + s
    g = tl.program_id(1) // ROW_BLOCKS
    rb = tl.program_id(1) % ROW_BLOCKS
    sp = tl.program_id(2)
    b = qr // S
    REP: tl.constexpr = H // HKV
    T: tl.constexpr = CTX_BLOCKS * BS
    pos = tl.load(pos_ptr + qr).to(tl.int32)

    r = rb * ROWS + tl.arange(0, ROWS)
    row_ok = r < REP
    h = g * REP + r  # [ROWS] query head
    row = (qr * H + h).to(tl.int64)  # [ROWS] index of (b, s, h)
    dk = tl.arange(0, RK)
    q = tl.load(q_ptr + row[:, None] * DK + dk[None, :], mask=row_ok[:, None], other=0.0)  # [ROWS, RK]
    if PK > 0:
        dkp = RK + tl.arange(0, PK)
        q_p = tl.load(q_ptr + row[:, None] * DK + dkp[None, :], mask=row_ok[:, None], other=0.0)
    dv = tl.arange(0, RV)
    if PV > 0:
        dvp = RV + tl.arange(0, PV)
        acc_p = tl.zeros([ROWS, PV], tl.float32)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, RV], tl.float32)
    n = tl.arange(0, BLOCK_N)
    start = sp * SPLIT_N
    end = tl.minimum(start + SPLIT_N, KSEL)
    for j0 in range(start, end, BLOCK_N):
        j = j0 + n
        t = tl.load(sel_ptr + qr.to(tl.int64) * KSEL + j, mask=j < end, other=-1).to(tl.int32)
        t_ok = (t >= 0) & (t <= pos) & (t < T)  # [BLOCK_N]
        blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS, mask=t_ok, other=0)
        kv = (blk.to(tl.int64) * BS + t % BS) * HKV + g  # [BLOCK_N] cache row
        k = tl.load(k_ptr + kv[:, None] * DK + dk[None, :], mask=t_ok[:, None], other=0.0)  # [BLOCK_N, RK]
        if PK > 0:
            k_p = tl.load(k_ptr + kv[:, None] * DK + dkp[None, :], mask=t_ok[:, None], other=0.0)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")  # [ROWS, BLOCK_N] f32
            if PK > 0:
                qk = tl.dot(q_p, tl.trans(k_p), qk, input_precision="ieee")
        elif _UPCAST_DOT:
            qk = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32))
            if PK > 0:
                qk = tl.dot(q_p.to(tl.float32), tl.trans(k_p).to(tl.float32), qk)
        else:
            qk = tl.dot(q, tl.trans(k))
            if PK > 0:
                qk = tl.dot(q_p, tl.trans(k_p), qk)
        qk = tl.where(t_ok[None, :], qk * SCALE, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        if SAME_KV:
            v = k
            if PV > 0:
                v_p = k_p
        else:
            v = tl.load(v_ptr + kv[:, None] * DV + dv[None, :], mask=t_ok[:, None], other=0.0)
            if PV > 0:
                v_p = tl.load(v_ptr + kv[:, None] * DV + dvp[None, :], mask=t_ok[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
            if PV > 0:
                acc_p = tl.dot(p, v_p, acc_p * alpha[:, None], input_precision="ieee")
        elif _UPCAST_DOT:
            pv = _i.round_to(p, v.dtype).to(tl.float32)
            acc = tl.dot(pv, v.to(tl.float32), acc * alpha[:, None])
            if PV > 0:
                acc_p = tl.dot(pv, v_p.to(tl.float32), acc_p * alpha[:, None])
        else:
            pv = p.to(v.dtype)
            acc = tl.dot(pv, v, acc * alpha[:, None])
            if PV > 0:
                acc_p = tl.dot(pv, v_p, acc_p * alpha[:, None])

    if NUM_SPLITS == 1:
        inv = 1.0 / l_i
        o = out_ptr + row[:, None] * DV
        tl.store(o + dv[None, :], (acc * inv[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        if PV > 0:
            tl.store(
                o + dvp[None, :], (acc_p * inv[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None]
            )
    else:
        part = row * NUM_SPLITS + sp  # [ROWS]
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        pa = part_acc_ptr + part[:, None] * DV
        tl.store(pa + dv[None, :], acc, mask=row_ok[:, None])
        if PV > 0:
            tl.store(pa + dvp[None, :], acc_p, mask=row_ok[:, None])


@triton.jit
def _index_reduce_kernel(
    part_acc_ptr,  # [B * S * H, NUM_SPLITS, DV] f32
    part_m_ptr,  # [B * S * H, NUM_SPLITS] f32
    part_l_ptr,  # [B * S * H, NUM_SPLITS] f32
    out_ptr,  # [B, S, H, DV]
    DV: tl.constexpr,
    RV: tl.constexpr,
    PV: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, SPLITS_P2)
    ok = j < NUM_SPLITS
    part = row * NUM_SPLITS + j
    m = tl.load(part_m_ptr + part, mask=ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=ok, other=0.0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - tl.max(m, axis=0)))  # [SPLITS_P2]; a split saw none
    inv = 1.0 / tl.sum(l * w, axis=0)
    d = tl.arange(0, RV)
    acc = tl.load(part_acc_ptr + part[:, None] * DV + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) * inv
    tl.store(out_ptr + row * DV + d, out.to(out_ptr.dtype.element_ty))
    if PV > 0:
        dp = RV + tl.arange(0, PV)
        acc_p = tl.load(part_acc_ptr + part[:, None] * DV + dp[None, :], mask=ok[:, None], other=0.0)
        out_p = tl.sum(acc_p * w[:, None], axis=0) * inv
        tl.store(out_ptr + row * DV + dp, out_p.to(out_ptr.dtype.element_ty))


# --- the contract -------------------------------------------------------------------------------------


def _is_pow2(x: Any) -> bool:
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def _split_dim(d: Any) -> tuple[int, int] | None:
    """D as R + P (R a power of two in [16, 512], P 0 or a smaller power of two >= 16), or None."""
    if not isinstance(d, int) or d < 16:
        return None
    if _is_pow2(d):
        return (d, 0) if d <= 512 else None
    r = 1 << (d.bit_length() - 1)
    p = d - r
    return (r, p) if r <= 512 and _is_pow2(p) and p >= 16 else None


def _common(spec: Any) -> bool:
    return len(spec.nodes) == 1 and spec.single.op in IMPLEMENTS and spec.target.is_gpu


def _supports_topk(spec: Any) -> bool:
    q, kc, w, table, pos = (spec.types[v] for v in spec.single.inputs)
    _, s, h, d = q.shape
    _, bs, heads, _ = kc.shape
    attrs = spec.attrs()
    k = attrs.get("k")
    return (
        set(attrs) <= {"k", "scale"}
        and str(q.dtype) in _FLOATS
        and kc.dtype == q.dtype
        and str(w.dtype) in _FLOATS
        and str(table.dtype) in _INTS
        and str(pos.dtype) in _INTS
        and isinstance(s, int)
        and isinstance(h, int)
        and 1 <= h <= 256
        and heads == 1
        and isinstance(bs, int)
        and bs >= 1
        and _is_pow2(d)
        and 16 <= d <= 256
        and isinstance(k, int)
        and 1 <= k <= MAX_K
    )


def _supports_attention(spec: Any) -> bool:
    q, kc, vc, table, pos, sel = (spec.types[v] for v in spec.single.inputs)
    _, s, h, dk = q.shape
    _, bs, hkv, _ = kc.shape
    return (
        set(spec.attrs()) <= {"scale"}
        and str(q.dtype) in _FLOATS
        and kc.dtype == q.dtype
        and vc.dtype == q.dtype
        and str(table.dtype) in _INTS
        and str(pos.dtype) in _INTS
        and str(sel.dtype) in _INTS
        and isinstance(s, int)
        and isinstance(h, int)
        and isinstance(hkv, int)
        and hkv >= 1
        and h % hkv == 0
        and isinstance(bs, int)
        and bs >= 1
        and kc.shape[3] == dk
        and isinstance(sel.shape[2], int)
        and 1 <= sel.shape[2] <= MAX_K
        and _split_dim(dk) is not None
        and _split_dim(vc.shape[3]) is not None
    )


def supports(spec: Any) -> bool:
    if not _common(spec):
        return False
    return _supports_topk(spec) if spec.single.op == "indexer_topk" else _supports_attention(spec)


def _topk_params(spec: Any, ctx_blocks: int, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    node = spec.single
    q_t, kc_t = spec.types[node.inputs[0]], spec.types[node.inputs[1]]
    _, s, h, d = q_t.shape
    bs = kc_t.shape[1]
    k = spec.attrs()["k"]
    score = {
        "SCALE": float(spec.attrs()["scale"]),
        "S": s,
        "H": h,
        "HP": max(16, triton.next_power_of_2(h)),
        "D": d,
        "BS": bs,
        "CTX_BLOCKS": ctx_blocks,
        "BLOCK_T": config["score_block_t"],
        "IEEE": str(q_t.dtype) == "f32",
    }
    select = {"T": ctx_blocks * bs, "K": k, "KP": triton.next_power_of_2(k), "BLOCK": config["select_block"]}
    return score, select


def _attn_params(
    spec: Any, batch: int, ctx_blocks: int, config: dict[str, Any], traits: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    node = spec.single
    q_t, kc_t, vc_t, _, _, sel_t = (spec.types[v] for v in node.inputs)
    _, s, h, dk = q_t.shape
    _, bs, hkv, _ = kc_t.shape
    dv = vc_t.shape[3]
    ksel = sel_t.shape[2]
    rk, pk = _split_dim(dk)  # type: ignore[misc]
    rv, pv = _split_dim(dv)  # type: ignore[misc]
    rep = h // hkv
    rows = max(16, min(config["rows"], triton.next_power_of_2(rep)))
    row_blocks = triton.cdiv(rep, rows)
    block_n = max(16, min(config["block_n"], triton.next_power_of_2(ksel)))
    units = traits.units if traits is not None else 1
    want = triton.cdiv(config["ctas_per_cu"] * units, batch * s * hkv * row_blocks)
    most = triton.cdiv(ksel, max(config["min_split"], block_n))
    splits = max(1, min(want, most))
    split_n = triton.cdiv(triton.cdiv(ksel, splits), block_n) * block_n
    splits = triton.cdiv(ksel, split_n)
    attend = {
        "SCALE": float(spec.attrs()["scale"]) * _LOG2E,
        "S": s,
        "H": h,
        "HKV": hkv,
        "DK": dk,
        "RK": rk,
        "PK": pk,
        "DV": dv,
        "RV": rv,
        "PV": pv,
        "BS": bs,
        "CTX_BLOCKS": ctx_blocks,
        "KSEL": ksel,
        "NUM_SPLITS": splits,
        "SPLIT_N": split_n,
        "BLOCK_N": block_n,
        "ROWS": rows,
        "ROW_BLOCKS": row_blocks,
        "SAME_KV": node.inputs[1] == node.inputs[2],
        "IEEE": str(q_t.dtype) == "f32",
    }
    reduce = {"DV": dv, "RV": rv, "PV": pv, "NUM_SPLITS": splits, "SPLITS_P2": triton.next_power_of_2(splits)}
    dedup = {"T": ctx_blocks * bs, "KSEL": ksel, "KSP": triton.next_power_of_2(ksel)}
    return attend, reduce, dedup


def _options(config: dict[str, Any], traits: Any, warps: str, stages: int | None = None) -> dict[str, Any]:
    return {
        "num_warps": config[warps],
        "num_stages": config["num_stages"] if stages is None else stages,
        **_t.extra_options(config, traits),
    }


def _reduce_options(reduce: dict[str, Any]) -> dict[str, Any]:
    warps = max(1, min(8, reduce["SPLITS_P2"] * reduce["DV"] // 1024))
    return {"num_warps": warps, "num_stages": 1}


def _build_topk(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    args = spec.args(spec.single)
    cache: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    score_opts = _options(config, traits, "score_warps")
    select_opts = _options(config, traits, "select_warps", 1)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        q, kc, w, table, pos = (inputs[i].contiguous() for i in args)
        out = outputs[0]
        batch, s = pos.shape
        ctx_blocks = table.shape[1]
        if batch * s == 0:
            return
        if ctx_blocks == 0:
            out.fill_(-1)
            return
        if ctx_blocks not in cache:
            cache[ctx_blocks] = _topk_params(spec, ctx_blocks, config)
        score, select = cache[ctx_blocks]
        rows, t = batch * s, select["T"]
        # scratch from torch's caching allocator (a CUDA graph capture serves it from its pool)
        scores = torch.empty((rows, t), dtype=torch.float32, device=q.device)  # [B * S, T]
        keys = torch.empty((rows, select["KP"]), dtype=torch.int64, device=q.device)  # [B * S, KP]
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        _index_score_kernel[(rows, triton.cdiv(t, score["BLOCK_T"]))](
            q, kc, w, table, pos, scores, **score, **score_opts
        )
        _topk_select_kernel[(rows,)](scores, pos, keys, o, **select, **select_opts)
        if o is not out:
            out.copy_(o)

    return launch


def _build_attention(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    args = spec.args(spec.single)
    cache: dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}
    options = _options(config, traits, "num_warps")
    dedup_opts = _options(config, traits, "select_warps", 1)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        q, kc, vc, table, pos, sel = (inputs[i].contiguous() for i in args)
        out = outputs[0]
        batch, s, h, _ = q.shape
        ctx_blocks = table.shape[1]
        if batch * s == 0:
            return
        key = (batch, ctx_blocks)
        if key not in cache:
            cache[key] = _attn_params(spec, batch, max(ctx_blocks, 1), config, traits)
        attend, reduce, dedup = cache[key]
        if ctx_blocks == 0:  # no position to attend to (the reference's 0 / 0)
            out.fill_(float("nan"))
            return
        dv, splits = attend["DV"], attend["NUM_SPLITS"]
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        if splits == 1:
            part_acc = part_m = part_l = o  # never touched: the kernel writes o
        else:
            part_acc = torch.empty((batch * s * h, splits, dv), dtype=torch.float32, device=q.device)
            part_m = torch.empty((batch * s * h, splits), dtype=torch.float32, device=q.device)
            part_l = torch.empty((batch * s * h, splits), dtype=torch.float32, device=q.device)
        ksel = attend["KSEL"]
        keys = torch.empty((batch * s, dedup["KSP"]), dtype=torch.int64, device=q.device)
        distinct = torch.empty((batch * s, ksel), dtype=torch.int32, device=q.device)
        _dedup_kernel[(batch * s,)](sel, keys, distinct, **dedup, **dedup_opts)
        grid = (batch * s, attend["HKV"] * attend["ROW_BLOCKS"], splits)
        _index_attn_kernel[grid](
            q, kc, vc, table, pos, distinct, o, part_acc, part_m, part_l, **attend, **options
        )
        if splits > 1:
            _index_reduce_kernel[(batch * s * h,)](
                part_acc, part_m, part_l, o, **reduce, **_reduce_options(reduce)
            )
        if o is not out:
            out.copy_(o)

    return launch


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    if spec.single.op == "indexer_topk":
        return _build_topk(spec, config, traits)
    return _build_attention(spec, config, traits)


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    node = spec.single
    types = [spec.types[v] for v in node.inputs]
    batch = types[0].shape[0]
    ctx_blocks = types[3].shape[1]
    if not (isinstance(batch, int) and isinstance(ctx_blocks, int)):
        raise ValueError(
            f"sparse_attention compiles for a concrete batch and ctx_blocks; got q {types[0]}, block_table "
            f"{types[3]} (specialize the graph to a traffic bucket first)"
        )
    sig = ["*" + _TRITON_DTYPE[str(t.dtype)] for t in types]
    if node.op == "indexer_topk":
        score, select = _topk_params(spec, ctx_blocks, config)
        score_sig = dict(zip(("q_ptr", "k_ptr", "w_ptr", "table_ptr", "pos_ptr"), sig, strict=True))
        score_sig |= {"score_ptr": "*fp32", **{name: "constexpr" for name in score}}
        select_sig = {"score_ptr": "*fp32", "pos_ptr": sig[4], "key_ptr": "*i64", "out_ptr": "*i32"}
        select_sig |= {name: "constexpr" for name in select}
        return [
            CompileUnit(
                "sparse_attention.index_scores", _index_score_kernel, score_sig, score,
                _options(config, traits, "score_warps"),
            ),
            CompileUnit(
                "sparse_attention.topk_select", _topk_select_kernel, select_sig, select,
                _options(config, traits, "select_warps", 1),
            ),
        ]  # fmt: skip
    attend, reduce, dedup = _attn_params(spec, batch, ctx_blocks, config, traits)
    data = sig[0]
    partial = "*fp32" if attend["NUM_SPLITS"] > 1 else data
    dedup_sig = {
        "sel_ptr": sig[5],
        "key_ptr": "*i64",
        "out_ptr": "*i32",
        **{name: "constexpr" for name in dedup},
    }
    attend_sig = dict(zip(("q_ptr", "k_ptr", "v_ptr", "table_ptr", "pos_ptr"), sig[:5], strict=True))
    attend_sig |= {
        "sel_ptr": "*i32",
        "out_ptr": data,
        "part_acc_ptr": partial,
        "part_m_ptr": partial,
        "part_l_ptr": partial,
    }
    attend_sig |= {name: "constexpr" for name in attend}
    units = [
        CompileUnit(
            "sparse_attention.dedup",
            _dedup_kernel,
            dedup_sig,
            dedup,
            _options(config, traits, "select_warps", 1),
        ),
        CompileUnit(
            "sparse_attention.attend",
            _index_attn_kernel,
            attend_sig,
            attend,
            _options(config, traits, "num_warps"),
        ),
    ]
    if attend["NUM_SPLITS"] > 1:
        reduce_sig = {"part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "out_ptr": data}
        reduce_sig |= {name: "constexpr" for name in reduce}
        units.append(
            CompileUnit(
                "sparse_attention.reduce", _index_reduce_kernel, reduce_sig, reduce, _reduce_options(reduce)
            )
        )
    return units
