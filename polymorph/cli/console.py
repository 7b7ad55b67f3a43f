"""Terminal output for the CLI: rich tables on a terminal, plain tab-separated text otherwise."""

from __future__ import annotations

import sys
from collections.abc import Sequence


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
