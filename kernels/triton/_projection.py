"""The projection core that linear+residual and the rmsnorm-fused projections share: the GEMV and
tl.dot tiles over K (with the norm's statistic folded into the K loop), the path and tile choice per
launch, and the norm as its own row kernel. Not a kernel file: kernel files take it with
`depend("triton/_projection.py", <sha256>)`, so each names the exact core it runs.

Paths: the GEMV for M <= GEMV_MAX_M (one row block holds every M; products accumulate in a
[BLOCK_M, BLOCK_N, BLOCK_K] fp32 tile reduced once after the loop), tl.dot tiles above it, narrow ones
for M <= SKINNY_MAX_M.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

# The GEMM path's dot operands are upcast under Triton's interpreter (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_INTERPRETED = _i.INTERPRETED
round_to = _i.round_to  # the kernel files take it from here too
# Configs and launch options per chip, from its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
# Programmatic dependent launch where the arch and the installed Triton take it: the projection kernels
# take USE_GDC (gdc_wait before reading the activations) and launch with launch_pdl (_pdl.py).
_g = depend("triton/_pdl.py", "7809e3ede67d44565604f0e698b9a8bf3482361de988ea8e9015fe96a0627986")
gdc = _g.enabled  # the kernel files take these from here
gdc_wait = _g.gdc_wait
gdc_launch_dependents = _g.gdc_launch_dependents

# The tiles written for 64-wide waves (CDNA3/4; not measured: no AMD machine here), for the files that
# share this core: 4 waves are 256 lanes, so a 16-byte load a lane covers 2048 bf16 of K; MFMA-friendly
# tiles (multiples of 32); two LDS stages; waves_per_eu as the occupancy hint. The first tile stages
# 96 KB of A and B (gemm_shared), which only an LDS above 64 KB holds (CDNA4's 160 KB; _targets.py
# leaves it out elsewhere): a 256-row tile reads each W tile once for twice the rows, which should
# help the prefill GEMMs that are compute-bound; unmeasured, so no speedup is claimed.
WAVE64_CONFIGS = [
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 256, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 4, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 8,
     "block_m": 256, "block_n": 128, "block_k": 32, "num_warps": 8, "num_stages": 2, "waves_per_eu": 0},
]  # fmt: skip

FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
GEMV_MAX_M = 2  # H200: at M=4 the tl.dot path (block_m 16) beat the GEMV 1.7x; at M=2 they tie
GEMV_TILE_REGS = 64  # fp32 accumulator registers a thread may hold in the GEMV

SKINNY_MAX_M = 64  # 2 < M <= 64 (decode at batch 3-64): narrow tl.dot tiles, so enough programs stream W


def skinny(config: dict[str, Any], m: int, traits: Any) -> dict[str, Any]:
    """The config a launch of M rows uses: for GEMV_MAX_M < M <= SKINNY_MAX_M the GEMM tile takes the
    config's skinny_* keys (defaults: block_n 32, block_k 128, 4 warps, the arch's pipeline stages),
    since a 128-wide N tile leaves most SMs idle at N = 2048. Torch's own autotuner picked 32 x 32 x
    128, 4 warps, for the [32, 8192] x [8192, 2048] GEMM on an H200."""
    if not GEMV_MAX_M < m <= SKINNY_MAX_M:
        return config
    stages = traits.pipeline_stages
    return {**config, "block_n": config.get("skinny_block_n", 32), "block_k": config.get("skinny_block_k", 128),
            "num_warps": config.get("skinny_warps", 4), "num_stages": config.get("skinny_stages", stages)}  # fmt: skip


@triton.jit
def gemv_tile(x_rows, wn_ptr, w_rows, K: tl.constexpr, NORM: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr, HINT: tl.constexpr):  # fmt: skip
    """GEMV: acc[BLOCK_M, BLOCK_N] = (x * w_norm) @ W^T over K and, with NORM, ss[BLOCK_M] = sum(x^2),
    both fp32; x_rows [BLOCK_M] and w_rows [BLOCK_N] are row pointers. Products accumulate elementwise
    in a [BLOCK_M, BLOCK_N, BLOCK_K] tile and are reduced once after the loop (loads and FMAs only in
    the loop body)."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    sq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        wp = w_rows[:, None] + ks[None, :]  # [BLOCK_N, BLOCK_K]
        xp = x_rows[:, None] + ks[None, :]  # [BLOCK_M, BLOCK_K]
        if HINT:  # rows start 16-byte aligned: 16-byte vector loads, in AOT units as in the JIT
            wp = tl.multiple_of(wp, [16, 16])
            xp = tl.multiple_of(xp, [16, 16])
        if EVEN_K:
            w = tl.load(wp)
            x = tl.load(xp).to(tl.float32)
        else:
            w = tl.load(wp, mask=(ks < K)[None, :], other=0.0)
            x = tl.load(xp, mask=(ks < K)[None, :], other=0.0).to(tl.float32)
        if NORM:
            sq += x * x
            x = x * tl.load(wn_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)[None, :]
        acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
    return tl.sum(acc, axis=2), tl.sum(sq, axis=1)


