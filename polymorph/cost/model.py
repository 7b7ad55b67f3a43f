"""The calibrated cost model: predicted time per kernel call and per step, and a plan's memory footprint.

Per kernel call (one plan group):

    projections: time = flops / matmul_rate(M, K, N) + other bytes / (bw * eff_bw(other bytes)) + launches
    experts: time = A * (gemm(R, D, 2F) + gemm(R, F, D)) + other bytes / (bw * eff_bw(...)) + launches
    other groups: time = max(bytes / (bw * eff_bw(bytes) * occ), flops / (peak * eff_flops)) + launches

(occ: the occupancy factor below, 1 where the compile reported no occupancy.)

`bw` and `peak` are the profile's figures (measured where calibrated, polymorph/hardware/profile.py). The rates and
efficiencies come from the calibration file's curves (hwprofiles/measured/README.md), piecewise-linear
in log(size) between measured points and flat beyond the ends:
- matmul_rate: the suite's torch matmul at the decoder's shapes, weights cold in cache: the points of
  the nearest M (in log), of the same K where measured, interpolated on FLOPs. A group's projections of
  one input (q, k and v; gate and up) count as one GEMM of their summed N. That measured time already
  streams the GEMM's own operands, so only the group's other traffic (a residual, a norm's weight,
  cache writes) is added, at the read curve's rate for its size.
- eff_bw(bytes) = bandwidth measured at a buffer of that size / bw: for decode attention the suite's
  attention_decode curve (K/V bytes read per second by context) where the calibration has one, else
  the read curve (it streams the KV cache); the read curve for other matrix work, the copy curve for
  norms, elementwise ops and gathers (they write about what they read). It can exceed 1 for buffers
  that stay in cache, since bw is the large-buffer figure.
- eff_flops for attention = the matmul rate at M = the query rows sharing one KV head (seq x heads /
  kv_heads: grouped-query heads read each K and V row once), K = head_dim. Other groups run at
  efficiency 1 on compute: their flops are negligible and memory or launch overhead bounds them.
- expert GEMMs (a group with a moe_ffn node), assuming uniform routing: each of T tokens picks k of E
  experts, so an expert is picked by a token with probability k/E and the expected number of distinct
  active experts is A = E (1 - (1 - k/E)^T); the T k token-expert rows spread over them, R = T k / A
  rows per active expert (about T k / E once T k >> E). The weights of every active expert are read
  once; each active expert runs its gate+up GEMM (M = R, K = D, N = 2F) and its down GEMM (M = R,
  K = F, N = D), each priced at the matmul rate of M = R: the calibrated curve where there is one,
  else the roofline of its FLOPs at the peak and its weights' (and rows') bytes at the bandwidth.
  Under expert parallelism over `ep` devices (parallel.py) a device holds E/ep experts and serves
  T k / ep rows: A = E/ep (1 - (1 - k/E)^T). The group's other traffic (x, routing, output) is added
  at the read curve's rate.
- launch overhead, once per kernel the group launches (a split decode attention launches two;
  counted from the plan's compile units where the caller gives them, else one), from the first of:
  the calibration's measured `launch_overhead`; the profile's `figures.launch_overhead` (the
  per-kernel gap in a captured graph's replay, which is how polymorph's GPU runtime runs a step, not
  an eager host launch; each profile cites where its figure comes from); DEFAULT_LAUNCH_OVERHEAD_S,
  an assumption. The prediction names the figure it used and its source (`launch_source`). Where
  the caller knows how many ops a kernel dispatches from the host (the cpu backend's torch kernels:
  `host_ops`, counted in one untimed step) and the calibration has `op_overhead` (one bare op), each op
  beyond the first adds it: a small cpu kernel's time is mostly dispatch, not arithmetic.
- occupancy, where the compile reported it (the report's `occupancy` per kernel: resident warps or
  waves per SM/CU over the maximum, from its registers, shared memory/LDS and block size, by
  backends/gpu/aot.py): a kernel streams memory at bw x min(1, occupancy / SATURATING_OCCUPANCY).
  The model, an assumption: by Little's law the bandwidth a kernel sustains is the bytes it keeps in
  flight over the memory latency, which grows with resident warps until the memory system saturates;
  kernels that keep several loads in flight per warp (Triton's pipelined loops) saturate well below
  full occupancy (V. Volkov, "Better performance at lower occupancy", GTC 2010). The saturating
  occupancy is taken as 1/8 (8 of 64 warps per SM): on the H200 (BENCHMARKS.md, 2026-11-30) the
  batch-32 lm_head kernel, which compiles here (Triton 3.9, sm_90) at occupancy 0.125, streamed
  525 MB of weights in 141 us (3.7 TB/s, 89% of the measured 4.19 TB/s read bandwidth), so
  saturation lies at or below it. That one point bounds the figure; the linear fall below it is the
  assumption.
  It lowers memory time only (a matrix-core GEMM runs at peak with one block per SM); for a GEMM
  priced by its measured rate it is a floor: its operands cannot stream faster than the lowered
  bandwidth. A pipelined kernel (Triton num_stages > 1) keeps its next tiles in flight in shared memory
  (cp.async / TMA / direct-to-LDS loads), not in warps: a unit whose staged bytes per SM, resident
  blocks x shared memory x (stages - 1) / stages, reach bw x ASSUMED_MEMORY_LATENCY_S / SMs counts
  as saturated whatever its occupancy (the grouped MoE tile at one block of 4 warps per SM streams
  ~3.9 TB/s of weights on the H200, kernels/triton/moe_ffn.py). A kernel's factor is its lowest
  unit's. Without a reported occupancy the factor is 1. So a prediction depends on the compiled
  code: a kernel compiled with more registers or shared memory, resident at lower occupancy, is
  predicted slower.
Without calibration every efficiency is 1 and the prediction says it is uncalibrated; a GEMM is then
its roofline.

`refine` corrects the prediction with measured group times: per pattern, a scale factor (the geometric
mean of measured / predicted over the measured groups of that pattern) multiplies every group of the
pattern, so timing a few groups of a pattern corrects the rest of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.hardware.profile import Curve, Profile, load_profile, peak_key, roofline_seconds
from polymorph.hardware.target import Target
from polymorph.ir.graph import Graph, TensorType
from polymorph.ir.ops import Cost, node_cost
from polymorph.ir.shapes import concrete, numel
from polymorph.pipeline.plan import KernelReport, Plan, PlanGroup, Report

# The roofline floor of each kernel (the op table's FLOPs and bytes against the profile's figures) and
# the plan's report, which the calibrated model below refines.


def group_cost(graph: Graph, group: PlanGroup, types: dict, bindings: dict[str, int]) -> Cost:
    """FLOPs and bytes of a group: the FLOPs of its nodes; the bytes of its external inputs and outputs
    (intermediates stay on chip in a fused kernel) counted through each node's own accounting."""
    by_name = {n.name: n for n in graph.nodes}
    flops = 0.0
    nbytes = 0.0
    inside = {v for name in group.nodes for v in by_name[name].outputs} - set(group.outputs)
    for name in group.nodes:
        node = by_name[name]
        cost = node_cost(node, [types[v] for v in node.inputs], [types[v] for v in node.outputs], bindings)
        flops += cost.flops
        # Remove the traffic of values that never leave the fused kernel: written and read on chip.
        internal = sum(tensor_bytes(types[v], bindings) for v in node.outputs if v in inside)
        internal += sum(tensor_bytes(types[v], bindings) for v in node.inputs if v in inside)
        nbytes += max(cost.bytes - internal, 0.0)
    return Cost(flops, nbytes)


