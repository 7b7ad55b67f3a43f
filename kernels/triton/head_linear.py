"""head_linear: x[*, H, K], w[H, N, K] -> y[*, H, N], y[..., h, :] = x[..., h, :] @ w[h]^T per head
(Multi-head Latent Attention's absorbed up-projections: DeepSeek-V3 takes H=128 heads from K=128 to
N=512 for the queries and from K=512 back to N=128 for the output), fp32 accumulation, rounded once to
x's dtype, as `polymorph.ir.reference` does.

One kernel: a program owns a block_m x block_n tile of one head's output, M = the flattened leading
dims of x (the tokens), and runs a tl.dot loop over K in block_k steps (wgmma on Hopper when block_m
>= 64, mma below; MFMA on CDNA), num_stages-deep software pipelining. Grid (token tiles, N tiles,
heads). block_m shrinks to the next power of two >= max(M, 16), so a decode step (1-64 tokens) runs one
token tile and reads each head's weight once; block_n and block_k shrink likewise to a small N or K.
Rows past M or N load row M-1 or N-1 again (unmasked loads); their results are never stored. A K tail
is masked. An f32 tl.dot runs in IEEE precision (no TF32), so every dtype meets its op tolerance; it
runs on FMAs, so f32 launches take a K step of 16 and two stages (F32_BLOCK_K, F32_STAGES), which
compile without spills.
Under Triton's interpreter the dot operands are upcast to fp32 and the result rounded on its bits
(_interpreter.py), so CPU runs check the numerics compiled code has.

Config keys: block_m, block_n, block_k, num_warps, num_stages; the arch's launch options
(waves_per_eu) where it takes them. Not measured on a device: the tiles are the projection kernels'
(kernels/triton/linear.py) shapes, sized for K 128-512 and N 128-512.

Constraints (supports): cuda or rocm target; x, w and y of one float dtype (bf16, f16, f32); concrete
H, N and K; H * N * K < 2**31 (32-bit weight offsets; token offsets are 64-bit). Every tensor
contiguous (the launch checks x and w).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "head_linear"

# 32-wide warps. The first is the default: 64 x 128 tiles of 4 warps give a 2k-token prefill 32 x 4 x
# 128 = 16384 programs at N=512 and a decode step 4 x 128 = 512 (at N=128: 256); the others trade
# tile size for programs.
_WARP32_CONFIGS = [
    {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3},
    {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3},
    {"block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4},
]
# 64-wide waves (not measured: no AMD machine here): MFMA-friendly tiles, two LDS stages, waves_per_eu
# as the occupancy hint.
_WAVE64_CONFIGS = [
    {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 2, "waves_per_eu": 2},
    {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 2, "waves_per_eu": 2},
    {"block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 2, "waves_per_eu": 0},
]
CONFIGS = _WARP32_CONFIGS

# An f32 launch (IEEE tl.dot: FMAs, no tensor cores) takes a K step of at most 16 and at most two
# stages: the AOT compiles at DeepSeek-V3's shapes spilled with the bf16 tiles (64 x 128 x 64, 3 stages:
# ~300 bytes on sm_90) and not with these, on sm_90, sm_100, gfx942 and gfx950.
F32_BLOCK_K = 16
F32_STAGES = 2

_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
_ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2}

# Rounding as compiled code rounds, and dot operands upcast, under Triton's interpreter (_interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_INTERPRETED = _i.INTERPRETED
_to = _i.round_to
# Configs and launch options per chip, mapped from the lists above by its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")


def _shared(config: dict[str, Any]) -> int:
    return _t.gemm_shared(config["block_m"], config["block_n"], config["block_k"], config["num_stages"])


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits, shared=_shared)


# --- the kernel --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _head_linear(x_ptr, w_ptr, y_ptr, M, H: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr):  # fmt: skip
    # x: [M, H, K], w: [H, N, K], y: [M, H, N]
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    head = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # clamped rows: unmasked loads; the tail's duplicates are never stored
    x_rows = (tl.minimum(offs_m, M - 1).to(tl.int64) * H + head) * K  # [BLOCK_M]
    w_rows = (head * N + tl.minimum(offs_n, N - 1)) * K  # [BLOCK_N]
    xp = x_ptr + x_rows[:, None] + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    wp = w_ptr + w_rows[:, None] + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(xp)
            b = tl.load(wp)
        else:
            kmask = (k0 + offs_k < K)[None, :]
            a = tl.load(xp, mask=kmask, other=0.0)
            b = tl.load(wp, mask=kmask, other=0.0)
        if _INTERPRETED:  # the interpreter multiplies bf16 dot operands wrongly; fp32 products are exact
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if a.dtype == tl.float32:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        xp += BLOCK_K
        wp += BLOCK_K
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    yp = y_ptr + (offs_m.to(tl.int64) * H + head)[:, None] * N + offs_n[None, :]
    tl.store(yp, _to(acc, y_ptr.dtype.element_ty), mask=mask)


# --- the contract ------------------------------------------------------------------------------------


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != IMPLEMENTS:
        return False
    node = spec.single
    if len(node.inputs) != 2:
        return False
    x, w = (spec.types[v] for v in node.inputs)
    y = spec.types[node.outputs[0]]
    if x.rank < 2 or w.rank != 3 or y.rank != x.rank:
        return False
    h, n, k = w.shape
    return (
        all(str(t.dtype) in _FLOATS for t in (x, w, y))
        and len({x.dtype, w.dtype, y.dtype}) == 1
        and all(isinstance(d, int) and d > 0 for d in (h, n, k))
        and x.shape[-2:] == (h, k)
        and y.shape[-2:] == (h, n)
        and h * n * k < 2**31
    )


def _dims(spec: Any) -> tuple[int, int, int]:
    h, n, k = spec.types[spec.single.inputs[1]].shape
    return h, n, k


def _plan(h: int, n: int, k: int, m: int | None, config: dict[str, Any], elem: int,
          traits: Any) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """(constexprs, launch options) of a launch of M tokens (None: not known, the config's tile): the
    one source for build and AOT. Stages shrink until the A and B tiles fit the block's shared memory
    (an f32 tile takes twice the bf16 figure the configs are filtered by)."""
    block_m = config["block_m"] if m is None else min(config["block_m"], max(16, triton.next_power_of_2(m)))
    block_n = min(config["block_n"], max(16, triton.next_power_of_2(n)))
    block_k = min(config["block_k"], max(16, triton.next_power_of_2(k)))
    stages = config["num_stages"]
    if elem == 4:  # an IEEE f32 dot runs on FMAs with its K slices in registers: short, few in flight
        block_k, stages = min(block_k, F32_BLOCK_K), min(stages, F32_STAGES)
    if traits is not None:
        per_stage = _t.gemm_shared(block_m, block_n, block_k, 1, elem)
        stages = max(1, min(stages, traits.shared_per_block // per_stage))
    consts = {"H": h, "N": n, "K": k, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
              "EVEN_K": k % block_k == 0}  # fmt: skip
    opts = {"num_warps": config["num_warps"], "num_stages": stages, **_t.extra_options(config, traits)}
    return consts, opts


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    h, n, k = _dims(spec)
    x_i, w_i = spec.args(spec.single)
    elem = _ELEM_BYTES[str(spec.types[spec.single.inputs[0]].dtype)]
    plans: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, w = inputs[x_i], inputs[w_i]
        y = outputs[0]
        m = x.numel() // (h * k)
        if m == 0:
            return
        if not (x.is_contiguous() and w.is_contiguous() and y.is_contiguous()):
            raise ValueError(
                f"head_linear (triton): x {tuple(x.shape)}, w {tuple(w.shape)} and y {tuple(y.shape)} must "
                "be contiguous; the kernel indexes them as dense [M, H, K], [H, N, K] and [M, H, N]"
            )
        if m not in plans:
            plans[m] = _plan(h, n, k, m, config, elem, traits)
        consts, opts = plans[m]
        grid = (triton.cdiv(m, consts["BLOCK_M"]), triton.cdiv(n, consts["BLOCK_N"]), h)
        _head_linear[grid](x, w, y, m, **consts, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    h, n, k = _dims(spec)
    x_t = spec.types[spec.single.inputs[0]]
    m: int | None = 1
    for d in x_t.shape[:-2]:
        m = m * d if isinstance(d, int) and m is not None else None
    consts, opts = _plan(h, n, k, m, config, _ELEM_BYTES[str(x_t.dtype)], traits)
    ptr = "*" + _FLOATS[str(x_t.dtype)]
    sig = {"x_ptr": ptr, "w_ptr": ptr, "y_ptr": ptr, "M": "i32", **dict.fromkeys(consts, "constexpr")}
    return [CompileUnit("head_linear", _head_linear, sig, consts, opts)]
