"""The general ops (polymorph/ir/general_ops.py) through torch, one node per group: elementwise and
comparison, reductions, complex matmul, convolution, pooling, resize, norms, indexing, layout and FFT.
Floats compute in float32 (complex in complex64) and are written into the output's dtype.

The configs (the first, {}, is the stock one; a key for another op family than the group's is inert):
  conv: "im2col"         the patches unfolded by strides into [N, G, *O, C/G * K] and one matmul
                         per group, instead of torch's convolution (another summation order: within
                         the op tolerance, not bit-identical to the stock config)
  conv: "channels_last"  torch's convolution on channels-last (NHWC, NDHWC) tensors
  reduce: "f64"          reduce_sum, reduce_mean and reduce_var accumulate in float64 and round once
                         (more accurate than the stock f32 accumulation, so not bit-identical to it)"""

import torch
import torch.nn.functional as F

from polymorph.ir.general_ops import GENERAL_OPS

IMPLEMENTS = tuple(GENERAL_OPS)  # every op of the closed set, one kernel for all
CONFIGS = [{}, {"conv": "im2col"}, {"conv": "channels_last"}, {"reduce": "f64"}]
_CONFIG_VALUES = {"conv": ("direct", "im2col", "channels_last"), "reduce": ("f32", "f64")}

_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "erf": torch.erf, "reciprocal": torch.reciprocal,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "sign": torch.sign,
    "log1p": torch.log1p, "expm1": torch.expm1, "logical_not": torch.logical_not,
}  # fmt: skip
_BINARY = {
    "sub": torch.sub, "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
    "remainder": torch.remainder, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge,
}  # fmt: skip
_REDUCE = {
    "reduce_sum": torch.sum,
    "reduce_mean": torch.mean,
    "reduce_max": torch.amax,
    "reduce_min": torch.amin,
}
_FFT_NORM = {"none": "backward", "sqrt": "ortho", "n": "forward"}


def supports(spec):
    return len(spec.nodes) == 1


def _num(x):
    """float32 for float tensors; integers, bools and complex values as they are."""
    return x.float() if x.is_floating_point() else x


def _axes(x, attrs):
    return tuple(a % x.dim() for a in attrs["axes"]) if attrs["axes"] else tuple(range(x.dim()))


def _inverse_norm(norm):
    # torch names the forward transform's scaling; the inverse of an unscaled forward is scaled by 1/n.
    return {"none": "forward", "sqrt": "ortho", "n": "backward"}[norm]


def _pool(x, attrs, op):
    n = len(attrs["kernel"])
    lead = x.shape[: x.dim() - n]
    # torch's pooling takes [N, C, *S] (or [C, *S]): fold every leading dim into one batch-of-channels.
    y = x.reshape(1, -1, *x.shape[x.dim() - n :])
    if op == "max_pool":
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]
        y = fn(y, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], attrs["ceil_mode"])
    else:
        fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
        kw = {"divisor_override": attrs["divisor"] or None} if n > 1 else {}
        if n == 1 and attrs["divisor"]:
            raise ValueError("avg_pool over one dim takes no divisor")
        y = fn(
            y,
            attrs["kernel"],
            attrs["stride"],
            attrs["padding"],
            attrs["ceil_mode"],
            attrs["count_include_pad"],
            **kw,
        )
    return y.reshape(*lead, *y.shape[2:])


def _resize(x, attrs):
    size = tuple(attrs["size"])
    n = len(size)
    lead = x.shape[: x.dim() - n]
    y = x.reshape(1, -1, *x.shape[x.dim() - n :])
    if attrs["mode"] == "nearest":
        y = F.interpolate(y, size=size, mode="nearest")
    else:
        mode = ("linear", "bilinear", "trilinear")[n - 1]
        y = F.interpolate(y, size=size, mode=mode, align_corners=attrs["align_corners"])
    return y.reshape(*lead, *size)


