"""`polymorph tune` in an empty working directory writes nothing there: its registry goes to the user's
data directory ($XDG_DATA_HOME/polymorph), its board beside its output, and its first line says where.

A real tune, as a user runs it (a separate process, the CLI's own entry point), with HOME and
XDG_DATA_HOME pointed at folders of this test, and --out elsewhere (the output is what was asked for).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polymorph.search.registry import Registry

pytestmark = pytest.mark.slow
TIMEOUT_S = 600  # a 30 s budget overruns by its engine start and final A/B on a loaded 2-core machine


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_tune_in_an_empty_working_directory_writes_nothing_there(tmp_path: Path) -> None:
    work, home, xdg, out = (tmp_path / name for name in ("work", "home", "xdg", "out"))
    for folder in (work, home):
        folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYMORPH_")}
    env.update(HOME=str(home), XDG_DATA_HOME=str(xdg), POLYMORPH_PLAIN="1")
    tune = [sys.executable, "-m", "polymorph", "tune", "llama-tiny", "--backend", "cpu", "--batch", "1",
            "--ctx", "32", "--budget", "30s", "--out", str(out)]  # fmt: skip
    done = subprocess.run(tune, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(work.iterdir()) == [], "tune wrote into the working directory"
    registry = xdg / "polymorph" / "registry.sqlite"
    assert done.stdout.splitlines()[0] == f"registry: {registry}; board: {out / 'board.sqlite'}"
    assert (xdg / "polymorph").stat().st_mode & 0o777 == 0o700  # made by polymorph, private
    assert (out / "board.sqlite").is_file() and (out / "tune-report.json").is_file()
    reg = Registry(registry)  # a registry file, not just any file
    try:
        reg.list()
    finally:
        reg.close()
