"""Tables that fit a line width: the cells of the columns that may be cut are shortened, widest first,
until every line of the plain (tab-separated) form fits; the full text stays in the JSON outputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

WIDTH = 80
MARK = "..."


def cut(text: str, width: int) -> str:
    """`text` in `width` characters at most, ending in ... when it was cut."""
    if len(text) <= width:
        return text
    return text[:width] if width <= len(MARK) else text[: width - len(MARK)] + MARK


def fit(
    columns: Sequence[str], rows: Sequence[Sequence[object]], cuttable: Mapping[str, int], width: int = WIDTH
) -> list[tuple[str, ...]]:
    """`rows` as strings, the cells of the `cuttable` columns (name -> the narrowest they may become)
    shortened so that the header line and every row, joined by one separator each, fit in `width`.
    Headers and the columns not named are never cut; when they alone are too wide the cuttable
    columns end at their minimum (or their header's width)."""
    text = [tuple(str(x) for x in r) for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]
    floors = {i: max(len(c), cuttable[c]) for i, c in enumerate(columns) if c in cuttable}
    while sum(widths) + len(widths) - 1 > width:
        over = [i for i in floors if widths[i] > floors[i]]
        if not over:
            break
        i = max(over, key=lambda j: widths[j] - floors[j])
        widths[i] -= 1
    return [tuple(cut(cell, widths[i]) if i in floors else cell for i, cell in enumerate(r)) for r in text]
