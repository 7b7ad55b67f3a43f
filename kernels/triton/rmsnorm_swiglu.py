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

Config keys: gemv_block_n (even), gemv_block_k, gemv_warps, gemv_prefetch (GEMV; `gemv_prefetch`: the
first K chunk of the weights loaded before the PDL wait, _projection.gemv_tile_prefetch); block_m, block_n, block_k,
num_warps, num_stages (GEMM); skinny_* (GEMM at 2 < M <= 64, see _projection.skinny); norm_prologue (GEMM: the
norm as its own row kernel first, then tiles with no norm work); the arch's launch options (waves_per_eu) where it takes them. Each config
zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; every float tensor of one dtype (bf16, f16, f32); gate and up of
one shape [F, K], both with a bias or neither; concrete F and K with F * K < 2**31; contiguous tensors
with 16-byte aligned bases (checked at launch).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "rmsnorm+linear+silu*mul"

# The projection core (tiles, paths, the norm's row kernel) shared with the other projection files,
# pinned by content hash.
_p = depend("triton/_projection.py", "f1c538360559b1c984c3825d678bd34fba79798a6e93c2b508f82df2d975d001")
_to, _gemv_tile, _gemm_tile = _p.round_to, _p.gemv_tile, _p.gemm_tile  # called by this file's kernels

# Measured on an H200 (M=1 bf16, F=8192, K=2048, 64 MB of weights): 8 interleaved rows (4 features) x
# 1024 of K with 4 warps, 21.3 us = 3.15 TB/s; 2 rows 23.6 us; 8 warps slower at every tile tried. More
# rows a program amortize its L2 re-reads of x and w_norm.
_WARP32_CONFIGS = [
    # The default since an H200 sweep (bench/decode.py --sweep, 2026-11-30): the norm as its own kernel
    # on the tl.dot path (M > 2) and 64-wide tiles at 2 < M <= 64: 52.9 -> 24.8 us at M = 8 and
    # 58.4 -> 23.0 us at M = 32 against the folded norm below; the GEMV (M <= 2) is the same.
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4, "norm_prologue": True,
     "skinny_block_n": 64, "skinny_block_k": 64, "skinny_warps": 4, "skinny_stages": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    # The norm as its own kernel with 128-wide tiles: 25.3 us at M = 8, 23.3 at M = 32.
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4, "norm_prologue": True,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4},
    {"gemv_block_n": 16, "gemv_block_k": 512, "gemv_warps": 8,
     "block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # The default with the first K chunk's weight loads before the PDL wait (gemv_prefetch; unmeasured).
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4, "norm_prologue": True, "gemv_prefetch": True,
     "skinny_block_n": 64, "skinny_block_k": 64, "skinny_warps": 4, "skinny_stages": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS


def configs(traits: Any) -> list[dict[str, Any]]:
    return _p.configs(_WARP32_CONFIGS, _p.WAVE64_CONFIGS, traits)


# --- the kernel --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _rmsnorm_swiglu(x_ptr, wn_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, y_ptr, M, eps,
                    F: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, HINT: tl.constexpr, NORM: tl.constexpr, PREFETCH: tl.constexpr,
                    USE_GDC: tl.constexpr):  # fmt: skip
    # launched with PDL: every program waits for the previous kernel before any read (_pdl.py); with
    # PREFETCH the GEMV tile waits instead, after its first weight loads
    if USE_GDC and not PREFETCH:
        _p.gdc_wait()
        _p.gdc_launch_dependents()
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
    elif PREFETCH:
        acc, ss = _p.gemv_tile_prefetch(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                                        HINT, USE_GDC)  # fmt: skip
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
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _p.FLOATS:
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
        and all(c["gemv_block_n"] % 2 == 0 and c["block_n"] % 2 == 0 for c in configs(spec.traits))
    )


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    norm, gate, up = _parts(spec)
    x_i, wn_i = spec.args(norm)
    wg_i, wu_i = spec.inputs.index(gate.inputs[1]), spec.inputs.index(up.inputs[1])
    has_bias = len(gate.inputs) == 3
    bg_i = spec.inputs.index(gate.inputs[2]) if has_bias else wg_i
    bu_i = spec.inputs.index(up.inputs[2]) if has_bias else wu_i
    f, k = spec.types[gate.inputs[1]].shape
    eps = float(spec.attrs(norm)["eps"])
    elem = _p.ELEM_BYTES[str(spec.types[norm.inputs[0]].dtype)]
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, wg, wu = inputs[x_i], inputs[wg_i], inputs[wu_i]
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            plans[m] = _p.launch_plan(config, m, k, elem, traits)
        tiles, opts = plans[m]
        if tiles["HINT"]:
            _p.check_aligned("rmsnorm+linear+silu*mul", x, wg, wu)
        wn, norm = inputs[wn_i], not _p.norm_prologue(config, tiles)
        if not norm:  # the norm as its own kernel, then plain tiles over the normalized rows
            n = torch.empty((m, k), dtype=x.dtype, device=x.device)
            _p.rms_rows[(m,)](x, wn, n, eps, K=k, BLOCK_K=_p.row_block(k), num_warps=4)
            x = n
        grid = (triton.cdiv(f, tiles["BLOCK_N"] // 2), triton.cdiv(m, tiles["BLOCK_M"]))
        _rmsnorm_swiglu[grid](x, wn, wg, wu, inputs[bg_i], inputs[bu_i], outputs[0], m, eps,
                              F=f, K=k, HAS_BIAS=has_bias, NORM=norm, **tiles, **opts)  # fmt: skip

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    norm, gate, _ = _parts(spec)
    f, k = spec.types[gate.inputs[1]].shape
    dtype = str(spec.types[norm.inputs[0]].dtype)
    tiles, opts = _p.launch_plan(config, _p.row_count(spec, norm.inputs[0]), k, _p.ELEM_BYTES[dtype], traits)
    norm = not _p.norm_prologue(config, tiles)
    consts = {"F": f, "K": k, "HAS_BIAS": len(gate.inputs) == 3, "NORM": norm, **tiles}
    ptr = "*" + _p.FLOATS[dtype]
    sig = {"x_ptr": ptr, "wn_ptr": ptr, "wg_ptr": ptr, "wu_ptr": ptr, "bg_ptr": ptr, "bu_ptr": ptr,
           "y_ptr": ptr, "M": "i32", "eps": "fp32", **{c: "constexpr" for c in consts}}  # fmt: skip
    name = f"rmsnorm_swiglu_{'gemm' if tiles['USE_DOT'] else 'gemv'}"
    units = [CompileUnit(name, _rmsnorm_swiglu, sig, consts, opts)]
    if not norm:
        rows = {"K": k, "BLOCK_K": _p.row_block(k)}
        row_sig = {"x_ptr": ptr, "wn_ptr": ptr, "n_ptr": ptr, "eps": "fp32", **{c: "constexpr" for c in rows}}
        units.insert(0, CompileUnit("rmsnorm_swiglu_rows", _p.rms_rows, row_sig, rows, {"num_warps": 4}))
    return units