def tensor_bytes(t: Any, bindings: Mapping[str, int]) -> int:
    """Bytes of a value of type `t` at `bindings`."""

    return numel(t.shape, bindings) * t.dtype.itemsize


def compute_dtype(group: PlanGroup, types: Mapping[str, Any]) -> str:
    """The dtype a group computes in, for its roofline: its first float input's, else f32."""
    for v in group.inputs:
        if types[v].dtype.is_float:
            return types[v].dtype.value
    return "f32"


def plan_report(
    plan: Plan,
    resources_of: Callable[[PlanGroup], dict[str, Any]],
    calibration_dir: Path | None = None,
    *,
    profile: Profile | None = None,
) -> Report:
    """report.json for a compiled plan: cost, roofline prediction and resources per kernel. The profile
    is `profile`, else the one the plan was lowered with (Plan.lowered_profile), else loaded."""
    from polymorph.knobs import knobs

    if profile is None:
        profile = plan.lowered_profile
    if profile is None or calibration_dir is not None:
        profile = load_profile(plan.profile, calibration_dir or knobs.calibration_dir)
    types = plan.graph.types()
    bindings = dict(plan.bindings)
    missing = sorted(plan.graph.symbols() - set(bindings))
    kernels: list[KernelReport] = []
    prediction = "roofline floor from the profile's figures (vendor, or measured where calibrated)"
    total: float | None = 0.0
    if missing:
        prediction = (
            f"none: symbols {', '.join(missing)} have no values (compile with --batch/--ctx or --traffic)"
        )
        total = None
    for group in plan.groups:
        flops = nbytes = 0.0
        predicted = bound = None
        if not missing:
            cost = group_cost(plan.graph, group, types, bindings)
            flops, nbytes = cost.flops, cost.bytes
            try:
                roof = roofline_seconds(profile, flops, nbytes, compute_dtype(group, types))
                predicted, bound = roof.floor_s, roof.bound
            except UserError as e:
                prediction, total = f"none: {e}", None
        if total is not None and predicted is not None:
            total += predicted
        kernels.append(
            KernelReport(
                group=group.id,
                kernel=f"{group.kernel.file}@{group.kernel.sha256[:12]}",
                target=plan.target,
                library=group.kernel.library,
                resources=resources_of(group),
                flops=flops,
                bytes=nbytes,
                predicted_s=predicted,
                bound=bound,
            )
        )
    report = Report(plan.backend, plan.target, plan.profile, plan.model, bindings, kernels, total, prediction)
    if not missing and total is not None:
        _apply_cost_model(plan, profile, report)
    return report


