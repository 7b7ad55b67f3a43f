"""`polymorph mcp`: a Model Context Protocol server in front of a tune's board, on the official `mcp`
Python SDK (2.3 <= mcp < 3; the `mcp` extra), over stdio or streamable HTTP on 127.0.0.1 with a
bearer token.

Its tools are `TuneBoardView`'s methods and nothing else: read the tunes, groups, sources, profile
and history; post a candidate; wait for its verdict. A tool's bad input (a UserError) is a tool error
with the one line that names it; an argument the tool does not declare is refused too (a call that
tries to pass `ok`, `median_s` or a champion along with a post gets an error, never a silent drop).
"""

from __future__ import annotations

import functools
import hmac
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.mcp import guide
from polymorph.mcp.view import MAX_WAIT_S, TuneBoardView

SUPPORTED_SDK = ">=2.3,<3"
INSTRUCTIONS = (
    "polymorph tunes ML inference kernels. Call list_tunes to see the running tunes and their node groups "
    "(share of the step, measured time, roofline floor and gap); read polymorph://guide and "
    "polymorph://kernel-contract; post_candidate a kernel file for a group and wait_result for its verdict. "
    "The tune gates and times every candidate; this server can only read and post."
)


def _refusing_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The tool `fn`, with every anticipated failure a ToolError carrying its one line."""
    from mcp.server.mcpserver.exceptions import ToolError

    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise ToolError(str(e)) from None
        except (sqlite3.Error, OSError) as e:
            raise ToolError(f"the board could not be read: {e}") from None

    return tool


def _strict(tool: Any) -> Any:
    """`tool` with its arguments closed: an undeclared argument fails validation (pydantic's default
    drops it silently, so an agent would believe a `result` it passed had counted)."""
    from pydantic import ConfigDict

    base = tool.fn_metadata.arg_model

    config = ConfigDict(**{**base.model_config, "extra": "forbid"})  # type: ignore[typeddict-item]
    closed = type(base.__name__, (base,), {"model_config": config, "__module__": base.__module__})
    tool.fn_metadata.arg_model = closed
    tool.parameters = {**tool.parameters, "additionalProperties": False}
    return tool


def build_server(view: TuneBoardView) -> Any:
    """The MCPServer over `view`: its tools, two resources and one prompt."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools import Tool

    def list_tunes() -> dict[str, Any]:
        """The tunes published on the board (running first): per node group its share of the decode
        step, measured stock time, roofline floor, gap (measured / floor) and best time so far."""
        return {"tunes": view.tunes()}

    def get_group(group: str, tune: str | None = None) -> dict[str, Any]:
        """A node group's spec (nodes, input and output shapes and dtypes), stock kernel and config, the
        configs the kernel declares, the library's other files for it, and its figures. `tune`: an id
        from list_tunes (default: the latest running)."""
        return view.group(tune, group)

    def kernel_contract() -> str:
        """The kernel-file contract every candidate must meet (also the resource polymorph://kernel-contract)."""
        return guide.kernel_contract()

    def read_source(group: str, which: str = "stock", tune: str | None = None) -> dict[str, Any]:
        """The source, config and reasoning of a group's kernel: which="stock" (the plan's), "best" (the
        fastest that passed in this tune so far) or "registry" (the champion kept for this key)."""
        return view.source(tune, group, which)

    def target_profile(tune: str | None = None) -> dict[str, Any]:
        """The tune's chip: datasheet and measured figures, calibration provenance, microbenchmark curves."""
        return view.profile(tune)

    def post_candidate(group: str, source: str | None = None, config: dict[str, Any] | None = None,
                       reasoning: str = "", agent: str = "mcp-agent", tune: str | None = None) -> dict[str, Any]:  # fmt: skip
        """Post a candidate for a node group of a running tune: the complete kernel file's text (and a
        config from its CONFIGS, or none for the first), or a config alone for the stock kernel. Returns
        its id; the tune gates and times it (wait_result)."""
        return view.post(tune, group, source, config, reasoning, agent)

    def wait_result(candidate: int, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait up to timeout_s (at most 600) for a candidate's verdict: passed (median_s, spread_s, the
        gate table), rejected (the gate named, its cause) or failed (build or load error, worker lost);
        pending when no verdict came in time (call again)."""
        return view.result(candidate, timeout_s)

    def group_history(group: str, tune: str | None = None, limit: int = 50) -> dict[str, Any]:
        """What was tried for the group's op signature in this tune, newest first: agent, config,
        reasoning, verdict, the gate that rejected it and its cause, the time of those that passed."""
        return view.history(tune, group, limit)

    tools = [_strict(Tool.from_function(_refusing_errors(fn))) for fn in (
        list_tunes, get_group, kernel_contract, read_source, target_profile, post_candidate, wait_result,
        group_history)]  # fmt: skip
    server = MCPServer(
        "polymorph", instructions=INSTRUCTIONS, version=_version(), tools=tools, log_level="WARNING"
    )  # stderr: a refused call is the caller's news, not the log's

    @server.resource("polymorph://kernel-contract", mime_type="text/markdown")
    def contract_resource() -> str:
        """The kernel-file contract."""
        return guide.kernel_contract()

    @server.resource("polymorph://guide", mime_type="text/markdown")
    def guide_resource() -> str:
        """How to read the roofline gap, what the gates reject and why, the loop to follow."""
        return guide.agent_guide()

    @server.prompt()
    def tune_largest_gap() -> str:
        """Start on the node group of the running tunes with the largest roofline gap (times its share)."""
        try:
            tunes = view.tunes()
        except UserError as e:
            return f"polymorph has nothing to tune yet: {e}"
        return guide.largest_gap_prompt(tunes)

    return server


def _version() -> str:
    from polymorph import __version__

    return __version__


def require_sdk() -> None:
    """UserError (exit 2) unless a supported `mcp` SDK is installed."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        raise UserError("`polymorph mcp` needs the MCP SDK: pip install 'polymorph[mcp]'") from None
    major_minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if not (2, 3) <= major_minor < (3, 0):
        raise UserError(
            f"`polymorph mcp` needs mcp{SUPPORTED_SDK}, found mcp {version}: pip install 'polymorph[mcp]'"
        )


def serve_stdio(view: TuneBoardView) -> None:
    build_server(view).run("stdio")


def http_app(view: TuneBoardView, token: str, port: int) -> Any:
    """The streamable-HTTP app at /mcp, every request refused (401) without `Authorization: Bearer TOKEN`."""
    app = build_server(view).streamable_http_app(host="127.0.0.1")
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(got, expected):
                body = json.dumps({"error": "missing or wrong bearer token"}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def serve_http(view: TuneBoardView, token: str, port: int) -> None:
    import uvicorn

    uvicorn.run(http_app(view, token, port), host="127.0.0.1", port=port, log_level="warning")


def read_token(path: Path | None) -> tuple[str, bool]:
    """(token, whether it was made here): the first line of `path`, or a fresh random one."""
    import secrets

    if path is None:
        return secrets.token_urlsafe(32), True
    try:
        token = (
            path.read_text(encoding="utf-8").strip().splitlines()[0].strip() if path.stat().st_size else ""
        )
    except (OSError, UnicodeDecodeError, IndexError) as e:
        raise UserError(f"--token-file {path}: cannot read a token ({e})") from None
    if len(token) < 16:
        raise UserError(f"--token-file {path}: the token must be at least 16 characters")
    return token, False


__all__ = ["MAX_WAIT_S", "SUPPORTED_SDK", "build_server", "require_sdk"]
