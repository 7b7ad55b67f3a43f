"""What the tuner may change: a compiled plan's node groups, collected by op signature into search
spaces (the stock kernel file and its declared configs, the library's other files that support the
same spec), the traffic buckets a run tunes, and the toolchain string the registry keys on."""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymorph.pipeline.kernel_files import kernel_library, kernels_root, load_choice
from polymorph.pipeline.lowering import kernel_spec
from polymorph.pipeline.plan import Plan
from polymorph.search.agents import GroupSpace
from polymorph.search.registry import group_signatures
from polymorph.serving.traffic import Bucket, TrafficShape

# By kernel language (Backend.language): a new backend on an existing language needs no entry here.
TOOLCHAIN_PACKAGES = {"torch": ("torch",), "triton": ("torch", "triton"), "xla": ("jax", "neuronx-cc")}


def toolchain(backend: str) -> str:
    """The versions a measurement depends on, e.g. "cuda: torch 2.11.0, triton 3.6.0, kernels 3f2c1a9e04b1":
    the packages, and the kernel library the search ran over (a hash of its files). A champion found
    over another library is one of another toolchain: a later tune re-verifies it as a warm start and
    searches the library's new choices, instead of taking the old search as the last word."""
    from polymorph.pipeline.backend import registry

    language = registry.get(backend).language
    parts = []
    for pkg in TOOLCHAIN_PACKAGES.get(language, ("torch",)):
        try:
            parts.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{pkg} absent")
    parts.append(f"kernels {library_hash(language)}")
    return f"{backend}: {', '.join(parts)}"


def library_hash(language: str) -> str:
    """The first 12 hex digits of a sha256 over the kernel library of `language`: every file's name and
    content (shared modules included), in name order."""
    digest = hashlib.sha256()
    for path in sorted((kernels_root() / language).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


def buckets_of(traffic: str | Path | None, batch: int | None, ctx: int | None) -> list[Bucket]:
    """The buckets a run tunes, heaviest first: a traffic file's, or the one --batch/--ctx names (as
    TrafficShape.single makes it, so its id is the registry's shape bucket for those flags)."""
    from polymorph.api import pick_bucket

    b = pick_bucket(batch, ctx, traffic)  # the usage errors compile gives
    shape = TrafficShape.load(traffic) if traffic is not None else TrafficShape.single(b.batch, b.ctx)
    return sorted(shape.buckets(), key=lambda x: -x.weight)


@dataclass
class PlanSpaces:
    plan: Plan
    spaces: list[GroupSpace]
    signature_of: dict[str, str]  # group id -> op signature
    fixed: list[str]  # signatures with nothing to choose (one config, no other file)


def group_spaces(plan: Plan, language: str, predicted: dict[str, float]) -> PlanSpaces:
    """The search spaces of `plan`, one per op signature, ordered by their share of the step
    (`predicted`: group id -> predicted or measured seconds, or bytes where there is no time)."""
    graph, types = plan.concrete()
    signatures = group_signatures(plan)
    target = plan.kernel_target()  # the chip's traits, as the plan's kernels were chosen for
    library = kernel_library(language)
    total = sum(predicted.values()) or 1.0
    by_sig: dict[str, GroupSpace] = {}
    signature_of: dict[str, str] = {}
    for group in plan.groups:
        spec = kernel_spec(graph, group, types, target)
        sig = signatures[group.id]
        signature_of[group.id] = sig
        share = predicted.get(group.id, 0.0) / total
        if sig in by_sig:
            space = by_sig[sig]
            space.groups = (*space.groups, group.id)
            space.share += share
            continue
        stock = load_choice(group.kernel.file, group.kernel.sha256)
        alternatives = [
            (k.path, k.configs_for(target)) for k in library if k.path != stock.path and _supports(k, spec)
        ]
        by_sig[sig] = GroupSpace(signature=sig, group=group.id, groups=(group.id,), pattern=group.pattern,
                                 stock_kernel=stock.path, stock_config=dict(group.kernel.config),
                                 configs=stock.configs_for(target), alternatives=alternatives,
                                 share=share)  # fmt: skip
    spaces = sorted(by_sig.values(), key=lambda s: -s.share)
    fixed = [s.signature for s in spaces if len(s.configs) <= 1 and not s.alternatives]
    return PlanSpaces(plan, [s for s in spaces if s.signature not in fixed], signature_of, fixed)


def _supports(kernel: Any, spec: Any) -> bool:
    try:
        return bool(kernel.supports(spec))
    except Exception:  # a library file that cannot judge this spec does not take it
        return False


def library_path(path: Path) -> str:
    """A kernel path as a plan names it: relative to the library when inside it."""
    try:
        return str(Path(path).resolve().relative_to(kernels_root().resolve()))
    except ValueError:
        return str(path)


def predicted_times(report: Any) -> dict[str, float]:
    """Group id -> predicted seconds from a compile report, falling back to bytes moved when the
    profile has no figures to predict from (the cpu profile before calibration)."""
    times = {k.group: k.predicted_s for k in report.kernels if k.predicted_s is not None}  # views: 0
    if len(times) == len(report.kernels):
        return times
    return {k.group: float(k.bytes or 0.0) for k in report.kernels}