@triton.jit
def gemv_tile_prefetch(x_rows, wn_ptr, w_rows, K: tl.constexpr, NORM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       EVEN_K: tl.constexpr, HINT: tl.constexpr, GDC: tl.constexpr):  # fmt: skip
    """gemv_tile with its first K chunk of W (and of w_norm) loaded before the wait for the previous
    kernel (GDC: griddepcontrol.wait, then launch_dependents): weights are never written during a
    step, so under PDL their first loads overlap the tail of the kernel before; x, which that kernel
    wrote, is read only after the wait. The config key `gemv_prefetch` picks it (`launch_plan`);
    without GDC it is the same loop with the first chunk peeled, so the interpreter checks its
    numerics."""
    offs_k = tl.arange(0, BLOCK_K)
    wp = w_rows[:, None] + offs_k[None, :]  # [BLOCK_N, BLOCK_K]: the first chunk
    if HINT:
        wp = tl.multiple_of(wp, [16, 16])
    if EVEN_K:
        w = tl.load(wp)
    else:
        w = tl.load(wp, mask=(offs_k < K)[None, :], other=0.0)
    if NORM:  # w_norm is a weight too (without NORM wn_ptr may point at x: not read before the wait)
        wn = tl.load(wn_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    if GDC:  # every program, before its first read of x (_pdl.py)
        gdc_wait()
        gdc_launch_dependents()
    xp = x_rows[:, None] + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    if HINT:
        xp = tl.multiple_of(xp, [16, 16])
    if EVEN_K:
        x = tl.load(xp).to(tl.float32)
    else:
        x = tl.load(xp, mask=(offs_k < K)[None, :], other=0.0).to(tl.float32)
    sq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    if NORM:
        sq += x * x
        x = x * wn[None, :]
    acc = x[:, None, :] * w.to(tl.float32)[None, :, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        ks = k0 + offs_k
        wp = w_rows[:, None] + ks[None, :]
        xp = x_rows[:, None] + ks[None, :]
        if HINT:
            wp = tl.multiple_of(wp, [16, 16])
            xp = tl.multiple_of(xp, [16, 16])
        if EVEN_K:
            w = tl.load(wp)
            x = tl.load(xp).to(tl.float32)
        else:
            w = tl.load(wp, mask=(ks < K)[None, :], other=0.0)
            x = tl.load(xp, mask=(ks < K)[None, :], other=0.0).to(tl.float32)
        if NORM:
            sq += x * x
            x = x * tl.load(wn_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)[None, :]
        acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
    return tl.sum(acc, axis=2), tl.sum(sq, axis=1)


@triton.jit
def gemm_tile(x_rows, wn_ptr, w_rows, K: tl.constexpr, NORM: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr, HINT: tl.constexpr):  # fmt: skip
    """GEMM: the same results through tl.dot tiles (wgmma / MFMA). With NORM the A tile is scaled by
    w_norm and rounded to the activation dtype before the dot (the MMA takes that dtype)."""
    offs_k = tl.arange(0, BLOCK_K)
    xp = x_rows[:, None] + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    wp = w_rows[:, None] + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if HINT:
            xp = tl.multiple_of(xp, [16, 16])
            wp = tl.multiple_of(wp, [16, 16])
        if EVEN_K:
            a = tl.load(xp)
            b = tl.load(wp)
        else:
            kmask = (k0 + offs_k < K)[None, :]
            a = tl.load(xp, mask=kmask, other=0.0)
            b = tl.load(wp, mask=kmask, other=0.0)
        if NORM:
            af = a.to(tl.float32)
            ss += tl.sum(af * af, axis=1)
            wn = tl.load(wn_ptr + k0 + offs_k, mask=k0 + offs_k < K, other=0.0).to(tl.float32)
            a = round_to(af * wn[None, :], a.dtype)
        if _INTERPRETED:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if a.dtype == tl.float32:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        xp += BLOCK_K
        wp += BLOCK_K
    return acc, ss


def tiles(k: int, m: int, config: dict[str, Any], elem: int, warp: int) -> dict[str, Any]:
    """The path and tile constexprs one launch of M rows uses (the one source for build and AOT):
    the GEMV for M <= GEMV_MAX_M (one row block holds every M), else tl.dot tiles."""
    if m <= GEMV_MAX_M:
        block_m, block_n = triton.next_power_of_2(m), config["gemv_block_n"]
        cap = GEMV_TILE_REGS * warp * config["gemv_warps"] // (block_m * block_n)
        block_k = max(
            16, min(config["gemv_block_k"], triton.next_power_of_2(k), triton.next_power_of_2(cap + 1) // 2)
        )
        return {"USE_DOT": False, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                "EVEN_K": k % block_k == 0, "HINT": k % (16 // elem) == 0}  # fmt: skip
    block_m = min(config["block_m"], max(16, triton.next_power_of_2(m)))
    return {"USE_DOT": True, "BLOCK_M": block_m, "BLOCK_N": config["block_n"], "BLOCK_K": config["block_k"],
            "EVEN_K": k % config["block_k"] == 0, "HINT": k % (16 // elem) == 0}  # fmt: skip


def options(config: dict[str, Any], use_dot: bool, traits: Any) -> dict[str, Any]:
    if use_dot:
        opts = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    else:
        opts = {"num_warps": config["gemv_warps"], "num_stages": 1}
    return {**opts, **_t.extra_options(config, traits), **_g.launch_options(traits)}


def shared(config: dict[str, Any]) -> int:
    """Shared memory / LDS (bytes, bf16 operands) the config's tl.dot tiles stage at most: its own tile
    and the narrow one of 2 < M <= 64 (`skinny`, block_m up to 64). The swiglu file's N tile holds its
    gate and up rows together, so one W tile a step holds for every file."""
    own = _t.gemm_shared(config["block_m"], config["block_n"], config["block_k"], config["num_stages"])
    narrow = _t.gemm_shared(SKINNY_MAX_M, config.get("skinny_block_n", 32), config.get("skinny_block_k", 128),
                            config.get("skinny_stages", config["num_stages"]))  # fmt: skip
    return max(own, narrow)


def configs(warp32: list[dict[str, Any]], wave64: list[dict[str, Any]], traits: Any) -> list[dict[str, Any]]:
    """A projection file's `configs(traits)`: its 32-wide list and the 64-wide one, mapped onto the chip
    (_targets.py), tiles beyond the block's shared memory left out."""
    return _t.configs_for({32: warp32, 64: wave64}, traits, shared=shared)


def check_aligned(where: str, *tensors: Any) -> None:
    for t in tensors:
        if t.data_ptr() % 16:
            raise ValueError(
                f"{where} (triton): a {tuple(t.shape)} operand is not 16-byte aligned (data_ptr "
                f"{t.data_ptr():#x}); the kernel's vector loads need aligned, contiguous tensors"
            )


def row_count(spec: Any, value: str) -> int:
    m = 1
    for d in spec.types[value].shape[:-1]:
        m *= int(d)
    return m


@triton.jit
def rms_rows(x_ptr, wn_ptr, n_ptr, eps, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """n = x / rms * w_norm, rounded to n's dtype, one program per row: the norm as its own kernel for
    the `norm_prologue` configs (the unfused graph's rmsnorm, rounded where the graph stores it)."""
    row = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    sq = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * K + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        sq += x * x
    rms = tl.sqrt(tl.sum(sq, axis=0) / K + eps)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * K + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        w = tl.load(wn_ptr + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
        tl.store(n_ptr + row * K + k0 + ks, round_to(x / rms * w, n_ptr.dtype.element_ty), mask=k0 + ks < K)


def norm_prologue(config: dict[str, Any], tile: dict[str, Any]) -> bool:
    """The norm runs as its own kernel first: on the tl.dot path, where the config asks for it."""
    return bool(config.get("norm_prologue")) and tile["USE_DOT"]


def row_block(k: int) -> int:
    return min(triton.next_power_of_2(k), 1024)


def launch_plan(
    config: dict[str, Any], m: int, k: int, elem: int, traits: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tile constexprs, launch options) for a launch of M rows: the one source for build and AOT.
    USE_GDC with the tiles: the kernel waits for its predecessor (PDL) where the launch options take
    launch_pdl. PREFETCH: the GEMV path runs gemv_tile_prefetch (config key `gemv_prefetch`, default
    off), where the tile, not the kernel's prologue, waits."""
    cfg = skinny(config, m, traits)
    t = tiles(k, m, cfg, elem, traits.warp_size)
    prefetch = bool(config.get("gemv_prefetch")) and not t["USE_DOT"]
    return {**t, "PREFETCH": prefetch, "USE_GDC": gdc(traits)}, options(cfg, t["USE_DOT"], traits)
