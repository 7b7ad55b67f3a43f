"""`polymorph board ...` and `polymorph registry ...`: the search loop's stores from the command line.

`add_commands(subparsers)` adds both commands to the CLI's subparsers (polymorph/cli/command.py); each action
sets `fn`, a handler that takes the parsed arguments and returns the exit code (0 done; a rejected or
unfinished candidate raises CheckFailed, exit 1; bad input raises UserError, exit 2).
"""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from pathlib import Path
from typing import Any

from polymorph.cli import console
from polymorph.cli.fit import fit
from polymorph.errors import CheckFailed, UserError
from polymorph.search.board import Board, Candidate, Result
from polymorph.search.registry import Registry

# --- board -------------------------------------------------------------------------------------------


def _existing(path: Path, what: str, hint: str) -> Path:
    """`path` if the file exists: a read-only action never creates an empty store at a mistyped path."""
    if not path.is_file():
        raise UserError(f"no {what} at {path}; {hint}")
    return path


def _board(args: argparse.Namespace) -> Board:
    return Board(_existing(args.board, "board", "post a candidate first or pass --board PATH"))


def _registry(args: argparse.Namespace) -> Registry:
    return Registry(_existing(args.registry, "registry", "import a bundle first or pass --registry PATH"))


def cmd_board_post(args: argparse.Namespace) -> int:
    from polymorph.knobs import knobs

    source = None
    if args.kernel is not None:
        try:
            source = Path(args.kernel).read_bytes()
        except OSError as e:
            raise UserError(f"{args.kernel}: cannot read the kernel file ({e.strerror})") from None
    config = _json_object(args.config, "--config") if args.config is not None else None
    reasoning = args.reasoning or ""
    if args.reasoning_file is not None:
        try:
            reasoning = Path(args.reasoning_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{args.reasoning_file}: cannot read the reasoning ({e})") from None
    board = Board(args.board)
    cid = board.post(
        group=args.group,
        backend=args.backend or knobs.backend,
        target=args.target,
        source=source,
        config=config,
        agent=args.agent,
        reasoning=reasoning,
    )
    print(cid, flush=True)  # the first line is the id alone, for scripts
    c = board.show(cid)
    # A duplicate returns the first posting's id, whatever its state: it is measured once.
    console.line(
        f"candidate {cid} ({c.kind}, posted {_when(c.posted)}) for {c.group} on {c.backend} {c.target}: {_state(c)}"
    )
    return 0


def cmd_board_wait(args: argparse.Namespace) -> int:
    board = _board(args)
    result = board.wait(args.id, args.timeout)
    if result is None:
        c = board.show(args.id)
        raise CheckFailed(f"candidate {args.id} has no result after {args.timeout:g} s ({_state(c)})")
    _print_result(result)
    if not result.ok:
        raise CheckFailed(f"candidate {args.id} failed: {result.cause}")
    return 0


def cmd_board_show(args: argparse.Namespace) -> int:
    c = _board(args).show(args.id)
    rows = [
        ("group", c.group),
        ("kind", c.kind),
        ("backend", c.backend),
        ("target", c.target),
        ("kernel sha256", c.sha256 or "-"),
        ("config", json.dumps(c.config, sort_keys=True)),
        ("agent", c.agent or "-"),
        ("posted", _when(c.posted)),
        ("state", _state(c)),
        ("claims", c.attempts),
    ]
    console.table(f"candidate {c.id}", ["field", "value"], rows)
    if c.reasoning:
        console.line(f"reasoning: {c.reasoning}")
    if c.result is not None:
        _print_result(c.result)
    if args.source and c.source is not None:
        console.line(c.source.rstrip("\n"))
    return 0


def cmd_board_results(args: argparse.Namespace) -> int:
    ok = True if args.ok else False if args.failed else None
    board = _board(args)
    results = board.results(group=args.group, ok=ok, after=args.after)
    rows = [
        (
            r.candidate,
            r.group,
            "ok" if r.ok else "failed",
            console.seconds(_float(r.measurements.get("median_s"))),
            console.seconds(_float(r.measurements.get("spread_s"))),
            r.worker,
            r.cause or "-",
        )
        for r in results
    ]
    columns = ["id", "group", "result", "median", "max-min", "worker", "cause"]
    console.table(f"results on {board.path}", columns,
                  fit(columns, rows, {"group": 16, "worker": 8, "cause": 10}))  # fmt: skip
    return 0


# --- registry ----------------------------------------------------------------------------------------


def cmd_registry_list(args: argparse.Namespace) -> int:
    registry = _registry(args)

    def shown(ch: Any) -> bool:
        return (args.op is None or args.op in ch.key.op_signature) and (
            args.profile is None or ch.key.profile == args.profile
        )

    def row(ch: Any, state: str) -> tuple:
        m = ch.measurement
        return (ch.key.id, ch.key.op_signature, ch.key.bucket, ch.key.profile, ch.key.toolchain,
                console.seconds(m.median_s), state)  # fmt: skip

    rows = [row(ch, "champion") for ch in registry.list() if shown(ch)]
    # Demoted ones stay on the record, after the champions: never returned as a champion again.
    demoted = [d for d in registry.demoted() if shown(d.champion)]
    rows += [row(d.champion, "demoted") for d in demoted]
    # 80 columns: the key id is what `registry show` takes, never cut; max-min, the agent and the
    # reasoning are in `registry show KEY`; why one was demoted follows the table, in full.
    columns = ["key", "op signature", "bucket", "chip", "toolchain", "median", "state"]
    cuts = {"op signature": 16, "bucket": 16, "toolchain": 10}
    console.table(f"champions in {registry.path}", columns, fit(columns, rows, cuts))
    for d in demoted:
        text = f"{d.champion.key.id} demoted {_when(d.demoted)}: {d.cause}"
        console.line(textwrap.fill(text, 80, subsequent_indent="  ", break_on_hyphens=False))
    return 0


def cmd_registry_show(args: argparse.Namespace) -> int:
    ch = _registry(args).find(args.key)
    m, t = ch.measurement, ch.tolerance
    rows = [
        ("op signature", ch.key.op_signature),
        ("bucket", ch.key.bucket),
        ("chip", ch.key.profile),
        ("toolchain", ch.key.toolchain),
        ("kernel", f"{ch.kernel or '-'} (sha256 {ch.sha256[:12]})"),
        ("config", json.dumps(dict(ch.config), sort_keys=True)),
        (
            "median",
            f"{console.seconds(m.median_s)} (max-min {console.seconds(m.spread_s)} over the timed "
            f"rounds, {m.trials} calls)",
        ),
        ("gates passed", ", ".join(ch.gates)),
        ("tolerance", f"rtol {t.rtol:g}, atol {t.atol:g}"),
        ("agent", ch.agent or "-"),
        ("since", _when(ch.created)),
    ]
    console.table(f"champion {ch.key.id}", ["field", "value"], rows)
    if ch.reasoning:
        console.line(f"reasoning: {ch.reasoning}")
    if args.source:
        console.line(ch.source.rstrip("\n"))
    return 0


def cmd_registry_export(args: argparse.Namespace) -> int:
    registry = _registry(args)
    n = registry.export_bundle(args.bundle)
    console.line(f"wrote {n} champions from {registry.path} to {args.bundle}")
    return 0


def cmd_registry_import(args: argparse.Namespace) -> int:
    registry = Registry(args.registry)
    s = registry.import_bundle(args.bundle)
    console.line(
        f"imported {args.bundle} into {registry.path}: {s.added} new, {s.replaced} faster than the "
        f"registry's, {s.kept} kept the registry's own"
        + (f", {s.refused} refused: demoted here before (failed re-verification)" if s.refused else "")
    )
    return 0


# --- parser ------------------------------------------------------------------------------------------


def add_commands(subparsers: Any) -> None:
    """Add `board` and `registry` to `subparsers` (the CLI's `add_subparsers()` action)."""

    def group(name: str, help: str, default: Path) -> Any:
        parser = subparsers.add_parser(name, help=help, description=help)
        actions = parser.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)

        def action(action_name: str, fn: Any, action_help: str) -> argparse.ArgumentParser:
            a = actions.add_parser(action_name, help=action_help, description=action_help)
            a.set_defaults(fn=fn)
            a.add_argument(
                f"--{name}",
                type=Path,
                default=default,
                help=f"the {name} SQLite file (default: POLYMORPH_{name.upper()} or {default})",
            )
            return a

        return action

    from polymorph.knobs import knobs

    board = group("board", "the search loop's message board: candidates, claims, results", knobs.board)
    a = board("post", cmd_board_post, "post a candidate kernel file or config; print its id")
    a.add_argument("group", help="node group id, e.g. layers.0.mlp.down+residual")
    a.add_argument("--kernel", help="the candidate kernel file")
    a.add_argument("--config", help="kernel config as a JSON object")
    a.add_argument("--backend", help="backend name (default: POLYMORPH_BACKEND or cpu)")
    a.add_argument("--target", required=True, help="chip profile id (h200, mi355x, trn2, cpu, ...)")
    a.add_argument("--agent", default="", help="who proposes it")
    a.add_argument("--reasoning", help="why it should be faster")
    a.add_argument("--reasoning-file", help="read the reasoning from this file")
    a = board("wait", cmd_board_wait, "wait for a candidate's result (exit 1: failed or no result in time)")
    a.add_argument("id", type=int, help="candidate id")
    a.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    a = board("show", cmd_board_show, "a candidate: what it is, its state and its result")
    a.add_argument("id", type=int, help="candidate id")
    a.add_argument("--source", action="store_true", help="print the kernel source too")
    a = board("results", cmd_board_results, "results so far, in candidate order")
    a.add_argument("--group", help="only this node group")
    verdict = a.add_mutually_exclusive_group()
    verdict.add_argument("--ok", action="store_true", help="only candidates that passed")
    verdict.add_argument("--failed", action="store_true", help="only candidates that failed")
    a.add_argument("--after", type=int, default=0, help="only candidates with a larger id")

    registry = group(
        "registry",
        "the champion registry: the best verified kernel per op, bucket and chip",
        knobs.registry,
    )
    a = registry("list", cmd_registry_list, "list the champions")
    a.add_argument("--op", help="only op signatures containing this text (e.g. rmsnorm)")
    a.add_argument("--profile", help="only this chip profile id")
    a = registry("show", cmd_registry_show, "one champion, with its reasoning")
    a.add_argument("key", help="its key id, as `polymorph registry list` prints it (a unique prefix will do)")
    a.add_argument("--source", action="store_true", help="print the kernel source too")
    a = registry("export", cmd_registry_export, "write every champion, sources included, to a JSON bundle")
    a.add_argument("bundle", help="the bundle file to write")
    a = registry("import", cmd_registry_import, "merge a bundle in, keeping the faster champion per key")
    a.add_argument("bundle", help="a bundle written by `polymorph registry export`")


