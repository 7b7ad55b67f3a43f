"""Hardware profiles: load, validate, overlay measured calibration, roofline.

A profile is a TOML file `hwprofiles/<id>.toml`. Its shape (schema_version 1):

    schema_version = 1
    id = "h200"                     # equals the file's stem
    name = "NVIDIA H200 SXM"
    target = "cuda:sm_90"           # parsed by Target.parse
    backend = "cuda"                # the target's family
    note = "..."                    # optional: conflicts between sources, caveats

    [peak.bf16]                     # dense peak rate per dtype: f32 tf32 bf16 f16 fp8 fp6 fp4 i8
    value = 989
    unit = "TFLOP/s"
    source = "stas00/ml-engineering compute/accelerator/README.md, TFLOPS table"

    [figures.memory_bandwidth]      # one of FIGURES below
    value = 4.8
    unit = "TB/s"
    source = "..."
    evidence = "derived"            # optional: spec (default) | derived | unverified
    note = "..."                    # optional; required when evidence is derived (show the arithmetic)

Every vendor figure is a table with a value, a unit from its dimension's list, and a source naming the
document it was read in; the loader rejects anything else with the file and the field. Values stay as
the vendor states them, so a reader can check them against the source; `Figure.si` has them in base
units. On-chip memories that vendors quote in "KB"/"MB" are binary sizes and are written in KiB/MiB.

Measured calibration lives apart from the vendor figures, one file per profile in a calibration
directory (`hwprofiles/measured/<id>.toml` by default; see its README.md), with provenance: date,
device, driver, toolchain versions, git commit. Accessors prefer a measured figure when there is one
(`calibrated=False` asks for the vendor's), and the two stay distinguishable in `describe()`.

Profiles are read from disk on every call rather than cached: microbenchmarks rewrite calibration
files while an engine runs, and a stale copy would be silently wrong.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, NamedTuple

from polymorph.errors import UserError
from polymorph.hardware import catalog
from polymorph.hardware.target import Target

SCHEMA_VERSION = 1

# Unit -> factor to the dimension's base unit (bytes, bytes/s, Hz, W, FLOP/s, plain count).
UNITS: dict[str, dict[str, float]] = {
    "bytes": {
        "B": 1.0,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "KiB": 2.0**10,
        "MiB": 2.0**20,
        "GiB": 2.0**30,
        "TiB": 2.0**40,
    },
    "bandwidth": {"GB/s": 1e9, "TB/s": 1e12},
    "frequency": {"MHz": 1e6, "GHz": 1e9},
    "power": {"W": 1.0},
    "flops": {"TFLOP/s": 1e12, "PFLOP/s": 1e15},
    "count": {"": 1.0},
    "time": {
        "ns": 1e-9,
        "us": 1e-6,
        "ms": 1e-3,
        "s": 1.0,
    },  # per-call overhead (calibration; launch_overhead)
}

# Figure name -> (dimension, label). `{unit}` in a label becomes the target's compute unit (SM, CU,
# NeuronCore, core). The set is closed so that a typo in a profile is an error, not a silent gap;
# adding a figure is one line here.
FIGURES: dict[str, tuple[str, str]] = {
    "memory_capacity": ("bytes", "Device memory capacity"),
    "memory_bandwidth": ("bandwidth", "Device memory bandwidth"),
    "compute_units": ("count", "{unit}s"),
    "clock": ("frequency", "Peak clock"),
    "l2_cache": ("bytes", "L2 cache"),
    "llc": ("bytes", "Last-level cache (AMD Infinity Cache)"),
    "l1_cache_per_unit": ("bytes", "L1 vector cache per {unit}"),
    "l1_shared_combined_per_unit": ("bytes", "L1 + shared memory, combined, per {unit}"),
    "shared_memory_per_unit": ("bytes", "Shared memory (LDS) per {unit}"),
    "tensor_memory_per_unit": ("bytes", "Tensor memory (TMEM) per {unit}"),
    "register_file_per_unit": ("bytes", "Register file (VGPRs) per {unit}"),
    "scalar_register_file_per_unit": ("bytes", "Scalar register file (SGPRs) per {unit}"),
    "sbuf_per_unit": ("bytes", "SBUF per {unit}"),
    "psum_per_unit": ("bytes", "PSUM per {unit}"),
    "warp_size": ("count", "Warp / wavefront width"),
    "max_warps_per_unit": ("count", "Max warps per {unit}"),
    "shared_memory_per_block": ("bytes", "Shared memory (LDS) one block / workgroup may take"),
    "register_allocation_unit": ("count", "Register allocation granule"),
    "max_blocks_per_unit": ("count", "Max resident blocks per {unit}"),
    "simds_per_unit": ("count", "SIMDs (warp schedulers) per {unit}"),
    "interconnect_bandwidth": ("bandwidth", "Interconnect bandwidth per direction"),
    "dma_bandwidth": ("bandwidth", "DMA bandwidth"),
    "power": ("power", "Power (max TDP / TBP)"),
    "launch_overhead": ("time", "Per-kernel launch gap in a captured graph replay (not an eager launch)"),
}

# Keys of the `[peak]` table: dense (no 2:4 sparsity) matrix rates, or the vector rate where a chip
# has no matrix path for the dtype (NVIDIA f32); a figure's note says which.
PEAK_KEYS: tuple[str, ...] = ("f32", "tf32", "bf16", "f16", "fp8", "fp6", "fp4", "i8")

# dtype name -> peak key; None for dtypes polymorph knows but no vendor rates (integer arithmetic
# beyond i8). fp8 formats share one rate on every chip we profile, so e4m3 and e5m2 map together.
_PEAK_KEY_OF_DTYPE: dict[str, str | None] = {
    "f32": "f32",
    "float32": "f32",
    "tf32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f16": "f16",
    "fp16": "f16",
    "float16": "f16",
    **{
        name: "fp8"
        for name in (
            "fp8",
            "f8",
            "fp8e4m3",
            "fp8e5m2",
            "f8e4m3",
            "f8e5m2",
            "f8e4m3fn",
            "f8e4m3fnuz",
            "f8e5m2fnuz",
            "float8_e4m3fn",
            "float8_e5m2",
            "float8_e4m3fnuz",
            "float8_e5m2fnuz",
        )
    },
    "fp6": "fp6",
    "mxfp6": "fp6",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "f4e2m1": "fp4",
    "float4_e2m1fn": "fp4",
    "i8": "i8",
    "int8": "i8",
    "u8": None,
    "i16": None,
    "i32": None,
    "int32": None,
    "i64": None,
    "int64": None,
    "bool": None,
    "c64": "f32",  # complex64 arithmetic is f32 arithmetic
    "complex64": "f32",
}

# What an unknown-dtype error lists: the short names, not every alias above.
_DTYPES_HINT = "f32, tf32, bf16, f16, f8e4m3, f8e5m2, fp6, fp4, i8, i32, i64, bool"

EVIDENCE: tuple[str, ...] = ("spec", "derived", "unverified")

_PROFILE_KEYS = {"schema_version", "id", "name", "target", "backend", "note", "peak", "figures", "compiler"}
# The `[compiler]` table of a GPU profile: facts about how Triton compiles for the arch (traits.py).
_COMPILER_KEYS = {
    "triton_backend",
    "matrix_instruction",
    "pipeline_stages",
    "launch_options",
    "programmatic_dependent_launch",
    "source",
}
_CALIBRATION_KEYS = {
    "schema_version",
    "profile",
    "provenance",
    "peak",
    "figures",
    "curves",
    "launch_overhead",
    "step_overhead",
    "op_overhead",
    "allreduce_latency",
}

# Calibration curves: name -> (what a point is indexed by, dimension of its values, label). A bandwidth
# curve is indexed by buffer size in bytes; a matmul curve (`matmul.<peak key>`) by the call's shape
# (M, K, N) of `x[M, K] @ w[N, K]^T`, its size being the call's FLOPs (2 M K N). The set is closed like
# FIGURES; adding a curve is one line here.
CURVES: dict[str, tuple[str, str, str]] = {
    "read_bandwidth": ("bytes", "bandwidth", "Read bandwidth by buffer size"),
    "copy_bandwidth": ("bytes", "bandwidth", "Copy bandwidth by buffer size (reads plus writes)"),
    "attention_decode": (
        "bytes",
        "bandwidth",
        "Decode attention (one query token, grouped-query) by the K and V bytes it reads: the context length",
    ),
    **{f"matmul.{k}": ("shape", "flops", f"Matmul rate by shape, {k}") for k in PEAK_KEYS},
}
_PROVENANCE_KEYS = {"date", "device", "driver", "toolchain", "commit", "command"}
_ID_FORM = re.compile(r"[a-z0-9][a-z0-9_-]*")


@dataclass(frozen=True)
class Figure:
    """One number about a chip. `value` and `unit` are as the source states them; `si` is the value in
    the dimension's base unit (bytes, bytes/s, Hz, W, FLOP/s, or a count). For a vendor figure,
    `source` cites the document; for a measured one it says how and when it was measured."""

    name: str  # "memory_bandwidth", or "peak.bf16" for a peak rate
    value: float
    unit: str
    si: float
    source: str
    evidence: str  # spec | derived | unverified | measured
    note: str | None = None


@dataclass(frozen=True)
class CurvePoint:
    """One measured point of a curve: `size` is bytes (bandwidth curves) or FLOPs per call (matmul
    curves, whose `shape` is (M, K, N)); `value` as written, `si` in base units; `spread` is the
    trials' (max - min) / median, when recorded."""

    size: float
    value: float
    si: float
    shape: tuple[int, ...] | None = None
    spread: float | None = None


