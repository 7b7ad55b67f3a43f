"""The `polymorph` command line. Every command is a thin layer over polymorph.api.

Exit codes: 0 done; 1 a check failed (verify mismatch); 2 bad input, bad usage or a missing
dependency, reported in one line without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from polymorph.cli import console
from polymorph.errors import CheckFailed, MissingDependency, UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line, exit 2: argparse's default prints the whole usage block first.
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _version() -> str:
    from polymorph import __version__

    return __version__


# --- commands ----------------------------------------------------------------------------------------


def cmd_backends(args: argparse.Namespace) -> int:
    from polymorph.pipeline.backend import registry

    rows = []
    for name, backend, failure in registry.available():
        if backend is None:
            rows.append((name, "-", "no", "no", "no", f"failed to load: {failure}"))
            continue
        p = backend.probe()
        why = "; ".join(
            f"{k}: {c.reason}"
            for k, c in (("compile", p.compile), ("run", p.run), ("measure", p.measure))
            if not c.ok
        )
        mark = {True: "yes", False: "no"}
        rows.append(
            (
                name,
                ", ".join(backend.targets),
                mark[p.compile.ok],
                mark[p.run.ok],
                mark[p.measure.ok],
                why or p.run.reason,
            )
        )
    console.table("backends", ["backend", "chips", "compile", "run", "measure", "notes"], rows)
    return 0


def _step_cost(model_name: str, dtype: str, batch: int, ctx: int) -> tuple[float, float, float]:
    """(FLOPs, bytes, weight bytes) of one decode step of `model_name` at batch and context."""
    from polymorph.ir.ops import node_cost
    from polymorph.ir.shapes import numel
    from polymorph.models import load_model
    from polymorph.passes import bucket_bindings

    m = load_model(model_name, dtype=dtype)
    g = m.graph
    bindings = bucket_bindings(g, batch=batch, ctx=ctx)
    types = g.types()
    flops = nbytes = 0.0
    for n in g.nodes:
        c = node_cost(n, [types[v] for v in n.inputs], [types[v] for v in n.outputs], bindings)
        flops, nbytes = flops + c.flops, nbytes + c.bytes
    weights = float(sum(numel(t.shape) * t.dtype.itemsize for t in g.params.values()))
    return flops, nbytes, weights


def cmd_hw(args: argparse.Namespace) -> int:
    from polymorph.hardware.profile import ListingRow, list_profiles, load_profile, roofline_seconds
    from polymorph.knobs import knobs

    def shown(x: float | None, unit: str) -> str:
        return console.quantity(x, unit) if x else ""

    if args.chip is None:
        rows = []
        for pid in list_profiles():
            r = ListingRow.of(load_profile(pid, knobs.calibration_dir))
            rows.append((r.id, r.name, r.target, shown(r.bf16_datasheet, "FLOP/s"), shown(r.bf16_measured, "FLOP/s"),
                         shown(r.bandwidth_datasheet, "B/s"), shown(r.bandwidth_measured, "B/s")))  # fmt: skip
        columns = ["chip", "name", "target", "bf16 datasheet", "bf16 measured", "memory datasheet"]
        columns.append("memory measured")
        console.table("hardware profiles (bf16 dense peak, memory bandwidth)", columns, rows)
        console.line("datasheet: the vendor's peak; measured: by `polymorph microbench` (empty: none)")
        return 0
    p = load_profile(args.chip, knobs.calibration_dir)
    rows = [(r.label, r.datasheet, r.measured, r.source) for r in p.figure_rows()]
    console.table(f"{p.id}: {p.name} ({p.target}, backend {p.backend}; {p.path})",
                  ["figure", "datasheet", "measured", "source"], rows)  # fmt: skip
    if p.calibration is not None:
        console.line(f"measured figures: {p.calibration.provenance()} ({p.calibration.path})")
        if "spread " in " ".join(r[3] for r in rows):
            console.line("spread: (max - min) / median over the trials of one measurement")
    if p.note:
        console.line(f"note: {p.note}")
    if args.model:
        flops, nbytes, weights = _step_cost(args.model, args.dtype, args.batch, args.ctx)
        console.line(
            f"{args.model} ({args.dtype}), one decode step at batch {args.batch}, context {args.ctx}, on {p.id}:\n"
            f"  bytes moved {console.quantity(nbytes, 'B')} (weights {console.quantity(weights, 'B')}), "
            f"FLOPs {console.quantity(flops, 'FLOP')}"
        )
        try:
            roof = roofline_seconds(p, flops, nbytes, args.dtype)
        except UserError as e:  # a profile without figures (cpu before calibration) cannot say more
            console.line(f"  roofline floor: unknown: {e}")
            return 0
        source = "measured calibration" if p.calibration is not None else "vendor figures"
        console.line(
            f"  roofline floor {console.seconds(roof.floor_s)} ({roof.bound}-bound: memory "
            f"{console.seconds(roof.memory_s)}, compute {console.seconds(roof.compute_s)}; {source}) = "
            f"{args.batch / roof.floor_s:,.0f} tokens/s at most"
        )
    return 0


def cmd_microbench(args: argparse.Namespace) -> int:
    from polymorph.hardware.profile import default_calibration_dir
    from polymorph.knobs import knobs

    out = Path(args.out) if args.out else knobs.calibration_dir or default_calibration_dir()
    if out is None:
        raise UserError("no calibration directory here; pass --out DIR or set POLYMORPH_CALIBRATION_DIR")
    if args.backend == "cpu":
        from polymorph.backends.cpu.microbench import run_suite, write_calibration

        results = run_suite(quick=args.quick)
        written = write_calibration(out, results)
    elif args.backend in ("cuda", "rocm"):
        from polymorph.backends.gpu import microbench
        from polymorph.pipeline.backend import registry

        target = args.target or registry.get(args.backend).targets[0]
        results = microbench.run_suite(target, quick=args.quick)
        written = microbench.write_calibration(out, target, results)
    else:
        raise UserError(
            f"microbenchmarks for `{args.backend}` are not built (README status table); "
            "cpu, cuda and rocm have them"
        )
    console.table(
        f"{args.backend} microbenchmarks",
        ["figure", "value", "method"],
        [(m.name, f"{m.value:.4g} {m.unit}", m.method) for m in results],
    )
    console.line(f"wrote {written}")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    from polymorph.ir import format_graph, to_json
    from polymorph.models import load_model

    m = load_model(args.model, dtype=args.dtype)
    console.line(to_json(m.graph) if args.json else format_graph(m.graph))
    return 0


def _default_dtype(backend: str) -> str:
    from polymorph.pipeline.backend import registry

    return registry.get(backend).default_dtype


def cmd_compile(args: argparse.Namespace) -> int:
    from polymorph import api
    from polymorph.knobs import knobs
    from polymorph.models import load_model

    backend = args.backend or knobs.backend
    model = load_model(args.model, dtype=args.dtype or _default_dtype(backend))
    artifact = api.compile(
        model, backend, args.target, args.out, batch=args.batch, ctx=args.ctx, prefill=args.prefill,
        traffic=args.traffic, phase=args.phase, force=args.force, stages=args.stages,
    )  # fmt: skip
    r = artifact.report
    from polymorph.cli import report_table

    title = f"{model.name} -> {r.backend} {r.target} ({len(r.kernels)} kernels)"
    report_table.print_kernels(r, title, verbose=args.verbose)
    console.line(
        f"predicted step time at {r.bindings}: {console.seconds(r.predicted_step_s)} ({r.prediction})"
    )
    for w in r.warnings:
        console.warn(w)
    if args.out:
        console.line(
            f"wrote {args.out}/plan.json, report.json, graph.json and {len(artifact.files)} kernel files"
        )
    if args.stages:
        from polymorph.pipeline.stages import stage_dump_names

        console.line(f"wrote each stage's product to {args.stages}/: {', '.join(stage_dump_names())}")
    return 0


def _prompt_tokens(args: argparse.Namespace):
    if args.text is not None:
        if args.tokenizer is None:
            raise UserError("--text needs --tokenizer tokenizer.json (or give token ids with --prompt)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise MissingDependency("tokenizers", "text", "--tokenizer") from None
        try:
            tok = Tokenizer.from_file(str(args.tokenizer))
        except Exception as e:
            raise UserError(f"{args.tokenizer}: cannot read the tokenizer ({e})") from None
        return tok.encode(args.text).ids, tok
    try:
        ids = [int(t) for t in args.prompt.replace(",", " ").split()]
    except ValueError:
        raise UserError(
            f"--prompt takes token ids separated by spaces or commas, got {args.prompt!r}"
        ) from None
    return ids, None


def cmd_run(args: argparse.Namespace) -> int:
    from polymorph import api
    from polymorph.cli import tensors
    from polymorph.knobs import knobs
    from polymorph.serving.session import Sampler

    if tensors.is_program(args.model) or args.inputs is not None or args.outputs is not None:
        return tensors.cmd_run_program(args)  # tensors in and out (a torch.export .pt2 file)

    prompt, tokenizer = _prompt_tokens(args)
    compiled = (Path(args.model) / "plan.json").exists()
    backend = args.backend or knobs.backend
    model = args.model if compiled else api.as_model(args.model, dtype=args.dtype or _default_dtype(backend))
    gen = api.run(
        model,
        prompt,
        backend=None if compiled else backend,
        new_tokens=args.new_tokens,
        sampler=Sampler(args.temperature, args.top_p, args.seed),
    )
    console.line("tokens: " + " ".join(map(str, gen.tokens)))
    if tokenizer is not None:
        console.line("text: " + tokenizer.decode(gen.tokens))
    console.line(
        f"prefill {len(prompt)} tokens in {console.seconds(gen.prefill_s)}; decode {gen.tokens_per_s:.1f} tokens/s"
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from polymorph import api
    from polymorph.cli import tensors
    from polymorph.knobs import knobs

    if tensors.is_program(args.model):
        if args.exact:
            return _verify_program_exact(args)
        return tensors.cmd_verify_program(args)  # against the program run by PyTorch
    if args.exact:
        raise UserError("--exact verifies a torch.export .pt2 program; an LLM's `verify` compares within "
                        "tolerance (bit-exact LLM candidates: `tune --exact`, `engine swap --exact`)")  # fmt: skip

    backend = args.backend or knobs.backend
    model = api.as_model(args.model, dtype=args.dtype or _default_dtype(backend))
    result = api.verify(model, backend, seed=args.seed)
    rows = [
        (
            s.step,
            (s.note or "ok") if s.comparison.ok else "MISMATCH",
            f"{s.comparison.max_abs:.3g}",
            f"{s.comparison.mismatched}/{s.comparison.total}",
        )
        for s in result.steps
    ]
    console.table(
        f"verify {model.name} on {backend} against the reference (rtol {result.tolerance.rtol}, "
        f"atol {result.tolerance.atol})",
        ["step", "result", "max abs err", "out of tolerance"],
        rows,
    )
    bad = result.first_failure()
    if bad is not None:
        raise CheckFailed(f"{model.name} on {backend}: {bad.step}: {bad.comparison}")
    console.line(f"{model.name} on {backend}: logits match the reference at every step")
    return 0


EXACT_ROUNDS = 3  # fresh input draws of `verify FILE.pt2 --exact`, each run twice


def _verify_program_exact(args: argparse.Namespace) -> int:
    """The plan on the backend, run twice on each of EXACT_ROUNDS fresh draws (the first the --inputs
    given, if any): the two runs must agree byte for byte. Against PyTorch eager each output is
    reported bitwise equal, or within the model tolerance (another kernel may sum in another order),
    or a mismatch; a mismatch or a disagreement between runs fails."""
    import numpy as np

    from polymorph import api
    from polymorph.cli import tensors
    from polymorph.frontend import load_pt2
    from polymorph.frontend.tensors import bind_inputs, bind_program
    from polymorph.ir.dtypes import DType
    from polymorph.knobs import knobs
    from polymorph.pipeline.backend import registry
    from polymorph.verify.tolerance import compare, model_tolerance

    backend = args.backend or knobs.backend
    model = load_pt2(args.model, dtype=args.dtype)
    if args.inputs:  # a program with dynamic dims at the given inputs' shapes (the fresh draws' too)
        model, _ = bind_program(model, tensors._read_inputs(args.inputs))
    artifact = api.compile(model, backend)
    exe = registry.get(artifact.plan.backend).load(artifact, model.weights())
    seed = int(np.random.default_rng().integers(2**31)) if args.seed is None else args.seed
    rows, bad = [], None
    for r in range(EXACT_ROUNDS):
        given = tensors._read_inputs(args.inputs) if args.inputs and r == 0 else None
        inputs = bind_inputs(model, given if given is not None else model.example_inputs(seed + r))
        first, second, eager = exe.run(dict(inputs)), exe.run(dict(inputs)), model.run_program(inputs)
        for name in model.graph.outputs:
            a, b, want = np.asarray(first[name]), np.asarray(second[name]), eager[name]
            same = a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            runs = "bitwise equal" if same else "DIFFER"
            if a.dtype == want.dtype and a.shape == want.shape and a.tobytes() == want.tobytes():
                vs = "bitwise equal"
            else:
                dtype = model.graph.types()[model.graph.outputs[name]].dtype
                tol = model_tolerance(DType.F32 if dtype == DType.C64 else dtype)
                wide = np.complex128 if np.iscomplexobj(want) else np.float64
                x, y = a.astype(wide), want.astype(wide)
                if np.iscomplexobj(want):
                    x, y = np.stack([x.real, x.imag]), np.stack([y.real, y.imag])
                c = compare(x, y, tol)
                vs = f"within tolerance (max abs err {c.max_abs:.3g})" if c.ok else f"MISMATCH: {c}"
                if not c.ok and bad is None:
                    bad = f"{name} on draw {r}: {c}"
            if not same and bad is None:
                bad = f"{name} on draw {r}: two runs on the same inputs differ (not deterministic)"
            rows.append((name, str(r), runs, vs))
    console.table(
        f"verify --exact {model.name} on {backend}: {EXACT_ROUNDS} fresh draws (seed {seed}), each run twice",
        ["output", "draw", "two runs", "against PyTorch eager"],
        rows,
    )
    if bad is not None:
        raise CheckFailed(f"{model.name} on {backend}: {bad}")
    eager_bits = all(row[3] == "bitwise equal" for row in rows)
    console.line(f"{model.name} on {backend}: deterministic, bit for bit, over {EXACT_ROUNDS} draws; "
                 + ("bitwise equal to PyTorch eager" if eager_bits else "within tolerance of PyTorch eager, "
                    "not bitwise equal to it everywhere"))  # fmt: skip
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from polymorph.cli.demo import run_demo

    return run_demo(args)


def _engine_address(args: argparse.Namespace) -> str:
    from polymorph.engine.protocol import parse_address
    from polymorph.knobs import knobs

    address = args.engine or knobs.engine
    if not address:
        raise UserError(
            "no engine given: pass --engine ADDR (printed by `polymorph engine start`) or set POLYMORPH_ENGINE"
        )
    parse_address(address, "--engine" if args.engine else "POLYMORPH_ENGINE")  # a malformed one: one line
    return address


def cmd_engine_start(args: argparse.Namespace) -> int:
    from polymorph import api
    from polymorph.engine.controller import start_detached
    from polymorph.knobs import knobs

    backend = args.backend or knobs.backend
    sizes = dict(batch=args.batch, ctx=args.ctx, traffic=args.traffic, dtype=args.dtype or _default_dtype(backend),
                 block_size=args.block_size)  # fmt: skip
    api.check_engine_sizes(args.model, backend, args.target, **sizes)  # before a process starts
    address, pid = start_detached(
        args.model,
        backend,
        args.target,
        batch=args.batch,
        ctx=args.ctx,
        traffic=args.traffic,
        dtype=args.dtype or _default_dtype(backend),
        block_size=args.block_size,
        unix=args.unix,
    )
    print(address, flush=True)  # the first line is the address alone, for scripts
    console.line(
        f"engine pid {pid} holds {args.model} on {backend}; stop it: polymorph engine stop --engine {address}"
    )
    from polymorph.cli import tensors

    note = tensors.buckets_note(args.model, args.dtype)  # a program with dynamic dims: its other buckets
    if note:
        console.line(note)
    return 0


def cmd_engine_swap(args: argparse.Namespace) -> int:
    import json

    from polymorph.engine.controller import Controller

    try:
        config = json.loads(args.config) if args.config else None
    except json.JSONDecodeError as e:
        raise UserError(f"--config must be a JSON object: {e}") from None
    except RecursionError:
        raise UserError("--config is JSON nested too deeply; it must be a JSON object") from None
    with Controller.attach(_engine_address(args), budget_s=args.budget) as engine:
        exact = {"exact": True} if args.exact else {}
        swap, gate = engine.try_candidate(args.group, args.kernel, config, seed=args.seed, **exact)
        replaced = engine.restarts
    if swap.fault is not None:
        raise CheckFailed(f"{args.kernel} rejected at {swap.fault.stage}: {swap.fault.cause}")
    assert gate is not None
    if replaced:
        console.line(f"the worker was lost and replaced at the same address ({replaced}x)")
    console.line(
        f"swapped {args.kernel} into {args.group}: build {console.seconds(swap.build_s)}, "
        f"swap {console.seconds(swap.swap_s)}, round trip {console.seconds(swap.round_trip_s)}"
    )
    if not gate.ok:
        fault = gate.faults[0]
        raise CheckFailed(f"{args.kernel} rejected at {fault.stage}: {fault.cause}; the stock kernel is back")
    console.table(
        f"gates of {args.kernel} in {args.group}", ["gate", "verdict", "what it found"],
        [(g.name, g.verdict, g.cause) for g in gate.gates],
    )  # fmt: skip
    m = gate.measurement or {}
    console.line(
        f"every gate passed; fast tier {console.seconds(m.get('median_s'))} (median of the timed rounds; "
        f"max-min {console.seconds(m.get('spread_s'))}; {m.get('trials', '-')} calls); the candidate stays in"
    )
    return 0


def cmd_engine_measure(args: argparse.Namespace) -> int:
    from polymorph.engine.controller import Controller

    with Controller.attach(_engine_address(args), budget_s=args.budget) as engine:
        result = engine.measure(args.tier, args.trials, args.group)
    if "fault" in result:
        raise CheckFailed(f"measure lost the engine: {result['fault']}")
    if args.tier == "slow":
        rows = [("decode step", console.seconds(result["median_s"]), console.seconds(result["spread_s"]))]
    else:
        rows = [
            (g, console.seconds(t["median_s"]), console.seconds(t["spread_s"]))
            for g, t in result["groups"].items()
        ]
    title = f"{args.tier} tier, {result['trials']} trials ({result['timer']})"
    console.table(title, ["what", "median", "max-min"], rows)
    console.line("median and max-min (slowest minus fastest) of the timed rounds' times per call")
    return 0


def cmd_engine_status(args: argparse.Namespace) -> int:
    from polymorph.engine.controller import Controller

    with Controller.attach(_engine_address(args), budget_s=args.budget) as engine:
        status = engine.status()
    candidates = [(g, e["kernel"], e["sha256"][:12]) for g, e in status["groups"].items() if e["candidate"]]
    console.line(
        f"engine pid {status['pid']}: {status['model']} on {status['backend']} ({status['target']}), "
        f"{status['swaps']} swaps, weights loaded {status['weight_loads']}x, cache allocated "
        f"{status['cache_allocations']}x"
    )
    console.table("candidate kernels in place", ["group", "kernel", "sha256"], candidates)
    layers = status.get("sandbox") or {}
    off = {k: v for k, v in layers.items() if v != "on"}
    console.line(
        f"sandbox: {len(layers) - len(off)} of {len(layers)} layers on"
        + (
            ""
            if not off
            else "; off: " + "; ".join(f"{k} ({v.removeprefix('off: ')})" for k, v in off.items())
        )
    )
    return 0


def cmd_engine_stop(args: argparse.Namespace) -> int:
    from polymorph.engine.controller import Controller, EngineError

    address = _engine_address(args)
    try:
        engine = Controller.attach(address, budget_s=args.budget)
    except EngineError as e:
        raise UserError(f"no engine to stop: {e}") from None
    engine.shutdown()
    engine.close()
    console.line(f"engine at {address} stopped")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from polymorph.knobs import knobs
    from polymorph.search.tune import TuneOptions, parse_budget, tune
    from polymorph.search.tune_view import ProgressView, print_report

    opts = TuneOptions(
        model=args.model, backend=args.backend or knobs.backend, target=args.target, traffic=args.traffic,
        dtype=args.dtype or _default_dtype(args.backend or knobs.backend),
        batch=args.batch, ctx=args.ctx, budget_s=parse_budget(args.budget), workers=args.workers,
        out=Path(args.out), board=args.board, registry=args.registry or knobs.registry, seed=args.seed,
        agent_command=args.agent_command, agent_endpoint=args.agent_endpoint, agent_model=args.agent_model,
        agent_api_key=knobs.agent_api_key, agent_calls=args.agent_calls, wait_for_posts=args.wait_for_posts,
        force=args.force, exact=args.exact,
    )  # fmt: skip
    view = ProgressView()
    try:
        report = tune(opts, view)
    finally:
        view.close()
    print_report(report)
    return 0


def cmd_knobs(args: argparse.Namespace) -> int:
    from polymorph.knobs import knobs

    rows = [(k.env, k.kind, k.default, k.value, k.doc) for k in knobs.describe()]
    console.table("knobs (environment variables)", ["variable", "type", "default", "value", "meaning"], rows)
    return 0


# --- parser ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="polymorph", description="Compile, run, verify and tune ML inference on any chip.")
    p.add_argument("--version", action="version", version=f"polymorph {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, fn, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help)
        c.set_defaults(fn=fn)
        return c

    command("backends", cmd_backends, "list backends and what works on this machine")
    c = command("hw", cmd_hw, "show hardware profiles, and a model's decode roofline on one")
    c.add_argument("chip", nargs="?", help="profile id (h100, h200, b200, gb300, mi300x, mi355x, trn2, cpu)")
    c.add_argument("--model", help="print the roofline floor of this model's decode step on the chip")
    c.add_argument("--dtype", default="bf16", help="weight dtype for --model (default bf16)")
    c.add_argument("--batch", type=int, default=1)
    c.add_argument("--ctx", type=int, default=1024, help="context length of the decode step (default 1024)")
    c = command("graph", cmd_graph, "print a model's graph (readable text, or --json)")
    c.add_argument("model")
    c.add_argument("--json", action="store_true")
    c.add_argument("--dtype", default="f32")

    def model_args(c: argparse.ArgumentParser) -> None:
        c.add_argument(
            "model", help="zoo name, Hugging Face model directory, IR .json or torch.export .pt2 file"
        )
        c.add_argument("--backend", help="backend name (default: POLYMORPH_BACKEND or cpu)")
        c.add_argument("--dtype", help="weight and activation dtype (default f32 on cpu, bf16 elsewhere)")

    c = command(
        "compile", cmd_compile, "lower and compile a model; write plan.json, report.json and device code"
    )
    model_args(c)
    c.add_argument("--target", help="chip profile id (default: the backend's first)")
    c.add_argument("--out", help="output directory (empty, new, or a previous compile output)")
    c.add_argument("--force", action="store_true", help="write into a non-empty --out that is not one")
    c.add_argument("--batch", type=int, help="sequences per step (default 1)")
    c.add_argument("--ctx", type=int, help="longest context in tokens (default 1024; a prefill's: --prefill)")
    c.add_argument(
        "--prefill", type=int, metavar="N", help="compile a prefill of N prompt tokens per sequence"
    )
    c.add_argument("--traffic", help="traffic shape TOML; the plan is for its heaviest bucket of --phase")
    c.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                   help="with --traffic: its decode steps' buckets, or its prompt lengths (batch 1)")  # fmt: skip
    c.add_argument("--stages", metavar="DIR", help="write the product of every compile stage to DIR")
    c.add_argument("-v", "--verbose", action="store_true", help="list every kernel")
    c = command("run", cmd_run, "generate tokens from a model or a compile output directory")
    model_args(c)
    c.add_argument("--prompt", default="1", help="prompt as token ids (default: 1)")
    c.add_argument("--text", help="prompt as text (needs --tokenizer)")
    c.add_argument("--tokenizer", help="a tokenizer.json (Hugging Face tokenizers)")
    c.add_argument("--new-tokens", type=int, default=16)
    c.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--seed", type=int, default=0, help="sampling seed")
    c.add_argument("--inputs", metavar="IN.npz", help="a .pt2 program's inputs (arr_0.. or by input name)")
    c.add_argument("--outputs", metavar="OUT.npz", help="where a .pt2 program's outputs go (output_0..)")
    c.add_argument("--force", action="store_true", help="overwrite an existing --outputs file")
    c = command(
        "verify", cmd_verify, "check a backend's logits against the reference engine (exit 1 on mismatch)"
    )
    model_args(c)
    c.add_argument("--seed", type=int, help="token seed (default: fresh random tokens every run)")
    c.add_argument("--inputs", metavar="IN.npz", help="a .pt2 program's inputs (default: fresh random ones)")
    c.add_argument("--exact", action="store_true",
                   help="bit-exact mode for a .pt2 program: the plan runs twice on each of "
                   f"{EXACT_ROUNDS} fresh draws (the first --inputs, if given) and the runs must agree byte "
                   "for byte (-0.0 is not 0.0, NaN payloads count); each output is reported bitwise equal "
                   "to PyTorch eager or only within tolerance of it (a mismatch fails)")  # fmt: skip
    c = command("demo", cmd_demo, "the tour: graph, compiles for four chips, verify, hot swap, short tune")
    c.add_argument("--model", default="llama-tiny",
                   help="zoo name or Hugging Face checkpoint folder (default llama-tiny, random weights)")  # fmt: skip
    c.add_argument("--out", default="polymorph-demo",
                   help="where every output goes and stays (default ./polymorph-demo; new, empty or a demo's)")  # fmt: skip
    c.add_argument("--force", action="store_true", help="write into a non-empty --out that is not a demo's")
    c.add_argument("--budget", default="15s", help="the tune's wall-clock budget (default 15s): 90s, 6m")
    c = command(
        "microbench", cmd_microbench, "measure this machine and write a calibration file for its profile"
    )
    c.add_argument("--backend", default="cpu")
    c.add_argument("--target", help="the GPU's profile id (default: the backend's first, e.g. h200)")
    c.add_argument("--quick", action="store_true", help="fewer sizes, shapes and trials (a smoke test)")
    c.add_argument(
        "--out", help="calibration directory (default: POLYMORPH_CALIBRATION_DIR or hwprofiles/measured)"
    )
    from polymorph.cost import parallel

    parallel.add_command(sub)
    c = command("engine", None, "a persistent engine: start once, swap candidate kernels into it")
    engine = c.add_subparsers(dest="engine_command", metavar="ACTION", parser_class=_Parser, required=True)

    def engine_command(name: str, fn, help: str) -> argparse.ArgumentParser:
        e = engine.add_parser(name, help=help, description=help)
        e.set_defaults(fn=fn)
        if name != "start":
            e.add_argument("--engine", metavar="ADDR", help="engine address, as `engine start` prints it: "
                           "HOST:PORT or tcp://HOST:PORT (TCP), unix:///PATH or a PATH with a / (a unix "
                           "socket); default: POLYMORPH_ENGINE")  # fmt: skip
            e.add_argument(
                "--budget", type=float, default=30.0, help="seconds before a worker counts as hung"
            )
        return e

    e = engine_command("start", cmd_engine_start, "start an engine with a model loaded; print its address")
    model_args(e)
    e.add_argument("--target", help="chip profile id (default: the backend's first)")
    e.add_argument("--batch", type=int)
    e.add_argument("--ctx", type=int)
    e.add_argument("--traffic", help="traffic shape TOML; the slow tier runs its heaviest bucket")
    e.add_argument(
        "--block-size", type=int, help="tokens per KV-cache block (default: POLYMORPH_KV_BLOCK_SIZE)"
    )
    e.add_argument("--unix", metavar="PATH", help="listen on this unix socket instead of TCP on 127.0.0.1")
    e = engine_command(
        "swap", cmd_engine_swap, "swap a candidate kernel into a group and gate it (exit 1: rejected)"
    )
    e.add_argument("group", help="node group id, e.g. layers.0.mlp.down+residual")
    e.add_argument("kernel", help="the candidate kernel file")
    e.add_argument("--config", help="kernel config as JSON (default: the file's first)")
    e.add_argument("--seed", type=int, help="token seed of the gate (default: fresh random tokens)")
    e.add_argument("--exact", action="store_true",
                   help="bit-exact mode: the candidate's outputs must equal the stock kernel's byte for "
                   "byte on fresh inputs and a repeated run (the `exact` gate)")  # fmt: skip
    e = engine_command("measure", cmd_engine_measure, "time the engine as it stands")
    e.add_argument("--tier", choices=("fast", "slow"), default="slow")
    e.add_argument("--trials", type=int, default=20)
    e.add_argument("--group", help="fast tier: time only this group")
    engine_command("status", cmd_engine_status, "what the engine holds")
    engine_command("stop", cmd_engine_stop, "stop the engine")
    c = command("tune", cmd_tune, "tune a model: agents propose, engines gate and measure, winners are kept")
    c.add_argument("model", help="zoo name, Hugging Face model directory, IR .json or torch.export .pt2 file "
                   "(a program's one bucket: its example inputs' shapes)")  # fmt: skip
    c.add_argument("--backend", help="backend name (default: POLYMORPH_BACKEND or cpu)")
    c.add_argument("--target", help="chip profile id (default: the backend's first)")
    c.add_argument("--traffic", help="traffic shape TOML: its buckets are tuned, heaviest first")
    c.add_argument("--exact", action="store_true",
                   help="bit-exact mode: keep only candidates whose outputs equal the stock kernel's byte for "
                   "byte on fresh inputs, deterministically (the registry's champions are not warm-started)")  # fmt: skip
    c.add_argument("--dtype", help="weight and activation dtype (default f32 on cpu, bf16 elsewhere)")
    c.add_argument("--batch", type=int)
    c.add_argument("--ctx", type=int)
    c.add_argument(
        "--budget", default="6m", help="wall-clock budget, engine start and final A/B included: 90s, 6m, 2h"
    )
    c.add_argument("--workers", type=int, default=1, help="engines: one per device (processes on cpu)")
    c.add_argument("--out", default="polymorph-tuned", help="where the tuned plan and the report go (empty, "
                   "new, or a previous tune output, which the run resumes)")  # fmt: skip
    c.add_argument("--force", action="store_true", help="write into a non-empty --out that is not one")
    c.add_argument("--board", type=Path, help="message board SQLite file (default: OUT/board.sqlite)")
    c.add_argument("--registry", type=Path, help="champion registry SQLite file (default: POLYMORPH_REGISTRY, "
                   "else registry.sqlite in $XDG_DATA_HOME/polymorph or ~/.local/share/polymorph)")  # fmt: skip
    c.add_argument("--seed", type=int, default=0, help="the agents' seed")
    c.add_argument("--agent-command", help="an external agent: a command given the prompt on stdin")
    c.add_argument(
        "--agent-endpoint",
        help="an external agent: OpenAI-compatible base URL (key: POLYMORPH_AGENT_API_KEY)",
    )
    c.add_argument("--agent-model", default="", help="the model name sent to --agent-endpoint")
    c.add_argument(
        "--agent-calls", type=int, default=1, help="calls per op signature for each external agent"
    )
    c.add_argument(
        "--wait-for-posts",
        action="store_true",
        help="measure what agents post to the board (`polymorph board post GROUP KERNEL`) until the "
        "budget ends, also after the built-in agents run out of ideas",
    )
    from polymorph.search.commands import add_commands

    add_commands(sub)
    from polymorph.mcp.command import add_command as add_mcp_command

    add_mcp_command(sub)
    from polymorph.cli import report

    report.add_command(sub)
    command("knobs", cmd_knobs, "list the POLYMORPH_* environment variables")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "fn", None):
            parser.print_help()
            return 2
        with console.showing_progress():  # long work reports progress on stderr; silent in library use
            return args.fn(args)
    except UserError as e:
        print(f"polymorph: error: {e}", file=sys.stderr)
        return e.exit_code
    except CheckFailed as e:
        print(f"polymorph: check failed: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `polymorph ... | head`: the reader left; nothing to report
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
