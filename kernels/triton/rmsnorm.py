"""rmsnorm: x[*, D], w[D] -> x / sqrt(mean(x^2) + eps) * w, float32 statistics, one rounding at the
output. Rows are every leading index, so the same kernel normalizes hidden states ([B, S, D]) and the
per-head q/k norms of Qwen3 ([B, S, H, Dh] with w[Dh]).

A program normalizes `rows` rows. When a row fits one block of block_d columns it is read once and
kept in registers; a longer row is read twice (the statistic, then the output; the second pass hits
L2). The decode step has few rows, so a row per program at D=2048; the per-head norms have many short
rows, so several a program.

Config keys: rows, block_d, num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; x, w and the output of one float dtype (bf16, f16, f32);
concrete D; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "rmsnorm"

CONFIGS = [
    {"rows": 1, "block_d": 4096, "num_warps": 4},
    {"rows": 4, "block_d": 1024, "num_warps": 4},
    {"rows": 16, "block_d": 128, "num_warps": 4},
    {"rows": 1, "block_d": 256, "num_warps": 2},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to


@triton.jit(do_not_specialize=["R"])
def _rmsnorm(x_ptr, w_ptr, y_ptr, R, eps, D: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    # x, y: [R, D], w: [D]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < R)[:, None]
    base = rows.to(tl.int64)[:, None] * D  # [ROWS, 1]
    cols = tl.arange(0, BLOCK_D)
    dtype = y_ptr.dtype.element_ty
    if BLOCK_D >= D:  # the whole row in registers
        mask = row_ok & (cols < D)[None, :]
        x = tl.load(x_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rms = tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + cols[None, :], _to(x / rms[:, None] * w[None, :], dtype), mask=mask)
    else:
        sq = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_D):
            mask = row_ok & (k0 + cols < D)[None, :]
            x = tl.load(x_ptr + base + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            sq += x * x
        rms = tl.sqrt(tl.sum(sq, axis=1) / D + eps)
        for k0 in range(0, D, BLOCK_D):
            mask = row_ok & (k0 + cols < D)[None, :]
            x = tl.load(x_ptr + base + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + k0 + cols, mask=k0 + cols < D, other=0.0).to(tl.float32)
            tl.store(y_ptr + base + k0 + cols[None, :], _to(x / rms[:, None] * w[None, :], dtype), mask=mask)


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != "rmsnorm":
        return False
    x, w = (spec.types[v] for v in spec.single.inputs)
    out = spec.types[spec.single.outputs[0]]
    return str(x.dtype) in _FLOATS and w.dtype == x.dtype == out.dtype and isinstance(x.shape[-1], int)


def _consts(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    d = spec.types[spec.single.inputs[0]].shape[-1]
    return {"D": d, "ROWS": config["rows"], "BLOCK_D": min(config["block_d"], triton.next_power_of_2(d))}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    x_i, w_i = spec.args(spec.single)
    eps = float(spec.attrs()["eps"])
    consts = _consts(spec, config)
    opts = _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        x = inputs[x_i]
        r = x.numel() // consts["D"]
        if r:
            _rmsnorm[(triton.cdiv(r, consts["ROWS"]),)](x, inputs[w_i], outputs[0], r, eps, **consts,
                                                         **opts)  # fmt: skip

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    consts = _consts(spec, config)
    ptr = "*" + _FLOATS[str(spec.types[spec.single.inputs[0]].dtype)]
    sig = {
        "x_ptr": ptr,
        "w_ptr": ptr,
        "y_ptr": ptr,
        "R": "i32",
        "eps": "fp32",
        **dict.fromkeys(consts, "constexpr"),
    }
    return [
        CompileUnit("rmsnorm", _rmsnorm, sig, consts, {**_t.launch_options(config, traits), "num_stages": 1})
    ]
