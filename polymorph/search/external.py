"""External agents: a user's command or an OpenAI-compatible endpoint proposes kernel files.

Both get the same prompt (`build_prompt`): the op signature and its groups, the backend and chip with
the profile's figures, the group's share of the step and its roofline gap (measured stock time against
the cost model's floor, when measured), the kernel-file contract, and the current best source with its
config. Both must answer with one kernel file in a ```python fenced block (a bare file is taken too),
optionally followed by a line `CONFIG: {json}`; the text outside the block is kept as the reasoning.
The answer is a candidate like any other: it goes to the board and through every gate. A call runs on
a thread of the agent's own (`parallel_calls` at a time), so a minute-long LLM answer never stalls the
loop that feeds the workers; `propose` hands the answer over on a later round.

- CommandAgent: runs a shell command (an LLM CLI, a script), prompt on stdin, answer on stdout.
- EndpointAgent: POST {base}/chat/completions (OpenAI's chat API) with the prompt as the user message;
  the key, when needed, comes from the POLYMORPH_AGENT_API_KEY knob, never from a flag.

Any coding agent can also take part without either: `polymorph board post|wait|results` (README).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.pipeline.kernel_files import pinned_sources, store_source
from polymorph.search.agents import GroupSpace, Outcome, Proposal

CONTRACT = (
    "A kernel file is a Python module exposing IMPLEMENTS (the pattern name), CONFIGS (a list of config "
    "dicts), supports(spec) -> bool and build(spec, config, target) -> launch, where "
    "launch(inputs, outputs, scratch) writes every output buffer in place. spec.nodes, spec.inputs, "
    "spec.outputs, spec.types[value].shape/.dtype, spec.args(node) and spec.node(op) describe the group."
)
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
_CONFIG = re.compile(r"^CONFIG:\s*(\{.*\})\s*$", re.M)


def build_prompt(space: GroupSpace, context: Mapping[str, Any], best: tuple[Path, Mapping[str, Any]]) -> str:
    """The prompt for one search space. `context`: backend, target, profile figures (text), the stock
    time and the floor when known, and results so far (lines)."""
    path, config = best
    lines = [
        f"Write a faster kernel for polymorph's node group `{space.group}` (and the {len(space.groups)} "
        f"groups with the same op signature) on backend `{context.get('backend', '?')}`, chip `{context.get('target', '?')}`.",
        f"Op signature: {space.signature}",
        f"Pattern: {space.pattern}; predicted share of the decode step: {space.share:.1%}.",
        f"Chip: {context.get('profile', 'no figures')}",
    ]
    if context.get("stock_s") is not None:
        gap = ""
        if context.get("floor_s"):
            gap = f"; the roofline floor is {context['floor_s'] * 1e6:.2f} us ({context['floor_s'] / context['stock_s']:.0%} of it)"
        lines.append(f"The stock kernel takes {context['stock_s'] * 1e6:.2f} us{gap}.")
    for r in context.get("results", [])[-8:]:
        lines.append(f"Tried: {r}")
    lines += [
        CONTRACT,
        f"The current best is `{path.name}` with config {json.dumps(dict(config), sort_keys=True)}:",
        "```python",
        path.read_text().rstrip(),
        "```",
    ]
    for name, _, text in pinned_sources(path.read_text(), path.parent):
        lines += [
            f"It takes the shared module `{name}` through its `depend(...)` line, pinned by content hash: keep "
            "that line to use this code as it is, or copy what you change into your file.",
            "```python",
            text.rstrip(),
            "```",
        ]
    lines += [
        "Answer with the complete new kernel file in one ```python block, then optionally one line "
        "`CONFIG: {...}` naming the config to measure, and say briefly why it should be faster.",
    ]
    return "\n".join(lines)


def parse_answer(text: str) -> tuple[str, dict[str, Any], str]:
    """(kernel source, config, reasoning) from an agent's answer; UserError when there is no kernel."""
    m = _FENCE.search(text)
    source = m.group(1) if m else text if "def build" in text else ""
    if "def build" not in source or "IMPLEMENTS" not in source:
        raise UserError(
            "the agent's answer holds no kernel file (a ```python block with IMPLEMENTS and build)"
        )
    config: dict[str, Any] = {}
    c = _CONFIG.search(text)
    if c:
        try:
            config = json.loads(c.group(1))
        except json.JSONDecodeError:
            raise UserError(f"the agent's CONFIG line is not JSON: {c.group(1)[:80]}") from None
    reasoning = (_FENCE.sub("", text) if m else "").strip()
    reasoning = _CONFIG.sub("", reasoning).strip()
    return source if source.endswith("\n") else source + "\n", config, reasoning or "(no reasoning given)"


