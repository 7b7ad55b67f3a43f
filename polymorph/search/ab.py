"""The verdict of an A/B of two plans timed in alternating pairs: the tuned/untuned time ratio with a
95% bootstrap interval, and a word only when the interval allows one.

Each pair is one untuned and one tuned timing taken back to back, so drift on a shared machine hits
both; the pair's log-ratio log(tuned / untuned) is the unit of evidence. The ratio is the geometric
mean of the pairs' ratios (exp of the mean log-ratio); the interval is the percentile bootstrap of
that mean over the pairs, resampled with replacement `resamples` times from a generator seeded with
`seed`, so given timings always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_PAIRS = 20  # the final A/B of a tune times at least this many alternating pairs
RESAMPLES = 2000
CONFIDENCE = 0.95

FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no difference above noise"


@dataclass(frozen=True)
class RatioInterval:
    """tuned / untuned time: below 1 is faster. `low`..`high` is the `confidence` bootstrap interval."""

    ratio: float
    low: float
    high: float
    pairs: int
    resamples: int
    seed: int
    confidence: float = CONFIDENCE

    @property
    def verdict(self) -> str:
        """`faster` when the whole interval is below 1, `slower` when it is all above, else no word."""
        if self.high < 1.0:
            return FASTER
        if self.low > 1.0:
            return SLOWER
        return NO_DIFFERENCE

    def describe(self) -> str:
        """One phrase: 'tuned/untuned 0.81x (95% interval 0.78-0.84 over 20 pairs): faster'."""
        return (
            f"tuned/untuned {self.ratio:.3f}x (95% bootstrap interval {self.low:.3f}-{self.high:.3f} "
            f"over {self.pairs} alternating pairs): {self.verdict}"
        )

    def to_json(self) -> dict[str, object]:
        return {"ratio": self.ratio, "interval": [self.low, self.high], "confidence": self.confidence,
                "pairs": self.pairs, "resamples": self.resamples, "seed": self.seed,
                "verdict": self.verdict}  # fmt: skip


def paired_ratio(
    untuned_s: Sequence[float], tuned_s: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0,
    confidence: float = CONFIDENCE,
) -> RatioInterval:  # fmt: skip
    """The tuned/untuned ratio of paired timings (untuned_s[i] and tuned_s[i] are one pair) and its
    bootstrap interval. Needs two pairs at least and positive, finite times (ValueError otherwise)."""
    a = np.asarray(untuned_s, dtype=np.float64)
    b = np.asarray(tuned_s, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"paired timings need two equal-length lists of 2 or more, got {a.shape}, {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and (a > 0).all() and (b > 0).all()):
        raise ValueError("paired timings must be positive, finite seconds")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError("resamples must be >= 1 and confidence in (0, 1)")
    logs = np.log(b) - np.log(a)  # one log-ratio per pair
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(logs), size=(resamples, len(logs)))
    means = logs[picks].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return RatioInterval(math.exp(float(logs.mean())), math.exp(float(low)), math.exp(float(high)),
                         len(logs), resamples, seed, confidence)  # fmt: skip
