"""Teacher-forced numerics of a whole model: a backend's executable against the reference engine.

The scenario exercises what a serving step does: two sequences prefilled separately with different
prompt lengths, then decoded together in one batch over ragged contexts, with the blocks of each
sequence scattered through the cache pool. Token ids are fresh random numbers on every call (unless a
seed is given); after each step both engines are fed the reference's greedy token (teacher forcing),
so one early difference cannot snowball into every later step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from polymorph.backend import Executable
from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.session import Session
from polymorph.tolerance import Comparison, Tolerance, compare, model_tolerance


@dataclass(frozen=True)
class StepCheck:
    step: str
    comparison: Comparison
    note: str = ""  # why a step's mismatch does not count (an MoE router near-tie), else empty


@dataclass
class VerifyResult:
    tolerance: Tolerance
    steps: list[StepCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.comparison.ok for s in self.steps)

    def first_failure(self) -> StepCheck | None:
        return next((s for s in self.steps if not s.comparison.ok), None)


def verify_executable(
    candidate: Executable,
    stock: Executable,
    graph: Graph,
    *,
    prompt_lens: tuple[int, ...] = (7, 3),
    decode_steps: int = 4,
    seed: int | None = None,
    tolerance: Tolerance | None = None,
) -> VerifyResult:
    """Run the same steps on `candidate` and `stock` (the reference); compare logits at every step."""
    rng = np.random.default_rng(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    dtype = DType.parse(graph.meta.get("dtype", "f32"))
    tol = tolerance or model_tolerance(dtype)
    vocab = int(graph.params["model.embed_tokens.weight"].shape[0])
    max_ctx = max(prompt_lens) + decode_steps
    batch = len(prompt_lens)
    sessions = [Session(e, graph, batch=batch, max_ctx=max_ctx) for e in (candidate, stock)]
    result = VerifyResult(tol)
    seqs = list(range(batch))

    def check(name: str, seq_ids: list[int], tokens: np.ndarray) -> np.ndarray | None:
        want = sessions[1].step(seq_ids, tokens)
        try:
            got = sessions[0].step(seq_ids, tokens)
        except UserError:
            raise
        except Exception as e:  # a candidate that crashes fails the step; it does not crash the check
            result.steps.append(StepCheck(name, _crashed(want, e)))
            return None
        comparison = compare(got, want, tol)
        margin = router_margin(graph, getattr(stock, "last_values", {}))
        if not comparison.ok and margin is not None and margin < 4 * _epsilon(dtype):
            # Two correct engines may route a near-tied token to different experts; from here on
            # their caches differ, so the scenario ends without counting this step against anyone.
            note = f"inconclusive: an MoE router near-tie (relative margin {margin:.2g}); scenario ended"
            ok = Comparison(True, comparison.max_abs, comparison.max_rel, 0, comparison.total, ())
            result.steps.append(StepCheck(name, ok, note))
            return None
        result.steps.append(StepCheck(name, comparison))
        return want

    next_tokens = []
    for seq, n in zip(seqs, prompt_lens, strict=True):
        prompt = rng.integers(0, vocab, size=(1, n), dtype=np.int32)
        want = check(f"prefill seq {seq} ({n} tokens)", [seq], prompt)
        if want is None:
            return result
        next_tokens.append(int(np.argmax(want[0, -1])))
    for i in range(decode_steps):
        tokens = np.array(next_tokens, dtype=np.int32)[:, None]
        want = check(f"decode step {i} (batch {batch}, ragged)", seqs, tokens)
        if want is None:
            return result
        next_tokens = [int(t) for t in np.argmax(want[:, -1], axis=-1)]
    return result


def router_margin(graph: Graph, values: dict[str, np.ndarray]) -> float | None:
    """The smallest relative gap, over every top-k router of the step and every token, between the
    k-th and the (k+1)-th largest router logit; None without routers (or without recorded values)."""
    margins = []
    for node in graph.nodes:
        if node.op != "topk_router" or node.inputs[0] not in values:
            continue
        k = int(node.attrs["k"])
        logits = np.sort(np.asarray(values[node.inputs[0]], dtype=np.float32), axis=-1)[..., ::-1]
        if logits.shape[-1] <= k:
            continue
        gap = logits[..., k - 1] - logits[..., k]
        # Relative to the row's largest logit: rounding errors scale with the row, not with the gap.
        scale = np.maximum(np.abs(logits).max(axis=-1), 1e-6)
        margins.append(float((gap / scale).min()))
    return min(margins) if margins else None


def _epsilon(dtype: DType) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype.numpy).eps) if dtype.is_float else 0.0


def _crashed(expected: np.ndarray, error: Exception) -> Comparison:
    reason = f"the candidate raised {type(error).__name__}: {error}"
    return Comparison(False, float("inf"), float("inf"), expected.size, expected.size, (), reason)