@dataclass(frozen=True)
class Curve:
    """A measured rate as a function of call size (CURVES names them), points in increasing size."""

    name: str  # "read_bandwidth", "copy_bandwidth", "matmul.bf16"
    unit: str
    method: str
    points: tuple[CurvePoint, ...]


@dataclass(frozen=True)
class Calibration:
    """Measured figures for one profile with their provenance, from one calibration file, with the
    optional curves (rate by call size) and per-call launch overhead the cost model reads."""

    path: str
    date: str  # ISO 8601
    device: str  # the device name as the runtime reports it
    driver: str
    toolchain: tuple[tuple[str, str], ...]  # (package, version), sorted by package
    commit: str  # polymorph's git commit that measured
    command: str | None
    figures: tuple[Figure, ...]
    curves: tuple[Curve, ...] = ()
    launch_overhead: Figure | None = None  # seconds per kernel call (`si`), measured
    step_overhead: Figure | None = None  # seconds per step beyond its kernels (`si`), measured
    op_overhead: Figure | None = None  # seconds per host-dispatched op inside a kernel (`si`), measured
    allreduce_latency: Figure | None = None  # seconds per small all-reduce over every device (`si`), measured

    def curve(self, name: str) -> Curve | None:
        """The curve `name` (a CURVES key), or None when this file has none."""
        return next((c for c in self.curves if c.name == name), None)

    def provenance(self) -> str:
        """One line: when, on what, with which versions."""
        tools = ", ".join(f"{name} {version}" for name, version in self.toolchain)
        return f"measured {self.date} on {self.device} (driver {self.driver}; {tools}; commit {self.commit})"


