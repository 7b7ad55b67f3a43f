"""Teacher-forced numerics of a whole model: a backend's executable against the reference engine.

The scenario exercises what a serving step does: two sequences prefilled separately with different
prompt lengths, then decoded together in one batch over ragged contexts, with the blocks of each
sequence scattered through the cache pool. Token ids are fresh random numbers on every call (unless a
seed is given), prompts and continuations alike, and every engine is fed the same ones (teacher
forcing), so one early difference cannot snowball into every later step. Since no token depends on
an answer, the reference can run each sequence's prompt and continuation as one prefill with every
position's logits (`whole`): causal attention makes the logits at a position those of the decode step
there, and the weights are read once per sequence instead of once per step (three times fewer passes
at the default scenario: what a 1B-parameter reference spends its time on).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import numpy as np

from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph, Node
from polymorph.pipeline.backend import Executable
from polymorph.serving.session import Session
from polymorph.verify.tolerance import Comparison, Tolerance, compare, model_tolerance, no_worse


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


@dataclass(frozen=True)
class ScenarioStep:
    """One step of the scenario: what to feed, and what the reference answered."""

    name: str
    seqs: list[int]
    tokens: np.ndarray
    want: np.ndarray
    router_margin: float | None  # the reference's smallest top-k router margin at this step
    # Every value (inputs, activations, caches) of the reference's run that answered this step, on
    # one step of a drawn scenario (its last run): real activations for gates that test one group.
    values: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)


def reference_scenario(
    stock: Executable,
    graph: Graph,
    *,
    prompt_lens: tuple[int, ...] = (7, 3),
    decode_steps: int = 4,
    seed: int | None = None,
    attempts: int = 20,
    whole: Executable | None = None,
) -> list[ScenarioStep]:
    """Every step of the scenario with the reference's logits. No token depends on an answer, so the
    whole scenario is known before a candidate runs (the engine sends it to its worker in one
    message). `whole`: the same model built with every position's logits (`Model.rebuild(all_logits=
    True)`) on the same weights; with it each sequence runs as one prefill, else `stock` runs the
    scenario step by step.

    MoE models: a token whose k-th and (k+1)-th router logits are within rounding of each other may go
    to different experts in two correct engines. Token draws whose scenario has such a near-tie (a
    relative margin under 4 machine epsilons of the graph's dtype) are redrawn, up to `attempts`
    times; the scenario with the widest margin is kept."""
    rng = np.random.default_rng(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    threshold = 4 * _epsilon(DType.parse(graph.meta.get("dtype", "f32")))
    runner = stock if whole is None else whole
    if hasattr(runner, "keep_values"):
        runner.keep_values = True  # the router margins come from the step's own values
    best: list[ScenarioStep] = []
    best_margin = -1.0
    for _ in range(attempts):
        tokens = _draw_tokens(graph, rng, prompt_lens, decode_steps)
        if whole is None:
            scenario = _run_steps(stock, graph, tokens, decode_steps)
        else:
            scenario = _run_whole(whole, graph, tokens, decode_steps)
        margins = [s.router_margin for s in scenario if s.router_margin is not None]
        margin = min(margins) if margins else float("inf")
        if margin > best_margin:
            best, best_margin = scenario, margin
        if margin >= threshold:
            break
    return best


def _draw_tokens(
    graph: Graph, rng: np.random.Generator, prompt_lens: tuple[int, ...], decode_steps: int
) -> list[np.ndarray]:
    """Each sequence's prompt and continuation, [1, prompt + decode_steps] token ids."""
    vocab = int(graph.params["model.embed_tokens.weight"].shape[0])
    return [rng.integers(0, vocab, size=(1, n + decode_steps), dtype=np.int32) for n in prompt_lens]


def _prefill_name(seq: int, n: int) -> str:
    return f"prefill seq {seq} ({n} tokens)"


def _decode_name(i: int, batch: int) -> str:
    return f"decode step {i} (batch {batch}, ragged)"


def _run_steps(
    stock: Executable, graph: Graph, tokens: list[np.ndarray], decode_steps: int
) -> list[ScenarioStep]:
    """The scenario as a serving engine runs it: each prompt prefilled, then the batch decoded."""
    lens = [t.shape[1] - decode_steps for t in tokens]
    session = Session(stock, graph, batch=len(tokens), max_ctx=max(t.shape[1] for t in tokens))
    steps: list[ScenarioStep] = []

    def step(name: str, seqs: list[int], fed: np.ndarray) -> None:
        want = session.step(seqs, fed)
        steps.append(
            ScenarioStep(name, seqs, fed, want, router_margin(graph, getattr(stock, "last_values", {})))
        )

    for seq, (t, n) in enumerate(zip(tokens, lens, strict=True)):
        step(_prefill_name(seq, n), [seq], t[:, :n])
    seqs = list(range(len(tokens)))
    for i in range(decode_steps):
        step(
            _decode_name(i, len(tokens)),
            seqs,
            np.stack([t[0, n + i] for t, n in zip(tokens, lens, strict=True)])[:, None],
        )
    values = dict(getattr(stock, "last_values", {})) or None
    if values is not None:  # the last step's run
        steps[-1] = dataclasses.replace(steps[-1], values=values)
    return steps


def _run_whole(
    whole: Executable, graph: Graph, tokens: list[np.ndarray], decode_steps: int
) -> list[ScenarioStep]:
    """The same scenario from one all-logits prefill per sequence: the prefill step's answer is the
    logits at its prompt's last position, decode step i's those at prompt + i (`_run_steps`' shapes)."""
    lens = [t.shape[1] - decode_steps for t in tokens]
    session = Session(whole, graph, batch=len(tokens), max_ctx=max(t.shape[1] for t in tokens))
    rows, margins = [], []
    for seq, t in enumerate(tokens):
        logits = np.asarray(session.step([seq], t))  # [1, n + decode_steps, vocab]
        if logits.ndim != 3 or logits.shape[1] != t.shape[1]:
            raise UserError(f"`whole` must answer every position's logits, got shape {list(logits.shape)}")
        rows.append(logits[0])
        margins.append(token_margins(graph, getattr(whole, "last_values", {})))
    values = dict(getattr(whole, "last_values", {})) or None  # the last sequence's run

    def margin(seq: int, lo: int, hi: int) -> float | None:
        m = margins[seq]
        return None if m is None else float(m[lo:hi].min())

    last = len(tokens) - 1
    steps = []
    for seq, (t, n) in enumerate(zip(tokens, lens, strict=True)):
        want = rows[seq][None, n - 1 : n]
        steps.append(
            ScenarioStep(
                _prefill_name(seq, n),
                [seq],
                t[:, :n],
                want,
                margin(seq, 0, n),
                values if seq == last else None,
            )
        )
    seqs = list(range(len(tokens)))
    for i in range(decode_steps):
        fed = np.stack([t[0, n + i] for t, n in zip(tokens, lens, strict=True)])[:, None]
        want = np.stack([rows[s][n + i] for s, n in enumerate(lens)])[:, None]
        step_margins = [m for s, n in enumerate(lens) if (m := margin(s, n + i, n + i + 1)) is not None]
        steps.append(
            ScenarioStep(_decode_name(i, len(tokens)), seqs, fed, want, min(step_margins, default=None))
        )
    return steps


def judge(
    scenario: list[ScenarioStep], got: list[np.ndarray | str], dtype: DType, tol: Tolerance
) -> VerifyResult:
    """Compare a candidate's logits (or, where it raised, the error text) with the scenario's.

    A step where the candidate raised fails and ends the scenario. A mismatch at a step where the
    reference's router margin is under 4 machine epsilons of `dtype` ends the scenario as inconclusive:
    two correct engines may route that near-tied token to different experts, and from there on their
    caches differ.
    """
    result = VerifyResult(tol)
    for step, logits in zip(scenario, got, strict=False):
        if isinstance(logits, str):
            reason = f"the candidate raised {logits}"
            crashed = Comparison(
                False, float("inf"), float("inf"), step.want.size, step.want.size, (), reason
            )
            result.steps.append(StepCheck(step.name, crashed))
            break
        comparison = compare(np.asarray(logits), step.want, tol)
        near_tie = step.router_margin is not None and step.router_margin < 4 * _epsilon(dtype)
        if not comparison.ok and near_tie:
            note = f"inconclusive: an MoE router near-tie (relative margin {step.router_margin:.2g}); scenario ended"
            ok = Comparison(True, comparison.max_abs, comparison.max_rel, 0, comparison.total, ())
            result.steps.append(StepCheck(step.name, ok, note))
            break
        result.steps.append(StepCheck(step.name, comparison))
    return result


# A step the stock plan itself gets out of tolerance of the reference (a bf16 model of many layers on
# random weights: a few logits of 128k drift past the bound) passes for a candidate no further from
# the reference than this many times the stock plan, in max error and in elements out of tolerance.
STOCK_SLACK = 2.0


def judge_beside(
    scenario: list[ScenarioStep],
    got: list[np.ndarray | str],
    stock: list[np.ndarray | str],
    dtype: DType,
    tol: Tolerance,
) -> VerifyResult:
    """`judge`, where the stock plan's logits over the same scenario (`stock`) set the bar at the steps
    it misses itself: the candidate must be within STOCK_SLACK of the stock plan's own error there.
    A raise, a NaN, or a step the stock plan gets right stays judged by the tolerance alone."""
    mine, theirs = judge(scenario, got, dtype, tol), judge(scenario, stock, dtype, tol)
    steps = []
    for i, check in enumerate(mine.steps):
        c = check.comparison
        s = theirs.steps[i].comparison if i < len(theirs.steps) else None
        if not c.ok and s is not None and not s.ok and no_worse(c, s, STOCK_SLACK):
            note = f"out of tolerance as the stock plan is, and within {STOCK_SLACK:g}x of its error ({s})"
            check = StepCheck(
                check.step, Comparison(True, c.max_abs, c.max_rel, c.mismatched, c.total, ()), note
            )
        steps.append(check)
    return VerifyResult(tol, steps)


def verify_executable(
    candidate: Executable,
    stock: Executable,
    graph: Graph,
    *,
    prompt_lens: tuple[int, ...] = (7, 3),
    decode_steps: int = 4,
    seed: int | None = None,
    tolerance: Tolerance | None = None,
    whole: Executable | None = None,
) -> VerifyResult:
    """Run the scenario on `stock` (the reference; `whole`: see `reference_scenario`), then on
    `candidate`; compare logits at every step."""
    dtype = DType.parse(graph.meta.get("dtype", "f32"))
    scenario = reference_scenario(
        stock, graph, prompt_lens=prompt_lens, decode_steps=decode_steps, seed=seed, whole=whole
    )
    session = Session(candidate, graph, batch=len(prompt_lens), max_ctx=max(prompt_lens) + decode_steps)
    got: list[np.ndarray | str] = []
    for step in scenario:
        try:
            got.append(session.step(step.seqs, step.tokens))
        except UserError:
            raise
        except Exception as e:  # a candidate that crashes fails the step; it does not crash the check
            got.append(f"{type(e).__name__}: {e}")
            break
    return judge(scenario, got, dtype, tolerance or model_tolerance(dtype))


def router_margin(graph: Graph, values: dict[str, np.ndarray]) -> float | None:
    """The smallest relative gap, over every top-k router of the step and every token, between the
    k-th and the (k+1)-th best expert by the router's selection score (and, for grouped routers,
    between the last kept and the first dropped group); None without routers (or without recorded
    values)."""
    margins = token_margins(graph, values)
    return None if margins is None else float(margins.min())


def _gap(scores: np.ndarray, k: int) -> np.ndarray | None:
    """Per row, (k-th - (k+1)-th largest) / the row's largest |score|; None when a row has <= k."""
    if scores.shape[-1] <= k:
        return None
    ordered = np.sort(scores, axis=-1)[:, ::-1]
    # Relative to the row's largest score: rounding errors scale with the row, not with the gap.
    scale = np.maximum(np.where(np.isfinite(ordered), np.abs(ordered), 0).max(axis=-1), 1e-6)
    return (ordered[:, k - 1] - ordered[:, k]) / scale


def selection_scores(node: Node, values: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """What a topk_router node chooses its experts by, [tokens, E], and (grouped routers) its group
    scores [tokens, groups] (ops._ROUTER): the logits (softmax and sigmoid keep their order), or for
    sigmoid_topk sigmoid(logits) plus the selection bias."""
    from polymorph.ir import reference
    from polymorph.ir.ops import OPS, normalize_attrs

    logits = np.asarray(values[node.inputs[0]], dtype=np.float32)
    logits = logits.reshape(-1, logits.shape[-1])
    if node.attrs.get("mode") != "sigmoid_topk":
        return logits, None
    bias = values.get(node.inputs[1]) if len(node.inputs) > 1 else None
    bias = None if bias is None else np.asarray(bias, dtype=np.float32)
    # the reference's own choice (experts of the dropped groups at -inf: no candidates)
    return reference.sigmoid_choice(
        reference.sigmoid(logits), bias, normalize_attrs(OPS["topk_router"], node.attrs)
    )


def token_margins(graph: Graph, values: dict[str, np.ndarray]) -> np.ndarray | None:
    """`router_margin` per token of the step, in token order (the leading dims flattened); the
    smallest over the step's routers. None without routers (or without recorded values)."""
    margins: np.ndarray | None = None
    for node in graph.nodes:
        if node.op != "topk_router" or node.inputs[0] not in values:
            continue
        choice, group_scores = selection_scores(node, values)
        gaps = [_gap(choice, int(node.attrs["k"]))]
        if group_scores is not None:
            kept = int(node.attrs.get("topk_groups") or group_scores.shape[-1])
            gaps.append(_gap(group_scores, kept))
        for gap in gaps:
            if gap is not None:
                margins = gap if margins is None else np.minimum(margins, gap)
    return margins


def _epsilon(dtype: DType) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype.numpy).eps) if dtype.is_float else 0.0
