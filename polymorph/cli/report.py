"""`polymorph report DIR`: pictures of a compile or tune output, and a summary table.

Reads DIR/report.json (a `compile --out` or `tune --out` folder: both hold the plan's report) and writes
into DIR (or --out):
- roofline.json: one point per kernel of the plan, with its FLOPs, bytes, arithmetic intensity, roofline
  floor and its time (measured where report.json has measured_s, else the tune's fast-tier median for
  the group where DIR is a tune output, else the prediction), so that any tool can redraw the chart;
- roofline.png: two panels, the classic roofline (attained FLOP/s against arithmetic intensity under the
  chip's compute roof and bandwidth slope) and each kernel's time against its floor (a kernel on the
  diagonal runs at its floor; the distance above it is what is left to win);
- for a tune output, tune-progress.json and tune-progress.png: the searched kernels' best-so-far
  speedup over the stock kernels against time, per bucket, from the tune's board.
The charts need matplotlib (`pip install 'polymorph[plot]'`); without it the data and the table are
written and one warning line says so. The terminal gets the top kernels by time, layers folded together,
with their share of the step and their distance from the floor.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polymorph.cli import console
from polymorph.errors import UserError

SCHEMA_VERSION = 1
TOP = 10  # kernel roles in the terminal table
LABELLED = 6  # kernel roles named in the charts' legends, by time; the rest are "other"
_LAYER = re.compile(r"\blayers\.\d+\.")


def add_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `polymorph report` on the CLI's subparsers (cli.build_parser's `sub`)."""
    help = "chart a compile or tune output: roofline of its kernels, a tune's best-so-far; summary table"
    c = subparsers.add_parser("report", help=help, description=help)
    c.set_defaults(fn=cmd_report)
    c.add_argument("dir", help="a `polymorph compile --out` or `polymorph tune --out` folder")
    c.add_argument("--out", help="where the charts and their data go (default: DIR)")
    c.add_argument("--board", type=Path, help="a tune's board, when not DIR/board.sqlite")
    return c


def cmd_report(args: argparse.Namespace) -> int:
    src = Path(args.dir)
    out = Path(args.out) if args.out else src
    report = read_report(src)
    tune = (
        read_json(src / "tune-report.json", "tune-report.json")
        if (src / "tune-report.json").exists()
        else None
    )
    data = roofline_data(report, tune)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "roofline.json", data)
        progress = None
        if tune is not None:
            board = args.board or src / "board.sqlite"
            if board.is_file():
                progress = tune_progress(tune, board)
                write_json(out / "tune-progress.json", progress)
            else:
                console.warn(f"no tune board at {board}: no best-so-far chart (pass --board PATH)")
    except OSError as e:
        raise UserError(f"cannot write into {out}: {e.strerror}") from None
    print_summary(data)
    written = [out / "roofline.json"] + ([out / "tune-progress.json"] if progress else [])
    try:
        import matplotlib  # noqa: F401 (the optional extra `plot`)
    except ImportError:
        console.warn("no charts drawn: matplotlib is not installed; pip install 'polymorph[plot]'")
    else:
        written.append(draw_roofline(data, out / "roofline.png"))
        if progress is not None:
            written.append(draw_tune_progress(progress, out / "tune-progress.png"))
    if not any(k["time_s"] is not None and k["floor_s"] is not None for k in data["kernels"]):
        console.warn(
            f"report.json has no roofline floors ({data['prediction']}): the roofline chart is empty"
        )
    console.line("wrote " + ", ".join(str(p) for p in written))
    return 0


# --- reading ------------------------------------------------------------------------------------------


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UserError(f"{path}: cannot read {what} ({type(e).__name__}: {e})") from None


