"""Judging a candidate's teacher-forced logits beside the stock plan's (polymorph/verify/numerics.py
`judge_beside`, polymorph/verify/tolerance.py `no_worse`): where the stock plan itself misses the tolerance
against the reference, a candidate as close as the stock plan passes, a worse one fails, and a NaN or
a raise never passes. Fresh random logits each run; the seed is in every message."""

from __future__ import annotations

import numpy as np
import pytest

from polymorph.ir.dtypes import DType
from polymorph.verify.numerics import STOCK_SLACK, ScenarioStep, judge_beside
from polymorph.verify.tolerance import compare, model_tolerance, no_worse

TOL = model_tolerance(DType.BF16)


@pytest.fixture
def rng() -> tuple[int, np.random.Generator]:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return seed, np.random.default_rng(seed)


def drift(rng: np.random.Generator, want: np.ndarray, count: int, size: float) -> np.ndarray:
    """`want` with `count` logits moved by `size` (past the tolerance when size is large)."""
    got = want.copy()
    at = rng.choice(want.size, count, replace=False)
    got.flat[at] += size
    return got


def scenario(rng: np.random.Generator, steps: int = 3) -> list[ScenarioStep]:
    return [
        ScenarioStep(
            f"step {i}",
            [0],
            np.zeros((1, 1), np.int32),
            rng.standard_normal((1, 1, 4096)).astype(np.float32),
            None,
        )
        for i in range(steps)
    ]


def test_a_candidate_as_close_as_the_stock_plan_passes_where_the_stock_plan_misses(rng) -> None:
    seed, r = rng
    sc = scenario(r)
    stock = [drift(r, s.want, 20, 0.5) for s in sc]
    same = [x.copy() for x in stock]  # the unchanged kernel: the stock plan's very logits
    near = [drift(r, s.want, 30, 0.6) for s in sc]  # other rounding, about as far
    for got in (same, near):
        result = judge_beside(sc, got, stock, DType.BF16, TOL)
        assert result.ok, f"seed {seed}: {result.first_failure()}"
        assert all("stock plan" in s.note for s in result.steps)


def test_a_candidate_much_further_than_the_stock_plan_fails(rng) -> None:
    seed, r = rng
    sc = scenario(r)
    stock = [drift(r, s.want, 20, 0.5) for s in sc]
    far = [drift(r, s.want, 20 * int(STOCK_SLACK) * 3, 0.5) for s in sc]  # many more logits off
    big = [drift(r, s.want, 20, 0.5 * STOCK_SLACK * 3) for s in sc]  # the same count, much further
    for got in (far, big):
        assert not judge_beside(sc, got, stock, DType.BF16, TOL).ok, f"seed {seed}"


def test_where_the_stock_plan_is_within_tolerance_the_tolerance_alone_judges(rng) -> None:
    seed, r = rng
    sc = scenario(r)
    stock = [s.want.copy() for s in sc]
    got = [drift(r, s.want, 1, 0.5) for s in sc]
    assert not judge_beside(sc, got, stock, DType.BF16, TOL).ok, f"seed {seed}"


def test_nan_and_a_raise_never_pass(rng) -> None:
    seed, r = rng
    sc = scenario(r)
    stock = [drift(r, s.want, 20, 0.5) for s in sc]
    nan = [x.copy() for x in stock]
    nan[1].flat[7] = np.nan
    assert not judge_beside(sc, nan, stock, DType.BF16, TOL).ok, f"seed {seed}"
    raised = [stock[0], "RuntimeError: boom"]
    result = judge_beside(sc, raised, stock, DType.BF16, TOL)
    assert not result.ok and len(result.steps) == 2, f"seed {seed}"


def test_no_worse_compares_both_error_measures() -> None:
    want = np.zeros(100, np.float32)
    stock = compare(np.where(np.arange(100) < 10, 1.0, 0.0).astype(np.float32), want, TOL)
    assert no_worse(stock, stock, 1.0)
    twice = compare(np.where(np.arange(100) < 20, 1.0, 0.0).astype(np.float32), want, TOL)
    assert no_worse(twice, stock, 2.0) and not no_worse(twice, stock, 1.5)
    higher = compare(np.where(np.arange(100) < 10, 3.0, 0.0).astype(np.float32), want, TOL)
    assert not no_worse(higher, stock, 2.0)