class ProfileRow(NamedTuple):
    """A row of `polymorph hw`-style output."""

    label: str
    value: str
    source: str


class FigureRow(NamedTuple):
    """One figure of a chip with the datasheet's value and the measured one side by side ("" where
    there is none), the measured one in the datasheet's unit where both exist."""

    label: str
    datasheet: str
    measured: str
    source: str  # the datasheet's source, then how the measured one was measured


class ListingRow(NamedTuple):
    """One chip of the `polymorph hw` list: datasheet and measured figures in separate fields, SI
    (FLOP/s, bytes/s), None where there is none."""

    id: str
    name: str
    target: str
    bf16_datasheet: float | None
    bf16_measured: float | None
    bandwidth_datasheet: float | None
    bandwidth_measured: float | None

    @classmethod
    def of(cls, p: Profile) -> ListingRow:
        def si(fig: Figure | None) -> float | None:
            return None if fig is None else fig.si

        return cls(p.id, p.name, str(p.target), si(p.vendor_figure("peak.bf16")), si(p.measured_figure("peak.bf16")),
                   si(p.vendor_figure("memory_bandwidth")), si(p.measured_figure("memory_bandwidth")))  # fmt: skip


@dataclass(frozen=True)
class Profile:
    """A chip's vendor figures, each with its source, and optionally its measured calibration.

    Accessors return SI values (FLOP/s, bytes/s, bytes) or None when neither a measured nor a vendor
    figure exists; with `calibrated=True` (the default) a measured figure wins over the vendor's."""

    id: str
    name: str
    target: Target
    backend: str
    path: str
    note: str | None
    vendor: tuple[Figure, ...]
    calibration: Calibration | None = None
    compiler: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)  # `[compiler]`

    @property
    def has_figures(self) -> bool:
        return bool(self.vendor) or (self.calibration is not None and bool(self.calibration.figures))

    def vendor_figure(self, name: str) -> Figure | None:
        return next((f for f in self.vendor if f.name == name), None)

    def measured_figure(self, name: str) -> Figure | None:
        if self.calibration is None:
            return None
        return next((f for f in self.calibration.figures if f.name == name), None)

    def figure(self, name: str, *, calibrated: bool = True) -> Figure | None:
        """The figure `name` (a FIGURES key, or `peak.<key>`): measured if `calibrated` and there is
        one, else the vendor's, else None."""
        measured = self.measured_figure(name) if calibrated else None
        return measured if measured is not None else self.vendor_figure(name)

    def peak_flops(self, dtype: str, *, calibrated: bool = True) -> float | None:
        """Dense peak FLOP/s for arithmetic in `dtype` (IR names such as f32, bf16, f8e4m3, or numpy /
        ml_dtypes names); every fp8 variant maps to the fp8 figure. None when the profile has no figure
        for it (mi355x has no tf32; nobody quotes i32). An unrecognised dtype name is a UserError."""
        key = peak_key(dtype)
        if key is None:
            return None
        fig = self.figure(f"peak.{key}", calibrated=calibrated)
        return None if fig is None else fig.si

    def memory_bandwidth(self, *, calibrated: bool = True) -> float | None:
        """Device-memory bandwidth in bytes/s: measured if calibrated, else the vendor's peak."""
        fig = self.figure("memory_bandwidth", calibrated=calibrated)
        return None if fig is None else fig.si

    def memory_bytes(self, *, calibrated: bool = True) -> int | None:
        """Device-memory (HBM) capacity in bytes, for footprint checks."""
        fig = self.figure("memory_capacity", calibrated=calibrated)
        return None if fig is None else int(fig.si)

    def compute_units(self, *, calibrated: bool = True) -> int | None:
        """SMs, CUs or NeuronCores on the chip (cores, for cpu once measured)."""
        fig = self.figure("compute_units", calibrated=calibrated)
        return None if fig is None else int(fig.si)

    def describe(self) -> list[ProfileRow]:
        """Rows (label, value, source) for a CLI table: identity, then vendor figures in a fixed order,
        then measured ones with their provenance, then the profile's note."""
        rows = [
            ProfileRow("Profile", f"{self.id} ({self.name})", self.path),
            ProfileRow("Target", str(self.target), ""),
            ProfileRow("Backend", self.backend, ""),
        ]
        for fig in _in_order(self.vendor):
            source = fig.source if fig.evidence == "spec" else f"[{fig.evidence}] {fig.source}"
            source += f" ({fig.note})" if fig.note else ""
            rows.append(ProfileRow(_label(fig.name, self.target), _format(fig), source))
        if self.calibration is not None:
            for fig in _in_order(self.calibration.figures):
                label = f"{_label(fig.name, self.target)} (measured)"
                source = f"{self.calibration.provenance()}: {fig.source}"
                source += f" ({fig.note})" if fig.note else ""
                rows.append(ProfileRow(label, _format(fig), source))
        if not self.has_figures:
            rows.append(ProfileRow("Figures", "none yet", _no_figures_hint(self)))
        if self.note:
            rows.append(ProfileRow("Note", self.note, ""))
        return rows

    def figure_rows(self) -> list[FigureRow]:
        """One row per figure, vendor and measured in separate columns, in the fixed order; the
        calibration's provenance is `calibration.provenance()`, said once rather than per row."""
        measured = {f.name: f for f in self.calibration.figures} if self.calibration is not None else {}
        vendor = {f.name: f for f in self.vendor}
        rows = []
        for fig in _in_order(tuple({**measured, **vendor}.values())):
            v, m = vendor.get(fig.name), measured.get(fig.name)
            sources = []
            if v is not None:
                source = v.source if v.evidence == "spec" else f"[{v.evidence}] {v.source}"
                sources.append(source + (f" ({v.note})" if v.note else ""))
            if m is not None:
                sources.append(f"measured: {m.source}" + (f" ({m.note})" if m.note else ""))
            shown = "" if m is None else _format(m) if v is None else _in_unit_of(m, v)
            rows.append(FigureRow(_label(fig.name, self.target), "" if v is None else _format(v), shown,
                                  "; ".join(sources)))  # fmt: skip
        if not rows:
            rows.append(FigureRow("Figures", "", "", f"none yet: {_no_figures_hint(self)}"))
        return rows