def _apply_cost_model(plan: Plan, profile: Any, report: Report) -> None:
    """Replace each kernel's floor by the cost model's prediction (calibrated efficiency curves plus
    launch overhead, below), keeping the floor beside it; the step adds the footprint."""

    # Kernels per call, where the compile counted them (a GPU group's KernelFile.launches), and the
    # occupancy its compiled code reaches (the lowest of its units'), where the compile computed one.
    launches = {k.group: k.resources["launches"] for k in report.kernels if "launches" in k.resources}
    hw = HardwareModel(profile)
    occupancy = {
        k.group: occ for k in report.kernels if (occ := streaming_occupancy(k.resources, hw)) is not None
    }
    try:
        pred = predict(plan, profile, launches=launches, occupancy=occupancy)
    except UserError:
        return  # the floor stands, with its own explanation
    rows = {r.group: r for r in pred.kernels}
    for k in report.kernels:
        row = rows[k.group]
        k.floor_s, k.predicted_s, k.bound = k.predicted_s, row.predicted_s, row.bound
        if row.note and not k.note:
            k.note = row.note
    report.predicted_step_s = pred.step_s
    report.prediction = f"cost model: {pred.basis}"
    fp = pred.footprint
    report.footprint = {"weights_bytes": fp.weights_bytes, "kv_cache_bytes": fp.kv_cache_bytes,
                        "activation_bytes": fp.activation_bytes, "method": fp.method}  # fmt: skip


# Per-call overhead when neither a calibration nor the profile has a launch figure (cpu, trn2): a
# kernel launched from the host costs a few microseconds (a Python-driven cpu kernel about as much).
# An assumed order of magnitude, not a measurement: calibrate, or add `figures.launch_overhead` with
# its source to the profile, to replace it.
DEFAULT_LAUNCH_OVERHEAD_S = 5e-6

# The occupancy at which a kernel's memory streaming saturates (module docstring): bounded above by
# one H200 measurement (a kernel at 0.125 streaming at 89% of the read bandwidth); the linear fall
# below it, after Volkov's "Better performance at lower occupancy" (GTC 2010), is an assumption.
SATURATING_OCCUPANCY = 0.125

# How long a load from device memory takes under load, for Little's law (bytes in flight = bandwidth x
# latency): an assumption of the order of a few hundred ns for HBM, rounded up, not a measured figure.
ASSUMED_MEMORY_LATENCY_S = 1e-6

MATRIX_OPS = frozenset({"linear", "matmul", "attention", "cache_attention", "moe_ffn"})

FOOTPRINT_METHOD = (
    "weights: every param at its dtype; KV cache: the graph's state at the bucket's cache_blocks; "
    "activations: peak over the plan's group order of the buffers it materializes (group outputs and "
    "graph inputs), each live from the group that writes it to the last group that reads it; KV writes "
    "alias the cache; values inside a fused group and a kernel's own scratch are not counted"
)


@dataclass(frozen=True)
class KernelRow:
    """One kernel call's prediction. `bound` is the term that set the time: memory, compute, overhead
    (launch overhead above both), interconnect (an all-reduce row of parallel.py), or view (a reshape
    the GPU runtime binds as a view of its input: no launch, no time)."""

    group: str
    pattern: str
    bytes: float
    flops: float
    dtype: str
    memory_s: float
    compute_s: float
    overhead_s: float
    predicted_s: float
    bound: str
    scale: float = 1.0  # refine's factor for this group's pattern (1: not refined)
    measured_s: float | None = None
    occupancy: float | None = None  # the compiled kernel's occupancy, where the compile reported it
    bandwidth_factor: float = 1.0  # min(1, occupancy / SATURATING_OCCUPANCY): its memory rate's share
    note: str = ""  # how the row was priced where it is not the plain formula (experts, occupancy)


@dataclass(frozen=True)
class Footprint:
    weights_bytes: float
    kv_cache_bytes: float
    activation_bytes: float
    method: str = FOOTPRINT_METHOD

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes


