"""External agents: the prompt they get, how their answers are read, a command and an
OpenAI-compatible endpoint (a local fake server) proposing kernel files, and a short tune in which the
endpoint's kernel goes through the board and every gate like any other candidate."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from polymorph.errors import UserError
from polymorph.pipeline.kernel_files import kernels_root
from polymorph.search.agents import GroupSpace, Outcome, Schedule, candidate_key
from polymorph.search.external import CommandAgent, EndpointAgent, build_prompt, parse_answer

KERNEL = '''"""linear as one torch.mm into the output buffer (an external agent's candidate)."""
import torch

IMPLEMENTS = ("linear",)
CONFIGS = [{"chunk": 0}]


def supports(spec):
    node = spec.single
    return len(spec.nodes) == 1 and len(node.inputs) == 2 and spec.types[node.outputs[0]].dtype.is_float


def build(spec, config, target):
    x_i, w_i = spec.args(spec.single)

    def launch(inputs, outputs, scratch):
        x, w = inputs[x_i], inputs[w_i]
        outputs[0].copy_((x.reshape(-1, x.shape[-1]) @ w.t()).reshape(outputs[0].shape))

    return launch
'''
ANSWER = f'Fuse the reshape into one GEMM call.\n```python\n{KERNEL}```\nCONFIG: {{"chunk": 0}}\n'
LINEAR = kernels_root() / "torch" / "linear.py"


def _space() -> GroupSpace:
    return GroupSpace(signature="linear(f32[batch,1,64],f32[256,64])->(f32[batch,1,256])", group="lm_head",
                      groups=("lm_head",), pattern="linear", stock_kernel=LINEAR,
                      stock_config={"weight_layout": "nk"}, configs=[{"weight_layout": "nk"}], share=0.2)  # fmt: skip


def test_answers_are_parsed_or_refused_in_one_line() -> None:
    source, config, reasoning = parse_answer(ANSWER)
    assert (
        "def build" in source
        and config == {"chunk": 0}
        and reasoning == "Fuse the reshape into one GEMM call."
    )
    assert parse_answer(KERNEL)[0] == KERNEL  # a bare file is taken too
    with pytest.raises(UserError, match="no kernel file"):
        parse_answer("I would try a larger tile.")
    with pytest.raises(UserError, match="CONFIG line is not JSON"):
        parse_answer(f"```python\n{KERNEL}```\nCONFIG: {{nope}}\n")


def test_prompt_quotes_the_op_the_chip_the_gap_and_the_best_source() -> None:
    ctx = {"backend": "cpu", "target": "cpu", "profile": "memory bandwidth 0.02 TB/s", "stock_s": 8e-6,
           "floor_s": 2e-6, "results": ["linear.py {}: 8.00 us"]}  # fmt: skip
    prompt = build_prompt(_space(), ctx, (LINEAR, {"weight_layout": "nk"}))
    for needle in ("lm_head", "linear(f32[batch,1,64]", "memory bandwidth 0.02 TB/s", "8.00 us", "25%",
                   "IMPLEMENTS", LINEAR.read_text().strip()[:200]):  # fmt: skip
        assert needle in prompt, needle


class _Fake(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Fake.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        prompt = body["messages"][0]["content"]
        content = ANSWER if "Pattern: linear;" in prompt else "I have no kernel for this pattern."
        reply = {"choices": [{"message": {"role": "assistant", "content": content}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endpoint():
    server = HTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Fake.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def answer_of(agent: Any, tried: dict | None = None) -> list[Any]:
    """Ask (never blocking), wait for the call, and take the answer on the next round."""
    assert agent.propose(_space(), tried or {}, 1) == []
    agent.settle(timeout_s=60)
    return agent.propose(_space(), tried or {}, 1)


def test_endpoint_agent_proposes_the_served_kernel(endpoint: str, tmp_path: Path) -> None:
    agent = EndpointAgent("endpoint", tmp_path, model="fake-coder", api_key="k-123", base_url=endpoint)
    (p,) = answer_of(agent)
    assert p.kernel.read_text() == KERNEL and p.config == {"chunk": 0} and p.agent == "endpoint"
    assert "one GEMM" in p.reasoning
    (req,) = _Fake.seen
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k-123"
    assert req["body"]["model"] == "fake-coder" and "lm_head" in req["body"]["messages"][0]["content"]
    assert agent.propose(_space(), {}, 1) == []  # one call per space and round


def test_endpoint_failures_are_kept_not_raised(tmp_path: Path) -> None:
    agent = EndpointAgent("endpoint", tmp_path, base_url="http://127.0.0.1:9/v1", timeout_s=2)
    assert answer_of(agent) == []
    assert len(agent.errors) == 1 and "unreachable" in agent.errors[0]


def test_command_agent_reads_the_prompt_and_answers(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    answer = tmp_path / "answer.txt"
    answer.write_text(ANSWER)
    script.write_text(
        "import sys\nprompt = sys.stdin.read()\nassert 'lm_head' in prompt\n"
        f"sys.stdout.write(open({str(answer)!r}).read())\n"
    )
    agent = CommandAgent("command", tmp_path / "src", command=f"{sys.executable} {script}")
    tried = {candidate_key(_space().signature, LINEAR, {"weight_layout": "nk"}): Outcome(True, 8e-6)}
    (p,) = answer_of(agent, tried)
    assert p.kernel.read_text() == KERNEL
    bad = CommandAgent("command", tmp_path, command="polymorph-no-such-agent")
    assert answer_of(bad) == [] and "not found" in bad.errors[0]


def test_a_slow_agent_never_stalls_the_loop(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text(f"import sys, time\nsys.stdin.read()\ntime.sleep(3)\nsys.stdout.write({ANSWER!r})\n")
    agent = CommandAgent("command", tmp_path / "src", command=f"{sys.executable} {script}")
    schedule = Schedule([_space()], [agent])
    t0 = time.monotonic()
    assert schedule.next_batch({}, 4) == [] and schedule.waiting
    assert time.monotonic() - t0 < 1.5  # the call is out on its own thread
    agent.settle(timeout_s=60)
    (p,) = schedule.next_batch({}, 4)
    assert p.kernel.read_text() == KERNEL and not schedule.waiting


def test_a_call_still_out_at_the_end_is_recorded_and_its_processes_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = tmp_path / "stuck.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    agent = CommandAgent("command", tmp_path / "src", command=f"{sys.executable} {script}")
    assert agent.propose(_space(), {}, 1) == [] and agent.waiting
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    agent.close()
    assert not agent.waiting and "still answering" in agent.errors[0]
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "what the agent command started outlived the tune"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its reaper is gone too
        return f.read().split()[2] != "Z"


def test_an_answer_that_cannot_be_stored_ends_the_call_with_its_cause(tmp_path: Path) -> None:
    answer = tmp_path / "answer.txt"
    answer.write_text(ANSWER)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    agent = CommandAgent(
        "command",
        blocked,
        command=f'{sys.executable} -c "import sys; sys.stdout.write(open({str(answer)!r}).read())"',
    )
    assert answer_of(agent) == [] and not agent.waiting
    assert "the agent call failed" in agent.errors[0]


@pytest.mark.slow
def test_tune_measures_an_endpoint_candidate_through_every_gate(endpoint: str, tmp_path: Path) -> None:
    from polymorph.search.board import Board
    from polymorph.search.tune import TuneOptions, tune

    report = tune(TuneOptions(model="llama-tiny", budget_s=50, workers=1, out=tmp_path, trials=3, ab_trials=3,
                              agent_endpoint=endpoint, agent_model="fake-coder"))  # fmt: skip
    errors = report.buckets[0].agent_errors
    # The patterns it had no answer for, and answers that came after the search had stopped taking
    # candidates (a run that ran out of ideas before the agent answered them all).
    assert errors and all("no kernel file" in e or "after the search stopped" in e for e in errors), errors
    board = Board(tmp_path / "board.sqlite")
    mine = [c for c in board.candidates() if c.agent == "endpoint"]
    board.close()
    assert mine, f"the endpoint's kernel never reached the board; agent errors: {errors}"
    done = [c for c in mine if c.state == "done"]
    assert done and all(c.result.ok for c in done), [c.result for c in done]
    assert {"numerics", "quality"} <= set(done[0].result.gates)
