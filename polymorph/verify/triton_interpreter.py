"""Checking Triton kernel files under Triton's interpreter from a process that compiles them: the
harness the kernel tests use, and a chip's new kernels can too. TRITON_INTERPRET=1 must be set before
triton is imported, and ahead-of-time compilation in the same process needs it unset, so the numerics
cases run in child processes.

A test module defines CASES (id -> a function that raises on a mismatch), a module-scoped fixture
that makes an `InterpreterRun` of the selected ids, and calls `child_main(CASES)` under `__main__`:
that is what each child process runs.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.pipeline.kernel_files import KernelFile, kernels_root, load_kernel

RESULT_LINE = "interpreter results: "
Cases = Mapping[str, Callable[[], None]]


@functools.cache
def load(name: str, interpret: bool) -> KernelFile:
    """kernels/triton/<name>.py, loaded (once per process) with TRITON_INTERPRET set or unset for its
    module and the shared modules it pins."""
    before = os.environ.pop("TRITON_INTERPRET", None)
    try:
        if interpret:
            os.environ["TRITON_INTERPRET"] = "1"
        return load_kernel(kernels_root() / "triton" / f"{name}.py")
    finally:
        os.environ.pop("TRITON_INTERPRET", None)
        if before is not None:
            os.environ["TRITON_INTERPRET"] = before


def run_cases(cases: Cases, ids: list[str]) -> dict[str, str | None]:
    """Run cases in this (interpreting) process: None for a pass, else what went wrong."""
    results: dict[str, str | None] = {}
    for case in ids:
        try:
            with np.errstate(invalid="ignore"):  # NaN poison in padding is compared on purpose
                cases[case]()
            results[case] = None
        except AssertionError as e:
            results[case] = str(e)
        except Exception:
            results[case] = traceback.format_exc()
    return results


@functools.cache
def process_interprets() -> bool:
    """Whether triton in this process was imported under TRITON_INTERPRET=1."""
    import triton
    import triton.language as tl

    return not isinstance(tl.standard.max, triton.runtime.JITFunction)


def selected(request: Any) -> list[str]:
    """The ids of the `case`-parametrized tests this session selected in the requesting module."""
    return [
        item.callspec.params["case"]
        for item in request.session.items
        if item.path == request.path and "case" in getattr(getattr(item, "callspec", None), "params", {})
    ]


class InterpreterRun:
    """The selected cases, started at once in child processes running `script` with TRITON_INTERPRET=1
    (one per CPU, at most 4), so that they run while this process compiles; or, when this process
    interprets itself, run here on the first call of `results`."""

    def __init__(self, script: Path, cases: Cases, ids: list[str]) -> None:
        self.cases, self.ids = cases, ids
        self.children: list[subprocess.Popen[str]] = []
        self._results: dict[str, str | None] | None = None
        if ids and not process_interprets():
            workers = max(1, min(len(ids), os.cpu_count() or 1, 4))
            # the child imports what this process imports: same working directory, same import path
            path = os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)
            env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
            for i in range(workers):
                self.children.append(
                    subprocess.Popen(
                        [sys.executable, str(script), *ids[i::workers]],
                        env=env,
                        cwd=os.getcwd(),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )

    def results(self) -> dict[str, str | None]:
        if self._results is None:
            if not self.children:
                self._results = run_cases(self.cases, self.ids)
                return self._results
            results: dict[str, str | None] = {}
            for child in self.children:
                output, _ = child.communicate(timeout=600)
                lines = [line for line in output.splitlines() if line.startswith(RESULT_LINE)]
                if child.returncode != 0 or not lines:
                    raise RuntimeError(
                        f"the interpreter child exited with {child.returncode}:\n{output[-4000:]}"
                    )
                results.update(json.loads(lines[-1][len(RESULT_LINE) :]))
            self._results = results
        return self._results

    def check(self, case: str) -> None:
        """Fail the calling pytest test with the case's failure, if it had one."""
        import pytest

        failure = self.results()[case]
        if failure is not None:
            pytest.fail(failure, pytrace=False)

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.communicate()


def child_main(cases: Cases) -> None:
    """A child process's work: run the ids on its command line (all when none), print the results."""
    print(RESULT_LINE + json.dumps(run_cases(cases, sys.argv[1:] or list(cases))))
