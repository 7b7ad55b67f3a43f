"""silu*mul: out = silu(gate) * up in one pass, the SwiGLU product where the gate and up projections
run as plain GEMMs (a GPU prefill: above FUSED_NORM_MAX_ROWS rows the norm-folded SwiGLU kernel does
not run). Unfused, `silu` and `mul` are two elementwise kernels that write and read back the whole
activation: at a 2048-token Llama-3.2-1B prefill on an H200 they took 50.2 and 69.6 us a layer.

Flat over the elements, `block` a program; fp32 math. silu(gate) is rounded to the output dtype
before the product, as the unfused graph stores it, so the result equals the two kernels' bit for bit.

Config keys: block, num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; gate, up, the silu and the output of one float dtype (bf16,
f16, f32) and one shape (no broadcast); contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "silu*mul"

# Not measured yet: 16-byte loads per lane at 1024 or 4096 elements a program.
CONFIGS = [
    {"block": 1024, "num_warps": 4},
    {"block": 4096, "num_warps": 8},
    {"block": 2048, "num_warps": 4},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to


@triton.jit(do_not_specialize=["N"])
def _silu_mul(g_ptr, u_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act = _to(g / (1.0 + tl.exp(-g)), y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + offs, _to(act * u, y_ptr.dtype.element_ty), mask=mask)


# --- the contract ------------------------------------------------------------------------------------


def _parts(spec: Any) -> tuple[str, str, str, str]:
    """(gate, up, silu output, output) value names."""
    silu, mul = spec.node("silu"), spec.node("mul")
    act = silu.outputs[0]
    (up,) = [v for v in mul.inputs if v != act] or [act]
    return silu.inputs[0], up, act, mul.outputs[0]


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or spec.pattern != "silu*mul":
        return False
    gate, up, act, out = _parts(spec)
    if up == act:  # silu(x) * silu(x): not SwiGLU
        return False
    types = [spec.types[v] for v in (gate, up, act, out)]
    return (
        len({t.dtype for t in types}) == 1
        and str(types[0].dtype) in _FLOATS
        and len({t.shape for t in types}) == 1
    )


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    gate, up, _, _ = _parts(spec)
    g_i, u_i = spec.inputs.index(gate), spec.inputs.index(up)
    block, opts = config["block"], _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        y = outputs[0]
        n = y.numel()
        if n:
            _silu_mul[(triton.cdiv(n, block),)](inputs[g_i], inputs[u_i], y, n, BLOCK=block, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    gate, _, _, out = _parts(spec)
    ptr = "*" + _FLOATS[str(spec.types[gate].dtype)]
    sig = {"g_ptr": ptr, "u_ptr": ptr, "y_ptr": ptr, "N": "i32", "BLOCK": "constexpr"}
    opts = {**_t.launch_options(config, traits), "num_stages": 1}
    return [CompileUnit("silu_mul", _silu_mul, sig, {"BLOCK": config["block"]}, opts)]
