"""rope: x[B, S, H, Dh], positions[B, S] (i32) -> the rotary embedding in the rotate-half (neox)
layout on the first R = rotary_dim dims of each head (R = Dh when rotary_dim is 0): out[..., i] =
(x_i cos - x_{i+R/2} sin) * a, out[..., i+R/2] = (x_{i+R/2} cos + x_i sin) * a for i < R/2, the dims
from R on copied, with angle pos * inv_freq[i], a the attention factor (yarn's mscale, longrope's), and
inv_freq from `polymorph.ir.reference.rope_inv_freq` (every rope type). The static types' table is
made at build time and copied to the device at the first launch on it (before graph capture).

"dynamic" and "longrope" take their frequencies per call from max(positions) + 1, computed on the
device by torch ops ahead of the kernel (captured into the CUDA graph with it, no host sync):
longrope selects between its short and long tables (both on the device); dynamic grows its base in
float64 exactly as the reference does, then rounds the table to float32.

A program rotates block_h heads of one token: both halves of each pair in registers, cos and sin
computed once per pair in fp32 (libdevice cosf/sinf on NVIDIA: accurate for long-context angles).

Config keys: block_h (heads a program), num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; x and the output of one float dtype (bf16, f16, f32); positions
i32; concrete heads and an even, concrete head_dim; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.ir.ops import rope_rotary_dim
from polymorph.ir.reference import rope_inv_freq
from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "rope"

CONFIGS = [
    {"block_h": 8, "num_warps": 2},
    {"block_h": 32, "num_warps": 4},
    {"block_h": 1, "num_warps": 1},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to


@triton.jit
def _rope(x_ptr, pos_ptr, inv_ptr, y_ptr, af, H: tl.constexpr, DH: tl.constexpr, ROT: tl.constexpr,
          BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr):  # fmt: skip
    # x, y: [T, H, DH], positions: [T], inv_freq: [ROT / 2]; af: the attention factor
    HALF: tl.constexpr = ROT // 2
    tok = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    mask = (heads < H)[:, None] & (j < HALF)[None, :]
    row = tok.to(tl.int64) * (H * DH) + heads[:, None] * DH  # [BLOCK_H, 1]
    first = row + j[None, :]  # [BLOCK_H, BLOCK_HALF]
    x1 = tl.load(x_ptr + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + first + HALF, mask=mask, other=0.0).to(tl.float32)
    angle = tl.load(pos_ptr + tok).to(tl.float32) * tl.load(inv_ptr + j, mask=j < HALF, other=0.0)
    cos = (tl.cos(angle) * af)[None, :]  # af == 1 multiplies exactly
    sin = (tl.sin(angle) * af)[None, :]
    dtype = y_ptr.dtype.element_ty
    out = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)  # [BLOCK_H, BLOCK_HALF, 2]: both halves
    tl.store(y_ptr + tl.join(first, first + HALF), _to(out, dtype), mask=tl.join(mask, mask))
    if ROT < DH:  # partial rotary: the dims past ROT pass through
        k = tl.arange(0, BLOCK_PASS)
        keep = (heads < H)[:, None] & (k < DH - ROT)[None, :]
        rest = row + ROT + k[None, :]
        tl.store(y_ptr + rest, tl.load(x_ptr + rest, mask=keep, other=0.0), mask=keep)


# The rope types whose frequencies depend on the call's max(positions) + 1.
PER_CALL = ("dynamic", "longrope")


def per_call_inv_freq(attrs: dict[str, Any], head_dim: int) -> Any:
    """For a per-call rope type: inv_freq(positions, tables) -> the call's [R / 2] fp32 table on the
    positions' device, by torch ops only (capturable, no host sync); `tables` holds the device copies
    this makes on the first call per device. Mirrors `rope_inv_freq` (dynamic in float64 as it is)."""
    dim = rope_rotary_dim(attrs, head_dim)
    if attrs["rope_type"] == "longrope":
        old = attrs["original_max_position_embeddings"]
        host = [torch.from_numpy(rope_inv_freq(head_dim, attrs, seq_len=n)) for n in (None, old + 1)]

        def longrope(pos: Any, tables: dict[Any, Any]) -> Any:
            if pos.device not in tables:
                tables[pos.device] = [t.to(pos.device) for t in host]
            short, long = tables[pos.device]
            return torch.where(pos.max() + 1 > old, long, short)

        return longrope
    theta, factor, max_pos = attrs["theta"], attrs["factor"], attrs["max_position_embeddings"]
    host_exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim

    def dynamic(pos: Any, tables: dict[Any, Any]) -> Any:
        if pos.device not in tables:
            tables[pos.device] = host_exponents.to(pos.device)
        length = torch.clamp(pos.max().to(torch.float64) + 1, min=max_pos)
        base = theta * ((factor * length / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return (1.0 / base ** tables[pos.device]).float()

    return dynamic


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != "rope":
        return False
    x, pos = (spec.types[v] for v in spec.single.inputs)
    out = spec.types[spec.single.outputs[0]]
    _, _, h, dh = x.shape
    return (
        str(x.dtype) in _FLOATS
        and out.dtype == x.dtype
        and str(pos.dtype) == "i32"
        and isinstance(h, int)
        and isinstance(dh, int)
        and dh % 2 == 0
    )


def _consts(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    _, _, h, dh = spec.types[spec.single.inputs[0]].shape
    rot = rope_rotary_dim(spec.attrs(), dh)
    return {"H": h, "DH": dh, "ROT": rot, "BLOCK_H": min(config["block_h"], triton.next_power_of_2(h)),
            "BLOCK_HALF": triton.next_power_of_2(rot // 2),
            "BLOCK_PASS": triton.next_power_of_2(max(dh - rot, 1))}  # fmt: skip


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    x_i, pos_i = spec.args(spec.single)
    attrs = spec.attrs()
    consts = _consts(spec, config)
    af = attrs["attention_factor"]
    per_call = per_call_inv_freq(attrs, consts["DH"]) if attrs["rope_type"] in PER_CALL else None
    host_inv = torch.from_numpy(rope_inv_freq(consts["DH"], attrs))
    device_inv: dict[Any, Any] = {}
    grid_h = triton.cdiv(consts["H"], consts["BLOCK_H"])
    opts = _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x, pos = inputs[x_i], inputs[pos_i]
        tokens = pos.numel()
        if not tokens:
            return
        if per_call is not None:
            inv = per_call(pos, device_inv)
        else:
            inv = device_inv.get(x.device)
            if inv is None:
                inv = device_inv[x.device] = host_inv.to(x.device)
        _rope[(tokens, grid_h)](x, pos, inv, outputs[0], af, **consts, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    consts = _consts(spec, config)
    ptr = "*" + _FLOATS[str(spec.types[spec.single.inputs[0]].dtype)]
    sig = {
        "x_ptr": ptr,
        "pos_ptr": "*i32",
        "inv_ptr": "*fp32",
        "y_ptr": ptr,
        "af": "fp32",
        **dict.fromkeys(consts, "constexpr"),
    }
    return [CompileUnit("rope", _rope, sig, consts, {**_t.launch_options(config, traits), "num_stages": 1})]
