"""numpy definitions of the general ops (general_ops.py); reference.py registers them with the rest.

Float ops compute in float32 (integers stay integers, complex values in complex64), as every op of
the reference does; the interpreter casts each result to the dtype the op table infers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from polymorph.errors import UserError

Array = np.ndarray
RefFn = Callable[[list[Array], Mapping[str, Any]], list[Array]]


def _num(x: Array) -> Array:
    """float32 for float tensors (ml_dtypes' bf16 and fp8 included); integers, bools and complex
    values as they are."""
    if x.dtype.kind in "biuc":
        return x
    return np.asarray(x, dtype=np.float32)


def _f(x: Array) -> Array:
    return np.asarray(x, dtype=np.float32)


def _erf(x: Array) -> Array:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(np.float32)


_UNARY: dict[str, Callable[[Array], Array]] = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "tanh": np.tanh,
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "erf": _erf,
    "reciprocal": lambda x: np.float32(1) / x,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,  # half to even, as torch.round
    "trunc": np.trunc,
    "sign": np.sign,
    "log1p": np.log1p,
    "expm1": np.expm1,
}


def _unary(name: str) -> RefFn:
    fn = _UNARY[name]

    def ref(ins: list[Array], a: Mapping) -> list[Array]:
        with np.errstate(all="ignore"):  # log(0), 1/0: inf and NaN are the defined results
            return [fn(_num(ins[0]))]

    return ref


def _remainder(x: Array, y: Array) -> Array:
    # torch.remainder: the sign of the divisor (numpy's mod), for floats and integers alike.
    return np.mod(x, y)


_BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "sub": np.subtract,
    "div": lambda x, y: np.floor_divide(x, y) if np.issubdtype(x.dtype, np.integer) else x / y,
    "pow": np.power,
    "maximum": np.maximum,  # NaN propagates, as torch.maximum
    "minimum": np.minimum,
    "remainder": _remainder,
    "logical_and": lambda x, y: np.logical_and(x, y),
    "logical_or": lambda x, y: np.logical_or(x, y),
    "logical_xor": lambda x, y: np.logical_xor(x, y),
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _binary(name: str) -> RefFn:
    fn = _BINARY[name]

    def ref(ins: list[Array], a: Mapping) -> list[Array]:
        x, y = _num(ins[0]), _num(ins[1])
        if name == "div" and np.issubdtype(x.dtype, np.integer) and (y == 0).any():
            raise UserError("integer division by zero")
        with np.errstate(all="ignore"):
            return [fn(x, y)]

    return ref


def _where(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.where(ins[0], _num(ins[1]), _num(ins[2]))]


def _logical_not(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.logical_not(ins[0])]


def _axes(x: Array, a: Mapping) -> tuple[int, ...]:
    return tuple(ax % x.ndim for ax in a["axes"]) if a["axes"] else tuple(range(x.ndim))


_REDUCE: dict[str, Callable[..., Array]] = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_max": np.max,
    "reduce_min": np.min,
    "reduce_prod": np.prod,
    "reduce_any": np.any,
    "reduce_all": np.all,
}


def _reduce(name: str) -> RefFn:
    fn = _REDUCE[name]

    def ref(ins: list[Array], a: Mapping) -> list[Array]:
        x = _num(ins[0])
        kw = {"dtype": x.dtype} if name in ("reduce_sum", "reduce_prod") and x.dtype != np.bool_ else {}
        return [np.asarray(fn(x, axis=_axes(x, a), keepdims=a["keepdims"], **kw))]

    return ref


def _reduce_var(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    axes = _axes(x, a)
    n = math.prod(x.shape[i] for i in axes)
    mean = x.mean(axis=axes, keepdims=True)
    ss = ((x - mean) ** 2).sum(axis=axes, keepdims=a["keepdims"])
    return [np.asarray(ss / np.float32(max(n - a["correction"], 0.0)))]


def _cumsum(ins: list[Array], a: Mapping) -> list[Array]:
    x = _num(ins[0])
    return [np.cumsum(x, axis=a["axis"], dtype=np.int64 if x.dtype == np.bool_ else x.dtype)]


def _log_softmax(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    shifted = x - x.max(axis=a["axis"], keepdims=True)
    return [shifted - np.log(np.exp(shifted).sum(axis=a["axis"], keepdims=True))]


def _cmatmul(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.asarray(ins[0], np.complex64) @ np.asarray(ins[1], np.complex64)]


def _conv(ins: list[Array], a: Mapping) -> list[Array]:
    x, w = _f(ins[0]), _f(ins[1])
    n = x.ndim - 2
    g = a["groups"]
    pad = [(0, 0), (0, 0), *((p, p) for p in a["padding"])]
    xp = np.pad(x, pad)
    k = w.shape[2:]
    dil, stride = a["dilation"], a["stride"]
    span = tuple(d * (kk - 1) + 1 for d, kk in zip(dil, k, strict=True))
    win = sliding_window_view(xp, span, axis=tuple(range(2, 2 + n)))  # [N, C, *S', *span]
    index = (..., *(slice(None, None, d) for d in dil))
    win = win[index]  # [N, C, *S', *K] (dilated taps)
    win = win[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]
    cin, cout = x.shape[1] // g, w.shape[0] // g
    outs = []
    letters = "xyz"[:n]
    spec = f"nc{letters.upper()}{letters},oc{letters}->no{letters.upper()}"
    for gi in range(g):
        xs = win[:, gi * cin : (gi + 1) * cin]
        ws = w[gi * cout : (gi + 1) * cout]
        outs.append(np.einsum(spec, xs, ws, optimize=True))
    y = np.concatenate(outs, axis=1).astype(np.float32)
    if len(ins) == 3:
        y = y + _f(ins[2]).reshape(1, -1, *([1] * n))
    return [y]


def _windows(x: Array, a: Mapping, fill: float) -> tuple[Array, Array]:
    """(windows [*lead, *S', *K] of the padded x, the same windows of a mask of real elements)."""
    n = len(a["kernel"])
    stride, pad = a["stride"], a["padding"]
    dil = a.get("dilation", (1,) * n)
    lead = x.ndim - n
    sizes = x.shape[lead:]
    # ceil_mode may let the last window run past the padding: pad that far on the right too.
    outs = []
    right = []
    for i in range(n):
        span = dil[i] * (a["kernel"][i] - 1) + 1
        num = sizes[i] + 2 * pad[i] - span
        out = (-(-num // stride[i]) if a["ceil_mode"] else num // stride[i]) + 1
        if a["ceil_mode"] and (out - 1) * stride[i] >= sizes[i] + pad[i]:
            out -= 1
        outs.append(out)
        right.append(max(pad[i], (out - 1) * stride[i] + span - sizes[i] - pad[i]))
    widths = [(0, 0)] * lead + [(p, r) for p, r in zip(pad, right, strict=True)]
    xp = np.pad(x, widths, constant_values=fill)
    real = np.pad(np.ones(sizes, dtype=bool), widths[lead:], constant_values=False)
    # count_include_pad counts the symmetric padding but never the ceil_mode overhang.
    inside_pad = np.pad(np.ones([s + 2 * p for s, p in zip(sizes, pad, strict=True)], dtype=bool),
                        [(0, r - p) for p, r in zip(pad, right, strict=True)], constant_values=False)  # fmt: skip
    spans = tuple(d * (k - 1) + 1 for d, k in zip(dil, a["kernel"], strict=True))
    axes = tuple(range(lead, x.ndim))

    def view(arr: Array, ax: tuple[int, ...]) -> Array:
        v = sliding_window_view(arr, spans, axis=ax)
        v = v[(..., *(slice(None, None, d) for d in dil))]
        lead_ = v.ndim - 2 * n
        return v[(*([slice(None)] * lead_), *(slice(0, o * s, s) for o, s in zip(outs, stride, strict=True)))]

    plain = tuple(range(n))
    return view(xp, axes), (view(real, plain), view(inside_pad, plain))


def _max_pool(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    win, _ = _windows(x, a, -np.inf)
    n = len(a["kernel"])
    return [win.max(axis=tuple(range(-n, 0)))]


def _avg_pool(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    win, (real, padded) = _windows(x, a, 0.0)
    n = len(a["kernel"])
    red = tuple(range(-n, 0))
    total = win.sum(axis=red)
    if a["divisor"]:
        count = np.float32(a["divisor"])
    else:
        count = (padded if a["count_include_pad"] else real).sum(axis=red).astype(np.float32)
    return [total / count]


def source_coords(size_in: int, size_out: int, mode: str, align_corners: bool) -> Array:
    """Where each output element samples its axis (float64), as torch's upsampling defines."""
    dst = np.arange(size_out, dtype=np.float64)
    if mode == "nearest":
        return np.minimum(np.floor(dst * (size_in / size_out)), size_in - 1)
    if align_corners:
        return dst * ((size_in - 1) / (size_out - 1)) if size_out > 1 else np.zeros(size_out)
    return np.maximum((dst + 0.5) * (size_in / size_out) - 0.5, 0.0)


def _resize(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    size = a["size"]
    lead = x.ndim - len(size)
    for i, out in enumerate(size):
        axis = lead + i
        src = source_coords(x.shape[axis], out, a["mode"], a["align_corners"])
        if a["mode"] == "nearest":
            x = np.take(x, src.astype(np.int64), axis=axis)
            continue
        lo = np.floor(src).astype(np.int64)
        hi = np.minimum(lo + 1, x.shape[axis] - 1)
        frac = (src - lo).astype(np.float32).reshape([-1] + [1] * (x.ndim - axis - 1))
        x = np.take(x, lo, axis=axis) * (np.float32(1) - frac) + np.take(x, hi, axis=axis) * frac
    return [x]


def _normalize(x: Array, axes: tuple[int, ...], eps: float) -> Array:
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps))


def _layer_norm(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    y = _normalize(x, tuple(range(x.ndim - a["dims"], x.ndim)), a["eps"])
    for p, op in zip(ins[1:], (np.multiply, np.add), strict=False):
        y = op(y, _f(p))
    return [y]


def _group_norm(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0])
    n, c = x.shape[:2]
    g = a["groups"]
    grouped = x.reshape(n, g, -1)
    y = _normalize(grouped, (2,), a["eps"]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    for p, op in zip(ins[1:], (np.multiply, np.add), strict=False):
        y = op(y, _f(p).reshape(shape))
    return [y]


def _batch_norm(ins: list[Array], a: Mapping) -> list[Array]:
    x, w, b, mean, var = (_f(t) for t in ins)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)

    def r(t: Array) -> Array:
        return t.reshape(shape)

    return [(x - r(mean)) / np.sqrt(r(var) + np.float32(a["eps"])) * r(w) + r(b)]


def _check_index(idx: Array, size: int, what: str) -> Array:
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise UserError(f"{what}: an index is outside [-{size}, {size}) ({idx.min()}..{idx.max()})")
    return np.where(idx < 0, idx + size, idx)


def _index_select(ins: list[Array], a: Mapping) -> list[Array]:
    x, idx = ins
    axis = a["axis"] % x.ndim
    return [np.take(x, _check_index(idx, x.shape[axis], "index_select"), axis=axis)]


def _gather(ins: list[Array], a: Mapping) -> list[Array]:
    x, idx = ins
    axis = a["axis"] % x.ndim
    idx = _check_index(idx, x.shape[axis], "gather")
    # torch.gather: out[i...] = x[..., idx[i...], ...] with the other coordinates of i itself.
    grids = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    return [x[tuple(grids)]]


def _scatter_add(ins: list[Array], a: Mapping) -> list[Array]:
    x, idx, src = _num(ins[0]).copy(), ins[1], _num(ins[2])
    axis = a["axis"] % x.ndim
    idx = _check_index(idx, x.shape[axis], "scatter_add")
    grids = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    src = src[tuple(slice(0, s) for s in idx.shape)]
    np.add.at(x, tuple(np.broadcast_arrays(*grids)), src)
    return [x]


def _scatter_reduce(ufunc: Any) -> RefFn:
    def ref(ins: list[Array], a: Mapping) -> list[Array]:
        x, idx, src = _num(ins[0]).copy(), ins[1], _num(ins[2])
        axis = a["axis"] % x.ndim
        idx = _check_index(idx, x.shape[axis], "scatter_max/min")
        grids = list(np.indices(idx.shape, sparse=True))
        grids[axis] = idx
        src = src[tuple(slice(0, s) for s in idx.shape)]
        ufunc.at(x, tuple(np.broadcast_arrays(*grids)), src)
        return [x]

    return ref


def _index_add(ins: list[Array], a: Mapping) -> list[Array]:
    x, idx, src = _num(ins[0]).copy(), ins[1], _num(ins[2])
    axis = a["axis"] % x.ndim
    idx = _check_index(idx, x.shape[axis], "index_add")
    moved = np.moveaxis(x, axis, 0)  # a view: adds land in x
    np.add.at(moved, idx, np.moveaxis(src, axis, 0))
    return [x]


def _expand(ins: list[Array], a: Mapping) -> list[Array]:
    return [np.broadcast_to(ins[0], a["shape"]).copy()]


def _slice_index(x: Array, a: Mapping) -> tuple[slice, ...]:
    index = [slice(None)] * x.ndim
    index[a["axis"] % x.ndim] = slice(a["start"], a["end"], a["step"])
    return tuple(index)


def _strided_slice(ins: list[Array], a: Mapping) -> list[Array]:
    return [ins[0][_slice_index(ins[0], a)].copy()]


def _slice_scatter(ins: list[Array], a: Mapping) -> list[Array]:
    x = ins[0].copy()
    x[_slice_index(x, a)] = ins[1]
    return [x]


_NORM = {"none": "backward", "sqrt": "ortho", "n": "forward"}


def _fft_norm(a: Mapping, forward: bool) -> str:
    # torch's normalization 0/1/2 scales by 1, 1/sqrt(n), 1/n in either direction; numpy names the
    # scaling of the forward transform, so the inverse's names swap.
    if a["norm"] == "sqrt":
        return "ortho"
    if forward:
        return "backward" if a["norm"] == "none" else "forward"
    return "forward" if a["norm"] == "none" else "backward"


def _fft_r2c(ins: list[Array], a: Mapping) -> list[Array]:
    x = _f(ins[0]).astype(np.float64)
    axes = a["axes"]
    norm = _fft_norm(a, True)
    if a["onesided"]:
        y = np.fft.rfftn(x, axes=axes, norm=norm)
    else:
        y = np.fft.fftn(x, axes=axes, norm=norm)
    return [y.astype(np.complex64)]


def _fft_c2r(ins: list[Array], a: Mapping) -> list[Array]:
    x = np.asarray(ins[0], np.complex128)
    axes = a["axes"]
    sizes = [x.shape[ax] for ax in axes[:-1]] + [a["last_size"]]
    y = np.fft.irfftn(x, s=sizes, axes=axes, norm=_fft_norm(a, False))
    return [y.astype(np.float32)]


def _fft_c2c(ins: list[Array], a: Mapping) -> list[Array]:
    x = np.asarray(ins[0], np.complex128)
    if a["forward"]:
        y = np.fft.fftn(x, axes=a["axes"], norm=_fft_norm(a, True))
    else:
        y = np.fft.ifftn(x, axes=a["axes"], norm=_fft_norm(a, False))
    return [y.astype(np.complex64)]


def _view_as_real(ins: list[Array], a: Mapping) -> list[Array]:
    x = np.asarray(ins[0], np.complex64)
    return [np.stack([x.real, x.imag], axis=-1).astype(np.float32)]


def _view_as_complex(ins: list[Array], a: Mapping) -> list[Array]:
    x = np.asarray(ins[0], np.float32)
    return [(x[..., 0] + 1j * x[..., 1]).astype(np.complex64)]


def _general_reference() -> dict[str, RefFn]:
    from polymorph.ir.general_ops import BINARY_ARITH, BINARY_LOGICAL, COMPARE, REDUCE, UNARY_FLOAT

    table: dict[str, RefFn] = {name: _unary(name) for name in UNARY_FLOAT}
    table.update({name: _binary(name) for name in (*BINARY_ARITH, *BINARY_LOGICAL, *COMPARE)})
    table.update({name: _reduce(name) for name in REDUCE})
    table.update({
        "logical_not": _logical_not, "where": _where, "reduce_var": _reduce_var, "cumsum": _cumsum,
        "log_softmax": _log_softmax, "cmatmul": _cmatmul, "conv": _conv, "max_pool": _max_pool,
        "avg_pool": _avg_pool, "resize": _resize, "layer_norm": _layer_norm, "group_norm": _group_norm,
        "batch_norm": _batch_norm, "index_select": _index_select, "gather": _gather,
        "scatter_add": _scatter_add, "scatter_max": _scatter_reduce(np.maximum),
        "scatter_min": _scatter_reduce(np.minimum), "index_add": _index_add, "expand": _expand,
        "strided_slice": _strided_slice, "slice_scatter": _slice_scatter, "fft_r2c": _fft_r2c,
        "fft_c2r": _fft_c2r, "fft_c2c": _fft_c2c,
        "view_as_real": _view_as_real, "view_as_complex": _view_as_complex,
    })  # fmt: skip
    return table


GENERAL_REFERENCE: dict[str, RefFn] = _general_reference()
