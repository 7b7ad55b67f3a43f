"""What every backend's microbenchmark suite shares: the rows a suite measures and the writer of the
calibration file they become (the format of hwprofiles/measured/README.md, read by polymorph.hardware.profile).

A suite (backends/<name>/microbench.py) measures its device and returns a `SuiteResult`; the
backend's `write_calibration` adds the provenance only it knows (device name, driver, toolchain) and
calls `write_calibration` here, which writes `<calibration_dir>/<profile>.toml` atomically. Nothing
here imports torch: the suites do their own timing.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import statistics
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class Measurement:
    name: str  # `figures.<name>`, `peak.<dtype>`, `*_overhead`, `allreduce_latency`, `curves.<name>`
    value: float
    unit: str
    method: str
    note: str | None = None


@dataclass(frozen=True)
class Timing:
    seconds: float  # median per call
    spread: float  # (max - min) / median over the trials

    @classmethod
    def of(cls, times: Sequence[float]) -> Timing:
        """The median and spread of per-call times, one per trial."""
        median = statistics.median(times)
        return cls(median, (max(times) - min(times)) / median)


@dataclass(frozen=True)
class CurveMeasurement:
    """One curve as the calibration file stores it: `keys` are bytes, or [M, K, N] for matmul curves."""

    name: str  # a polymorph.hardware.profile.CURVES key
    unit: str
    method: str
    keys: tuple[int | tuple[int, int, int], ...]
    values: tuple[float, ...]
    spreads: tuple[float, ...]

    @classmethod
    def bandwidth(
        cls, name: str, method: str, sizes: Sequence[int], timings: Sequence[Timing], overhead_s: float,
        passes: int = 1,
    ) -> CurveMeasurement:  # fmt: skip
        """A GB/s curve from one timing per buffer size: `passes` x size bytes moved per call (2 for a
        copy, reads plus writes), net of the per-call overhead."""
        rates = tuple(
            passes * n / net_seconds(t, overhead_s) / 1e9 for n, t in zip(sizes, timings, strict=True)
        )
        return cls(name, "GB/s", method, tuple(sizes), rates, tuple(t.spread for t in timings))

    def summary(self) -> Measurement:
        best = max(range(len(self.values)), key=lambda i: self.values[i])
        return Measurement(
            f"curves.{self.name}",
            self.values[best],
            self.unit,
            f"best of {len(self.values)} points, at {describe_key(self.keys[best])}",
        )


@dataclass(frozen=True)
class SuiteResult:
    """What a suite's `run_suite` measured. Iterating yields one row per figure, per curve and per
    unrecorded measurement (what `polymorph microbench` prints); `calibration_toml` writes the figures,
    the launch overhead and the curves. `unrecorded` holds what polymorph.hardware.profile has no name for yet (a
    GPU's all-reduce), printed so that it is seen, never written."""

    figures: list[Measurement]
    launch_overhead: Measurement
    curves: list[CurveMeasurement] = field(default_factory=list)
    unrecorded: list[Measurement] = field(default_factory=list)
    step_overhead: Measurement | None = None  # the runtime's fixed cost per step, beyond its kernels
    op_overhead: Measurement | None = None  # one host-dispatched op inside a kernel (cpu: a torch op)
    allreduce_latency: Measurement | None = None  # the smallest all-reduce over every device (several GPUs)

    def overheads(self) -> list[Measurement]:
        rest = (self.step_overhead, self.op_overhead, self.allreduce_latency)
        return [self.launch_overhead, *(m for m in rest if m is not None)]

    def __iter__(self) -> Iterator[Measurement]:
        yield from self.figures
        yield from self.overheads()
        yield from (c.summary() for c in self.curves)
        yield from self.unrecorded


def net_seconds(timing: Timing, overhead_s: float) -> float:
    """A call's time without the per-call overhead. Floored at half the measured time: a call barely
    longer than the overhead has an uncertain net time, and a rate must not come out unbounded. The
    cost model adds the overhead once per kernel, so curve points must not hold it too."""
    return max(timing.seconds - overhead_s, timing.seconds / 2)


def describe_key(key: int | tuple[int, int, int]) -> str:
    if isinstance(key, tuple):
        return "M={} K={} N={}".format(*key)
    if key >= GIB:
        return f"{key / GIB:g} GiB"
    return f"{key / MIB:g} MiB" if key >= MIB else f"{key / KIB:g} KiB"


def git_commit() -> str:
    """polymorph's short git commit, or "unknown" outside a checkout."""
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


def calibration_toml(
    results: SuiteResult | Sequence[Measurement],
    *,
    profile: str,
    device: str,
    driver: str,
    toolchain: Mapping[str, str],
    command: str,
) -> str:
    """The calibration file for `profile` (hwprofiles/measured/README.md): provenance from the
    arguments (date and commit are taken now), then every figure, the launch overhead and the curves.
    A plain sequence of measurements is written as figures only. Raises ValueError for a value the
    loader would refuse (not finite, not positive), naming it, so that no unloadable file is written."""
    lines = [
        f"# Written by `{command}`; see hwprofiles/measured/README.md.",
        "schema_version = 1",
        f"profile = {_string(profile)}",
        "",
        "[provenance]",
        f"date = {_string(datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'))}",
        f"device = {_string(device)}",
        f"driver = {_string(driver)}",
        f"commit = {_string(git_commit())}",
        f"command = {_string(command)}",
        "",
        "[provenance.toolchain]",
        *(f"{_key(package)} = {_string(version)}" for package, version in toolchain.items()),
    ]
    if isinstance(results, SuiteResult):
        for m in [*results.figures, *results.overheads()]:
            lines += _figure_lines(m)
        for c in results.curves:
            lines += _curve_lines(c)
    else:
        for m in results:
            lines += _figure_lines(m)
    return "\n".join(lines) + "\n"


def write_calibration(
    calibration_dir: Path,
    profile: str,
    results: SuiteResult | Sequence[Measurement],
    *,
    device: str,
    driver: str,
    toolchain: Mapping[str, str],
    command: str,
) -> Path:
    """Write `<calibration_dir>/<profile>.toml` (creating the directory), replacing any earlier file
    atomically; returns its path."""
    text = calibration_toml(
        results, profile=profile, device=device, driver=driver, toolchain=toolchain, command=command
    )
    calibration_dir.mkdir(parents=True, exist_ok=True)
    path = calibration_dir / f"{profile}.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # never leave a half-written calibration behind
    return path


def _figure_lines(m: Measurement) -> list[str]:
    _check_positive(m.value, m.name)
    lines = ["", f"[{m.name}]", f"value = {m.value:.6g}", f"unit = {_string(m.unit)}"]
    lines.append(f"method = {_string(m.method)}")
    return lines + ([f"note = {_string(m.note)}"] if m.note else [])


def _curve_lines(c: CurveMeasurement) -> list[str]:
    for i, (v, s) in enumerate(zip(c.values, c.spreads, strict=True)):
        _check_positive(v, f"curves.{c.name}.values[{i}]")
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"`curves.{c.name}.spreads[{i}]` is {s}; a spread is finite and >= 0")
    by = "shapes" if c.name.startswith("matmul.") else "bytes"
    keys = ", ".join(f"[{k[0]}, {k[1]}, {k[2]}]" if isinstance(k, tuple) else str(k) for k in c.keys)
    return [
        "",
        f"[curves.{c.name}]",
        f"unit = {_string(c.unit)}",
        f"method = {_string(c.method)}",
        f"{by} = [{keys}]",
        "values = [" + ", ".join(f"{v:.6g}" for v in c.values) + "]",
        "spreads = [" + ", ".join(f"{s:.3g}" for s in c.spreads) + "]",
    ]


def _check_positive(value: float, name: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` is {value}; a measured value is finite and positive")


def _string(text: str) -> str:
    # A JSON string is a TOML basic string: the same escapes for quotes, backslashes and controls.
    return json.dumps(text)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _string(name)
