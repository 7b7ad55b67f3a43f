"""Random-graph steps for the general ops (polymorph/ir/general_ops.py), one per op, merged into
test_ir_hypothesis.py's STEPS. Each takes that file's Recipe. Ops whose value can leave the finite
range (exp, log, div, ...) get positive or bounded operands and keep their results out of the pool,
so no NaN reaches a graph output from finite inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from polymorph.ir.dtypes import DType
from polymorph.ir.general_ops import BINARY_LOGICAL, COMPARE, REDUCE, UNARY_FLOAT

BOUNDED = (
    "neg",
    "abs",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "erf",
    "floor",
    "ceil",
    "round",
    "trunc",
    "sign",
)
POSITIVE_ARG = ("log", "sqrt", "rsqrt", "log1p")  # computed on sigmoid(x) > 0


def _positive(r: Any, x: str) -> str:
    return r.op("sigmoid", x, reusable=False)


def _unary(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        x, _ = r.any_float(min_rank=0)
        if op in POSITIVE_ARG:
            x = _positive(r, x)
        r.op(op, x, reusable=op in BOUNDED)

    return step


def _partner(r: Any, at: Any) -> str:
    """A value that broadcasts with `at`: a suffix of its shape with some dims set to 1."""
    shape = at.shape[r.draw(st.integers(0, at.rank)) :]
    shape = tuple(1 if r.draw(st.booleans()) else d for d in shape)
    return r.input(at.dtype, shape)


def _binary(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        a, at = r.any_float(min_rank=0)
        b = a if r.draw(st.booleans()) else _partner(r, at)
        if op in ("div", "remainder"):
            b = _positive(r, b)
        if op == "pow":
            a = _positive(r, a)
        r.op(op, *((a, b) if r.draw(st.booleans()) or op in ("div", "remainder", "pow") else (b, a)),
             reusable=op in ("sub", "maximum", "minimum"))  # fmt: skip

    return step


def _bools(r: Any, min_rank: int = 0) -> tuple[str, Any]:
    a, at = r.any_float(min_rank=min_rank)
    b = a if r.draw(st.booleans()) else _partner(r, at)
    return r.op("lt", a, b, reusable=False), at


def _compare(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        a, at = r.any_float(min_rank=0)
        b = a if r.draw(st.booleans()) else _partner(r, at)
        r.op(op, a, b)

    return step


def _logical(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        x, at = r.any_float(min_rank=0)
        a = r.op("lt", x, _partner(r, at), reusable=False)  # both of x's shape
        b = r.op("gt", x, _partner(r, at), reusable=False) if r.draw(st.booleans()) else a
        r.op(op, a, b)

    return step


def step_logical_not(r: Any) -> None:
    r.op("logical_not", _bools(r)[0])


def step_where(r: Any) -> None:
    a, at = r.any_float(min_rank=0)
    cond = r.op("lt", a, _partner(r, at), reusable=False)  # of a's shape
    r.op("where", cond, a, r.input(at.dtype, ()))


def _axes(r: Any, rank: int) -> tuple[int, ...]:
    return tuple(sorted(r.draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))))


def _reduce(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        if op in ("reduce_any", "reduce_all"):
            x, at = _bools(r, min_rank=1)
        else:
            x, at = r.any_float(min_rank=1)
        attrs = {"axes": _axes(r, at.rank), "keepdims": r.draw(st.booleans())}
        if op == "reduce_var":
            attrs["correction"] = 0.0  # a single-element reduction with correction 1 divides by zero
        r.op(op, x, reusable=op in ("reduce_max", "reduce_min", "reduce_mean"), **attrs)

    return step


def step_cumsum(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    r.op("cumsum", x, axis=r.draw(st.integers(-xt.rank, xt.rank - 1)))


def step_log_softmax(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    r.op("log_softmax", x, axis=r.draw(st.integers(-xt.rank, xt.rank - 1)), reusable=False)


def step_cmatmul(r: Any) -> None:
    m, k, n = (r.draw(st.integers(1, 3)) for _ in range(3))
    r.op("cmatmul", r.input(DType.C64, (m, k)), r.input(DType.C64, (2, k, n)))


def _ints(r: Any, lo: int, hi: int) -> int:
    return r.draw(st.integers(lo, hi))


def step_conv(r: Any) -> None:
    n = _ints(r, 1, 3)
    g = _ints(r, 1, 2)
    c, o = g * _ints(r, 1, 2), g * _ints(r, 1, 2)
    k = tuple(_ints(r, 1, 2) for _ in range(n))
    dil = tuple(_ints(r, 1, 2) for _ in range(n))
    pad = tuple(_ints(r, 0, 1) for _ in range(n))
    spatial = tuple(d * (kk - 1) + 1 + _ints(r, 0, 2) for d, kk in zip(dil, k, strict=True))
    dtype = r.fdtype()
    x = r.input(dtype, (_ints(r, 1, 2), c, *spatial))
    w = r.param(dtype, (o, c // g, *k))
    inputs = [x, w] + ([r.param(dtype, (o,))] if r.draw(st.booleans()) else [])
    r.op("conv", *inputs, stride=tuple(_ints(r, 1, 2) for _ in range(n)), padding=pad, dilation=dil, groups=g)


def _pool(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        n = _ints(r, 1, 3)
        k = tuple(_ints(r, 1, 3) for _ in range(n))
        pad = tuple(_ints(r, 0, kk // 2) for kk in k)
        x = r.input(r.fdtype(), (_ints(r, 1, 2), *(kk + _ints(r, 0, 3) for kk in k)))
        attrs: dict[str, Any] = {"kernel": k, "stride": tuple(_ints(r, 1, 2) for _ in range(n)), "padding": pad,
                                 "ceil_mode": r.draw(st.booleans())}  # fmt: skip
        if op == "max_pool":
            attrs["dilation"] = (1,) * n
        else:
            attrs["count_include_pad"] = r.draw(st.booleans())
        r.op(op, x, **attrs)

    return step


def step_resize(r: Any) -> None:
    n = _ints(r, 1, 3)
    x = r.input(r.fdtype(), (_ints(r, 1, 2), *(_ints(r, 1, 3) for _ in range(n))))
    r.op("resize", x, size=tuple(_ints(r, 1, 5) for _ in range(n)), mode=r.draw(st.sampled_from(["nearest", "linear"])),
         align_corners=r.draw(st.booleans()))  # fmt: skip


def step_layer_norm(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    dims = _ints(r, 1, xt.rank)
    params = [r.param(xt.dtype, xt.shape[xt.rank - dims :]) for _ in range(_ints(r, 0, 2))]
    r.op("layer_norm", x, *params, dims=dims)


def step_group_norm(r: Any) -> None:
    g = _ints(r, 1, 2)
    c = g * _ints(r, 1, 2)
    dtype = r.fdtype()
    x = r.input(dtype, (r.dim(), c, r.dim()))
    params = [r.param(dtype, (c,)) for _ in range(_ints(r, 0, 2))]
    r.op("group_norm", x, *params, groups=g)


def step_batch_norm(r: Any) -> None:
    dtype = r.fdtype()
    c = _ints(r, 1, 3)
    x = r.input(dtype, (r.dim(), c, r.dim()))
    w, b, mean = (r.param(dtype, (c,)) for _ in range(3))
    var = r.op("abs", r.param(dtype, (c,)), reusable=False)  # a variance is not negative
    r.op("batch_norm", x, w, b, mean, var)


def _index(r: Any, size: Any, shape: tuple) -> str:
    return r.input(DType.I64, shape, lo=0, hi=r.size(size))


def step_index_select(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    axis = _ints(r, 0, xt.rank - 1)
    r.op("index_select", x, _index(r, xt.shape[axis], (r.dim(),)), axis=axis)


def step_gather(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    axis = _ints(r, 0, xt.rank - 1)
    r.op("gather", x, _index(r, xt.shape[axis], xt.shape), axis=axis)


def step_scatter_add(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    axis = _ints(r, 0, xt.rank - 1)
    r.op("scatter_add", x, _index(r, xt.shape[axis], xt.shape), r.input(xt.dtype, xt.shape), axis=axis)


def _scatter(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        x, xt = r.any_float(min_rank=1)
        axis = _ints(r, 0, xt.rank - 1)
        r.op(op, x, _index(r, xt.shape[axis], xt.shape), r.input(xt.dtype, xt.shape), axis=axis)

    return step


def step_index_add(r: Any) -> None:
    x, xt = r.any_float(min_rank=1)
    axis = _ints(r, 0, xt.rank - 1)
    n = r.dim()
    src = r.input(xt.dtype, (*xt.shape[:axis], n, *xt.shape[axis + 1 :]))
    r.op("index_add", x, _index(r, xt.shape[axis], (n,)), src, axis=axis)


def step_expand(r: Any) -> None:
    dtype = r.fdtype()
    shape = tuple(_ints(r, 1, 3) for _ in range(_ints(r, 1, 3)))
    small = tuple(1 if r.draw(st.booleans()) else d for d in shape)
    r.op("expand", r.input(dtype, small), shape=(_ints(r, 1, 2), *shape))


def _sliced(r: Any) -> tuple[str, Any, dict[str, int]]:
    dtype = r.fdtype()
    shape = (_ints(r, 1, 3), _ints(r, 2, 6))
    x = r.input(dtype, shape)
    start = _ints(r, 0, shape[1] - 1)
    return x, shape, {"axis": 1, "start": start, "end": _ints(r, start + 1, shape[1]), "step": _ints(r, 1, 3)}


def step_strided_slice(r: Any) -> None:
    x, _, attrs = _sliced(r)
    r.op("strided_slice", x, **attrs)


def step_slice_scatter(r: Any) -> None:
    x, shape, attrs = _sliced(r)
    n = len(range(attrs["start"], attrs["end"], attrs["step"]))
    r.op("slice_scatter", x, r.input(r.builder.graph.inputs[x].dtype, (shape[0], n)), **attrs)


def _fft(op: str) -> Callable[[Any], None]:
    def step(r: Any) -> None:
        shape = tuple(_ints(r, 1, 4) for _ in range(_ints(r, 1, 3)))
        axes = _axes(r, len(shape))
        norm = r.draw(st.sampled_from(["none", "sqrt", "n"]))
        if op == "fft_r2c":
            r.op(op, r.input(DType.F32, shape), axes=axes, norm=norm, onesided=r.draw(st.booleans()))
        elif op == "fft_c2r":
            r.op(
                op, r.input(DType.C64, shape), axes=axes, norm=norm, last_size=_ints(r, 1, 6), reusable=False
            )
        else:
            r.op(op, r.input(DType.C64, shape), axes=axes, norm=norm, forward=r.draw(st.booleans()))

    return step


def step_view_as_real(r: Any) -> None:
    shape = tuple(_ints(r, 1, 4) for _ in range(_ints(r, 0, 2)))
    r.op("view_as_real", r.input(DType.C64, shape), reusable=False)


def step_view_as_complex(r: Any) -> None:
    shape = tuple(_ints(r, 1, 4) for _ in range(_ints(r, 0, 2)))
    r.op("view_as_complex", r.input(DType.F32, (*shape, 2)), reusable=False)


GENERAL_STEPS: dict[str, Callable[[Any], None]] = {
    **{op: _unary(op) for op in UNARY_FLOAT},
    **{op: _binary(op) for op in ("sub", "div", "pow", "maximum", "minimum", "remainder")},
    **{op: _compare(op) for op in COMPARE},
    **{op: _logical(op) for op in BINARY_LOGICAL},
    **{op: _reduce(op) for op in (*REDUCE, "reduce_var")},
    "logical_not": step_logical_not, "where": step_where, "cumsum": step_cumsum,
    "log_softmax": step_log_softmax, "cmatmul": step_cmatmul, "conv": step_conv,
    "max_pool": _pool("max_pool"), "avg_pool": _pool("avg_pool"), "resize": step_resize,
    "layer_norm": step_layer_norm, "group_norm": step_group_norm, "batch_norm": step_batch_norm,
    "index_select": step_index_select, "gather": step_gather, "scatter_add": step_scatter_add,
    "scatter_max": _scatter("scatter_max"), "scatter_min": _scatter("scatter_min"),
    "index_add": step_index_add, "expand": step_expand, "strided_slice": step_strided_slice,
    "slice_scatter": step_slice_scatter, **{op: _fft(op) for op in ("fft_r2c", "fft_c2r", "fft_c2c")},
    "view_as_real": step_view_as_real, "view_as_complex": step_view_as_complex,
}  # fmt: skip
