"""The cpu backend's microbenchmarks, written as a calibration file that overlays the `cpu` profile
(hwprofiles/measured/README.md), since a CPU has no vendor figures polymorph could know in advance.

What is measured:
- figures: copy bandwidth at the largest size (`figures.memory_bandwidth`) and the best square matmul
  rate per dtype (`peak.f32`, `peak.bf16`), the numbers the roofline uses;
- the cost of a small torch op (`op_overhead`, a mix of the ops cpu kernels are made of): what each op
  a kernel dispatches beyond its first adds;
- the cpu executable's own costs (`launch_overhead` per kernel call, `step_overhead` per step), from
  steps of 1 and 17 tiny kernels;
- curves the cost model interpolates (polymorph/cost/model.py): read and copy bandwidth by buffer size,
  decode attention's K/V read rate by context length, and matmul rates over decoder-like skinny shapes
  x[M, K] @ w[N, K]^T (M of 1 to 64, K = N).

Timing is host wall clock (perf_counter_ns): warm-up calls, then the median of repeated trials, and
the spread (max - min) / median of those trials. Small calls are timed in a loop of several calls per
trial so that the clock's own cost does not count. Curve points are net of the call overhead (see
`_net_seconds`): the cost model adds the overhead once per kernel, so the curves must not hold it too.
`quick=True` runs fewer sizes, shapes and trials (a few seconds; what tests use).

The rows (Measurement, CurveMeasurement, SuiteResult) and the file writer are polymorph/hardware/microbench.py's,
shared with the GPU suite (backends/gpu/microbench.py); this module adds the host's provenance.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from polymorph.cli import console
from polymorph.errors import UserError
from polymorph.hardware import microbench
from polymorph.hardware.microbench import (
    KIB,
    MIB,
    CurveMeasurement,
    Measurement,
    SuiteResult,
    Timing,
    net_seconds,
)

BANDWIDTH_SIZES = (64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
QUICK_BANDWIDTH_SIZES = (64 * KIB, 1 * MIB, 16 * MIB)
MATMUL_ROWS = (1, 4, 16, 64)  # M: decode batch sizes
MATMUL_WIDTHS = (256, 512, 1024, 2048)  # K = N: hidden sizes of small decoders
QUICK_MATMUL_ROWS = (1, 16)
QUICK_MATMUL_WIDTHS = (256, 1024)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
T = TypeVar("T")
ATTN_CONTEXTS = (256, 1024, 4096, 16384)  # tokens of K and V per decode attention call
QUICK_ATTN_CONTEXTS = (256, 4096)
ATTN_HEADS, ATTN_KV_HEADS, ATTN_HEAD_DIM = 32, 8, 64  # Llama-3.2-1B's attention
_MIN_TRIAL_S = 1e-3  # calls shorter than this are looped within one trial
COMMAND = "polymorph microbench --backend cpu"


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
    return Timing.of(times)


def bare_op_seconds(trials: int = 9) -> float:
    """One bare torch op (an add of 8 floats into a preallocated output): what the curves are net of."""
    a, b, c = torch.ones(8), torch.ones(8), torch.empty(8)
    return time_call(lambda: torch.add(a, b, out=c), trials, warmup=50).seconds


# The ops a cpu kernel's body is made of (polymorph's kernels/torch/): allocating elementwise math, a
# reduction, a view and a copy into the output buffer, on a decode-sized row.
_OP_MIX = ("a * w", "a.pow(2)", "a.mean(-1, keepdim=True)", "torch.rsqrt(a)", "a.reshape(-1)", "out.copy_(a)")


def op_overhead(trials: int = 9) -> Measurement:
    """What each op a cpu kernel dispatches beyond its first costs (the cost model's `op_overhead`):
    the mean time of the small ops in _OP_MIX, under inference mode as the executable runs them."""
    a, w, out = torch.rand(1, 64), torch.rand(64), torch.empty(1, 64)

    def mix() -> None:
        a * w
        a.pow(2)
        a.mean(-1, keepdim=True)
        torch.rsqrt(a)
        a.reshape(-1)
        out.copy_(a)

    with torch.inference_mode():
        t = time_call(mix, trials, warmup=50)
    return Measurement(
        "op_overhead",
        t.seconds / len(_OP_MIX) * 1e6,
        "us",
        f"mean of {len(_OP_MIX)} small torch ops on [1, 64] f32 ({'; '.join(_OP_MIX)}), inference mode, "
        f"median of {trials} trials after 50 warm-up calls",
        note=f"spread {t.spread:.0%}, (max - min) / median of the trials",
    )


def runtime_overheads(trials: int = 9, chain: int = 16) -> tuple[Measurement, Measurement]:
    """The cpu executable's own costs, on graphs of 1 and of 1 + `chain` tiny `add` kernels through
    the cpu backend (lower, load, run): per kernel call (the group's Python launch, its output buffer,
    the value table) and per step (binding shapes, numpy/torch conversion). These are what a decode step
    of small kernels pays on top of their arithmetic; no kernel of a model's plan is run."""
    from polymorph.hardware.profile import load_profile
    from polymorph.ir.builder import GraphBuilder
    from polymorph.ir.dtypes import DType
    from polymorph.pipeline.backend import registry

    def step_seconds(n: int) -> float:
        b = GraphBuilder(f"overhead-{n}")
        x = b.input("x", DType.F32, (1, 8))
        y = x
        for i in range(n):
            y = b.op("add", f"add{i}", y, x)
        b.output("y", y)
        backend = registry.get("cpu")
        plan = backend.lower(b.build(), load_profile("cpu"), {})
        exe = backend.load(backend.compile(plan), {})
        inputs = {"x": np.ones((1, 8), np.float32)}
        return time_call(lambda: exe.run(inputs), trials, warmup=20).seconds

    one, many = step_seconds(1), step_seconds(1 + chain)
    # Both are positive in fact; on a noisy machine a difference of medians can come out below zero.
    per_launch = max((many - one) / chain, 1e-9)
    step = max(one - per_launch, 1e-9)
    method = f"cpu executable steps of 1 and {1 + chain} add kernels on [1, 8] f32, median of {trials}"
    return (
        Measurement("launch_overhead", per_launch * 1e6, "us", f"per kernel call: {method}, slope"),
        Measurement("step_overhead", step * 1e6, "us", f"per step beyond its kernels: {method}, intercept"),
    )


def read_bandwidth(sizes: Sequence[int], overhead_s: float, trials: int) -> CurveMeasurement:
    timings = []
    for nbytes in sizes:
        x = torch.full((nbytes // 4,), 1.0)
        timings.append(time_call(lambda x=x: torch.sum(x), trials))
    return CurveMeasurement.bandwidth(
        "read_bandwidth",
        f"torch.sum over a f32 buffer, bytes read / (median of {trials} - call overhead), {_threads()}",
        sizes,
        timings,
        overhead_s,
    )


def copy_bandwidth(sizes: Sequence[int], overhead_s: float, trials: int) -> CurveMeasurement:
    timings = []
    for nbytes in sizes:
        src = torch.full((nbytes // 4,), 1.0)
        dst = torch.empty_like(src)
        timings.append(time_call(lambda s=src, d=dst: d.copy_(s), trials))
    return CurveMeasurement.bandwidth(
        "copy_bandwidth",
        f"torch copy_ of a f32 buffer of the size, reads plus writes / (median of {trials} - call "
        f"overhead), {_threads()}",
        sizes,
        timings,
        overhead_s,
        passes=2,
    )


def attention_decode(contexts: Sequence[int], overhead_s: float, trials: int) -> CurveMeasurement:
    """One decode step's attention of a Llama-3.2-1B-shaped layer (32 query heads sharing 8 kv heads
    of 64) over `contexts` tokens of f32 K and V: torch SDPA, the K and V bytes read per second."""
    timings, sizes = [], []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for ctx in contexts:
        q = torch.randn(1, ATTN_HEADS, 1, ATTN_HEAD_DIM)
        k, v = (torch.randn(1, ATTN_KV_HEADS, ctx, ATTN_HEAD_DIM) for _ in range(2))
        timings.append(time_call(lambda q=q, k=k, v=v: sdpa(q, k, v, enable_gqa=True), trials))
        sizes.append(k.nbytes + v.nbytes)
    return CurveMeasurement.bandwidth(
        "attention_decode",
        f"torch SDPA, one query token, {ATTN_HEADS} heads on {ATTN_KV_HEADS} kv heads of {ATTN_HEAD_DIM}, "
        f"f32 K and V of {contexts[0]}-{contexts[-1]} tokens, K+V bytes / (median of {trials} - call "
        f"overhead), {_threads()}",
        sizes,
        timings,
        overhead_s,
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
            values.append(2.0 * m * width * width / net_seconds(t, overhead_s) / 1e12)
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
    steps = 6 + 2 * len(DTYPES)
    with console.progress(steps, "cpu microbenchmarks") as advance:  # shown by the CLI only, on stderr

        def done(value: T, what: str) -> T:
            advance(note=f"{what} measured")
            return value

        overhead_s = done(bare_op_seconds(trials), "bare op")  # what the curves are net of
        op = done(op_overhead(trials), "op overhead")
        kernel_call, step = done(runtime_overheads(trials), "runtime overheads")
        read = done(read_bandwidth(sizes, overhead_s, trials), "read bandwidth")
        copy = done(copy_bandwidth(sizes, overhead_s, trials), "copy bandwidth")
        contexts = QUICK_ATTN_CONTEXTS if quick else ATTN_CONTEXTS
        attention = done(attention_decode(contexts, overhead_s, trials), "decode attention")
        matmuls = [
            done(matmul_curve(key, rows, widths, overhead_s, trials), f"{key} matmuls") for key in DTYPES
        ]
        curves = [read, copy, attention, *matmuls]
        largest = copy.values[-1]
        figures = [
            Measurement(
                "figures.memory_bandwidth",
                largest,
                "GB/s",
                f"torch copy_ of {sizes[-1] >> 20} MiB f32, reads plus writes, {_threads()}, median of {trials}",
            ),
            *(
                done(matmul_rate(key, n=512 if quick else 1024, trials=3 if quick else 5), f"{key} peak")
                for key in DTYPES
            ),
        ]
    return SuiteResult(figures, kernel_call, curves, step_overhead=step, op_overhead=op)


def _threads() -> str:
    n = torch.get_num_threads()
    return f"{n} thread" + ("s" if n > 1 else "")


def _device_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def _toolchain() -> dict[str, str]:
    import numpy

    from polymorph import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "polymorph": __version__,
    }


def calibration_toml(results: SuiteResult | Sequence[Measurement]) -> str:
    """The host's calibration file for the `cpu` profile (polymorph.hardware.microbench.calibration_toml)."""
    return microbench.calibration_toml(
        results,
        profile="cpu",
        device=_device_name(),
        driver=platform.release(),
        toolchain=_toolchain(),
        command=COMMAND,
    )


def write_calibration(calibration_dir: Path, results: SuiteResult | Sequence[Measurement]) -> Path:
    """Write `<calibration_dir>/cpu.toml` atomically; returns its path."""
    return microbench.write_calibration(
        calibration_dir,
        "cpu",
        results,
        device=_device_name(),
        driver=platform.release(),
        toolchain=_toolchain(),
        command=COMMAND,
    )
