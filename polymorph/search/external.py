"""External agents: a user's command or an OpenAI-compatible endpoint proposes kernel files.

Both get the same prompt (`build_prompt`): the op signature and its groups, the backend and chip with
the profile's figures, the group's share of the step and its roofline gap (measured stock time against
the cost model's floor, when measured), the kernel-file contract, and the current best source with its
config. Both must answer with one kernel file in a ```python fenced block (a bare file is taken too),
optionally followed by a line `CONFIG: {json}`; the text outside the block is kept as the reasoning.
The answer is a candidate like any other: it goes to the board and through every gate.

- CommandAgent: runs a shell command (an LLM CLI, a script), prompt on stdin, answer on stdout.
- EndpointAgent: POST {base}/chat/completions (OpenAI's chat API) with the prompt as the user message;
  the key, when needed, comes from the POLYMORPH_AGENT_API_KEY knob, never from a flag.

Any coding agent can also take part without either: `polymorph board post|wait|results` (README).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.kernel_files import pinned_sources, store_source
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
    for name, text in pinned_sources(path.read_text()):
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
    asked: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @abstractmethod
    def ask(self, prompt: str) -> str:
        """The agent's answer to `prompt`; UserError with the cause when there is none."""

    def propose(self, space: GroupSpace, tried: Mapping[tuple, Outcome | None], limit: int) -> list[Proposal]:
        if limit < 1 or self.asked.get(space.signature, 0) >= self.calls_per_space:
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
        context = {**self.context_of(space), "results": results}
        try:
            source, config, reasoning = parse_answer(self.ask(build_prompt(space, context, best)))
        except UserError as e:
            self.errors.append(f"{space.group}: {e}")
            return []
        path = store_source(self.sources, source)
        return [Proposal(space.signature, space.group, path, config, self.name, reasoning[:4000])]


@dataclass
class CommandAgent(_External):
    command: str = ""
    timeout_s: float = 600.0

    def ask(self, prompt: str) -> str:
        try:
            argv = shlex.split(self.command)
        except ValueError as e:
            raise UserError(f"the agent command `{self.command}` does not parse: {e}") from None
        try:
            done = subprocess.run(argv, input=prompt, capture_output=True, text=True, errors="replace",
                                  timeout=self.timeout_s, check=False)  # fmt: skip
        except FileNotFoundError:
            raise UserError(f"the agent command `{self.command}` was not found") from None
        except subprocess.TimeoutExpired:
            raise UserError(f"the agent command took more than {self.timeout_s:.0f} s") from None
        if done.returncode != 0:
            raise UserError(f"the agent command exited {done.returncode}: {done.stderr.strip()[-200:]}")
        return done.stdout


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
