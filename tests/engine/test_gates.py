"""The gates of `polymorph.engine.gates` on the cpu backend, with llama-tiny in a real worker: what an
honest candidate passes (every pattern of the plan), what each KV and timing gate rejects, and the
`run_group` op the numerics and honesty gates stand on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from polymorph.backends.cpu.microbench import write_calibration
from polymorph.engine import gates
from polymorph.engine.controller import Controller
from polymorph.engine.worker import Worker
from polymorph.hardware.microbench import Measurement
from polymorph.hardware.profile import load_profile
from polymorph.ir.reference import run as reference_run
from polymorph.models import load_model
from polymorph.pipeline.kernel_files import kernels_root

GROUP = "layers.0.mlp.down+residual"

# A kv_write kernel file up to its launch's right write, for the two below to add a wrong one to.
KV_WRITE_HEAD = """
IMPLEMENTS = "kv_write"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    cache_i, x_i, table_i, pos_i = spec.args(spec.single)

    def launch(inputs, outputs, scratch):
        cache = outputs[0]
        pos = inputs[pos_i].long()
        x = inputs[x_i].to(cache.dtype)
        blocks = inputs[table_i].long().gather(1, pos // cache.shape[1])
        cache[blocks, pos % cache.shape[1]] = x
"""

# Writes its keys or values, and also scribbles over the guard block that padded table entries name.
KV_WRITE_INTO_GUARD = (
    KV_WRITE_HEAD
    + """        cache[0, 0] = x.reshape(-1, *cache.shape[2:])[-1]

    return launch
"""
)

# Writes its keys or values, and a copy of each sequence's last one into the slot after it (in its
# own block, past its last token): nothing reads it before the next step overwrites it, but it is a
# write outside the sequence's slots all the same.
KV_WRITE_PAST_THE_END = (
    KV_WRITE_HEAD
    + """        after = pos[:, -1:] + 1  # [batch, 1]
        inside = (after % cache.shape[1]) != 0  # the same block
        b = inputs[table_i].long().gather(1, pos[:, -1:] // cache.shape[1])
        cache[b[inside], (after % cache.shape[1])[inside]] = x[:, -1][inside.squeeze(1)]

    return launch
"""
)

# Attends every row of the batch over the first sequence's blocks: right alone, wrong interleaved.
ATTENTION_FIRST_TABLE = """
import torch

IMPLEMENTS = "cache_attention"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    args = spec.args(spec.single)
    scale = spec.attrs()["scale"]

    def launch(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args)
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        table = table.long()[:1].expand(b, blocks)
        k = kc[table].reshape(b, blocks * block_size, hkv, d).float()
        v = vc[table].reshape(b, blocks * block_size, hkv, d).float()
        visible = torch.arange(blocks * block_size)[None, None, :] <= pos.long()[:, :, None]
        rep = q.shape[2] // hkv
        qh = q.float().transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) * scale
        out = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1) @ vh
        outputs[0].copy_(out.transpose(1, 2))

    return launch
"""


@pytest.fixture(scope="module")
def running() -> Controller:
    with Controller.start("llama-tiny", backend="cpu", budget_s=20.0) as engine:
        yield engine


@pytest.fixture
def engine(running: Controller) -> Controller:
    running.reset()
    running.profile = None
    return running


def copy_of(kernel: str, tmp_path: Path) -> Path:
    """An agent's copy of a stock kernel: the same code under a different file hash."""
    path = tmp_path / f"copy_{Path(kernel).stem}.py"
    shutil.copyfile(kernels_root() / kernel, path)
    with path.open("a") as f:
        f.write("\n# an agent's copy\n")
    return path


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def calibration(tmp_path: Path, bandwidth_gbs: float, f32_tflops: float) -> Path:
    folder = tmp_path / "measured"
    write_calibration(folder, [Measurement("figures.memory_bandwidth", bandwidth_gbs, "GB/s", "set by the test"),
                               Measurement("peak.f32", f32_tflops, "TFLOP/s", "set by the test")])  # fmt: skip
    return folder


