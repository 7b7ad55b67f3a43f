"""Candidates that cheat or break, one kernel file per trick beside this module, each a real file a
swap loads into llama-tiny's `linear+residual` group. Each must be rejected by the gate that names
its trick, with that cause recorded, and leave the engine serving.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from polymorph.engine import gates
from polymorph.engine.controller import Controller
from polymorph.kernel_files import kernels_root

HERE = Path(__file__).parent
GROUP = "layers.0.mlp.down+residual"
BUDGET_S = 20.0
HANG_BUDGET_S = 2.0  # the infinite loop costs this much per run, then a restart
# A hundred candidates: every honest request answers in well under this (at 1 s, a timing request on a
# loaded 2-core machine once took 1.02 s and its candidate's cause read as a hang).
SHORT_BUDGET_S = 3.0


@dataclass(frozen=True)
class Trick:
    file: str
    gate: str  # the gate that must reject it
    stage: str  # the recorded fault's stage (the gate's name, or hang/crash when the worker is lost)
    cause: str  # text the recorded cause contains
    restarts: int = 0  # workers replaced (lost, or with a timer that can no longer be trusted)


# Ordered so that the kinds that cost the worker are spread out: its standby has time to start.
TRICKS = [
    Trick("unwritten_output.py", gates.NUMERICS, gates.NUMERICS, "NaN in output"),
    Trick("patched_timer.py", gates.WALL_CLOCK, gates.WALL_CLOCK, "replaced by a candidate", restarts=1),
    Trick(
        "cached_answer.py",
        gates.INPUT_DEPENDENCE,
        gates.INPUT_DEPENDENCE,
        "did not change when the inputs did",
    ),
    Trick("mutates_inputs.py", gates.INPUTS_UNCHANGED, gates.INPUTS_UNCHANGED, "mutated inputs"),
    Trick("infinite_loop.py", gates.NUMERICS, "hang", "no answer to", restarts=1),
    Trick("constant_output.py", gates.INPUT_DEPENDENCE, gates.INPUT_DEPENDENCE, "constant or cached answer"),
    Trick("shape_specialized.py", gates.NUMERICS, gates.NUMERICS, "seq "),
    Trick("exits_process.py", gates.NUMERICS, "crash", "the worker died", restarts=1),
    Trick("late_write_thread.py", gates.COMPLETION, gates.COMPLETION, "work still running after return"),
    Trick("low_precision.py", gates.NUMERICS, gates.NUMERICS, "rounding of bf16"),
    Trick("raises_at_run.py", gates.NUMERICS, gates.NUMERICS, "raised IndexError: tile 3 out of range"),
    Trick("segfault.py", gates.NUMERICS, "crash", "the worker died", restarts=1),
    Trick("exhausts_memory.py", gates.NUMERICS, gates.NUMERICS, "allocate"),
    Trick("breaks_device.py", gates.NUMERICS, "canary", "illegal memory access", restarts=1),
]


@pytest.fixture(scope="module")
def running() -> Controller:
    with Controller.start("llama-tiny", backend="cpu", budget_s=BUDGET_S) as engine:
        yield engine


@pytest.fixture
def engine(running: Controller) -> Controller:
    running.reset()
    running.budget_s = BUDGET_S
    return running


def good_candidate(tmp_path: Path) -> Path:
    path = tmp_path / "linear_residual_copy.py"
    shutil.copyfile(kernels_root() / "torch" / "linear_residual.py", path)
    with path.open("a") as f:
        f.write("\n# an agent's copy: same code, a different file hash\n")
    return path


def assert_rejected(engine: Controller, trick: Trick, seed: int) -> None:
    pid, restarts, recorded = engine.pid, engine.restarts, len(engine.faults)
    swap, report = engine.try_candidate(GROUP, HERE / trick.file, seed=seed)
    assert swap.ok and report is not None, trick.file  # every trick builds; the gates catch it
    assert not report.ok and report.measurement is None
    gate = report.gate(trick.gate)
    assert gate.verdict == "fail" and trick.cause in gate.cause, (trick.file, gate)
    faults = engine.faults[recorded:]
    assert faults == report.faults
    assert any(f.stage == trick.stage and trick.cause in f.cause for f in faults), (trick.file, faults)
    assert all(f.group == GROUP and f.kernel == str(HERE / trick.file) for f in faults)
    assert (engine.restarts, engine.pid != pid) == (restarts + trick.restarts, trick.restarts > 0), trick.file
    assert GROUP not in engine.accepted and GROUP not in engine.pending


@pytest.mark.parametrize("trick", TRICKS, ids=[t.file.removesuffix(".py") for t in TRICKS])
def test_trick_is_rejected_with_its_cause(engine: Controller, trick: Trick, tmp_path: Path) -> None:
    if trick.stage == "hang":
        engine.budget_s = HANG_BUDGET_S
    assert_rejected(engine, trick, seed=11)
    engine.budget_s = BUDGET_S
    assert not engine.status()["groups"][GROUP]["candidate"]
    # The engine still serves, and an honest candidate still passes every gate.
    swap, report = engine.try_candidate(GROUP, good_candidate(tmp_path), seed=12)
    assert report is not None and report.ok, report.failed() if report else swap


@pytest.mark.slow
def test_a_hundred_bad_candidates_leave_the_engine_serving(running: Controller, tmp_path: Path) -> None:
    engine = running
    engine.reset()
    engine.budget_s = SHORT_BUDGET_S
    engine.standby = 2  # three restarts in every ten candidates outrun one standby's start-up
    weight_loads = []
    for i, trick in zip(range(100), itertools.cycle(TRICKS), strict=False):
        assert_rejected(engine, trick, seed=i)
        weight_loads.append(engine.status()["weight_loads"])
    assert set(weight_loads) == {1}  # a fresh worker after each restart, never a second load in one
    engine.budget_s = BUDGET_S
    engine.standby = 1
    status = engine.status()
    assert status["loaded"] and not any(g["candidate"] for g in status["groups"].values())
    swap, report = engine.try_candidate(GROUP, good_candidate(tmp_path), seed=100)
    assert report is not None and report.ok, report.failed() if report else swap
    assert engine.status()["groups"][GROUP]["candidate"]
