"""The general ops: the closed set that torch.export's core ATen graphs import into (polymorph/frontend/).

These are the second tier of the op table (ops.py holds the model-level ops LLM kernels implement);
ops.py merges `GENERAL_OPS` into `OPS`, so the verifier, the reference and every backend see one
table. Where an ATen op means the same as a model-level op it imports into that op instead (add,
mul, matmul, linear, softmax, gelu, silu, layernorm, embedding, reshape, transpose, slice, concat,
cast), so fusion patterns written for the builders' graphs can match imported ones.

The set, by group (each op's numpy definition is in general_reference.py):
  elementwise  unary float: neg abs exp log sqrt rsqrt sin cos tan tanh sigmoid relu erf reciprocal
               floor ceil round trunc sign log1p expm1; logical_not (any -> bool)
               binary (same dtype, numpy broadcast): sub div pow maximum minimum remainder;
               logical_and logical_or logical_xor (-> bool); where(cond, a, b)
  comparison   eq ne lt le gt ge (same dtype, broadcast, -> bool)
  reduction    reduce_sum reduce_mean reduce_max reduce_min reduce_prod reduce_any reduce_all
               (axes, keepdims); reduce_var (axes, keepdims, correction); cumsum (axis);
               log_softmax (axis)
  projection   cmatmul: matmul of complex64 operands (real matmuls are `matmul`)
  convolution  conv: x[N, C, *S], w[O, C/groups, *K] (, b[O]), 1-3 spatial dims, stride, padding,
               dilation, groups
  pooling      max_pool, avg_pool: kernel, stride, padding (, dilation, ceil_mode, count_include_pad,
               divisor) over the trailing 1-3 dims
  resize       resize: nearest or linear (bi-, trilinear) to `size`, align_corners
  norm         layer_norm (over the last `dims` dims, weight and bias optional), group_norm,
               batch_norm (inference: running statistics)
  indexing     index_select gather scatter_add scatter_max scatter_min index_add (torch's semantics,
               along `axis`; scatter_max/min reduce with x's own values: include_self)
  layout       expand, strided_slice (step > 1), slice_scatter
  spectral     fft_r2c fft_c2r fft_c2c over `axes`, norm none|sqrt|n (torch's 0|1|2), complex64 values;
               view_as_real (c64 [*] -> f32 [*, 2]: real, imaginary) and view_as_complex (its inverse)
"""

from __future__ import annotations

from collections.abc import Mapping

from polymorph.ir.dtypes import DType
from polymorph.ir.graph import TensorType
from polymorph.ir.ops import (
    AttrSpec,
    Cost,
    OpDef,
    OpError,
    _axis,
    _cost_elementwise,
    _cost_move,
    _io_bytes,
    _req,
)
from polymorph.ir.shapes import Dim, broadcast, numel

UNARY_FLOAT = (
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "relu", "erf",
    "reciprocal", "floor", "ceil", "round", "trunc", "sign", "log1p", "expm1",
)  # fmt: skip
UNARY_ANY = ("neg", "abs", "sign")  # also defined on integers
BINARY_ARITH = ("sub", "div", "pow", "maximum", "minimum", "remainder")
BINARY_LOGICAL = ("logical_and", "logical_or", "logical_xor")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_any", "reduce_all")
FFT = ("fft_r2c", "fft_c2r", "fft_c2c")


def _numeric(t: TensorType, what: str) -> None:
    _req(t.dtype != DType.BOOL, f"{what} must be a numeric tensor, got {t}")