@dataclass(frozen=True)
class Prediction:
    """A plan's predicted step at one bucket: rows in plan order, their sum, and the footprint."""

    profile: str
    model: str
    bindings: dict[str, int]
    kernels: tuple[KernelRow, ...]
    footprint: Footprint
    calibrated: bool
    basis: str  # where bw, peak, curves and overhead came from
    scales: dict[str, float] = field(default_factory=dict)  # pattern -> refine factor

    step_overhead_s: float = 0.0  # the runtime's fixed cost per step beyond its kernels (calibrated)
    launch_overhead_s: float = 0.0  # the per-kernel launch figure every row's overhead counts
    launch_source: str = ""  # where that figure comes from (measured, the profile's cited figure, assumed)

    @property
    def step_s(self) -> float:
        return sum(k.predicted_s for k in self.kernels) + self.step_overhead_s

    def row(self, group: str) -> KernelRow:
        for k in self.kernels:
            if k.group == group:
                return k
        raise UserError(f"the prediction has no group `{group}`")

    def refine(self, measured: Mapping[str, float]) -> Prediction:
        """A new prediction whose groups are scaled per pattern by the geometric mean of measured /
        unrefined-predicted over the measured groups of that pattern. Patterns without a measured group
        keep their scale. Measured times are recorded on their rows. UserError for an unknown group or
        a time that is not a positive finite number."""
        ratios: dict[str, list[float]] = {}
        for group_id, seconds in measured.items():
            row = self.row(group_id)
            if row.bound == "view":
                raise UserError(f"`{group_id}` is a view of its input here: it has no launch to measure")
            if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
                raise UserError(f"measured time of `{group_id}` must be a positive number of seconds")
            ratios.setdefault(row.pattern, []).append(math.log(seconds / (row.predicted_s / row.scale)))
        scales = dict(self.scales)
        scales.update({p: math.exp(sum(logs) / len(logs)) for p, logs in ratios.items()})
        rows = []
        for k in self.kernels:
            scale = scales.get(k.pattern, 1.0)
            rows.append(
                replace(
                    k,
                    predicted_s=k.predicted_s / k.scale * scale,
                    scale=scale,
                    measured_s=measured.get(k.group, k.measured_s),
                )
            )
        return replace(self, kernels=tuple(rows), scales=scales)

    def to_dict(self) -> dict[str, Any]:
        """For report.json and agents: every field, plus step_s and the footprint's total."""
        d = asdict(self)
        d["step_s"] = self.step_s
        d["footprint"]["total_bytes"] = self.footprint.total_bytes
        return d


