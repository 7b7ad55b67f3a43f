"""Terminal output for the CLI: rich tables on a terminal, plain tab-separated text otherwise; and the
progress of long work (compiles of many kernels, microbenchmarks, tunes) on stderr, shown only when the
CLI asks for it (`showing_progress`), so library callers see nothing and stdout stays parseable."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def fancy() -> bool:
    from polymorph.knobs import knobs

    return sys.stdout.isatty() and not knobs.plain


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    if fancy():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, title_justify="left")
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*(str(x) for x in r))
        Console().print(t)
        return
    print(f"# {title}")
    print("\t".join(columns))
    for r in rows:
        print("\t".join(str(x) for x in r))


def line(text: str = "") -> None:
    print(text)


def warn(text: str) -> None:
    print(f"polymorph: warning: {text}", file=sys.stderr)


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def quantity(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


# --- progress -----------------------------------------------------------------------------------------

PLAIN_STEP = 0.1  # off a terminal: a line each time another tenth of the work is done ...
PLAIN_MIN_GAP_S = 1.0  # ... but not sooner than this after the previous line ...
PLAIN_MAX_GAP_S = 10.0  # ... and one at least this often while work goes on, however slowly

_progress_on = False


@contextmanager
def showing_progress(on: bool = True) -> Iterator[None]:
    """Within this block, `progress` reports on stderr (the CLI's main wraps each command in it);
    outside it, `progress` is silent. Restores the previous setting on exit."""
    global _progress_on
    previous, _progress_on = _progress_on, on
    try:
        yield
    finally:
        _progress_on = previous


Advance = Callable[..., None]


@contextmanager
def progress(total: float, what: str, unit: str = "") -> Iterator[Advance]:
    """Progress of `what` ("compiling 48 kernels for cuda:sm_90") over `total` units (`unit` names
    them, e.g. " s"; default: items). Yields `advance(n=1, note="", at=None)`: n more units are done
    (with `at`, `at` units are done in all, for work measured in time); `note`, when given, says what
    stands now ("3 candidates passed") and is shown beside the count.

    Silent unless within `showing_progress`. Then, with stderr a terminal (and POLYMORPH_PLAIN unset),
    a rich progress bar on stderr that disappears when the work ends; otherwise plain lines on stderr:
    one each time another tenth is done (no more than one a second, at least one every ten seconds
    while work goes on) and one when the work ends. An error inside the block ends it without a
    line (the error says what happened)."""
    if not _progress_on or total <= 0:
        yield _ignore
        return
    if _fancy_progress():
        with _rich_progress(total, what, unit) as advance:
            yield advance
        return
    plain = _PlainProgress(total, what, unit)
    yield plain.advance
    plain.finish()


def _ignore(n: float = 1, note: str = "", at: float | None = None) -> None:
    return None


def _fancy_progress() -> bool:
    from polymorph.knobs import knobs

    return sys.stderr.isatty() and not knobs.plain


@contextmanager
def _rich_progress(total: float, what: str, unit: str) -> Iterator[Advance]:
    import rich
    from rich.errors import LiveError
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # A live display already on the terminal (the tune's view) takes the bar in, below its own
    # content; two live displays drawing on one terminal apart would overwrite each other.
    shared = rich.get_console()
    console = shared if getattr(shared, "_live_stack", None) else _stderr_console()
    count = (
        MofNCompleteColumn() if not unit else TextColumn(f"{{task.completed:.0f}}/{{task.total:.0f}}{unit}")
    )
    bar = Progress(TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn(),
                   TextColumn("{task.fields[note]}"), console=console, transient=True)  # fmt: skip
    task = bar.add_task(what, total=total, note="")
    try:
        bar.start()
    except LiveError:  # a rich without nested live displays (before 15): the other display stays alone
        yield _ignore
        return

    def advance(n: float = 1, note: str = "", at: float | None = None) -> None:
        done = {"completed": min(at, total)} if at is not None else {"advance": n}
        bar.update(task, **done, **({"note": note} if note else {}))

    try:
        yield advance
    finally:
        bar.stop()


_stderr: Any = None


def _stderr_console() -> Any:  # rich's Console, imported lazily
    global _stderr
    from rich.console import Console

    if _stderr is None:
        _stderr = Console(stderr=True)
    return _stderr


class _PlainProgress:
    def __init__(self, total: float, what: str, unit: str) -> None:
        self.total, self.what, self.unit = total, what, unit
        self.done, self.note = 0.0, ""
        self.started = self.last = time.monotonic()
        self.step = 0  # the last tenth a line was written for

    def advance(self, n: float = 1, note: str = "", at: float | None = None) -> None:
        self.done = min(self.total, self.done + n if at is None else at)
        self.note = note or self.note
        now = time.monotonic()
        step = int(self.done / self.total / PLAIN_STEP + 1e-9)
        gap = now - self.last
        if (step > self.step and gap >= PLAIN_MIN_GAP_S) or gap >= PLAIN_MAX_GAP_S:
            if self.done < self.total:  # the last line is finish's
                self._line(now)
            self.step, self.last = step, now

    def finish(self) -> None:
        self._line(time.monotonic(), end=True)

    def _line(self, now: float, end: bool = False) -> None:
        count = (
            f"{self.done:.0f}/{self.total:.0f}{self.unit}" if self.unit else f"{self.done:g}/{self.total:g}"
        )
        state = "finished" if end else f"{self.done / self.total:.0%}"
        note = f"; {self.note}" if self.note else ""
        print(f"polymorph: {self.what}: {count} ({state}, {now - self.started:.1f} s){note}",
              file=sys.stderr, flush=True)  # fmt: skip
