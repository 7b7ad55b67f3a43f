"""linear+residual: out = residual + (x @ w^T (+ bias)), the residual add in the projection's epilogue
(o_proj and down_proj: the residual stream is read once, where the projection's output is written).

Paths and tiles as in linear.py: the GEMV for M <= GEMV_MAX_M (gemv_block_n rows of W a program, K
chunks of gemv_block_k with 16-byte loads, products reduced once after the loop; at N=2048, K=8192,
the Llama-3.2-1B down_proj, the default launches 1024 programs), tl.dot tiles above it. The projection
is rounded to the output dtype before the add, as the unfused graph stores it.

Config keys: gemv_block_n, gemv_block_k, gemv_warps (GEMV); block_m, block_n, block_k, num_warps,
num_stages (GEMM); waves_per_eu on rocm. Each config zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; x, w, bias, residual and out of one float dtype (bf16, f16,
f32); concrete N and K with N * K < 2**31; the projection has the output's shape (a projection that
the add broadcasts up is refused) and the residual either the output's shape or [N] (broadcast over
rows); contiguous tensors with 16-byte aligned bases (checked at launch).
"""

from __future__ import annotations

import os
from typing import Any

import triton
import triton.language as tl

IMPLEMENTS = "linear+residual"

# Measured on an H200 (M=1 bf16): o_proj (2048 x 2048) 4.6-4.8 us with 2 rows x 2048 of K, 4 warps;
# down_proj (2048 x 8192) 12.2 us with that and 11.8 us (2.85 TB/s) with 4 rows x 1024.
_CUDA_CONFIGS = [
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 4, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 2, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
]  # fmt: skip
_ROCM_CONFIGS = [
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 4, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 2, "waves_per_eu": 2},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 8,
     "block_m": 256, "block_n": 128, "block_k": 32, "num_warps": 8, "num_stages": 2, "waves_per_eu": 0},
]  # fmt: skip
CONFIGS = _CUDA_CONFIGS


def configs(target: Any) -> list[dict[str, Any]]:
    return _ROCM_CONFIGS if target.family == "rocm" else _CUDA_CONFIGS


# Triton's interpreter (3.6-3.9) multiplies bf16 tl.dot operands as their raw 16-bit patterns, so under
# TRITON_INTERPRET the GEMM path upcasts its operands to fp32 first: exact, since bf16 products are
# exact in fp32. Compiled code (and AOT compilation, which never runs interpreted) is unaffected.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
_ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
GEMV_MAX_M = 2  # H200: at M=4 the tl.dot path (block_m 16) beat the GEMV 1.7x; at M=2 they tie
GEMV_TILE_REGS = 64  # fp32 accumulator registers a thread may hold in the GEMV

SKINNY_MAX_M = 64  # 2 < M <= 64 (decode at batch 3-64): narrow tl.dot tiles, so enough programs stream W


def _skinny(config: dict[str, Any], m: int, target: Any) -> dict[str, Any]:
    """The config a launch of M rows uses: for GEMV_MAX_M < M <= SKINNY_MAX_M the GEMM tile takes the
    config's skinny_* keys (defaults: block_n 32, block_k 128, 4 warps; 4 stages on cuda, 2 on rocm's
    smaller LDS), since a 128-wide N tile leaves most SMs idle at N = 2048. Torch's own autotuner picked
    32 x 32 x 128, 4 warps, for the [32, 8192] x [8192, 2048] GEMM on an H200."""
    if not GEMV_MAX_M < m <= SKINNY_MAX_M:
        return config
    stages = 2 if target.family == "rocm" else 4
    return {**config, "block_n": config.get("skinny_block_n", 32), "block_k": config.get("skinny_block_k", 128),
            "num_warps": config.get("skinny_warps", 4), "num_stages": config.get("skinny_stages", stages)}  # fmt: skip


# --- the projection core (the same in each projection kernel file: a file is hashed on its own) -----


