"""`polymorph demo`: the tour in under a minute on a laptop. The graph; a compile for cpu, a run and a
verify against the reference engine; compiles for three chips that are not here, with their per-kernel
resource tables; a hot swap of a candidate into a running sandboxed engine, with every gate's verdict;
a short tune with its speedup table. Everything it writes stays in its output folder.

Time: the one engine (a sandboxed zygote that loads the model, then forks workers) starts first, in a
thread, while the compiles run; once it has loaded, the short tune searches on it from that thread
(the tune's first worker is then that thread, not a process starting an engine of its own: see
TuneOptions.engine), and the hot swap uses it after the tune is done. Every gate runs as it does in
`polymorph engine swap` and `polymorph tune`.
"""

from __future__ import annotations

import argparse
import gc
import io
import math
import re
import shutil
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from polymorph.cli import console
from polymorph.errors import CheckFailed, UserError

CANDIDATE = '''"""A candidate kernel for `linear+residual` (residual + x @ w^T), written by `polymorph demo` and
hot-swapped into a running engine: torch.addmm writes straight into the output buffer, and the
weight's f32 transpose is kept between calls (the stock kernel, kernels/torch/linear_residual.py,
makes a temporary and copies it). Edit it and try it yourself:
polymorph engine swap GROUP THIS_FILE --engine ADDR (ADDR from `polymorph engine start MODEL`)."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    lin, add = spec.node("linear"), spec.node("add")
    return len(lin.inputs) == 2 and spec.types[add.outputs[0]].shape == spec.types[lin.outputs[0]].shape


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    res_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    cached = {}

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[res_i]
        key = (w.data_ptr(), w._version)  # a weight changed in place is read again
        if key not in cached:
            cached.clear()
            cached[key] = w.float().t().contiguous()
        out = outputs[0]
        args = (r.reshape(-1, r.shape[-1]).float(), x.reshape(-1, x.shape[-1]).float(), cached[key])
        if out.dtype == torch.float32 and out.is_contiguous():
            torch.addmm(*args, out=out.view(-1, out.shape[-1]))
        else:
            out.copy_(torch.addmm(*args).reshape(out.shape))

    return launch
'''


class _Background:
    """The demo's engine and the short tune on it, in one thread: the sandbox dies with the thread
    that started it (PR_SET_PDEATHSIG, polymorph/engine/sandbox.py), so this thread lives until the
    engine is closed."""

    def __init__(self, model: str, dtype: str, bucket: Any, tune_opts: Any) -> None:
        self.model, self.dtype, self.bucket, self.tune_opts = model, dtype, bucket, tune_opts
        self.engine: Any = None
        self.engine_error: BaseException | None = None
        self.engine_start_s = 0.0
        self.tune_report: Any = None
        self.tune_error: BaseException | None = None
        self.tune_started = 0.0
        self.tune_s = 0.0
        self.tuned = threading.Event()  # the tune is over (or could not run): the engine is free
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polymorph-demo-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from polymorph.engine.controller import Controller
        from polymorph.search.tune import tune

        started = time.perf_counter()
        try:
            self.engine = Controller.start(self.model, "cpu", batch=self.bucket.batch, ctx=self.bucket.ctx,
                                           dtype=self.dtype)  # fmt: skip
        except Exception as e:  # reported at step 5, in one line; the tune starts an engine of its own
            self.engine_error = e
        self.engine_start_s = time.perf_counter() - started
        self.tune_started = time.perf_counter()
        try:
            self.tune_opts.engine = self.engine
            self.tune_report = tune(self.tune_opts)
        except Exception as e:  # reported at step 6, in one line
            self.tune_error = e
        self.tune_s = time.perf_counter() - self.tune_started
        self.tuned.set()
        self._done.wait()
        if self.engine is not None:
            self.engine.close()

    def close(self) -> None:
        if self._thread.is_alive():  # a step failed early: the tune still holds the engine
            self.tuned.wait(timeout=600)
        self._done.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=60)