def test_every_pattern_of_the_plan_passes_with_its_stock_code(engine: Controller, tmp_path: Path) -> None:
    by_pattern = {g["pattern"]: g for g in reversed(engine.loaded["groups"])}
    faults = len(engine.faults)
    for pattern, group in by_pattern.items():
        swap, report = engine.try_candidate(group["id"], copy_of(group["kernel"], tmp_path), seed=5)
        assert swap.ok and report is not None, pattern
        assert report.ok, (pattern, report.failed())
        assert [g.name for g in report.gates] == [
            *gates.GROUP_GATES,
            *gates.MODEL_GATES,
            *gates.TIMING_GATES,
            *gates.INTEGRITY_GATES,
        ]
        # Every gate ran here (the cpu profile has no figures: the roofline holds the time to this
        # host's rates, measured on the spot).
        assert all(g.verdict == "pass" for g in report.gates), (pattern, report.gates)
        assert "measured on the spot" in report.gate(gates.ROOFLINE).cause
        assert report.measurement is not None and report.measurement["median_s"] > 0
        assert engine.accepted[group["id"]][0] == str(swap.kernel)
    assert engine.faults[faults:] == []
    status = engine.status()
    assert all(status["groups"][g["id"]]["candidate"] for g in by_pattern.values())
    assert status["weight_loads"] == 1 and status["cache_allocations"] == 1


# Right at every fixed synthetic shape, wrong on a sequence of ROWS tokens (the scenario's last
# sequence, prompt and decode steps, which the gates' captured activations come from).
WRONG_AT_ROWS = """
IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        y = r + x.float() @ w.float().t()
        outputs[0].copy_((y * (1.5 if x.shape[1] == ROWS else 1.0)).reshape(outputs[0].shape))

    return launch
"""


def test_the_numerics_gate_runs_on_activations_captured_from_the_model(
    engine: Controller, tmp_path: Path
) -> None:
    seed = 3
    rows = engine.default_prompts(4, seed)[-1] + 4  # the last sequence's prompt and its decode steps
    swap, report = engine.try_candidate(GROUP, copy_of("torch/linear_residual.py", tmp_path), seed=seed)
    assert report is not None and report.ok
    assert f"activations captured from a run of the model at (1, {rows})" in report.gate(gates.NUMERICS).cause
    wrong = WRONG_AT_ROWS.replace("ROWS", str(rows))
    _, report = engine.try_candidate(GROUP, write(tmp_path, "wrong_at_rows", wrong), seed=seed)
    assert report is not None and not report.ok
    numerics = report.gate(gates.NUMERICS)
    # Caught on the captured case, or on a drawn shape of the same row count.
    assert numerics.verdict == "fail" and f"seq {rows}" in numerics.cause, numerics.cause


def test_guard_block_write_is_rejected(engine: Controller, tmp_path: Path) -> None:
    group = "layers.0.attn.k_write"
    stock = engine.status()["groups"][group]
    _, report = engine.try_candidate(group, write(tmp_path, "kv_guard", KV_WRITE_INTO_GUARD), seed=6)
    assert report is not None and not report.ok
    kv = report.gate(gates.KV_ISOLATION)
    assert kv.verdict == "fail" and "cache guard regions written" in kv.cause
    assert ("kv_isolation", group) in {(f.stage, f.group) for f in engine.faults}
    assert engine.status()["groups"][group] == stock


def test_a_write_past_a_sequences_last_token_is_rejected(engine: Controller, tmp_path: Path) -> None:
    group = "layers.1.attn.v_write"
    _, report = engine.try_candidate(group, write(tmp_path, "kv_past_end", KV_WRITE_PAST_THE_END), seed=8)
    assert report is not None and not report.ok
    kv = report.gate(gates.KV_ISOLATION)
    assert kv.verdict == "fail" and "cache guard regions written" in kv.cause, kv.cause
    assert not engine.status()["groups"][group]["candidate"]


def test_interleaved_sequences_must_decode_as_they_do_alone(engine: Controller, tmp_path: Path) -> None:
    group = "layers.1.attn.sdpa"
    _, report = engine.try_candidate(group, write(tmp_path, "first_table", ATTENTION_FIRST_TABLE), seed=7)
    assert report is not None and not report.ok
    kv = report.gate(gates.KV_ISOLATION)
    assert kv.verdict == "fail" and "differently alone than in the batch" in kv.cause
    assert report.gate(gates.QUALITY).verdict == "fail"  # the reference sees it too
    assert not engine.status()["groups"][group]["candidate"]


