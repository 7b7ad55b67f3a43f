"""kv_write: cache[blocks, BS, Hkv, Dh], x[B, S, Hkv, Dh], block_table[B, ctx_blocks] (i32),
positions[B, S] (i32) -> the cache with token (b, s) written at block block_table[b, pos // BS], slot
pos % BS. The output tensor is the cache itself (the executable aliases it to the state): only the new
rows are written, the rest of the cache is never touched.

One program copies block columns of one token's row (Hkv * Dh values). A token whose position falls
outside its block table writes nothing (the reference raises there; a kernel keeps its writes inside
the cache instead). Cache offsets are 64-bit: a pool can exceed 2**31 elements.

Config keys: block (row values a program copies), num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; x and cache of one float dtype (bf16, f16, f32); block_table and
positions i32; concrete block size, heads and head_dim; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = "kv_write"

CONFIGS = [
    {"block": 1024, "num_warps": 4},
    {"block": 256, "num_warps": 1},
    {"block": 4096, "num_warps": 8},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}


@triton.jit(do_not_specialize=["S", "CTX_BLOCKS"])
def _kv_write(cache_ptr, x_ptr, table_ptr, pos_ptr, S, CTX_BLOCKS, BS: tl.constexpr, ROW: tl.constexpr,
              BLOCK: tl.constexpr):  # fmt: skip
    # x: [M, ROW] (M = B*S tokens), cache: [blocks * BS, ROW]
    tok = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pos = tl.load(pos_ptr + tok) + tl.zeros([BLOCK], dtype=tl.int32)  # [BLOCK], one position
    logical = pos // BS
    valid = (pos >= 0) & (logical < CTX_BLOCKS)
    block = tl.load(table_ptr + (tok // S) * CTX_BLOCKS + logical, mask=valid, other=0)
    x = tl.load(x_ptr + tok.to(tl.int64) * ROW + cols, mask=cols < ROW)
    slot = block.to(tl.int64) * BS + pos % BS
    tl.store(cache_ptr + slot * ROW + cols, x, mask=(cols < ROW) & valid)


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op != "kv_write":
        return False
    cache, x, table, pos = (spec.types[v] for v in spec.single.inputs)
    return (
        str(cache.dtype) in _FLOATS
        and x.dtype == cache.dtype
        and str(table.dtype) == "i32"
        and str(pos.dtype) == "i32"
        and all(isinstance(d, int) for d in cache.shape[1:])
    )


def _consts(spec: Any, config: dict[str, Any]) -> dict[str, Any]:
    _, bs, hkv, dh = spec.types[spec.single.inputs[0]].shape
    return {"BS": bs, "ROW": hkv * dh, "BLOCK": min(config["block"], triton.next_power_of_2(hkv * dh))}


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    _, x_i, table_i, pos_i = spec.args(spec.single)
    consts = _consts(spec, config)
    grid_row = triton.cdiv(consts["ROW"], consts["BLOCK"])
    opts = _t.launch_options(config, traits)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        pos, table = inputs[pos_i], inputs[table_i]
        tokens = pos.numel()
        if tokens:
            _kv_write[(tokens, grid_row)](outputs[0], inputs[x_i], table, pos, pos.shape[-1], table.shape[-1],
                                          **consts, **opts)  # fmt: skip

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    consts = _consts(spec, config)
    ptr = "*" + _FLOATS[str(spec.types[spec.single.inputs[0]].dtype)]
    sig = {"cache_ptr": ptr, "x_ptr": ptr, "table_ptr": "*i32", "pos_ptr": "*i32", "S": "i32",
           "CTX_BLOCKS": "i32", **dict.fromkeys(consts, "constexpr")}  # fmt: skip
    return [
        CompileUnit(
            "kv_write", _kv_write, sig, consts, {**_t.launch_options(config, traits), "num_stages": 1}
        )
    ]
