"""Element types of IR tensors, and their numpy (ml_dtypes) storage types."""

from __future__ import annotations

from enum import Enum

import ml_dtypes
import numpy as np


class DType(str, Enum):
    F32 = "f32"
    BF16 = "bf16"
    F16 = "f16"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"
    I32 = "i32"
    I64 = "i64"
    BOOL = "bool"
    C64 = "c64"  # complex64: FFT values (two f32)

    def __str__(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.BF16, DType.F16, DType.F8E4M3, DType.F8E5M2)

    @property
    def is_int(self) -> bool:
        return self in (DType.I32, DType.I64)

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that stores a tensor of this type (bf16 and fp8 through ml_dtypes)."""
        return _NUMPY[self]

    @classmethod
    def parse(cls, text: str) -> DType:
        try:
            return cls(_ALIASES.get(text, text))
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown dtype `{text}`; known dtypes: {known}") from None

    @classmethod
    def of(cls, array: np.ndarray) -> DType:
        for dtype, np_dtype in _NUMPY.items():
            if array.dtype == np_dtype:
                return dtype
        raise ValueError(f"numpy dtype {array.dtype} has no IR dtype")


_ITEMSIZE = {
    DType.F32: 4,
    DType.BF16: 2,
    DType.F16: 2,
    DType.F8E4M3: 1,
    DType.F8E5M2: 1,
    DType.I32: 4,
    DType.I64: 8,
    DType.BOOL: 1,
    DType.C64: 8,
}

_NUMPY = {
    DType.F32: np.dtype(np.float32),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.F16: np.dtype(np.float16),
    DType.F8E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.F8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.BOOL: np.dtype(np.bool_),
    DType.C64: np.dtype(np.complex64),
}

_ALIASES = {
    "float32": "f32",
    "bfloat16": "bf16",
    "float16": "f16",
    "fp8e4m3": "f8e4m3",
    "fp8e5m2": "f8e5m2",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "int32": "i32",
    "int64": "i64",
    "complex64": "c64",
}
