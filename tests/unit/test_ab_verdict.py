"""The final A/B's verdict (polymorph.search.ab) on synthetic paired timings, and the tune report's
tables and lines at 80 columns on a non-terminal output."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from polymorph.knobs import knobs
from polymorph.search.ab import FASTER, MIN_PAIRS, NO_DIFFERENCE, SLOWER, paired_ratio
from polymorph.search.tune import BucketResult, SignatureResult, TuneReport
from polymorph.search.tune_view import print_report


def timings(ratio: float, pairs: int, rng: np.random.Generator, jitter: float = 0.04) -> tuple[list, list]:
    """Untuned times with machine drift, and tuned ones `ratio` times as long, each pair's ratio off
    by at most `jitter` (uniform on the log scale)."""
    untuned = np.exp(rng.normal(np.log(4e-3), 0.3, pairs))  # drift: pairs differ by tens of percent
    tuned = untuned * ratio * np.exp(rng.uniform(-jitter, jitter, pairs))
    return list(untuned), list(tuned)


@pytest.mark.parametrize("ratio, verdict", [(0.8, FASTER), (1.2, SLOWER)])
def test_a_clear_ratio_gets_its_word(ratio: float, verdict: str) -> None:
    rng = np.random.default_rng()
    untuned, tuned = timings(ratio, MIN_PAIRS, rng)
    r = paired_ratio(untuned, tuned, seed=int(rng.integers(1 << 31)))
    # Every pair's ratio is within 4% of `ratio`, so is any mean of them, so is the whole interval.
    assert ratio * math.exp(-0.04) <= r.low <= r.ratio <= r.high <= ratio * math.exp(0.04)
    assert r.verdict == verdict and r.pairs == MIN_PAIRS and r.resamples == 2000
    assert verdict in r.describe()


def test_equal_plans_get_no_word() -> None:
    """Pairs whose log-ratios come in +x / -x couples: the mean is exactly 1x and the interval holds 1
    on both sides (drift between pairs as large as tens of percent changes nothing)."""
    rng = np.random.default_rng()
    half = rng.uniform(0.01, 0.2, MIN_PAIRS // 2)
    logs = np.concatenate([half, -half])
    untuned = np.exp(rng.normal(np.log(4e-3), 0.3, MIN_PAIRS))
    r = paired_ratio(list(untuned), list(untuned * np.exp(logs)), seed=int(rng.integers(1 << 31)))
    assert r.ratio == pytest.approx(1.0)
    assert r.low < 1.0 < r.high and r.verdict == NO_DIFFERENCE
    identical = paired_ratio(list(untuned), list(untuned))
    assert (identical.low, identical.ratio, identical.high) == (1.0, 1.0, 1.0)
    assert identical.verdict == NO_DIFFERENCE


def test_the_interval_is_reproducible_and_matches_the_normal_approximation() -> None:
    """Seeded: the same timings give the same interval. With many pairs the percentile bootstrap of a
    mean approaches mean +- 1.96 sd / sqrt(n) (the oracle); the two widths agree within 15%."""
    rng = np.random.default_rng()
    n = 400
    logs = rng.normal(-0.05, 0.1, n)
    untuned = np.exp(rng.normal(np.log(4e-3), 0.2, n))
    tuned = untuned * np.exp(logs)
    seed = int(rng.integers(1 << 31))
    a = paired_ratio(list(untuned), list(tuned), seed=seed)
    b = paired_ratio(list(untuned), list(tuned), seed=seed)
    assert (a.low, a.ratio, a.high) == (b.low, b.ratio, b.high)
    mean, half = logs.mean(), 1.96 * logs.std(ddof=1) / math.sqrt(n)
    assert math.log(a.ratio) == pytest.approx(mean)
    assert (math.log(a.high) - math.log(a.low)) == pytest.approx(2 * half, rel=0.15)
    assert abs((math.log(a.high) + math.log(a.low)) / 2 - mean) < 0.25 * half
    assert json.loads(json.dumps(a.to_json()))["interval"] == [a.low, a.high]


@pytest.mark.parametrize(
    "untuned, tuned",
    [([1.0], [1.0]), ([1.0, 2.0], [1.0]), ([1.0, 0.0], [1.0, 1.0]), ([1.0, float("nan")], [1, 1])],
)
def test_bad_timings_are_refused(untuned: list, tuned: list) -> None:
    with pytest.raises(ValueError):
        paired_ratio(untuned, tuned)


# --- the tune report at 80 columns -------------------------------------------------------------------

LONG_SIGNATURE = "linear+residual(f32[batch,seq,128],f32[64,128],f32[batch,seq,64])->(f32[batch,seq,64])"


def report(reasoning: str) -> TuneReport:
    rng = np.random.default_rng()
    untuned, tuned = timings(0.9, MIN_PAIRS, rng)
    r = paired_ratio(untuned, tuned)
    sig = SignatureResult(LONG_SIGNATURE, [f"layers.{i}.mlp.down+residual" for i in range(12)], 0.31,
                          stock_s=8.6e-6, chosen=True,
                          best={"median_s": 7.1e-6, "agent": "config-neighbourhood-search", "reasoning": reasoning})  # fmt: skip
    bucket = BucketResult("b16-ctx2048-4096", 0.75, [sig, SignatureResult("rmsnorm(f32[batch,1,64])", ["n"], 0.01)],
                          candidates=123, passed=99, failed={"numerics": 20, "timing.checked": 4},
                          stopped="early: every candidate the agents proposed was tried (123 posted)",
                          plan_dir="/tmp/out",
                          ab={"stock_s": untuned, "tuned_s": tuned, **r.to_json(), "speedup": 1 / r.ratio,
                              "trials": 5, "gate": "passed", "plan": "tuned"})  # fmt: skip
    return TuneReport("llama-tiny", "cpu", "cpu", "cpu: torch 2.13.0+cpu", 60.0, 58.0, [bucket])


def test_the_tune_table_fits_80_columns_and_the_json_keeps_the_reasoning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reasoning = "because " + " ".join(f"reason{i}" for i in range(40))
    rep = report(reasoning)
    with knobs.scope(plain=True):
        print_report(rep)
    out = capsys.readouterr().out
    lines = out.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("# bucket"))
    table = lines[title : title + 4]  # title, header, two rows
    assert table[1].split("\t")[0] == "op signature" and len(table[2].split("\t")) == 9
    for line in lines[: lines.index("  run it: polymorph run /tmp/out")]:
        assert len(line) <= 80, line
    assert "..." in table[2] and reasoning not in out  # cut in the table
    assert (
        json.loads(json.dumps(rep.to_json()))["buckets"][0]["signatures"][0]["best"]["reasoning"] == reasoning
    )
    assert "tuned/untuned" in out and "95% bootstrap interval" in out and FASTER in out
    assert "20 alternating pairs" in out
    assert "search stopped early: every candidate the agents proposed was tried" in out
