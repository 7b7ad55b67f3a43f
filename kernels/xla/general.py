"""The general ops (polymorph/ir/general_ops.py) through jnp/lax, one node per group: elementwise and
comparison, reductions, complex matmul, convolution, pooling, resize, norms, indexing, layout and FFT
(jnp.fft). Floats compute in float32 (complex in complex64) and are returned in the output's dtype."""

import math

import jax.numpy as jnp
import numpy as np
from jax import dtypes, lax

from polymorph.ir.general_ops import GENERAL_OPS

IMPLEMENTS = tuple(GENERAL_OPS)  # every op of the closed set, one kernel for all
CONFIGS = [{}]

_UNARY = {
    "neg": jnp.negative, "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + jnp.exp(-x)), "relu": lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
    "erf": lax.erf, "reciprocal": lambda x: 1.0 / x, "floor": jnp.floor, "ceil": jnp.ceil,
    "round": jnp.round, "trunc": jnp.trunc, "sign": jnp.sign, "log1p": jnp.log1p, "expm1": jnp.expm1,
    "logical_not": jnp.logical_not,
}  # fmt: skip
_BINARY = {
    "sub": jnp.subtract, "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum,
    "remainder": jnp.remainder, "logical_and": jnp.logical_and, "logical_or": jnp.logical_or,
    "logical_xor": jnp.logical_xor, "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less,
    "le": jnp.less_equal, "gt": jnp.greater, "ge": jnp.greater_equal,
}  # fmt: skip
_REDUCE = {"reduce_sum": jnp.sum, "reduce_mean": jnp.mean, "reduce_max": jnp.max, "reduce_min": jnp.min,
           "reduce_prod": jnp.prod, "reduce_any": jnp.any, "reduce_all": jnp.all}  # fmt: skip
_FFT_NORM = {"none": "backward", "sqrt": "ortho", "n": "forward"}
_INVERSE_NORM = {"none": "forward", "sqrt": "ortho", "n": "backward"}


def supports(spec):
    return len(spec.nodes) == 1


def _num(x):
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _axes(x, attrs):
    return tuple(a % x.ndim for a in attrs["axes"]) if attrs["axes"] else tuple(range(x.ndim))