@dataclass(frozen=True)
class HardwareModel:
    """What the model knows of one chip: figures, curves and per-call overhead, and their origin."""

    profile: Profile

    @property
    def calibrated(self) -> bool:
        return self.profile.calibration is not None

    @property
    def launch_overhead_s(self) -> float:
        return self.launch_figure()[0]

    def launch_figure(self) -> tuple[float, str]:
        """(seconds per kernel launch, where the figure comes from): the calibration's measured
        `launch_overhead`, else the profile's `figures.launch_overhead` (with its source and evidence),
        else DEFAULT_LAUNCH_OVERHEAD_S, said to be assumed."""
        cal = self.profile.calibration
        if cal is not None and cal.launch_overhead is not None:
            fig = cal.launch_overhead
            return fig.si, f"measured ({cal.path}, {cal.date}: {fig.source})"
        fig = self.profile.figure("launch_overhead")
        if fig is not None:
            how = "measured" if fig.evidence == "measured" else f"evidence: {fig.evidence}"
            return fig.si, f"{self.profile.path} figures.launch_overhead ({how}; {fig.source})"
        return DEFAULT_LAUNCH_OVERHEAD_S, (
            f"assumed default DEFAULT_LAUNCH_OVERHEAD_S: neither profile `{self.profile.id}` nor a "
            f"calibration has a launch figure"
        )

    @property
    def op_overhead_s(self) -> float | None:
        """One host-dispatched op inside a kernel (measured; None when the calibration has none)."""
        cal = self.profile.calibration
        return cal.op_overhead.si if cal is not None and cal.op_overhead is not None else None

    @property
    def step_overhead_s(self) -> float:
        cal = self.profile.calibration
        return cal.step_overhead.si if cal is not None and cal.step_overhead is not None else 0.0

    def basis(self) -> str:
        cal = self.profile.calibration
        launch_s, source = self.launch_figure()
        launch = f"launch overhead {launch_s * 1e6:.3g} us per kernel, {source}"
        if cal is None:
            return f"uncalibrated: {self.profile.id}'s vendor figures at efficiency 1, {launch}"
        curves = ", ".join(c.name for c in cal.curves) or "no curves (efficiency 1)"
        step = f"; step overhead {self.step_overhead_s * 1e6:.3g} us" if cal.step_overhead is not None else ""
        op = f"; {self.op_overhead_s * 1e6:.3g} us per host op" if self.op_overhead_s is not None else ""
        return f"calibrated ({cal.path}, {cal.provenance()}): curves {curves}; {launch}{step}{op}"

    def bandwidth(self) -> float:
        bw = self.profile.memory_bandwidth()
        if bw is None:
            raise UserError(
                f"profile `{self.profile.id}` has no memory bandwidth; calibrate it with "
                f"`polymorph microbench --backend {self.profile.backend}` or add `figures.memory_bandwidth`"
            )
        return bw

    def peak(self, dtype: str) -> float:
        peak = self.profile.peak_flops(dtype)
        if peak is None:
            raise UserError(
                f"profile `{self.profile.id}` has no peak rate for {dtype}; calibrate it with "
                f"`polymorph microbench --backend {self.profile.backend}` or add `peak.{peak_key(dtype)}`"
            )
        return peak

    def eff_bw(self, nbytes: float, traffic: str = "read") -> float:
        """Measured bandwidth for a kernel that moves `nbytes`, over the sustained figure: the read
        curve for `traffic` "read", the copy curve for "copy" (each falls back on the other), the
        decode attention curve for "attention" (else the read curve)."""
        cal = self.profile.calibration
        names = {
            "read": ("read_bandwidth", "copy_bandwidth"),
            "copy": ("copy_bandwidth", "read_bandwidth"),
            "attention": ("attention_decode", "read_bandwidth", "copy_bandwidth"),
        }[traffic]
        curve = None if cal is None else next((c for n in names if (c := cal.curve(n)) is not None), None)
        if curve is None or nbytes <= 0:
            return 1.0
        # A copy curve's points are buffer sizes, its traffic twice that (read, then written).
        size = nbytes / 2 if curve.name == "copy_bandwidth" else nbytes
        return _interpolate([(p.size, p.si) for p in curve.points], size) / self.bandwidth()

    def matmul_curve(self, dtype: str) -> Curve | None:
        cal = self.profile.calibration
        key = peak_key(dtype)
        return None if cal is None or key is None else cal.curve(f"matmul.{key}")

    def eff_flops(self, flops: float, dtype: str, shape: tuple[int, int, int] | None) -> float:
        curve = self.matmul_curve(dtype)
        if curve is None or flops <= 0:
            return 1.0
        points = _nearest_rows(curve, shape)
        return _interpolate([(p.size, p.si) for p in points], flops) / self.peak(dtype)

    def gemm_s(
        self, m: float, k: int, n: int, dtype: str, itemsize: int, bandwidth_factor: float = 1.0
    ) -> tuple[float, str]:
        """(seconds, bound) of one GEMM x[m, k] @ w[n, k]^T that reads its weights once: at the matmul
        curve's rate for M = m where the calibration has one (its operands streaming no faster than
        the bandwidth times `bandwidth_factor`), else its roofline: the larger of its FLOPs at the
        peak and its weights' and rows' bytes at that bandwidth. The bound is the roofline's."""
        flops = 2.0 * m * k * n
        stream_s = (k * n + m * (k + n)) * itemsize / (self.bandwidth() * bandwidth_factor)
        peak_s = flops / self.peak(dtype)
        bound = "memory" if stream_s >= peak_s else "compute"
        if self.matmul_curve(dtype) is None:
            return max(stream_s, peak_s), bound
        shape = (m, k, n)  # M is an expected row count: fractional
        measured_s = flops / (self.peak(dtype) * self.eff_flops(flops, dtype, shape))  # type: ignore[arg-type]
        return (max(measured_s, stream_s) if bandwidth_factor < 1 else measured_s), bound

    def experts_s(self, work: ExpertWork, dtype: str, bandwidth_factor: float = 1.0) -> tuple[float, float]:
        """(compute-bound seconds, memory-bound seconds) of one moe_ffn call's expert GEMMs: every
        active expert's gate+up GEMM (M = rows, K = D, N = 2F) and down GEMM (M = rows, K = F, N = D),
        each by gemm_s, times the expected active experts."""
        out = {"compute": 0.0, "memory": 0.0}
        for k, n in ((work.dim, 2 * work.ffn), (work.ffn, work.dim)):
            seconds, bound = self.gemm_s(work.rows, k, n, dtype, work.itemsize, bandwidth_factor)
            out[bound] += work.active * seconds
        return out["compute"], out["memory"]

    def kernel_row(
        self,
        group: str,
        pattern: str,
        cost: Cost,
        dtype: str,
        shape: tuple[int, int, int] | None,
        matrix: bool,
        host_ops: int | None = None,
        launches: int = 1,
        operand_bytes: float = 0.0,
        experts: Sequence[ExpertWork] = (),
        occupancy: float | None = None,
        limited_by: str | None = None,
    ) -> KernelRow:
        factor = occupancy_factor(occupancy)
        notes = []
        bw = self.bandwidth()
        if experts:
            # Expert GEMMs at the rate of their rows per expert; the rest of the traffic (x, routing,
            # output, a fused neighbour's) at the read curve's rate.
            compute_s = memory_s = 0.0
            for work in experts:
                c, m = self.experts_s(work, dtype, factor)
                compute_s, memory_s = compute_s + c, memory_s + m
                notes.append(work.describe())
            rest = max(cost.bytes - sum(w.cost_weight_bytes for w in experts), 0.0)
            memory_s += rest / (bw * self.eff_bw(rest, "read") * factor) if rest > 0 else 0.0
            core_s = compute_s + memory_s
        else:
            compute_s = 0.0
            if cost.flops > 0:
                eff = self.eff_flops(cost.flops, dtype, shape) if matrix else 1.0
                compute_s = cost.flops / (self.peak(dtype) * eff)
            measured_gemm = matrix and operand_bytes > 0 and self.matmul_curve(dtype) is not None
            # A projection's measured matmul rate already moved its own operands (weights cold in
            # cache): only the group's other traffic (a residual, a norm's weight, cache writes) adds.
            rest = max(cost.bytes - operand_bytes, 0.0) if measured_gemm else cost.bytes
            # Attention streams its KV cache (reads); norms, elementwise ops and gathers write about
            # what they read, as a copy does.
            traffic = "attention" if pattern == "cache_attention" else "read" if matrix else "copy"
            memory_s = rest / (bw * self.eff_bw(rest, traffic) * factor) if rest > 0 else 0.0
            if measured_gemm and factor < 1 and operand_bytes / (bw * factor) > compute_s:
                # At low occupancy the GEMM's operands cannot stream at the rate the suite measured.
                compute_s, memory_s = 0.0, memory_s + operand_bytes / (bw * factor)
            core_s = compute_s + memory_s if measured_gemm else max(memory_s, compute_s)
        if factor < 1:
            why = f", limited by {limited_by}" if limited_by else ""
            notes.append(
                f"occupancy {occupancy:.3g}{why}: memory at {factor:.0%} of the bandwidth (saturates at "
                f"{SATURATING_OCCUPANCY:g}, assumed)"
            )
        overhead = self.launch_overhead_s * launches
        if host_ops is not None and self.op_overhead_s is not None:
            overhead += max(host_ops - 1, 0) * self.op_overhead_s
        if overhead > core_s:
            bound = "overhead"
        else:
            bound = "compute" if compute_s > memory_s else "memory"
        return KernelRow(
            group=group,
            pattern=pattern,
            bytes=cost.bytes,
            flops=cost.flops,
            dtype=dtype,
            memory_s=memory_s,
            compute_s=compute_s,
            overhead_s=overhead,
            predicted_s=core_s + overhead,
            bound=bound,
            occupancy=occupancy,
            bandwidth_factor=factor,
            note="; ".join(notes),
        )


