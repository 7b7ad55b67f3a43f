"""How many whole steps one round of an arm of the final A/B times (polymorph.search.tune)."""

from polymorph.search.tune import (
    AB_MAX_STEPS,
    AB_MIN_STEPS,
    AB_ROUND_S,
    SignatureResult,
    TuneOptions,
    ab_round_steps,
)


def sigs(stock_s: float, groups: int) -> list[SignatureResult]:
    return [SignatureResult("s", [f"g{i}" for i in range(groups)], 1.0, stock_s)]


def test_a_set_count_is_kept() -> None:
    assert ab_round_steps(TuneOptions(model="llama-tiny", ab_trials=2), sigs(1e-3, 4)) == 2


def test_the_default_fills_a_round_by_the_step_estimate() -> None:
    opts = TuneOptions(model="llama-tiny")
    step_s = 3.0 * 4 * 1e-4  # three times the stock kernels' time: 1.2 ms
    n = ab_round_steps(opts, sigs(1e-4, 4))
    assert AB_MIN_STEPS <= n <= AB_MAX_STEPS and (n - 1) * step_s < AB_ROUND_S <= n * step_s
    assert ab_round_steps(opts, sigs(1.0, 4)) == AB_MIN_STEPS  # slow steps: the fewest
    assert ab_round_steps(opts, sigs(1e-9, 1)) <= AB_MAX_STEPS  # no stock time measured to speak of
    assert ab_round_steps(opts, [SignatureResult("s", ["g"], 1.0, None)]) >= AB_MIN_STEPS
