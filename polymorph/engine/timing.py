"""Timing taken by the trusted side: the controller's clock around batches of checked calls.

The worker is hostile, so no number it reports is a time. A group is timed by `time_group`:

- each round is one `run_group` request of K calls, every call on fresh input content the controller
  drew (float activations; caches and integer inputs copied per call) into its own output slots,
  poisoned with NaN beforehand. The inputs are written into the shared arena inside the timed window,
  so nothing can be computed from them before the clock starts;
- the clock is the controller's (`time.perf_counter`) from just before the inputs are written to the
  answer's arrival; the worker's whole process tree is frozen the moment the answer arrives, before
  any output is read, so work left running after the answer (a thread, a child) cannot finish later;
- some calls, chosen after the answer came, are compared with the numpy reference on the same inputs
  (`cases.reference_outputs`): a kernel that skips its work while it is being timed is caught there,
  and the gates run the very same request with one call, so being timed cannot be told from being
  checked by the request's path, only guessed, and a wrong guess costs the verdict;
- the harness's own cost per call (writing the inputs, the worker's loop) is measured with the empty
  launch on a worker no candidate has touched (the standby) and taken off.

K grows until a round takes MIN_ROUND_S on the clock (within IO_BUDGET bytes of inputs and outputs);
the median over ROUNDS rounds is the time per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from polymorph.engine.cases import GroupInfo, draw, error, reference_outputs, vary

if TYPE_CHECKING:
    from polymorph.engine.controller import Controller

MIN_ROUND_S = 0.02
ROUNDS = 5
IO_BUDGET = 64 << 20  # bytes of inputs and outputs one round may hold
CHECKS = 8  # calls of each round compared with the reference, besides the last


@dataclass
class Timing:
    """Seconds per call of one group, by the controller's clock; failures of the checked calls."""

    group: str
    per_call_s: list[float] = field(default_factory=list)  # one per round, harness cost taken off
    raw_s: list[float] = field(default_factory=list)  # one per round, as the clock saw it (an upper bound)
    calls: int = 0  # per round
    harness_s: float = 0.0  # the empty launch's cost per call, taken off
    checked: int = 0
    failures: list[str] = field(default_factory=list)
    bindings: dict[str, int] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return float(np.median(self.per_call_s)) if self.per_call_s else float("nan")

    @property
    def raw_median_s(self) -> float:
        """Per call with the harness's cost still in: never below the kernel's true time, so what the
        roofline holds to."""
        return float(np.median(self.raw_s)) if self.raw_s else float("nan")

    @property
    def spread_s(self) -> float:
        return float(max(self.per_call_s) - min(self.per_call_s)) if self.per_call_s else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "median_s": self.median_s,
            "spread_s": self.spread_s,
            "total_s": float(sum(self.per_call_s) * self.calls),
            "trials": len(self.per_call_s) * self.calls,
            "calls": self.calls,
            "rounds": len(self.per_call_s),
            "harness_s": self.harness_s,
            "raw_median_s": self.raw_median_s,
            "checked": self.checked,
        }


def time_group(
    engine: Controller,
    group: GroupInfo,
    rng: np.random.Generator,
    *,
    trials: int = 20,
    allowed: float | None = None,
    stock: bool = False,
) -> Timing:
    """Time `group` (its stock kernel with `stock`) at the loaded bucket's decode step, at its longest
    context. `allowed`: the error a checked call may have (default: four times the op tolerance)."""
    from polymorph.verify.tolerance import op_tolerance

    loaded = engine.loaded
    batch = int(loaded["bucket"]["batch"])
    common = {"block_size": int(loaded["block_size"]), "bucket_ctx": int(loaded["bucket"]["ctx"]),
              "vocab": engine.vocab}  # fmt: skip
    base, bindings = draw(group, rng, (batch, 1), "normal", longest=True, **common)
    if allowed is None:
        allowed = 4 * op_tolerance(group.types[group.outputs[0]].dtype).rtol
    timing = Timing(group.id, bindings=dict(bindings))
    per_call = sum(a.nbytes for a in base if a is not None) + engine.output_bytes(group, bindings)
    k_max = max(2, IO_BUDGET // max(per_call, 1))
    key = (group.id, tuple(sorted(bindings.items())))
    k = engine.round_sizes.get(key) or min(max(trials, 8), k_max)
    while key not in engine.round_sizes:  # the round size: long enough on the clock to swamp its jitter
        wall = _round(engine, group, base, bindings, k, rng, allowed, stock, timing)
        if wall >= MIN_ROUND_S or k >= k_max:
            engine.round_sizes[key] = k  # the next candidate of this group starts from it
            break
        k = min(k * 4, k_max)
    timing.calls = k
    timing.harness_s = engine.harness_cost(group, base, bindings, k) / k
    for _ in range(ROUNDS):
        wall = _round(engine, group, base, bindings, k, rng, allowed, stock, timing)
        timing.raw_s.append(wall / k)
        # Contention only ever adds time: a round below the harness's own cost is noise, kept at a
        # tenth of what the clock saw rather than at zero.
        timing.per_call_s.append(max(wall / k - timing.harness_s, 0.1 * wall / k))
    return timing


def _round(
    engine: Controller,
    group: GroupInfo,
    base: list[np.ndarray | None],
    bindings: dict[str, int],
    k: int,
    rng: np.random.Generator,
    allowed: float,
    stock: bool,
    timing: Timing,
) -> float:
    """One timed request of `k` calls; checks some of them; the request's wall time."""
    calls = [vary(base, group, rng) for _ in range(k)]
    done = engine.run_calls(group, calls, bindings, stock=stock)
    picked = sorted({k - 1, *rng.choice(k, min(CHECKS, k), replace=False).tolist()})
    for i in picked:  # the worker is frozen: nothing it runs can change these any more
        got = done.output(i)
        want = reference_outputs(group, engine.weights, engine.wide_weights, calls[i], bindings)
        timing.checked += 1
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            err = error(g, w)
            if err > allowed:
                timing.failures.append(
                    f"timed call {i + 1} of {k}: output {j} max error {err:.3g} of its row scale, "
                    f"allowed {allowed:.3g}"
                )
                break
    return done.wall_s
