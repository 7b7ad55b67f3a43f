"""The host side of running a model: paged-KV bookkeeping, step inputs, generation, sampling.

It drives any `Executable`, the reference engine's included, so the same steps run on every backend.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from polymorph.errors import UserError
from polymorph.ir import reference
from polymorph.ir.graph import Graph
from polymorph.ir.shapes import concrete
from polymorph.pipeline.backend import Executable
from polymorph.serving.kvcache import PagedKVCache

# float32 copies of low-precision weights the reference keeps, so a projection does not convert its
# weight on every call (the conversion was 73% of a Llama-3.2-1B bf16 step); beyond this many bytes
# the rest convert per call as before.
WIDE_BUDGET_BYTES = 8 << 30


class ReferenceExecutable(Executable):
    """The stock engine: the numpy reference interpreter behind the Executable interface."""

    def __init__(
        self,
        graph: Graph,
        weights: Mapping[str, np.ndarray],
        *,
        keep_values: bool = False,
        wide_budget: int = WIDE_BUDGET_BYTES,
        wide: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """`wide`: f32 copies of the weights made already (another reference's, shared), else made
        here within `wide_budget` bytes."""
        self.graph = graph
        self.weights = dict(weights)
        self.state: dict[str, np.ndarray] = {}
        self.keep_values = keep_values  # keep every value of the last step (for checks that look inside)
        self.last_values: dict[str, np.ndarray] = {}
        self.wide = dict(wide) if wide is not None else _widen(graph, self.weights, wide_budget)

    def allocate_state(self, cache_blocks: int) -> None:
        self.state = {
            name: np.zeros(concrete(t.shape, {"cache_blocks": cache_blocks}), dtype=t.dtype.numpy)
            for name, t in self.graph.state.items()
        }

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        trace: dict[str, np.ndarray] | None = {} if self.keep_values else None
        out = reference.run(self.graph, self.weights, inputs, self.state, trace, self.wide)
        self.last_values = trace or {}
        return out

    def read_state(self, name: str) -> np.ndarray:
        return self.state[name].copy()

    def weight(self, name: str) -> np.ndarray:
        return self.weights[name]


def _widen(graph: Graph, weights: Mapping[str, np.ndarray], budget: int) -> dict[str, np.ndarray]:
    """float32 copies of the low-precision weights that reference.WIDE_OPS read, largest first,
    within `budget` bytes."""
    read = {v for n in graph.nodes if n.op in reference.WIDE_OPS for v in n.inputs}
    names = [
        n for n in read if n in weights and weights[n].dtype.itemsize < 4 and weights[n].dtype.kind in "fV"
    ]
    wide: dict[str, np.ndarray] = {}
    for name in sorted(names, key=lambda n: -weights[n].size):
        if weights[name].size * 4 <= budget:
            wide[name] = np.asarray(weights[name], dtype=np.float32)
            budget -= weights[name].size * 4
    return wide


def block_size_of(graph: Graph) -> int:
    if "block_size" in graph.meta:
        return int(graph.meta["block_size"])
    for t in graph.state.values():
        return int(t.shape[1])
    raise UserError(f"graph `{graph.name}` has no KV cache state; it is not a decoder step")


class Session:
    """A batch of sequences on one executable, each with its own paged cache blocks."""

    def __init__(self, executable: Executable, graph: Graph, *, batch: int, max_ctx: int) -> None:
        self.executable = executable
        self.graph = graph
        self.cache = PagedKVCache.for_batch(batch, max_ctx, block_size_of(graph))
        executable.allocate_state(self.cache.cache_blocks)

    def step(self, seqs: list[int], tokens: np.ndarray) -> np.ndarray:
        """Feed `tokens` [len(seqs), S] (same S for every sequence); return the logits output."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.ndim != 2 or tokens.shape[0] != len(seqs):
            raise UserError(f"tokens must be [{len(seqs)}, S], got {list(tokens.shape)}")
        vocab = self.graph.params.get("model.embed_tokens.weight")
        if vocab is not None and (tokens.min() < 0 or tokens.max() >= int(vocab.shape[0])):
            raise UserError(f"token ids must be in [0, {vocab.shape[0]}), got {tokens.min()}..{tokens.max()}")
        positions = np.stack([self.cache.reserve(s, tokens.shape[1]) for s in seqs])
        inputs = {"tokens": tokens, "positions": positions, "block_table": self.cache.block_table(seqs)}
        return self.executable.run(inputs)["logits"]


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UserError("--temperature must be >= 0 and --top-p in (0, 1]")

    def pick(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """One token id from a [vocab] row of logits."""
        if self.temperature == 0:
            return int(np.argmax(logits))
        probs = reference.softmax(logits.astype(np.float64) / self.temperature)
        order = np.argsort(-probs, kind="stable")
        keep = np.cumsum(probs[order]) - probs[order] < self.top_p  # the smallest set reaching top_p
        chosen = order[keep]
        p = probs[chosen] / probs[chosen].sum()
        return int(rng.choice(chosen, p=p))


@dataclass(frozen=True)
class Generation:
    tokens: list[int]
    prefill_s: float
    decode_s: float

    @property
    def tokens_per_s(self) -> float:
        decoded = max(len(self.tokens) - 1, 0)
        return decoded / self.decode_s if self.decode_s > 0 else float("nan")


def generate(
    executable: Executable, graph: Graph, prompt: list[int], new_tokens: int, sampler: Sampler
) -> Generation:
    """Prefill `prompt`, then decode `new_tokens` tokens one at a time against the cache."""
    if not prompt:
        raise UserError("the prompt is empty; give at least one token")
    if new_tokens < 1:
        raise UserError("--new-tokens must be at least 1")
    session = Session(executable, graph, batch=1, max_ctx=len(prompt) + new_tokens)
    rng = np.random.default_rng(sampler.seed)
    t0 = time.perf_counter()
    logits = session.step([0], np.array([prompt]))
    out = [sampler.pick(logits[0, -1], rng)]
    t1 = time.perf_counter()
    for _ in range(new_tokens - 1):
        logits = session.step([0], np.array([[out[-1]]]))
        out.append(sampler.pick(logits[0, -1], rng))
    t2 = time.perf_counter()
    return Generation(out, t1 - t0, t2 - t1)