def streaming_occupancy(resources: Mapping[str, Any], hw: HardwareModel) -> tuple[float, str | None] | None:
    """(occupancy, what limits it) of a compiled kernel for its memory rate: the lowest of its units'
    (report resources, backends/gpu/aot.py), where a pipelined unit (num_stages > 1) whose tiles staged
    in shared memory keep at least bw x ASSUMED_MEMORY_LATENCY_S / compute units bytes in flight per SM
    (Little's law) counts as saturated however few warps it has; None where nothing was reported."""
    units = [u for u in resources.get("units", ()) if isinstance(u.get("occupancy"), int | float)]
    if not units:
        occ = resources.get("occupancy")
        return (float(occ), resources.get("limited_by")) if isinstance(occ, int | float) else None
    sms = hw.profile.compute_units()
    need = hw.bandwidth() * ASSUMED_MEMORY_LATENCY_S / sms if sms else None
    worst: tuple[float, str | None] | None = None
    for u in units:
        occ, why = float(u["occupancy"]), u.get("limited_by")
        stages = int(u.get("num_stages") or 1)
        staged = u.get("shared_dynamic_bytes") or u.get("lds_dynamic_bytes") or 0  # NVIDIA, AMD
        blocks = int(u.get("blocks_per_unit") or 0)
        if need and stages > 1 and staged and blocks:
            in_flight = blocks * staged * (stages - 1) / stages
            if in_flight >= need:
                occ = max(occ, SATURATING_OCCUPANCY)
        if worst is None or occ < worst[0]:
            worst = (occ, f"{why} ({u.get('unit')})" if why and u.get("unit") else why)
    return worst


def occupancy_factor(occupancy: float | None) -> float:
    """The share of the bandwidth a kernel at `occupancy` (resident warps over the maximum) streams
    at: min(1, occupancy / SATURATING_OCCUPANCY); 1 where the occupancy is not known."""
    if occupancy is None or not math.isfinite(occupancy) or occupancy <= 0:
        return 1.0
    return min(1.0, occupancy / SATURATING_OCCUPANCY)


@dataclass(frozen=True)
class ExpertWork:
    """One moe_ffn call's expected expert work, assuming uniform routing (module docstring): each of
    `tokens` tokens picks `k` distinct of `total_experts` experts, each with probability k / E; this
    device holds `experts` of them (E, or E / ep under expert parallelism) and serves tokens k / ep
    token-expert rows."""

    experts: int
    total_experts: int
    k: int
    tokens: int
    dim: int  # D
    ffn: int  # F
    itemsize: int  # the weights' bytes per element
    ep: int = 1

    @property
    def active(self) -> float:
        """Expected distinct active experts here: experts (1 - (1 - k/E)^tokens)."""
        return self.experts * (1.0 - (1.0 - self.k / self.total_experts) ** self.tokens)

    @property
    def rows(self) -> float:
        """Expected rows (token-expert assignments) per active expert: tokens k / ep / active."""
        return self.tokens * self.k / self.ep / self.active

    @property
    def cost_weight_bytes(self) -> float:
        """The expert weight bytes the op table (or parallel.py's per-device cost) counts: every
        expert a row may touch, min(experts, rows served), read once."""
        return min(self.experts, self.tokens * self.k / self.ep) * 3.0 * self.ffn * self.dim * self.itemsize

    def describe(self) -> str:
        ep = f" (EP={self.ep}: {self.experts} of {self.total_experts} experts here)" if self.ep > 1 else ""
        return (
            f"uniform routing{ep}: {self.active:.4g} of {self.experts} experts active, {self.rows:.4g} "
            f"rows each; each expert's GEMMs at M = {self.rows:.4g}"
        )


