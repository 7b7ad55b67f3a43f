"""linear: y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]), M = the flattened leading dims of x.

Two code paths, picked by M at launch (M <= GEMV_MAX_M = 2 takes the GEMV):

GEMV (decode): each program owns `gemv_block_n` rows of W and streams them along the contiguous K
  dim in chunks of `gemv_block_k`, 16-byte vector loads (8 bf16 a thread and load; the alignment is
  stated to the compiler with tl.multiple_of, so ahead-of-time units vectorize as the JIT does). The
  M activation rows are re-read per chunk from L1/L2 (K * M * 2 bytes). Products accumulate
  elementwise in a [BLOCK_M, BLOCK_N, BLOCK_K] fp32 tile and are reduced over K once, after the
  loop, so the loop body is loads and FMAs only; the chunk halves as M grows so that the tile stays at
  most 64 fp32 registers a thread (gemv_block_k is the chunk at M = 1). W is read exactly once.
  At N = K = 2048 the default (2 rows x 2048) launches 1024 programs of 4 warps, ~8 per H200 SM, all
  resident at once: 8 MB in flight from the first instant.
  `split_k` > 1 cuts K into spans on a second grid axis; each program writes fp32 partial sums to a
  workspace [split_k, M, N] and a second tiny kernel adds the spans (+ bias) and casts: two passes, no
  atomics, deterministic, graph-capturable. It is for a small N with a long K (an MoE router), where
  the row blocks alone are too few programs; on an H200 at N=512, K=2048 one pass is faster (2.6 us
  against 4.0 us with split_k=4), so the default is 1. The workspace is this file's one allocation:
  made on the first launch at a given M and device, reused after (the runtime's warm-up launches run
  before graph capture).
GEMM (prefill): tl.dot tiles of block_m x block_n x block_k (wgmma on Hopper when block_m >= 64, mma
  below; MFMA on CDNA), grouped launch order (group_m) so row tiles share W column tiles in L2,
  num_stages-deep software pipelining. block_m shrinks to the next power of two >= max(M, 16).

Config keys: gemv_block_n, gemv_block_k, gemv_warps, split_k (GEMV); block_m, block_n, block_k,
num_warps, num_stages, group_m (GEMM); the arch's launch options (waves_per_eu) where it takes them. One config carries a setting for each
path; a shape takes only one path, so the list zips the two spaces instead of taking their product.

Constraints (supports): cuda or rocm target; x, w, bias and y of one float dtype (bf16, f16, f32);
concrete K and N; N * K < 2**31 (32-bit offsets). Every tensor contiguous, with a 16-byte aligned base
where the vector loads rely on it (checked at launch). fp32 accumulation; an f32 tl.dot runs in IEEE precision (no TF32), so every dtype
meets its op tolerance against the reference.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "linear"

# Measured on an H200 (triton 3.6, M=1 bf16, weights cycled through more than L2, CUDA graphs): 2 rows
# x 2048 of K with 4 warps was best or within 3% of best at every (N, K) of a 30-setting sweep: 3.5 TB/s
# at 8192x2048, 3.9 at 16384x2048, 4.5 at 128256x2048 (the copy bandwidth, read + write, is 4.2-4.3).
# GEMM: 128x128x64 with 8 warps and 4 stages gave 564 TFLOP/s at 2048^3; 64x64x128 with 4 warps was
# best at M=512 (378 TFLOP/s, more tiles for 132 SMs) and at M=4..16 (3.1 TB/s at M=16, N=8192).
_WARP32_CONFIGS = [
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4, "split_k": 1,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4, "group_m": 8},
    {"gemv_block_n": 4, "gemv_block_k": 2048, "gemv_warps": 8, "split_k": 1,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3, "group_m": 8},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4, "split_k": 1,
     "block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3, "group_m": 8},
    {"gemv_block_n": 2, "gemv_block_k": 1024, "gemv_warps": 4, "split_k": 1,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4, "group_m": 4},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4, "split_k": 4,
     "block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4, "group_m": 8},
]  # fmt: skip
# Written for 64-wide waves (not measured: no AMD machine here): 4 waves are 256 lanes, so one 16-byte
# load a lane covers 2048 bf16 of K; MFMA-friendly tiles (multiples of 32), two LDS stages (the stream
# pipeliner's depth), waves_per_eu as the occupancy hint. The first tile stages 96 KB of A and B, so
# only a chip whose block may take more than 64 KB of LDS keeps it (CDNA4's 160 KB): 256 rows read each
# W tile once for twice the rows of the next, for the compute-bound prefill GEMM; unmeasured, so no
# speedup is claimed. Where it does not fit, the 128 x 128 tile after it is the default.
_WAVE64_CONFIGS = [
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4, "split_k": 1,
     "block_m": 256, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "group_m": 8,
     "waves_per_eu": 2},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4, "split_k": 1,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "group_m": 8,
     "waves_per_eu": 2},
    {"gemv_block_n": 4, "gemv_block_k": 2048, "gemv_warps": 4, "split_k": 1,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 2, "group_m": 8,
     "waves_per_eu": 2},
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 8, "split_k": 1,
     "block_m": 256, "block_n": 256, "block_k": 32, "num_warps": 8, "num_stages": 2, "group_m": 4,
     "waves_per_eu": 0},
    {"gemv_block_n": 4, "gemv_block_k": 1024, "gemv_warps": 4, "split_k": 4,
     "block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 2, "group_m": 8,
     "waves_per_eu": 1},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to
# The M thresholds, the narrow tiles for 2 < M <= 64 and the launch options the projection files share
# (this file's GEMV splits K, so that tile is its own; its GEMM orders the tiles in groups along M).
_p = depend("triton/_projection.py", "f1c538360559b1c984c3825d678bd34fba79798a6e93c2b508f82df2d975d001")
GEMV_MAX_M, GEMV_TILE_REGS = _p.GEMV_MAX_M, _p.GEMV_TILE_REGS
_gemm_tile = _p.gemm_tile  # the tl.dot K loop; the grouped tile order around it is this file's


def configs(traits: Any) -> list[dict[str, Any]]:
    return _p.configs(_WARP32_CONFIGS, _WAVE64_CONFIGS, traits)


# --- kernels -----------------------------------------------------------------------------------------


@triton.jit
def _gemv_tile(x_ptr, w_rows, M, k_begin, K: tl.constexpr, K_SPAN: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr, HINT: tl.constexpr):  # fmt: skip
    """acc[BLOCK_M, BLOCK_N] fp32 = x[:M, span] @ W[rows, span]^T; w_rows: [BLOCK_N] row pointers.

    Products accumulate elementwise in a [BLOCK_M, BLOCK_N, BLOCK_K] fp32 tile and are reduced over K
    once, after the loop: no cross-lane traffic inside it (host code keeps the tile <= 64 registers)."""
    offs_k = tl.arange(0, BLOCK_K)
    # padding rows (m >= M) read row M-1 again; their results are never stored
    x_rows = x_ptr + tl.minimum(tl.arange(0, BLOCK_M), M - 1) * K  # [BLOCK_M]
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K_SPAN, BLOCK_K):
        ks = k_begin + k0 + offs_k
        wp = w_rows[:, None] + ks[None, :]  # [BLOCK_N, BLOCK_K]
        xp = x_rows[:, None] + ks[None, :]  # [BLOCK_M, BLOCK_K]
        if HINT:
            wp = tl.multiple_of(wp, [16, 16])
            xp = tl.multiple_of(xp, [16, 16])
        if EVEN_K:
            w = tl.load(wp)
            x = tl.load(xp)
        else:
            kmask = (k0 + offs_k < K_SPAN)[None, :]
            w = tl.load(wp, mask=kmask, other=0.0)
            x = tl.load(xp, mask=kmask, other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return tl.sum(acc, axis=2)


@triton.jit(do_not_specialize=["M"])
def _linear_gemv(x_ptr, w_ptr, b_ptr, y_ptr, M,
                 N: tl.constexpr, K: tl.constexpr, K_SPAN: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr, USE_GDC: tl.constexpr):  # fmt: skip
    if USE_GDC:  # launched with PDL: every program waits for the previous kernel before any read (_pdl.py)
        _p.gdc_wait()
        _p.gdc_launch_dependents()
    # x: [M, K], w: [N, K], y: [M, N] (SPLIT_K == 1) or the fp32 workspace [SPLIT_K, M, N]
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # tail rows load row N-1 again (unmasked vector loads); their results are never stored
    w_rows = w_ptr + tl.minimum(rows, N - 1) * K
    acc = _gemv_tile(x_ptr, w_rows, M, pid_k * K_SPAN, K, K_SPAN, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    offs_m = tl.arange(0, BLOCK_M)
    mask = (offs_m < M)[:, None] & (rows < N)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * N + rows[None, :], _to(acc, y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(y_ptr + (pid_k * M + offs_m[:, None]) * N + rows[None, :], acc, mask=mask)


@triton.jit(do_not_specialize=["MN"])
def _splitk_reduce(ws_ptr, b_ptr, y_ptr, MN, N: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # ws: [SPLIT_K, M*N] fp32 partial sums -> y: [M*N]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, _to(acc, y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _linear_gemm(x_ptr, w_ptr, b_ptr, y_ptr, M,
                 N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr, USE_GDC: tl.constexpr):  # fmt: skip
    if USE_GDC:  # launched with PDL: every program waits for the previous kernel before any read (_pdl.py)
        _p.gdc_wait()
        _p.gdc_launch_dependents()
    # x: [M, K], w: [N, K], y: [M, N]; grouped order: GROUP_M row tiles share each W column tile in L2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # clamped rows: unmasked loads; the tail's duplicates are never stored
    x_rows = x_ptr + tl.minimum(offs_m, M - 1) * K
    w_rows = w_ptr + tl.minimum(offs_n, N - 1) * K
    acc, _ = _gemm_tile(x_rows, x_ptr, w_rows, K, False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], _to(acc, y_ptr.dtype.element_ty), mask=mask)


# --- the contract ------------------------------------------------------------------------------------


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != "linear":
        return False
    node = spec.single
    types = [spec.types[v] for v in (*node.inputs, node.outputs[0])]
    n, k = spec.types[node.inputs[1]].shape
    return (
        all(str(t.dtype) in _p.FLOATS for t in types)
        and len({t.dtype for t in types}) == 1
        and isinstance(n, int)
        and isinstance(k, int)
        and n * k < 2**31
    )


def _shape(spec: Any) -> tuple[int, int, bool]:
    node = spec.single
    n, k = spec.types[node.inputs[1]].shape
    return n, k, len(node.inputs) == 3


def _gemv_block_k(k: int, block_m: int, block_n: int, config: dict[str, Any], warp: int) -> int:
    """The K chunk: the config's, at most next_pow2(K) (K: the span a program covers), and small enough that the accumulator tile
    [block_m, block_n, chunk] stays within GEMV_TILE_REGS fp32 registers a thread."""
    cap = GEMV_TILE_REGS * warp * config["gemv_warps"] // (block_m * block_n)
    return max(
        16, min(config["gemv_block_k"], triton.next_power_of_2(k), triton.next_power_of_2(cap + 1) // 2)
    )


def _plan(n: int, k: int, m: int, config: dict[str, Any], elem: int, warp: int) -> tuple[str, dict[str, Any]]:
    """The kernel and constexprs one launch of M rows uses: the single source for build and AOT."""
    hint = k % (16 // elem) == 0
    if m <= GEMV_MAX_M:
        block_m = triton.next_power_of_2(m)
        split = config["split_k"] if k % config["split_k"] == 0 else 1
        span = k // split
        block_k = _gemv_block_k(span, block_m, config["gemv_block_n"], config, warp)
        # a span must start 16-byte aligned for the vector-load hint to hold
        hint = hint and span % (16 // elem) == 0
        return "gemv", {
            "N": n, "K": k, "K_SPAN": span, "BLOCK_M": block_m, "BLOCK_N": config["gemv_block_n"],
            "BLOCK_K": block_k, "SPLIT_K": split, "EVEN_K": span % block_k == 0, "HINT": hint,
        }  # fmt: skip
    block_m = min(config["block_m"], max(16, triton.next_power_of_2(m)))
    block_k = config["block_k"]
    return "gemm", {
        "N": n, "K": k, "BLOCK_M": block_m, "BLOCK_N": config["block_n"], "BLOCK_K": block_k,
        "GROUP_M": config["group_m"], "EVEN_K": k % block_k == 0, "HINT": hint,
    }  # fmt: skip


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    n, k, has_bias = _shape(spec)
    args = spec.args(spec.single)
    elem = _p.ELEM_BYTES[str(spec.types[spec.single.inputs[0]].dtype)]
    plans: dict[int, tuple[str, dict[str, Any], dict[str, Any]]] = {}
    workspaces: dict[tuple[Any, int], Any] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, w = inputs[args[0]], inputs[args[1]]
        bias = inputs[args[2]] if has_bias else w  # any pointer when there is no bias
        y = outputs[0]
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            cfg = _p.skinny(config, m, traits)
            path, consts = _plan(n, k, m, cfg, elem, traits.warp_size)
            plans[m] = (path, {**consts, "USE_GDC": _p.gdc(traits)}, _p.options(cfg, path == "gemm", traits))
        path, consts, opts = plans[m]
        if consts["HINT"]:
            _p.check_aligned("linear", x, w)
        if path == "gemm":
            grid = (triton.cdiv(m, consts["BLOCK_M"]) * triton.cdiv(n, consts["BLOCK_N"]),)
            _linear_gemm[grid](x, w, bias, y, m, HAS_BIAS=has_bias, **consts, **opts)
            return
        split = consts["SPLIT_K"]
        grid = (triton.cdiv(n, consts["BLOCK_N"]), split)
        if split == 1:
            _linear_gemv[grid](x, w, bias, y, m, HAS_BIAS=has_bias, **consts, **opts)
            return
        key = (x.device, m)
        ws = workspaces.get(key)
        if ws is None:
            ws = workspaces[key] = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        _linear_gemv[grid](x, w, bias, ws, m, HAS_BIAS=has_bias, **consts, **opts)
        _splitk_reduce[(triton.cdiv(m * n, 1024),)](
            ws, bias, y, m * n, N=n, HAS_BIAS=has_bias, SPLIT_K=split, BLOCK=1024, num_warps=4
        )

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    n, k, has_bias = _shape(spec)
    node = spec.single
    x_t = spec.types[node.inputs[0]]
    m = 1
    for d in x_t.shape[:-1]:
        m *= int(d)
    dt = "*" + _p.FLOATS[str(x_t.dtype)]
    elem = _p.ELEM_BYTES[str(x_t.dtype)]
    cfg = _p.skinny(config, m, traits)
    path, consts = _plan(n, k, m, cfg, elem, traits.warp_size)
    consts = {**consts, "HAS_BIAS": has_bias, "USE_GDC": _p.gdc(traits)}
    opts = _p.options(cfg, path == "gemm", traits)
    ptrs = {"x_ptr": dt, "w_ptr": dt, "b_ptr": dt, "y_ptr": dt, "M": "i32"}
    if path == "gemm":
        sig = {**ptrs, **{c: "constexpr" for c in consts}}
        return [CompileUnit("linear_gemm", _linear_gemm, sig, consts, opts)]
    split = consts["SPLIT_K"]
    if split == 1:
        sig = {**ptrs, **{c: "constexpr" for c in consts}}
        return [CompileUnit("linear_gemv", _linear_gemv, sig, consts, opts)]
    sig = {**ptrs, "y_ptr": "*fp32", **{c: "constexpr" for c in consts}}
    reduce_consts = {"N": n, "HAS_BIAS": has_bias, "SPLIT_K": split, "BLOCK": 1024}
    reduce_sig = {"ws_ptr": "*fp32", "b_ptr": dt, "y_ptr": dt, "MN": "i32",
                  **{c: "constexpr" for c in reduce_consts}}  # fmt: skip
    return [
        CompileUnit("linear_gemv_splitk", _linear_gemv, sig, consts, opts),
        CompileUnit("linear_splitk_reduce", _splitk_reduce, reduce_sig, reduce_consts, {"num_warps": 4}),
    ]
