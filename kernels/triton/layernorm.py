"""layernorm: x[*, D], w[D], b[D] -> (x - mean) / sqrt(var + eps) * w + b, float32 statistics (the
variance about the mean, as the reference computes it), one rounding at the output. Rows are every
leading index: DeepSeek-V3.2's indexer normalizes one key of index_head_dim per token.

A program normalizes `rows` rows; a row that fits one block of block_d columns is read once and kept in
registers, a longer row is read three times (the mean, the variance about it, the output).

Config keys: rows, block_d, num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; x, w, b and the output of one float dtype (bf16, f16, f32);
concrete D; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "layernorm"

CONFIGS = [
    {"rows": 4, "block_d": 1024, "num_warps": 4},
    {"rows": 16, "block_d": 128, "num_warps": 4},
    {"rows": 1, "block_d": 4096, "num_warps": 4},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)

_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to


@triton.jit(do_not_specialize=["R"])
def _layernorm(
    x_ptr, w_ptr, b_ptr, y_ptr, R, eps, D: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr
):
    # x, y: [R, D], w, b: [D]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < R)[:, None]
    base = rows.to(tl.int64)[:, None] * D  # [ROWS, 1]
    cols = tl.arange(0, BLOCK_D)
    dtype = y_ptr.dtype.element_ty
    if BLOCK_D >= D:  # the whole row in registers
        col_ok = cols < D
        mask = row_ok & col_ok[None, :]
        x = tl.load(x_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / D
        dev = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
        inv = 1.0 / tl.sqrt(tl.sum(dev * dev, axis=1) / D + eps)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = dev * inv[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + base + cols[None, :], _to(y, dtype), mask=mask)
    else:
        total = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_D):
            mask = row_ok & (k0 + cols < D)[None, :]
            total += tl.load(x_ptr + base + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(total, axis=1) / D
        sq = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_D):
            col_ok = (k0 + cols < D)[None, :]
            x = tl.load(x_ptr + base + k0 + cols[None, :], mask=row_ok & col_ok, other=0.0).to(tl.float32)
            dev = tl.where(col_ok, x - mean[:, None], 0.0)
            sq += dev * dev
        inv = 1.0 / tl.sqrt(tl.sum(sq, axis=1) / D + eps)
        for k0 in range(0, D, BLOCK_D):
            col_ok = k0 + cols < D
            mask = row_ok & col_ok[None, :]
            x = tl.load(x_ptr + base + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + k0 + cols, mask=col_ok, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + k0 + cols, mask=col_ok, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * inv[:, None] * w[None, :] + b[None, :]
            tl.store(y_ptr + base + k0 + cols[None, :], _to(y, dtype), mask=mask)


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != "layernorm":
        return False
    x, w, b = (spec.types[v] for v in spec.single.inputs)
    out = spec.types[spec.single.outputs[0]]
    same = w.dtype == b.dtype == x.dtype == out.dtype
    return str(x.dtype) in _FLOATS and same and isinstance(x.shape[-1], int)


def _consts(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    d = spec.types[spec.single.inputs[0]].shape[-1]
    return {"D": d, "ROWS": config["rows"], "BLOCK_D": min(config["block_d"], triton.next_power_of_2(d))}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    x_i, w_i, b_i = spec.args(spec.single)
    eps = float(spec.attrs()["eps"])
    consts = _consts(spec, config)
    opts = _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x = inputs[x_i]
        r = x.numel() // consts["D"]
        if r:
            grid = (triton.cdiv(r, consts["ROWS"]),)
            _layernorm[grid](x, inputs[w_i], inputs[b_i], outputs[0], r, eps, **consts, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    consts = _consts(spec, config)
    ptr = "*" + _FLOATS[str(spec.types[spec.single.inputs[0]].dtype)]
    sig = {
        "x_ptr": ptr,
        "w_ptr": ptr,
        "b_ptr": ptr,
        "y_ptr": ptr,
        "R": "i32",
        "eps": "fp32",
        **dict.fromkeys(consts, "constexpr"),
    }
    return [
        CompileUnit(
            "layernorm", _layernorm, sig, consts, {**_t.launch_options(config, traits), "num_stages": 1}
        )
    ]
