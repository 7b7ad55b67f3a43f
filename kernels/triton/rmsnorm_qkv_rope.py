"""rmsnorm+qkv+rope+kv_write: the attention input of one layer in one kernel. n = rmsnorm(h, w_norm);
q, k, v = n @ Wq^T, n @ Wk^T, n @ Wv^T (+ biases); rope (rotate-half, `rope_inv_freq` of each rope
node's attributes: default, linear, yarn, llama3; cos and sin times its attention factor) on the q
and k heads; k_rope and v written into the paged
caches at slot (block_table[b, pos // BS], pos % BS); q_rope written as the group's output. The cache
outputs are the state tensors themselves (the executable aliases them): only the new rows are written.

Rope pairs rows i and i + Dh/2 of a head, so a program owns whole pairs: its tile of gemv_block_n rows
interleaves the first-half row and the second-half row of gemv_block_n / 2 consecutive pairs (pair p
of a projection with H heads is row (p // (Dh/2)) * Dh + p % (Dh/2) and that plus Dh/2; a tile may span
heads). Both halves of a pair come out of one accumulator tile and rotate in registers. One launch
covers q, k and v: the first cdiv(Hq*Dh/2, pairs) programs take Wq, the next Wk, the last Wv (the
branch is uniform per program). At Llama-3.2-1B (Hq 32, Hkv 8, Dh 64, K 2048) the default GEMV
launches 768 programs, 12 MB of weights streamed with 16-byte loads. The norm is folded in as in
rmsnorm_linear.py (sum(x^2) in the same K loop, w_norm applied to the chunk, 1/rms in the epilogue).
The epilogue rounds q and k to the activation dtype before rope, where the unfused graph stores them.
cos and sin are computed from pos * inv_freq in fp32 (libdevice cosf/sinf on NVIDIA, accurate for the
large angles of long contexts). A token whose position falls outside its block table writes nothing.

Paths and tiles as in linear.py: the GEMV for M = B*S <= GEMV_MAX_M, tl.dot tiles above it (block_n
counts interleaved rows: block_n / 2 pairs). The inv_freq tables are made at build time and copied to
the device at the first launch on it (the runtime's warm-up launches run before graph capture).

Config keys: gemv_block_n (even), gemv_block_k, gemv_warps, gemv_prefetch (GEMV; `gemv_prefetch`: the
first K chunk of the weights loaded before the PDL wait, _projection.gemv_tile_prefetch); block_m, block_n, block_k,
num_warps, num_stages (GEMM); the arch's launch options (waves_per_eu) where it takes them. Each config zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; h, the weights, biases, q_rope and both caches of one float dtype
(bf16, f16, f32); positions and block_table i32; q, k and v all with a bias or none; concrete heads,
head_dim (even), block size and K; contiguous tensors with 16-byte aligned bases (checked at launch);
ropes over the whole head with frequencies fixed at build (no partial rotary, no "dynamic" or
"longrope": those groups fall back to the single-op kernels, kernels/triton/rope.py among them).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.ir.ops import rope_rotary_dim
from polymorph.ir.reference import rope_inv_freq
from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "rmsnorm+qkv+rope+kv_write"

# Measured on an H200 (M=1 bf16, Llama-3.2-1B: 12 MB of q/k/v weights): 4 rows (2 pairs) x 512 of K
# with 4 warps, 6.75 us; 2 rows x 2048 7.0 us; 8 rows 7.1 us. At this size a launch's fixed cost (about
# 2 us in a CUDA graph) is a third of the time.
_WARP32_CONFIGS = [
    # The default since an H200 sweep (bench/decode.py --sweep, 2026-11-30): the norm as its own kernel
    # on the tl.dot path (M > 2). 17.6 -> 11.6 us at M = 8, 22.8 -> 10.5 us at M = 32 against the folded
    # norm below; the GEMV (M <= 2) is the same.
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4, "norm_prologue": True,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 8, "gemv_block_k": 512, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 4, "gemv_block_k": 2048, "gemv_warps": 8,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    # The default with the first K chunk's weight loads before the PDL wait (gemv_prefetch; unmeasured).
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4, "norm_prologue": True, "gemv_prefetch": True,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3},
]  # fmt: skip
# The tl.dot epilogue (split of the accumulator, cos/sin, two cache stores) is register-heavy: 64 x 128
# tiles on 8 warps compile without spills on both targets (177 registers on sm_90, 118 VGPRs on
# gfx942); 128 x 128 spills on gfx942.
_WAVE64_CONFIGS = [  # written for 64-wide waves
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 4, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 8,
     "block_m": 64, "block_n": 128, "block_k": 32, "num_warps": 8, "num_stages": 2, "waves_per_eu": 0},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS


def configs(traits: Any) -> list[dict[str, Any]]:
    return _p.configs(_WARP32_CONFIGS, _WAVE64_CONFIGS, traits)


# The projection core (tiles, paths, the norm's row kernel) shared with the other projection files,
# pinned by content hash.
_p = depend("triton/_projection.py", "f1c538360559b1c984c3825d678bd34fba79798a6e93c2b508f82df2d975d001")
_to, _gemv_tile, _gemm_tile = _p.round_to, _p.gemv_tile, _p.gemm_tile  # called by this file's kernels


# --- the kernel --------------------------------------------------------------------------------------


@triton.jit
def _qkv_part(h_ptr, wn_ptr, w_ptr, b_ptr, inv_ptr, pos_ptr, table_ptr, out_ptr, pair0, offs_m,
              M, S, CTX_BLOCKS, eps, af, K: tl.constexpr, H: tl.constexpr, DH: tl.constexpr,
              BS: tl.constexpr, ROPE: tl.constexpr, TO_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr,
              USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr,
              NORM: tl.constexpr, PREFETCH: tl.constexpr, USE_GDC: tl.constexpr):  # fmt: skip
    """One projection's BLOCK_N / 2 rope pairs from pair0 on, for rows offs_m: norm, GEMV/GEMM, bias,
    rounding, rope (ROPE), and the store into q_rope [M, H*DH] or a paged cache (TO_CACHE)."""
    HALF: tl.constexpr = DH // 2
    PAIRS: tl.constexpr = BLOCK_N // 2
    NPAIRS: tl.constexpr = H * HALF
    j = tl.arange(0, BLOCK_N)
    p = tl.minimum(pair0 + j // 2, NPAIRS - 1)  # tail pairs repeat the last, never stored
    row = (p // HALF) * DH + p % HALF + (j % 2) * HALF  # interleaved: first half, second half
    w_rows = w_ptr + row * K
    x_rows = h_ptr + tl.minimum(offs_m, M - 1) * K  # padding rows (m >= M) repeat row M-1, never stored
    if USE_DOT:
        acc, ss = _gemm_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    elif PREFETCH:  # the tile waits for the previous kernel (PDL) after its first weight loads
        acc, ss = _p.gemv_tile_prefetch(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                                        HINT, USE_GDC)  # fmt: skip
    else:
        acc, ss = _gemv_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    if NORM:
        y = acc / tl.sqrt(ss / K + eps)[:, None]
    else:  # h is already the normalized activation (the norm_prologue path)
        y = acc
    if HAS_BIAS:
        y += tl.load(b_ptr + row).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    y = _to(y, dtype).to(tl.float32)  # the projection as the unfused graph stores it
    x1, x2 = tl.split(tl.reshape(y, [BLOCK_M, PAIRS, 2]))  # [BLOCK_M, PAIRS]: halves i and i + Dh/2
    pr = pair0 + tl.arange(0, PAIRS)
    prc = tl.minimum(pr, NPAIRS - 1)
    r1 = (prc // HALF) * DH + prc % HALF  # [PAIRS]
    m_c = tl.minimum(offs_m, M - 1)
    pos = tl.load(pos_ptr + m_c)  # [BLOCK_M] i32
    if ROPE:
        inv = tl.load(inv_ptr + prc % HALF)  # [PAIRS] fp32
        angle = pos.to(tl.float32)[:, None] * inv[None, :]
        cos = tl.cos(angle) * af  # the attention factor; 1 multiplies exactly
        sin = tl.sin(angle) * af
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
    else:
        o1 = x1
        o2 = x2
    ok = (offs_m < M)[:, None] & (pr < NPAIRS)[None, :]
    if TO_CACHE:
        logical = pos // BS
        valid = (offs_m < M) & (pos >= 0) & (logical < CTX_BLOCKS)
        block = tl.load(table_ptr + (m_c // S) * CTX_BLOCKS + logical, mask=valid, other=0)
        base = (block.to(tl.int64) * BS + pos % BS) * (H * DH)  # [BLOCK_M]: the token's cache row
        ok = ok & valid[:, None]
    else:
        base = offs_m.to(tl.int64) * (H * DH)
    offs = base[:, None] + r1[None, :]  # [BLOCK_M, PAIRS]: the first halves; + HALF the second
    tl.store(out_ptr + tl.join(offs, offs + HALF), _to(tl.join(o1, o2), dtype), mask=tl.join(ok, ok))


@triton.jit(do_not_specialize=["M", "S", "CTX_BLOCKS"])
def _rmsnorm_qkv_rope(h_ptr, wn_ptr, wq_ptr, wk_ptr, wv_ptr, bq_ptr, bk_ptr, bv_ptr, invq_ptr, invk_ptr,
                      pos_ptr, table_ptr, q_ptr, kc_ptr, vc_ptr, M, S, CTX_BLOCKS, eps, afq, afk,
                      K: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, DH: tl.constexpr,
                      BS: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVEN_K: tl.constexpr, HINT: tl.constexpr, NORM: tl.constexpr, PREFETCH: tl.constexpr,
                      USE_GDC: tl.constexpr):  # fmt: skip
    # launched with PDL: every program waits for the previous kernel before any read (_pdl.py); with
    # PREFETCH the GEMV tile waits instead, after its first weight loads
    if USE_GDC and not PREFETCH:
        _p.gdc_wait()
        _p.gdc_launch_dependents()
    # h: [M, K]; wq: [HQ*DH, K]; wk, wv: [HKV*DH, K]; positions: [B, S]; block_table: [B, CTX_BLOCKS];
    # q: [M, HQ*DH]; caches: [blocks, BS, HKV, DH]
    PAIRS: tl.constexpr = BLOCK_N // 2
    NQ: tl.constexpr = (HQ * DH // 2 + PAIRS - 1) // PAIRS
    NK: tl.constexpr = (HKV * DH // 2 + PAIRS - 1) // PAIRS
    pid = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    if pid < NQ:
        _qkv_part(h_ptr, wn_ptr, wq_ptr, bq_ptr, invq_ptr, pos_ptr, table_ptr, q_ptr, pid * PAIRS, offs_m,
                  M, S, CTX_BLOCKS, eps, afq, K, HQ, DH, BS, True, False, HAS_BIAS,
                  USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT, NORM, PREFETCH, USE_GDC)  # fmt: skip
    elif pid < NQ + NK:
        _qkv_part(h_ptr, wn_ptr, wk_ptr, bk_ptr, invk_ptr, pos_ptr, table_ptr, kc_ptr, (pid - NQ) * PAIRS,
                  offs_m, M, S, CTX_BLOCKS, eps, afk, K, HKV, DH, BS, True, True, HAS_BIAS,
                  USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT, NORM, PREFETCH, USE_GDC)  # fmt: skip
    else:
        _qkv_part(h_ptr, wn_ptr, wv_ptr, bv_ptr, invk_ptr, pos_ptr, table_ptr, vc_ptr,
                  (pid - NQ - NK) * PAIRS, offs_m, M, S, CTX_BLOCKS, eps, 1.0, K, HKV, DH, BS, False, True,
                  HAS_BIAS, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT, NORM, PREFETCH, USE_GDC)  # fmt: skip


# --- the contract ------------------------------------------------------------------------------------

_STEPS = ("norm", "q", "k", "v", "q_rope", "k_rope", "k_write", "v_write")


def _parts(spec: Any) -> dict[str, Any]:
    return {step: spec.role(step) for step in _STEPS}


def _dims(spec: Any, p: dict[str, Any]) -> dict[str, Any]:
    _, _, hq, dh = spec.types[p["q_rope"].outputs[0]].shape
    cache = spec.types[p["k_write"].inputs[0]].shape
    return {
        "K": spec.types[p["norm"].inputs[1]].shape[0],
        "HQ": hq,
        "HKV": cache[2],
        "DH": dh,
        "BS": cache[1],
    }


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or spec.pattern != "rmsnorm+qkv+rope+kv_write":
        return False
    try:
        p = _parts(spec)
    except KeyError:  # a group without the pattern's roles
        return False
    floats = {v for s in ("norm", "q", "k", "v") for v in (*p[s].inputs, *p[s].outputs)}
    floats |= {p["q_rope"].outputs[0], p["k_write"].inputs[0], p["v_write"].inputs[0]}
    dtypes = {spec.types[v].dtype for v in floats}
    ints = {spec.types[v].dtype for v in (p["k_write"].inputs[2], p["k_write"].inputs[3])}
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _p.FLOATS or {str(d) for d in ints} != {"i32"}:
        return False
    d = _dims(spec, p)
    if not all(isinstance(v, int) for v in d.values()) or d["DH"] % 2:
        return False
    for step in ("q_rope", "k_rope"):  # frequencies fixed at build, over the whole head
        attrs = spec.attrs(p[step])
        if attrs["rope_type"] in ("dynamic", "longrope") or rope_rotary_dim(attrs, d["DH"]) != d["DH"]:
            return False
    if spec.types[p["v_write"].inputs[0]].shape[1:] != (d["BS"], d["HKV"], d["DH"]):
        return False
    n_total = (d["HQ"] + 2 * d["HKV"]) * d["DH"]
    return (
        spec.types[p["q"].inputs[1]].shape == (d["HQ"] * d["DH"], d["K"])
        and spec.types[p["k"].inputs[1]].shape == (d["HKV"] * d["DH"], d["K"])
        and spec.types[p["v"].inputs[1]].shape == (d["HKV"] * d["DH"], d["K"])
        and len({len(p[s].inputs) for s in ("q", "k", "v")}) == 1
        and n_total * d["K"] < 2**31
        and all(c["gemv_block_n"] % 2 == 0 and c["block_n"] % 2 == 0 for c in configs(spec.traits))
    )


def _grid_n(d: dict[str, Any], block_n: int) -> int:
    pairs = block_n // 2
    return triton.cdiv(d["HQ"] * d["DH"] // 2, pairs) + 2 * triton.cdiv(d["HKV"] * d["DH"] // 2, pairs)


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    p = _parts(spec)
    d = _dims(spec, p)
    has_bias = len(p["q"].inputs) == 3
    h_i, wn_i = spec.args(p["norm"])
    w_i = [spec.inputs.index(p[s].inputs[1]) for s in ("q", "k", "v")]
    b_i = [spec.inputs.index(p[s].inputs[2]) for s in ("q", "k", "v")] if has_bias else w_i
    pos_i = spec.inputs.index(p["q_rope"].inputs[1])
    table_i = spec.inputs.index(p["k_write"].inputs[2])
    q_out = spec.outputs.index(p["q_rope"].outputs[0])
    k_out = spec.outputs.index(p["k_write"].outputs[0])
    v_out = spec.outputs.index(p["v_write"].outputs[0])
    eps = float(spec.attrs(p["norm"])["eps"])
    elem = _p.ELEM_BYTES[str(spec.types[p["norm"].inputs[0]].dtype)]
    host_inv = [torch.from_numpy(rope_inv_freq(d["DH"], spec.attrs(p[s]))) for s in ("q_rope", "k_rope")]
    af = [spec.attrs(p[s])["attention_factor"] for s in ("q_rope", "k_rope")]
    device_inv: dict[Any, list[Any]] = {}
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        h, pos, table = inputs[h_i], inputs[pos_i], inputs[table_i]
        m = h.numel() // d["K"]
        if m == 0:
            return
        if m not in plans:
            plans[m] = _p.launch_plan(config, m, d["K"], elem, traits)
        tiles, opts = plans[m]
        wq, wk, wv = (inputs[i] for i in w_i)
        if tiles["HINT"]:
            _p.check_aligned("rmsnorm+qkv+rope+kv_write", h, wq, wk, wv)
        inv = device_inv.get(h.device)
        if inv is None:
            inv = device_inv[h.device] = [t.to(h.device) for t in host_inv]
        norm = not _p.norm_prologue(config, tiles)
        if not norm:  # the norm as its own kernel, then plain tiles over the normalized rows
            n = torch.empty((m, d["K"]), dtype=h.dtype, device=h.device)
            _p.rms_rows[(m,)](h, inputs[wn_i], n, eps, K=d["K"], BLOCK_K=_p.row_block(d["K"]), num_warps=4)
            h = n
        grid = (_grid_n(d, tiles["BLOCK_N"]), triton.cdiv(m, tiles["BLOCK_M"]))
        _rmsnorm_qkv_rope[grid](
            h,
            inputs[wn_i],
            wq,
            wk,
            wv,
            *(inputs[i] for i in b_i),
            inv[0],
            inv[1],
            pos,
            table,
            outputs[q_out],
            outputs[k_out],
            outputs[v_out],
            m,
            pos.shape[-1],
            table.shape[-1],
            eps,
            *af,
            HAS_BIAS=has_bias,
            NORM=norm,
            **d,
            **tiles,
            **opts,
        )

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    p = _parts(spec)
    d = _dims(spec, p)
    dtype = str(spec.types[p["norm"].inputs[0]].dtype)
    tiles, opts = _p.launch_plan(
        config, _p.row_count(spec, p["norm"].inputs[0]), d["K"], _p.ELEM_BYTES[dtype], traits
    )
    norm = not _p.norm_prologue(config, tiles)
    consts = {**d, "HAS_BIAS": len(p["q"].inputs) == 3, "NORM": norm, **tiles}
    ptr = "*" + _p.FLOATS[dtype]
    sig = {
        **{name: ptr for name in ("h_ptr", "wn_ptr", "wq_ptr", "wk_ptr", "wv_ptr", "bq_ptr", "bk_ptr", "bv_ptr")},
        "invq_ptr": "*fp32", "invk_ptr": "*fp32", "pos_ptr": "*i32", "table_ptr": "*i32",
        "q_ptr": ptr, "kc_ptr": ptr, "vc_ptr": ptr, "M": "i32", "S": "i32", "CTX_BLOCKS": "i32", "eps": "fp32",
        "afq": "fp32", "afk": "fp32",
        **{c: "constexpr" for c in consts},
    }  # fmt: skip
    name = f"rmsnorm_qkv_rope_{'gemm' if tiles['USE_DOT'] else 'gemv'}"
    units = [CompileUnit(name, _rmsnorm_qkv_rope, sig, consts, opts)]
    if not norm:
        rows = {"K": d["K"], "BLOCK_K": _p.row_block(d["K"])}
        row_sig = {"x_ptr": ptr, "wn_ptr": ptr, "n_ptr": ptr, "eps": "fp32", **{c: "constexpr" for c in rows}}
        units.insert(0, CompileUnit("rmsnorm_qkv_rope_rows", _p.rms_rows, row_sig, rows, {"num_warps": 4}))
    return units
