"""The per-kernel table `polymorph compile` prints: what each kernel takes of the chip and what it is
predicted to cost, read from the report's resources (backends/gpu/aot.py says where each comes from).

Columns: group, kernel (with the library it calls, if any), registers (NVIDIA) or VGPRs (AMD, with the
allocation where padding or AGPRs make it larger), spills with their kind, shared memory or LDS per
block, occupancy with the limit that binds it, and the predicted time. A figure the backend does not
report is `-`; one it could not read is `?`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polymorph.cli import console
from polymorph.pipeline.plan import KernelReport, Report

COLUMNS = ("group", "kernel", "registers", "spills", "shared/LDS", "occupancy", "predicted")
SHOWN = 40  # kernels listed in full without --verbose
HEAD = 30  # kernels listed before the "... more" row when there are more than SHOWN


def print_kernels(report: Report, title: str, verbose: bool = False) -> None:
    """Print the table of `report`'s kernels (all of them with `verbose`, else the first HEAD of a
    report with more than SHOWN)."""
    rows = [kernel_row(k) for k in report.kernels]
    if not verbose and len(rows) > SHOWN:
        rows = [*rows[:HEAD], ("...", f"{len(rows) - HEAD} more", *[""] * (len(COLUMNS) - 2))]
    console.table(title, COLUMNS, rows)


def kernel_row(k: KernelReport) -> tuple[str, ...]:
    res = k.resources or {}
    kernel = k.kernel.split("@")[0] + (f" ({k.library})" if k.library else "")
    return (
        k.group,
        kernel,
        registers(res),
        spills(res),
        shared(res),
        occupancy(res),
        console.seconds(k.predicted_s),
    )


def _own(res: Mapping[str, Any]) -> bool:
    """Whether the group runs device code of ours (a library call, or a cpu kernel, has no figures)."""
    return res.get("device_code", True) and any(
        key in res for key in ("registers", "vgprs", "shared_bytes", "lds_bytes")
    )


def registers(res: Mapping[str, Any]) -> str:
    if not _own(res):
        return "-"
    if "vgprs" in res:
        vgprs, alloc, agprs = res.get("vgprs"), res.get("vgprs_allocated"), res.get("agprs") or 0
        if vgprs is None:
            return "?"
        text = f"{vgprs} VGPR" + (f" + {agprs} AGPR" if agprs else "")
        return text + (f" ({alloc} allocated)" if alloc and alloc > vgprs + agprs else "")
    regs = res.get("registers")
    return "?" if regs is None else str(regs)


def spills(res: Mapping[str, Any]) -> str:
    if not _own(res):
        return "-"
    if "vgprs" in res:  # AMD: VGPRs to scratch memory, SGPRs to VGPR lanes
        vgpr, sgpr = res.get("vgpr_spills"), res.get("sgpr_spills")
        if vgpr is None and sgpr is None:
            return "?"
        parts = []
        if vgpr:
            parts.append(f"{vgpr} VGPR to scratch")
        if sgpr:
            parts.append(f"{sgpr} SGPR to VGPR lanes")
        return ", ".join(parts) or "0"
    if "spill_store_bytes" not in res:
        return "?"
    stores, loads = res["spill_store_bytes"], res.get("spill_load_bytes") or 0
    if not stores and not loads:
        return "0"
    return f"{console.quantity(stores, 'B')} to local ({console.quantity(loads, 'B')} reloaded)"


def shared(res: Mapping[str, Any]) -> str:
    if not _own(res):
        return "-"
    value = res.get("lds_bytes", res.get("shared_bytes"))
    return "?" if value is None else console.quantity(value, "B")


def occupancy(res: Mapping[str, Any]) -> str:
    if not _own(res) or res.get("occupancy") is None:
        return "-"
    limit = res.get("limited_by")
    return f"{res['occupancy']:.0%}" + (f" ({limit})" if limit else "")
