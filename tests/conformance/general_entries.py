"""Conformance entries for the general ops (polymorph/ir/general_ops.py): conftest.py's `_entries()`
adds them, passing its own helpers (OpInfo, one_node, inp, par, leaf_samples), as this file cannot
import conftest under --import-mode=importlib."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from polymorph.ir.dtypes import DType
from polymorph.ir.general_ops import BINARY_LOGICAL, COMPARE, UNARY_FLOAT

F32, BF16, I32, I64, C64, BOOL = DType.F32, DType.BF16, DType.I32, DType.I64, DType.C64, DType.BOOL
POSITIVE = ("log", "sqrt", "rsqrt", "log1p", "reciprocal")


def _positive(*names: str):
    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        for n in names:
            x = arrays[n]
            arrays[n] = (np.abs(x.astype(np.float32)) + np.float32(0.5)).astype(x.dtype)

    return fix


def _ties(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """b equals a at about half the elements, so eq/ne/le/ge see both outcomes."""
    a, b = arrays["a"], arrays["b"]
    same = rng.random(b.shape) < 0.5
    arrays["b"] = np.where(same, np.broadcast_to(a, b.shape), b).astype(b.dtype)


def _complex(*names: str):
    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        for n in names:
            shape = arrays[n].shape
            arrays[n] = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)

    return fix


def _bools(*names: str):
    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        for n in names:
            arrays[n] = rng.random(arrays[n].shape) < 0.5

    return fix


def _index(lo: int, hi: int):
    return lambda rng, shape, sizes: rng.integers(lo, hi, shape)


def entries(ns: Mapping[str, Any]) -> list[Any]:
    OpInfo, one_node, inp, par, leaf_samples = (
        ns[k] for k in ("OpInfo", "one_node", "inp", "par", "leaf_samples")
    )
    rows = [{"batch": 1}, {"batch": 3}]
    e: list[Any] = []

    def add(
        name: str,
        op: str,
        leaves: dict,
        *,
        dtypes=(F32, BF16),
        ints=None,
        fix=None,
        sizes=rows,
        large: float = 100.0,
        **attrs: Any,
    ) -> None:
        def build(d: DType) -> Any:
            made = {k: (kind, d if dt is None else dt, shape) for k, (kind, dt, shape) in leaves.items()}
            return one_node(op, made, **attrs)

        e.append(
            OpInfo(name, op, build, leaf_samples(sizes, ints=ints or {}, fix=fix, large=large), dtypes=dtypes)
        )

    def x(*shape: Any, dtype: DType | None = None) -> tuple:
        return ("input", dtype, shape)

    def w(*shape: Any, dtype: DType | None = None) -> tuple:
        return ("param", dtype, shape)

    for op in UNARY_FLOAT:
        add(op, op, {"x": x("batch", 7)}, fix=_positive("x") if op in POSITIVE else None)
    add("neg.i32", "neg", {"x": x("batch", 7)}, dtypes=(I32,), ints={"x": _index(-100, 100)})
    add("logical_not", "logical_not", {"x": x("batch", 7)}, dtypes=(BOOL,), fix=_bools("x"))
    for op in ("sub", "maximum", "minimum"):
        add(op, op, {"a": x("batch", 7), "b": x(1, 7)})
    add("div", "div", {"a": x("batch", 7), "b": x("batch", 7)}, fix=_positive("b"))
    add("div.i64", "div", {"a": x("batch", 7), "b": x("batch", 7)}, dtypes=(I64,),
        ints={"a": _index(-50, 50), "b": _index(1, 9)})  # fmt: skip
    add("pow", "pow", {"a": x("batch", 7), "b": x("batch", 7)}, fix=_positive("a"))
    add("remainder", "remainder", {"a": x("batch", 7), "b": x("batch", 7)}, dtypes=(I32,),
        ints={"a": _index(-50, 50), "b": _index(1, 9)})  # fmt: skip
    for op in BINARY_LOGICAL:
        add(op, op, {"a": x("batch", 7), "b": x(1, 7)}, dtypes=(BOOL,), fix=_bools("a", "b"))
    for op in COMPARE:
        add(op, op, {"a": x("batch", 7), "b": x("batch", 7)}, fix=_ties)
    add("where", "where", {"c": x("batch", 7, dtype=BOOL), "a": x("batch", 7), "b": x(1, 7)}, fix=_bools("c"))
    for op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"):
        add(op, op, {"x": x("batch", 3, 4)}, axes=(1, 2))
        add(f"{op}.keepdims", op, {"x": x("batch", 3, 4)}, axes=(0,), keepdims=True)
    for op in ("reduce_any", "reduce_all"):
        add(op, op, {"x": x("batch", 3, 4)}, dtypes=(BOOL,), fix=_bools("x"), axes=(2,))
    add("reduce_var", "reduce_var", {"x": x("batch", 3, 8)}, axes=(2,), correction=1.0)
    add("cumsum", "cumsum", {"x": x("batch", 9)}, axis=1)
    add("cumsum.i64", "cumsum", {"x": x("batch", 9)}, dtypes=(I64,), ints={"x": _index(-5, 5)}, axis=1)
    add("log_softmax", "log_softmax", {"x": x("batch", 9)}, axis=-1)
    add("cmatmul", "cmatmul", {"a": x(2, 3, 5), "b": w(2, 5, 4)}, dtypes=(C64,), fix=_complex("a", "b"))
    # Convolutions sum many products: with inputs up to +-100 an output near zero is the difference of
    # terms of hundreds, and f32 summation order alone (XLA's against numpy's) can move it by 1e-4, past
    # an elementwise tolerance. Inputs up to +-4 keep that under the f32 atol.
    add("conv1d", "conv", {"x": x(2, 4, 11), "w": w(6, 2, 3), "b": w(6)}, dtypes=(F32,),
        stride=(2,), padding=(1,), dilation=(2,), groups=2, large=4.0)  # fmt: skip
    add("conv2d", "conv", {"x": x(2, 3, 9, 8), "w": w(5, 3, 3, 2)}, stride=(1, 2), padding=(1, 0),
        dilation=(1, 1), groups=1, large=4.0)  # fmt: skip
    add("conv3d", "conv", {"x": x(1, 2, 5, 6, 4), "w": w(2, 1, 2, 3, 2), "b": w(2)}, dtypes=(F32,),
        stride=(1, 1, 2), padding=(0, 1, 1), dilation=(2, 1, 1), groups=2, large=4.0)  # fmt: skip
    add("max_pool", "max_pool", {"x": x(2, 3, 9, 8)}, kernel=(3, 2), stride=(2, 2), padding=(1, 0),
        dilation=(1, 1), ceil_mode=True)  # fmt: skip
    add("avg_pool", "avg_pool", {"x": x(2, 3, 9, 8)}, kernel=(3, 3), stride=(2, 2), padding=(1, 1),
        ceil_mode=True, count_include_pad=True)  # fmt: skip
    add("avg_pool.exclude_pad", "avg_pool", {"x": x(2, 3, 7)}, kernel=(3,), stride=(2,), padding=(1,),
        count_include_pad=False)  # fmt: skip
    add("resize.nearest", "resize", {"x": x(2, 3, 5, 4)}, size=(10, 7), mode="nearest")
    # Linear resizing weighs two neighbours by the fraction of a source coordinate that torch computes in
    # f32 (the reference in f64): one f32 step of a coordinate near 5 moves a weight by ~5e-7, and with
    # neighbours +-100 apart the output by ~1e-4, past the f32 atol where the output is near zero (seen
    # once in CI). Inputs up to +-4 keep that under it, as for the convolutions.
    add("resize.bilinear", "resize", {"x": x(2, 3, 5, 4)}, size=(9, 8), mode="linear", large=4.0)
    add("resize.align_corners", "resize", {"x": x(2, 3, 5)}, size=(9,), mode="linear", align_corners=True,
        large=4.0)  # fmt: skip
    add("layer_norm", "layer_norm", {"x": x("batch", 3, 8), "w": w(3, 8), "b": w(3, 8)}, dims=2)
    add("layer_norm.plain", "layer_norm", {"x": x("batch", 8)}, dims=1)
    add("group_norm", "group_norm", {"x": x(2, 6, 5), "w": w(6), "b": w(6)}, groups=3)
    add("batch_norm", "batch_norm", {"x": x(2, 4, 5), "w": w(4), "b": w(4), "m": w(4), "v": x(4)},
        fix=_positive("v"))  # fmt: skip
    add("index_select", "index_select", {"x": x(7, 5), "i": x("batch", dtype=I64)}, ints={"i": _index(-7, 7)},
        axis=0)  # fmt: skip
    add("gather", "gather", {"x": x(4, 6), "i": x(4, 3, dtype=I64)}, ints={"i": _index(0, 6)}, axis=1)
    add("scatter_add", "scatter_add", {"x": x(5, 3), "i": x(8, 3, dtype=I64), "s": x(8, 3)},
        ints={"i": _index(0, 5)}, axis=0)  # fmt: skip
    for op in ("scatter_max", "scatter_min"):
        add(op, op, {"x": x(5, 3), "i": x(8, 3, dtype=I64), "s": x(8, 3)}, ints={"i": _index(0, 5)}, axis=0)
    add("index_add", "index_add", {"x": x(5, 3), "i": x(8, dtype=I64), "s": x(8, 3)}, ints={"i": _index(0, 5)},
        axis=0)  # fmt: skip
    add("expand", "expand", {"x": x(3, 1)}, shape=(2, 3, 4))
    add("strided_slice", "strided_slice", {"x": x("batch", 11)}, axis=1, start=1, end=10, step=3)
    add("slice_scatter", "slice_scatter", {"x": x("batch", 11), "s": x("batch", 3)}, axis=1, start=1, end=10,
        step=3)  # fmt: skip
    add(
        "fft_r2c",
        "fft_r2c",
        {"x": x(2, 6, 8)},
        dtypes=(F32,),
        large=4.0,
        axes=(1, 2),
        norm="none",
        onesided=True,
    )
    add(
        "fft_r2c.ortho",
        "fft_r2c",
        {"x": x(2, 5)},
        dtypes=(F32,),
        large=4.0,
        axes=(1,),
        norm="sqrt",
        onesided=False,
    )
    add("fft_c2r", "fft_c2r", {"x": x(2, 6, 5)}, dtypes=(C64,), fix=_complex("x"), axes=(1, 2), norm="n",
        last_size=8)  # fmt: skip
    add("fft_c2c", "fft_c2c", {"x": x(2, 6, 5)}, dtypes=(C64,), fix=_complex("x"), axes=(2,), norm="none",
        forward=False)  # fmt: skip
    add("view_as_real", "view_as_real", {"x": x("batch", 6, 5)}, dtypes=(C64,), fix=_complex("x"))
    add("view_as_complex", "view_as_complex", {"x": x("batch", 5, 2)}, dtypes=(F32,))
    # the importer's composites over existing ops: flip (index_select of reversed positions), advanced
    # indexing with several tensors (a linear index: remainder, mul and add on i64)
    add("remainder.i64", "remainder", {"a": x("batch", 7), "b": x(1, 7)}, dtypes=(I64,),
        ints={"a": _index(-9, 9), "b": _index(1, 9)})  # fmt: skip
    return e
