"""rmsnorm+linear+silu*mul: out = silu(n @ w_gate^T) * (n @ w_up^T), n = rmsnorm(h, w_norm): the
SwiGLU MLP input in one kernel that reads h once and both weights once.

Each program owns gemv_block_n / 2 features: its tile interleaves gate row f and up row f (row 2i of the
tile is gate row f0+i, row 2i+1 up row f0+i, selected per row between the two weight tensors), so the
two products of a feature land in one accumulator tile and split apart in registers for the epilogue;
no intermediate goes to memory. The norm is folded in as in rmsnorm_linear.py: sum(x^2) accumulates in
the same K loop that streams the weights, the chunk is scaled by w_norm before the products, and the
epilogue divides by rms. The epilogue rounds gate, silu(gate) and up to the activation dtype where
the unfused graph stores them, then multiplies. At F=8192, K=2048 (Llama-3.2-1B) the default GEMV
launches 2048 programs, 64 MB of weights streamed with 16-byte loads.

Paths and tiles as in linear.py: the GEMV for M <= GEMV_MAX_M, tl.dot tiles above it (block_n counts
interleaved rows: block_n / 2 features; the A tile is scaled by w_norm and rounded before the MMA).

Config keys: gemv_block_n (even), gemv_block_k, gemv_warps (GEMV); block_m, block_n, block_k,
num_warps, num_stages (GEMM); skinny_* (GEMM at 2 < M <= 64, see _skinny); norm_prologue (GEMM: the
norm as its own row kernel first, then tiles with no norm work); waves_per_eu on rocm. Each config
zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; every float tensor of one dtype (bf16, f16, f32); gate and up of
one shape [F, K], both with a bias or neither; concrete F and K with F * K < 2**31; contiguous tensors
with 16-byte aligned bases (checked at launch).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

IMPLEMENTS = "rmsnorm+linear+silu*mul"

# Measured on an H200 (M=1 bf16, F=8192, K=2048, 64 MB of weights): 8 interleaved rows (4 features) x
# 1024 of K with 4 warps, 21.3 us = 3.15 TB/s; 2 rows 23.6 us; 8 warps slower at every tile tried. More
# rows a program amortize its L2 re-reads of x and w_norm.
_CUDA_CONFIGS = [
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4},
    {"gemv_block_n": 16, "gemv_block_k": 512, "gemv_warps": 8,
     "block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # Not measured yet: the norm as its own kernel on the tl.dot path (M > 2), so the tiles stream the
    # weights with no per-tile norm work (at M = 32 the folded norm ran at 28% of copy bandwidth).
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4, "norm_prologue": True,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
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


@triton.jit
def _rms_rows(x_ptr, wn_ptr, n_ptr, eps, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """n = x / rms * w_norm, rounded to x's dtype, one program per row: the norm as its own kernel for
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
        tl.store(n_ptr + row * K + k0 + ks, _to(x / rms * w, n_ptr.dtype.element_ty), mask=k0 + ks < K)