@dataclass
class _External(ABC):
    """What both external agents share: the prompt, the answer's parsing, one call per space and round.
    `context_of(space)` gives the figures the prompt quotes (tune keeps them current); `errors` keeps
    every failed call's cause, since a failed call yields no candidate to record it on."""

    name: str
    sources: Path  # where proposed files are written, by content hash
    context_of: Callable[[GroupSpace], Mapping[str, Any]] = lambda space: {}
    calls_per_space: int = 1
    parallel_calls: int = 2
    asked: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _calls: dict[str, Future[list[Proposal]]] = field(default_factory=dict, init=False, repr=False)

    @abstractmethod
    def ask(self, prompt: str) -> str:
        """The agent's answer to `prompt`; UserError with the cause when there is none."""

    @property
    def waiting(self) -> bool:
        """A call is out, or answered and not yet handed over: the search is not over."""
        return bool(self._calls)

    def ready(self) -> set[str]:
        """Signatures of the spaces whose call has been answered and not yet handed over."""
        return {signature for signature, call in self._calls.items() if call.done()}

    def settle(self, timeout_s: float | None = None) -> None:
        """Wait for the calls that are out (tests, and a caller with time to spare)."""
        wait_futures(list(self._calls.values()), timeout=timeout_s)

    def close(self) -> None:
        """Stop taking answers; a call still out is recorded as unanswered and abandoned (its thread is
        a daemon: it never holds the process past the budget)."""
        for signature, call in self._calls.items():
            if not call.done():
                self.errors.append(f"{signature}: still answering when the budget ran out")
            elif call.result():
                self.errors.append(f"{signature}: answered after the search stopped taking candidates")
        self._calls.clear()

    def propose(self, space: GroupSpace, tried: Mapping[tuple, Outcome | None], limit: int) -> list[Proposal]:
        """The answer to this space's call once it has come (else []); a new call when none is out and
        the space has calls left. Never blocks."""
        call = self._calls.get(space.signature)
        if call is not None:
            if limit < 1 or not call.done():
                return []
            del self._calls[space.signature]
            return call.result()
        out = sum(not c.done() for c in self._calls.values())
        if (
            limit < 1
            or out >= self.parallel_calls
            or self.asked.get(space.signature, 0) >= self.calls_per_space
        ):
            return []
        self.asked[space.signature] = self.asked.get(space.signature, 0) + 1
        mine = {k: o for k, o in tried.items() if k[0] == space.signature}
        measured = sorted((o.median_s, k) for k, o in mine.items() if o is not None and o.ok and o.median_s)
        best = (Path(measured[0][1][1]), json.loads(measured[0][1][2])) if measured else (
            space.stock_kernel, dict(space.stock_config))  # fmt: skip
        results = [
            f"{Path(k[1]).name} {k[2]}: "
            + (
                f"{o.median_s * 1e6:.2f} us"
                if o and o.ok and o.median_s
                else f"rejected: {o.cause}"
                if o
                else "pending"
            )
            for k, o in mine.items()
        ]
        prompt = build_prompt(space, {**self.context_of(space), "results": results}, best)
        call: Future[list[Proposal]] = Future()
        self._calls[space.signature] = call

        def answer() -> None:
            try:
                call.set_result(self._answer(space, prompt))
            except BaseException as e:  # the call always ends: a hung future would hold tune to its budget
                self.errors.append(f"{space.group}: the agent call failed: {type(e).__name__}: {e}")
                call.set_result([])

        threading.Thread(target=answer, daemon=True, name=f"agent-{self.name}").start()
        return []

    def _answer(self, space: GroupSpace, prompt: str) -> list[Proposal]:
        try:
            source, config, reasoning = parse_answer(self.ask(prompt))
        except UserError as e:
            self.errors.append(f"{space.group}: {e}")
            return []
        path = store_source(self.sources, source)
        return [Proposal(space.signature, space.group, path, config, self.name, reasoning[:4000])]


@dataclass
class CommandAgent(_External):
    command: str = ""
    timeout_s: float = 600.0
    _running: set[subprocess.Popen[str]] = field(default_factory=set, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def ask(self, prompt: str) -> str:
        try:
            argv = shlex.split(self.command)
        except ValueError as e:
            raise UserError(f"the agent command `{self.command}` does not parse: {e}") from None
        try:  # a session of its own: close() ends the command and whatever it started
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, errors="replace", start_new_session=True)  # fmt: skip
        except FileNotFoundError:
            raise UserError(f"the agent command `{self.command}` was not found") from None
        with self._lock:
            self._running.add(proc)
            if self._closed:
                _kill_group(proc)
        try:
            stdout, stderr = proc.communicate(prompt, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:  # a process that left the group may still hold the pipes: do not wait on it for ever
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
            raise UserError(f"the agent command took more than {self.timeout_s:.0f} s") from None
        finally:
            with self._lock:
                self._running.discard(proc)
        if proc.returncode != 0:
            raise UserError(f"the agent command exited {proc.returncode}: {stderr.strip()[-200:]}")
        return stdout

    def close(self) -> None:
        super().close()
        with self._lock:  # an abandoned call's processes do not outlive the tune
            self._closed = True
            for proc in self._running:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


@dataclass
class EndpointAgent(_External):
    base_url: str = ""
    model: str = ""
    api_key: str | None = None
    timeout_s: float = 600.0

    def ask(self, prompt: str) -> str:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}]}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                reply = json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            raise UserError(f"the agent endpoint {url} answered HTTP {e.code}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise UserError(f"the agent endpoint {url} is unreachable: {e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"the agent endpoint {url} did not answer JSON") from None
        try:
            return str(reply["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            raise UserError(f"the agent endpoint {url} answered no choices[0].message.content") from None
