"""embedding: table[V, D], ids[*] (i32 or i64) -> out[*, D], a row gather.

One program copies block_d columns of one token's row (a grid of tokens x column blocks), 16-byte
vector loads and stores along D. An id outside [0, V) reads nothing and writes zeros: the reference
raises there (or wraps a negative id, numpy-style), and a kernel cannot raise, so it keeps its reads
inside the table instead.

Config keys: block_d (columns a program copies), num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; table and output of one float dtype (bf16, f16, f32); ids i32
or i64; concrete V and D; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "embedding"

CONFIGS = [
    {"block_d": 2048, "num_warps": 4},
    {"block_d": 512, "num_warps": 2},
    {"block_d": 8192, "num_warps": 8},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
_INTS = {"i32": "i32", "i64": "i64"}


@triton.jit
def _embedding(table_ptr, ids_ptr, out_ptr, V: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    # table: [V, D], ids: [T], out: [T, D]
    tok = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row = tl.load(ids_ptr + tok).to(tl.int64) + tl.zeros([BLOCK_D], dtype=tl.int64)  # [BLOCK_D], one id
    valid = (row >= 0) & (row < V)
    x = tl.load(table_ptr + row * D + cols, mask=(cols < D) & valid, other=0.0)
    tl.store(out_ptr + tok.to(tl.int64) * D + cols, x, mask=cols < D)


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != "embedding":
        return False
    table, ids = (spec.types[v] for v in spec.single.inputs)
    out = spec.types[spec.single.outputs[0]]
    return (
        str(table.dtype) in _FLOATS
        and out.dtype == table.dtype
        and str(ids.dtype) in _INTS
        and all(isinstance(d, int) for d in table.shape)
    )


def _consts(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    v, d = spec.types[spec.single.inputs[0]].shape
    return {"V": v, "D": d, "BLOCK_D": min(config["block_d"], triton.next_power_of_2(d))}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    table_i, ids_i = spec.args(spec.single)
    consts = _consts(spec, config)
    grid_d = triton.cdiv(consts["D"], consts["BLOCK_D"])
    opts = _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        ids = inputs[ids_i]
        tokens = ids.numel()
        if tokens:
            _embedding[(tokens, grid_d)](inputs[table_i], ids, outputs[0], **consts, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    table, ids = (spec.types[v] for v in spec.single.inputs)
    consts = _consts(spec, config)
    ptr = "*" + _FLOATS[str(table.dtype)]
    sig = {
        "table_ptr": ptr,
        "ids_ptr": "*" + _INTS[str(ids.dtype)],
        "out_ptr": ptr,
        **dict.fromkeys(consts, "constexpr"),
    }
    return [
        CompileUnit(
            "embedding", _embedding, sig, consts, {**_t.launch_options(config, traits), "num_stages": 1}
        )
    ]
