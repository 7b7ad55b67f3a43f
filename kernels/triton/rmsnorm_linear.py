"""rmsnorm+linear: n = rmsnorm(x, w_norm) and every projection y_i = n @ W_i^T (+ b_i) that reads it
(the final norm and the lm_head; a norm and an MoE router), the norm folded into the projection.

The norm never makes a round trip through memory: each program accumulates sum(x^2) of its rows in
the same K loop that streams W (the activation chunk is in registers anyway), multiplies the chunk by
w_norm before the products, and divides by rms = sqrt(mean(x^2) + eps) in the epilogue:
y = (sum_k x_k w_norm_k W_nk) / rms. That is the reference's math reassociated; in bf16 it skips the
reference's rounding of n before the GEMV, a difference far inside the op tolerance. The statistic
costs nothing extra at decode (x is K * 2 bytes; W is N * K * 2). One launch per projection; when the
norm is itself an output of the group (read outside it, e.g. by moe_ffn), the first launch's programs
of the first column block also write n = x / rms * w_norm for their rows (a second, cheap pass over x).

Paths and tiles as in linear.py: GEMV for M <= GEMV_MAX_M (gemv_block_n rows of W a program, K chunks
of gemv_block_k, 16-byte loads, reduction deferred to after the loop), tl.dot tiles above it (there the
A tile is scaled by w_norm and rounded to the activation dtype before the MMA).

Config keys: gemv_block_n, gemv_block_k, gemv_warps (GEMV); block_m, block_n, block_k, num_warps,
num_stages (GEMM); waves_per_eu on rocm. Each config zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; every tensor of one float dtype (bf16, f16, f32); concrete N and
K with N * K < 2**31; contiguous tensors with 16-byte aligned bases (checked at launch); every
projection's output is an output of the group.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

IMPLEMENTS = "rmsnorm+linear"

# Measured on an H200 (M=1 bf16, final norm + lm_head 128256 x 2048): 8 rows x 1024 of K with 4 warps
# read 3.97 TB/s, 93% of the copy bandwidth and on par with cuBLAS's GEMV (4.00); 2 rows read 3.14. Each
# program re-reads x and w_norm (4 KB each at K=2048) from L2, so more rows a program amortize them.
_CUDA_CONFIGS = [
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4,
     "block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 4,
     "block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4},
    {"gemv_block_n": 16, "gemv_block_k": 512, "gemv_warps": 8,
     "block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3},
    # Not measured yet: the norm as its own kernel on the tl.dot path (M > 2), with 128-wide N tiles at
    # M <= 64 (lm_head's 128256 rows: each tile re-reads x, so fewer and wider tiles). At M = 32 the
    # folded norm took lm_head to 430 us, 30% of copy bandwidth.
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4, "norm_prologue": True,
     "skinny_block_n": 128, "skinny_block_k": 64, "skinny_warps": 8, "skinny_stages": 4,
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
        tl.store(n_ptr + row * K + k0 + ks, _to(x / rms * w, n_ptr.dtype.element_ty), mask=k0 + ks < K)


@triton.jit(do_not_specialize=["M"])
def _rmsnorm_linear(x_ptr, wn_ptr, w_ptr, b_ptr, y_ptr, n_ptr, M, eps,
                    N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_NORM: tl.constexpr,
                    USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr,
                    NORM: tl.constexpr):  # fmt: skip
    # x: [M, K], w_norm: [K], w: [N, K], y: [M, N], n: [M, K]
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + tl.minimum(rows, N - 1) * K  # tail rows repeat row N-1, never stored
    x_rows = x_ptr + tl.minimum(offs_m, M - 1) * K  # padding rows (m >= M) repeat row M-1, never stored
    if USE_DOT:
        acc, ss = _gemm_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    else:
        acc, ss = _gemv_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    rms = tl.sqrt(ss / K + eps)  # [BLOCK_M]
    if NORM:
        y = acc / rms[:, None]
    else:  # x is already the normalized activation (the norm_prologue path; WRITE_NORM is off)
        y = acc
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[None, :]
    m_ok = offs_m < M
    mask = m_ok[:, None] & (rows < N)[None, :]
    tl.store(y_ptr + offs_m[:, None] * N + rows[None, :], _to(y, y_ptr.dtype.element_ty), mask=mask)
    if WRITE_NORM:  # noqa: SIM102 (nested: a constexpr gate, then a runtime branch)
        if pid_n == 0:
            offs_k = tl.arange(0, BLOCK_K)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + offs_k
                kmask = m_ok[:, None] & (ks < K)[None, :]
                x = tl.load(x_ptr + offs_m[:, None] * K + ks[None, :], mask=kmask, other=0.0).to(tl.float32)
                wn = tl.load(wn_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
                n = x / rms[:, None] * wn[None, :]
                tl.store(
                    n_ptr + offs_m[:, None] * K + ks[None, :], _to(n, n_ptr.dtype.element_ty), mask=kmask
                )


# --- the contract ------------------------------------------------------------------------------------


def _parts(spec: Any) -> tuple[Any, list[Any]]:
    norm = spec.node("rmsnorm")
    return norm, [n for n in spec.nodes if n.op == "linear"]


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or spec.pattern != "rmsnorm+linear":
        return False
    norm, linears = _parts(spec)
    values = {v for n in spec.nodes for v in (*n.inputs, *n.outputs)}
    dtypes = {spec.types[v].dtype for v in values}
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _FLOATS:
        return False
    k = spec.types[norm.inputs[1]].shape[0]
    for lin in linears:
        n, kw = spec.types[lin.inputs[1]].shape
        if not (isinstance(n, int) and kw == k and n * k < 2**31 and lin.outputs[0] in spec.outputs):
            return False
        if lin.inputs[0] != norm.outputs[0]:
            return False
    return isinstance(k, int) and bool(linears)


def _launches(spec: Any) -> list[dict[str, Any]]:
    """One launch per projection: its weight, bias and output, and whether it writes the norm."""
    norm, linears = _parts(spec)
    write_norm = norm.outputs[0] in spec.outputs
    out = []
    for i, lin in enumerate(linears):
        n = spec.types[lin.inputs[1]].shape[0]
        out.append({
            "w": spec.inputs.index(lin.inputs[1]),
            "b": spec.inputs.index(lin.inputs[2]) if len(lin.inputs) == 3 else None,
            "y": spec.outputs.index(lin.outputs[0]),
            "N": n,
            "WRITE_NORM": write_norm and i == 0,
        })  # fmt: skip
    return out


def build(spec: Any, config: dict[str, Any], target: Any) -> Any:
    norm, _ = _parts(spec)
    x_i, wn_i = spec.args(norm)
    eps = float(spec.attrs(norm)["eps"])
    k = spec.types[norm.inputs[1]].shape[0]
    elem = _ELEM_BYTES[str(spec.types[norm.inputs[0]].dtype)]
    n_out = spec.outputs.index(norm.outputs[0]) if norm.outputs[0] in spec.outputs else None
    launches = _launches(spec)
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, wn = inputs[x_i], inputs[wn_i]
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            cfg = _skinny(config, m, target)
            tiles = _tiles(k, m, cfg, elem, target.warp_size)
            plans[m] = (tiles, _options(cfg, tiles["USE_DOT"], target))
        tiles, opts = plans[m]
        n_buf = outputs[n_out] if n_out is not None else x
        norm = not _prologue(config, tiles)
        if not norm:  # the norm as its own kernel (into the norm's output when the group has one)
            if n_out is None:
                n_buf = torch.empty((m, k), dtype=x.dtype, device=x.device)
            _rms_rows[(m,)](x, wn, n_buf, eps, K=k, BLOCK_K=_row_block(k), num_warps=4)
            x = n_buf
        for p in launches:
            w = inputs[p["w"]]
            if tiles["HINT"]:
                _check_aligned("rmsnorm+linear", x, w)
            bias = inputs[p["b"]] if p["b"] is not None else w  # any pointer when there is no bias
            grid = (triton.cdiv(p["N"], tiles["BLOCK_N"]), triton.cdiv(m, tiles["BLOCK_M"]))
            _rmsnorm_linear[grid](
                x,
                wn,
                w,
                bias,
                outputs[p["y"]],
                n_buf,
                m,
                eps,
                N=p["N"],
                K=k,
                HAS_BIAS=p["b"] is not None,
                WRITE_NORM=p["WRITE_NORM"] and norm,
                NORM=norm,
                **tiles,
                **opts,
            )

    return launch


def _prologue(config: dict[str, Any], tiles: dict[str, Any]) -> bool:
    """The norm runs as its own kernel first: on the tl.dot path, where the config asks for it."""
    return bool(config.get("norm_prologue")) and tiles["USE_DOT"]


def _row_block(k: int) -> int:
    return min(triton.next_power_of_2(k), 1024)


def compile_units(spec: Any, config: dict[str, Any], target: Any) -> list[Any]:
    from polymorph.kernel_files import CompileUnit

    norm, _ = _parts(spec)
    k = spec.types[norm.inputs[1]].shape[0]
    dtype = str(spec.types[norm.inputs[0]].dtype)
    cfg = _skinny(config, _rows(spec, norm.inputs[0]), target)
    tiles = _tiles(k, _rows(spec, norm.inputs[0]), cfg, _ELEM_BYTES[dtype], target.warp_size)
    opts = _options(cfg, tiles["USE_DOT"], target)
    ptr = "*" + _FLOATS[dtype]
    units: dict[str, Any] = {}
    norm = not _prologue(config, tiles)
    if not norm:
        rows = {"K": k, "BLOCK_K": _row_block(k)}
        row_sig = {"x_ptr": ptr, "wn_ptr": ptr, "n_ptr": ptr, "eps": "fp32", **{c: "constexpr" for c in rows}}
        units["rows"] = CompileUnit("rmsnorm_linear_rows", _rms_rows, row_sig, rows, {"num_warps": 4})
    for p in _launches(spec):
        consts = {"N": p["N"], "K": k, "HAS_BIAS": p["b"] is not None, "WRITE_NORM": p["WRITE_NORM"] and norm,
                  "NORM": norm, **tiles}  # fmt: skip
        sig = {"x_ptr": ptr, "wn_ptr": ptr, "w_ptr": ptr, "b_ptr": ptr, "y_ptr": ptr, "n_ptr": ptr,
               "M": "i32", "eps": "fp32", **{c: "constexpr" for c in consts}}  # fmt: skip
        name = f"rmsnorm_linear_{'gemm' if tiles['USE_DOT'] else 'gemv'}_n{p['N']}"
        units.setdefault(repr(sorted(consts.items())), CompileUnit(name, _rmsnorm_linear, sig, consts, opts))
    return list(units.values())
