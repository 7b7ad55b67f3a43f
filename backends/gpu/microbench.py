"""The GPU microbenchmarks for cuda and rocm (torch.cuda is HIP on a ROCm build of torch), written as
the calibration file that overlays a GPU profile (hwprofiles/measured/README.md), e.g.
hwprofiles/measured/h200.toml over hwprofiles/h200.toml.

What is measured, on device 0:
- `launch_overhead`: the per-kernel cost of a tiny kernel (torch.add of 8 elements) replayed from a
  graph of back-to-back launches, what a decode step captured in a graph pays; the host's launch cost
  (device events around as many back-to-back launches from Python) is in its note;
- curves the cost model interpolates (polymorph/cost/model.py): read bandwidth (torch.sum over a bf16
  buffer) and copy bandwidth by size, 1 MiB to 1 GiB; GEMV/GEMM rates of torch.nn.functional.linear
  x[M, K] @ w[N, K]^T in bf16 and f16 at M of 1 to 128 over Llama-3.2-1B's (K, N): the attention
  and MLP projections and the LM head; decode attention (torch SDPA, one query token, grouped-query,
  bf16 K and V cold in cache) by the K/V bytes of 1k to 64k tokens of context;
- figures: `memory_bandwidth`, the read bandwidth at the largest size, and `peak.bf16` / `peak.f16`
  from an 8192^3 GEMM;
- with more than one device: all-reduce bus bandwidth and latency over sizes (NCCL or RCCL, one
  spawned process per device). The latency of the smallest all-reduce is written
  (`allreduce_latency`, which `polymorph plan` charges per all-reduce); the bus bandwidth is printed
  (`SuiteResult.unrecorded`), not written: `interconnect_bandwidth` holds the vendor's link bandwidth
  per direction (H200: 450 GB/s NVLink), which NCCL's bus bandwidth is measured against but never
  reaches.

Timing is by device events around a graph replay (backends/gpu/timing.py: `reps` calls captured in one
CUDA graph, HIP graph on ROCm), after a warm-up of the device and warm replays; each point is the median
of its trials, with the spread (max - min) / median. Operands are cold as in a decode step: each call
reads the next of enough copies of its buffers (weights, for GEMMs) that together they are at least 3x
the largest cache the data passes through (L2, or the Infinity Cache where the profile names one).
Curve points are net of the graph launch overhead (polymorph.hardware.microbench.net_seconds), which the cost
model adds once per kernel. `quick=True` runs fewer sizes, shapes and trials (a smoke test).
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import platform
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from polymorph.backends.gpu.timing import ROTATE_MAX_BYTES, graph_seconds
from polymorph.cli import console
from polymorph.errors import UserError
from polymorph.hardware import microbench
from polymorph.hardware import profile as hw
from polymorph.hardware.microbench import (
    KIB,
    MIB,
    CurveMeasurement,
    Measurement,
    SuiteResult,
    Timing,
    net_seconds,
)

BANDWIDTH_SIZES = tuple(MIB << (2 * i) for i in range(6))  # 1 MiB .. 1 GiB
QUICK_BANDWIDTH_SIZES = (1 * MIB, 64 * MIB)
MATMUL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)  # M: decode batch sizes
# (K, N) of Llama-3.2-1B: q/o projections, gate/up, down, fused q/k/v, LM head.
MATMUL_WEIGHTS = ((2048, 2048), (2048, 8192), (8192, 2048), (2048, 3072), (2048, 128256))
QUICK_MATMUL_ROWS = (1, 16)
QUICK_MATMUL_WEIGHTS = ((2048, 2048), (2048, 128256))
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
T = TypeVar("T")
PEAK_SIZE = 8192
ATTN_CONTEXTS = (1024, 4096, 16384, 65536)  # tokens of K and V per decode attention call
QUICK_ATTN_CONTEXTS = (1024, 16384)
ATTN_BATCH, ATTN_HEADS, ATTN_KV_HEADS, ATTN_HEAD_DIM = 8, 32, 8, 64  # Llama-3.2-1B's attention
ALLREDUCE_SIZES = tuple((4 * KIB) << (2 * i) for i in range(10))  # 4 KiB .. 1 GiB
QUICK_ALLREDUCE_SIZES = (64 * KIB, 16 * MIB)
LAUNCHES = 200  # tiny kernels per launch-overhead trial
MAX_COPIES = 1024  # operand copies one graph rotates over
WARM_REPLAYS = 2  # replays timed and dropped before each point's trials


def run_suite(profile: str, quick: bool = False, allreduce: bool = True) -> SuiteResult:
    """Measure device 0 for `profile` (a profile id of this machine's family, e.g. h200). `quick` keeps
    it short; `allreduce` False skips the all-reduce even with several devices. Raises UserError on a
    machine without a GPU, or when the profile belongs to the other GPU family."""
    if not torch.cuda.is_available():
        raise UserError(
            f"the GPU microbenchmarks need a GPU, and torch {torch.__version__} sees none here "
            "(torch.cuda.is_available() is False); run them on the machine to calibrate"
        )
    chip = hw.load_profile(profile)
    family = "rocm" if torch.version.hip else "cuda"
    if chip.backend != family:
        same = [p for p in hw.list_profiles() if hw.load_profile(p).backend == family]
        raise UserError(
            f"profile `{profile}` is a {chip.backend} chip, but torch {torch.__version__} here runs "
            f"{family}; pick a {family} profile: {', '.join(same)}"
        )
    torch.cuda.set_device(0)
    cache = _cache_bytes(chip)
    trials = 5 if quick else 11
    reps = 16 if quick else 48
    sizes = QUICK_BANDWIDTH_SIZES if quick else BANDWIDTH_SIZES
    rows = QUICK_MATMUL_ROWS if quick else MATMUL_ROWS
    weights = QUICK_MATMUL_WEIGHTS if quick else MATMUL_WEIGHTS
    reduce = allreduce and torch.cuda.device_count() > 1
    steps = 5 + 2 * len(DTYPES) + reduce
    with console.progress(steps, f"{profile} microbenchmarks") as advance:  # the CLI's only, on stderr

        def done(value: T, what: str) -> T:
            advance(note=f"{what} measured")
            return value

        done(_warm_up_device(), "warm-up")
        overhead = done(launch_overhead(trials), "launch overhead")
        overhead_s = overhead.value * 1e-6
        read = done(read_bandwidth(sizes, cache, overhead_s, trials, reps), "read bandwidth")
        copy = done(copy_bandwidth(sizes, cache, overhead_s, trials, reps), "copy bandwidth")
        matmuls = [
            done(matmul_curve(key, rows, weights, cache, overhead_s, trials, reps), f"{key} matmuls")
            for key in DTYPES
        ]
        contexts = QUICK_ATTN_CONTEXTS if quick else ATTN_CONTEXTS
        attention = done(attention_decode(contexts, cache, overhead_s, trials, reps), "decode attention")
        figures = [
            Measurement(
                "figures.memory_bandwidth",
                read.values[-1],
                "GB/s",
                f"{read.method}, at {microbench.describe_key(sizes[-1])}",
            ),
            *(
                done(
                    matmul_rate(key, PEAK_SIZE, trials=3 if quick else 7, reps=4 if quick else 10),
                    f"{key} peak",
                )
                for key in DTYPES
            ),
        ]
        unrecorded: list[Measurement] = []
        latency = None
        if reduce:
            sizes_ar = QUICK_ALLREDUCE_SIZES if quick else ALLREDUCE_SIZES
            bus, latency = done(allreduce_rates(sizes_ar, trials), "all-reduce")
            unrecorded = [bus]
    return SuiteResult(
        figures, overhead, [read, copy, attention, *matmuls], unrecorded, allreduce_latency=latency
    )


def launch_overhead(trials: int, launches: int = LAUNCHES) -> Measurement:
    a, b = torch.ones(8, device="cuda"), torch.ones(8, device="cuda")
    c = torch.empty(8, device="cuda")

    def tiny() -> None:
        torch.add(a, b, out=c)

    replay = _graph_timing(lambda _: tiny(), copies=1, reps=launches, trials=trials)
    for _ in range(50):
        tiny()
    torch.cuda.synchronize()
    host = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            tiny()
        end.record()
        end.synchronize()
        host.append(start.elapsed_time(end) * 1e-3 / launches)
    launched = Timing.of(host)
    return Measurement(
        "launch_overhead",
        replay.seconds * 1e6,
        "us",
        f"{_graph_kind()} replay of {launches} back-to-back torch.add of 8 f32, device time per kernel, "
        f"median of {trials} replays",
        note=(
            f"spread {replay.spread:.0%}; launched from the host instead (device events around "
            f"{launches} back-to-back calls from Python): {launched.seconds * 1e6:.3g} us per call, "
            f"spread {launched.spread:.0%} ((max - min) / median of the trials)"
        ),
    )


def read_bandwidth(
    sizes: Sequence[int], cache_bytes: int, overhead_s: float, trials: int, reps: int
) -> CurveMeasurement:
    timings = []
    for nbytes in sizes:
        copies = _copies(nbytes, cache_bytes)
        pool = torch.ones(copies * nbytes // 2, dtype=torch.bfloat16, device="cuda")
        views = pool.view(copies, nbytes // 2)  # [copies, elements]: one buffer per row
        timings.append(_graph_timing(lambda i, v=views: torch.sum(v[i]), copies, reps, trials))
        del pool, views
    return CurveMeasurement.bandwidth(
        "read_bandwidth",
        f"torch.sum over a bf16 buffer cold in cache, bytes read / (median of {trials} - launch "
        f"overhead), {_graph_kind()} replay",
        sizes,
        timings,
        overhead_s,
    )


def copy_bandwidth(
    sizes: Sequence[int], cache_bytes: int, overhead_s: float, trials: int, reps: int
) -> CurveMeasurement:
    timings = []
    for nbytes in sizes:
        copies = _copies(2 * nbytes, cache_bytes)
        src = torch.ones(copies, nbytes // 2, dtype=torch.bfloat16, device="cuda")  # [copies, elements]
        dst = torch.empty_like(src)
        timings.append(_graph_timing(lambda i, s=src, d=dst: d[i].copy_(s[i]), copies, reps, trials))
        del src, dst
    return CurveMeasurement.bandwidth(
        "copy_bandwidth",
        f"torch copy_ of a bf16 buffer of the size cold in cache, reads plus writes / (median of "
        f"{trials} - launch overhead), {_graph_kind()} replay",
        sizes,
        timings,
        overhead_s,
        passes=2,
    )


def attention_decode(
    contexts: Sequence[int], cache_bytes: int, overhead_s: float, trials: int, reps: int
) -> CurveMeasurement:
    """One decode step's attention of a Llama-3.2-1B-shaped layer (32 query heads sharing 8 kv heads
    of 64) at batch ATTN_BATCH over `contexts` tokens of bf16 K and V cold in cache: torch SDPA in a
    graph, the K and V bytes read per second."""
    timings, sizes = [], []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for ctx in contexts:
        shape = (ATTN_BATCH, ATTN_KV_HEADS, ctx, ATTN_HEAD_DIM)
        nbytes = 2 * math.prod(shape) * 2
        copies = _copies(nbytes, cache_bytes)
        kv = torch.randn(copies, 2, *shape, dtype=torch.bfloat16, device="cuda")  # [copies, K|V, ...]
        q = torch.randn(ATTN_BATCH, ATTN_HEADS, 1, ATTN_HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        call = lambda i, q=q, kv=kv: sdpa(q, kv[i, 0], kv[i, 1], enable_gqa=True)  # noqa: E731
        timings.append(_graph_timing(call, copies, reps, trials))
        sizes.append(nbytes)
        del kv
    return CurveMeasurement.bandwidth(
        "attention_decode",
        f"torch SDPA, one query token, batch {ATTN_BATCH}, {ATTN_HEADS} heads on {ATTN_KV_HEADS} kv heads "
        f"of {ATTN_HEAD_DIM}, bf16 K and V cold in cache, K+V bytes / (median of {trials} - launch "
        f"overhead), {_graph_kind()} replay",
        sizes,
        timings,
        overhead_s,
    )


def matmul_curve(
    key: str,
    rows: Sequence[int],
    weights: Sequence[tuple[int, int]],
    cache_bytes: int,
    overhead_s: float,
    trials: int,
    reps: int,
) -> CurveMeasurement:
    dtype = DTYPES[key]
    shapes, values, spreads = [], [], []
    for k, n in weights:
        copies = _copies(n * k * 2, cache_bytes)
        w = torch.randn(copies, n, k, dtype=dtype, device="cuda")  # [copies, N, K]: checkpoint layout
        for m in rows:
            x = torch.randn(m, k, dtype=dtype, device="cuda")  # [M, K], hot as a step's activations are
            t = _graph_timing(lambda i, x=x, w=w: torch.nn.functional.linear(x, w[i]), copies, reps, trials)
            shapes.append((m, k, n))
            values.append(2.0 * m * k * n / net_seconds(t, overhead_s) / 1e12)
            spreads.append(t.spread)
        del w
    return CurveMeasurement(
        f"matmul.{key}",
        "TFLOP/s",
        f"torch linear x[M, K] @ w[N, K]^T in {key}, weights cold in cache, 2MKN / (median of {trials} "
        f"- launch overhead), {_graph_kind()} replay",
        tuple(shapes),
        tuple(values),
        tuple(spreads),
    )


def matmul_rate(key: str, n: int = PEAK_SIZE, trials: int = 7, reps: int = 10) -> Measurement:
    dtype = DTYPES[key]
    a = torch.randn(n, n, dtype=dtype, device="cuda")
    b = torch.randn(n, n, dtype=dtype, device="cuda")
    t = _graph_timing(lambda _: torch.matmul(a, b), copies=1, reps=reps, trials=trials)
    return Measurement(
        f"peak.{key}",
        2 * n**3 / t.seconds / 1e12,
        "TFLOP/s",
        f"torch matmul {n}x{n}x{n} {key} on random data, {_graph_kind()} replay of {reps}, median of "
        f"{trials}",
        note=f"spread {t.spread:.0%}, (max - min) / median of the trials",
    )


def allreduce_rates(sizes: Sequence[int], trials: int) -> tuple[Measurement, Measurement]:
    """All-reduce (sum of bf16) over every device, one spawned process each; rank 0's timings: (bus
    bandwidth as nccl-tests defines it, bytes / time * 2 (n - 1) / n, at the largest size; the time of
    the smallest, the latency the cost model charges each all-reduce of a decode step)."""
    world = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "allreduce.json"
        torch.multiprocessing.spawn(
            _allreduce_worker, args=(world, _free_port(), list(sizes), trials, str(out)), nprocs=world
        )
        seconds, spreads = json.loads(out.read_text())
    bus = [n / s * 2 * (world - 1) / world / 1e9 for n, s in zip(sizes, seconds, strict=True)]
    by_size = ", ".join(
        f"{microbench.describe_key(n)} {b:.3g} GB/s ({s * 1e6:.3g} us)"
        for n, b, s in zip(sizes, bus, seconds, strict=True)
    )
    method = f"torch.distributed.all_reduce of bf16 over {world} devices, median of {trials} trials of 20"
    why = "not written: the profile's interconnect_bandwidth is per link and direction, this is a bus figure"
    return (
        Measurement(
            "allreduce.bus_bandwidth",
            bus[-1],
            "GB/s",
            f"{method}, at {microbench.describe_key(sizes[-1])}",
            note=f"{why}; by size: {by_size}; spread {spreads[-1]:.0%} ((max - min) / median of the trials)",
        ),
        Measurement(
            "allreduce_latency",
            seconds[0] * 1e6,
            "us",
            f"{method}, at {microbench.describe_key(sizes[0])}",
            note=f"spread {spreads[0]:.0%}, (max - min) / median of the trials",
        ),
    )


def _allreduce_worker(rank: int, world: int, port: int, sizes: list[int], trials: int, out: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=5),
        device_id=torch.device("cuda", rank),
    )
    try:
        seconds, spreads = [], []
        for nbytes in sizes:
            x = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device="cuda")
            for _ in range(5):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dist.barrier()  # every rank starts the timed calls together
            times = []
            for _ in range(trials):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(20):
                    dist.all_reduce(x)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3 / 20)
            t = Timing.of(times)
            seconds.append(t.seconds)
            spreads.append(t.spread)
            del x
        if rank == 0:
            Path(out).write_text(json.dumps([seconds, spreads]))
    finally:
        dist.destroy_process_group()


def write_calibration(
    calibration_dir: Path, profile: str, results: SuiteResult, command: str | None = None
) -> Path:
    """Write `<calibration_dir>/<profile>.toml` with this machine's provenance (device 0's name, the
    driver, torch/triton/python versions); returns its path. `command` defaults to the CLI's."""
    family = "rocm" if torch.version.hip else "cuda"
    return microbench.write_calibration(
        calibration_dir,
        profile,
        results,
        device=torch.cuda.get_device_name(0),
        driver=_driver(),
        toolchain=_toolchain(),
        command=command or f"polymorph microbench --backend {family} --target {profile}",
    )


