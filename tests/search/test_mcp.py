"""`polymorph mcp`: the MCP SDK's own client against the server, over stdio against a real running
`polymorph tune --wait-for-posts` on cpu (list, read, post an honest and a wrong candidate, wait for
"passed" with a time and "rejected" with the gate named, both on the board), and against a published
tune in process and over streamable HTTP (refusals: writes, traversal, oversized and malformed
arguments are tool errors; HTTP without the bearer token is refused).

Skipped, with the reason, when the `mcp` extra is not installed (`pip install 'polymorph[mcp]'`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

mcp = pytest.importorskip("mcp", reason="the `mcp` extra is not installed: pip install 'polymorph[mcp]'")
anyio = pytest.importorskip("anyio")

from mcp import Client, StdioServerParameters  # noqa: E402

from polymorph.pipeline.kernel_files import kernels_root  # noqa: E402
from polymorph.search.board import Board  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GROUP = "layers.0.mlp.down+residual"  # llama-tiny's down projection: two groups share its signature


def _stock() -> str:
    return (kernels_root() / "torch" / "linear_residual.py").read_text()


def _wrong() -> str:
    """The stock kernel with every output off by 0.5: plausible code, a wrong answer (its `build`
    wrapped, so it holds whatever the stock file's internals are)."""
    return _stock() + (
        "\n\n_stock_build = build\n\n\ndef build(spec, config, target):\n"
        "    launch = _stock_build(spec, config, target)\n\n"
        "    def off_by_half(inputs, outputs, scratch):\n        launch(inputs, outputs, scratch)\n"
        "        outputs[0].add_(0.5)\n\n    return off_by_half\n"
    )


def _json(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def _error(result: Any) -> str:
    assert result.is_error, result.content[0].text[:400]
    return result.content[0].text


def _env() -> dict[str, str]:
    keep = ("PATH", "HOME", "XDG_DATA_HOME", "PYTHONPATH", "TMPDIR", "LANG")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"PYTHONUNBUFFERED": "1"}


async def _refusals(client: Any, tune: str) -> None:
    """Every way a hostile agent might try to write or to break the server: a tool error each, and
    the server keeps answering."""
    tools = {t.name for t in (await client.list_tools()).tools}
    assert tools == {"list_tunes", "get_group", "kernel_contract", "read_source", "target_profile",
                     "post_candidate", "wait_result", "group_history"}  # fmt: skip
    for name in ("post_result", "write_champion", "claim"):
        assert "Unknown tool" in _error(await client.call_tool(name, {"candidate": 1, "ok": True}))
    # A result or a champion smuggled in with a post: refused, not silently dropped.
    for extra in ({"ok": True, "median_s": 1e-9}, {"champion": {"source": _stock()}}):
        text = _error(await client.call_tool("post_candidate", {"group": GROUP, "source": _stock(), **extra}))
        assert "Extra inputs are not permitted" in text
    for group in ("../../etc/passwd", "layers.0.mlp.down+residual@other-scope", "", "lm_head/../x"):
        text = _error(
            await client.call_tool("post_candidate", {"group": group, "source": _stock(), "tune": tune})
        )
        assert "node group" in text, text
    big = _stock() + "#" * 300_000
    assert "limit is" in _error(await client.call_tool("post_candidate", {"group": GROUP, "source": big}))
    assert "no kernel file" in _error(
        await client.call_tool("post_candidate", {"group": GROUP, "source": "print(1)"})
    )
    assert "valid dictionary" in _error(
        await client.call_tool("post_candidate", {"group": GROUP, "config": [1, 2]})
    )
    assert "agent" in _error(await client.call_tool("post_candidate", {"group": GROUP, "config": {"a": 1},
                                                                        "agent": "x" * 500}))  # fmt: skip
    assert "valid integer" in _error(await client.call_tool("wait_result", {"candidate": "one"}))
    assert "timeout_s" in _error(await client.call_tool("wait_result", {"candidate": 1, "timeout_s": 1e9}))
    assert "candidate" in _error(await client.call_tool("wait_result", {"candidate": -3}))
    assert "no candidate 999999" in _error(
        await client.call_tool("wait_result", {"candidate": 999999, "timeout_s": 0})
    )
    assert "stock, best or registry" in _error(
        await client.call_tool("read_source", {"group": GROUP, "which": "../../x"})
    )
    assert "no tune" in _error(await client.call_tool("get_group", {"group": GROUP, "tune": "../board"}))
    assert "required" in _error(await client.call_tool("get_group", {})).lower()
    assert _json(await client.call_tool("list_tunes", {}))["tunes"]  # still serving


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_mcp_client_posts_an_honest_and_a_wrong_candidate_into_a_running_tune(tmp_path: Path) -> None:
    out, board_path = tmp_path / "run", tmp_path / "board.sqlite"
    log = (tmp_path / "tune.log").open("w")
    tune = subprocess.Popen(
        [sys.executable, "-m", "polymorph", "tune", "llama-tiny", "--backend", "cpu", "--wait-for-posts",
         "--budget", "400s", "--out", str(out), "--board", str(board_path),
         "--registry", str(tmp_path / "registry.sqlite")],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    server = StdioServerParameters(command=sys.executable, cwd=str(REPO), env=_env(),
                                   args=["-m", "polymorph", "mcp", "--board", str(board_path),
                                         "--registry", str(tmp_path / "registry.sqlite")])  # fmt: skip
    seen: dict[str, Any] = {}

    async def agent() -> None:
        async with Client(server, cache=None, read_timeout_seconds=700) as client:
            deadline = time.monotonic() + 240  # the tune compiles and publishes first
            while True:
                r = await client.call_tool("list_tunes", {})
                if not r.is_error and any(t["running"] for t in json.loads(r.content[0].text)["tunes"]):
                    break
                assert "no board" in r.content[0].text or "no tune" in r.content[0].text, r.content[0].text
                assert tune.poll() is None and time.monotonic() < deadline, (
                    "the tune never published its groups"
                )
                await anyio.sleep(1.0)
            (running,) = _json(r)["tunes"]
            groups = {g["group"]: g for g in running["groups"]}
            assert GROUP in groups and running["backend"] == "cpu" and running["waits_for_posts"]
            assert 0 < groups[GROUP]["share"] < 1 and groups[GROUP]["same_signature_groups"] == 2
            space = _json(await client.call_tool("get_group", {"group": GROUP}))
            spec, configs = space["spec"], space["configs"]
            assert spec["pattern"] == "linear+residual" and [n["op"] for n in spec["nodes"]] == [
                "linear",
                "add",
            ]
            stock = _json(await client.call_tool("read_source", {"group": GROUP, "which": "stock"}))
            assert stock["source"] == _stock() and stock["kernel"] == "torch/linear_residual.py"
            contract = await client.call_tool("kernel_contract", {})
            assert not contract.is_error and "IMPLEMENTS" in contract.content[0].text
            honest = _json(await client.call_tool("post_candidate", {
                "group": GROUP, "source": _stock() + "\n# the stock kernel, posted back through MCP\n",
                "config": configs[-1], "reasoning": "the stock kernel at the last config it declares",
                "agent": "mcp-test"}))  # fmt: skip
            wrong = _json(await client.call_tool("post_candidate", {
                "group": GROUP, "source": _wrong(), "reasoning": "faster, trust me", "agent": "mcp-test"}))  # fmt: skip
            assert honest["candidate"] != wrong["candidate"]
            await _refusals(client, running["tune"])
            for name, cid in (("honest", honest["candidate"]), ("wrong", wrong["candidate"])):
                deadline = time.monotonic() + 600
                while True:
                    verdict = _json(
                        await client.call_tool("wait_result", {"candidate": cid, "timeout_s": 60})
                    )
                    if verdict["verdict"] != "pending":
                        break
                    assert tune.poll() is None and time.monotonic() < deadline, (name, verdict)
                seen[name] = verdict
            history = _json(await client.call_tool("group_history", {"group": GROUP}))
            seen["history"] = {row["candidate"]: row["verdict"] for row in history["tried"]}
            seen["ids"] = (honest["candidate"], wrong["candidate"])
            seen["tunes"] = _json(await client.call_tool("list_tunes", {}))["tunes"]

    try:
        anyio.run(agent)
    finally:
        if tune.poll() is None:
            tune.send_signal(signal.SIGINT)  # the rest of the budget is the tune's own search and A/B
            try:
                tune.wait(timeout=120)
            except subprocess.TimeoutExpired:
                tune.kill()
                tune.wait()
        log.close()
    tail = (tmp_path / "tune.log").read_text()[-3000:]
    honest, wrong = seen.get("honest"), seen.get("wrong")
    assert honest is not None and wrong is not None, tail
    assert honest["verdict"] == "passed" and honest["median_s"] > 0 and honest["gates"], honest
    assert all(g["ok"] for g in honest["gates"].values()), honest["gates"]
    assert wrong["verdict"] == "rejected" and wrong["gate"] == "numerics", wrong
    assert wrong["cause"].startswith("numerics:") and wrong["median_s"] is None
    # Both on the board, measured by the tune's own workers (this server has no way to write a verdict).
    board = Board(board_path)
    for cid in seen["ids"]:
        c = board.show(cid)
        assert c.state == "done" and c.result.worker.startswith("worker-"), (c.state, c.result)
        assert "@" in c.group and c.agent == "mcp-test"
    board.close()
    assert {seen["history"].get(cid) for cid in seen["ids"]} == {"passed", "rejected"}
    (t,) = seen["tunes"]
    g = next(g for g in t["groups"] if g["group"] == GROUP)
    assert g["best_s"] is not None and g["best_s"] > 0  # the fastest candidate that passed so far
    # measured_s is the tune's own baseline of the group: there once the tune has posted and timed it.
    assert g["measured_s"] is None or g["measured_s"] > 0


# --- a published tune, no engine: fast checks of the surface ----------------------------------------


def _published(tmp_path: Path) -> Path:
    """A board with a real compiled llama-tiny plan published on it by this process (so "running")."""
    from polymorph import api
    from polymorph.models import load_model
    from polymorph.search.live_tunes import publish_tune
    from polymorph.search.space import buckets_of, group_spaces, predicted_times, toolchain

    (bucket,) = buckets_of(None, None, None)
    artifact = api.compile(load_model("llama-tiny"), "cpu", "cpu", batch=bucket.batch, ctx=bucket.ctx)
    spaces = group_spaces(artifact.plan, "torch", predicted_times(artifact.report))
    board = Board(tmp_path / "board.sqlite")
    opts = SimpleNamespace(model="llama-tiny", backend="cpu", wait_for_posts=True)
    publish_tune(board, opts, "cpu", bucket.id, f"{bucket.id}@published", spaces, artifact.report, 600.0,
                 toolchain("cpu"))  # fmt: skip
    board.close()
    return tmp_path / "board.sqlite"


def test_the_server_reads_and_posts_and_refuses_everything_else_in_process(tmp_path: Path) -> None:
    from polymorph.mcp.server import build_server
    from polymorph.mcp.view import TuneBoardView

    board_path = _published(tmp_path)
    server = build_server(TuneBoardView(board_path, tmp_path / "registry.sqlite"))

    async def agent() -> None:
        async with Client(server, cache=None) as client:
            (t,) = _json(await client.call_tool("list_tunes", {}))["tunes"]
            assert t["running"] and {g["group"] for g in t["groups"]} >= {GROUP, "layers.0.attn.sdpa"}
            await _refusals(client, t["tune"])
            assert "no registry" in _error(
                await client.call_tool("read_source", {"group": GROUP, "which": "registry"})
            )
            assert "has passed" in _error(
                await client.call_tool("read_source", {"group": GROUP, "which": "best"})
            )
            posted = _json(await client.call_tool("post_candidate", {"group": "layers.1.mlp.down+residual",
                                                                     "config": {"some": "config"}}))  # fmt: skip
            assert posted["group"] == GROUP and posted["state"] == "open"
            pending = _json(
                await client.call_tool("wait_result", {"candidate": posted["candidate"], "timeout_s": 0})
            )
            assert pending["verdict"] == "pending"
            profile = _json(await client.call_tool("target_profile", {}))
            assert profile["profile"] == "cpu" and "figures" in profile
            guide = (await client.read_resource("polymorph://guide")).contents[0].text
            assert "timing.checked" in guide and "roofline gap" in guide.lower()
            contract = (await client.read_resource("polymorph://kernel-contract")).contents[0].text
            assert "IMPLEMENTS" in contract and "build(spec, config, target)" in contract
            prompt = (await client.get_prompt("tune_largest_gap")).messages[0].content.text
            assert "layers.0.attn.sdpa" in prompt  # no floor on an uncalibrated cpu: the largest share

    anyio.run(agent)
    board = Board(board_path)
    (c,) = board.candidates()
    assert c.kind == "config" and c.group == GROUP and c.result is None  # posted, nothing else written
    board.close()


def test_a_post_the_tune_had_measured_already_answers_with_that_verdict(tmp_path: Path) -> None:
    """A tune that adopts a post it has already measured (the same kernel and config in its scope)
    fails the post with a cause naming the other candidate: wait_result follows it to that verdict."""
    from polymorph.mcp.server import build_server
    from polymorph.mcp.view import TuneBoardView
    from polymorph.search.live_tunes import LiveTunes
    from polymorph.search.tune import board_group

    board_path = _published(tmp_path)
    live = LiveTunes(board_path)
    (tune,) = live.list()
    live.close()
    board = Board(board_path)
    scoped = board.post(group=board_group(GROUP, tune.scope), backend="cpu", target="cpu",
                        source=_stock(), agent="baseline")  # fmt: skip
    worker = board.claim("worker-b1-0-0", 60.0)
    assert worker is not None and worker.id == scoped  # what a tune's worker does, on the real board
    assert board.post_result(scoped, "worker-b1-0-0", True, "", {"median_s": 4e-5, "spread_s": 1e-6}, {})
    server = build_server(TuneBoardView(board_path))

    async def agent() -> dict[str, Any]:
        async with Client(server, cache=None) as client:
            posted = _json(await client.call_tool("post_candidate", {"group": GROUP, "source": _stock()}))
            assert board.adopt(posted["candidate"], board_group(GROUP, tune.scope)) == scoped
            return _json(
                await client.call_tool("wait_result", {"candidate": posted["candidate"], "timeout_s": 5})
            )

    verdict = anyio.run(agent)
    board.close()
    assert verdict["verdict"] == "passed" and verdict["same_as"] == scoped and verdict["median_s"] == 4e-5


def test_http_needs_the_bearer_token(tmp_path: Path) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    board_path = _published(tmp_path)
    token = "t0ken-" + "x" * 20
    (tmp_path / "token").write_text(token + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "polymorph", "mcp", "--board", str(board_path), "--http",
                             str(port), "--token-file", str(tmp_path / "token")], cwd=REPO, env=_env(),
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                refused = httpx2.post(
                    url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=5
                )
                break
            except httpx2.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.5)
        assert refused.status_code == 401
        wrong = httpx2.post(url, headers={"Authorization": "Bearer nope"}, json={}, timeout=5)
        assert wrong.status_code == 401

        async def agent() -> None:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
                (t,) = _json(await client.call_tool("list_tunes", {}))["tunes"]
                assert t["running"] and t["groups"]

        anyio.run(agent)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_bad_mcp_flags_are_one_line_and_exit_2(tmp_path: Path) -> None:
    from polymorph.cli.command import main

    assert main(["mcp", "--board", str(tmp_path / "b.sqlite"), "--http", "0"]) == 2
    assert main(["mcp", "--token-file", str(tmp_path / "t")]) == 2
    short = tmp_path / "short"
    short.write_text("abc\n")
    assert main(["mcp", "--http", "8765", "--token-file", str(short)]) == 2
