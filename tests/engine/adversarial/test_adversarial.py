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
from polymorph.pipeline.kernel_files import kernels_root

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
    # The gate that must reject it (None: the one running when the worker was lost), or gates one of
    # which must.
    gate: str | tuple[str, ...] | None
    stage: str  # the recorded fault's stage (the gate's name, or hang/crash when the worker is lost)
    cause: str | tuple[str, ...]  # text the recorded cause contains (or one of several texts)
    restarts: int = 0  # workers lost (beyond the retirement every candidate's worker gets)
    group: str = GROUP
    at_build: bool = False  # its attack runs at build: the swap itself fails


ATTENTION = "layers.0.attn.sdpa"


def _says(text: str, expected: str | tuple[str, ...]) -> bool:
    return any(e in text for e in ((expected,) if isinstance(expected, str) else expected))


# Ordered so that the kinds that cost the worker are spread out.
TRICKS = [
    Trick("unwritten_output.py", gates.NUMERICS, gates.NUMERICS, "NaN in output"),
    Trick("patched_timer.py", gates.TAMPER, gates.TAMPER, "rebound"),
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
    # Which gate sees a late write depends on when the freeze lands after the answer: within the settle
    # window, completion; before the write, the outputs are unwritten (numerics, output_prefill); on a
    # loaded host the freeze can come after the 20 ms write for some calls, and a later gate sees it.
    Trick(
        "late_write_thread.py",
        (gates.COMPLETION, gates.NUMERICS, gates.OUTPUT_PREFILL, gates.CHECKED),
        gates.COMPLETION,
        "",
    ),
    Trick("low_precision.py", gates.NUMERICS, gates.NUMERICS, "rounding of bf16"),
    Trick("raises_at_run.py", gates.NUMERICS, gates.NUMERICS, "raised IndexError: tile 3 out of range"),
    Trick("segfault.py", gates.NUMERICS, "crash", "the worker died", restarts=1),
    Trick("exhausts_memory.py", gates.NUMERICS, gates.NUMERICS, "allocate"),
    Trick("breaks_device.py", gates.NUMERICS, "canary", "illegal memory access", restarts=1),
    # Telling timing from gates: the timed calls are checked afterwards.
    # A call within 1 ms of its last skips the work: the timing rounds always call so, the whole-model
    # runs of quality and kv_isolation where a step is that fast (a loaded or fast host).
    Trick(
        "detects_timing_rate.py",
        (gates.CHECKED, gates.QUALITY, gates.KV_ISOLATION),
        gates.CHECKED,
        ("timed calls checked afterwards are wrong", "NaN in output"),
    ),
    Trick(
        "detects_timing_stack.py", gates.CHECKED, gates.CHECKED, "timed calls checked afterwards are wrong"
    ),
    Trick("memoizes_by_address.py", gates.NUMERICS, gates.NUMERICS, "max error"),
    # Tampering with what measures and judges.
    Trick("patches_torch.py", gates.TAMPER, gates.TAMPER, "rebound"),
    Trick("damages_weights_later.py", None, "crash", "the worker died", restarts=1),
    # Its child either has not written yet when the worker is frozen (the poison is still there) or
    # has (the slots changed after the answer: the answer's digest no longer matches): which one is
    # a race the machine's load decides; both are rejected by the numerics gate.
    Trick(
        "finishes_in_child.py", gates.NUMERICS, gates.NUMERICS, ("NaN in output", "after the worker answered")
    ),
    Trick("forges_answer_digest.py", gates.NUMERICS, gates.NUMERICS, "after the worker answered"),
    # Shapes the model-level scenario does not reach.
    Trick("short_context_attention.py", gates.NUMERICS, gates.NUMERICS, "max error", group=ATTENTION),
    Trick("batched_kv_leak.py", gates.NUMERICS, gates.NUMERICS, "max error", group=ATTENTION),
    # Reaching outside: the sandbox stops each, and the candidate is rejected for trying.
    Trick("reads_registry.py", None, "sandbox", "Permission denied", at_build=True),
    Trick("connects_tcp.py", gates.SANDBOX, gates.SANDBOX, "Operation not permitted"),
    Trick("reads_parent_memory.py", None, "sandbox", "Permission denied", at_build=True),
    Trick("signals_group.py", None, "crash", "the worker died", restarts=1, at_build=True),
    Trick("leaves_daemon.py", gates.SANDBOX, gates.SANDBOX, "process(es) running in the worker"),
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
    swap, report = engine.try_candidate(trick.group, HERE / trick.file, seed=seed)
    faults = engine.faults[recorded:]
    if trick.at_build:
        assert not swap.ok and report is None, trick.file
        assert faults == [swap.fault]
    else:
        assert swap.ok and report is not None, (trick.file, swap)  # it builds; the gates catch it
        assert not report.ok and report.measurement is None
        if isinstance(trick.gate, tuple):
            failed = [g for g in report.gates if g.name in trick.gate and g.verdict == "fail"]
            assert failed, (trick.file, report.gates)
        elif trick.gate is not None:
            gate = report.gate(trick.gate)
            assert gate.verdict == "fail" and _says(gate.cause, trick.cause), (trick.file, gate)
        assert faults == report.faults
    stages = trick.gate if isinstance(trick.gate, tuple) else (trick.stage,)
    assert any(f.stage in stages and _says(f.cause, trick.cause) for f in faults), (trick.file, faults)
    assert all(f.group == trick.group and f.kernel == str(HERE / trick.file) for f in faults)
    assert engine.restarts == restarts + trick.restarts, trick.file
    assert engine.pid != pid, trick.file  # whatever the verdict, the worker it ran in is retired
    assert trick.group not in engine.accepted and trick.group not in engine.pending


@pytest.mark.parametrize("trick", TRICKS, ids=[t.file.removesuffix(".py") for t in TRICKS])
def test_trick_is_rejected_with_its_cause(engine: Controller, trick: Trick, tmp_path: Path) -> None:
    if trick.stage == "hang":
        engine.budget_s = HANG_BUDGET_S
    assert_rejected(engine, trick, seed=11)
    engine.budget_s = BUDGET_S
    assert not engine.status()["groups"][trick.group]["candidate"]
    assert engine.link.processes() == 0  # nothing it started is left
    # The engine still serves, and an honest candidate still passes every gate.
    swap, report = engine.try_candidate(GROUP, good_candidate(tmp_path), seed=12)
    assert report is not None and report.ok, report.failed() if report else swap


@pytest.mark.slow
def test_a_hundred_bad_candidates_leave_the_engine_serving(running: Controller, tmp_path: Path) -> None:
    engine = running
    engine.reset()
    engine.budget_s = SHORT_BUDGET_S
    weight_loads = []
    for i, trick in zip(range(100), itertools.cycle(TRICKS), strict=False):
        assert_rejected(engine, trick, seed=i)
        weight_loads.append(engine.status()["weight_loads"])
    assert set(weight_loads) == {1}  # every worker a fork of the loaded zygote, never a second load
    engine.budget_s = BUDGET_S
    status = engine.status()
    assert status["loaded"] and not any(g["candidate"] for g in status["groups"].values())
    swap, report = engine.try_candidate(GROUP, good_candidate(tmp_path), seed=100)
    assert report is not None and report.ok, report.failed() if report else swap
    assert engine.status()["groups"][GROUP]["candidate"]
