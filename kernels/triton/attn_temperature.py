"""attn_temperature: x[B, S, H, Dh], positions[B, S] -> x * (log1p(floor((p + 1) / floor_scale)) * scale
+ 1) per token (Llama 4's attention temperature on its layers without rope), computed in fp32 and
rounded once to x's dtype, as `polymorph.ir.reference` does.

A program scales `block` elements of one token's row of H * Dh, the token's factor computed once in fp32:
(p + 1) / floor_scale by IEEE division (div_rn: the floor of a quotient at a multiple of floor_scale
must not drop by one), and log1p(y) as log(1 + y), exact in its argument since y = floor(...) is an
integer >= 0 (below 2**24) and tl.log1p is not in every Triton this runs on.

Config keys: block (elements a program), num_warps; the arch's launch options (waves_per_eu) where it
takes them.
Constraints (supports): cuda or rocm; x and the output of one float dtype (bf16, f16, f32); positions
i32 or i64; concrete heads and head_dim; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "attn_temperature"

CONFIGS = [
    {"block": 1024, "num_warps": 4},
    {"block": 4096, "num_warps": 8},
    {"block": 256, "num_warps": 2},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
_POSITIONS = {"i32": "i32", "i64": "i64"}

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to


@triton.jit
def _attn_temperature(x_ptr, pos_ptr, y_ptr, floor_scale, scale, ROW: tl.constexpr, BLOCK: tl.constexpr):
    # x, y: [T, ROW] (ROW = H * Dh), positions: [T]
    tok = tl.program_id(0)
    p = tl.load(pos_ptr + tok).to(tl.float32)
    steps = tl.floor(tl.math.div_rn(p + 1.0, floor_scale))  # an integer >= 0: 1 + steps is exact
    factor = tl.log(1.0 + steps) * scale + 1.0
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs = tok.to(tl.int64) * ROW + cols
    mask = cols < ROW
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, _to(x * factor, y_ptr.dtype.element_ty), mask=mask)


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != IMPLEMENTS:
        return False
    x, pos = (spec.types[v] for v in spec.single.inputs)
    out = spec.types[spec.single.outputs[0]]
    if x.rank != 4:
        return False
    _, _, h, dh = x.shape
    return (
        str(x.dtype) in _FLOATS
        and out.dtype == x.dtype
        and str(pos.dtype) in _POSITIONS
        and isinstance(h, int)
        and isinstance(dh, int)
    )


def _consts(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    _, _, h, dh = spec.types[spec.single.inputs[0]].shape
    row = h * dh
    return {"ROW": row, "BLOCK": min(config["block"], triton.next_power_of_2(max(row, 1)))}


def _scalars(spec: Any) -> tuple[float, float]:
    attrs = spec.attrs()
    return float(attrs["floor_scale"]), float(attrs["scale"])


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    x_i, pos_i = spec.args(spec.single)
    consts = _consts(spec, config)
    floor_scale, scale = _scalars(spec)
    grid_row = triton.cdiv(consts["ROW"], consts["BLOCK"])
    opts = _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, pos = inputs[x_i], inputs[pos_i]
        tokens = pos.numel()
        if not tokens or not consts["ROW"]:
            return
        _attn_temperature[(tokens, grid_row)](x, pos, outputs[0], floor_scale, scale, **consts, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    x, pos = (spec.types[v] for v in spec.single.inputs)
    consts = _consts(spec, config)
    ptr = "*" + _FLOATS[str(x.dtype)]
    sig = {
        "x_ptr": ptr,
        "pos_ptr": "*" + _POSITIONS[str(pos.dtype)],
        "y_ptr": ptr,
        "floor_scale": "fp32",
        "scale": "fp32",
        **dict.fromkeys(consts, "constexpr"),
    }
    opts = {**_t.launch_options(config, traits), "num_stages": 1}
    return [CompileUnit("attn_temperature", _attn_temperature, sig, consts, opts)]
