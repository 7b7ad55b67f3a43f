"""The cpu microbenchmark's curves (backends/cpu/microbench.py): the quick suite writes a calibration
file that polymorph.hardware.profile loads as an overlay on the `cpu` profile, and the cost model's prediction for a
llama-tiny decode step is computed from it and printed beside a measured step. Timings are printed,
never asserted: only that they are positive and finite, and that the prediction names every group."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from polymorph import api
from polymorph.backends.cpu import microbench
from polymorph.cost import model as costmodel
from polymorph.errors import UserError
from polymorph.hardware import profile as hw
from polymorph.serving.session import Session


@pytest.fixture(scope="module")
def suite() -> microbench.SuiteResult:
    # One thread: what the cpu executable runs llama-tiny on (runtime._auto_threads).
    return microbench.run_suite(quick=True, threads=1)


@pytest.fixture(scope="module")
def calibration_dir(suite: microbench.SuiteResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("measured")
    microbench.write_calibration(folder, suite)
    return folder


def test_the_quick_suite_loads_as_the_cpu_profiles_overlay(calibration_dir: Path) -> None:
    cpu = hw.load_profile("cpu", calibration_dir)
    cal = cpu.calibration
    assert cal is not None and cal.path == str(calibration_dir / "cpu.toml")
    assert {c.name for c in cal.curves} == {
        "read_bandwidth",
        "copy_bandwidth",
        "attention_decode",
        "matmul.f32",
        "matmul.bf16",
    }
    for name in ("read_bandwidth", "copy_bandwidth"):
        curve = cal.curve(name)
        assert curve is not None and curve.unit == "GB/s"
        assert [p.size for p in curve.points] == list(microbench.QUICK_BANDWIDTH_SIZES)
    for key in ("f32", "bf16"):
        curve = cal.curve(f"matmul.{key}")
        assert curve is not None
        shapes = {(m, w, w) for w in microbench.QUICK_MATMUL_WIDTHS for m in microbench.QUICK_MATMUL_ROWS}
        assert {p.shape for p in curve.points} == shapes
        assert all(p.size == 2.0 * math.prod(p.shape or ()) for p in curve.points)
    for curve in cal.curves:
        assert curve.method and all(math.isfinite(p.si) and p.si > 0 for p in curve.points)
        assert all(p.spread is not None and p.spread >= 0 for p in curve.points)
    assert cal.launch_overhead is not None and 0 < cal.launch_overhead.si < 1e-2
    assert cal.step_overhead is not None and 0 < cal.step_overhead.si < 1e-1
    assert (
        cal.op_overhead is not None
        and 0 < cal.op_overhead.si < 1e-3
        and "mean of 6" in cal.op_overhead.source
    )
    assert cpu.memory_bandwidth() is not None and cpu.peak_flops("bf16") is not None
    assert any(row.label.endswith("(measured)") for row in cpu.describe())


def test_the_suite_iterates_as_rows_for_the_cli(suite: microbench.SuiteResult) -> None:
    rows = list(suite)
    assert len(rows) == len(suite.figures) + 3 + len(suite.curves)
    names = {r.name for r in rows}
    assert names >= {
        "figures.memory_bandwidth",
        "launch_overhead",
        "step_overhead",
        "op_overhead",
        "curves.matmul.bf16",
    }
    assert all(r.value > 0 and r.unit and r.method for r in rows)
    assert all(c.method.endswith(", 1 thread") for c in suite.curves)


def test_the_suite_restores_the_thread_count_and_refuses_zero_threads() -> None:
    before = torch.get_num_threads()
    with pytest.raises(UserError, match="threads must be >= 1"):
        microbench.run_suite(quick=True, threads=0)
    assert torch.get_num_threads() == before


def test_predicted_llama_tiny_step_beside_a_measured_one(calibration_dir: Path) -> None:
    artifact = api.compile("llama-tiny", "cpu", batch=1, ctx=64)
    cpu = hw.load_profile("cpu", calibration_dir)
    prediction = costmodel.predict(artifact.plan, cpu)
    assert [k.group for k in prediction.kernels] == [g.id for g in artifact.plan.groups]
    assert prediction.calibrated
    assert all(math.isfinite(k.predicted_s) and k.predicted_s > 0 for k in prediction.kernels)

    exe = api.load(artifact)
    session = Session(exe, artifact.plan.graph, batch=1, max_ctx=64)
    rng = np.random.default_rng(0)
    session.step([0], rng.integers(0, 256, size=(1, 8)))
    times = []
    for token in rng.integers(0, 256, size=40):
        t0 = time.perf_counter()
        session.step([0], np.array([[token]]))
        times.append(time.perf_counter() - t0)
    measured = statistics.median(times)
    print(
        f"llama-tiny decode step, batch 1, ctx <= 64, cpu: predicted {prediction.step_s * 1e6:.1f} us "
        f"({len(prediction.kernels)} kernels, {prediction.basis}); measured median {measured * 1e6:.1f} us "
        f"over {len(times)} steps (ratio {measured / prediction.step_s:.2f})"
    )
    assert math.isfinite(measured) and measured > 0
    assert math.isfinite(prediction.step_s) and prediction.step_s > 0
    assert prediction.footprint.total_bytes > prediction.footprint.weights_bytes > 0

    # A measured pass (each group's time where it runs inside whole steps) on layer 0 refines the
    # prediction for layer 1 and the rest of each measured pattern.
    inputs = {
        "tokens": np.array([[1]], dtype=np.int32),
        "positions": np.array([[8]], dtype=np.int32),
        "block_table": session.cache.block_table([0]),
    }
    measured_groups, _ = exe.time_in_step(lambda: inputs, 10)
    fit = {g: s for g, s in measured_groups.items() if not g.startswith("layers.1.")}
    refined = prediction.refine(fit)
    held_out = [g for g in measured_groups if g.startswith("layers.1.")]
    print(
        f"refined on {len(fit)} groups: layer 1 predicted {sum(refined.row(g).predicted_s for g in held_out) * 1e6:.1f} us "
        f"(unrefined {sum(prediction.row(g).predicted_s for g in held_out) * 1e6:.1f} us), measured "
        f"{sum(measured_groups[g] for g in held_out) * 1e6:.1f} us; step predicted {refined.step_s * 1e6:.1f} us; "
        + ", ".join(f"{p} x{f:.3g}" for p, f in sorted(refined.scales.items()))
    )
    assert set(measured_groups) == {g.id for g in artifact.plan.groups}
    assert all(math.isfinite(f) and f > 0 for f in refined.scales.values())


CURVE_HEAD = """
schema_version = 1
profile = "cpu"
[provenance]
date = 2026-11-20
device = "test cpu"
driver = "6.0"
commit = "abc1234"
[provenance.toolchain]
python = "3.11.7"
"""


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            '[curves.read_bandwidth]\nunit = "GB/s"\nmethod = "m"\nbytes = [1, 2]\nvalues = [3.0]',
            "`curves.read_bandwidth.bytes` must be a list as long as `values` (1)",
        ),
        (
            '[curves.write_bandwidth]\nunit = "GB/s"\nmethod = "m"\nbytes = [1]\nvalues = [3.0]',
            "unknown field `curves.write_bandwidth`",
        ),
        (
            '[curves.matmul.f32]\nunit = "TFLOP/s"\nmethod = "m"\nshapes = [[1, 2]]\nvalues = [3.0]',
            "`curves.matmul.f32.shapes[0]` must be [M, K, N] positive ints",
        ),
        (
            '[curves.copy_bandwidth]\nunit = "GB/s"\nmethod = "m"\nbytes = [4, 4]\nvalues = [3.0, 2.0]',
            "lists a size twice",
        ),
        (
            '[curves.copy_bandwidth]\nunit = "TFLOP/s"\nmethod = "m"\nbytes = [4]\nvalues = [3.0]',
            "`curves.copy_bandwidth.unit` is 'TFLOP/s'",
        ),
        (
            '[curves.copy_bandwidth]\nunit = "GB/s"\nbytes = [4]\nvalues = [3.0]',
            "`curves.copy_bandwidth.method` is missing",
        ),
        ('[launch_overhead]\nvalue = 2\nunit = "GB/s"\nmethod = "m"', "`launch_overhead.unit` is 'GB/s'"),
    ],
)
def test_a_bad_curve_is_refused_naming_the_file_and_field(tmp_path: Path, table: str, expected: str) -> None:
    path = tmp_path / "cpu.toml"
    path.write_text(CURVE_HEAD + table + "\n")
    with pytest.raises(UserError) as err:
        hw.load_profile("cpu", tmp_path)
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)