@dataclass(frozen=True)
class RooflineTime:
    """Lower bound on a kernel's time from the roofline: the larger of compute and memory time."""

    compute_s: float
    memory_s: float
    floor_s: float
    bound: str  # "compute" when compute_s > memory_s, else "memory"


def peak_key(dtype: str) -> str | None:
    """The `[peak]` key whose rate applies to arithmetic in `dtype`; None for a known dtype without
    vendor rates (i32). Raises UserError for a name polymorph does not know."""
    name = str(dtype)
    if name not in _PEAK_KEY_OF_DTYPE:
        raise UserError(
            f"unknown dtype `{name}`; known dtypes: {_DTYPES_HINT} (or their numpy/ml_dtypes names)"
        )
    return _PEAK_KEY_OF_DTYPE[name]


def roofline_seconds(profile: Profile, flops: float, bytes_moved: float, dtype: str) -> RooflineTime:
    """Roofline floor for `flops` arithmetic operations in `dtype` and `bytes_moved` bytes of device
    memory traffic, using the profile's (calibrated when available) peak rate and bandwidth.

    A zero amount needs no figure (a pure copy needs no peak rate). Raises UserError when a figure the
    calculation needs is missing, naming what to do about it."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"roofline needs non-negative work; got flops={flops}, bytes_moved={bytes_moved}")
    if not profile.has_figures:
        raise UserError(_no_figures_hint(profile))
    compute_s = 0.0
    if flops > 0:
        peak = profile.peak_flops(dtype)
        if peak is None:
            have = ", ".join(k for k in PEAK_KEYS if profile.figure(f"peak.{k}") is not None) or "none"
            raise UserError(
                f"profile `{profile.id}` has no peak rate for {dtype}; it has: {have}. Compute in one "
                f"of those, or add the figure to {profile.path} (with its source) or to its calibration"
            )
        compute_s = flops / peak
    memory_s = 0.0
    if bytes_moved > 0:
        bandwidth = profile.memory_bandwidth()
        if bandwidth is None:
            raise UserError(
                f"profile `{profile.id}` has no memory bandwidth; add `figures.memory_bandwidth` to "
                f"{profile.path} (with its source) or calibrate it with "
                f"`polymorph microbench --backend {profile.backend}`"
            )
        memory_s = bytes_moved / bandwidth
    bound = "compute" if compute_s > memory_s else "memory"
    return RooflineTime(compute_s=compute_s, memory_s=memory_s, floor_s=max(compute_s, memory_s), bound=bound)


def profiles_dir() -> Traversable:
    """Where the shipped profile TOMLs are (catalog.shipped_dir); POLYMORPH_PROFILES adds others."""
    return catalog.shipped_dir()


def default_calibration_dir() -> Path | None:
    """`measured/` beside the profiles, when it is a real directory (not inside a zipped wheel)."""
    measured = profiles_dir() / "measured"
    return measured if isinstance(measured, Path) and measured.is_dir() else None


def calibration_path(profile_id: str, calibration_dir: Path) -> Path:
    """The file that holds (or will hold) `profile_id`'s measured calibration."""
    return calibration_dir / f"{profile_id}.toml"


