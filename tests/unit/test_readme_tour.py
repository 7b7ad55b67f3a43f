"""The README's tour runs as written: every command after a `<!-- tour -->` marker is run in a fresh
working directory, through `python -m polymorph` in a subprocess, and its stdout is compared with the
fenced output block that follows the command's block, with what varies from run to run masked
(durations, throughputs, absolute paths, hashes, dates, errors printed in e-notation).

The convention, in README.md:

    <!-- tour -->
    ```sh
    polymorph COMMAND ARGS...
    ```
    ```text
    the command's stdout, as a run printed it (tables may be aligned with spaces: runs of whitespace
    compare equal to one space)
    ```

After changing a command's output: `python tests/unit/test_readme_tour.py --update` reruns the tour
and writes the new output blocks into README.md (review the diff: it is what a reader will see).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- tour -->"
TIMEOUT_S = 600  # one command, on a loaded 2-core machine (a Triton compile of 16 kernels takes ~10 s)

# What differs between two runs of the same command, masked on both sides before comparing.
MASKS = [
    (re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:\d{2}|Z)?"), "<date>"),
    # absolute and ./ paths: /tmp/pytest-3/x, ./polymorph-demo/ (a path after a word, as in 0/256, stays)
    (re.compile(r"(?<![\w.~])(?:~|\.{1,2})?/(?:[\w.+@-]+/)*[\w.+@-]+/?"), "<path>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hash>"),
    (re.compile(r"[-+]?\d+(\.\d+)?e[-+]?\d+"), "<x>"),  # errors: 1.67e-06
    (re.compile(r"\d+(\.\d+)?\s?(s|ms|us|µs|ns)\b"), "<time>"),
    (re.compile(r"\d+(\.\d+)?\s?tokens/s"), "<rate> tokens/s"),
]


def mask(text: str) -> list[str]:
    """`text` with the run-dependent parts masked, one entry per non-empty line, whitespace runs as one
    space (the README aligns tables with spaces where a pipe prints tabs)."""
    lines = []
    for line in text.splitlines():
        for pattern, replacement in MASKS:
            line = pattern.sub(replacement, line)
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return lines


@dataclass
class Stop:
    """One stop of the tour: a command and the output the README shows for it."""

    command: str
    expected: str
    line: int  # of the command in README.md
    span: tuple[int, int]  # the output block's text: character offsets in README.md


FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


def tour(text: str) -> list[Stop]:
    """Every (command block, output block) pair that follows a marker."""
    stops = []
    for m in re.finditer(re.escape(MARKER), text):
        command = FENCE.search(text, m.end())
        output = FENCE.search(text, command.end()) if command else None
        if command is None or output is None:
            raise AssertionError(f"README.md:{text.count(chr(10), 0, m.start()) + 1}: {MARKER} needs a "
                                 "command block and an output block after it")  # fmt: skip
        between = text[command.end() : output.start()]
        if between.strip():
            raise AssertionError(f"README.md: text between the command and its output block: {between!r}")
        lines = [x for x in command.group(1).splitlines() if x.strip() and not x.lstrip().startswith("#")]
        if len(lines) != 1 or not lines[0].startswith("polymorph "):
            raise AssertionError(f"a tour block holds one `polymorph ...` command, not {command.group(1)!r}")
        stops.append(Stop(lines[0].strip(), output.group(1), text.count("\n", 0, command.start()) + 2,
                          output.span(1)))  # fmt: skip
    return stops


def run_stop(stop: Stop, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYMORPH_")}
    env["POLYMORPH_PLAIN"] = "1"
    argv = shlex.split(stop.command)[1:]
    r = subprocess.run([sys.executable, "-m", "polymorph", *argv], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert r.returncode == 0, f"README.md:{stop.line}: `{stop.command}` exited {r.returncode}:\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout


STOPS = tour(README.read_text(encoding="utf-8"))


def test_the_readme_has_a_tour() -> None:
    assert len(STOPS) >= 3, "README.md's tour lost its stops"
    assert all(stop.expected.strip() for stop in STOPS)


@pytest.mark.parametrize("stop", STOPS, ids=[s.command for s in STOPS])
def test_tour_stop_prints_what_the_readme_shows(stop: Stop, tmp_path: Path) -> None:
    got, want = mask(run_stop(stop, tmp_path)), mask(stop.expected)
    if got != want:
        diff = "\n".join(f"  line {i}: README {w!r}\n           ran    {g!r}"
                         for i, (w, g) in enumerate(zip(want + [""] * len(got), got + [""] * len(want)))
                         if w != g)  # fmt: skip
        pytest.fail(
            f"README.md:{stop.line}: `{stop.command}` printed something else (masked):\n{diff}\n"
            "if the change is meant: python tests/unit/test_readme_tour.py --update"
        )


def test_mask_hides_what_varies_and_keeps_the_rest() -> None:
    a = "prefill 4 tokens in 28.9 ms; decode 127.0 tokens/s\nok\t1.67e-06\t0/256\nwrote /tmp/x1/plan.json"
    b = "prefill 4 tokens in 1.2 s; decode 9 tokens/s\nok    3.64e-06  0/256\nwrote /tmp/pytest-7/y/plan.json"
    assert mask(a) == mask(b)
    assert mask("tokens: 232 232 202") != mask("tokens: 232 232 109")  # tokens are not masked
    assert mask("0/256 out of tolerance") != mask("3/256 out of tolerance")  # nor counts
    assert mask("triton/embedding.py 14 0 0 B 100% (warps)") == ["triton/embedding.py 14 0 0 B 100% (warps)"]


def align(output: str) -> str:
    """Tab-separated table rows as columns padded with spaces, as a terminal reader would want them."""
    lines, out, block = output.splitlines(), [], []

    def flush() -> None:
        if block:
            widths = [
                max(len(r[i]) if i < len(r) - 1 else 0 for r in block) for i in range(max(map(len, block)))
            ]
            out.extend("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in block)
            block.clear()

    for line in lines:
        if "\t" in line:
            block.append(line.split("\t"))
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out) + "\n"


def update(readme: Path = README) -> None:
    """Rerun every stop and write its output into README.md's block (from the last, so offsets hold)."""
    import tempfile

    text = readme.read_text(encoding="utf-8")
    for stop in reversed(tour(text)):
        with tempfile.TemporaryDirectory() as tmp:
            got = align(run_stop(stop, Path(tmp)))
        print(f"README.md:{stop.line}: {stop.command}: {len(got.splitlines())} lines")
        text = text[: stop.span[0]] + got + text[stop.span[1] :]
    readme.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/unit/test_readme_tour.py --update")
    update()
