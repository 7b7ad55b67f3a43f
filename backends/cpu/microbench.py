"""The cpu backend's microbenchmarks, written as a calibration file that overlays the `cpu` profile
(hwprofiles/measured/README.md), since a CPU has no vendor figures polymorph could know in advance.

What is measured:
- figures: copy bandwidth at the largest size (`figures.memory_bandwidth`) and the best square matmul
  rate per dtype (`peak.f32`, `peak.bf16`), the numbers the roofline uses;
- the per-call overhead of a tiny torch op (`launch_overhead`);
- curves the cost model interpolates (polymorph/costmodel.py): read and copy bandwidth by buffer size,
  and matmul rates over decoder-like skinny shapes x[M, K] @ w[N, K]^T (M of 1 to 64, K = N).

Timing is host wall clock (perf_counter_ns): warm-up calls, then the median of repeated trials, and
the spread (max - min) / median of those trials. Small calls are timed in a loop of several calls per
trial so that the clock's own cost does not count. Curve points are net of the call overhead (see
`_net_seconds`): the cost model adds the overhead once per kernel, so the curves must not hold it too.
`quick=True` runs fewer sizes, shapes and trials (a few seconds; what tests use).
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from polymorph.errors import UserError

KIB, MIB = 1 << 10, 1 << 20
BANDWIDTH_SIZES = (64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
QUICK_BANDWIDTH_SIZES = (64 * KIB, 1 * MIB, 16 * MIB)
MATMUL_ROWS = (1, 4, 16, 64)  # M: decode batch sizes
MATMUL_WIDTHS = (256, 512, 1024, 2048)  # K = N: hidden sizes of small decoders
QUICK_MATMUL_ROWS = (1, 16)
QUICK_MATMUL_WIDTHS = (256, 1024)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
_MIN_TRIAL_S = 1e-3  # calls shorter than this are looped within one trial


@dataclass(frozen=True)
class Measurement:
    name: str  # `figures.<name>`, `peak.<dtype>`, `launch_overhead`, or `curves.<name>` (a summary row)
    value: float
    unit: str
    method: str
    note: str | None = None


@dataclass(frozen=True)
class Timing:
    seconds: float  # median per call
    spread: float  # (max - min) / median over the trials


@dataclass(frozen=True)
class CurveMeasurement:
    """One curve as the calibration file stores it: `keys` are bytes, or [M, K, N] for matmul curves."""

    name: str  # a polymorph.hw.CURVES key
    unit: str
    method: str
    keys: tuple[int | tuple[int, int, int], ...]
    values: tuple[float, ...]
    spreads: tuple[float, ...]

    def summary(self) -> Measurement:
        best = max(range(len(self.values)), key=lambda i: self.values[i])
        return Measurement(
            f"curves.{self.name}",
            self.values[best],
            self.unit,
            f"best of {len(self.values)} points, at {_describe_key(self.keys[best])}",
        )


@dataclass(frozen=True)
class SuiteResult:
    """What `run_suite` measured. Iterating yields one row per figure and per curve (what
    `polymorph microbench` prints); `write_calibration` writes all of it."""

    figures: list[Measurement]
    launch_overhead: Measurement
    curves: list[CurveMeasurement] = field(default_factory=list)

    def __iter__(self) -> Iterator[Measurement]:
        yield from self.figures
        yield self.launch_overhead
        yield from (c.summary() for c in self.curves)


def time_call(fn: Callable[[], object], trials: int, warmup: int = 2) -> Timing:
    """Median and spread of `fn`'s time per call, after `warmup` calls; short calls are looped."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter_ns()
    fn()
    once = max((time.perf_counter_ns() - t0) * 1e-9, 1e-9)
    loops = max(1, min(1000, int(_MIN_TRIAL_S / once)))
    times = []
    for _ in range(trials):
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        times.append((time.perf_counter_ns() - t0) * 1e-9 / loops)
    median = statistics.median(times)
    return Timing(median, (max(times) - min(times)) / median)


def _net_seconds(timing: Timing, overhead_s: float) -> float:
    """A call's time without the per-call overhead. Floored at half the measured time: a call barely
    longer than the overhead has an uncertain net time, and a rate must not come out unbounded."""
    return max(timing.seconds - overhead_s, timing.seconds / 2)


def launch_overhead(trials: int = 9) -> Measurement:
    a, b, c = torch.ones(8), torch.ones(8), torch.empty(8)
    t = time_call(lambda: torch.add(a, b, out=c), trials, warmup=50)
    return Measurement(
        "launch_overhead",
        t.seconds * 1e6,
        "us",
        f"torch.add of 8 f32 into a preallocated output, median of {trials} trials after 50 warm-up calls",
        note=f"spread {t.spread:.0%}",
    )