def list_profiles() -> list[str]:
    """Ids of the known profiles, sorted: the shipped ones and those in POLYMORPH_PROFILES directories."""
    return sorted(catalog.profile_files())


def load_profile(id: str, calibration_dir: Path | None = None) -> Profile:
    """Load and validate the profile `id` (shipped, or in a POLYMORPH_PROFILES directory), then overlay
    `<calibration_dir>/<id>.toml` if it exists. `calibration_dir` None means the default
    (`hwprofiles/measured`); callers that honour POLYMORPH_CALIBRATION_DIR read it through
    `polymorph.knobs` and pass it here. An unknown id raises UserError listing the known profiles; an
    invalid file raises UserError naming file and field."""
    return _overlay(load_profile_vendor(id), calibration_dir)


def load_profile_vendor(id: str) -> Profile:
    """The profile `id` with its vendor figures only, no calibration overlaid (what a chip's kernel
    traits are read from: a sandboxed worker reads no calibration directory)."""
    files = catalog.profile_files()
    if id not in files:
        raise UserError(
            f"unknown chip `{id}`; known profiles: {', '.join(sorted(files))} (a new chip is one profile "
            f"file in a directory named by POLYMORPH_PROFILES)"
        )
    resource = files[id]
    return _parse_profile(_read_toml(resource, str(resource)), str(resource), expected_id=id)


def load_profile_file(path: Path, calibration_dir: Path | None = None) -> Profile:
    """Load and validate a profile from any path (a new chip's file before it ships), overlaying
    calibration as `load_profile` does. The file's stem must equal its `id`."""
    profile = _parse_profile(_read_toml(path, str(path)), str(path), expected_id=path.stem)
    return _overlay(profile, calibration_dir)


def load_calibration(path: Path, profile: Profile) -> Calibration:
    """Read and validate one calibration file for `profile`. Raises UserError naming file and field."""
    return _parse_calibration(_read_toml(path, str(path)), str(path), profile)


def _overlay(profile: Profile, calibration_dir: Path | None) -> Profile:
    if calibration_dir is None:
        calibration_dir = default_calibration_dir()
        if calibration_dir is None:
            return profile
    elif not Path(calibration_dir).is_dir():
        raise UserError(
            f"calibration directory `{calibration_dir}` does not exist; create it (`polymorph microbench` "
            f"writes there) or point POLYMORPH_CALIBRATION_DIR at an existing one"
        )
    path = calibration_path(profile.id, Path(calibration_dir))
    if not path.is_file():
        return profile
    return dataclasses.replace(profile, calibration=load_calibration(path, profile))