def _infer_unary(op: str):
    def infer(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
        (x,) = ins
        if op in UNARY_ANY:
            _numeric(x, "x")
        else:
            _req(x.dtype.is_float, f"x must be a float tensor, got {x}")
        return [x]

    return infer


def _infer_logical_not(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    return [TensorType(DType.BOOL, ins[0].shape)]


def _broadcast_all(ins: list[TensorType]) -> tuple[Dim, ...]:
    shape: tuple[Dim, ...] = ()
    try:
        for t in ins:
            shape = broadcast(shape, t.shape)
    except ValueError as e:
        raise OpError(str(e)) from None
    return shape


def _infer_arith(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    a, b = ins
    _req(a.dtype == b.dtype, f"dtypes differ: {a.dtype} and {b.dtype}")
    _numeric(a, "a")
    return [TensorType(a.dtype, _broadcast_all(ins))]


def _infer_compare(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    a, b = ins
    _req(a.dtype == b.dtype, f"dtypes differ: {a.dtype} and {b.dtype}")
    return [TensorType(DType.BOOL, _broadcast_all(ins))]


def _infer_logical(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    return [TensorType(DType.BOOL, _broadcast_all(ins))]


def _infer_where(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    cond, a, b = ins
    _req(cond.dtype == DType.BOOL, f"cond must be bool, got {cond}")
    _req(a.dtype == b.dtype, f"dtypes differ: {a.dtype} and {b.dtype}")
    return [TensorType(a.dtype, _broadcast_all(ins))]


def _reduced_axes(x: TensorType, axes: tuple[int, ...]) -> set[int]:
    axes = tuple(_axis(x.rank, a) for a in axes) if axes else tuple(range(x.rank))
    _req(len(set(axes)) == len(axes), f"axes {list(axes)} repeat an axis")
    return set(axes)


def _infer_reduce(op: str):
    def infer(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
        (x,) = ins
        axes = _reduced_axes(x, attrs["axes"])
        if op in ("reduce_mean", "reduce_var"):
            _req(x.dtype.is_float, f"x must be a float tensor, got {x}")
        dtype = DType.BOOL if op in ("reduce_any", "reduce_all") else x.dtype
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [TensorType(dtype, shape)]

    return infer


def _cost_reduce(ins, outs, attrs) -> Cost:
    return Cost(float(numel(ins[0][1])), _io_bytes(ins, outs))


def _infer_same(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    if "axis" in attrs:
        _axis(x.rank, attrs["axis"])
    return [x]


def _infer_log_softmax(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    _req(ins[0].dtype.is_float, f"x must be a float tensor, got {ins[0]}")
    return _infer_same(ins, attrs)


def _infer_cmatmul(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    a, b = ins
    _req(a.dtype == DType.C64 and b.dtype == DType.C64, f"cmatmul takes c64 operands, got {a} and {b}")
    _req(a.rank >= 2 and b.rank >= 2, f"cmatmul needs rank >= 2, got {a} and {b}")
    _req(a.shape[-1] == b.shape[-2], f"a {a} and b {b} disagree on the inner dim")
    try:
        batch = broadcast(a.shape[:-2], b.shape[:-2])
    except ValueError as e:
        raise OpError(str(e)) from None
    return [TensorType(DType.C64, (*batch, a.shape[-2], b.shape[-1]))]


def _cost_cmatmul(ins, outs, attrs) -> Cost:
    # A complex multiply-add is 4 real multiplies and 4 adds.
    return Cost(8.0 * numel(outs[0][1]) * ins[0][1][-1], _io_bytes(ins, outs))


def _spatial_attr(attrs: Mapping, key: str, n: int) -> tuple[int, ...]:
    value = tuple(attrs[key])
    _req(len(value) == n, f"`{key}` has {len(value)} entries for {n} spatial dims")
    return value


def _window_out(size: int, k: int, stride: int, pad: int, dilation: int, ceil: bool = False) -> int:
    span = dilation * (k - 1) + 1
    _req(stride > 0 and dilation > 0, "stride and dilation must be positive")
    _req(size + 2 * pad >= span, f"window {span} exceeds the padded size {size + 2 * pad}")
    num = size + 2 * pad - span
    out = (-(-num // stride) if ceil else num // stride) + 1
    if ceil and (out - 1) * stride >= size + pad:  # torch: the last window must start inside the input
        out -= 1
    return out


def _concrete(t: TensorType, what: str) -> tuple[int, ...]:
    _req(all(isinstance(d, int) for d in t.shape), f"{what} needs concrete dims, got {t}")
    return tuple(int(d) for d in t.shape)


def _infer_conv(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, w = ins[0], ins[1]
    _req(x.dtype.is_float and w.dtype == x.dtype, f"conv takes float x and w of one dtype, got {x}, {w}")
    n = x.rank - 2
    _req(
        1 <= n <= 3 and w.rank == x.rank,
        f"conv takes x[N, C, *S] with 1-3 spatial dims and w[O, C/g, *K], got {x}, {w}",
    )
    xs, ws = _concrete(x, "conv"), _concrete(w, "conv")
    g = attrs["groups"]
    _req(g >= 1 and xs[1] % g == 0 and ws[0] % g == 0, f"groups {g} must divide channels {xs[1]} and {ws[0]}")
    _req(ws[1] * g == xs[1], f"w {w} takes {ws[1] * g} input channels, x has {xs[1]}")
    if len(ins) == 3:
        _req(ins[2].shape == (ws[0],), f"bias must be [{ws[0]}], got {ins[2]}")
    stride, pad, dil = (_spatial_attr(attrs, k, n) for k in ("stride", "padding", "dilation"))
    spatial = tuple(_window_out(xs[2 + i], ws[2 + i], stride[i], pad[i], dil[i]) for i in range(n))
    return [TensorType(x.dtype, (xs[0], ws[0], *spatial))]


def _cost_conv(ins, outs, attrs) -> Cost:
    (_, ws) = ins[1]
    per_out = 2.0 * numel(ws[1:])
    return Cost(per_out * numel(outs[0][1]), _io_bytes(ins, outs))


def _infer_pool(op: str):
    def infer(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
        (x,) = ins
        _req(x.dtype.is_float, f"x must be a float tensor, got {x}")
        n = len(attrs["kernel"])
        _req(1 <= n <= 3 and x.rank >= n + 1, f"pooling over {n} dims of {x}")
        xs = _concrete(x, op)
        kernel = tuple(attrs["kernel"])
        stride = _spatial_attr(attrs, "stride", n)
        pad = _spatial_attr(attrs, "padding", n)
        dil = _spatial_attr(attrs, "dilation", n) if op == "max_pool" else (1,) * n
        _req(
            all(2 * p <= k for p, k in zip(pad, kernel, strict=True)),
            "padding must be at most half the kernel",
        )
        lead = xs[: x.rank - n]
        spatial = tuple(
            _window_out(xs[len(lead) + i], kernel[i], stride[i], pad[i], dil[i], attrs["ceil_mode"])
            for i in range(n)
        )
        return [TensorType(x.dtype, (*lead, *spatial))]

    return infer


def _cost_pool(ins, outs, attrs) -> Cost:
    window = 1
    for k in attrs["kernel"]:
        window *= k
    return Cost(float(window * numel(outs[0][1])), _io_bytes(ins, outs))


def _infer_resize(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    _req(x.dtype.is_float, f"x must be a float tensor, got {x}")
    size = tuple(attrs["size"])
    _req(1 <= len(size) <= 3 and x.rank >= len(size) + 1, f"resize of {len(size)} dims of {x}")
    _req(all(s > 0 for s in size), f"size {list(size)} must be positive")
    return [TensorType(x.dtype, (*x.shape[: x.rank - len(size)], *size))]


def _cost_resize(ins, outs, attrs) -> Cost:
    per = 1.0 if attrs["mode"] == "nearest" else 3.0 * 2 ** len(attrs["size"])
    return Cost(per * numel(outs[0][1]), _io_bytes(ins, outs))


def _infer_layer_norm(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x = ins[0]
    _req(x.dtype.is_float, f"x must be a float tensor, got {x}")
    dims = attrs["dims"]
    _req(1 <= dims <= x.rank, f"dims {dims} out of range for {x}")
    for i, p in enumerate(ins[1:], start=1):
        _req(
            p.shape == x.shape[x.rank - dims :],
            f"input {i} must be {list(x.shape[x.rank - dims :])}, got {p}",
        )
    return [x]


def _infer_group_norm(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x = ins[0]
    _req(x.dtype.is_float and x.rank >= 2, f"x must be a float [N, C, *], got {x}")
    c, g = x.shape[1], attrs["groups"]
    _req(isinstance(c, int) and g >= 1 and c % g == 0, f"groups {g} must divide the {c} channels")
    for i, p in enumerate(ins[1:], start=1):
        _req(p.shape == (c,), f"input {i} must be [{c}], got {p}")
    return [x]


def _infer_batch_norm(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x = ins[0]
    _req(x.dtype.is_float and x.rank >= 2, f"x must be a float [N, C, *], got {x}")
    for i, p in enumerate(ins[1:], start=1):
        _req(p.shape == (x.shape[1],), f"input {i} must be [{x.shape[1]}], got {p}")
    return [x]


def _cost_norm(ins, outs, attrs) -> Cost:
    return Cost(5.0 * numel(ins[0][1]), _io_bytes(ins, outs))


def _infer_index_select(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, idx = ins
    axis = _axis(x.rank, attrs["axis"])
    _req(idx.dtype.is_int and idx.rank == 1, f"index must be a 1-d integer tensor, got {idx}")
    return [TensorType(x.dtype, (*x.shape[:axis], idx.shape[0], *x.shape[axis + 1 :]))]


def _infer_gather(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, idx = ins
    _axis(x.rank, attrs["axis"])
    _req(
        idx.dtype.is_int and idx.rank == x.rank,
        f"index must be an integer tensor of rank {x.rank}, got {idx}",
    )
    return [TensorType(x.dtype, idx.shape)]


def _infer_scatter_add(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, idx, src = ins
    _axis(x.rank, attrs["axis"])
    _req(
        idx.dtype.is_int and idx.rank == x.rank,
        f"index must be an integer tensor of rank {x.rank}, got {idx}",
    )
    _req(src.dtype == x.dtype and src.rank == x.rank, f"src {src} must match x {x} in dtype and rank")
    ok = all(
        i == s or (isinstance(i, int) and isinstance(s, int) and i <= s)
        for i, s in zip(idx.shape, src.shape, strict=True)
    )
    _req(ok, f"index {idx} must fit inside src {src}")
    return [x]


def _infer_index_add(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, idx, src = ins
    axis = _axis(x.rank, attrs["axis"])
    _req(idx.dtype.is_int and idx.rank == 1, f"index must be a 1-d integer tensor, got {idx}")
    want = (*x.shape[:axis], idx.shape[0], *x.shape[axis + 1 :])
    _req(src.dtype == x.dtype and src.shape == want, f"src must be {x.dtype}{list(want)}, got {src}")
    return [x]


def _cost_gather(ins, outs, attrs) -> Cost:
    return Cost(0.0, _io_bytes(ins, outs))


def _cost_scatter(ins, outs, attrs) -> Cost:
    return Cost(float(numel(ins[2][1])), _io_bytes(ins, outs))


def _infer_expand(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    shape = tuple(attrs["shape"])
    _req(len(shape) >= x.rank, f"cannot expand {x} to {list(shape)}")
    _req(_broadcast_all([x, TensorType(x.dtype, shape)]) == shape, f"cannot expand {x} to {list(shape)}")
    return [TensorType(x.dtype, shape)]


def _slice_length(size: Dim, start: int, end: int, step: int) -> int:
    _req(isinstance(size, int), f"strided slices need concrete dims, got {size}")
    _req(step >= 1, f"step {step} must be positive")
    n = len(range(*slice(start, end, step).indices(int(size))))
    return n


def _infer_strided_slice(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    axis = _axis(x.rank, attrs["axis"])
    n = _slice_length(x.shape[axis], attrs["start"], attrs["end"], attrs["step"])
    _req(n > 0, "the slice is empty")
    return [TensorType(x.dtype, (*x.shape[:axis], n, *x.shape[axis + 1 :]))]


def _infer_slice_scatter(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    x, src = ins
    axis = _axis(x.rank, attrs["axis"])
    n = _slice_length(x.shape[axis], attrs["start"], attrs["end"], attrs["step"])
    want = (*x.shape[:axis], n, *x.shape[axis + 1 :])
    _req(src.dtype == x.dtype and src.shape == want, f"src must be {x.dtype}{list(want)}, got {src}")
    return [x]


def _fft_axes(x: TensorType, attrs: Mapping) -> tuple[int, ...]:
    axes = tuple(_axis(x.rank, a) for a in attrs["axes"])
    _req(len(axes) >= 1 and len(set(axes)) == len(axes), f"axes {list(attrs['axes'])} must be distinct")
    _concrete(x, "fft")
    return axes


def _infer_fft(op: str):
    def infer(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
        (x,) = ins
        axes = _fft_axes(x, attrs)
        shape = list(x.shape)
        if op == "fft_r2c":
            _req(x.dtype == DType.F32, f"fft_r2c takes f32, got {x}")
            if attrs["onesided"]:
                shape[axes[-1]] = int(shape[axes[-1]]) // 2 + 1
            return [TensorType(DType.C64, tuple(shape))]
        _req(x.dtype == DType.C64, f"{op} takes c64, got {x}")
        if op == "fft_c2r":
            _req(attrs["last_size"] >= 1, "last_size must be positive")
            shape[axes[-1]] = attrs["last_size"]
            return [TensorType(DType.F32, tuple(shape))]
        return [x]

    return infer


def _infer_view_as_real(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    _req(x.dtype == DType.C64, f"view_as_real takes c64, got {x}")
    return [TensorType(DType.F32, (*x.shape, 2))]


def _infer_view_as_complex(ins: list[TensorType], attrs: Mapping) -> list[TensorType]:
    (x,) = ins
    _req(
        x.dtype == DType.F32 and x.rank >= 1 and x.shape[-1] == 2,
        f"view_as_complex takes f32 [*, 2], got {x}",
    )
    return [TensorType(DType.C64, tuple(x.shape[:-1]))]


def _cost_fft(ins, outs, attrs) -> Cost:
    import math

    n = max(numel(ins[0][1]), numel(outs[0][1]))
    return Cost(5.0 * n * math.log2(max(n, 2)), _io_bytes(ins, outs))


def _ints(default: tuple[int, ...] = ()) -> AttrSpec:
    return AttrSpec("ints", default=default)


_REDUCE_ATTRS = {"axes": _ints(), "keepdims": AttrSpec("bool", default=False)}
_AXIS = {"axis": AttrSpec("int", required=True)}
_WINDOW = {"kernel": AttrSpec("ints", required=True), "stride": AttrSpec("ints", required=True),
           "padding": AttrSpec("ints", required=True), "ceil_mode": AttrSpec("bool", default=False)}  # fmt: skip
_SLICE = {"axis": AttrSpec("int", required=True), "start": AttrSpec("int", required=True),
          "end": AttrSpec("int", required=True), "step": AttrSpec("int", default=1)}  # fmt: skip
_NORM = AttrSpec("str", default="none", choices=("none", "sqrt", "n"))
_FLOPS_UNARY = {"exp": 4.0, "log": 4.0, "sin": 4.0, "cos": 4.0, "tan": 8.0, "tanh": 6.0, "sigmoid": 5.0,
                "erf": 8.0, "sqrt": 2.0, "rsqrt": 2.0, "log1p": 4.0, "expm1": 4.0}  # fmt: skip


def _general_ops() -> list[OpDef]:
    ops: list[OpDef] = []
    for name in UNARY_FLOAT:
        ops.append(
            OpDef(
                name,
                "elementwise",
                (1, 1),
                _infer_unary(name),
                _cost_elementwise(_FLOPS_UNARY.get(name, 1.0)),
            )
        )
    ops.append(OpDef("logical_not", "elementwise", (1, 1), _infer_logical_not, _cost_elementwise(1.0)))
    for name in BINARY_ARITH:
        ops.append(
            OpDef(name, "elementwise", (2, 2), _infer_arith, _cost_elementwise(4.0 if name == "pow" else 1.0))
        )
    for name in BINARY_LOGICAL:
        ops.append(OpDef(name, "elementwise", (2, 2), _infer_logical, _cost_elementwise(1.0)))
    for name in COMPARE:
        ops.append(OpDef(name, "comparison", (2, 2), _infer_compare, _cost_elementwise(1.0)))
    ops.append(
        OpDef(
            "where",
            "elementwise",
            (3, 3),
            _infer_where,
            _cost_elementwise(1.0),
            doc="cond[*] bool, a, b -> cond ? a : b (broadcast)",
        )
    )
    for name in REDUCE:
        ops.append(OpDef(name, "reduction", (1, 1), _infer_reduce(name), _cost_reduce, dict(_REDUCE_ATTRS)))
    ops.append(
        OpDef(
            "reduce_var",
            "reduction",
            (1, 1),
            _infer_reduce("reduce_var"),
            _cost_reduce,
            {**_REDUCE_ATTRS, "correction": AttrSpec("float", default=1.0)},
        )
    )
    ops.append(OpDef("cumsum", "reduction", (1, 1), _infer_same, _cost_reduce, dict(_AXIS)))
    ops.append(
        OpDef(
            "log_softmax",
            "reduction",
            (1, 1),
            _infer_log_softmax,
            _cost_elementwise(5.0),
            {"axis": AttrSpec("int", default=-1)},
        )
    )
    ops.append(
        OpDef(
            "cmatmul",
            "projection",
            (2, 2),
            _infer_cmatmul,
            _cost_cmatmul,
            doc="a[*, M, K], b[*, K, N] c64 -> [*, M, N] c64",
        )
    )
    ops.append(
        OpDef(
            "conv",
            "convolution",
            (2, 3),
            _infer_conv,
            _cost_conv,
            {
                "stride": AttrSpec("ints", required=True),
                "padding": AttrSpec("ints", required=True),
                "dilation": AttrSpec("ints", required=True),
                "groups": AttrSpec("int", default=1),
            },
            doc="x[N, C, *S], w[O, C/groups, *K] (, b[O]) -> [N, O, *S'] (cross-correlation)",
        )
    )
    ops.append(
        OpDef(
            "max_pool",
            "pooling",
            (1, 1),
            _infer_pool("max_pool"),
            _cost_pool,
            {**_WINDOW, "dilation": AttrSpec("ints", required=True)},
            doc="max over windows of the trailing len(kernel) dims; padding is -inf",
        )
    )
    ops.append(
        OpDef(
            "avg_pool",
            "pooling",
            (1, 1),
            _infer_pool("avg_pool"),
            _cost_pool,
            {
                **_WINDOW,
                "count_include_pad": AttrSpec("bool", default=True),
                "divisor": AttrSpec("int", default=0),
            },
            doc="mean over windows of the trailing len(kernel) dims (divisor 0: the window's count)",
        )
    )
    ops.append(
        OpDef(
            "resize",
            "resize",
            (1, 1),
            _infer_resize,
            _cost_resize,
            {
                "size": AttrSpec("ints", required=True),
                "mode": AttrSpec("str", default="nearest", choices=("nearest", "linear")),
                "align_corners": AttrSpec("bool", default=False),
            },
            doc="trailing len(size) dims resampled to size; source scale in/out (torch's)",
        )
    )
    ops.append(
        OpDef(
            "layer_norm",
            "norm",
            (1, 3),
            _infer_layer_norm,
            _cost_norm,
            {"dims": AttrSpec("int", default=1), "eps": AttrSpec("float", default=1e-5)},
            doc="x, (w, (b)) over the last `dims` dims",
        )
    )
    ops.append(
        OpDef(
            "group_norm",
            "norm",
            (1, 3),
            _infer_group_norm,
            _cost_norm,
            {"groups": AttrSpec("int", required=True), "eps": AttrSpec("float", default=1e-5)},
            doc="x[N, C, *], (w[C], (b[C])): statistics over each group of C/groups channels",
        )
    )
    ops.append(
        OpDef(
            "batch_norm",
            "norm",
            (5, 5),
            _infer_batch_norm,
            _cost_norm,
            {"eps": AttrSpec("float", default=1e-5)},
            doc="x[N, C, *], w[C], b[C], running_mean[C], running_var[C] (inference)",
        )
    )
    ops.append(OpDef("index_select", "indexing", (2, 2), _infer_index_select, _cost_gather, dict(_AXIS)))
    ops.append(OpDef("gather", "indexing", (2, 2), _infer_gather, _cost_gather, dict(_AXIS)))
    for name, fn in (("scatter_max", "amax"), ("scatter_min", "amin")):
        ops.append(
            OpDef(
                name,
                "indexing",
                (3, 3),
                _infer_scatter_add,
                _cost_scatter,
                dict(_AXIS),
                doc=f"x, index, src -> x with src[i] reduced into index[i] along axis by {fn[1:]} "
                f"(torch.scatter_reduce, '{fn}', include_self)",
            )
        )
    ops.append(
        OpDef(
            "scatter_add",
            "indexing",
            (3, 3),
            _infer_scatter_add,
            _cost_scatter,
            dict(_AXIS),
            doc="x, index, src -> x with src[i] added at index[i] along axis (torch.scatter_add)",
        )
    )
    ops.append(
        OpDef(
            "index_add",
            "indexing",
            (3, 3),
            _infer_index_add,
            _cost_scatter,
            dict(_AXIS),
            doc="x, index[n], src -> x with src's n slices added at index along axis",
        )
    )
    ops.append(
        OpDef(
            "expand", "layout", (1, 1), _infer_expand, _cost_move, {"shape": AttrSpec("ints", required=True)}
        )
    )
    ops.append(OpDef("strided_slice", "layout", (1, 1), _infer_strided_slice, _cost_move, dict(_SLICE)))
    ops.append(
        OpDef(
            "slice_scatter",
            "layout",
            (2, 2),
            _infer_slice_scatter,
            _cost_move,
            dict(_SLICE),
            doc="x, src -> x with x[start:end:step] along axis replaced by src",
        )
    )
    ops.append(
        OpDef(
            "fft_r2c",
            "spectral",
            (1, 1),
            _infer_fft("fft_r2c"),
            _cost_fft,
            {
                "axes": AttrSpec("ints", required=True),
                "norm": _NORM,
                "onesided": AttrSpec("bool", default=True),
            },
        )
    )
    ops.append(
        OpDef(
            "fft_c2r",
            "spectral",
            (1, 1),
            _infer_fft("fft_c2r"),
            _cost_fft,
            {
                "axes": AttrSpec("ints", required=True),
                "norm": _NORM,
                "last_size": AttrSpec("int", required=True),
            },
            doc="inverse of a onesided r2c; the last axis gets last_size points",
        )
    )
    ops.append(
        OpDef(
            "fft_c2c",
            "spectral",
            (1, 1),
            _infer_fft("fft_c2c"),
            _cost_fft,
            {
                "axes": AttrSpec("ints", required=True),
                "norm": _NORM,
                "forward": AttrSpec("bool", default=True),
            },
        )
    )
    ops.append(
        OpDef(
            "view_as_real",
            "spectral",
            (1, 1),
            _infer_view_as_real,
            _cost_move,
            doc="c64 [*] -> f32 [*, 2]: each value's real and imaginary parts",
        )
    )
    ops.append(
        OpDef(
            "view_as_complex",
            "spectral",
            (1, 1),
            _infer_view_as_complex,
            _cost_move,
            doc="f32 [*, 2] -> c64 [*]: the last dim's (real, imaginary) pairs as complex values",
        )
    )
    return ops  # fmt: skip


GENERAL_OPS: dict[str, OpDef] = {op.name: op for op in _general_ops()}