# --- output ------------------------------------------------------------------------------------------


def _print_result(r: Result) -> None:
    m = r.measurements
    if r.ok:
        console.line(
            f"candidate {r.candidate}: ok, median {console.seconds(_float(m.get('median_s')))} "
            f"(max-min {console.seconds(_float(m.get('spread_s')))} over the timed rounds), measured by {r.worker}"
        )
    else:
        console.line(f"candidate {r.candidate}: failed: {r.cause} (worker {r.worker}, claim {r.attempts})")
    if r.gates:
        console.line("gates: " + ", ".join(f"{name}: {value}" for name, value in sorted(r.gates.items())))


def _state(c: Candidate) -> str:
    if c.state == "claimed":
        left = (c.lease_until or 0.0) - time.time()
        lease = f"lease {left:.0f} s left" if left >= 0 else f"lease ran out {-left:.0f} s ago"
        return f"claimed by {c.worker}, {lease}"
    if c.state == "done" and c.result is not None:
        return "done: ok" if c.result.ok else f"done: failed: {c.result.cause}"
    return c.state


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{option} must be a JSON object: {e}") from None
    except RecursionError:
        raise UserError(f"{option} is JSON nested too deeply; it must be a JSON object") from None
    if not isinstance(value, dict):
        raise UserError(f"{option} must be a JSON object, got {type(value).__name__}")
    return value