def expert_work(
    group: PlanGroup,
    by_name: Mapping[str, Any],
    types: Mapping[str, TensorType],
    bindings: Mapping[str, int],
    expert_parallel: int = 1,
) -> list[ExpertWork]:
    """The expert work of each moe_ffn node in `group` (none: an empty list). Under expert
    parallelism the plan is one device's: its moe nodes hold E / `expert_parallel` experts."""
    out = []
    for name in group.nodes:
        node = by_name[name]
        if node.op != "moe_ffn":
            continue
        x, routing, w_gate = types[node.inputs[0]], types[node.inputs[1]], types[node.inputs[3]]
        experts, ffn, dim = (numel((d,), bindings) for d in w_gate.shape)
        out.append(
            ExpertWork(
                experts=experts,
                total_experts=experts * expert_parallel,
                k=numel(routing.shape[-1:], bindings),
                tokens=numel(x.shape[:-1], bindings),
                dim=dim,
                ffn=ffn,
                itemsize=w_gate.dtype.itemsize,
                ep=expert_parallel,
            )
        )
    return out


def predict(
    plan: Plan,
    profile: Profile | None = None,
    *,
    calibration_dir: Path | None = None,
    costs: Mapping[str, Cost] | None = None,
    host_ops: Mapping[str, int] | None = None,
    launches: Mapping[str, int] | None = None,
    occupancy: Mapping[str, float | tuple[float, str | None]] | None = None,
    expert_parallel: int = 1,
) -> Prediction:
    """The predicted step of `plan` at its bindings on `profile` (default: the plan's, with the
    calibration overlay from `calibration_dir` or POLYMORPH_CALIBRATION_DIR). `costs` replaces the
    op-table cost of the groups it names (parallel.py's per-device expert work); `host_ops` gives the
    ops each group dispatches from the host (CpuExecutable.host_ops); `launches` the kernels each
    group launches per call (its compile units, backends/gpu `launch_counts`; default one);
    `occupancy` the occupancy each group's compiled code reaches (the report's resources: a fraction,
    or (fraction, what limits it)); `expert_parallel` the EP degree the plan is one device of (its moe
    nodes hold E / EP experts). UserError when the plan has unbound symbols or the profile lacks a
    figure the model needs."""
    if profile is None:
        from polymorph.knobs import knobs

        profile = load_profile(plan.profile, calibration_dir or knobs.calibration_dir)
    graph = plan.graph
    bindings = dict(plan.bindings)
    missing = sorted(graph.symbols() - set(bindings))
    if missing:
        raise UserError(
            f"the plan has no sizes for {', '.join(missing)}; compile it for a bucket (--batch/--ctx or "
            f"--traffic) before predicting"
        )
    model = HardwareModel(profile)
    types = graph.types()
    by_name = {n.name: n for n in graph.nodes}
    rows = []
    gpu = Target.parse(plan.target).is_gpu
    for group in plan.groups:
        # The GPU runtime binds a reshape, and a slice whose result is contiguous (a decode step's
        # last-token slice), as a view: no launch, no time.
        if gpu and _binds_as_view(group, by_name, types, bindings):
            rows.append(KernelRow(group.id, group.pattern, 0.0, 0.0, compute_dtype(group, types), 0.0, 0.0,
                                  0.0, 0.0, "view"))  # fmt: skip
            continue
        cost = (costs or {}).get(group.id) or group_cost(graph, group, types, bindings)
        ops = {by_name[n].op for n in group.nodes}
        gemm = _matmul_shape(group, by_name, types, bindings)
        shape = gemm[0] if gemm else _attention_shape(group, by_name, types, bindings)
        occ = (occupancy or {}).get(group.id)
        occ, limited_by = occ if isinstance(occ, tuple) else (occ, None)
        rows.append(
            model.kernel_row(
                group.id,
                group.pattern,
                cost,
                compute_dtype(group, types),
                shape,
                matrix=bool(ops & MATRIX_OPS),
                host_ops=(host_ops or {}).get(group.id),
                launches=(launches or {}).get(group.id, 1),
                operand_bytes=gemm[1] if gemm and group.id not in (costs or {}) else 0.0,
                experts=expert_work(group, by_name, types, bindings, expert_parallel),
                occupancy=occ,
                limited_by=limited_by,
            )
        )
    return Prediction(
        profile=profile.id,
        model=plan.model or graph.name,
        bindings=bindings,
        kernels=tuple(rows),
        footprint=footprint(plan),
        calibrated=model.calibrated,
        basis=model.basis(),
        step_overhead_s=model.step_overhead_s,
        launch_overhead_s=model.launch_overhead_s,
        launch_source=model.launch_figure()[1],
    )


def _binds_as_view(
    group: PlanGroup, by_name: Mapping[str, Any], types: Mapping[str, TensorType], bindings: Mapping[str, int]
) -> bool:
    """What backends/gpu/runtime.py `_view` binds without a copy: a reshape, or a slice of a contiguous
    tensor whose result is contiguous (every dim before the axis is 1, or the slice is the whole axis)."""
    if group.pattern == "reshape":
        return True
    if group.pattern != "slice":
        return False
    node = by_name[group.nodes[0]]
    shape = [int(d) for d in concrete(types[node.inputs[0]].shape, bindings)]
    axis = int(node.attrs["axis"]) % len(shape)
    start, end, _ = slice(node.attrs["start"], node.attrs.get("end")).indices(shape[axis])
    return math.prod(shape[:axis]) == 1 or end - start == shape[axis]


