"""numpy <-> torch tensors for the backends that run on torch (cpu today; cuda and rocm share it).

bf16 and fp8 arrays (ml_dtypes) cross by reinterpreting their bits, never through float32, so a
weight arrives bit-exact.
"""

from __future__ import annotations

import numpy as np
import torch

from polymorph.ir.dtypes import DType

TORCH_DTYPE = {
    DType.F32: torch.float32,
    DType.BF16: torch.bfloat16,
    DType.F16: torch.float16,
    DType.F8E4M3: torch.float8_e4m3fn,
    DType.F8E5M2: torch.float8_e5m2,
    DType.I32: torch.int32,
    DType.I64: torch.int64,
    DType.BOOL: torch.bool,
    DType.C64: torch.complex64,
}
IR_DTYPE = {t: d for d, t in TORCH_DTYPE.items()}
_BITS = {1: (np.uint8, torch.uint8), 2: (np.uint16, torch.int16)}


def to_torch(arr: np.ndarray, device: str | torch.device = "cpu") -> torch.Tensor:
    dtype = DType.of(arr)
    arr = np.ascontiguousarray(arr).reshape(arr.shape)  # ascontiguousarray makes a 0-d array 1-d
    if dtype in (DType.BF16, DType.F8E4M3, DType.F8E5M2):
        np_bits, torch_bits = _BITS[dtype.itemsize]
        bits = torch.from_numpy(arr.view(np_bits).astype(np_bits, copy=True))
        if torch_bits is torch.int16:
            bits = bits.view(torch.int16)
        tensor = bits.view(TORCH_DTYPE[dtype])
    else:
        tensor = torch.from_numpy(arr.copy())
    return tensor.to(device)


def share_torch(arr: np.ndarray) -> torch.Tensor:
    """A host tensor on `arr`'s own memory, no copy (an arena array: shared memory the controller made).
    A read-only array gives a tensor whose writes fault: torch cannot mark a tensor read-only, the
    pages are."""
    import warnings

    dtype = DType.of(arr)
    if not arr.flags.c_contiguous:
        raise ValueError("share_torch needs a C-contiguous array")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        if dtype in (DType.BF16, DType.F8E4M3, DType.F8E5M2):
            np_bits, torch_bits = _BITS[dtype.itemsize]
            bits = torch.from_numpy(arr.view(np_bits))
            if torch_bits is torch.int16:
                bits = bits.view(torch.int16)
            return bits.view(TORCH_DTYPE[dtype])
        return torch.from_numpy(arr)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    t = tensor.detach().to("cpu").contiguous()
    for dtype, torch_dtype in TORCH_DTYPE.items():
        if t.dtype == torch_dtype:
            break
    else:
        raise TypeError(f"torch dtype {t.dtype} has no IR dtype")
    if dtype in (DType.BF16, DType.F8E4M3, DType.F8E5M2):
        bits = t.view(torch.int16 if dtype.itemsize == 2 else torch.uint8).numpy()
        return bits.view(dtype.numpy).copy()
    return t.numpy().copy()
