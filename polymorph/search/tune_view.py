"""What `polymorph tune` shows: a live progress view while it runs (rich on a terminal, a plain line
every few seconds otherwise) and the report at the end."""

from __future__ import annotations

import textwrap
import time
from typing import Any

import numpy as np

from polymorph.cli import console
from polymorph.cli.fit import WIDTH, fit
from polymorph.search.ab import FASTER, NO_DIFFERENCE
from polymorph.search.tune import BucketResult, TuneReport


def _short(signature: str, width: int = 60) -> str:
    return signature if len(signature) <= width else signature[: width - 3] + "..."


class ProgressView:
    def __init__(self) -> None:
        self._live: Any = None
        self._last_plain = 0.0
        if console.fancy():
            from rich.live import Live

            self._live = Live(refresh_per_second=4, transient=True)
            self._live.start()

    def __call__(self, p: dict[str, Any]) -> None:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(p["failed"].items())) or "none"
        head = (f"bucket {p['bucket']}: {p['done']}/{p['posted']} candidates done, {p['passed']} passed, "
                f"failed: {failed}; {len(p['workers']) + p.get('threads', 0)} workers; {p['left_s']:.0f} s left")  # fmt: skip
        if self._live is None:
            now = time.monotonic()
            if now - self._last_plain >= 5.0:
                self._last_plain = now
                console.line(head)
            return
        from rich.table import Table

        t = Table(title=head, title_justify="left")
        t.add_column("op signature")
        t.add_column("best vs stock", justify="right")
        for sig, speedup in sorted(p["best"].items(), key=lambda kv: -kv[1]):
            t.add_row(_short(sig), f"{speedup:.2f}x")
        self._live.update(t)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


SIGNATURE_COLUMNS = ["op signature", "n", "share", "stock", "best", "speedup", "plan", "agent", "reasoning"]
# The columns cut to fit 80 characters, with the narrowest each may become; the full signatures and
# reasoning are in OUT/tune-report.json.
SIGNATURE_CUTS = {"op signature": 24, "reasoning": 12, "agent": 8}


def signature_rows(b: BucketResult) -> list[tuple[str, ...]]:
    """The rows of a bucket's table, cut to fit 80 columns."""
    rows = []
    for s in b.signatures:
        best = s.best or {}
        rows.append((
            s.signature, len(s.groups), f"{s.share:.0%}", console.seconds(s.stock_s),
            console.seconds(best.get("median_s")), f"{s.speedup:.2f}x" if s.speedup else "-",
            "yes" if s.chosen else "no", best.get("agent", "-"), best.get("reasoning") or "-",
        ))  # fmt: skip
    return fit(SIGNATURE_COLUMNS, rows, SIGNATURE_CUTS)


def _p10_p90(xs: list[float]) -> str:
    lo, hi = np.quantile(np.asarray(xs, dtype=np.float64), [0.1, 0.9])
    return f"{console.seconds(float(lo))}-{console.seconds(float(hi))}"


def ab_lines(ab: dict[str, Any]) -> list[str]:
    """What the final A/B found, in lines of 80 characters or fewer where the numbers allow."""
    if "error" in ab:
        return [f"end to end: the final A/B failed ({ab['error']}); the untuned plan is written"]
    if "skipped" in ab:
        return textwrap.wrap(f"end to end: no final A/B: {ab['skipped']}", WIDTH, subsequent_indent="  ")
    where = "in one fresh engine" if ab.get("engine", "fresh") == "fresh" else "in the search's engine"
    stock, tuned = ab["stock_s"], ab["tuned_s"]
    low, high = ab["interval"]
    lines = [
        f"end to end, whole decode steps {where}: {ab['pairs']} alternating pairs,",
        f"  {ab['trials']} steps per arm (the fastest of 3 rounds each; p10-p90 over the pairs):",
        f"  untuned {console.seconds(float(np.median(stock)))} ({_p10_p90(stock)}), "
        f"tuned {console.seconds(float(np.median(tuned)))} ({_p10_p90(tuned)})",
        f"  tuned/untuned {ab['ratio']:.3f}x, 95% bootstrap interval {low:.3f}-{high:.3f}:",
        f"  {ab['verdict']}" + ("" if ab["verdict"] == NO_DIFFERENCE else " (the whole interval is "
                               f"{'below' if ab['verdict'] == FASTER else 'above'} 1)"),
        f"  final gate: {ab['gate']}"
        + ("; both arms ran the same plan (no champion beat stock)" if ab.get("same_plan") else ""),
    ]  # fmt: skip
    return lines


def print_report(report: TuneReport) -> None:
    for b in report.buckets:
        console.table(
            f"bucket {b.bucket} (weight {b.weight:.2f}): {b.candidates} candidates, {b.passed} passed",
            SIGNATURE_COLUMNS,
            signature_rows(b),
        )
        console.line("n: groups of the signature; plan: in the tuned plan; full text: tune-report.json")
        notes = [f"not searched: {b.skipped}"] if b.skipped else []
        if b.stopped:
            notes.append(
                f"search stopped {b.stopped}"
                if b.stopped.startswith("early")
                else f"search stopped: {b.stopped}"
            )
        if b.failed:
            notes.append("rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(b.failed.items())))
        # registry champions that failed re-verification here
        notes += [f"demoted in the registry (failed re-verification): {d}" for d in b.demoted]
        for note in notes:
            console.line(textwrap.fill(note, WIDTH, subsequent_indent="  ", break_on_hyphens=False))
        for text in ab_lines(b.ab):
            console.line(text)
        console.line(f"plan written ({b.ab.get('plan', 'tuned')}): {b.plan_dir}")
        console.line(f"  run it: polymorph run {b.plan_dir}")
    console.line(
        f"took {report.elapsed_s:.0f} s of a {report.budget_s:.0f} s budget; toolchain {report.toolchain}"
    )
