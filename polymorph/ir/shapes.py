"""Shapes whose dimensions are ints or named symbols (`batch`, `seq`, `ctx_blocks`, ...).

Symbolic arithmetic is kept to what the op table needs: equality, and products compared as
monomials (an int coefficient times a sorted tuple of symbols), so that a reshape of
`[batch, seq, 2048]` into `[batch, seq, 32, 64]` can be checked before specialization.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Dim = int | str
Shape = tuple[Dim, ...]


def is_symbol(dim: Dim) -> bool:
    return isinstance(dim, str)


def monomial(shape: Sequence[Dim]) -> tuple[int, tuple[str, ...]]:
    """The product of `shape` as (int coefficient, sorted symbols)."""
    coeff = math.prod(d for d in shape if isinstance(d, int))
    return coeff, tuple(sorted(d for d in shape if isinstance(d, str)))


def same_numel(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return monomial(a) == monomial(b)


def bind(shape: Sequence[Dim], bindings: Mapping[str, int]) -> Shape:
    """Replace the symbols that `bindings` names; others stay symbolic."""
    return tuple(bindings.get(d, d) if isinstance(d, str) else d for d in shape)


def concrete(shape: Sequence[Dim], bindings: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """The shape with every symbol bound; KeyError names a symbol without a binding."""
    out = bind(shape, bindings or {})
    for d in out:
        if isinstance(d, str):
            raise KeyError(f"symbol `{d}` has no value")
    return tuple(int(d) for d in out)


def numel(shape: Sequence[Dim], bindings: Mapping[str, int] | None = None) -> int:
    return math.prod(concrete(shape, bindings))


def format_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def broadcast(a: Sequence[Dim], b: Sequence[Dim]) -> Shape:
    """numpy's right-aligned broadcast, for int and symbolic dims; ValueError when incompatible."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"shapes {format_shape(a)} and {format_shape(b)} do not broadcast")
    return tuple(reversed(out))
