"""The cpu backend's microbenchmarks: host memory bandwidth and matmul rates, written as a calibration
file that overlays the `cpu` profile (hwprofiles/measured/README.md), since a CPU has no vendor
figures polymorph could know in advance.

Timing is host wall clock (perf_counter_ns), median of repeated trials after a warm-up. Sizes are
chosen to leave the caches: the copy moves 256 MiB each way.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Measurement:
    name: str  # `figures.<name>` or `peak.<dtype>`
    value: float
    unit: str
    method: str


def _median_seconds(fn: Callable[[], object], trials: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(trials):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 256 << 20, trials: int = 7) -> Measurement:
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    s = _median_seconds(lambda: dst.copy_(src), trials)
    return Measurement(
        "figures.memory_bandwidth",
        2 * nbytes / s / 1e9,
        "GB/s",
        f"torch copy_ of {nbytes >> 20} MiB f32, reads plus writes, median of {trials}",
    )


def matmul_rate(dtype: torch.dtype, n: int = 1024, trials: int = 5) -> Measurement:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    s = _median_seconds(lambda: a @ b, trials)
    key = {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]
    return Measurement(
        f"peak.{key}",
        2 * n**3 / s / 1e12,
        "TFLOP/s",
        f"torch matmul {n}x{n}x{n} {key} on random data, {torch.get_num_threads()} threads, "
        f"median of {trials}",
    )


def run_suite() -> list[Measurement]:
    return [copy_bandwidth(), matmul_rate(torch.float32), matmul_rate(torch.bfloat16)]


def _commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _device_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def calibration_toml(results: list[Measurement]) -> str:
    import numpy

    from polymorph import __version__

    lines = [
        "# Written by `polymorph microbench --backend cpu`; see hwprofiles/measured/README.md.",
        "schema_version = 1",
        'profile = "cpu"',
        "",
        "[provenance]",
        f'date = "{datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}"',
        f'device = "{_device_name()}"',
        f'driver = "{platform.release()}"',
        f'commit = "{_commit()}"',
        'command = "polymorph microbench --backend cpu"',
        "",
        "[provenance.toolchain]",
        f'python = "{platform.python_version()}"',
        f'torch = "{torch.__version__}"',
        f'numpy = "{numpy.__version__}"',
        f'polymorph = "{__version__}"',
    ]
    for m in results:
        lines += ["", f"[{m.name}]", f"value = {m.value:.6g}", f'unit = "{m.unit}"', f'method = "{m.method}"']
    return "\n".join(lines) + "\n"


def write_calibration(calibration_dir: Path, results: list[Measurement]) -> Path:
    calibration_dir.mkdir(parents=True, exist_ok=True)
    path = calibration_dir / "cpu.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(calibration_toml(results))
    tmp.replace(path)  # never leave a half-written calibration behind
    return path
