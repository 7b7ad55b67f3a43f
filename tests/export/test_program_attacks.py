"""Attacks on the gates through imported programs' groups (each candidate under tests/export/kernels/
says its trick), every one of which passed the gates before the fix named with it:

- a fused group whose reference output holds NaN on the gate's draws (sqrt of a drawn input the program
  only feeds positive values): NaN where the reference had NaN counted as an infinite error, so the
  stock kernel's error was infinite, four times it too, and any answer passed
  (garbage_where_reference_nan.py; fix: cases.error judges non-finite elements, NaN only where the
  reference has NaN and the same infinity where it has one, and a stock kernel whose error is still
  infinite sets no bar of its own);
- index kernels wrong only for index patterns uniform draws never make: a target reached more than a
  dozen times (index_add_capacity.py), indices in sorted order (index_select_sorted_path.py); fix: the
  case's distribution picks a uniform, sorted or hub pattern (cases.INDEX_PATTERNS);
- a layer norm whose variance is E[x^2] - E[x]^2 in float32 (layernorm_naive_variance.py): right about
  zero, where every draw was centred; fix: a program's group gets a case about a common offset of 1e3
  (cases.OFFSET); and a kernel that clamps its inputs to float16's range (clamps_to_half_range.py): no
  draw passed 1e4; fix: a case with outliers at ±1e6 too (cases.HUGE);
- a masked sum with a wrong fast path for a mask with nothing masked (mask_fast_path.py): masks were
  drawn half True at random; fix: all True and all False too, by the case's distribution
  (cases.BOOL_PATTERNS);
- a kernel right only when its output buffer holds NaN, the poison of every call the gates judge
  (right_only_when_poisoned.py): the prefill gate compared its 0-filled and -7.5-filled runs only with
  each other; fix: both are compared with the poisoned run's answer, and the second fill is drawn;
- a kernel right only when its output buffer holds one value throughout
  (right_only_in_uniform_buffers.py), as every buffer the gates filled did (one scalar); fix: the
  prefill gate also runs into buffers of varied numbers (engine/link.py's VARIED fill);
- bit-exact mode: a candidate bit-exact for its first calls and off by an ulp or so after them
  (inexact_after_calls.py; fix: every timed call is held to the stock kernel's bytes), and ones
  bit-exact except on subnormals (flushes_subnormals.py) or signed zeros (signed_zero.py), values no
  normal draw holds (fix: the exact gate adds a case of each special float regime, cases.SPECIALS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from polymorph.engine.cases import (
    HUB_SHARE,
    SPECIALS,
    GroupInfo,
    _draw_bool,
    _draw_in,
    draw,
    draw_float,
    error,
    vary,
)
from polymorph.engine.controller import Controller
from polymorph.engine.gates import CHECKED, EXACT, NUMERICS, OUTPUT_PREFILL

HERE = Path(__file__).parent / "kernels"
FUSED = "kernels/torch/general_fused.py"


class Chains(torch.nn.Module):
    """Three chains, one group each: sqrt of an input (positive in the program, not in the gate's draws),
    a negation whose zeros keep their sign, and a masked sum."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> Any:
        return torch.sqrt(x) * 2.0 + 1.0, torch.neg(y) * 3.0, torch.where(mask, z, 0.0).sum(-1)


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("pt2") / "chains.pt2"
    example = (torch.rand(4, 16) + 0.5, torch.randn(4, 16), torch.randn(4, 16), torch.rand(4, 16) < 0.5)
    torch.export.save(torch.export.export(Chains(), example, strict=False), str(path))
    with Controller.start(str(path), "cpu") as e:
        yield e


@pytest.fixture(scope="module")
def gnn(zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.manual_seed(3)
    module, example = zoo.gnn()
    path = tmp_path_factory.mktemp("pt2") / "gnn.pt2"
    torch.export.save(torch.export.export(module, example, strict=False), str(path))
    with Controller.start(str(path), "cpu") as e:
        yield e


def _group(engine: Any, pattern: str) -> str:
    return next(g for g in engine.groups() if engine.plan_group(g)["pattern"] == pattern)


def _failed(report: Any) -> list[tuple[str, str]]:
    return [(g.name, g.cause) for g in report.failed()]


def test_a_group_whose_reference_has_nan_is_still_judged(chains: Any) -> None:
    group = _group(chains, "elementwise:sqrt+mul+add")
    _, stock = chains.try_candidate(group, FUSED, {})
    assert stock is not None and stock.ok, _failed(stock)
    _, bad = chains.try_candidate(group, str(HERE / "garbage_where_reference_nan.py"), {})
    assert bad is not None and [g.name for g in bad.failed()] == [NUMERICS], _failed(bad)


@pytest.mark.parametrize(
    ("op", "kernel"),
    [
        ("index_add", "index_add_capacity.py"),
        ("index_select", "index_select_sorted_path.py"),
        ("layernorm", "layernorm_naive_variance.py"),
    ],
)
def test_kernels_wrong_only_off_the_usual_draws_are_rejected(gnn: Any, op: str, kernel: str) -> None:
    _, report = gnn.try_candidate(_group(gnn, op), str(HERE / kernel), {})
    assert report is not None and [g.name for g in report.failed()] == [NUMERICS], _failed(report)


@pytest.mark.parametrize(
    ("kernel", "gate"),
    [("inexact_after_calls.py", CHECKED), ("flushes_subnormals.py", EXACT), ("signed_zero.py", EXACT)],
)
def test_bit_exact_only_on_the_usual_draws_is_rejected(chains: Any, kernel: str, gate: str) -> None:
    group = _group(chains, "elementwise:neg+mul")
    _, plain = chains.try_candidate(group, str(HERE / kernel), {})  # right within tolerance
    assert plain is not None and plain.ok, _failed(plain)
    _, exact = chains.try_candidate(group, str(HERE / kernel), {}, exact=True)
    assert exact is not None and [g.name for g in exact.failed()] == [gate], _failed(exact)


@pytest.mark.parametrize(
    ("pattern", "kernel"),
    [("reduction:where+reduce_sum", "mask_fast_path.py"), ("elementwise:neg+mul", "clamps_to_half_range.py")],
)
def test_fused_kernels_wrong_off_the_usual_draws_are_rejected(chains: Any, pattern: str, kernel: str) -> None:
    group = _group(chains, pattern)
    _, stock = chains.try_candidate(group, FUSED, {})
    assert stock is not None and stock.ok, _failed(stock)
    _, report = chains.try_candidate(group, str(HERE / kernel), {})
    assert report is not None and [g.name for g in report.failed()] == [NUMERICS], _failed(report)


def test_a_kernel_right_only_in_poisoned_buffers_is_rejected(chains: Any) -> None:
    group = _group(chains, "elementwise:neg+mul")
    _, report = chains.try_candidate(group, str(HERE / "right_only_when_poisoned.py"), {})
    assert report is not None and [g.name for g in report.failed()] == [OUTPUT_PREFILL], _failed(report)


def test_a_kernel_right_only_in_uniform_buffers_is_rejected(chains: Any) -> None:
    group = _group(chains, "elementwise:neg+mul")
    _, report = chains.try_candidate(group, str(HERE / "right_only_in_uniform_buffers.py"), {})
    assert report is not None and not report.ok, "passed every gate"


def test_the_stock_kernel_passes_bit_exact_mode(chains: Any) -> None:
    for pattern in ("elementwise:neg+mul", "elementwise:sqrt+mul+add", "reduction:where+reduce_sum"):
        _, report = chains.try_candidate(_group(chains, pattern), FUSED, {}, exact=True)
        assert report is not None and report.ok, (pattern, _failed(report))


def test_error_judges_non_finite_elements() -> None:
    want = np.array([[1.0, np.nan, np.inf, -np.inf]])
    assert error(want.copy(), want) == 0.0
    for bad in ([1.0, 0.0, np.inf, -np.inf], [1.0, np.nan, -np.inf, -np.inf], [1.0, np.nan, 3e38, -np.inf],
                [1.0, np.nan, np.nan, -np.inf], [np.inf, np.nan, np.inf, -np.inf]):  # fmt: skip
        assert error(np.array([bad]), want) == float("inf"), bad


def test_index_patterns_and_special_values() -> None:
    rng = np.random.default_rng()
    for pattern in ("uniform", "sorted", "hub"):
        for _ in range(20):
            x = _draw_in(rng, (2, 40), 0, 12, pattern)
            assert x.min() == 0 and x.max() == 11, pattern
            if pattern == "sorted":
                assert (np.diff(x.reshape(-1)) >= 0).all()
            if pattern == "hub":  # one value many times over
                assert np.bincount(x.reshape(-1)).max() >= 0.75 * HUB_SHARE * x.size
    tiny = draw_float(rng, SPECIALS[0], (4, 16))
    assert (np.signbit(tiny) & (tiny == 0)).any() and ((tiny != 0) & (np.abs(tiny) < 2.0**-126)).any()
    assert _draw_bool(rng, (3, 5), "all True").all() and not _draw_bool(rng, (3, 5), "all False").any()
    wild = draw_float(rng, SPECIALS[1], (4, 16))
    assert np.isnan(wild).any() and np.isposinf(wild).any() and np.isneginf(wild).any()


def test_timed_calls_draw_integer_inputs_afresh(gnn: Any) -> None:
    """A group whose output follows from its integer inputs alone (the degree count: an index_add of
    constant rows by the edge targets) cannot be answered from a cache keyed by them while timed:
    each timed call's indices are drawn afresh, within their legal range."""
    info = gnn.plan_group(_group(gnn, "index_add"))
    group = GroupInfo.of(info, gnn.graph, gnn.graph.types())
    rng = np.random.default_rng()
    base, _ = draw(group, rng, (1, 1), "normal", block_size=16, bucket_ctx=32, vocab=2)
    (at,) = [i for i, a in enumerate(base) if a is not None and a.dtype.kind == "i"]
    calls = [vary(base, group, rng)[at] for _ in range(4)]
    assert all(c.min() >= 0 and c.max() < 12 for c in calls)
    assert len({c.tobytes() for c in calls}) == 4
