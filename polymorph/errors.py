"""Errors a user can act on.

Every error that reaches the CLI as a `UserError` becomes one line on stderr and exit code 2 (bad
input, bad usage, missing dependency). `CheckFailed` becomes exit code 1 (a verify mismatch, a gate
that rejected). Anything else is a bug in polymorph and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input, bad usage or a missing dependency: one line naming the cause and the fix."""

    exit_code = 2


class CheckFailed(Exception):
    """A check ran and failed (verify mismatch, a gate rejected a candidate)."""

    exit_code = 1


class MissingDependency(UserError):
    """An optional dependency needed for the requested step is not installed."""

    def __init__(self, module: str, extra: str, why: str) -> None:
        super().__init__(
            f"{why} needs the Python package `{module}`, which is not installed; "
            f"install it with `pip install 'polymorph[{extra}]'`"
        )
        self.module = module
        self.extra = extra
