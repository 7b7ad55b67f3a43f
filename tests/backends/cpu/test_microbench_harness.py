"""The shared microbenchmark harness (polymorph/hardware/microbench.py) without a GPU: a GPU-shaped suite result
(what backends/gpu/microbench.py returns on an H200) written by the shared writer loads back through
polymorph.hardware.profile as the `h200` profile's calibration, value for value; the writer refuses what the loader
would; and the GPU suite refuses cleanly on a machine without a GPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from polymorph.backends.gpu import microbench as gpu_microbench
from polymorph.errors import UserError
from polymorph.hardware import microbench
from polymorph.hardware import profile as hw
from polymorph.hardware.microbench import GIB, MIB, CurveMeasurement, Measurement, SuiteResult

TOOLCHAIN = {"python": "3.12.3", "torch": "2.11.0+cu128", "triton": "3.6.0", "cuda": "12.8"}
COMMAND = "polymorph microbench --backend cuda --target h200"


def gpu_shaped_result() -> SuiteResult:
    sizes = gpu_microbench.BANDWIDTH_SIZES
    shapes = tuple((m, k, n) for k, n in gpu_microbench.MATMUL_WEIGHTS for m in gpu_microbench.MATMUL_ROWS)
    # Rates that grow with the call, as measured ones do; distinct so that a mix-up shows.
    bandwidth = tuple(1000.0 + 500 * i for i in range(len(sizes)))
    rates = tuple(0.5 + 4.25 * i for i in range(len(shapes)))
    curves = [
        CurveMeasurement("read_bandwidth", "GB/s", "torch.sum, bytes read", sizes, bandwidth, (0.02,) * 6),
        CurveMeasurement("copy_bandwidth", "GB/s", "torch copy_", sizes, bandwidth[::-1], (0.0,) * 6),
        *(
            CurveMeasurement(
                f"matmul.{key}", "TFLOP/s", f"linear in {key}", shapes, rates, (0.01,) * len(shapes)
            )
            for key in ("bf16", "f16")
        ),
    ]
    figures = [
        Measurement("figures.memory_bandwidth", bandwidth[-1], "GB/s", "read at 1 GiB"),
        Measurement("peak.bf16", 788.5, "TFLOP/s", "8192^3 GEMM", note="spread 1%"),
    ]
    overhead = Measurement("launch_overhead", 2.25, "us", "CUDA graph replay", note="host 4.1 us")
    unrecorded = [Measurement("allreduce.bus_bandwidth", 370.0, "GB/s", "all_reduce over 8 devices")]
    return SuiteResult(figures, overhead, curves, unrecorded)


def write(folder: Path, results: SuiteResult | list[Measurement], device: str = "NVIDIA H200") -> Path:
    return microbench.write_calibration(
        folder, "h200", results, device=device, driver="570.124.06", toolchain=TOOLCHAIN, command=COMMAND
    )


def test_a_gpu_shaped_result_round_trips_through_the_h200_profile(tmp_path: Path) -> None:
    results = gpu_shaped_result()
    path = write(tmp_path, results)
    assert path == tmp_path / "h200.toml" and not list(tmp_path.glob("*.tmp"))

    h200 = hw.load_profile("h200", tmp_path)
    cal = h200.calibration
    assert cal is not None and cal.path == str(path)
    assert (cal.device, cal.driver, cal.command) == ("NVIDIA H200", "570.124.06", COMMAND)
    assert dict(cal.toolchain) == TOOLCHAIN

    assert h200.memory_bandwidth() == pytest.approx(3500e9)
    assert h200.memory_bandwidth(calibrated=False) == pytest.approx(4.8e12)  # the vendor's stays
    assert h200.peak_flops("bf16") == pytest.approx(788.5e12)
    assert cal.launch_overhead is not None and cal.launch_overhead.si == pytest.approx(2.25e-6)
    assert cal.launch_overhead.note == "host 4.1 us"

    read = cal.curve("read_bandwidth")
    assert read is not None
    assert [p.size for p in read.points] == [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB]
    assert [p.si for p in read.points] == pytest.approx([v * 1e9 for v in results.curves[0].values])
    assert [p.spread for p in read.points] == pytest.approx([0.02] * 6)

    written = next(c for c in results.curves if c.name == "matmul.bf16")
    by_shape = dict(zip(written.keys, written.values, strict=True))
    for key in ("bf16", "f16"):
        curve = cal.curve(f"matmul.{key}")
        assert curve is not None and len(curve.points) == 8 * 5
        for p in curve.points:
            assert p.shape is not None and p.size == 2.0 * math.prod(p.shape)
            assert p.value == pytest.approx(by_shape[p.shape], rel=1e-5)
        assert max(p.shape[2] for p in curve.points if p.shape) == 128256

    text = path.read_text()
    assert "allreduce" not in text  # printed by the CLI, never written: hw has no name for it
    assert [r.name for r in results][-1] == "allreduce.bus_bandwidth"
    assert sum(row.label.endswith("(measured)") for row in h200.describe()) == 2


def test_a_new_calibration_replaces_the_old_and_quotes_any_device_name(tmp_path: Path) -> None:
    write(tmp_path, gpu_shaped_result())
    name = 'GPU "H200" \\ rev\tb ü'
    write(tmp_path, [Measurement("figures.memory_bandwidth", 4.2, "TB/s", "m")], device=name)
    cal = hw.load_profile("h200", tmp_path).calibration
    assert cal is not None and cal.device == name
    assert cal.curves == () and cal.launch_overhead is None
    assert [(f.name, f.si) for f in cal.figures] == [("memory_bandwidth", pytest.approx(4.2e12))]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.toml"]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (Measurement("peak.bf16", math.nan, "TFLOP/s", "m"), "`peak.bf16` is nan"),
        (Measurement("launch_overhead", 0.0, "us", "m"), "`launch_overhead` is 0.0"),
    ],
    ids=["nan", "zero"],
)
def test_the_writer_refuses_a_value_the_loader_would_and_leaves_the_old_file(
    tmp_path: Path, bad: Measurement, expected: str
) -> None:
    before = write(tmp_path, gpu_shaped_result()).read_text()
    results = gpu_shaped_result()
    broken = SuiteResult([*results.figures, bad], results.launch_overhead, results.curves)
    with pytest.raises(ValueError, match=expected.replace(".", r"\.")):
        write(tmp_path, broken)
    assert (tmp_path / "h200.toml").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.toml"]


def test_the_gpu_suite_refuses_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as err:
        gpu_microbench.run_suite("h200", quick=True)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("the GPU microbenchmarks need a GPU")


def test_the_gpu_suite_refuses_a_profile_of_the_other_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(UserError) as err:
        gpu_microbench.run_suite("mi300x", quick=True)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("profile `mi300x` is a rocm chip")
    assert message.endswith("pick a cuda profile: b200, gb300, h100, h200")


def test_operands_rotate_over_three_times_the_cache() -> None:
    l2 = 50 * MIB  # an H200's
    assert gpu_microbench._copies(MIB, l2) == 150
    assert gpu_microbench._copies(8 * MIB, l2) == 19  # a 2048 x 2048 bf16 weight
    assert gpu_microbench._copies(GIB, l2) == 1
    assert gpu_microbench._copies(4096, l2) == gpu_microbench.MAX_COPIES
    assert gpu_microbench._copies(3 * GIB, 8 * GIB) == 1  # capped by memory: never below one copy
