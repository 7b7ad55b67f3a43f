"""linear+residual: out = residual + (x @ w^T (+ bias)), the residual add in the projection's epilogue
(o_proj and down_proj: the residual stream is read once, where the projection's output is written).

Paths and tiles as in linear.py: the GEMV for M <= GEMV_MAX_M (gemv_block_n rows of W a program, K
chunks of gemv_block_k with 16-byte loads, products reduced once after the loop; at N=2048, K=8192,
the Llama-3.2-1B down_proj, the default launches 1024 programs), tl.dot tiles above it. The projection
is rounded to the output dtype before the add, as the unfused graph stores it.

Config keys: gemv_block_n, gemv_block_k, gemv_warps, gemv_prefetch (GEMV; `gemv_prefetch`: the first K
chunk of the weights loaded before the PDL wait, _projection.gemv_tile_prefetch); block_m, block_n, block_k, num_warps,
num_stages (GEMM); the arch's launch options (waves_per_eu) where it takes them. Each config zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; x, w, bias, residual and out of one float dtype (bf16, f16,
f32); concrete N and K with N * K < 2**31; the projection has the output's shape (a projection that
the add broadcasts up is refused) and the residual either the output's shape or [N] (broadcast over
rows); contiguous tensors with 16-byte aligned bases (checked at launch).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "linear+residual"

# The projection core (tiles, paths, the norm's row kernel) shared with the other projection files,
# pinned by content hash.
_p = depend("triton/_projection.py", "f1c538360559b1c984c3825d678bd34fba79798a6e93c2b508f82df2d975d001")
_to, _gemv_tile, _gemm_tile = _p.round_to, _p.gemv_tile, _p.gemm_tile  # called by this file's kernels

# Measured on an H200 (M=1 bf16): o_proj (2048 x 2048) 4.6-4.8 us with 2 rows x 2048 of K, 4 warps;
# down_proj (2048 x 8192) 12.2 us with that and 11.8 us (2.85 TB/s) with 4 rows x 1024.
_WARP32_CONFIGS = [
    # The default since an H200 sweep (bench/decode.py --sweep, 2026-11-30): 16-wide tiles at
    # 2 < M <= 64, so o_proj and down_proj (N = 2048) launch 128 programs for 132 SMs. At M = 32 o_proj
    # 7.8 -> 7.0 us, down_proj 23.3 -> 20.6 us; at M = 8 they lose 0.3 and 0.8 us. GEMV (M <= 2) the same.
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "skinny_block_n": 16, "skinny_block_k": 256, "skinny_warps": 4, "skinny_stages": 3,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 4, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 2, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # Weight loads of the first K chunk issued before the PDL wait (gemv_prefetch, _projection.py): not
    # yet measured in a whole step; in a chain of 2048 x 2048 GEMVs on an H200 it was 3.71 against 3.88 us
    # a kernel, in a chain of MLP-sized ones 10.8 against 9.4 (bench/h200_decode_kernels_results.json).
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4, "gemv_prefetch": True,
     "skinny_block_n": 16, "skinny_block_k": 256, "skinny_warps": 4, "skinny_stages": 3,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS


def configs(traits: Any) -> list[dict[str, Any]]:
    return _p.configs(_WARP32_CONFIGS, _p.WAVE64_CONFIGS, traits)


# --- the kernel --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _linear_residual(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, M,
                     N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, RES_ROWS: tl.constexpr,
                     USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr, PREFETCH: tl.constexpr,
                     USE_GDC: tl.constexpr):  # fmt: skip
    # launched with PDL: every program waits for the previous kernel before any read (_pdl.py); with
    # PREFETCH the GEMV tile waits instead, after its first weight loads
    if USE_GDC and not PREFETCH:
        _p.gdc_wait()
        _p.gdc_launch_dependents()
    # x: [M, K], w: [N, K], residual: [M, N] (RES_ROWS) or [N], y: [M, N]
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + tl.minimum(rows, N - 1) * K  # tail rows repeat row N-1, never stored
    x_rows = x_ptr + tl.minimum(offs_m, M - 1) * K  # padding rows (m >= M) repeat row M-1, never stored
    if USE_DOT:
        acc, ss = _gemm_tile(x_rows, x_ptr, w_rows, K, False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    elif PREFETCH:
        acc, ss = _p.gemv_tile_prefetch(x_rows, x_ptr, w_rows, K, False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                                        HINT, USE_GDC)  # fmt: skip
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
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _p.FLOATS:
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


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    lin, add, residual = _parts(spec)
    args = spec.args(lin)
    r_i = spec.inputs.index(residual)
    n, k = spec.types[lin.inputs[1]].shape
    has_bias = len(lin.inputs) == 3
    res_rows = spec.types[residual].shape == spec.types[add.outputs[0]].shape
    elem = _p.ELEM_BYTES[str(spec.types[lin.inputs[0]].dtype)]
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, w = inputs[args[0]], inputs[args[1]]
        bias = inputs[args[2]] if has_bias else w  # any pointer when there is no bias
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            plans[m] = _p.launch_plan(config, m, k, elem, traits)
        tiles, opts = plans[m]
        if tiles["HINT"]:
            _p.check_aligned("linear+residual", x, w)
        grid = (triton.cdiv(n, tiles["BLOCK_N"]), triton.cdiv(m, tiles["BLOCK_M"]))
        _linear_residual[grid](x, w, bias, inputs[r_i], outputs[0], m, N=n, K=k, HAS_BIAS=has_bias,
                               RES_ROWS=res_rows, **tiles, **opts)  # fmt: skip

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    lin, add, residual = _parts(spec)
    n, k = spec.types[lin.inputs[1]].shape
    dtype = str(spec.types[lin.inputs[0]].dtype)
    tiles, opts = _p.launch_plan(config, _p.row_count(spec, lin.inputs[0]), k, _p.ELEM_BYTES[dtype], traits)
    consts = {"N": n, "K": k, "HAS_BIAS": len(lin.inputs) == 3,
              "RES_ROWS": spec.types[residual].shape == spec.types[add.outputs[0]].shape, **tiles}  # fmt: skip
    ptr = "*" + _p.FLOATS[dtype]
    sig = {"x_ptr": ptr, "w_ptr": ptr, "b_ptr": ptr, "r_ptr": ptr, "y_ptr": ptr, "M": "i32",
           **{c: "constexpr" for c in consts}}  # fmt: skip
    name = f"linear_residual_{'gemm' if tiles['USE_DOT'] else 'gemv'}"
    return [CompileUnit(name, _linear_residual, sig, consts, opts)]
