"""Numerical tolerances per dtype, in one place, and the comparison every check uses.

An element passes when |actual - expected| <= atol + rtol * |expected|. NaN or inf where the
expected value is finite never passes. The figures follow the dtype's precision (bf16 keeps 8
significant bits, so one rounding is ~0.4%; an op chain compounds a few of those).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polymorph.ir.dtypes import DType


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


# One op against the reference.
OP_TOLERANCE: dict[DType, Tolerance] = {
    DType.F32: Tolerance(rtol=1e-4, atol=1e-5),
    DType.F16: Tolerance(rtol=2e-3, atol=1e-3),
    DType.BF16: Tolerance(rtol=1.6e-2, atol=1e-2),
    DType.F8E4M3: Tolerance(rtol=1.25e-1, atol=2e-2),
    DType.F8E5M2: Tolerance(rtol=2.5e-1, atol=4e-2),
    DType.C64: Tolerance(rtol=1e-4, atol=1e-5),  # complex64: two f32 parts
}

# A whole model's logits against the reference (or transformers), after every layer compounded.
# bf16: engines that round at different points (a fused kernel keeps its intermediates in fp32, the
# reference rounds every op's output) drift apart by a few bf16 steps per layer; on unit-scale logits
# the fused Triton plans of llama-tiny reached 0.059 over 6 seeds, so 0.06 was too tight to be stable.
MODEL_TOLERANCE: dict[DType, Tolerance] = {
    DType.F32: Tolerance(rtol=1e-3, atol=1e-4),
    DType.C64: Tolerance(rtol=1e-3, atol=1e-4),
    DType.F16: Tolerance(rtol=2e-2, atol=2e-2),
    DType.BF16: Tolerance(rtol=8e-2, atol=8e-2),
}


def op_tolerance(dtype: DType) -> Tolerance:
    return OP_TOLERANCE.get(dtype, Tolerance(0.0, 0.0))  # integers must match exactly


def model_tolerance(dtype: DType) -> Tolerance:
    return MODEL_TOLERANCE.get(dtype, OP_TOLERANCE.get(dtype, Tolerance(0.0, 0.0)))


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float
    mismatched: int
    total: int
    worst_index: tuple[int, ...]
    reason: str = ""

    def __str__(self) -> str:
        status = "ok" if self.ok else "MISMATCH"
        text = (
            f"{status}: max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}, "
            f"{self.mismatched}/{self.total} elements out of tolerance"
        )
        if not self.ok:
            text += f", worst at {list(self.worst_index)}"
        return text + (f" ({self.reason})" if self.reason else "")


def compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> Comparison:
    """Elementwise check of `actual` against `expected` (compared in float64)."""
    if actual.shape != expected.shape:
        return Comparison(
            False,
            np.inf,
            np.inf,
            expected.size,
            expected.size,
            (),
            f"shape {list(actual.shape)} != expected {list(expected.shape)}",
        )
    if np.iscomplexobj(actual) or np.iscomplexobj(expected):  # complex: its real and imaginary parts
        actual = np.stack([np.real(actual), np.imag(actual)])
        expected = np.stack([np.real(expected), np.imag(expected)])
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    finite = np.isfinite(e)
    bad_nonfinite = finite & ~np.isfinite(a)
    diff = np.where(finite, np.abs(a - e), np.where(a == e, 0.0, np.inf))
    bound = tol.atol + tol.rtol * np.abs(np.where(finite, e, 0.0))
    over = (diff > bound) | bad_nonfinite | np.isnan(a)
    rel = diff / np.maximum(np.abs(e), 1e-12)
    worst = (
        np.unravel_index(int(np.argmax(np.where(finite, diff - bound, np.inf))), e.shape) if e.size else ()
    )
    reason = "NaN in output" if np.isnan(a).any() else ""
    return Comparison(
        ok=not over.any(),
        max_abs=float(diff.max()) if diff.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        mismatched=int(over.sum()),
        total=int(e.size),
        worst_index=tuple(int(i) for i in worst),
        reason=reason,
    )


def no_worse(candidate: Comparison, stock: Comparison, slack: float) -> bool:
    """Both against the same expected values: the candidate misses by at most `slack` times what the
    stock engine misses by, in max error and in elements out of tolerance. A NaN, a raise (a
    comparison with a reason) or an infinite stock error never qualifies."""
    return (
        not candidate.reason
        and not stock.reason
        and bool(np.isfinite(stock.max_abs))
        and candidate.max_abs <= slack * stock.max_abs
        and candidate.mismatched <= slack * stock.mismatched
    )