def footprint(plan: Plan) -> Footprint:
    """Memory a step of `plan` needs at its bindings; see FOOTPRINT_METHOD for how."""
    graph, bindings = plan.graph, dict(plan.bindings)
    weights = sum(tensor_bytes(t, bindings) for t in graph.params.values())
    kv = sum(tensor_bytes(t, bindings) for t in graph.state.values())
    return Footprint(float(weights), float(kv), float(_peak_activations(plan, graph, bindings)))


def _peak_activations(plan: Plan, graph: Graph, bindings: Mapping[str, int]) -> int:
    types = graph.types()
    aliases = {o for n in graph.nodes if n.op == "kv_write" for o in n.outputs}
    end = len(plan.groups)
    first: dict[str, int] = {v: 0 for v in graph.inputs}
    last: dict[str, int] = {v: end for v in graph.outputs.values()}
    for i, group in enumerate(plan.groups):
        for v in group.outputs:
            first.setdefault(v, i)
        for v in group.inputs:
            last[v] = max(last.get(v, i), i)
    live = [0] * (end + 1)
    for v, start in first.items():
        if v in aliases or v in graph.params or v in graph.state:
            continue
        size = tensor_bytes(types[v], bindings)
        for i in range(start, max(last.get(v, start), start) + 1):
            live[i] += size
    return max(live)


def _matmul_shape(
    group: PlanGroup, by_name: Mapping[str, Any], types: Mapping[str, TensorType], bindings: Mapping[str, int]
) -> tuple[tuple[int, int, int], float] | None:
    """((M, K, N), operand bytes) of the group's projections, or None when it has none. Projections of
    one input (q, k and v; gate and up) count as one GEMM of their summed N; of several such GEMMs,
    the largest. Operand bytes: x, the weights and the outputs of those projections."""
    gemms: dict[tuple[str, int, int], list[float]] = {}
    for name in group.nodes:
        node = by_name[name]
        if node.op != "linear":
            continue
        x, w = types[node.inputs[0]], types[node.inputs[1]]
        n_out, k = (numel((d,), bindings) for d in w.shape)
        m = numel(x.shape[:-1], bindings)
        acc = gemms.setdefault((node.inputs[0], m, k), [0.0, tensor_bytes(x, bindings)])
        acc[0] += n_out
        acc[1] += tensor_bytes(w, bindings) + tensor_bytes(types[node.outputs[0]], bindings)
    if not gemms:
        return None
    (_, m, k), (n, operands) = max(gemms.items(), key=lambda kv: kv[0][1] * kv[0][2] * kv[1][0])
    return (m, k, int(n)), operands


def _attention_shape(
    group: PlanGroup, by_name: Mapping[str, Any], types: Mapping[str, TensorType], bindings: Mapping[str, int]
) -> tuple[int, int, int] | None:
    """(M, K, N) of the group's attention as matrix work: the query rows that share one KV head
    (seq x heads / kv_heads: grouped-query heads read each K and V row once), head_dim, context (the
    keys each query sees: under a sliding window, at most the window)."""
    for name in group.nodes:
        node = by_name[name]
        if node.op not in ("cache_attention", "attention"):
            continue
        q, k = types[node.inputs[0]], types[node.inputs[1]]
        s, h, d = (numel((dim,), bindings) for dim in q.shape[1:])
        if node.op == "cache_attention":
            table = types[node.inputs[3]]
            ctx = numel((table.shape[1],), bindings) * numel((k.shape[1],), bindings)
            kv = numel((k.shape[2],), bindings)
        else:
            ctx, kv = numel((k.shape[1],), bindings), numel((k.shape[2],), bindings)
        window = node.attrs.get("window", 0)
        return s * max(h // max(kv, 1), 1), d, min(ctx, window) if window else ctx
    return None


def _nearest_rows(curve: Curve, shape: tuple[int, int, int] | None) -> Sequence[Any]:
    """The curve's points whose M is nearest `shape`'s M in log (the smallest M's when no shape); of
    those, the ones of the same K where the curve has any."""
    rows = sorted({p.shape[0] for p in curve.points if p.shape})
    if not rows:
        return curve.points
    m = rows[0] if shape is None else min(rows, key=lambda r: abs(math.log(r) - math.log(shape[0])))
    near = [p for p in curve.points if p.shape and p.shape[0] == m]
    same_k = [p for p in near if shape is not None and p.shape[1] == shape[1]]
    return same_k or near


def _interpolate(points: Sequence[tuple[float, float]], size: float) -> float:
    """Piecewise-linear in log(size) through (size, value) points sorted by size; flat beyond the ends."""
    pts = sorted(points)
    if size <= pts[0][0]:
        return pts[0][1]
    if size >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= size <= x1:
            if x1 == x0:
                return y1
            t = (math.log(size) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return pts[-1][1]