@triton.jit(do_not_specialize=["M"])
def _rmsnorm_swiglu(x_ptr, wn_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, y_ptr, M, eps,
                    F: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, HINT: tl.constexpr, NORM: tl.constexpr):  # fmt: skip
    # x: [M, K], w_norm: [K], w_gate / w_up: [F, K], y: [M, F]; BLOCK_N interleaved rows = BLOCK_N/2 features
    FEATURES: tl.constexpr = BLOCK_N // 2
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.arange(0, BLOCK_N)
    f = tl.minimum(pid_n * FEATURES + j // 2, F - 1)  # tail features repeat F-1, never stored
    is_gate = j % 2 == 0
    w_rows = tl.where(is_gate, wg_ptr + f * K, wu_ptr + f * K)  # [BLOCK_N] row pointers
    x_rows = x_ptr + tl.minimum(offs_m, M - 1) * K  # padding rows (m >= M) repeat row M-1, never stored
    if USE_DOT:
        acc, ss = _gemm_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    else:
        acc, ss = _gemv_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    if NORM:
        y = acc / tl.sqrt(ss / K + eps)[:, None]
    else:  # x is already the normalized activation (the norm_prologue path)
        y = acc
    if HAS_BIAS:
        bias = tl.where(is_gate, tl.load(bg_ptr + f), tl.load(bu_ptr + f)).to(tl.float32)
        y += bias[None, :]
    dtype = y_ptr.dtype.element_ty
    y = _to(y, dtype).to(tl.float32)  # gate and up as the unfused graph stores them
    gate, up = tl.split(tl.reshape(y, [BLOCK_M, FEATURES, 2]))  # [BLOCK_M, FEATURES] each
    act = _to(gate / (1.0 + tl.exp(-gate)), dtype).to(tl.float32)
    cols = pid_n * FEATURES + tl.arange(0, FEATURES)
    mask = (offs_m < M)[:, None] & (cols < F)[None, :]
    tl.store(y_ptr + offs_m[:, None] * F + cols[None, :], _to(act * up, dtype), mask=mask)


# --- the contract ------------------------------------------------------------------------------------


def _parts(spec: Any) -> tuple[Any, Any, Any]:
    return spec.node("rmsnorm"), spec.role("gate"), spec.role("up")


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or spec.pattern != "rmsnorm+linear+silu*mul":
        return False
    try:
        norm, gate, up = _parts(spec)
    except KeyError:  # a group without the pattern's roles
        return False
    values = {v for n in spec.nodes for v in (*n.inputs, *n.outputs)}
    dtypes = {spec.types[v].dtype for v in values}
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _FLOATS:
        return False
    shape = spec.types[gate.inputs[1]].shape
    f, k = shape
    return (
        spec.types[up.inputs[1]].shape == shape
        and len(gate.inputs) == len(up.inputs)
        and spec.types[norm.inputs[1]].shape == (k,)
        and isinstance(f, int)
        and isinstance(k, int)
        and f * k < 2**31
        and all(c["gemv_block_n"] % 2 == 0 and c["block_n"] % 2 == 0 for c in configs(spec.target))
    )


def build(spec: Any, config: dict[str, Any], target: Any) -> Any:
    norm, gate, up = _parts(spec)
    x_i, wn_i = spec.args(norm)
    wg_i, wu_i = spec.inputs.index(gate.inputs[1]), spec.inputs.index(up.inputs[1])
    has_bias = len(gate.inputs) == 3
    bg_i = spec.inputs.index(gate.inputs[2]) if has_bias else wg_i
    bu_i = spec.inputs.index(up.inputs[2]) if has_bias else wu_i
    f, k = spec.types[gate.inputs[1]].shape
    eps = float(spec.attrs(norm)["eps"])
    elem = _ELEM_BYTES[str(spec.types[norm.inputs[0]].dtype)]
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, wg, wu = inputs[x_i], inputs[wg_i], inputs[wu_i]
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            cfg = _skinny(config, m, target)
            tiles = _tiles(k, m, cfg, elem, target.warp_size)
            plans[m] = (tiles, _options(cfg, tiles["USE_DOT"], target))
        tiles, opts = plans[m]
        if tiles["HINT"]:
            _check_aligned("rmsnorm+linear+silu*mul", x, wg, wu)
        wn, norm = inputs[wn_i], not _prologue(config, tiles)
        if not norm:  # the norm as its own kernel, then plain tiles over the normalized rows
            n = torch.empty((m, k), dtype=x.dtype, device=x.device)
            _rms_rows[(m,)](x, wn, n, eps, K=k, BLOCK_K=_row_block(k), num_warps=4)
            x = n
        grid = (triton.cdiv(f, tiles["BLOCK_N"] // 2), triton.cdiv(m, tiles["BLOCK_M"]))
        _rmsnorm_swiglu[grid](x, wn, wg, wu, inputs[bg_i], inputs[bu_i], outputs[0], m, eps,
                              F=f, K=k, HAS_BIAS=has_bias, NORM=norm, **tiles, **opts)  # fmt: skip

    return launch


def compile_units(spec: Any, config: dict[str, Any], target: Any) -> list[Any]:
    from polymorph.kernel_files import CompileUnit

    norm, gate, _ = _parts(spec)
    f, k = spec.types[gate.inputs[1]].shape
    dtype = str(spec.types[norm.inputs[0]].dtype)
    cfg = _skinny(config, _rows(spec, norm.inputs[0]), target)
    tiles = _tiles(k, _rows(spec, norm.inputs[0]), cfg, _ELEM_BYTES[dtype], target.warp_size)
    norm = not _prologue(config, tiles)
    consts = {"F": f, "K": k, "HAS_BIAS": len(gate.inputs) == 3, "NORM": norm, **tiles}
    ptr = "*" + _FLOATS[dtype]
    sig = {"x_ptr": ptr, "wn_ptr": ptr, "wg_ptr": ptr, "wu_ptr": ptr, "bg_ptr": ptr, "bu_ptr": ptr,
           "y_ptr": ptr, "M": "i32", "eps": "fp32", **{c: "constexpr" for c in consts}}  # fmt: skip
    name = f"rmsnorm_swiglu_{'gemm' if tiles['USE_DOT'] else 'gemv'}"
    units = [CompileUnit(name, _rmsnorm_swiglu, sig, consts, _options(cfg, tiles["USE_DOT"], target))]
    if not norm:
        rows = {"K": k, "BLOCK_K": _row_block(k)}
        row_sig = {"x_ptr": ptr, "wn_ptr": ptr, "n_ptr": ptr, "eps": "fp32", **{c: "constexpr" for c in rows}}
        units.insert(0, CompileUnit("rmsnorm_swiglu_rows", _rms_rows, row_sig, rows, {"num_warps": 4}))
    return units


def _prologue(config: dict[str, Any], tiles: dict[str, Any]) -> bool:
    """The norm runs as its own kernel first: on the tl.dot path, where the config asks for it."""
    return bool(config.get("norm_prologue")) and tiles["USE_DOT"]


def _row_block(k: int) -> int:
    return min(triton.next_power_of_2(k), 1024)
