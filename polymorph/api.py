"""polymorph's Python API: the same operations as the CLI.

import polymorph
model = polymorph.load_model("llama-tiny")
artifact = polymorph.compile(model, backend="cpu", out="build/")
exe = polymorph.load(artifact, model)
result = polymorph.verify(model, backend="cpu")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from polymorph.errors import UserError
from polymorph.hardware.profile import load_profile
from polymorph.ir import serialize
from polymorph.knobs import knobs
from polymorph.models import Model, load_model
from polymorph.passes import bucket_bindings
from polymorph.pipeline.backend import Artifact, Executable, check_profile, registry
from polymorph.pipeline.plan import Plan
from polymorph.serving.session import Generation, ReferenceExecutable, Sampler, generate
from polymorph.serving.traffic import TrafficShape
from polymorph.verify import VerifyResult, verify_executable

if TYPE_CHECKING:
    from polymorph.pipeline.stages import Compilation


@dataclass(frozen=True)
class Bucket:
    batch: int
    ctx: int
    weight: float = 1.0
    seq: int = 1  # new tokens per sequence: 1 for a decode step, the prompt length for a prefill


def as_model(model: str | Path | Model, **options: object) -> Model:
    return model if isinstance(model, Model) else load_model(model, **options)  # type: ignore[arg-type]


def pick_bucket(
    batch: int | None,
    ctx: int | None,
    traffic: str | Path | None,
    *,
    prefill: int | None = None,
    phase: str = "decode",
) -> Bucket:
    """The traffic bucket a plan is specialized and predicted for: --batch/--ctx (one decode step;
    default batch 1 at 1024 tokens of context), --prefill N (a prefill of N prompt tokens for each of
    --batch sequences, default 1), or the heaviest bucket of a traffic file for `phase` (decode: the
    decode steps' (batch, context) buckets; prefill: its prompt-length buckets, batch 1)."""
    if phase not in ("decode", "prefill"):
        raise UserError(f"--phase is decode or prefill, not {phase!r}")
    if traffic is not None:
        if batch is not None or ctx is not None or prefill is not None:
            raise UserError("give either --traffic or --batch/--ctx/--prefill, not both")
        shape = TrafficShape.load(traffic)
        if phase == "prefill":
            top = max(shape.prefill_buckets(), key=lambda b: b.weight)
            return Bucket(1, top.ctx_hi, top.weight, seq=top.ctx_hi)
        top = max(shape.buckets(), key=lambda b: b.weight)
        return Bucket(top.batch, top.ctx_hi, top.weight)
    if phase == "prefill" and prefill is None:
        raise UserError(
            "--phase prefill reads a traffic file's prompt lengths; give --traffic, or --prefill N"
        )
    batch = 1 if batch is None else batch
    if prefill is not None:
        if isinstance(prefill, bool) or prefill < 1:
            raise UserError(f"--prefill is the prompt length in tokens and must be at least 1, got {prefill}")
        if ctx is not None and ctx < prefill:
            raise UserError(f"--ctx {ctx} cannot hold a prefill of {prefill} tokens; use --ctx >= --prefill")
        ctx = prefill if ctx is None else ctx
        if batch < 1:
            raise UserError("--batch must be positive")
        return Bucket(batch, ctx, seq=prefill)
    ctx = 1024 if ctx is None else ctx
    if batch < 1 or ctx < 1:
        raise UserError("--batch and --ctx must be positive")
    return Bucket(batch, ctx)


def check_engine_sizes(
    model: str | Path,
    backend: str,
    target: str | None = None,
    *,
    batch: int | None = None,
    ctx: int | None = None,
    traffic: str | Path | None = None,
    dtype: str | None = None,
    block_size: int | None = None,
) -> int:
    """Refuse (UserError, one line) an engine whose sizes cannot work before anything starts: a block
    size below 1, a batch or context below 1, or weights, KV cache and the largest activation that do
    not fit in the memory the engine would use (the device's for a GPU backend, else this machine's).
    Returns the bytes the engine needs."""
    from functools import partial

    from polymorph.cli.console import quantity
    from polymorph.cost.model import tensor_bytes
    from polymorph.models.zoo import available_memory_bytes

    if block_size is not None and (isinstance(block_size, bool) or block_size < 1):
        raise UserError(f"--block-size is tokens per KV-cache block and must be at least 1, got {block_size}")
    bucket = pick_bucket(batch, ctx, traffic)
    options = {"dtype": dtype} if dtype else {}
    m = load_model(model, **options, **({"block_size": block_size} if block_size is not None else {}))
    b = registry.get(backend or knobs.backend)
    profile = load_profile(target or b.targets[0], knobs.calibration_dir)
    bindings = bucket_bindings(m.graph, batch=bucket.batch, ctx=bucket.ctx)
    weights = sum(tensor_bytes(t, bindings) for t in m.graph.params.values())
    kv = sum(tensor_bytes(t, bindings) for t in m.graph.state.values())
    values = [t for v, t in m.graph.types().items() if v not in m.graph.params and v not in m.graph.state]
    activations = max((tensor_bytes(t, bindings) for t in values), default=0)
    need = weights + kv + activations
    device = profile.memory_bytes() if profile.target.family != "cpu" else None
    have = device if device is not None else available_memory_bytes()
    if need > have:
        q = partial(quantity, unit="B")
        where = (
            f"{profile.id} has {q(have)} of device memory"
            if device
            else f"this machine has {q(have)} available"
        )
        raise UserError(
            f"an engine for {m.name} at batch {bucket.batch}, context {bucket.ctx} needs about {q(need)} (weights "
            f"{q(weights)}, KV cache {q(kv)}, largest activation {q(activations)}) but {where}; use a smaller "
            "--batch or --ctx"
        )
    return need


def compile(
    model: str | Path | Model,
    backend: str | None = None,
    target: str | None = None,
    out: str | Path | None = None,
    *,
    batch: int | None = None,
    ctx: int | None = None,
    prefill: int | None = None,
    traffic: str | Path | None = None,
    phase: str = "decode",
    force: bool = False,
    stages: str | Path | None = None,
) -> Artifact:
    """Lower and compile `model` for `target` (a profile id; default: the backend's first chip), through
    the compile stages (polymorph/pipeline/stages.py), each run once.

    Needs no device. The bucket is one decode step (batch, ctx), a prefill of `prefill` prompt tokens
    per sequence, or the heaviest bucket of a traffic file for its `phase` (decode or prefill);
    costs and predicted times in the report are for one step at that bucket. `out` must be missing,
    empty or a previous compile output unless `force` (polymorph/cli/outdir.py); `stages`, a folder
    of the same kind, receives each stage's product.
    """
    from polymorph.cli.outdir import claim_out
    from polymorph.pipeline.stages import run_stages

    c = compilation(
        model, backend, target, batch=batch, ctx=ctx, prefill=prefill, traffic=traffic, phase=phase
    )
    if out is not None:
        claim_out(out, "compile", force=force)
        c.out_dir = Path(out)
    dump = None
    if stages is not None:
        claim_out(stages, "compile --stages", force=force)
        dump = Path(stages)
    artifact = run_stages(c, dump=dump).artifact
    assert artifact is not None
    return artifact


def compilation(
    model: str | Path | Model,
    backend: str | None = None,
    target: str | None = None,
    *,
    batch: int | None = None,
    ctx: int | None = None,
    prefill: int | None = None,
    traffic: str | Path | None = None,
    phase: str = "decode",
) -> Compilation:
    """The input of the compile stages: the model's graph, the backend, its profile (loaded here,
    once) and the bucket's bindings."""
    from polymorph.pipeline.stages import Compilation

    m = as_model(model)
    b = registry.get(backend or knobs.backend)
    profile = load_profile(target or b.targets[0], knobs.calibration_dir)
    check_profile(b, profile)
    bucket = pick_bucket(batch, ctx, traffic, prefill=prefill, phase=phase)
    bindings = bucket_bindings(m.graph, batch=bucket.batch, ctx=bucket.ctx, seq=bucket.seq)
    return Compilation(b, profile, m.graph, bindings, model=m.source)


def lower(
    model: str | Path | Model,
    backend: str | None = None,
    target: str | None = None,
    *,
    batch: int | None = None,
    ctx: int | None = None,
    prefill: int | None = None,
    traffic: str | Path | None = None,
) -> Artifact:
    """The plan `compile` makes, with its report, but no device code: for runtimes that build their
    kernels themselves on load (the engine, the Triton JIT), so nothing is compiled twice."""
    from polymorph.cost.model import plan_report
    from polymorph.pipeline.stages import run_stages

    c = compilation(model, backend, target, batch=batch, ctx=ctx, prefill=prefill, traffic=traffic)
    plan = run_stages(c, until="plan").plan
    assert plan is not None
    return Artifact(plan, plan_report(plan, resources_of=lambda group: {}), None)


def load(artifact: Artifact, model: str | Path | Model | None = None) -> Executable:
    """Load a compiled plan with its model's weights on the backend's device."""
    plan = artifact.plan
    meta = plan.graph.meta
    options = {k: meta[k] for k in ("dtype", "block_size", "all_logits", "seed") if k in meta}
    m = as_model(model if model is not None else plan.model, **options)
    from polymorph.passes import dce

    # The plan holds the graph after the compile stages' dce; the model's graph is compared the same way.
    if serialize.content_hash(dce(m.graph)) != serialize.content_hash(plan.graph):
        raise UserError(f"model `{m.name}` no longer builds the graph this plan was compiled from; recompile")
    return registry.get(plan.backend).load(artifact, m.weights())


def load_compiled(out_dir: str | Path) -> Artifact:
    """A compile output directory (plan.json, graph.json, kernels/ or device/) as an Artifact whose
    kernels are the copies in that directory, not whatever the library holds now."""
    from polymorph.cost.model import plan_report

    out_dir = Path(out_dir)
    plan = Plan.load(out_dir)
    registry.get(plan.backend)  # an unknown or broken backend is reported before anything loads
    return Artifact(plan, plan_report(plan, resources_of=lambda group: {}), out_dir)


def run(
    model: str | Path | Model,
    prompt: list[int],
    *,
    backend: str | None = None,
    new_tokens: int = 16,
    sampler: Sampler | None = None,
) -> Generation:
    """Generate `new_tokens` after `prompt` (token ids). MODEL may be a compile output directory."""
    path = Path(str(model)) if not isinstance(model, Model) else None
    if path is not None and (path / "plan.json").exists():
        artifact = load_compiled(path)
    else:
        artifact = compile(model, backend)
    exe = load(artifact, model if isinstance(model, Model) else None)
    return generate(exe, artifact.plan.graph, prompt, new_tokens, sampler or Sampler())


def verify(model: str | Path | Model, backend: str | None = None, *, seed: int | None = None) -> VerifyResult:
    """Teacher-forced logits of `backend` against the reference engine on fresh random tokens."""
    m = as_model(model)
    artifact = compile(m, backend)
    candidate = registry.get(artifact.plan.backend).load(artifact, m.weights())
    if hasattr(candidate, "poison"):
        candidate.poison = True  # outputs start as NaN: a kernel that skips writing cannot pass
    stock = ReferenceExecutable(m.graph, m.weights(), keep_values=True)  # router near-ties are checked
    # Every position's logits: the reference runs each sequence as one prefill.
    whole = (
        ReferenceExecutable(m.rebuild(all_logits=True), m.weights(), wide=stock.wide) if m.config else None
    )
    return verify_executable(candidate, stock, m.graph, seed=seed, whole=whole)