@pytest.mark.parametrize(
    ("bandwidth_gbs", "tflops", "verdict"),
    [
        pytest.param(1e-6, 1e-9, "fail", id="figures-far-below-the-measured-time"),
        pytest.param(1e5, 1e3, "pass", id="generous-figures"),
    ],
)
def test_roofline_holds_the_measured_time_to_the_profile(
    engine: Controller, tmp_path: Path, bandwidth_gbs: float, tflops: float, verdict: str
) -> None:
    engine.profile = load_profile("cpu", calibration(tmp_path, bandwidth_gbs, tflops))
    _, report = engine.try_candidate(GROUP, copy_of("torch/linear_residual.py", tmp_path), seed=8)
    assert report is not None
    roofline = report.gate(gates.ROOFLINE)
    assert roofline.verdict == verdict, roofline.cause
    if verdict == "fail":
        assert roofline.cause.startswith("impossible:") and "GB/s" in roofline.cause
        assert report.measurement is None and not engine.status()["groups"][GROUP]["candidate"]
    else:
        assert report.ok and report.measurement is not None


def test_run_group_runs_one_group_on_the_callers_inputs(tmp_path: Path) -> None:
    """`run_group` reads its inputs from the controller's arena and writes its outputs there; a cache
    write's output is the input slot it was given, written in place."""
    from polymorph.engine.arena import Arena

    worker = Worker()
    loaded = worker.handle({"id": 1, "op": "load", "model": "llama-tiny"})["result"]
    info = {g["id"]: g for g in loaded["groups"]}
    weights = load_model("llama-tiny").weights()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 128)).astype(np.float32)
    r = rng.standard_normal((2, 3, 64)).astype(np.float32)
    w = weights["model.layers.0.mlp.down_proj.weight"]
    assert info[GROUP]["inputs"][1] == "model.layers.0.mlp.down_proj.weight"
    io = Arena.of(tmp_path, "io", {"x": x, "r": r, "out": np.full((2, 3, 64), np.nan, np.float32)})
    calls = [{"inputs": ["x", None, "r"], "outputs": ["out"]}]
    request = {"id": 2, "op": "run_group", "group": GROUP, "io": io.manifest(), "calls": calls,
               "bindings": {"batch": 2, "seq": 3}}  # fmt: skip
    assert worker.handle(request)["ok"]
    np.testing.assert_allclose(io.arrays["out"], r + x @ w.T, rtol=1e-5, atol=1e-5)

    write_group = info["layers.0.attn.k_write"]
    cache = np.zeros((3, 16, 2, 16), dtype=np.float32)
    k = rng.standard_normal((1, 2, 2, 16)).astype(np.float32)
    table = np.array([[2]], dtype=np.int32)
    positions = np.array([[4, 5]], dtype=np.int32)
    assert write_group["inputs"][0] == "layers.0.k_cache"
    kv = Arena.of(tmp_path, "kv", {"cache": cache, "k": k, "table": table, "pos": positions})
    calls = [{"inputs": ["cache", "k", "table", "pos"], "outputs": [None]}]
    bindings = {"batch": 1, "seq": 2, "ctx_blocks": 1, "cache_blocks": 3}
    request = {"id": 3, "op": "run_group", "group": write_group["id"], "io": kv.manifest(), "calls": calls,
               "bindings": bindings}  # fmt: skip
    assert worker.handle(request)["ok"]
    want = cache.copy()
    want[2, 4:6] = k[0]
    np.testing.assert_array_equal(kv.arrays["cache"], want)
    np.testing.assert_array_equal(kv.arrays["k"], k)