def _conv_im2col(x, w, b, attrs):
    """conv as im2col + matmul. x: [N, C, *S], w: [O, C/G, *K] (, b: [O]) -> [N, O, *Out]."""
    n = x.dim() - 2
    groups = attrs["groups"]
    stride, padding, dilation = attrs["stride"], attrs["padding"], attrs["dilation"]
    kernel = w.shape[2:]
    pad = [p for i in reversed(range(n)) for p in (padding[i], padding[i])]  # F.pad: last dim first
    cols = F.pad(x, pad) if any(padding) else x
    for i in range(n):  # each spatial dim d -> [.., Out_d, ..] with its window appended last
        extent = dilation[i] * (kernel[i] - 1) + 1
        cols = cols.unfold(2 + i, extent, stride[i])[..., :: dilation[i]]
    # cols: [N, C, *Out, *K] -> [N, G, *Out, C/G * prod(K)]
    batch, channels = x.shape[:2]
    out_sizes = cols.shape[2 : 2 + n]
    cols = cols.reshape(batch, groups, channels // groups, *out_sizes, *kernel)
    order = [0, 1, *range(3, 3 + n), 2, *range(3 + n, 3 + 2 * n)]
    cols = cols.permute(order).reshape(batch, groups, *out_sizes, -1)
    # w: [O, C/G, *K] -> [G, C/G * prod(K), O/G]
    wg = w.reshape(groups, w.shape[0] // groups, -1).transpose(1, 2)
    flat = cols.reshape(batch, groups, -1, cols.shape[-1])  # [N, G, prod(Out), C/G * prod(K)]
    y = torch.matmul(flat, wg[None])  # [N, G, prod(Out), O/G]
    y = y.permute(0, 1, 3, 2).reshape(batch, w.shape[0], *out_sizes)
    return y + b.reshape(1, -1, *([1] * n)) if b is not None else y


def _slice_index(x, attrs):
    index = [slice(None)] * x.dim()
    index[attrs["axis"] % x.dim()] = slice(attrs["start"], attrs["end"], attrs["step"])
    return tuple(index)


def compute(op, xs, attrs, out, config=None):
    config = config or {}
    if op in _UNARY:
        return _UNARY[op](_num(xs[0]))
    if op == "div":
        a, b = _num(xs[0]), _num(xs[1])
        return torch.div(a, b, rounding_mode="floor") if not a.is_floating_point() else a / b
    if op in _BINARY:
        return _BINARY[op](_num(xs[0]), _num(xs[1]))
    if op == "where":
        return torch.where(xs[0], _num(xs[1]), _num(xs[2]))
    if op in _REDUCE:
        x = _num(xs[0])
        if config.get("reduce") == "f64" and op in ("reduce_sum", "reduce_mean") and x.is_floating_point():
            x = x.double()
        return _REDUCE[op](x, dim=_axes(x, attrs), keepdim=attrs["keepdims"])
    if op in ("reduce_prod", "reduce_any", "reduce_all"):
        x = _num(xs[0])
        fn = {"reduce_prod": torch.prod, "reduce_any": torch.any, "reduce_all": torch.all}[op]
        for axis in sorted(_axes(x, attrs), reverse=True):
            x = fn(x, dim=axis, keepdim=attrs["keepdims"])
        return x
    if op == "reduce_var":
        x = xs[0].double() if config.get("reduce") == "f64" else xs[0].float()
        return torch.var(x, dim=_axes(x, attrs), correction=attrs["correction"], keepdim=attrs["keepdims"])
    if op == "cumsum":
        return torch.cumsum(_num(xs[0]), dim=attrs["axis"])
    if op == "log_softmax":
        return torch.log_softmax(xs[0].float(), dim=attrs["axis"])
    if op == "cmatmul":
        return xs[0].to(torch.complex64) @ xs[1].to(torch.complex64)
    if op == "conv":
        x, w = xs[0].float(), xs[1].float()
        b = xs[2].float() if len(xs) == 3 else None
        impl = config.get("conv", "direct")
        if impl == "im2col":
            return _conv_im2col(x, w, b, attrs)
        if impl == "channels_last" and x.dim() in (4, 5):
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        fn = (F.conv1d, F.conv2d, F.conv3d)[x.dim() - 3]
        return fn(x, w, b, attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"])
    if op in ("max_pool", "avg_pool"):
        return _pool(xs[0].float(), attrs, op)
    if op == "resize":
        return _resize(xs[0].float(), attrs)
    if op == "layer_norm":
        x = xs[0].float()
        w = xs[1].float() if len(xs) > 1 else None
        b = xs[2].float() if len(xs) > 2 else None
        return F.layer_norm(x, x.shape[x.dim() - attrs["dims"] :], w, b, attrs["eps"])
    if op == "group_norm":
        x = xs[0].float()
        w = xs[1].float() if len(xs) > 1 else None
        b = xs[2].float() if len(xs) > 2 else None
        return F.group_norm(x, attrs["groups"], w, b, attrs["eps"])
    if op == "batch_norm":
        x, w, b, mean, var = (t.float() for t in xs)
        return F.batch_norm(x, mean, var, w, b, training=False, eps=attrs["eps"])
    if op == "index_select":
        return torch.index_select(xs[0], attrs["axis"], _wrap(xs[1], xs[0].shape[attrs["axis"]]))
    if op == "gather":
        return torch.gather(xs[0], attrs["axis"], _wrap(xs[1], xs[0].shape[attrs["axis"]]))
    if op == "scatter_add":
        x, idx, src = _num(xs[0]), _wrap(xs[1], xs[0].shape[attrs["axis"]]), _num(xs[2])
        return torch.scatter_add(x, attrs["axis"], idx, src)
    if op in ("scatter_max", "scatter_min"):
        x, idx, src = _num(xs[0]), _wrap(xs[1], xs[0].shape[attrs["axis"]]), _num(xs[2])
        src = src[tuple(slice(0, s) for s in idx.shape)]
        reduce = "amax" if op == "scatter_max" else "amin"
        return torch.scatter_reduce(x, attrs["axis"], idx, src, reduce, include_self=True)
    if op == "index_add":
        x, idx, src = _num(xs[0]), _wrap(xs[1], xs[0].shape[attrs["axis"]]), _num(xs[2])
        return torch.index_add(x, attrs["axis"], idx, src)
    if op == "expand":
        return xs[0].expand(*attrs["shape"])
    if op == "strided_slice":
        return xs[0][_slice_index(xs[0], attrs)]
    if op == "slice_scatter":
        y = xs[0].clone()
        y[_slice_index(y, attrs)] = xs[1]
        return y
    if op == "fft_r2c":
        x = xs[0].float()
        if attrs["onesided"]:
            return torch.fft.rfftn(x, dim=attrs["axes"], norm=_FFT_NORM[attrs["norm"]])
        return torch.fft.fftn(x, dim=attrs["axes"], norm=_FFT_NORM[attrs["norm"]])
    if op == "fft_c2r":
        x = xs[0]
        axes = attrs["axes"]
        sizes = [x.shape[a] for a in axes[:-1]] + [attrs["last_size"]]
        return torch.fft.irfftn(x, s=sizes, dim=axes, norm=_inverse_norm(attrs["norm"]))
    if op == "fft_c2c":
        if attrs["forward"]:
            return torch.fft.fftn(xs[0], dim=attrs["axes"], norm=_FFT_NORM[attrs["norm"]])
        return torch.fft.ifftn(xs[0], dim=attrs["axes"], norm=_inverse_norm(attrs["norm"]))
    if op == "view_as_real":
        return torch.view_as_real(xs[0].to(torch.complex64)).clone()
    if op == "view_as_complex":
        return torch.view_as_complex(xs[0].float().contiguous()).clone()
    raise AssertionError(f"general.py has no {op}")


def _wrap(idx, size):
    # The reference accepts negative indices as Python does; torch.gather and friends do not.
    idx = idx.long()
    return torch.where(idx < 0, idx + size, idx)


def build(spec, config, target):
    for key, value in config.items():
        if value not in _CONFIG_VALUES.get(key, ()):
            raise ValueError(
                f"general.py has no config {key}={value!r}; its keys: "
                + "; ".join(f"{k}: {', '.join(v)}" for k, v in _CONFIG_VALUES.items())
            )
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op

    def launch(inputs, outputs, scratch):
        out = outputs[0]
        y = compute(op, [inputs[i] for i in args], attrs, out, config)
        out.copy_(y.to(out.dtype) if y.dtype != out.dtype else y)

    return launch
