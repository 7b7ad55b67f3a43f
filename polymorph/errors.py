"""Errors a user can act on.

Every error that reaches the CLI as a `UserError` becomes one line on stderr and exit code 2 (bad
input, bad usage, missing dependency). `CheckFailed` becomes exit code 1 (a verify mismatch, a gate
that rejected). Anything else is a bug in polymorph and keeps its traceback.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(message: str) -> str:
    """`message` with control characters escaped (a name from a user's file may hold a newline)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)


class UserError(Exception):
    """Bad input, bad usage or a missing dependency: one line naming the cause and the fix."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class CheckFailed(Exception):
    """A check ran and failed (verify mismatch, a gate rejected a candidate)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class MissingDependency(UserError):
    """An optional dependency needed for the requested step is not installed."""

    def __init__(self, module: str, extra: str, why: str) -> None:
        super().__init__(
            f"{why} needs the Python package `{module}`, which is not installed; "
            f"install it with `pip install 'polymorph[{extra}]'`"
        )
        self.module = module
        self.extra = extra
