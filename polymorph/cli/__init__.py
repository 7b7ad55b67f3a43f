"""The `polymorph` command. The entry point is `main` (polymorph.cli.command), imported on call so that
importing polymorph.cli.console or polymorph.cli.outdir stays cheap."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from polymorph.cli.command import main as run

    return run(argv)
