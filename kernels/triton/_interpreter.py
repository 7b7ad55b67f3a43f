"""Where Triton's interpreter (TRITON_INTERPRET=1, 3.6-3.9) computes differently from compiled code, and
the kernels' corrections, so that CPU runs of the kernels check the numerics the GPU runs. Not a kernel
file: kernel files take it with `depend("triton/_interpreter.py", <sha256>)`.

- It truncates fp32 -> bf16 where compiled code rounds to nearest even: `round_to` rounds on the bits
  first there.
- It multiplies bf16 tl.dot operands as their raw 16-bit patterns (triton-lang/triton#11584): kernels
  upcast their dot operands to fp32 where INTERPRETED is set (exact: bf16 products fit fp32).

INTERPRETED is read when the module loads, as Triton reads the variable when kernels are decorated.
Compiled code, and AOT compilation (never interpreted), is unaffected.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """x.to(dtype), rounded to nearest even as compiled code does."""
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True).to(tl.int64)  # 64-bit: no overflow checks
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = bits.to(tl.uint32).to(tl.float32, bitcast=True)
    return x.to(dtype)
