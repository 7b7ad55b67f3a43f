"""What `polymorph tune` shows: a live progress view while it runs (rich on a terminal, a plain line
every few seconds otherwise) and the report at the end."""

from __future__ import annotations

import time
from typing import Any

from polymorph.cli import console
from polymorph.search.tune import TuneReport


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
                f"failed: {failed}; {len(p['workers'])} workers; {p['left_s']:.0f} s left")  # fmt: skip
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


def print_report(report: TuneReport) -> None:
    for b in report.buckets:
        rows = []
        for s in b.signatures:
            best = s.best or {}
            rows.append((
                _short(s.signature, 48), len(s.groups), f"{s.share:.0%}", console.seconds(s.stock_s),
                console.seconds(best.get("median_s")), f"{s.speedup:.2f}x" if s.speedup else "-",
                "yes" if s.chosen else "no", best.get("agent", "-"), (best.get("reasoning") or "-")[:70],
            ))  # fmt: skip
        console.table(
            f"bucket {b.bucket} (weight {b.weight:.2f}): {b.candidates} candidates, {b.passed} passed"
            + (f"; {b.skipped}" if b.skipped else ""),
            ["op signature", "groups", "share", "stock", "best", "speedup", "in plan", "agent", "reasoning"],
            rows,
        )
        if b.failed:
            console.line("rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(b.failed.items())))
        for d in b.demoted:  # registry champions that failed re-verification here
            console.line(f"demoted in the registry (failed re-verification): {d}")
        ab = b.ab
        if "error" in ab:
            console.line(f"end to end: the final A/B failed ({ab['error']}); the untuned plan is written")
            console.line(f"plan written ({ab['plan']}): {b.plan_dir}")
            continue
        console.line(
            f"end to end, whole decode steps, same run, {ab['rounds']} alternating rounds: untuned "
            f"{' '.join(console.seconds(x) for x in ab['stock_s'])}, tuned "
            f"{' '.join(console.seconds(x) for x in ab['tuned_s'])}: {ab['speedup']:.2f}x "
            f"(medians; {ab['trials']} steps per arm and round; final gate {ab['gate']})"
        )
        console.line(f"plan written ({ab.get('plan', 'tuned')}): {b.plan_dir} (polymorph run {b.plan_dir})")
    console.line(
        f"took {report.elapsed_s:.0f} s of a {report.budget_s:.0f} s budget; toolchain {report.toolchain}"
    )
