"""Timing one kernel launch on a GPU the way a decode step sees it: weights cold in L2, launched from a
CUDA graph (HIP graph on ROCm) right after the previous kernel.

A launch timed alone with an event pair around a Python call measures the host's launch latency, not
the kernel (a 5 us GEMV reads as 30 us). Here `reps` launches are captured into one graph and the
replay is timed; the launches rotate over enough copies of the inputs that together they exceed the L2
several times over, so each launch streams its operands from HBM as it does inside a step, where 2.5 GB
of weights pass through a 60 MB L2. The per-launch figure includes the graph's launch gap between
kernels: that is the cost the step pays.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import torch

ROTATE_MAX_COPIES = 32
ROTATE_MAX_BYTES = 4 << 30


def input_copies(ins: Sequence[torch.Tensor], l2_bytes: int) -> list[list[torch.Tensor]]:
    """`ins` and enough clones that the sets together are at least 3x the L2 (capped in count and
    memory), each float clone scaled a little (1 + (i % 8)/64 for copy i): every timed call sees other
    content, so a kernel that memoizes an answer gains nothing here. Integer tensors (indices,
    positions, block tables) are cloned as they are. Tensors that are the same object stay shared
    within a copy."""
    nbytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in ins}.values())
    want = math.ceil(3 * l2_bytes / max(nbytes, 1))
    copies = max(1, min(ROTATE_MAX_COPIES, want, ROTATE_MAX_BYTES // max(nbytes, 1)))
    sets = [list(ins)]
    for i in range(1, copies):
        clones: dict[int, torch.Tensor] = {}
        sets.append([clones.setdefault(id(t), fresh_clone(t, i)) for t in ins])
    return sets


def fresh_clone(t: torch.Tensor, i: int) -> torch.Tensor:
    """Copy `i` of operand `t` for timing: `t` itself for i = 0; else a clone, scaled by 1 + (i % 8)/64
    where it is float (other content, same magnitude), as it is where it is an integer tensor."""
    if i == 0:
        return t
    clone = t.clone()
    return clone.mul_(1 + (i % 8) / 64) if clone.is_floating_point() else clone


def graph_seconds(body: Callable[[], None], reps: int, trials: int = 7) -> list[float]:
    """Seconds per `body()` call: `reps` calls captured in one graph, the replay timed with device
    events, `trials` times (after one warm replay)."""
    body()  # compiles and settles the allocator before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        for _ in range(reps):
            body()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3 / reps)
    return out


def time_launch(launch: Callable, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], *,
                l2_bytes: int, reps: int = 48, trials: int = 7) -> tuple[float, float, float]:  # fmt: skip
    """(median, spread, total) seconds of one launch with cold operands, from graph replay: spread is
    (max - min) / median over the trials, total the device time of every timed replay (for the
    engine's check of its timer against the host's wall clock)."""
    sets = input_copies(ins, l2_bytes)
    reps = max(reps, len(sets))
    reps -= reps % len(sets)
    counter = iter(range(1 << 62))

    def body() -> None:
        launch(sets[next(counter) % len(sets)], outs, None)

    times = graph_seconds(body, reps, trials)
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med, sum(times) * reps
