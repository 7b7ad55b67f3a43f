"""The persistent engine on the cpu backend: sandboxed workers holding llama-tiny (forks of a loaded
zygote), driven by the controller over a socketpair and shared memory. Candidates are swapped into a
`linear+residual` group and gated by teacher-forced whole-model numerics against the reference;
faults cost the candidate, never the engine.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from polymorph.engine import protocol
from polymorph.engine.controller import Controller, start_detached
from polymorph.engine.worker import Worker
from polymorph.pipeline.kernel_files import kernels_root

GROUP = "layers.0.mlp.down+residual"
OTHER = "layers.1.attn.o+residual"

HEADER = """
import os, time
import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True
"""

# Forgets the residual: x @ w^T only.
NO_RESIDUAL = (
    HEADER
    + """

def build(spec, config, target):
    x_i, w_i = spec.args(spec.node("linear"))

    def launch(inputs, outputs, scratch):
        x, w = inputs[x_i], inputs[w_i]
        outputs[0].copy_((x.reshape(-1, x.shape[-1]).float() @ w.float().t()).reshape(outputs[0].shape))

    return launch
"""
)

UNWRITTEN = (
    HEADER + "\n\ndef build(spec, config, target):\n    return lambda inputs, outputs, scratch: None\n"
)
RAISES_AT_BUILD = HEADER + "\n\ndef build(spec, config, target):\n    raise RuntimeError('no tile fits')\n"
RAISES_AT_RUN = (
    HEADER
    + "\n\ndef build(spec, config, target):\n"
    + "    def launch(inputs, outputs, scratch):\n        raise IndexError('tile out of range')\n"
    + "    return launch\n"
)
HANGS = (
    HEADER
    + "\n\ndef build(spec, config, target):\n"
    + "    def launch(inputs, outputs, scratch):\n        time.sleep(3600)\n"
    + "    return launch\n"
)
KILLS_PROCESS = (
    HEADER
    + "\n\ndef build(spec, config, target):\n"
    + "    def launch(inputs, outputs, scratch):\n        os._exit(3)\n"
    + "    return launch\n"
)

# Right at the verify scenario's shapes, hangs at the measured bucket's (batch 1, one new token).
HANGS_AT_BUCKET = (
    HEADER
    + """

def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        if tuple(x.shape[:2]) == (1, 1):
            time.sleep(3600)
        outputs[0].copy_((r + x.float() @ w.float().t()).reshape(outputs[0].shape))

    return launch