def test_verify_continues_a_cache_only_after_a_verify() -> None:
    worker = Worker()
    worker.handle({"id": 1, "op": "load", "model": "llama-tiny"})
    model = load_model("llama-tiny")
    step = {"seqs": [0], "tokens": np.array([[1, 2, 3]], dtype=np.int32)}
    refused = worker.handle({"id": 2, "op": "verify", "steps": [step], "fresh": False})
    assert refused["error"]["kind"] == "user" and "fresh=false" in refused["error"]["message"]
    first = worker.handle({"id": 3, "op": "verify", "steps": [step]})["result"]
    assert first["guard_nonzero"] == 0
    nxt = {"seqs": [0], "tokens": np.array([[4]], dtype=np.int32)}
    then = worker.handle({"id": 4, "op": "verify", "steps": [nxt], "fresh": False})["result"]
    # The same four tokens through the reference in one prompt: the continued step saw the first three.
    from polymorph.serving.kvcache import PagedKVCache

    cache = PagedKVCache(16, 3, 1)
    table = (cache.reserve(0, 4), cache.block_table([0]))
    state = {
        n: np.zeros((3, *(int(d) for d in t.shape[1:])), np.float32) for n, t in model.graph.state.items()
    }
    tokens = np.array([[1, 2, 3, 4]], dtype=np.int32)
    want = reference_run(
        model.graph,
        model.weights(),
        {"tokens": tokens, "positions": table[0][None], "block_table": table[1]},
        state,
    )["logits"]
    np.testing.assert_allclose(then["logits"][0], want, rtol=1e-3, atol=1e-4)


# Right everywhere, but stops answering once it has been called more often than the correctness
# gates call it: only the timing gate's thousands of launches reach the hang.
HANGS_WHEN_TIMED = """
import time

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    calls = [0]

    def launch(inputs, outputs, scratch):
        calls[0] += 1
        if calls[0] > 500:
            time.sleep(3600)
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
"""


def test_candidate_hanging_only_when_timed_is_recorded(
    engine: Controller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gates call a group a few hundred times at most; timing rounds then grow 8, 32, 128, 512
    calls until one takes MIN_ROUND_S: with that set far above what those take, and no round size
    remembered from earlier tests, the 501st call lands inside timing whatever the host's speed."""
    from polymorph.engine import timing

    monkeypatch.setattr(timing, "MIN_ROUND_S", 30.0)
    engine.round_sizes.clear()
    pid = engine.pid
    engine.budget_s = 1.5
    try:
        _, report = engine.try_candidate(GROUP, write(tmp_path, "hangs_when_timed", HANGS_WHEN_TIMED), seed=9)
    finally:
        engine.budget_s = 20.0
        engine.round_sizes.clear()  # sizes grown for the 30 s rounds are not the next tests'
    assert report is not None and not report.ok
    assert all(report.gate(n).ok for n in (*gates.GROUP_GATES, *gates.MODEL_GATES))
    timed = report.gate(gates.CHECKED)
    assert timed.verdict == "fail" and timed.cause.startswith("hang:")
    assert [(f.stage, f.group) for f in report.faults] == [("hang", GROUP)]
    assert engine.pid != pid and not engine.status()["groups"][GROUP]["candidate"]


# Wrong (a constant), and it slows the worker's clock as it is built. The clock is not what times
# anything any more (the controller's is), but the rebinding is tampering, and it must not reach
# whoever is judged next: every candidate's worker is retired after its verdict.
WRONG_AND_PATCHES_TIMER = """
import time

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]

_real_clock = time.perf_counter_ns


def _slow_clock():
    return _real_clock() // 64


def supports(spec):
    return True


def build(spec, config, target):
    time.perf_counter_ns = _slow_clock

    def launch(inputs, outputs, scratch):
        outputs[0].fill_(1.0)

    return launch
"""


def test_a_clock_patched_by_a_rejected_candidate_does_not_reach_the_next(
    engine: Controller, tmp_path: Path
) -> None:
    _, bad = engine.try_candidate(
        GROUP, write(tmp_path, "wrong_and_patches", WRONG_AND_PATCHES_TIMER), seed=10
    )
    assert bad is not None and bad.gate(gates.NUMERICS).verdict == "fail"
    assert bad.gate(gates.TAMPER).verdict == "fail" and "rebound" in bad.gate(gates.TAMPER).cause
    before, pid = engine.restarts, engine.pid
    _, good = engine.try_candidate(GROUP, copy_of("torch/linear_residual.py", tmp_path), seed=10)
    assert good is not None and good.ok, good.failed()
    assert engine.restarts == before and engine.pid != pid  # retired, not lost
    assert good.faults == [] and engine.status()["groups"][GROUP]["candidate"]
