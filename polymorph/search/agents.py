"""The built-in search agents, which need no LLM: each reads a node group's search space and what has
been tried, and proposes candidates with the reasoning that led to them.

- ConfigAutotuner: samples the configs the group's kernel file declares, in a seeded random order, and
  once those are measured refines: it crosses the two best measured configs key by key.
- VariantExplorer: proposes the other kernel files of the backend's library that support the group's
  spec (another implementation or fusion of the same pattern), each at its first config.
- MutationAgent: rewrites the current champion's parameters one at a time: a power-of-two size doubled
  or halved, a small count stepped by one, a categorical key set to another value the space declares.

A proposal names an op signature, not one group: identical layers share it, and the tuner applies a
winner to every group with that signature. Agents never see reference outputs or timings beyond the
medians the board reports.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Proposal:
    signature: str  # the op signature: the tuner swaps the winner into every group that has it
    group: str  # the representative group it is measured on
    kernel: Path  # a kernel file (library file or candidate)
    config: Mapping[str, Any]
    agent: str
    reasoning: str

    @property
    def key(self) -> tuple[str, str, str]:
        return candidate_key(self.signature, self.kernel, self.config)


def candidate_key(signature: str, kernel: Path | str, config: Mapping[str, Any]) -> tuple[str, str, str]:
    """What makes two proposals the same candidate: signature, file (resolved), canonical config."""
    return signature, str(Path(kernel).resolve()), json.dumps(dict(config), sort_keys=True)


@dataclass
class GroupSpace:
    """What an agent may change in one op signature's groups."""

    signature: str
    group: str  # representative group id
    groups: tuple[str, ...]  # every group id with this signature
    pattern: str
    stock_kernel: Path
    stock_config: Mapping[str, Any]
    configs: Sequence[Mapping[str, Any]]  # the stock file's declared configs for the target
    alternatives: Sequence[tuple[Path, Sequence[Mapping[str, Any]]]] = ()  # other files that support it
    share: float = 0.0  # predicted fraction of the step (for ordering)
    champion: tuple[Path, Mapping[str, Any]] | None = None  # the best verified so far, if any


@dataclass(frozen=True)
class Outcome:
    ok: bool
    median_s: float | None = None
    cause: str = ""


class Agent(Protocol):
    name: str

    def propose(
        self, space: GroupSpace, tried: Mapping[tuple, Outcome | None], limit: int
    ) -> list[Proposal]: ...


def _untried(
    proposals: Iterable[Proposal], tried: Mapping[tuple, Outcome | None], limit: int
) -> list[Proposal]:
    out, seen = [], set(tried)
    for p in proposals:
        if p.key not in seen:
            seen.add(p.key)
            out.append(p)
            if len(out) == limit:
                break
    return out


def _measured(space: GroupSpace, tried: Mapping[tuple, Outcome | None]) -> list[tuple[float, Path, dict]]:
    """(median, file, config) of this signature's passed candidates, fastest first."""
    rows = []
    for (sig, path, config), outcome in tried.items():
        if sig == space.signature and outcome is not None and outcome.ok and outcome.median_s is not None:
            rows.append((outcome.median_s, Path(path), json.loads(config)))
    return sorted(rows, key=lambda r: r[0])


@dataclass
class ConfigAutotuner:
    seed: int = 0
    name: str = "autotune"

    def propose(self, space: GroupSpace, tried: Mapping[tuple, Outcome | None], limit: int) -> list[Proposal]:
        rng = random.Random(f"{self.seed}:{space.signature}")
        order = list(range(len(space.configs)))
        rng.shuffle(order)
        sampled = (
            Proposal(
                space.signature,
                space.group,
                space.stock_kernel,
                space.configs[i],
                self.name,
                f"sample: config {i + 1} of the {len(space.configs)} that {space.stock_kernel.name} "
                f"declares for this target, not yet measured on {space.group}",
            )
            for i in order
        )
        out = _untried(sampled, tried, limit)
        if out:
            return out
        best = [r for r in _measured(space, tried) if r[1].resolve() == space.stock_kernel.resolve()]
        if len(best) < 2:
            return []
        (t0, _, a), (t1, _, b) = best[0], best[1]
        crosses = []
        keys = sorted(set(a) | set(b))
        for mask in range(1, 2 ** len(keys) - 1):
            child = {k: (a if mask >> i & 1 else b).get(k, a.get(k, b.get(k))) for i, k in enumerate(keys)}
            crosses.append(
                Proposal(
                    space.signature,
                    space.group,
                    space.stock_kernel,
                    child,
                    self.name,
                    f"refine: cross of the two fastest measured configs ({t0 * 1e6:.1f} us and "
                    f"{t1 * 1e6:.1f} us), keys {', '.join(k for i, k in enumerate(keys) if mask >> i & 1)} "
                    "from the fastest",
                )
            )
        rng.shuffle(crosses)
        return _untried(crosses, tried, limit)


