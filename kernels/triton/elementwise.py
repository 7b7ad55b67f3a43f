"""Elementwise ops and small reductions: silu, gelu (erf or tanh), scale, softcap, mul, add, softmax,
argmax, cast.

Every op computes in fp32 and rounds once to its output dtype, as the reference does.
- silu, gelu, scale, softcap, cast: flat over the elements, `block` a program. scale multiplies by its
  factor as an fp32 argument (rounded to x's dtype on the host first under round_factor_to_dtype);
  softcap is cap * tanh(x / cap), tanh by its odd Taylor series below |u| = 1/8 (where 1 - 2 / (exp(2u)
  + 1) would cancel) and by that saturating form above.
- mul, add: flat over the output; operands broadcast numpy-style (rank <= 4): each operand's element
  offset comes from the output index and its broadcast strides (0 along a broadcast dim), computed on
  the host from the actual shapes at launch; an operand with the output's own shape skips the math.
- softmax, argmax: along any axis, seen as [outer, L, inner]: a program takes one outer index and
  block_inner columns of inner, and walks L in chunks of block_l (softmax: a running max and sum, then
  a second pass that writes; argmax: the first index of the maximum, as numpy's). inner is 1 for the
  last axis (the lm_head's vocab).
- cast: between f32, bf16, f16 and i32 (float -> int truncates toward zero, as numpy's astype).

Config keys: block (flat ops), block_l, block_inner (reductions), num_warps; the arch's launch options (waves_per_eu) where it takes them.
Constraints (supports): cuda or rocm; float operands bf16, f16 or f32 (argmax also i32, cast also i32
either way); rank <= 4 for mul and add; contiguous tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = ("silu", "gelu", "scale", "softcap", "mul", "add", "softmax", "argmax", "cast")

CONFIGS = [
    {"block": 1024, "block_l": 1024, "block_inner": 1, "num_warps": 4},
    {"block": 4096, "block_l": 4096, "block_inner": 1, "num_warps": 8},
    {"block": 256, "block_l": 64, "block_inner": 16, "num_warps": 2},
]

# Configs and launch options per chip, mapped from the list above by its traits (see _targets.py).
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")
configs = _t.configs_by_target(CONFIGS)


_FLOATS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
_TYPES = {**_FLOATS, "i32": "i32"}
_UNARY = {"silu": 0, "gelu": 1, "scale": 2, "softcap": 3}
_BINARY = {"mul": 0, "add": 1}

# Rounding as compiled code rounds, under Triton's interpreter too (see _interpreter.py).
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_to = _i.round_to


@triton.jit(do_not_specialize=["N", "c"])
def _unary(x_ptr, y_ptr, N, c, OP: tl.constexpr, TANH: tl.constexpr, BLOCK: tl.constexpr):
    # c: scale's factor, softcap's cap (unused by silu and gelu)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if OP == 0:  # silu
        y = x / (1.0 + tl.exp(-x))
    elif OP == 2:  # scale
        y = x * c
    elif OP == 3:  # softcap
        u = x / c
        u2 = u * u
        series = u * (
            1.0 + u2 * (-0.3333333333333333 + u2 * (0.13333333333333333 + u2 * -0.05396825396825397))
        )
        y = c * tl.where(tl.abs(u) < 0.125, series, 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
    elif TANH:  # gelu, tanh approximation; tanh(u) = 1 - 2 / (exp(2u) + 1) saturates cleanly
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
    else:  # gelu, erf
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, _to(y, y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bcast_offset(offs, D1, D2, D3, S0, S1, S2, S3):
    """Element offset of the operand at output index offs (output [D0, D1, D2, D3], strides S*)."""
    i3 = offs % D3
    t = offs // D3
    i2 = t % D2
    t = t // D2
    return (t // D1) * S0 + (t % D1) * S1 + i2 * S2 + i3 * S3


@triton.jit(do_not_specialize=["N", "D1", "D2", "D3", "SA0", "SA1", "SA2", "SA3", "SB0", "SB1", "SB2", "SB3"])
def _binary(a_ptr, b_ptr, y_ptr, N, D1, D2, D3, SA0, SA1, SA2, SA3, SB0, SB1, SB2, SB3,
            OP: tl.constexpr, A_FLAT: tl.constexpr, B_FLAT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    if A_FLAT:
        a_offs = offs
    else:
        a_offs = _bcast_offset(offs, D1, D2, D3, SA0, SA1, SA2, SA3)
    if B_FLAT:
        b_offs = offs
    else:
        b_offs = _bcast_offset(offs, D1, D2, D3, SB0, SB1, SB2, SB3)
    a = tl.load(a_ptr + a_offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + b_offs, mask=mask, other=0.0).to(tl.float32)
    if OP == 0:
        y = a * b
    else:
        y = a + b
    tl.store(y_ptr + offs, _to(y, y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["L", "INNER"])
def _softmax(x_ptr, y_ptr, L, INNER, BLOCK_L: tl.constexpr, BLOCK_I: tl.constexpr):
    # x, y: [outer, L, INNER]; softmax along L
    base = tl.program_id(0).to(tl.int64) * L * INNER
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    ls = tl.arange(0, BLOCK_L)
    run_max = tl.full([BLOCK_I], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_I], dtype=tl.float32)
    for l0 in range(0, L, BLOCK_L):
        mask = (l0 + ls < L)[:, None] & (cols < INNER)[None, :]
        x = tl.load(x_ptr + base + (l0 + ls)[:, None] * INNER + cols[None, :], mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        new_max = tl.maximum(run_max, tl.max(x, axis=0))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)  # all -inf so far: nothing to rescale
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(x - safe[None, :]), axis=0)
        run_max = new_max
    for l0 in range(0, L, BLOCK_L):
        mask = (l0 + ls < L)[:, None] & (cols < INNER)[None, :]
        offs = base + (l0 + ls)[:, None] * INNER + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.exp(x - run_max[None, :]) / run_sum[None, :]
        tl.store(y_ptr + offs, _to(y, y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["L", "INNER"])
def _argmax(x_ptr, y_ptr, L, INNER, BLOCK_L: tl.constexpr, BLOCK_I: tl.constexpr):
    # x: [outer, L, INNER] -> y: [outer, INNER] i32, the first index of the maximum along L
    outer = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    ls = tl.arange(0, BLOCK_L)
    best = tl.full([BLOCK_I], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK_I], dtype=tl.int32)
    for l0 in range(0, L, BLOCK_L):
        mask = (l0 + ls < L)[:, None] & (cols < INNER)[None, :]
        offs = outer * L * INNER + (l0 + ls)[:, None] * INNER + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.float32)
        x = tl.where(mask, x, float("-inf"))
        chunk = tl.max(x, axis=0)  # [BLOCK_I]
        first = tl.min(tl.where(x == chunk[None, :], (l0 + ls)[:, None], 2147483647), axis=0)
        take = chunk > best  # strictly: an earlier chunk keeps a tie
        best_i = tl.where(take, first, best_i)
        best = tl.where(take, chunk, best)
    tl.store(y_ptr + outer * INNER + cols, best_i, mask=cols < INNER)


@triton.jit(do_not_specialize=["N"])
def _cast(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    if x.dtype == y_ptr.dtype.element_ty:
        y = x
    elif y_ptr.dtype.element_ty == tl.int32:
        y = x.to(tl.float32).to(tl.int32)  # truncation toward zero
    else:
        y = _to(x.to(tl.float32), y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs, y, mask=mask)


# --- the contract ------------------------------------------------------------------------------------


def supports(spec: Any) -> bool:
    if not spec.target.is_gpu or len(spec.nodes) != 1 or spec.single.op not in IMPLEMENTS:
        return False
    node = spec.single
    ins = [spec.types[v] for v in node.inputs]
    out = spec.types[node.outputs[0]]
    if node.op == "cast":
        return str(ins[0].dtype) in _TYPES and str(out.dtype) in _TYPES
    if node.op == "argmax":
        return str(ins[0].dtype) in _TYPES and str(out.dtype) == "i32"
    if not all(str(t.dtype) in _FLOATS for t in (*ins, out)):
        return False
    if node.op in _BINARY:
        return out.rank <= 4
    return True


def _axis_split(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    axis %= len(shape)
    outer = inner = 1
    for d in shape[:axis]:
        outer *= d
    for d in shape[axis + 1 :]:
        inner *= d
    return outer, shape[axis], inner


def _strides(t: Any, shape: tuple[int, ...]) -> tuple[bool, list[int]]:
    """(whether t is the output's own shape, its broadcast strides padded to rank 4)."""
    if tuple(t.shape) == shape:
        return True, [0, 0, 0, 0]
    strides = list(t.expand(shape).stride())
    return False, [0] * (4 - len(strides)) + strides


def unary_constant(op: str, attrs: dict[str, Any], x_dtype: Any) -> float:
    """The fp32 constant of a unary op: scale's factor (rounded to x's dtype first if asked, from fp32
    as the reference rounds it), softcap's cap; 0 for the others."""
    if op == "scale":
        factor = np.float32(attrs["factor"])
        if attrs["round_factor_to_dtype"]:
            factor = np.float32(np.asarray(factor).astype(x_dtype.numpy))
        return float(factor)
    return float(attrs["cap"]) if op == "softcap" else 0.0


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op
    opts = _t.launch_options(config, traits)
    block = config["block"]
    c = unary_constant(op, attrs, spec.types[node.inputs[0]].dtype)

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        y = outputs[0]
        x = inputs[args[0]]
        if op in _UNARY or op == "cast":
            n = x.numel()
            if n == 0:
                return
            grid = (triton.cdiv(n, block),)
            if op == "cast":
                _cast[grid](x, y, n, BLOCK=block, **opts)
            else:
                _unary[grid](
                    x, y, n, c, OP=_UNARY[op], TANH=attrs.get("approximate") == "tanh", BLOCK=block, **opts
                )
        elif op in _BINARY:
            n = y.numel()
            if n == 0:
                return
            shape = tuple(y.shape)
            a_flat, sa = _strides(x, shape)
            b_flat, sb = _strides(inputs[args[1]], shape)
            dims = [1] * (4 - len(shape)) + list(shape)
            _binary[(triton.cdiv(n, block),)](x, inputs[args[1]], y, n, dims[1], dims[2], dims[3], *sa, *sb,
                                               OP=_BINARY[op], A_FLAT=a_flat, B_FLAT=b_flat, BLOCK=block,
                                               **opts)  # fmt: skip
        else:
            outer, length, inner = _axis_split(tuple(x.shape), attrs["axis"])
            if outer * length * inner == 0:
                return
            block_i = min(config["block_inner"], triton.next_power_of_2(inner))
            block_l = min(config["block_l"], triton.next_power_of_2(length))
            grid = (outer, triton.cdiv(inner, block_i))
            kernel = _softmax if op == "softmax" else _argmax
            kernel[grid](x, y, length, inner, BLOCK_L=block_l, BLOCK_I=block_i, **opts)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    node = spec.single
    attrs = spec.attrs()
    x_t = spec.types[node.inputs[0]]
    out_t = spec.types[node.outputs[0]]
    x_ptr, y_ptr = "*" + _TYPES[str(x_t.dtype)], "*" + _TYPES[str(out_t.dtype)]
    opts = {**_t.launch_options(config, traits), "num_stages": 1}
    block = config["block"]
    if node.op == "cast":
        consts = {"BLOCK": block}
        sig = {"x_ptr": x_ptr, "y_ptr": y_ptr, "N": "i32", "BLOCK": "constexpr"}
        return [CompileUnit("cast", _cast, sig, consts, opts)]
    if node.op in _UNARY:
        consts = {"OP": _UNARY[node.op], "TANH": attrs.get("approximate") == "tanh", "BLOCK": block}
        sig = {"x_ptr": x_ptr, "y_ptr": y_ptr, "N": "i32", "c": "fp32", **dict.fromkeys(consts, "constexpr")}
        return [CompileUnit(node.op, _unary, sig, consts, opts)]
    if node.op in _BINARY:
        a_t, b_t = (spec.types[v] for v in node.inputs)
        consts = {"OP": _BINARY[node.op], "A_FLAT": a_t.shape == out_t.shape, "B_FLAT": b_t.shape == out_t.shape,
                  "BLOCK": block}  # fmt: skip
        ints = ("N", "D1", "D2", "D3", "SA0", "SA1", "SA2", "SA3", "SB0", "SB1", "SB2", "SB3")
        sig = {"a_ptr": x_ptr, "b_ptr": x_ptr, "y_ptr": y_ptr, **dict.fromkeys(ints, "i32"),
               **dict.fromkeys(consts, "constexpr")}  # fmt: skip
        return [CompileUnit(node.op, _binary, sig, consts, opts)]
    _, length, inner = _axis_split(tuple(int(d) for d in x_t.shape), attrs["axis"])
    consts = {"BLOCK_L": min(config["block_l"], triton.next_power_of_2(length)),
              "BLOCK_I": min(config["block_inner"], triton.next_power_of_2(inner))}  # fmt: skip
    sig = {"x_ptr": x_ptr, "y_ptr": y_ptr, "L": "i32", "INNER": "i32", **dict.fromkeys(consts, "constexpr")}
    return [CompileUnit(node.op, _softmax if node.op == "softmax" else _argmax, sig, consts, opts)]
