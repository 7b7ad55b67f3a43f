"""What a candidate's failure is recorded as: shared by the controller and the gates, which judge
apart (the controller's wire and retirement, the gates' comparisons) and import neither each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """One candidate's failure. stage: build, run, numerics, hang, crash, or the name of the gate
    of `polymorph.engine.gates` that rejected it (`honesty.input_dependence`, `timing.roofline`...)."""

    group: str
    kernel: str
    stage: str
    cause: str