@triton.jit
def _to(x, dtype: tl.constexpr):
    """x.to(dtype), rounded to nearest even as compiled code does. The interpreter (3.6-3.9) truncates
    fp32 -> bf16, so under it the rounding is done on the bits first."""
    if _INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True).to(tl.int64)  # 64-bit: no overflow checks
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = bits.to(tl.uint32).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _gemv_tile(x_rows, wn_ptr, w_rows, K: tl.constexpr, NORM: tl.constexpr,
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
def _gemm_tile(x_rows, wn_ptr, w_rows, K: tl.constexpr, NORM: tl.constexpr,
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
            a = _to(af * wn[None, :], a.dtype)
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


def _tiles(k: int, m: int, config: dict[str, Any], elem: int, warp: int) -> dict[str, Any]:
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


def _options(config: dict[str, Any], use_dot: bool, target: Any) -> dict[str, Any]:
    if use_dot:
        opts = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    else:
        opts = {"num_warps": config["gemv_warps"], "num_stages": 1}
    if target.family == "rocm" and "waves_per_eu" in config:
        opts["waves_per_eu"] = config["waves_per_eu"]
    return opts


def _check_aligned(where: str, *tensors: Any) -> None:
    for t in tensors:
        if t.data_ptr() % 16:
            raise ValueError(
                f"{where} (triton): a {tuple(t.shape)} operand is not 16-byte aligned (data_ptr "
                f"{t.data_ptr():#x}); the kernel's vector loads need aligned, contiguous tensors"
            )


def _rows(spec: Any, value: str) -> int:
    m = 1
    for d in spec.types[value].shape[:-1]:
        m *= int(d)
    return m


# --- the kernel --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _linear_residual(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, M,
                     N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, RES_ROWS: tl.constexpr,
                     USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr):  # fmt: skip
    # x: [M, K], w: [N, K], residual: [M, N] (RES_ROWS) or [N], y: [M, N]
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + tl.minimum(rows, N - 1) * K  # tail rows repeat row N-1, never stored
    x_rows = x_ptr + tl.minimum(offs_m, M - 1) * K  # padding rows (m >= M) repeat row M-1, never stored
    if USE_DOT:
        acc, ss = _gemm_tile(x_rows, x_ptr, w_rows, K, False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    else:
        acc, ss = _gemv_tile(x_rows, x_ptr, w_rows, K, False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[None, :]
    dtype = y_ptr.dtype.element_ty
    proj = _to(acc, dtype).to(tl.float32)  # the projection as the unfused graph stores it
    mask = (offs_m < M)[:, None] & (rows < N)[None, :]
    if RES_ROWS:
        r = tl.load(r_ptr + offs_m[:, None] * N + rows[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        r = tl.load(r_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs_m[:, None] * N + rows[None, :], _to(r + proj, dtype), mask=mask)


# --- the contract ------------------------------------------------------------------------------------


def _parts(spec: Any) -> tuple[Any, Any, str]:
    lin, add = spec.node("linear"), spec.node("add")
    others = [v for v in add.inputs if v != lin.outputs[0]]
    residual = others[0] if others else lin.outputs[0]  # add(proj, proj) has no outside residual
    return lin, add, residual


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or spec.pattern != "linear+residual":
        return False
    lin, add, residual = _parts(spec)
    if residual == lin.outputs[0]:
        return False
    values = (*lin.inputs, residual, lin.outputs[0], add.outputs[0])
    dtypes = {spec.types[v].dtype for v in values}
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _FLOATS:
        return False
    n, k = spec.types[lin.inputs[1]].shape
    out, proj, res = (spec.types[v].shape for v in (add.outputs[0], lin.outputs[0], residual))
    row_broadcast = res[-1] == n and all(d == 1 for d in res[:-1])
    return (
        isinstance(n, int)
        and isinstance(k, int)
        and n * k < 2**31
        and proj == out
        and (res == out or row_broadcast)
    )


def build(spec: Any, config: dict[str, Any], target: Any) -> Any:
    lin, add, residual = _parts(spec)
    args = spec.args(lin)
    r_i = spec.inputs.index(residual)
    n, k = spec.types[lin.inputs[1]].shape
    has_bias = len(lin.inputs) == 3
    res_rows = spec.types[residual].shape == spec.types[add.outputs[0]].shape
    elem = _ELEM_BYTES[str(spec.types[lin.inputs[0]].dtype)]
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, w = inputs[args[0]], inputs[args[1]]
        bias = inputs[args[2]] if has_bias else w  # any pointer when there is no bias
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            cfg = _skinny(config, m, target)
            tiles = _tiles(k, m, cfg, elem, target.warp_size)
            plans[m] = (tiles, _options(cfg, tiles["USE_DOT"], target))
        tiles, opts = plans[m]
        if tiles["HINT"]:
            _check_aligned("linear+residual", x, w)
        grid = (triton.cdiv(n, tiles["BLOCK_N"]), triton.cdiv(m, tiles["BLOCK_M"]))
        _linear_residual[grid](x, w, bias, inputs[r_i], outputs[0], m, N=n, K=k, HAS_BIAS=has_bias,
                               RES_ROWS=res_rows, **tiles, **opts)  # fmt: skip

    return launch


def compile_units(spec: Any, config: dict[str, Any], target: Any) -> list[Any]:
    from polymorph.kernel_files import CompileUnit

    lin, add, residual = _parts(spec)
    n, k = spec.types[lin.inputs[1]].shape
    dtype = str(spec.types[lin.inputs[0]].dtype)
    cfg = _skinny(config, _rows(spec, lin.inputs[0]), target)
    tiles = _tiles(k, _rows(spec, lin.inputs[0]), cfg, _ELEM_BYTES[dtype], target.warp_size)
    consts = {"N": n, "K": k, "HAS_BIAS": len(lin.inputs) == 3,
              "RES_ROWS": spec.types[residual].shape == spec.types[add.outputs[0]].shape, **tiles}  # fmt: skip
    ptr = "*" + _FLOATS[dtype]
    sig = {"x_ptr": ptr, "w_ptr": ptr, "b_ptr": ptr, "r_ptr": ptr, "y_ptr": ptr, "M": "i32",
           **{c: "constexpr" for c in consts}}  # fmt: skip
    name = f"linear_residual_{'gemm' if tiles['USE_DOT'] else 'gemv'}"
    return [CompileUnit(name, _linear_residual, sig, consts, _options(cfg, tiles["USE_DOT"], target))]