def _read_toml(resource: Traversable | Path, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(resource.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{where}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: not valid TOML ({exc}); fix the syntax") from None


def _parse_profile(data: dict[str, Any], where: str, expected_id: str) -> Profile:
    _no_unknown_keys(data, _PROFILE_KEYS, where, "")
    version = _get(data, "schema_version", int, where)
    if version != SCHEMA_VERSION:
        raise UserError(f"{where}: `schema_version` is {version}; this polymorph reads {SCHEMA_VERSION}")
    pid = _get(data, "id", str, where)
    if pid != expected_id:
        raise UserError(f"{where}: `id` is `{pid}` but the file is named {expected_id}.toml; make them equal")
    if not _ID_FORM.fullmatch(pid):
        raise UserError(f"{where}: `id` `{pid}` must be lowercase letters, digits, `-` or `_`")
    name = _get(data, "name", str, where)
    target_text = _get(data, "target", str, where)
    try:
        target = Target.parse(target_text)
    except UserError as exc:
        raise UserError(f"{where}: `target`: {exc}") from None
    backend = _get(data, "backend", str, where)
    if backend != target.family:
        raise UserError(f"{where}: `backend` is `{backend}` but target {target} belongs to `{target.family}`")
    note = _get(data, "note", str, where, required=False)
    figures = _parse_figures(data, where, measured=False)
    if target.family == "cpu" and figures:
        raise UserError(
            f"{where}: a cpu profile carries no vendor figures (found `{figures[0].name}`); cpu figures "
            f"come from measurement: `polymorph microbench --backend cpu`"
        )
    warp = next((f for f in figures if f.name == "warp_size"), None)
    if warp is not None and target.warp_sizes and warp.si not in target.warp_sizes:
        widths = " or ".join(str(w) for w in target.warp_sizes)
        raise UserError(
            f"{where}: `figures.warp_size` is {warp.value:g} but {target.family} warps are {widths} wide; "
            f"one of them is wrong"
        )
    compiler = _get(data, "compiler", dict, where, required=False) or {}
    _no_unknown_keys(compiler, _COMPILER_KEYS, where, "compiler.")
    if compiler and "source" not in compiler:
        raise UserError(f"{where}: `compiler` has no `source`; say where its facts come from")
    return Profile(
        id=pid,
        name=name,
        target=target,
        backend=backend,
        path=where,
        note=note,
        vendor=tuple(figures),
        compiler=compiler,
    )


def _parse_calibration(data: dict[str, Any], where: str, profile: Profile) -> Calibration:
    _no_unknown_keys(data, _CALIBRATION_KEYS, where, "")
    version = _get(data, "schema_version", int, where)
    if version != SCHEMA_VERSION:
        raise UserError(f"{where}: `schema_version` is {version}; this polymorph reads {SCHEMA_VERSION}")
    owner = _get(data, "profile", str, where)
    if owner != profile.id:
        raise UserError(
            f"{where}: `profile` is `{owner}` but this file calibrates `{profile.id}`; "
            f"name the file {owner}.toml or fix the field"
        )
    prov = _get(data, "provenance", dict, where)
    _no_unknown_keys(prov, _PROVENANCE_KEYS, where, "provenance.")
    raw_date = _get(prov, "date", (str, date), where, prefix="provenance.")
    if isinstance(raw_date, date):  # a bare TOML date or datetime
        when = raw_date.isoformat()
    else:
        try:
            datetime.fromisoformat(raw_date)
        except ValueError:
            raise UserError(
                f"{where}: `provenance.date` `{raw_date}` is not an ISO 8601 date (e.g. 2026-11-20)"
            ) from None
        when = raw_date
    toolchain = _get(prov, "toolchain", dict, where, prefix="provenance.")
    for package, version_text in toolchain.items():
        if not isinstance(version_text, str):
            raise UserError(f"{where}: `provenance.toolchain.{package}` must be a version string")
    if not toolchain:
        raise UserError(f"{where}: `provenance.toolchain` is empty; list the versions that measured")
    return Calibration(
        path=where,
        date=when,
        device=_get(prov, "device", str, where, prefix="provenance."),
        driver=_get(prov, "driver", str, where, prefix="provenance."),
        toolchain=tuple(sorted(toolchain.items())),
        commit=_get(prov, "commit", str, where, prefix="provenance."),
        command=_get(prov, "command", str, where, prefix="provenance.", required=False),
        figures=tuple(_parse_figures(data, where, measured=True)),
        curves=tuple(_parse_curves(data, where)),
        launch_overhead=_parse_overhead(data, "launch_overhead", where),
        step_overhead=_parse_overhead(data, "step_overhead", where),
        op_overhead=_parse_overhead(data, "op_overhead", where),
        allreduce_latency=_parse_overhead(data, "allreduce_latency", where),
    )


def _parse_overhead(data: dict[str, Any], name: str, where: str) -> Figure | None:
    raw = _get(data, name, dict, where, required=False)
    return None if raw is None else _parse_figure(raw, name, "time", where, measured=True, top_level=True)


def _parse_curves(data: dict[str, Any], where: str) -> list[Curve]:
    raw = _get(data, "curves", dict, where, required=False) or {}
    flat: dict[str, Any] = {}
    for key, table in raw.items():
        if key == "matmul" and isinstance(table, dict):
            _no_unknown_keys(table, set(PEAK_KEYS), where, "curves.matmul.")
            flat.update({f"matmul.{k}": v for k, v in table.items()})
        else:
            flat[key] = table
    _no_unknown_keys(flat, set(CURVES), where, "curves.")
    return [_parse_curve(flat[name], name, where) for name in CURVES if name in flat]


def _parse_curve(raw: object, name: str, where: str) -> Curve:
    field = f"curves.{name}"
    index, dimension, _ = CURVES[name]
    keys = "`shapes` ([M, K, N] per point)" if index == "shape" else "`bytes`"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: `{field}` must be a table with `unit`, `method`, {keys} and `values`")
    by = "shapes" if index == "shape" else "bytes"
    _no_unknown_keys(raw, {"unit", "method", "note", by, "values", "spreads"}, where, f"{field}.")
    units = UNITS[dimension]
    unit = raw.get("unit", "")
    if unit not in units:
        raise UserError(f"{where}: `{field}.unit` is {unit!r}; a {dimension} curve takes {', '.join(units)}")
    method = raw.get("method")
    if not isinstance(method, str) or not method.strip():
        raise UserError(f"{where}: `{field}.method` is missing or empty; say how it was measured")
    values = _numbers(raw.get("values"), f"{field}.values", where)
    keys_raw = raw.get(by)
    if not isinstance(keys_raw, list) or len(keys_raw) != len(values):
        raise UserError(f"{where}: `{field}.{by}` must be a list as long as `values` ({len(values)})")
    spreads_raw = raw.get("spreads")
    spreads: list[float | None] = [None] * len(values)
    if spreads_raw is not None:
        spreads = list(_numbers(spreads_raw, f"{field}.spreads", where, allow_zero=True))
        if len(spreads) != len(values):
            raise UserError(f"{where}: `{field}.spreads` must be as long as `values` ({len(values)})")
    points = []
    for i, (key, value, spread) in enumerate(zip(keys_raw, values, spreads, strict=True)):
        if index == "shape":
            if not (
                isinstance(key, list)
                and len(key) == 3
                and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in key)
            ):
                raise UserError(
                    f"{where}: `{field}.shapes[{i}]` must be [M, K, N] positive ints; got {key!r}"
                )
            shape: tuple[int, ...] | None = tuple(key)
            size = 2.0 * key[0] * key[1] * key[2]
        else:
            size = _numbers([key], f"{field}.bytes[{i}]", where)[0]
            shape = None
        points.append(CurvePoint(size, value, value * units[unit], shape, spread))
    points.sort(key=lambda p: (p.size, p.shape or ()))
    if index == "bytes" and len({p.size for p in points}) != len(points):
        raise UserError(f"{where}: `{field}.bytes` lists a size twice; keep one point per size")
    if index == "shape" and len({p.shape for p in points}) != len(points):
        raise UserError(f"{where}: `{field}.shapes` lists a shape twice; keep one point per shape")
    return Curve(name=name, unit=unit, method=method.strip(), points=tuple(points))


def _numbers(raw: object, field: str, where: str, *, allow_zero: bool = False) -> list[float]:
    ok = isinstance(raw, list) and bool(raw)
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw)  # type: ignore[union-attr]
    ok = ok and all((v >= 0 if allow_zero else v > 0) for v in raw)  # type: ignore[union-attr]
    if not ok:
        sign = "non-negative" if allow_zero else "positive"
        raise UserError(f"{where}: `{field}` must be a non-empty list of {sign} numbers; got {raw!r}")
    return [float(v) for v in raw]  # type: ignore[union-attr]