"""
)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has died)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def running() -> Controller:
    with Controller.start("llama-tiny", backend="cpu", budget_s=20.0) as engine:
        yield engine


@pytest.fixture
def engine(running: Controller) -> Controller:
    running.reset()
    running.budget_s = 20.0
    return running


def candidate(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def correct(tmp_path: Path) -> Path:
    path = tmp_path / "linear_residual_copy.py"
    shutil.copyfile(kernels_root() / "torch" / "linear_residual.py", path)
    with path.open("a") as f:
        f.write("\n# an agent's copy: same code, a different file hash\n")
    return path


def test_correct_candidate_passes_without_reloading_weights(engine: Controller, tmp_path: Path) -> None:
    before = engine.status()
    swap = engine.swap(GROUP, correct(tmp_path))
    assert swap.ok and swap.fault is None
    assert swap.sha256 != before["groups"][GROUP]["sha256"]
    gate = engine.verify()
    assert gate.ok, gate.first_failure()
    assert len(gate.steps) == 7  # three prefills (one as long as the bucket allows), four ragged decodes
    after = engine.status()
    assert after["groups"][GROUP] == {
        "kernel": str(swap.kernel),
        "sha256": swap.sha256,
        "candidate": True,
        "config": None,
    }
    assert after["weight_loads"] == before["weight_loads"] == 1
    assert after["cache_allocations"] == before["cache_allocations"] == 1
    assert after["swaps"] == before["swaps"] + 1
    assert after["pid"] == before["pid"]
    assert engine.accepted == {GROUP: (str(swap.kernel), None)}


def test_wrong_candidate_is_rejected_and_stock_restored(engine: Controller, tmp_path: Path) -> None:
    stock = engine.status()["groups"][GROUP]
    assert engine.swap(GROUP, candidate(tmp_path, "no_residual", NO_RESIDUAL)).ok
    gate = engine.verify()
    assert not gate.ok
    assert [f.stage for f in gate.faults] == ["numerics"]
    assert engine.faults[-1] == gate.faults[0]
    assert engine.status()["groups"][GROUP] == stock
    assert engine.verify().ok  # later steps match again with the stock kernel back


def test_the_stock_plan_runs_beside_a_candidate_without_losing_it(engine: Controller, tmp_path: Path) -> None:
    """`stock_logits`: the same scenario with the group on its stock kernel, the candidate held aside
    in the worker and back in place after it, not loaded again."""
    scenario = engine.scenario(seed=7)
    stock = engine.stock_logits(scenario, [GROUP])  # nothing swapped in yet: the plan as loaded
    assert engine.swap(GROUP, candidate(tmp_path, "no_residual", NO_RESIDUAL)).ok
    swaps = engine.status()["swaps"]
    beside = engine.stock_logits(scenario, [GROUP])
    for want, got in zip(stock, beside, strict=True):
        np.testing.assert_array_equal(got, want)
    status = engine.status()
    assert status["groups"][GROUP]["candidate"] and status["swaps"] == swaps  # held, not swapped again
    result, _ = engine.judge_scenario(scenario, {GROUP: "no_residual"}, swapped=[GROUP])
    assert not result.ok  # the candidate is back: it forgets the residual, far beyond the stock plan
    engine.restore(GROUP)


def test_unwritten_output_never_passes(engine: Controller, tmp_path: Path) -> None:
    assert engine.swap(GROUP, candidate(tmp_path, "unwritten", UNWRITTEN)).ok
    gate = engine.verify()
    assert not gate.ok
    assert "NaN" in gate.faults[0].cause  # outputs are poisoned before every kernel
    assert not engine.status()["groups"][GROUP]["candidate"]


def test_candidate_raising_at_build_is_recorded(engine: Controller, tmp_path: Path) -> None:
    swap = engine.swap(GROUP, candidate(tmp_path, "raises_at_build", RAISES_AT_BUILD))
    assert not swap.ok
    assert swap.fault is not None and swap.fault.stage == "build"
    assert "RuntimeError: no tile fits" in swap.fault.cause
    assert engine.verify().ok


def test_candidate_raising_at_run_is_swapped_out(engine: Controller, tmp_path: Path) -> None:
    assert engine.swap(GROUP, candidate(tmp_path, "raises_at_run", RAISES_AT_RUN)).ok
    pid = engine.pid
    gate = engine.verify()
    assert not gate.ok
    assert gate.faults[0].stage == "run" and "IndexError: tile out of range" in gate.faults[0].cause
    assert engine.pid == pid
    assert not engine.status()["groups"][GROUP]["candidate"]
    assert engine.verify().ok


@pytest.mark.parametrize(
    ("name", "source", "stage"),
    [
        pytest.param("hangs", HANGS, "hang", id="hang"),
        pytest.param("kills", KILLS_PROCESS, "crash", id="crash"),
    ],
)
def test_worker_lost_to_a_candidate_is_replaced(
    engine: Controller, tmp_path: Path, name: str, source: str, stage: str
) -> None:
    good = engine.try_candidate(OTHER, correct(tmp_path))[1]
    assert good is not None and good.ok
    old_pid = engine.pid
    restarts = engine.restarts
    engine.budget_s = 3.0
    assert engine.swap(GROUP, candidate(tmp_path, name, source)).ok
    gate = engine.verify()
    assert not gate.ok
    assert [(f.group, f.stage) for f in gate.faults] == [(GROUP, stage)]
    assert engine.restarts == restarts + 1
    assert engine.pid != old_pid and not alive(old_pid)
    status = engine.status()
    assert status["groups"][OTHER]["candidate"]  # the accepted candidate survives the restart
    assert not status["groups"][GROUP]["candidate"]
    assert engine.verify().ok


def test_candidate_hanging_at_the_loaded_bucket_is_recorded(engine: Controller, tmp_path: Path) -> None:
    """It hangs only at the bucket's own shape: the numerics gate runs that shape, so the hang is caught
    before any timing (tests/engine/test_gates.py has one that hangs only when timed)."""
    old_pid = engine.pid
    engine.budget_s = 3.0
    swap, report = engine.try_candidate(GROUP, candidate(tmp_path, "hangs_at_bucket", HANGS_AT_BUCKET))
    assert swap.ok and report is not None and not report.ok
    assert [(f.group, f.stage) for f in report.faults] == [(GROUP, "hang")]
    assert engine.pid != old_pid and not alive(old_pid)
    assert not engine.status()["groups"][GROUP]["candidate"]
    assert engine.measure("slow", trials=3)["median_s"] > 0


def test_measure_both_tiers(engine: Controller) -> None:
    slow = engine.measure("slow", trials=5)
    assert slow["median_s"] > 0 and slow["spread_s"] >= 0 and slow["trials"] == 5
    fast = engine.measure("fast", trials=5, group=GROUP)
    assert list(fast["groups"]) == [GROUP] and fast["groups"][GROUP]["median_s"] > 0


def test_close_leaves_no_process() -> None:
    """The zygote, the worker and everything they started die with the engine."""
    from polymorph.engine.wire import descendants

    others = set(descendants(os.getpid()))  # the module's running engine
    engine = Controller.start("llama-tiny", backend="cpu")
    assert engine.status()["loaded"]
    pids = [p for p in descendants(os.getpid()) if p not in others]
    assert engine.pid is not None and len(pids) >= 3  # the worker, the sandbox's bootstrap, the zygote
    engine.close()
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    assert not [p for p in pids if alive(p) and p != os.getpid()]


def test_a_swap_after_a_rejected_candidate_runs_in_a_fresh_worker(engine: Controller, tmp_path: Path) -> None:
    """A worker that imported a candidate which is no longer in is retired before the next swap."""
    assert engine.swap(GROUP, candidate(tmp_path, "no_residual", NO_RESIDUAL)).ok
    pid = engine.pid
    assert not engine.verify().ok and engine.pid == pid
    assert engine.swap(GROUP, correct(tmp_path)).ok
    assert engine.pid != pid and not alive(pid)
    assert engine.verify().ok


def test_detached_engine_is_driven_by_attached_controllers(tmp_path: Path) -> None:
    address, pid = start_detached("llama-tiny", "cpu", log=tmp_path / "worker.log")
    try:
        with Controller.attach(address) as first:
            assert first.pid == pid  # the engine's host
            assert all(v == "on" for v in first.layers.values()), first.layers
            swap, gate = first.try_candidate(GROUP, correct(tmp_path))
            assert swap.ok and gate is not None and gate.ok
        assert alive(pid)  # closing an attached controller only disconnects
        second = Controller.attach(address)
        assert second.status()["groups"][GROUP]["candidate"]
        second.shutdown()
        second.close()
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)  # our child here (the CLI's exits and leaves it to init)
        except ChildProcessError:
            pass
    assert not alive(pid)


@pytest.mark.parametrize("where", ["tcp", "unix"])
def test_an_attached_engine_survives_a_candidate_that_kills_or_hangs_its_worker(
    tmp_path: Path, where: str
) -> None:
    """`polymorph engine start` + attached controllers (the CLI's way): a candidate that kills or
    hangs the worker is recorded with its cause; a fresh worker takes the same address with the
    model and the candidates that passed before, so the next attached controller finds it serving."""
    unix = tmp_path / "engine.sock" if where == "unix" else None
    address, pid = start_detached("llama-tiny", "cpu", unix=unix, log=tmp_path / "worker.log")
    try:
        with Controller.attach(address) as engine:
            swap, gate = engine.try_candidate(OTHER, correct(tmp_path))
            assert swap.ok and gate is not None and gate.ok
        for source, how in ((KILLS_PROCESS, "crash"), (HANGS, "hang")):
            bad = tmp_path / f"bad_{how}.py"
            bad.write_text(source)
            with Controller.attach(address, budget_s=5.0) as engine:
                swap, gate = engine.try_candidate(GROUP, bad)
                assert gate is not None and not gate.ok
                assert [(f.group, f.stage) for f in gate.faults] == [(GROUP, how)], gate.faults
                assert engine.restarts == 1
            with Controller.attach(address) as engine:
                status = engine.status()
                assert engine.pid == pid  # the same host, at the same address, with a fresh worker
                assert not status["groups"][GROUP]["candidate"]  # the blamed one is out
                assert status["groups"][OTHER]["candidate"]  # the one that passed before is back
                assert engine.measure("slow", 2)["median_s"] > 0
        with Controller.attach(address) as engine:
            engine.shutdown()
        os.waitpid(pid, 0)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_worker_answers_bad_requests_without_a_model() -> None:
    worker = Worker()
    assert worker.handle({"id": 1, "op": "nope"})["error"]["kind"] == "bad_request"
    assert (
        worker.handle({"id": 2, "op": "swap", "group": GROUP, "path": "x.py"})["error"]["kind"]
        == "not_loaded"
    )
    answer = worker.handle({"id": 3, "op": "status"})
    assert answer["worker_s"] >= 0.0  # how long the op took inside the worker
    assert {**answer, "worker_s": 0.0} == protocol.ok(3, worker.op_status({}), 0.0)


def test_protocol_round_trip() -> None:
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    line = protocol.encode(protocol.ok(7, {"logits": [logits], "n": np.int64(2)}))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = protocol.decode(line)
    assert back["id"] == 7 and back["result"]["n"] == 2
    np.testing.assert_array_equal(back["result"]["logits"][0], logits)
    assert protocol.parse_address("tcp://127.0.0.1:5000") == ("tcp", ("127.0.0.1", 5000))
    assert protocol.parse_address("unix:///tmp/e.sock") == ("unix", "/tmp/e.sock")
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b"[1, 2]")


def test_input_fingerprints_see_every_small_change() -> None:
    """The worker's `_fingerprint` (run_group's inputs-unchanged evidence): one changed word, two
    words swapped, and two sign flips of 8-byte values all show; equal contents agree."""
    import torch

    from polymorph.engine.worker import _fingerprint

    rng = np.random.default_rng()
    for dtype in (torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.uint8):
        x = torch.from_numpy(rng.integers(0, 100, (37, 5))).to(dtype)
        f = _fingerprint(x)
        assert f == _fingerprint(x.clone())
        one = x.clone()
        one[3, 2] += 1
        swapped = x.clone()
        swapped[[0, 1]] = x[[1, 0]]
        assert _fingerprint(one) != f
        assert torch.equal(swapped, x) or _fingerprint(swapped) != f
    # Two rows of equal sums swapped: a plain position weight missed this one (a CI run drew it).
    rows = torch.tensor([[27, 83, 39, 64, 21], [48, 66, 73, 47, 0], [1, 2, 3, 4, 5]], dtype=torch.int32)
    assert _fingerprint(rows[[1, 0, 2]]) != _fingerprint(rows)
    y = torch.arange(1.0, 9.0, dtype=torch.float64)
    flipped = y.clone()
    flipped[[1, 3]] = -flipped[[1, 3]]  # cancels in a sum of int64 words: not in 4-byte words
    assert _fingerprint(flipped) != _fingerprint(y)


def test_an_engine_on_a_backend_without_hot_reload_is_refused(tmp_path: Path) -> None:
    from polymorph.errors import UserError

    with pytest.raises(UserError, match="not `neuron`, which does not declare it"):
        start_detached("llama-tiny", "neuron", log=tmp_path / "worker.log")
