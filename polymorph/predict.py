"""Per-kernel cost and predicted time for a plan, from the op table's FLOPs and bytes and the profile's
roofline. This is the floor a kernel can reach; the calibrated cost model (costmodel.py) refines it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from polymorph.errors import UserError
from polymorph.hw import load_profile, roofline_seconds
from polymorph.ir.graph import Graph
from polymorph.ir.ops import Cost, node_cost
from polymorph.plan import KernelReport, Plan, PlanGroup, Report


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
    from polymorph.ir.shapes import numel

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
    launch overhead, costmodel.py), keeping the floor beside it; the step adds the footprint."""
    from polymorph.costmodel import predict

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