def _parse_figures(data: dict[str, Any], where: str, measured: bool) -> list[Figure]:
    out: list[Figure] = []
    peak = _get(data, "peak", dict, where, required=False) or {}
    _no_unknown_keys(peak, set(PEAK_KEYS), where, "peak.")
    for key in PEAK_KEYS:
        if key in peak:
            out.append(_parse_figure(peak[key], f"peak.{key}", "flops", where, measured))
    figures = _get(data, "figures", dict, where, required=False) or {}
    _no_unknown_keys(figures, set(FIGURES), where, "figures.")
    for key, (dimension, _) in FIGURES.items():
        if key in figures:
            out.append(_parse_figure(figures[key], key, dimension, where, measured))
    return out


def _parse_figure(
    raw: object, name: str, dimension: str, where: str, measured: bool, *, top_level: bool = False
) -> Figure:
    # The table's name in the file: figures.<name>; peak.<key>; a calibration's top-level tables
    # (launch_overhead, step_overhead, op_overhead, allreduce_latency), whatever FIGURES also holds.
    field = name if top_level or name not in FIGURES else f"figures.{name}"
    if not isinstance(raw, dict):
        raise UserError(
            f"{where}: `{field}` must be a table with `value`, `unit` and "
            f"`{'method' if measured else 'source'}`, e.g. [{field}] value = ... "
        )
    # A measured figure's provenance is the file's; per figure it says how it was measured.
    cite = "method" if measured else "source"
    allowed = {"value", "unit", cite, "note"} | (set() if measured else {"evidence"})
    _no_unknown_keys(raw, allowed, where, f"{field}.")
    value = raw.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{where}: `{field}.value` must be a number; got {value!r}")
    if value <= 0:
        raise UserError(f"{where}: `{field}.value` must be positive; leave a figure out when it is unknown")
    units = UNITS[dimension]
    unit = raw.get("unit", "")
    if unit not in units:
        accepted = ", ".join(f"`{u}`" for u in units if u) or "none (omit `unit`)"
        raise UserError(f"{where}: `{field}.unit` is {unit!r}; a {dimension} figure takes {accepted}")
    source = raw.get(cite)
    if not isinstance(source, str) or not source.strip():
        why = "say how it was measured" if measured else "cite the document every vendor figure comes from"
        raise UserError(f"{where}: `{field}.{cite}` is missing or empty; {why}")
    evidence = "measured" if measured else raw.get("evidence", "spec")
    if not measured and evidence not in EVIDENCE:
        raise UserError(f"{where}: `{field}.evidence` is {evidence!r}; use one of {', '.join(EVIDENCE)}")
    note = raw.get("note")
    if note is not None and not isinstance(note, str):
        raise UserError(f"{where}: `{field}.note` must be a string")
    if evidence == "derived" and not note:
        raise UserError(
            f"{where}: `{field}` is derived; add a `note` showing the arithmetic or the reasoning"
        )
    if dimension == "count" and float(value) != int(value):
        raise UserError(f"{where}: `{field}.value` is a count and must be a whole number; got {value}")
    return Figure(
        name=name,
        value=float(value),
        unit=unit,
        si=float(value) * units[unit],
        source=source.strip(),
        evidence=evidence,
        note=note,
    )


