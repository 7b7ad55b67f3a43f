"""The GPU microbenchmark suite (backends/gpu/microbench.py) on a GPU: the quick suite writes a
calibration file that polymorph.hardware.profile loads, and its numbers are physically possible for the chip: no
bandwidth, and no GEMV at M=1 through the LM head (one FLOP per weight byte in 16 bits), above the
vendor's HBM peak, which a hot cache would show. Timings are printed. The profile id only names the file here: the suite
measures whatever GPU device 0 is. Run: nox -s tests-cuda."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from polymorph.backends.gpu import microbench
from polymorph.hardware import profile as hw


@pytest.mark.parametrize(
    "profile", [pytest.param("h200", marks=pytest.mark.cuda), pytest.param("mi300x", marks=pytest.mark.rocm)]
)
def test_the_quick_suite_writes_a_calibration_that_loads(profile: str, tmp_path: Path) -> None:
    results = microbench.run_suite(profile, quick=True)
    for row in results:
        print(f"{row.name}: {row.value:.4g} {row.unit} ({row.method}){f'; {row.note}' if row.note else ''}")
    path = microbench.write_calibration(tmp_path, profile, results)
    assert path == tmp_path / f"{profile}.toml"

    chip = hw.load_profile(profile, tmp_path)
    cal = chip.calibration
    assert cal is not None and cal.device == torch.cuda.get_device_name(0)
    assert {"python", "torch"} <= dict(cal.toolchain).keys()
    assert cal.command == f"polymorph microbench --backend {chip.backend} --target {profile}"
    assert {c.name for c in cal.curves} == {
        "read_bandwidth",
        "copy_bandwidth",
        "attention_decode",
        "matmul.bf16",
        "matmul.f16",
    }
    attention = cal.curve("attention_decode")
    assert attention is not None and len(attention.points) == len(microbench.QUICK_ATTN_CONTEXTS)
    for name in ("read_bandwidth", "copy_bandwidth"):
        curve = cal.curve(name)
        assert curve is not None
        assert [p.size for p in curve.points] == list(microbench.QUICK_BANDWIDTH_SIZES)
    shapes = {(m, k, n) for k, n in microbench.QUICK_MATMUL_WEIGHTS for m in microbench.QUICK_MATMUL_ROWS}
    for key in ("bf16", "f16"):
        curve = cal.curve(f"matmul.{key}")
        assert curve is not None and {p.shape for p in curve.points} == shapes
    for curve in cal.curves:
        assert all(math.isfinite(p.si) and p.si > 0 and p.spread is not None for p in curve.points)
    assert cal.launch_overhead is not None and 0 < cal.launch_overhead.si < 1e-3

    vendor_bw = chip.memory_bandwidth(calibrated=False)
    assert vendor_bw is not None
    measured_bw = chip.memory_bandwidth()
    assert measured_bw is not None and 0.2 * vendor_bw < measured_bw < 1.1 * vendor_bw
    # Points of 64 MiB and more only: a small call's rate, net of the launch overhead, is uncertain.
    read = cal.curve("read_bandwidth")
    assert read is not None and all(p.si < 1.1 * vendor_bw for p in read.points if p.size >= 64 << 20)
    gemv = cal.curve("matmul.bf16")
    assert gemv is not None
    lm_head = [p for p in gemv.points if p.shape and p.shape[0] == 1 and p.shape[2] == 128256]
    assert len(lm_head) == 1 and lm_head[0].si < 1.1 * vendor_bw
    vendor_peak = chip.peak_flops("bf16", calibrated=False)
    measured_peak = chip.peak_flops("bf16")
    assert vendor_peak is not None and measured_peak is not None
    assert 0.2 * vendor_peak < measured_peak < 1.1 * vendor_peak