def _window_geometry(shape, attrs, dilation):
    """Per pooled dim: (left pad, right pad, output size), ceil_mode as torch defines it."""
    out = []
    for i, size in enumerate(shape):
        k, s, p, d = attrs["kernel"][i], attrs["stride"][i], attrs["padding"][i], dilation[i]
        span = d * (k - 1) + 1
        num = size + 2 * p - span
        n = (-(-num // s) if attrs["ceil_mode"] else num // s) + 1
        if attrs["ceil_mode"] and (n - 1) * s >= size + p:
            n -= 1
        out.append((p, max(p, (n - 1) * s + span - size - p), n))
    return out


def _pool(x, attrs, op):
    n = len(attrs["kernel"])
    lead = x.ndim - n
    dilation = tuple(attrs.get("dilation", (1,) * n)) if op == "max_pool" else (1,) * n
    geo = _window_geometry(x.shape[lead:], attrs, dilation)
    pads = [(0, 0)] * lead + [(lo, hi) for lo, hi, _ in geo]
    window = (1,) * lead + tuple(attrs["kernel"])
    strides = (1,) * lead + tuple(attrs["stride"])
    dil = (1,) * lead + dilation
    if op == "max_pool":
        y = lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads, window_dilation=dil)
    else:
        total = lax.reduce_window(x, 0.0, lax.add, window, strides, pads)
        if attrs["divisor"]:
            y = total / float(attrs["divisor"])
        else:
            # the count of each window: real elements only, or the symmetric padding too (never the
            # ceil_mode overhang past it)
            sizes = x.shape[lead:]
            if attrs["count_include_pad"]:
                ones = jnp.ones([s + 2 * lo for s, (lo, _, _) in zip(sizes, geo)], jnp.float32)
                extra = [(0, hi - lo) for lo, hi, _ in geo]
            else:
                ones = jnp.ones(sizes, jnp.float32)
                extra = [(lo, hi) for lo, hi, _ in geo]
            count = lax.reduce_window(
                ones, 0.0, lax.add, tuple(attrs["kernel"]), tuple(attrs["stride"]), extra
            )
            y = total / count
    ends = [g[2] for g in geo]
    return y[(..., *(slice(0, e) for e in ends))]


def _source(size_in, size_out, mode, align):
    dst = np.arange(size_out, dtype=np.float64)
    if mode == "nearest":
        return np.minimum(np.floor(dst * (size_in / size_out)), size_in - 1)
    if align:
        return dst * ((size_in - 1) / (size_out - 1)) if size_out > 1 else np.zeros(size_out)
    return np.maximum((dst + 0.5) * (size_in / size_out) - 0.5, 0.0)


def _resize(x, attrs):
    size = attrs["size"]
    lead = x.ndim - len(size)
    for i, out in enumerate(size):
        axis = lead + i
        src = _source(x.shape[axis], out, attrs["mode"], attrs["align_corners"])
        if attrs["mode"] == "nearest":
            x = jnp.take(x, src.astype(np.int32), axis=axis)
            continue
        lo = np.floor(src).astype(np.int32)
        hi = np.minimum(lo + 1, x.shape[axis] - 1)
        frac = jnp.asarray((src - lo).astype(np.float32).reshape([-1] + [1] * (x.ndim - axis - 1)))
        x = jnp.take(x, lo, axis=axis) * (1.0 - frac) + jnp.take(x, hi, axis=axis) * frac
    return x


def _normalize(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps)


def _affine(y, params, shape):
    if params:
        y = y * params[0].astype(jnp.float32).reshape(shape)
    if len(params) > 1:
        y = y + params[1].astype(jnp.float32).reshape(shape)
    return y


def _wrap(idx, size):
    return jnp.where(idx < 0, idx + size, idx)


def _slice_index(x, attrs):
    index = [slice(None)] * x.ndim
    index[attrs["axis"] % x.ndim] = slice(attrs["start"], attrs["end"], attrs["step"])
    return tuple(index)


def _conv(xs, attrs):
    x, w = xs[0].astype(jnp.float32), xs[1].astype(jnp.float32)
    n = x.ndim - 2
    y = lax.conv_general_dilated(
        x, w, window_strides=tuple(attrs["stride"]), padding=[(p, p) for p in attrs["padding"]],
        rhs_dilation=tuple(attrs["dilation"]), feature_group_count=attrs["groups"],
        precision=lax.Precision.HIGHEST,
    )  # fmt: skip
    if len(xs) == 3:
        y = y + xs[2].astype(jnp.float32).reshape(1, -1, *([1] * n))
    return y


def _scatter_coords(idx, axis):
    grids = list(jnp.indices(idx.shape, sparse=True))
    grids[axis] = idx
    return tuple(jnp.broadcast_arrays(*grids))


def compute(op, xs, attrs):
    if op in _UNARY:
        return _UNARY[op](_num(xs[0]))
    if op == "div":
        a, b = _num(xs[0]), _num(xs[1])
        return jnp.floor_divide(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else a / b
    if op in _BINARY:
        return _BINARY[op](_num(xs[0]), _num(xs[1]))
    if op == "where":
        return jnp.where(xs[0], _num(xs[1]), _num(xs[2]))
    if op in _REDUCE:
        x = _num(xs[0])
        return _REDUCE[op](x, axis=_axes(x, attrs), keepdims=attrs["keepdims"])
    if op == "reduce_var":
        x = xs[0].astype(jnp.float32)
        axes = _axes(x, attrs)
        n = math.prod(x.shape[a] for a in axes)
        mean = x.mean(axis=axes, keepdims=True)
        ss = ((x - mean) ** 2).sum(axis=axes, keepdims=attrs["keepdims"])
        return ss / max(n - attrs["correction"], 0.0)
    if op == "cumsum":
        x = _num(xs[0])
        return jnp.cumsum(x.astype(jnp.int32) if x.dtype == jnp.bool_ else x, axis=attrs["axis"])
    if op == "log_softmax":
        x = xs[0].astype(jnp.float32)
        shifted = x - x.max(axis=attrs["axis"], keepdims=True)
        return shifted - jnp.log(jnp.exp(shifted).sum(axis=attrs["axis"], keepdims=True))
    if op == "cmatmul":
        return jnp.matmul(xs[0], xs[1], precision=lax.Precision.HIGHEST)
    if op == "conv":
        return _conv(xs, attrs)
    if op in ("max_pool", "avg_pool"):
        return _pool(xs[0].astype(jnp.float32), attrs, op)
    if op == "resize":
        return _resize(xs[0].astype(jnp.float32), attrs)
    if op == "layer_norm":
        x = xs[0].astype(jnp.float32)
        dims = attrs["dims"]
        y = _normalize(x, tuple(range(x.ndim - dims, x.ndim)), attrs["eps"])
        return _affine(y, xs[1:], x.shape[x.ndim - dims :])
    if op == "group_norm":
        x = xs[0].astype(jnp.float32)
        n, c = x.shape[:2]
        y = _normalize(x.reshape(n, attrs["groups"], -1), (2,), attrs["eps"]).reshape(x.shape)
        return _affine(y, xs[1:], (1, c) + (1,) * (x.ndim - 2))
    if op == "batch_norm":
        x, w, b, mean, var = (t.astype(jnp.float32) for t in xs)
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        return (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + attrs["eps"]) * w.reshape(
            shape
        ) + b.reshape(shape)
    if op == "index_select":
        axis = attrs["axis"] % xs[0].ndim
        return jnp.take(xs[0], _wrap(xs[1], xs[0].shape[axis]), axis=axis)
    if op == "gather":
        axis = attrs["axis"] % xs[0].ndim
        return xs[0][_scatter_coords(_wrap(xs[1], xs[0].shape[axis]), axis)]
    if op == "scatter_add":
        x, idx, src = _num(xs[0]), xs[1], _num(xs[2])
        axis = attrs["axis"] % x.ndim
        src = src[tuple(slice(0, s) for s in idx.shape)]
        return x.at[_scatter_coords(_wrap(idx, x.shape[axis]), axis)].add(src)
    if op in ("scatter_max", "scatter_min"):
        x, idx, src = _num(xs[0]), xs[1], _num(xs[2])
        axis = attrs["axis"] % x.ndim
        src = src[tuple(slice(0, s) for s in idx.shape)]
        at = x.at[_scatter_coords(_wrap(idx, x.shape[axis]), axis)]
        return at.max(src) if op == "scatter_max" else at.min(src)
    if op == "index_add":
        x, idx, src = _num(xs[0]), xs[1], _num(xs[2])
        axis = attrs["axis"] % x.ndim
        index = [slice(None)] * x.ndim
        index[axis] = _wrap(idx, x.shape[axis])
        return x.at[tuple(index)].add(src)
    if op == "expand":
        return jnp.broadcast_to(xs[0], attrs["shape"])
    if op == "strided_slice":
        return xs[0][_slice_index(xs[0], attrs)]
    if op == "slice_scatter":
        return xs[0].at[_slice_index(xs[0], attrs)].set(xs[1])
    if op == "fft_r2c":
        x = xs[0].astype(jnp.float32)
        fn = jnp.fft.rfftn if attrs["onesided"] else jnp.fft.fftn
        return fn(x, axes=attrs["axes"], norm=_FFT_NORM[attrs["norm"]])
    if op == "fft_c2r":
        x = xs[0]
        axes = attrs["axes"]
        sizes = [x.shape[a] for a in axes[:-1]] + [attrs["last_size"]]
        return jnp.fft.irfftn(x, s=sizes, axes=axes, norm=_INVERSE_NORM[attrs["norm"]])
    if op == "fft_c2c":
        if attrs["forward"]:
            return jnp.fft.fftn(xs[0], axes=attrs["axes"], norm=_FFT_NORM[attrs["norm"]])
        return jnp.fft.ifftn(xs[0], axes=attrs["axes"], norm=_INVERSE_NORM[attrs["norm"]])
    if op == "view_as_real":
        x = xs[0].astype(jnp.complex64)
        return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).astype(jnp.float32)
    if op == "view_as_complex":
        x = xs[0].astype(jnp.float32)
        return lax.complex(x[..., 0], x[..., 1])
    raise AssertionError(f"general.py has no {op}")


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        y = compute(op, [inputs[i] for i in args], attrs)
        return (y.astype(out),)

    return launch