def _get(
    data: Mapping[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str,
    *,
    prefix: str = "",
    required: bool = True,
) -> Any:
    if key not in data:
        if required:
            raise UserError(f"{where}: missing field `{prefix}{key}`")
        return None
    value = data[key]
    # bool is an int subclass; a version or count of `true` is a mistake.
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
        names = names.replace("dict", "table").replace("str", "string")
        raise UserError(f"{where}: `{prefix}{key}` must be a {names}; got {value!r}")
    if isinstance(value, str) and not value.strip():
        raise UserError(f"{where}: `{prefix}{key}` is empty")
    return value


def _no_unknown_keys(data: Mapping[str, Any], allowed: set[str], where: str, prefix: str) -> None:
    for key in data:
        if key not in allowed:
            raise UserError(
                f"{where}: unknown field `{prefix}{key}`; expected one of: "
                + ", ".join(f"{prefix}{k}" for k in sorted(allowed))
            )


def _in_order(figures: tuple[Figure, ...]) -> list[Figure]:
    order = [f"peak.{k}" for k in PEAK_KEYS] + list(FIGURES)
    return sorted(figures, key=lambda f: order.index(f.name))


def _label(name: str, target: Target) -> str:
    if name.startswith("peak."):
        return f"Peak {name.removeprefix('peak.')} (dense)"
    return FIGURES[name][1].format(unit=target.compute_unit)


def _format(fig: Figure) -> str:
    return f"{fig.value:,g} {fig.unit}".rstrip()


def _in_unit_of(fig: Figure, like: Figure) -> str:
    """`fig` in `like`'s unit (a measured 4,190.68 GB/s beside a datasheet's 4.8 TB/s: 4.19 TB/s)."""
    if not like.value or not like.si:
        return _format(fig)
    return f"{fig.si * like.value / like.si:,.4g} {like.unit}".rstrip()


def _no_figures_hint(profile: Profile) -> str:
    return (
        f"profile `{profile.id}` has no figures yet; it is filled by measurement "
        f"(`polymorph microbench --backend {profile.backend}`)"
    )
