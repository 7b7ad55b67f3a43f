"""Multi-head latent attention (DeepSeek-V3, Kimi-K2) over the paged latent cache: flash-decoding with
every query head sharing one KV head whose entry is [latent c (R), roped key k_pe (P)].

cache_attention where the cache has one KV head of width D = R + P (R = kv_lora_rank, P =
qk_rope_head_dim; 512 + 64 on DeepSeek-V3) and k_cache and v_cache are the same value (the graph's
`mla` in polymorph/models/decoder.py). D is not a power of two, so the entry is handled as its two
power-of-two parts: scores = q_R . c + q_P . k_pe (two tl.dot's), and the value is the whole entry,
out = sum_t p_t [c_t, k_pe_t] (two accumulators, [rows, R] and [rows, P]). Token (b, s) attends to
logical positions t <= positions[b, s] of sequence b, whose cache blocks are block_table[b, :].

The kernels:
  split   grid (row tiles, splits, batch). A program holds BLOCK_H consecutive (token, head) rows of
          one sequence (s-major: at S = 1 a tile of heads; at S > 1 a tile may hold two tokens' heads),
          so each cache tile it reads serves all of them (the point of MLA: one KV head for 128 query
          heads), and walks its share of the sequence's tokens BLOCK_N at a time through block_table.
          Programs of one split sit next to each other in the grid (the tile index is the fastest),
          so the head tiles reading the same cache rows run together and share them in L2. Online
          softmax in fp32 (exp2, scale folded with log2 e); with several splits it writes the
          unnormalised partial (acc, max, sumexp) per split, with one it writes the output. A split
          past the end of its rows' context (ragged contexts: length max positions + 1) exits at once.
  reduce  grid (batch * S * H,): merges a row's valid splits, CHUNK_D of the D columns at a time.
The keys' c and k_pe tiles, loaded once, are also the values; where k_cache and v_cache are distinct
values (equal types, one KV head) the values are loaded from v_cache (SAME_KV off). A P below 16 (a
tl.dot's least width) takes its two products as broadcast sums instead (the tiny test models' P = 8).
Where the target takes programmatic dependent launch (_pdl.py) every kernel waits for its predecessor
(griddepcontrol.wait) in every program before any read, as decode_attention.py does.

Splits (`_split_plan`) are chosen at build/launch from ctx_blocks so that row tiles x batch x splits
is about `ctas_per_cu` programs per SM/CU, no split shorter than `min_split_tokens`; BLOCK_N is lowered
for a split shorter than the config's. At DeepSeek-V3's decode (H 128, batch 1, 4k context) on an H200
with the first config: 8 head tiles x 32 splits of 128 tokens.

Constraints (supports): cuda or rocm; one cache_attention node, no window, chunk, softcap or sinks;
q and the caches of one float dtype (f32, bf16, f16); the caches of one type with one KV head;
D = R + P with R a power of two in [16, 512] and P a power of two in [8, 128] (the split of D is the
one with the largest power of two R < D: any split computes the same attention); block table and
positions i32 or i64; S >= 1 query tokens per sequence (concrete, or symbolic: read at launch);
concrete heads and block size.

Config keys: block_h (query rows per program, rounded up to a power of two >= 16), block_n (cache
tokens per step), min_split_tokens, ctas_per_cu, num_warps, num_stages; the arch's launch options
(waves_per_eu).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "cache_attention"

# Written for 32-wide warps (not measured on a device): 16 heads a program keep the [16, 512] fp32
# latent accumulator at 32 registers a lane under 8 warps; 32-token cache tiles (36 KiB of bf16) in
# two stages.
_WARP32_CONFIGS = [
    {"block_h": 16, "block_n": 32, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 8, "num_stages": 2},
    {"block_h": 16, "block_n": 64, "min_split_tokens": 128, "ctas_per_cu": 2, "num_warps": 8, "num_stages": 2},
    {"block_h": 32, "block_n": 32, "min_split_tokens": 64, "ctas_per_cu": 1, "num_warps": 8, "num_stages": 2},
    {"block_h": 16, "block_n": 32, "min_split_tokens": 64, "ctas_per_cu": 4, "num_warps": 4, "num_stages": 3},
]  # fmt: skip
# Written for 64-wide waves (CDNA; not measured): 16-token tiles keep the cache tile and its transposed
# copy within gfx942's 64 KiB of LDS.
_WAVE64_CONFIGS = [
    {"block_h": 16, "block_n": 16, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1},
    {"block_h": 16, "block_n": 32, "min_split_tokens": 64, "ctas_per_cu": 2, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1},
    {"block_h": 32, "block_n": 16, "min_split_tokens": 64, "ctas_per_cu": 1, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS

_TRITON_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i32": "i32", "i64": "i64"}
_FLOATS = ("f32", "bf16", "f16")
_LOG2E = 1.4426950408889634
_MAX_R, _MAX_P = 512, 128

# Triton's interpreter multiplies bfloat16 bit patterns in tl.dot (triton-lang/triton#11584): there, and
# only there, the dots run on operands upcast to fp32 (exact), and p is rounded to bf16 to nearest even
# as compiled code does (the interpreter truncates). Read when the module is loaded.
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_UPCAST_DOT = _i.INTERPRETED
# Configs and launch options per chip, from its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
# Programmatic dependent launch where the arch and the installed Triton take it (see _pdl.py).
_g = depend("triton/_pdl.py", "7809e3ede67d44565604f0e698b9a8bf3482361de988ea8e9015fe96a0627986")


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits)


@triton.jit
def _latent_split_kernel(
    q_ptr,  # [B, S, H, D], D = R + P
    k_ptr,  # [cache_blocks, BS, 1, D]
    v_ptr,  # [cache_blocks, BS, 1, D] (k_ptr itself when SAME_KV)
    table_ptr,  # [B, CTX_BLOCKS] int
    pos_ptr,  # [B, S] int
    out_ptr,  # [B, S, H, D], written when NUM_SPLITS == 1
    part_acc_ptr,  # [B * S * H, NUM_SPLITS, D] f32 unnormalised sum p [c, k_pe], when NUM_SPLITS > 1
    part_m_ptr,  # [B * S * H, NUM_SPLITS] f32 running max (log2 domain)
    part_l_ptr,  # [B * S * H, NUM_SPLITS] f32 sum of exp2
    SCALE: tl.constexpr,  # softmax scale * log2(e)
    S: tl.constexpr,
    H: tl.constexpr,
    R: tl.constexpr,  # the latent part of an entry (a power of two >= 16)
    P: tl.constexpr,  # the roped key part (a power of two)
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,  # a whole number of BLOCK_N tiles
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,  # (token, head) rows per program, a power of two >= 16
    SAME_KV: tl.constexpr,  # the values are the keys' entries (k_cache is v_cache)
    IEEE: tl.constexpr,  # f32 inputs: full-precision dots, not tf32
    USE_GDC: tl.constexpr,  # launched with PDL: wait for the previous kernel before reading q or the cache
):
    tile = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2)
    if USE_GDC:  # every program, before any read or early exit (_pdl.py)
        _g.gdc_wait()
        _g.gdc_launch_dependents()
    D: tl.constexpr = R + P
    PE_DOT: tl.constexpr = P >= 16  # narrower than a tl.dot tile: broadcast sums

    flat = tile * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H] (s, h) of the row, s-major
    row_ok = flat < S * H
    s = flat // H
    pos = tl.load(pos_ptr + b * S + s, mask=row_ok, other=-1).to(tl.int32)  # [BLOCK_H]
    n_tok = tl.minimum(tl.max(pos, axis=0) + 1, CTX_BLOCKS * BS)  # tokens this tile's rows may see
    start = sp * SPLIT_TOKENS
    if NUM_SPLITS > 1:  # noqa: SIM102 (a constexpr test apart from the runtime one)
        if start >= n_tok:  # past the end of every row's context: the reduce reads no partial of it
            return
    end = tl.minimum(start + SPLIT_TOKENS, n_tok)

    row = (b * (S * H) + flat).to(tl.int64)  # [BLOCK_H] index of (b, s, h)
    dr = tl.arange(0, R)
    dp = tl.arange(0, P)
    q_c = tl.load(q_ptr + row[:, None] * D + dr[None, :], mask=row_ok[:, None], other=0.0)  # [BLOCK_H, R]
    q_pe = tl.load(
        q_ptr + row[:, None] * D + R + dp[None, :], mask=row_ok[:, None], other=0.0
    )  # [BLOCK_H, P]

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_c = tl.zeros([BLOCK_H, R], tl.float32)
    acc_pe = tl.zeros([BLOCK_H, P], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + n  # [BLOCK_N] logical token
        t_ok = t < end  # a slot past the end is never read (it may hold anything, NaN included)
        blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS, mask=t_ok, other=0)
        kv = (blk.to(tl.int64) * BS + t % BS) * D  # [BLOCK_N] cache entry offset (one KV head)
        c = tl.load(k_ptr + kv[:, None] + dr[None, :], mask=t_ok[:, None], other=0.0)  # [BLOCK_N, R]
        k_pe = tl.load(k_ptr + kv[:, None] + R + dp[None, :], mask=t_ok[:, None], other=0.0)  # [BLOCK_N, P]
        if IEEE:
            qk = tl.dot(q_c, tl.trans(c), input_precision="ieee")  # [BLOCK_H, BLOCK_N] f32
        elif _UPCAST_DOT:
            qk = tl.dot(q_c.to(tl.float32), tl.trans(c).to(tl.float32))
        else:
            qk = tl.dot(q_c, tl.trans(c))
        if not PE_DOT:
            qk += tl.sum(q_pe.to(tl.float32)[:, None, :] * k_pe.to(tl.float32)[None, :, :], axis=2)
        elif IEEE:
            qk = tl.dot(q_pe, tl.trans(k_pe), qk, input_precision="ieee")
        elif _UPCAST_DOT:
            qk = tl.dot(q_pe.to(tl.float32), tl.trans(k_pe).to(tl.float32), qk)
        else:
            qk = tl.dot(q_pe, tl.trans(k_pe), qk)
        visible = t_ok[None, :] & (t[None, :] <= pos[:, None])  # [BLOCK_H, BLOCK_N] causal
        qk = tl.where(visible, qk * SCALE, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not SAME_KV:
            c = tl.load(v_ptr + kv[:, None] + dr[None, :], mask=t_ok[:, None], other=0.0)
            k_pe = tl.load(v_ptr + kv[:, None] + R + dp[None, :], mask=t_ok[:, None], other=0.0)
        acc_c = acc_c * alpha[:, None]
        acc_pe = acc_pe * alpha[:, None]
        if IEEE:
            acc_c = tl.dot(p, c, acc_c, input_precision="ieee")
            if PE_DOT:
                acc_pe = tl.dot(p, k_pe, acc_pe, input_precision="ieee")
            else:
                acc_pe += tl.sum(p[:, :, None] * k_pe[None, :, :], axis=1)
        elif _UPCAST_DOT:
            if c.dtype == tl.bfloat16:  # round p to nearest even, as compiled code does
                pb = p.to(tl.uint32, bitcast=True).to(tl.int64)  # (the interpreter truncates)
                p = (
                    (((pb + 0x7FFF + ((pb >> 16) & 1)) >> 16) << 16)
                    .to(tl.uint32)
                    .to(tl.float32, bitcast=True)
                )
            pv = p.to(c.dtype).to(tl.float32)
            acc_c = tl.dot(pv, c.to(tl.float32), acc_c)
            if PE_DOT:
                acc_pe = tl.dot(pv, k_pe.to(tl.float32), acc_pe)
            else:
                acc_pe += tl.sum(pv[:, :, None] * k_pe.to(tl.float32)[None, :, :], axis=1)
        else:
            pv = p.to(c.dtype)
            acc_c = tl.dot(pv, c, acc_c)
            if PE_DOT:
                acc_pe = tl.dot(pv, k_pe, acc_pe)
            else:
                acc_pe += tl.sum(pv.to(tl.float32)[:, :, None] * k_pe.to(tl.float32)[None, :, :], axis=1)
        m_i = m_new

    if NUM_SPLITS == 1:
        inv = 1.0 / tl.where(row_ok, l_i, 1.0)  # padding rows saw nothing (l 0) and are not stored
        ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + row[:, None] * D + dr[None, :], _i.round_to(acc_c * inv[:, None], ty),
                 mask=row_ok[:, None])  # fmt: skip
        tl.store(out_ptr + row[:, None] * D + R + dp[None, :], _i.round_to(acc_pe * inv[:, None], ty),
                 mask=row_ok[:, None])  # fmt: skip
    else:
        part = row * NUM_SPLITS + sp  # [BLOCK_H]
        tl.store(part_acc_ptr + part[:, None] * D + dr[None, :], acc_c, mask=row_ok[:, None])
        tl.store(part_acc_ptr + part[:, None] * D + R + dp[None, :], acc_pe, mask=row_ok[:, None])
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)


@triton.jit
def _latent_reduce_kernel(
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
    CHUNK_D: tl.constexpr,  # columns merged at a time (a power of two dividing D)
    USE_GDC: tl.constexpr,  # launched with PDL: wait for the split kernel before reading its partials
):
    row = tl.program_id(0)  # (b * S + s) * H + h
    if USE_GDC:
        _g.gdc_wait()
        _g.gdc_launch_dependents()
    pos = tl.load(pos_ptr + row // H).to(tl.int32)
    n_tok = tl.minimum(pos + 1, CTX_BLOCKS * BS)
    n_valid = (n_tok + SPLIT_TOKENS - 1) // SPLIT_TOKENS  # splits that saw a token of this row
    j = tl.arange(0, SPLITS_P2)
    ok = j < n_valid
    part = row.to(tl.int64) * NUM_SPLITS + j
    m = tl.load(part_m_ptr + part, mask=ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=ok, other=0.0)
    w = tl.where(ok, tl.exp2(m - tl.max(m, axis=0)), 0.0)  # [SPLITS_P2]
    inv = 1.0 / tl.sum(l * w, axis=0)
    d = tl.arange(0, CHUNK_D)
    for d0 in range(0, D, CHUNK_D):
        acc = tl.load(part_acc_ptr + part[:, None] * D + d0 + d[None, :], mask=ok[:, None], other=0.0)
        out = tl.sum(acc * w[:, None], axis=0) * inv
        tl.store(out_ptr + row.to(tl.int64) * D + d0 + d, _i.round_to(out, out_ptr.dtype.element_ty))


# --- choosing the work split -------------------------------------------------------------------------


def _split_plan(
    batch: int, tiles: int, ctx_tokens: int, config: dict[str, Any], units: int
) -> tuple[int, int, int]:
    """(splits, tokens per split, BLOCK_N): enough programs to put `ctas_per_cu` on every SM/CU, no
    split shorter than `min_split_tokens`, BLOCK_N the config's or the split's length if that is
    shorter (at least 16, a tl.dot tile), each split a whole number of BLOCK_N tiles."""
    want = triton.cdiv(config["ctas_per_cu"] * units, batch * tiles)
    most = triton.cdiv(ctx_tokens, config["min_split_tokens"])
    splits = max(1, min(want, most))
    tokens = triton.cdiv(ctx_tokens, splits)
    block_n = min(config["block_n"], max(16, 1 << (tokens.bit_length() - 1)))  # largest power of 2 <= tokens
    split_tokens = triton.cdiv(tokens, block_n) * block_n
    return triton.cdiv(ctx_tokens, split_tokens), split_tokens, block_n


# --- the contract -------------------------------------------------------------------------------------


def _is_pow2(x: Any) -> bool:
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def _parts(d: Any) -> tuple[int, int] | None:
    """(R, P) of an entry of width d: R the largest power of two below d, P = d - R a power of two
    (576 -> 512 + 64), within the sizes the kernel is written for; None otherwise (a power-of-two d is
    a plain head, decode_attention.py's). Any split of d into two contiguous parts computes the same
    attention (q.k and the value entry are sums and concatenations over d), so a model whose latent
    part is the narrower one (R < P) is split the other way round, correctly."""
    if not isinstance(d, int) or d < 24 or _is_pow2(d):
        return None
    r = 1 << (d.bit_length() - 1)
    p = d - r
    if not (16 <= r <= _MAX_R and _is_pow2(p) and 8 <= p <= _MAX_P):
        return None
    return r, p


def supports(spec: Any) -> bool:
    if len(spec.nodes) != 1 or spec.single.op != "cache_attention" or not spec.target.is_gpu:
        return False
    node = spec.single
    if len(node.inputs) != 5:  # no sinks
        return False
    q, kc, vc, table, pos = (spec.types[v] for v in node.inputs)
    if q.rank != 4 or kc.rank != 4:
        return False
    _, s, h, d = q.shape
    _, bs, hkv, dc = kc.shape
    attrs = spec.attrs()
    return (
        set(attrs) <= {"scale", "window", "softcap", "chunk"}
        and not attrs.get("window")
        and not attrs.get("chunk")
        and not attrs.get("softcap")
        and str(q.dtype) in _FLOATS
        and kc.dtype == q.dtype
        and vc == kc
        and str(table.dtype) in ("i32", "i64")
        and str(pos.dtype) in ("i32", "i64")
        and (not isinstance(s, int) or s >= 1)
        and isinstance(h, int)
        and h >= 1
        and hkv == 1
        and isinstance(bs, int)
        and bs >= 1
        and dc == d
        and _parts(d) is not None
    )


def _params(
    s: int,
    h: int,
    d: int,
    bs: int,
    batch: int,
    ctx_blocks: int,
    scale: float,
    dtype: str,
    same_kv: bool,
    config: dict[str, Any],
    traits: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The split and reduce kernels' constexprs for one concrete shape."""
    r, p = _parts(d)  # type: ignore[misc]
    gdc = _g.enabled(traits)
    block_h = max(16, triton.next_power_of_2(config["block_h"]))
    tiles = triton.cdiv(s * h, block_h)
    splits, split_tokens, block_n = _split_plan(batch, tiles, ctx_blocks * bs, config, traits.units)
    split = {
        "SCALE": float(scale) * _LOG2E,
        "S": s,
        "H": h,
        "R": r,
        "P": p,
        "BS": bs,
        "CTX_BLOCKS": ctx_blocks,
        "NUM_SPLITS": splits,
        "SPLIT_TOKENS": split_tokens,
        "BLOCK_N": block_n,
        "BLOCK_H": block_h,
        "SAME_KV": bool(same_kv),
        "IEEE": dtype == "f32",
        "USE_GDC": gdc,
    }
    splits_p2 = triton.next_power_of_2(splits)
    reduce = {
        "H": h,
        "D": d,
        "BS": bs,
        "CTX_BLOCKS": ctx_blocks,
        "NUM_SPLITS": splits,
        "SPLITS_P2": splits_p2,
        "SPLIT_TOKENS": split_tokens,
        # about 4k fp32 partials in registers at a time; a power of two dividing both parts of D
        "CHUNK_D": min(p, max(1, 4096 // splits_p2)),
        "USE_GDC": gdc,
    }
    return split, reduce


def _grid(split: dict[str, Any], batch: int) -> tuple[int, int, int]:
    return (triton.cdiv(split["S"] * split["H"], split["BLOCK_H"]), split["NUM_SPLITS"], batch)


def _options(config: dict[str, Any], traits: Any) -> dict[str, Any]:
    return {
        "num_warps": config["num_warps"],
        "num_stages": config["num_stages"],
        **_t.extra_options(config, traits),
        **_g.launch_options(traits),
    }


def _reduce_options(reduce: dict[str, Any], traits: Any) -> dict[str, Any]:
    warps = max(1, min(4, reduce["SPLITS_P2"] * reduce["CHUNK_D"] // 1024))
    return {"num_warps": warps, "num_stages": 1, **_g.launch_options(traits)}


def _same_kv(spec: Any) -> bool:
    node = spec.single
    return node.inputs[1] == node.inputs[2]


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    node = spec.single
    args = spec.args(node)
    scale = spec.attrs()["scale"]
    q_t, kc_t = spec.types[node.inputs[0]], spec.types[node.inputs[1]]
    _, _, h, d = q_t.shape
    bs = kc_t.shape[1]
    dtype = str(q_t.dtype)
    same_kv = _same_kv(spec)
    cache: dict[
        tuple[int, int, int], tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]
    ] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        q, kc, vc, table, pos = (inputs[i].contiguous() for i in args[:5])
        out = outputs[0]
        batch, s = q.shape[0], q.shape[1]
        ctx_blocks = table.shape[1]
        if batch == 0 or s == 0 or ctx_blocks == 0:
            return
        key = (batch, s, ctx_blocks)
        if key not in cache:
            split, reduce = _params(s, h, d, bs, batch, ctx_blocks, scale, dtype, same_kv, config, traits)
            cache[key] = (split, _options(config, traits), reduce, _reduce_options(reduce, traits))
        split, options, reduce, reduce_options = cache[key]
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        splits = split["NUM_SPLITS"]
        if splits == 1:
            part_acc = part_m = part_l = o  # never touched: the kernel writes o directly
        else:
            part_acc = torch.empty((batch * s * h, splits, d), dtype=torch.float32, device=q.device)
            part_m = torch.empty((batch * s * h, splits), dtype=torch.float32, device=q.device)
            part_l = torch.empty((batch * s * h, splits), dtype=torch.float32, device=q.device)
        _latent_split_kernel[_grid(split, batch)](
            q, kc, kc if same_kv else vc, table, pos, o, part_acc, part_m, part_l, **split, **options
        )  # fmt: skip
        if splits > 1:
            _latent_reduce_kernel[(batch * s * h,)](
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
    bs = kc_t.shape[1]
    ctx_blocks = table_t.shape[1]
    if not (isinstance(batch, int) and isinstance(s, int) and isinstance(ctx_blocks, int)):
        raise ValueError(
            f"latent_attention compiles for a concrete batch, seq and ctx_blocks; got q {q_t}, block_table "
            f"{table_t} (specialize the graph to a traffic bucket first)"
        )
    dtype = str(q_t.dtype)
    split, reduce = _params(
        s, h, d, bs, batch, ctx_blocks, spec.attrs()["scale"], dtype, _same_kv(spec), config, traits
    )
    data, table, pos = (
        "*" + _TRITON_DTYPE[dtype],
        "*" + _TRITON_DTYPE[str(table_t.dtype)],
        "*" + _TRITON_DTYPE[str(pos_t.dtype)],
    )
    partial = "*fp32" if split["NUM_SPLITS"] > 1 else data
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
        **{name: "constexpr" for name in split},
    }
    units = [
        CompileUnit(
            "latent_attention.split", _latent_split_kernel, split_sig, split, _options(config, traits)
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
                "latent_attention.reduce",
                _latent_reduce_kernel,
                reduce_sig,
                reduce,
                _reduce_options(reduce, traits),
            )
        )
    return units


def occupancy(
    batch: int, heads: int, ctx_tokens: int, config: dict[str, Any], traits: Any, seq: int = 1
) -> dict[str, Any]:
    """How the split heuristic fills the chip `traits` describes at one shape (for reports and the
    tuner's notes)."""
    tiles = triton.cdiv(seq * heads, max(16, triton.next_power_of_2(config["block_h"])))
    splits, split_tokens, block_n = _split_plan(batch, tiles, ctx_tokens, config, traits.units)
    ctas = batch * tiles * splits
    return {
        "splits": splits,
        "split_tokens": split_tokens,
        "block_n": block_n,
        "ctas": ctas,
        "compute_units": traits.units,
        "ctas_per_unit": ctas / traits.units,
        "waves": math.ceil(ctas / traits.units),
    }
