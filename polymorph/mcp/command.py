"""The `polymorph mcp` subcommand: `add_command(subparsers)` adds it to the CLI (polymorph/cli/command.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from polymorph.errors import UserError


def cmd_mcp(args: argparse.Namespace) -> int:
    from polymorph.mcp import server
    from polymorph.mcp.view import TuneBoardView

    server.require_sdk()
    view = TuneBoardView(args.board, args.registry)
    if args.http is None:
        if args.token_file is not None:
            raise UserError(
                "--token-file is for --http; over stdio the client that started this process is the one peer"
            )
        server.serve_stdio(view)
        return 0
    if not 1 <= args.http <= 65535:
        raise UserError(f"--http takes a TCP port from 1 to 65535, got {args.http}")
    token, made = server.read_token(args.token_file)
    where = f"http://127.0.0.1:{args.http}/mcp"
    # stderr: stdout stays free; the token is shown once, to whoever started the server.
    shown = f"token: {token}" if made else f"token: the first line of {args.token_file}"
    print(f"polymorph mcp: serving {where} (board {args.board}); send Authorization: Bearer TOKEN; {shown}",
          file=sys.stderr, flush=True)  # fmt: skip
    server.serve_http(view, token, args.http)
    return 0


def add_command(subparsers: Any) -> None:
    """Add `mcp` to `subparsers` (the CLI's `add_subparsers()` action)."""
    from polymorph.knobs import knobs

    what = "serve a tune's board to coding agents over the Model Context Protocol (stdio, or --http)"
    c = subparsers.add_parser("mcp", help=what, description=what)
    c.set_defaults(fn=cmd_mcp)
    c.add_argument("--board", type=Path, default=knobs.board,
                   help=f"the board of the tune (`polymorph tune --board`, or OUT/board.sqlite; default: "
                   f"POLYMORPH_BOARD or {knobs.board})")  # fmt: skip
    c.add_argument("--registry", type=Path, default=knobs.registry,
                   help="the champion registry to read champions from (default: POLYMORPH_REGISTRY or the data dir's)")  # fmt: skip
    c.add_argument(
        "--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT instead of stdio"
    )
    c.add_argument("--token-file", type=Path,
                   help="with --http: the bearer token, first line of this file (default: a fresh one, printed on stderr)")  # fmt: skip