def run_demo(args: argparse.Namespace) -> int:
    from polymorph import api
    from polymorph.cli.outdir import claim_out, manifest_command
    from polymorph.models import load_model
    from polymorph.pipeline.backend import registry
    from polymorph.search.tune import TuneOptions, parse_budget

    t0 = time.perf_counter()
    _keep_heap()
    budget_s = parse_budget(args.budget)
    out = claim_out(args.out, "demo", force=args.force)  # a user's folder is refused before any work
    model = load_model(args.model)
    registry.available()  # discovered here, once: the engine's thread looks backends up too
    tune_out = out / "tune"
    if manifest_command(tune_out) == "tune":  # the previous demo's tune: each demo tunes afresh
        shutil.rmtree(tune_out)
    dtype = registry.get("cpu").default_dtype
    tune_opts = TuneOptions(model=args.model, backend="cpu", dtype=dtype, budget_s=budget_s, out=tune_out,
                            board=tune_out / "board.sqlite", registry=tune_out / "registry.sqlite",
                            quiet=True)  # fmt: skip
    # The engine loads while steps 1-4 run, at the bucket the tune tunes (the default one).
    background = _Background(args.model, dtype, api.pick_bucket(None, None, None), tune_opts)
    background.start()
    try:
        return _steps(args, out, model, background, t0)
    finally:
        background.close()


