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

Config keys: gemv_block_n, gemv_block_k, gemv_warps, gemv_prefetch (GEMV; `gemv_prefetch`: the first K
chunk of the weights loaded before the PDL wait, _projection.gemv_tile_prefetch); block_m, block_n, block_k, num_warps,
num_stages (GEMM); the arch's launch options (waves_per_eu) where it takes them. Each config zips one GEMV and one GEMM setting.

Constraints (supports): cuda or rocm; every tensor of one float dtype (bf16, f16, f32); concrete N and
K with N * K < 2**31; contiguous tensors with 16-byte aligned bases (checked at launch); every
projection's output is an output of the group.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "rmsnorm+linear"

# The projection core (tiles, paths, the norm's row kernel) shared with the other projection files,
# pinned by content hash.
_p = depend("triton/_projection.py", "f1c538360559b1c984c3825d678bd34fba79798a6e93c2b508f82df2d975d001")
_to, _gemv_tile, _gemm_tile = _p.round_to, _p.gemv_tile, _p.gemm_tile  # called by this file's kernels

# Measured on an H200 (M=1 bf16, final norm + lm_head 128256 x 2048): 8 rows x 1024 of K with 4 warps
# read 3.97 TB/s, 93% of the copy bandwidth and on par with cuBLAS's GEMV (4.00); 2 rows read 3.14. Each
# program re-reads x and w_norm (4 KB each at K=2048) from L2, so more rows a program amortize them.
_WARP32_CONFIGS = [
    # The default since an H200 sweep (bench/decode.py --sweep, 2026-11-30): the norm as its own kernel
    # on the tl.dot path (M > 2), 128-wide N tiles at M <= 64. final_norm + lm_head 386 -> 134 us at
    # M = 8 and 430 -> 141 us at M = 32 against the folded norm below; the GEMV (M <= 2) is the same.
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4, "norm_prologue": True,
     "skinny_block_n": 128, "skinny_block_k": 64, "skinny_warps": 8, "skinny_stages": 4,
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
     "skinny_block_n": 128, "skinny_block_k": 64, "skinny_warps": 8, "skinny_stages": 4,
     "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
]  # fmt: skip
CONFIGS = _WARP32_CONFIGS


def configs(traits: Any) -> list[dict[str, Any]]:
    return _p.configs(_WARP32_CONFIGS, _p.WAVE64_CONFIGS, traits)


# --- the kernel --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _rmsnorm_linear(x_ptr, wn_ptr, w_ptr, b_ptr, y_ptr, n_ptr, M, eps,
                    N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_NORM: tl.constexpr,
                    USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HINT: tl.constexpr,
                    NORM: tl.constexpr, PREFETCH: tl.constexpr, USE_GDC: tl.constexpr):  # fmt: skip
    # launched with PDL: every program waits for the previous kernel before any read (_pdl.py); with
    # PREFETCH the GEMV tile waits instead, after its first weight loads
    if USE_GDC and not PREFETCH:
        _p.gdc_wait()
        _p.gdc_launch_dependents()
    # x: [M, K], w_norm: [K], w: [N, K], y: [M, N], n: [M, K]
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + tl.minimum(rows, N - 1) * K  # tail rows repeat row N-1, never stored
    x_rows = x_ptr + tl.minimum(offs_m, M - 1) * K  # padding rows (m >= M) repeat row M-1, never stored
    if USE_DOT:
        acc, ss = _gemm_tile(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT)
    elif PREFETCH:
        acc, ss = _p.gemv_tile_prefetch(x_rows, wn_ptr, w_rows, K, NORM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                                        HINT, USE_GDC)  # fmt: skip
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
    if len(dtypes) != 1 or str(next(iter(dtypes))) not in _p.FLOATS:
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


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    norm, _ = _parts(spec)
    x_i, wn_i = spec.args(norm)
    eps = float(spec.attrs(norm)["eps"])
    k = spec.types[norm.inputs[1]].shape[0]
    elem = _p.ELEM_BYTES[str(spec.types[norm.inputs[0]].dtype)]
    n_out = spec.outputs.index(norm.outputs[0]) if norm.outputs[0] in spec.outputs else None
    launches = _launches(spec)
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, wn = inputs[x_i], inputs[wn_i]
        m = x.numel() // k
        if m == 0:
            return
        if m not in plans:
            plans[m] = _p.launch_plan(config, m, k, elem, traits)
        tiles, opts = plans[m]
        n_buf = outputs[n_out] if n_out is not None else x
        norm = not _p.norm_prologue(config, tiles)
        if not norm:  # the norm as its own kernel (into the norm's output when the group has one)
            if n_out is None:
                n_buf = torch.empty((m, k), dtype=x.dtype, device=x.device)
            _p.rms_rows[(m,)](x, wn, n_buf, eps, K=k, BLOCK_K=_p.row_block(k), num_warps=4)
            x = n_buf
        for p in launches:
            w = inputs[p["w"]]
            if tiles["HINT"]:
                _p.check_aligned("rmsnorm+linear", x, w)
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


def launches(spec: Any, config: dict[str, Any], traits: Any) -> int:
    """One launch per projection (identical ones share a compile unit), plus the norm's row kernel
    where the config runs it first."""
    norm, _ = _parts(spec)
    dtype = str(spec.types[norm.inputs[0]].dtype)
    k = spec.types[norm.inputs[1]].shape[0]
    tiles, _ = _p.launch_plan(config, _p.row_count(spec, norm.inputs[0]), k, _p.ELEM_BYTES[dtype], traits)
    return len(_launches(spec)) + int(_p.norm_prologue(config, tiles))


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    norm, _ = _parts(spec)
    k = spec.types[norm.inputs[1]].shape[0]
    dtype = str(spec.types[norm.inputs[0]].dtype)
    tiles, opts = _p.launch_plan(config, _p.row_count(spec, norm.inputs[0]), k, _p.ELEM_BYTES[dtype], traits)
    ptr = "*" + _p.FLOATS[dtype]
    units: dict[str, Any] = {}
    norm = not _p.norm_prologue(config, tiles)
    if not norm:
        rows = {"K": k, "BLOCK_K": _p.row_block(k)}
        row_sig = {"x_ptr": ptr, "wn_ptr": ptr, "n_ptr": ptr, "eps": "fp32", **{c: "constexpr" for c in rows}}
        units["rows"] = CompileUnit("rmsnorm_linear_rows", _p.rms_rows, row_sig, rows, {"num_warps": 4})
    for p in _launches(spec):
        consts = {"N": p["N"], "K": k, "HAS_BIAS": p["b"] is not None, "WRITE_NORM": p["WRITE_NORM"] and norm,
                  "NORM": norm, **tiles}  # fmt: skip
        sig = {"x_ptr": ptr, "wn_ptr": ptr, "w_ptr": ptr, "b_ptr": ptr, "y_ptr": ptr, "n_ptr": ptr,
               "M": "i32", "eps": "fp32", **{c: "constexpr" for c in consts}}  # fmt: skip
        name = f"rmsnorm_linear_{'gemm' if tiles['USE_DOT'] else 'gemv'}_n{p['N']}"
        units.setdefault(repr(sorted(consts.items())), CompileUnit(name, _rmsnorm_linear, sig, consts, opts))
    return list(units.values())