@dataclass
class VariantExplorer:
    name: str = "variants"

    def propose(self, space: GroupSpace, tried: Mapping[tuple, Outcome | None], limit: int) -> list[Proposal]:
        props = []
        for path, configs in space.alternatives:
            for config in configs[:1]:
                props.append(
                    Proposal(
                        space.signature,
                        space.group,
                        path,
                        config,
                        self.name,
                        f"variant: {path.name} also implements {space.pattern} and supports this "
                        f"group's shapes; stock is {space.stock_kernel.name}",
                    )
                )
        return _untried(props, tried, limit)


def _neighbours(key: str, value: Any, declared: set[Any]) -> list[Any]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        out = []
        if value > 0 and value & (value - 1) == 0 and value >= 16:  # a tile size: double or halve
            out += [value * 2, value // 2]
        elif 0 <= value <= 8:  # a small count (warps, stages, splits): step by one
            out += [value + 1] + ([value - 1] if value > 1 else [])
        return out + sorted(v for v in declared if v != value and type(v) is int)[:2]
    return sorted((v for v in declared if v != value), key=repr)


@dataclass
class MutationAgent:
    seed: int = 0
    name: str = "mutate"

    def propose(self, space: GroupSpace, tried: Mapping[tuple, Outcome | None], limit: int) -> list[Proposal]:
        best = _measured(space, tried)
        if best:
            base_t, path, base = best[0]
            whence = f"the fastest measured ({base_t * 1e6:.1f} us)"
        elif space.champion is not None:
            path, base = space.champion[0], dict(space.champion[1])
            whence = "the registry's champion"
        else:
            path, base, whence = space.stock_kernel, dict(space.stock_config), "the stock config"
        values: dict[str, set[Any]] = {}
        for c in space.configs:
            for k, v in c.items():
                if isinstance(v, (int, str, bool, float)):
                    values.setdefault(k, set()).add(v)
        props = []
        for key in sorted(base):
            for v in _neighbours(key, base[key], values.get(key, set())):
                child = {**base, key: v}
                props.append(
                    Proposal(
                        space.signature,
                        space.group,
                        path,
                        child,
                        self.name,
                        f"mutate {whence}: {key} {base[key]!r} -> {v!r}",
                    )
                )
        random.Random(f"{self.seed}:{space.signature}:{len(tried)}").shuffle(props)
        return _untried(props, tried, limit)


def builtin_agents(seed: int = 0) -> list[Agent]:
    return [ConfigAutotuner(seed), VariantExplorer(), MutationAgent(seed)]


@dataclass
class Schedule:
    """Which space each agent works on next: breadth first, every space one turn (`per_round`
    proposals of one agent) in order of its share of the step, largest first, before any space gets a
    second; the agents take the rounds in turn. A short budget so reaches every space's best-known
    choices (on the 2-core box a one-minute tune measures about 30 candidates: depth first, three
    agents' turns on the largest space each came before the fourth space's first)."""

    spaces: Sequence[GroupSpace]
    agents: Sequence[Agent]
    per_round: int = 2
    _cursor: int = field(default=0, init=False)

    @property
    def waiting(self) -> bool:
        """Some agent has a call out (an external agent's answer still to come)."""
        return any(getattr(a, "waiting", False) for a in self.agents)

    def next_batch(self, tried: Mapping[tuple, Outcome | None], limit: int) -> list[Proposal]:
        """Up to `limit` proposals: first the answers external agents have ready (an answer that came
        is measured at once, not when the round robin next visits its space), then the round robin."""
        ordered = sorted(self.spaces, key=lambda s: -s.share)
        out: list[Proposal] = []
        pending = {p.key for p in out}
        for agent in self.agents:
            ready = getattr(agent, "ready", None)
            for space in ordered if ready is not None else ():
                if len(out) >= limit:
                    return out
                if space.signature in ready():
                    for p in agent.propose(space, {**tried, **dict.fromkeys(pending)}, limit - len(out)):
                        out.append(p)
                        pending.add(p.key)
        for _ in range(len(ordered) * len(self.agents)):
            if len(out) >= limit:
                break
            i = self._cursor
            self._cursor += 1
            space = ordered[i % len(ordered)]
            agent = self.agents[(i // len(ordered)) % len(self.agents)]
            seen = {**tried, **dict.fromkeys(pending)}
            for p in agent.propose(space, seen, min(self.per_round, limit - len(out))):
                out.append(p)
                pending.add(p.key)
        return out