def _keep_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach: torch and polymorph leave some
    200,000 long-lived objects (modules, functions) that each full collection, and the last one at
    exit, would walk again (a second or more on a busy 2-core machine); a one-shot command loses
    nothing by never collecting them. Not after triton is loaded: its nanobind objects, never
    collected, would be reported as leaks at exit."""
    gc.freeze()


def _steps(args: argparse.Namespace, out: Path, model: Any, background: _Background, t0: float) -> int:
    """The steps, in order, once the folder is claimed and the engine is loading."""
    from polymorph import api
    from polymorph.cli import report_table
    from polymorph.models import load_model
    from polymorph.pipeline.backend import registry
    from polymorph.search.tune_view import print_report
    from polymorph.serving.session import Sampler

    name, random_weights = model.name, model.checkpoint is None

    def took(since: float) -> str:
        return console.seconds(time.perf_counter() - since)

    def short(text: str, width: int = 100) -> str:
        return text if len(text) <= width else text[: width - 3] + "..."

    if random_weights:
        console.line(
            f"polymorph demo: {name} with seeded random weights (POLYMORPH_SEED), so nothing is downloaded. It "
            "has a real Llama's architecture at toy size but has learned nothing: the tokens it generates "
            "mean nothing and repeat (greedy decoding keeps picking the few tokens random weights favour). "
            "What counts is that every backend computes the reference engine's numbers."
        )
    else:
        console.line(f"polymorph demo: {name}, weights from {model.checkpoint}")
    console.line(f"output folder: {out}/ (kept; only a later demo writes into it again)")

    # 1. the graph: its size, and one layer node by node
    g = model.graph
    types = g.types()
    layers = {n.name.split(".")[1] for n in g.nodes if n.name.startswith("layers.")}
    n_params = sum(math.prod(int(d) for d in t.shape) for t in g.params.values())
    console.line(
        f"\n1. the graph: {len(g.nodes)} nodes in {len(layers)} layers, {len(g.params)} weights "
        f"({n_params:,} parameters), {len(g.state)} state tensors (the paged KV cache); layer 0:"
    )
    for n in g.nodes:
        if n.name.startswith("layers.0."):
            outs = ", ".join(str(types[o]) for o in n.outputs)
            ins = ", ".join(v.removeprefix("model.").removeprefix("layers.0.") for v in n.inputs)
            console.line(f"   {n.name.removeprefix('layers.0.'):<16} {outs} = {n.op}({ins})")
    console.line(f"   all of it: polymorph graph {args.model}")

    # 2-3. cpu: compile, run, verify against the reference engine
    since = time.perf_counter()
    cpu_out = out / "cpu"
    artifact = api.compile(model, "cpu", out=cpu_out)
    gen = api.run(cpu_out, [1, 2, 3, 4], new_tokens=8, sampler=Sampler())
    _keep_heap()  # torch is loaded now
    console.line(
        f"\n2. compiled for cpu: {len(artifact.plan.groups)} kernels -> {cpu_out}/; ran it greedily: prompt "
        f"[1, 2, 3, 4] -> {gen.tokens}" + (" (random weights: repeats expected)" if random_weights else "")
        + f"; {gen.tokens_per_s:.0f} tokens/s ({took(since)})"
    )  # fmt: skip
    since = time.perf_counter()
    result = api.verify(model, "cpu")
    console.table(
        f"3. verify: cpu logits against the reference engine (numpy) on fresh random tokens, rtol "
        f"{result.tolerance.rtol}, atol {result.tolerance.atol} ({took(since)})",
        ["step", "result", "max abs err", "out of tolerance"],
        [(s.step, (s.note or "ok") if s.comparison.ok else "MISMATCH", f"{s.comparison.max_abs:.2g}",
          f"{s.comparison.mismatched}/{s.comparison.total}") for s in result.steps],
    )  # fmt: skip
    failed = [] if result.ok else ["verify: the cpu logits do not match the reference engine's"]

    # 4. the same graph for three more chips, none of them here
    bucket = api.pick_bucket(None, None, None)
    console.line(
        f"\n4. the same graph for three more chips, compiled here without them; predicted times are for one "
        f"decode step at batch {bucket.batch}, context {bucket.ctx}:"
    )
    missing: list[tuple[str, str]] = []  # (chip, why not)
    for backend, chip in (("cuda", "h200"), ("rocm", "mi355x"), ("neuron", "trn2")):
        probe = registry.get(backend).probe()
        if not probe.compile.ok:
            missing.append((chip, probe.compile.reason))
            continue
        since = time.perf_counter()
        try:
            m = load_model(args.model, dtype=registry.get(backend).default_dtype)
            a = api.compile(m, backend, chip, out=out / chip)
        except UserError as e:  # an optional cross-compile: one warning line, the demo goes on
            console.warn(f"{backend} for {chip}: not compiled: {e}")
            continue
        r = a.report
        head = f"{chip} ({r.target}): {len(r.kernels)} kernels -> {out / chip}/ ({took(since)})"
        basis = short(re.sub(r"/\S*/", "", r.prediction.split(" (")[0]), 90)  # the files by name only
        if any(report_table.registers(k.resources or {}) != "-" for k in r.kernels):
            report_table.print_kernels(r, head)
            console.line(f"   predicted step {console.seconds(r.predicted_step_s)} ({basis})")
        else:  # no per-kernel resources to show (XLA compiles the whole step as one program)
            console.line(f"   {head}; predicted step {console.seconds(r.predicted_step_s)} ({basis})")
        for w in r.warnings:
            console.warn(w)
    if missing:
        extras = sorted({x for _, why in missing for x in re.findall(r"polymorph\[([\w-]+)\]", why)})
        chips = ", ".join(chip for chip, _ in missing)
        if extras and all("polymorph[" in why for _, why in missing):
            console.line(
                f"   not compiled here: {chips}; to compile them: pip install 'polymorph[{','.join(extras)}]'"
            )
        else:
            for chip, why in missing:
                console.line(f"   {chip}: not compiled here: {why}")

    # 5. a hot swap into the running engine (once the tune is done with it): the candidate runs in a
    # sandboxed worker, every gate runs
    background.tuned.wait()
    engine = background.engine
    groups = [gr.id for gr in artifact.plan.groups if gr.pattern == "linear+residual"]
    group = next((gid for gid in groups if "mlp.down" in gid), groups[0] if groups else None)
    if engine is None:
        console.warn(f"hot swap skipped: the engine did not start: {background.engine_error}")
    elif group is None:
        console.line("\n5. hot swap skipped: the plan has no linear+residual group for the demo's candidate")
    else:
        since = time.perf_counter()
        candidate = out / "candidates" / "linear_residual_addmm.py"
        candidate.parent.mkdir(exist_ok=True)
        candidate.write_text(CANDIDATE)
        stock = engine.measure("fast", 20, group)["groups"][group]
        swap, gate = engine.try_candidate(group, candidate)
        on = sum(v == "on" for v in engine.layers.values())
        console.line(
            f"\n5. hot swap of {candidate} into {group} of a running cpu engine (a sandboxed worker, {on} "
            f"of {len(engine.layers)} sandbox layers on; it loaded while steps 1-4 ran, in "
            f"{console.seconds(background.engine_start_s)}, and the short tune below ran on it first)"
        )
        if swap.fault is not None or gate is None:
            fault = swap.fault
            failed.append(f"hot swap: {fault.stage}: {fault.cause}" if fault else "hot swap: swap failed")
        else:
            console.table(
                f"gates ({took(since)}: the swap, every gate, the worker retired and a fresh one forked)",
                ["gate", "verdict", "what it found"],
                [(x.name, x.verdict, short(x.cause)) for x in gate.gates],
            )
            if gate.ok:
                console.line(
                    f"   build {console.seconds(swap.build_s)}, swap {console.seconds(swap.swap_s)}, no weight "
                    f"reloaded; fast tier by the controller's clock: stock "
                    f"{console.seconds(stock.get('median_s'))}, candidate "
                    f"{console.seconds((gate.measurement or {}).get('median_s'))} a call; it stays in"
                )
            else:
                fault = gate.faults[0] if gate.faults else None
                failed.append(
                    f"hot swap: {f'rejected at {fault.stage}: {fault.cause}' if fault else 'rejected'}"
                )

    # 6. the short tune's report
    opts = background.tune_opts
    tune_args = [args.model, "--backend", "cpu", "--budget", args.budget, "--out", str(opts.out)]
    console.line(
        f"\n6. a short tune: polymorph tune {' '.join(tune_args)} (the built-in agents propose, the engine "
        "gates and times each candidate, the winners go into the plan; a real tune runs minutes). It ran "
        "on the engine above as soon as it had loaded"
        + ("" if engine is not None else " (here on one of its own: the demo's did not start)")
        + ", while steps 2-4 ran, so what it timed shared the CPU with them"
    )  # fmt: skip
    text = io.StringIO()
    with redirect_stdout(text):  # the other threads are idle now: only this one prints
        console.line(f"registry: {opts.registry}; board: {opts.board}")
        if background.tune_report is not None:
            print_report(background.tune_report)
    if background.tune_error is not None:
        cause = background.tune_error
        line = str(cause) if isinstance(cause, UserError) else f"{type(cause).__name__}: {cause}"
        text.write(f"the tune failed: {line}\n")
        failed.append(f"the tune failed: {line}")
    tune_log = out / "tune-output.txt"
    tune_log.write_text(text.getvalue())
    for x in text.getvalue().splitlines():
        console.line(f"   {x}")
    console.line(f"   ({console.seconds(background.tune_s)} from its start; its whole output: {tune_log})")
    report = background.tune_report
    if report is not None and not any(b.candidates for b in report.buckets):
        console.warn(f"the tune gated no candidate in {args.budget}: a busy machine? try --budget 60s")

    console.line(
        f"\ndemo done in {took(t0)}. Everything stays in {out}/: cpu/ (polymorph run {cpu_out} --prompt "
        f"'1 2 3 4'), h200/ mi355x/ trn2/ (plans, reports, device code), candidates/, tune/ (polymorph run "
        f"{opts.out})"
    )
    if failed:
        raise CheckFailed("; ".join(failed))
    return 0