def read_bandwidth(sizes: Sequence[int], overhead_s: float, trials: int) -> CurveMeasurement:
    timings = []
    for nbytes in sizes:
        x = torch.full((nbytes // 4,), 1.0)
        timings.append(time_call(lambda x=x: torch.sum(x), trials))
    return CurveMeasurement(
        "read_bandwidth",
        "GB/s",
        f"torch.sum over a f32 buffer, bytes read / (median of {trials} - call overhead), {_threads()}",
        tuple(sizes),
        tuple(n / _net_seconds(t, overhead_s) / 1e9 for n, t in zip(sizes, timings, strict=True)),
        tuple(t.spread for t in timings),
    )


def copy_bandwidth(sizes: Sequence[int], overhead_s: float, trials: int) -> CurveMeasurement:
    timings = []
    for nbytes in sizes:
        src = torch.full((nbytes // 4,), 1.0)
        dst = torch.empty_like(src)
        timings.append(time_call(lambda s=src, d=dst: d.copy_(s), trials))
    return CurveMeasurement(
        "copy_bandwidth",
        "GB/s",
        f"torch copy_ of a f32 buffer of the size, reads plus writes / (median of {trials} - call "
        f"overhead), {_threads()}",
        tuple(sizes),
        tuple(2 * n / _net_seconds(t, overhead_s) / 1e9 for n, t in zip(sizes, timings, strict=True)),
        tuple(t.spread for t in timings),
    )


def matmul_curve(
    key: str, rows: Sequence[int], widths: Sequence[int], overhead_s: float, trials: int
) -> CurveMeasurement:
    dtype = DTYPES[key]
    shapes, values, spreads = [], [], []
    for width in widths:
        w = torch.randn(width, width).to(dtype)  # [N, K], the checkpoint layout the kernels see
        for m in rows:
            x = torch.randn(m, width).to(dtype)  # [M, K]
            t = time_call(lambda x=x, w=w: torch.nn.functional.linear(x, w), trials)
            shapes.append((m, width, width))
            values.append(2.0 * m * width * width / _net_seconds(t, overhead_s) / 1e12)
            spreads.append(t.spread)
    return CurveMeasurement(
        f"matmul.{key}",
        "TFLOP/s",
        f"torch linear x[M, K] @ w[N, K]^T in {key}, 2MKN / (median of {trials} - call overhead), "
        f"{_threads()}",
        tuple(shapes),
        tuple(values),
        tuple(spreads),
    )


def matmul_rate(key: str, n: int = 1024, trials: int = 5) -> Measurement:
    dtype = DTYPES[key]
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    t = time_call(lambda: a @ b, trials)
    return Measurement(
        f"peak.{key}",
        2 * n**3 / t.seconds / 1e12,
        "TFLOP/s",
        f"torch matmul {n}x{n}x{n} {key} on random data, {_threads()}, median of {trials}",
    )


def run_suite(quick: bool = False, threads: int | None = None) -> SuiteResult:
    """Measure the host. `quick` keeps it to a few seconds (fewer sizes, shapes and trials). `threads`
    sets torch's thread count for the suite (restored after; default: as it stands, every core unless
    set): calibrate at the count the runs to predict use. The cpu executable runs small models on one
    thread, and on a loaded machine a multi-threaded small call waits for its workers to be scheduled,
    which a curve measured with every core then shows as a flat time per call."""
    previous = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise UserError(f"microbench threads must be >= 1; got {threads}")
        torch.set_num_threads(threads)
    try:
        return _measure(quick)
    finally:
        torch.set_num_threads(previous)


def _measure(quick: bool) -> SuiteResult:
    trials = 5 if quick else 11
    sizes = QUICK_BANDWIDTH_SIZES if quick else BANDWIDTH_SIZES
    rows = QUICK_MATMUL_ROWS if quick else MATMUL_ROWS
    widths = QUICK_MATMUL_WIDTHS if quick else MATMUL_WIDTHS
    overhead = launch_overhead(trials)
    overhead_s = overhead.value * 1e-6
    read = read_bandwidth(sizes, overhead_s, trials)
    copy = copy_bandwidth(sizes, overhead_s, trials)
    curves = [read, copy] + [matmul_curve(key, rows, widths, overhead_s, trials) for key in DTYPES]
    largest = copy.values[-1]
    figures = [
        Measurement(
            "figures.memory_bandwidth",
            largest,
            "GB/s",
            f"torch copy_ of {sizes[-1] >> 20} MiB f32, reads plus writes, {_threads()}, median of {trials}",
        ),
        *(matmul_rate(key, n=512 if quick else 1024, trials=3 if quick else 5) for key in DTYPES),
    ]
    return SuiteResult(figures, overhead, curves)


def _threads() -> str:
    n = torch.get_num_threads()
    return f"{n} thread" + ("s" if n > 1 else "")


def _describe_key(key: int | tuple[int, int, int]) -> str:
    if isinstance(key, tuple):
        return "M={} K={} N={}".format(*key)
    return f"{key / MIB:g} MiB" if key >= MIB else f"{key / KIB:g} KiB"


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


def _figure_lines(m: Measurement) -> list[str]:
    lines = ["", f"[{m.name}]", f"value = {m.value:.6g}", f'unit = "{m.unit}"', f'method = "{m.method}"']
    return lines + ([f'note = "{m.note}"'] if m.note else [])


def _curve_lines(c: CurveMeasurement) -> list[str]:
    by = "shapes" if c.name.startswith("matmul.") else "bytes"
    keys = ", ".join(f"[{k[0]}, {k[1]}, {k[2]}]" if isinstance(k, tuple) else str(k) for k in c.keys)
    return [
        "",
        f"[curves.{c.name}]",
        f'unit = "{c.unit}"',
        f'method = "{c.method}"',
        f"{by} = [{keys}]",
        "values = [" + ", ".join(f"{v:.6g}" for v in c.values) + "]",
        "spreads = [" + ", ".join(f"{s:.3g}" for s in c.spreads) + "]",
    ]


def calibration_toml(results: SuiteResult | Sequence[Measurement]) -> str:
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
    if isinstance(results, SuiteResult):
        for m in [*results.figures, results.launch_overhead]:
            lines += _figure_lines(m)
        for c in results.curves:
            lines += _curve_lines(c)
    else:
        for m in results:
            lines += _figure_lines(m)
    return "\n".join(lines) + "\n"


def write_calibration(calibration_dir: Path, results: SuiteResult | Sequence[Measurement]) -> Path:
    calibration_dir.mkdir(parents=True, exist_ok=True)
    path = calibration_dir / "cpu.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(calibration_toml(results))
    tmp.replace(path)  # never leave a half-written calibration behind
    return path