def read_report(src: Path) -> dict[str, Any]:
    """DIR/report.json, checked enough that the rest can read it; UserError otherwise."""
    if not src.exists():
        raise UserError(
            f"{src}: no such folder; pass a `polymorph compile --out` or `polymorph tune --out` folder"
        )
    if not src.is_dir():
        raise UserError(f"{src} is a file; pass the folder a `polymorph compile --out` or `tune --out` wrote")
    path = src / "report.json"
    if not path.is_file():
        raise UserError(
            f"{src} has no report.json, so it is not a compile or tune output; make one with "
            f"`polymorph compile MODEL --out {src}`"
        )
    report = read_json(path, "report.json")
    kernels = report.get("kernels") if isinstance(report, dict) else None
    if not isinstance(kernels, list) or not all(isinstance(k, dict) and "group" in k for k in kernels):
        raise UserError(f"{path} is not a polymorph report (no list of kernels with their groups)")
    return report


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def roofline_data(report: Mapping[str, Any], tune: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The chart's data: one point per kernel of report.json, in its order, with the report's figures
    unchanged (flops, bytes, floor_s, predicted_s, measured_s) and what the chart derives from them."""
    tuned = _tuned_times(tune) if tune else {}
    kernels = []
    for k in report["kernels"]:
        flops, nbytes = _number(k.get("flops")) or 0.0, _number(k.get("bytes")) or 0.0
        predicted, measured = _number(k.get("predicted_s")), _number(k.get("measured_s"))
        # Without a cost model the prediction is the roofline floor itself (cost.model.plan_report).
        floor = _number(k.get("floor_s"))
        floor_from = "floor_s"
        if floor is None and predicted is not None:
            floor, floor_from = predicted, "predicted_s (the roofline floor: no cost model)"
        group = k["group"]
        if measured is not None:
            time_s, time_from = measured, "measured_s"
        elif group in tuned:
            time_s, time_from = tuned[group], "tune: fast-tier median of the group"
        else:
            time_s, time_from = predicted, "predicted_s"
        kernels.append({
            "group": group, "role": _LAYER.sub("layers.*.", group), "kernel": k.get("kernel", ""),
            "flops": flops, "bytes": nbytes, "intensity_flop_per_byte": flops / nbytes if nbytes else None,
            "floor_s": floor, "floor_from": floor_from, "predicted_s": predicted, "measured_s": measured,
            "tuned_s": tuned.get(group), "time_s": time_s, "time_from": time_from, "bound": k.get("bound"),
            "times_floor": time_s / floor if time_s is not None and floor else None,
        })  # fmt: skip
    total = sum(k["time_s"] for k in kernels if k["time_s"] is not None)
    for k in kernels:
        k["share"] = k["time_s"] / total if k["time_s"] is not None and total else None
    return {
        "schema_version": SCHEMA_VERSION,
        "model": report.get("model"), "backend": report.get("backend"), "target": report.get("target"),
        "profile": report.get("profile"), "bindings": report.get("bindings"),
        "prediction": report.get("prediction", ""), "predicted_step_s": _number(report.get("predicted_step_s")),
        "kernel_time_s": total, "roof": _roof(report), "kernels": kernels,
    }  # fmt: skip


def _tuned_times(tune: Mapping[str, Any]) -> dict[str, float]:
    """Group -> the tune's fast-tier time of the kernel its tuned plan runs there (the best candidate
    where the plan took it, else the stock kernel), for the plan in DIR (the first bucket's)."""
    buckets = tune.get("buckets") or []
    out: dict[str, float] = {}
    for sig in (buckets[0].get("signatures") or []) if buckets else []:
        best = sig.get("best") or {}
        t = _number(best.get("median_s")) if sig.get("chosen") else _number(sig.get("stock_s"))
        if t is not None:
            out.update({g: t for g in sig.get("groups") or []})
    return out


def _roof(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chip's compute roof and bandwidth slope, from its profile (calibrated where it is)."""
    from polymorph.hardware.profile import load_profile
    from polymorph.knobs import knobs

    try:
        profile = load_profile(str(report.get("profile")), knobs.calibration_dir)
        bandwidth = profile.memory_bandwidth()
        dtype = "bf16" if profile.peak_flops("bf16") else "f32"
        peak = profile.peak_flops(dtype)
    except (UserError, OSError, ValueError, KeyError):
        return None
    if not peak or not bandwidth:
        return None
    return {"peak_flop_per_s": peak, "peak_dtype": dtype, "bandwidth_byte_per_s": bandwidth,
            "source": "calibration" if profile.calibration is not None else "vendor figures"}  # fmt: skip


def tune_progress(tune: Mapping[str, Any], board_path: Path) -> dict[str, Any]:
    """Per bucket of the tune: (seconds since its first post, best-so-far speedup) after each passing
    result on the board. The speedup is the searched op signatures' stock time over their best time so
    far, each weighted by its group count, on the fast tier (the tune's own measurements)."""
    from polymorph.search.board import Board

    board = Board(board_path)
    try:
        candidates = board.candidates()
    finally:
        board.close()
    buckets = []
    for b in tune.get("buckets") or []:
        sigs = [s for s in b.get("signatures") or [] if _number(s.get("stock_s"))]
        of_group = {g: s["signature"] for s in sigs for g in s.get("groups") or []}
        weight = {s["signature"]: len(s.get("groups") or []) for s in sigs}
        stock = {s["signature"]: float(s["stock_s"]) for s in sigs}
        mine = [c for c in candidates if c.group.split("@")[1:2] == [b.get("bucket")]]
        if not mine or not sigs:
            buckets.append({"bucket": b.get("bucket"), "points": []})
            continue
        t0 = min(c.posted for c in mine)
        best = dict(stock)
        points = [{"t_s": 0.0, "speedup": 1.0, "candidate": None, "agent": None}]
        done = sorted(
            (c for c in mine if c.result is not None and c.result.ok), key=lambda c: c.result.finished
        )
        for c in done:
            sig = of_group.get(c.group.split("@")[0])
            median = _number((c.result.measurements or {}).get("median_s"))
            if sig is None or median is None or c.agent == "baseline":  # the stock kernel is the start
                continue
            best[sig] = min(best[sig], median)
            speedup = sum(weight[s] * stock[s] for s in stock) / sum(weight[s] * best[s] for s in stock)
            points.append(
                {"t_s": c.result.finished - t0, "speedup": speedup, "candidate": c.id, "agent": c.agent}
            )
        buckets.append({"bucket": b.get("bucket"), "points": points})
    return {"schema_version": SCHEMA_VERSION, "model": tune.get("model"), "profile": tune.get("profile"),
            "board": str(board_path), "buckets": buckets}  # fmt: skip


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


# --- the table ----------------------------------------------------------------------------------------


def roles(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The kernels with a time, folded by role (the same group in every layer), slowest first."""
    by: dict[str, dict[str, Any]] = {}
    for k in data["kernels"]:
        if k["time_s"] is None:
            continue
        r = by.setdefault(k["role"], {"role": k["role"], "count": 0, "time_s": 0.0, "floor_s": 0.0,
                                      "floored": True, "bound": k["bound"], "time_from": k["time_from"]})  # fmt: skip
        r["count"] += 1
        r["time_s"] += k["time_s"]
        if k["floor_s"] is None:
            r["floored"] = False
        else:
            r["floor_s"] += k["floor_s"]
    total = data["kernel_time_s"] or 0.0
    for r in by.values():
        r["share"] = r["time_s"] / total if total else None
        r["times_floor"] = r["time_s"] / r["floor_s"] if r["floored"] and r["floor_s"] else None
    return sorted(by.values(), key=lambda r: -r["time_s"])


def print_summary(data: Mapping[str, Any]) -> None:
    rows = []
    table = roles(data)
    for r in table[:TOP]:
        rows.append((
            _short(r["role"], 44), r["count"], console.seconds(r["time_s"]),
            f"{r['share']:.0%}" if r["share"] is not None else "-",
            console.seconds(r["floor_s"]) if r["floored"] else "-",
            f"{r['times_floor']:.1f}x" if r["times_floor"] else "-", r["bound"] or "-",
        ))  # fmt: skip
    if len(table) > TOP:
        rows.append(("...", f"{len(table) - TOP} more", "", "", "", "", ""))
    basis = sorted({BASIS[k["time_from"]] for k in data["kernels"] if k["time_s"] is not None})
    console.table(
        f"{data['model']} on {data['profile']} ({data['target']}): top kernels by time "
        f"({', '.join(basis) or 'no times'}; {len(data['kernels'])} kernels, "
        f"{console.seconds(data['kernel_time_s'] or None)} in all)",
        ["kernel", "n", "time", "share", "floor", "x floor", "bound"],
        rows,
    )


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# --- the charts ---------------------------------------------------------------------------------------


BASIS = {
    "measured_s": "measured",
    "predicted_s": "predicted",
    "tune: fast-tier median of the group": "tune-measured",
}
TIME_NAMES = {"measured_s": "measured time", "predicted_s": "predicted time (cost model)",
              "tune: fast-tier median of the group": "time measured in the tune (fast tier)"}  # fmt: skip


def _bindings(bindings: Any) -> str:
    if not isinstance(bindings, Mapping):
        return "-"
    return ", ".join(f"{k} {v}" for k, v in bindings.items())


def _colours(data: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """Role -> (legend label, colour): the LABELLED slowest roles by name, the rest "other"."""
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    named = [r["role"] for r in roles(data)[:LABELLED]]
    out = {role: (_short(role, 42), palette[i]) for i, role in enumerate(named)}
    for k in data["kernels"]:
        out.setdefault(k["role"], ("other", "0.55"))
    return out


def draw_roofline(data: Mapping[str, Any], path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5.6), dpi=110, layout="constrained")
    classic, vs = fig.subplots(1, 2)
    colours = _colours(data)
    order = list(colours)  # the named roles first (slowest first), so the legend reads in that order
    points = sorted(
        (k for k in data["kernels"] if k["time_s"] and k["floor_s"]), key=lambda k: order.index(k["role"])
    )
    seen: set[str] = set()

    def label(role: str) -> str:
        name = colours[role][0]
        if name in seen:
            return "_nolegend_"
        seen.add(name)
        return name

    # The classic roofline: attained rate against arithmetic intensity, under the chip's roof.
    rated = [k for k in points if k["flops"] > 0 and k["bytes"] > 0]
    roof = data.get("roof")
    if rated:
        xs = [k["intensity_flop_per_byte"] for k in rated]
        lo, hi = min(xs) / 4, max(xs) * 4
        if roof:
            ridge = roof["peak_flop_per_s"] / roof["bandwidth_byte_per_s"]
            lo, hi = min(lo, ridge / 8), max(hi, ridge * 8)
            grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            classic.plot(grid, [min(roof["peak_flop_per_s"], x * roof["bandwidth_byte_per_s"]) for x in grid],
                         color="black", lw=1.5, label=f"roof ({roof['peak_dtype']} peak, memory bandwidth; "
                         f"{roof['source']})")  # fmt: skip
        for k in rated:
            x = k["intensity_flop_per_byte"]
            classic.plot([x, x], [k["flops"] / k["floor_s"], k["flops"] / k["time_s"]], color="0.8", lw=0.8,
                         zorder=1)  # fmt: skip
            classic.scatter([x], [k["flops"] / k["time_s"]], color=colours[k["role"]][1], s=28, zorder=3)
        classic.set_xlim(lo, hi)
        classic.set_xscale("log")
        classic.set_yscale("log")
        classic.legend(fontsize=7, loc="lower right")
    else:
        classic.text(
            0.5, 0.5, "no kernel with FLOPs, bytes and a time", ha="center", transform=classic.transAxes
        )
    classic.set_xlabel("arithmetic intensity (FLOP/byte)")
    classic.set_ylabel("attained rate (FLOP/s)")
    classic.set_title(
        "roofline: each kernel's rate (dot) below its floor's (grey line to the roof)", fontsize=9
    )
    classic.grid(True, which="major", alpha=0.3)

    # Time against floor: the diagonal is the floor, each decade above it a 10x slower kernel.
    if points:
        for k in points:
            vs.scatter([k["floor_s"] * 1e6], [k["time_s"] * 1e6], color=colours[k["role"]][1], s=28, zorder=3,
                       label=label(k["role"]))  # fmt: skip
        lo = min(min(k["floor_s"], k["time_s"]) for k in points) * 1e6 / 2
        hi = max(max(k["floor_s"], k["time_s"]) for k in points) * 1e6 * 2
        for factor, style in ((1, "-"), (2, "--"), (10, ":")):
            vs.plot([lo, hi], [lo * factor, hi * factor], color="black", ls=style, lw=1,
                    label=f"{factor}x the floor" if factor > 1 else "at the floor")  # fmt: skip
        vs.set_xlim(lo, hi)
        vs.set_ylim(lo, hi * 10)
        vs.set_xscale("log")
        vs.set_yscale("log")
        vs.legend(fontsize=7, loc="lower right")  # below the diagonal: faster than the floor, empty
    else:
        vs.text(0.5, 0.5, "no kernel with a time and a floor", ha="center", transform=vs.transAxes)
    basis = sorted({TIME_NAMES.get(k["time_from"], k["time_from"]) for k in points})
    vs.set_xlabel("roofline floor (µs)")
    vs.set_ylabel(f"{' / '.join(basis) or 'time'} (µs)")
    vs.set_title("time against the floor, one dot per kernel", fontsize=9)
    vs.grid(True, which="major", alpha=0.3)
    fig.suptitle(f"{data['model']} on {data['profile']} ({data['target']}), {data['backend']} backend, "
                 f"{len(data['kernels'])} kernels at {_bindings(data['bindings'])}", fontsize=10)  # fmt: skip
    fig.savefig(path)
    return path


def draw_tune_progress(progress: Mapping[str, Any], path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    ax = fig.subplots()
    drawn = False
    for b in progress["buckets"]:
        pts = b["points"]
        if not pts:
            continue
        ax.step([p["t_s"] for p in pts], [p["speedup"] for p in pts], where="post", marker="o", ms=3,
                label=f"bucket {b['bucket']}")  # fmt: skip
        drawn = True
    if drawn:
        ax.axhline(1.0, color="black", lw=0.8)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no measured candidates on the board", ha="center", transform=ax.transAxes)
    ax.set_xlabel("time since the bucket's first candidate (s)")
    ax.set_ylabel("best-so-far speedup over stock (x)")
    ax.set_title(f"tune of {progress['model']} on {progress['profile']}: searched kernels' summed fast-tier "
                 "time, stock / best so far", fontsize=9)  # fmt: skip
    ax.grid(True, alpha=0.3)
    fig.savefig(path)
    return path
