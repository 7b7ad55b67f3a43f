"""The calibrated cost model: predicted time per kernel call and per step, and a plan's memory footprint.

Per kernel call (one plan group):

    projections: time = flops / matmul_rate(M, K, N) + other bytes / (bw * eff_bw(other bytes)) + launches
    other groups: time = max(bytes / (bw * eff_bw(bytes)), flops / (peak * eff_flops)) + launches

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
  kv_heads: grouped-query heads read each K and V row once), K = head_dim; moe_ffn uses the smallest
  M's points (routed experts are matrix-vector work). Other groups run at efficiency 1 on compute:
  their flops are negligible and memory or launch overhead bounds them.
- launch overhead: the calibration's measured `launch_overhead`, else DEFAULT_LAUNCH_OVERHEAD_S, once
  per kernel the group launches (a split decode attention launches two; counted from the plan's
  compile units where the caller gives them, else one). Where
  the caller knows how many ops a kernel dispatches from the host (the cpu backend's torch kernels:
  `host_ops`, counted in one untimed step) and the calibration has `op_overhead` (one bare op), each op
  beyond the first adds it: a small cpu kernel's time is mostly dispatch, not arithmetic.
Without calibration every efficiency is 1 and the prediction says it is uncalibrated.

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
    plan: Plan, resources_of: Callable[[PlanGroup], dict[str, Any]], calibration_dir=None
) -> Report:
    """report.json for a compiled plan: cost, roofline prediction and resources per kernel."""
    from polymorph.knobs import knobs

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

    # Kernels per call, where the compile counted them (a GPU group's KernelFile.launches).
    launches = {k.group: k.resources["launches"] for k in report.kernels if "launches" in k.resources}
    try:
        pred = predict(plan, profile, launches=launches)
    except UserError:
        return  # the floor stands, with its own explanation
    rows = {r.group: r for r in pred.kernels}
    for k in report.kernels:
        row = rows[k.group]
        k.floor_s, k.predicted_s, k.bound = k.predicted_s, row.predicted_s, row.bound
    report.predicted_step_s = pred.step_s
    report.prediction = f"cost model: {pred.basis}"
    fp = pred.footprint
    report.footprint = {"weights_bytes": fp.weights_bytes, "kv_cache_bytes": fp.kv_cache_bytes,
                        "activation_bytes": fp.activation_bytes, "method": fp.method}  # fmt: skip


# Per-call overhead when nothing is measured: a GPU kernel launched from the host costs a few
# microseconds (captured graphs cut it; a Python-driven cpu kernel costs about as much). An assumed
# order of magnitude, not a measurement: calibrate to replace it.
DEFAULT_LAUNCH_OVERHEAD_S = 5e-6

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
        cal = self.profile.calibration
        if cal is not None and cal.launch_overhead is not None:
            return cal.launch_overhead.si
        return DEFAULT_LAUNCH_OVERHEAD_S

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
        if cal is None:
            return (
                f"uncalibrated: {self.profile.id}'s vendor figures at efficiency 1, launch overhead "
                f"{DEFAULT_LAUNCH_OVERHEAD_S * 1e6:g} us (assumed default)"
            )
        curves = ", ".join(c.name for c in cal.curves) or "no curves (efficiency 1)"
        overhead = "measured" if cal.launch_overhead is not None else "assumed default"
        step = f"; step overhead {self.step_overhead_s * 1e6:.3g} us" if cal.step_overhead is not None else ""
        op = f"; {self.op_overhead_s * 1e6:.3g} us per host op" if self.op_overhead_s is not None else ""
        return (
            f"calibrated ({cal.path}, {cal.provenance()}): curves {curves}; launch overhead "
            f"{self.launch_overhead_s * 1e6:.3g} us ({overhead}){step}{op}"
        )

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
    ) -> KernelRow:
        compute_s = 0.0
        if cost.flops > 0:
            eff = self.eff_flops(cost.flops, dtype, shape) if matrix else 1.0
            compute_s = cost.flops / (self.peak(dtype) * eff)
        measured_gemm = matrix and operand_bytes > 0 and self.matmul_curve(dtype) is not None
        # A projection's measured matmul rate already moved its own operands (weights cold in cache):
        # only the group's other traffic (a residual, a norm's weight, cache writes) adds to it.
        rest = max(cost.bytes - operand_bytes, 0.0) if measured_gemm else cost.bytes
        # Attention streams its KV cache (reads); norms, elementwise ops and gathers write about what
        # they read, as a copy does.
        traffic = "attention" if pattern == "cache_attention" else "read" if matrix else "copy"
        memory_s = rest / (self.bandwidth() * self.eff_bw(rest, traffic)) if rest > 0 else 0.0
        core_s = compute_s + memory_s if measured_gemm else max(memory_s, compute_s)
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
        )


def predict(
    plan: Plan,
    profile: Profile | None = None,
    *,
    calibration_dir: Path | None = None,
    costs: Mapping[str, Cost] | None = None,
    host_ops: Mapping[str, int] | None = None,
    launches: Mapping[str, int] | None = None,
) -> Prediction:
    """The predicted step of `plan` at its bindings on `profile` (default: the plan's, with the
    calibration overlay from `calibration_dir` or POLYMORPH_CALIBRATION_DIR). `costs` replaces the
    op-table cost of the groups it names (parallel.py's per-device expert work); `host_ops` gives the
    ops each group dispatches from the host (CpuExecutable.host_ops); `launches` the kernels each
    group launches per call (its compile units, backends/gpu `launch_counts`; default one). UserError
    when the plan has unbound symbols or the profile lacks a figure the model needs."""
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
    (seq x heads / kv_heads: grouped-query heads read each K and V row once), head_dim, context."""
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
        return s * max(h // max(kv, 1), 1), d, ctx
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
