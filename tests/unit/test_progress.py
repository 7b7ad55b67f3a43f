"""Progress on long work (polymorph.cli.console.progress): plain lines on stderr off a terminal when the
CLI runs, nothing in library use, and stdout unchanged."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import pytest

from polymorph.cli import console
from polymorph.cli.command import build_parser


def test_silent_in_library_use(capsys: pytest.CaptureFixture[str]) -> None:
    n = random.Random(os.urandom(8)).randint(50, 500)
    with console.progress(n, "work") as advance:
        for _ in range(n):
            advance()
    assert capsys.readouterr() == ("", "")


def test_plain_lines_are_few_and_end_with_the_count(capsys: pytest.CaptureFixture[str]) -> None:
    n = random.Random(os.urandom(8)).randint(200, 2000)
    with console.showing_progress(), console.progress(n, "many items") as advance:
        for i in range(n):
            advance(note=f"item {i}")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert 1 <= len(lines) <= 12  # a tenth at a time (at most) and the end, never one per item
    assert all(line.startswith("polymorph: many items: ") for line in lines)
    assert re.fullmatch(rf"polymorph: many items: {n}/{n} \(finished, [\d.]+ s\); item {n - 1}", lines[-1])


def test_an_error_inside_ends_without_a_finished_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError), console.showing_progress(), console.progress(10, "failing") as advance:
        advance()
        raise ValueError("boom")
    assert "finished" not in capsys.readouterr().err


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton (cuda extra)")
def test_gpu_compile_progress_on_stderr_same_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """`polymorph compile` off a terminal: progress lines on stderr, stdout as without progress."""
    argv = ["compile", "llama-tiny", "--backend", "cuda", "--target", "h200"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("POLYMORPH_PLAIN", None)
    p = subprocess.run([sys.executable, "-m", "polymorph", *argv], capture_output=True, text=True, env=env,
                       timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("polymorph: compiling ")]
    assert lines, p.stderr
    assert re.fullmatch(
        r"polymorph: compiling (\d+) kernels for cuda:sm_90: (\d+)/\1 \(finished, .*", lines[-1]
    )
    assert "compiling" not in p.stdout
    # The same command with progress off (the command's function, not main, which turns it on).
    args = build_parser().parse_args(argv)
    assert args.fn(args) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert "compiling" not in quiet_err
    assert p.stdout == quiet_out