def _graph_timing(call: Callable[[int], object], copies: int, reps: int, trials: int) -> Timing:
    """Seconds per `call(i)` from graph replay, `i` cycling over the `copies` operand copies; `reps`
    rounded up to a multiple of `copies` so that every replay reads each copy equally often."""
    reps = copies * max(1, math.ceil(reps / copies))
    counter = itertools.count()

    def body() -> None:
        call(next(counter) % copies)

    return Timing.of(graph_seconds(body, reps, trials + WARM_REPLAYS)[WARM_REPLAYS:])


def _copies(nbytes: int, cache_bytes: int) -> int:
    """How many copies of `nbytes` of operands make 3x the cache (capped in count and memory)."""
    return max(1, min(MAX_COPIES, math.ceil(3 * cache_bytes / nbytes), ROTATE_MAX_BYTES // nbytes))


def _cache_bytes(chip: hw.Profile) -> int:
    """The largest cache between the cores and HBM: torch's L2 size, or the profile's L2 or LLC (AMD's
    Infinity Cache, which torch does not report) where larger."""
    props = torch.cuda.get_device_properties(0)
    sizes = [int(getattr(props, "L2_cache_size", 64 * MIB))]
    sizes += [int(f.si) for f in (chip.figure("l2_cache"), chip.figure("llc")) if f is not None]
    return max(sizes)


def _warm_up_device() -> None:
    """Raise the clocks before the first timing: about half a second of GEMMs."""
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spent_ms = 0.0
    while spent_ms < 500:
        start.record()
        for _ in range(20):
            torch.matmul(a, a)
        end.record()
        end.synchronize()
        spent_ms += start.elapsed_time(end)


def _graph_kind() -> str:
    return "HIP graph" if torch.version.hip else "CUDA graph"


def _driver() -> str:
    if torch.version.hip:
        return f"HIP {torch.version.hip}"
    runtime = f"CUDA runtime {torch.version.cuda}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return runtime
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader", "--id=0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return runtime
    version = out.stdout.strip().splitlines()[0].strip() if out.stdout.strip() else ""
    return f"{version} ({runtime})" if version else runtime


def _toolchain() -> dict[str, str]:
    import numpy

    from polymorph import __version__

    tools = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        tools["triton"] = triton.__version__
    except ImportError:
        pass
    tools["hip" if torch.version.hip else "cuda"] = str(torch.version.hip or torch.version.cuda)
    return {**tools, "numpy": numpy.__version__, "polymorph": __version__}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
