"""The gates a candidate kernel passes before its timing counts, run by the controller.

The worker is untrusted: it runs the candidate and reports what came out; every comparison happens
here, against the stock kernel and the numpy reference the controller holds. `run_gates` takes a
candidate already swapped into `group` and ends each gate in a named `Gate` with its cause:

  numerics                  the group alone (op `run_group`) on fresh random inputs from several
                            distributions, over several shapes of the loaded bucket (odd sizes
                            included), into output buffers poisoned with NaN: within the op tolerance
                            of the reference, or no worse than a few times the stock kernel's own
                            error. NaN never passes.
  honesty.inputs_unchanged  each input's checksum, taken by the worker around every launch, is the
                            same after it (a cache written in place by design excepted)
  honesty.input_dependence  where the stock kernel's output changes with the inputs (same shape,
                            other values), the candidate's changes too: no constant or cached answers
  honesty.output_prefill    the same inputs into buffers prefilled with 0 and with -7.5 give the same
                            output: every element is written
  honesty.completion        the output does not change after the launch returned: no work left running
  honesty.determinism       where the stock kernel is bitwise deterministic, two runs of the candidate
                            on the same inputs agree bitwise
  quality                   teacher-forced logits of the whole model, prefill and decode steps, against
                            the reference (the scenario of `polymorph.verify.numerics`); at a step the
                            stock plan misses too, within STOCK_SLACK of the stock plan's own error
  kv_isolation              interleaved sequences decode as they do alone; the guard block stays zero;
                            blocks the stock kernel wrote before a swap decode right after it
  timing.wall_clock         the worker's timer agrees with the host's wall clock around the measured
                            calls (two trial counts, so that fixed costs cancel). The worker puts the
                            host clock back at every swap and says when a candidate replaced it since;
                            a disagreement without that is checked again on a fresh worker before the
                            candidate is blamed. The worker is replaced after a failure.
  timing.roofline           the measured time implies no bandwidth or FLOP rate above the profile's
                            roofline (`hw.roofline_seconds` of `predict.group_cost`)

The timing gates run only when every other gate passed; their measurement is the one that counts. A
worker lost during a gate (hang, crash) fails that gate and is replaced without the candidate; the
gates after it are "not run".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.ir.shapes import concrete
from polymorph.kvcache import PagedKVCache
from polymorph.tolerance import compare, model_tolerance, op_tolerance
from polymorph.verify.numerics import ScenarioStep, StepCheck, judge, judge_beside

if TYPE_CHECKING:
    from polymorph.engine.controller import Controller, Fault

NUMERICS = "numerics"
INPUTS_UNCHANGED = "honesty.inputs_unchanged"
INPUT_DEPENDENCE = "honesty.input_dependence"
OUTPUT_PREFILL = "honesty.output_prefill"
COMPLETION = "honesty.completion"
DETERMINISM = "honesty.determinism"
QUALITY = "quality"
KV_ISOLATION = "kv_isolation"
WALL_CLOCK = "timing.wall_clock"
ROOFLINE = "timing.roofline"
GROUP_GATES = (NUMERICS, INPUTS_UNCHANGED, INPUT_DEPENDENCE, OUTPUT_PREFILL, COMPLETION, DETERMINISM)
MODEL_GATES = (QUALITY, KV_ISOLATION)
TIMING_GATES = (WALL_CLOCK, ROOFLINE)
STAGES = {GROUP_GATES: "group", MODEL_GATES: "model", TIMING_GATES: "timing"}

DISTRIBUTIONS = ("normal", "uniform ±1e3", "normal with outliers ±1e4")
GUARD_WHERE = " (the guard block, blocks no sequence owns, or slots past a sequence's last token)"
CAPTURED = "captured"  # the reference's own activations, from a run of the whole model (the scenario's)
NEAR_TIE_EPS = 4  # a router margin under this many epsilons may route differently (verify.numerics)
STOCK_ERROR_FACTOR = 4.0  # a candidate may be this many times less accurate than the stock kernel
SETTLE_S = 0.05  # how long after a launch returned its outputs must stay as they were
WALL_CLOCK_FRACTION = 0.5  # the worker's timed trials must cover this much of the host's wall clock
WALL_CLOCK_MIN_S = 0.05  # extra trials until they take this long on the host's clock
# Calibrated figures are achievable rates, not peaks: a kernel may beat them a little, never by more.
ROOFLINE_SLACK = 1.25

# Rounding unit of the float formats a kernel might secretly compute in, for a cause that names it.
_EPS = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7}


@dataclass(frozen=True)
class Gate:
    """One gate's outcome. verdict: pass, fail, skipped (cannot apply here, and says why) or
    "not run" (the worker was lost, or an earlier gate failed)."""

    name: str
    verdict: str
    cause: str

    @property
    def ok(self) -> bool:
        return self.verdict in ("pass", "skipped")


@dataclass
class GateReport:
    group: str
    kernel: str
    gates: list[Gate] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    measurement: dict[str, Any] | None = None  # the fast-tier timing that counts, when all passed
    steps: list[StepCheck] = field(default_factory=list)  # the quality gate's teacher-forced steps
    seconds: dict[str, float] = field(default_factory=dict)  # host time per stage: group, model, timing

    @property
    def ok(self) -> bool:
        return bool(self.gates) and all(g.ok for g in self.gates)

    def gate(self, name: str) -> Gate:
        return next(g for g in self.gates if g.name == name)

    def failed(self) -> list[Gate]:
        return [g for g in self.gates if g.verdict == "fail"]


class _CandidateRaised(Exception):
    """The candidate raised inside the worker (a `candidate_run` or `candidate_build` error)."""


def run_gates(
    engine: Controller, group: str, kernel: str, config: dict[str, Any] | None, *, seed: int | None = None
) -> GateReport:
    """Every gate on the candidate swapped into `group`; the report's faults are the failed gates'.
    Swapping back (or accepting) is the caller's."""
    from polymorph.engine.controller import Fault, WorkerLost

    run = _Run(engine, group, kernel, config, np.random.default_rng(seed), seed)
    report = GateReport(group, kernel)
    stages: list[tuple[tuple[str, ...], Callable[[], list[Gate]]]] = [
        (GROUP_GATES, run.group_gates),
        (MODEL_GATES, run.model_gates),
        (TIMING_GATES, lambda: run.timing_gates(report)),
    ]
    for names, stage in stages:
        if names is TIMING_GATES and not report.ok:
            failed = ", ".join(g.name for g in report.gates if not g.ok)
            report.gates += [Gate(n, "not run", f"not measured: {failed} failed") for n in names]
            continue
        run.current = names[0]
        t0 = time.perf_counter()
        raised = None
        try:
            gates = stage()
        except _CandidateRaised as e:
            gates = _fail_rest(names, run.current, f"the candidate raised: {e}")
            raised = e
        except WorkerLost as lost:
            report.gates += _fail_rest(names, run.current, f"{lost.how}: {lost}")
            report.faults.append(Fault(group, kernel, lost.how, f"{run.current}: {lost}"))
            engine.replace_worker({group})
            _not_run_rest(report, stages, f"the worker was lost in {run.current}")
            return report
        finally:
            report.seconds[STAGES[names]] = time.perf_counter() - t0
        report.gates += gates
        report.steps = run.steps
        report.faults += [Fault(group, kernel, g.name, g.cause) for g in gates if g.verdict == "fail"]
        if raised is not None and not engine.healthy():
            # It raised and took the device context (or a weight) with it: the worker answers, but
            # computes wrong. A fresh one, without the candidate.
            report.faults.append(Fault(group, kernel, "canary", f"{run.current}: the worker failed its canary "
                                       f"after the candidate raised ({raised}); replaced"))  # fmt: skip
            engine.replace_worker({group})
            _not_run_rest(report, stages, "the worker was replaced after its canary failed")
            return report
        if run.tainted:
            # The worker answers, but its weights or its timer were tampered with: nothing it runs
            # counts any more. A fresh one, without the candidate; the gates left have nothing to run.
            engine.replace_worker({group})
            _not_run_rest(report, stages, "the worker was replaced after tampering")
            return report
    return report


def _not_run_rest(report: GateReport, stages: list[tuple[tuple[str, ...], Any]], why: str) -> None:
    """Every gate of `stages` the report has no verdict for yet: not run, for `why`."""
    done = {g.name for g in report.gates}
    report.gates += [Gate(n, "not run", why) for ns, _ in stages for n in ns if n not in done]


def _fail_rest(names: tuple[str, ...], current: str, cause: str) -> list[Gate]:
    """`current` failed with `cause`; the stage's other gates have no outcome of their own."""
    return [Gate(current, "fail", cause)] + [
        Gate(n, "not run", f"{current} failed in the same stage") for n in names if n != current
    ]


@dataclass
class _Case:
    shape: tuple[int, int]  # (batch, seq)
    dist: str
    inputs: list[np.ndarray | None]
    bindings: dict[str, int]
    want: list[np.ndarray]  # the reference's outputs
    stock: list[np.ndarray]
    got: list[np.ndarray]


class _Run:
    """One candidate's pass through the gates: the shared draws, runs and scenario."""

    def __init__(
        self,
        engine: Controller,
        group: str,
        kernel: str,
        config: dict[str, Any] | None,
        rng: np.random.Generator,
        seed: int | None,
    ) -> None:
        self.engine, self.group, self.kernel, self.config = engine, group, kernel, config
        self.rng, self.seed = rng, seed
        self.info = engine.plan_group(group)
        self.graph = engine.graph
        self.types = self.graph.types()
        self.current = NUMERICS
        self.tainted = False
        self.steps: list[StepCheck] = []
        self._scenario: list[ScenarioStep] | None = None

    @property
    def scenario(self) -> list[ScenarioStep]:
        """This candidate's fresh teacher-forced scenario (drawn once: the captured activations of the
        group gates and the model gates share it)."""
        if self._scenario is None:
            self._scenario = self.engine.scenario(seed=self.seed)
        return self._scenario

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        r = self.engine.request(op, **fields)
        if "__error__" in r:
            raise _CandidateRaised(r["__error__"]["message"])
        return r

    # --- the group alone -----------------------------------------------------------------------------

    def run_group(
        self, inputs: list[np.ndarray | None], bindings: dict[str, int], **fields: Any
    ) -> dict[str, Any]:
        return self.request("run_group", group=self.group, inputs=inputs, bindings=bindings, **fields)

    def group_gates(self) -> list[Gate]:
        shapes = _shapes(int(self.engine.loaded["bucket"]["batch"]))
        try:
            draws = [(shape, dist, *self._draw(shape, dist)) for shape in shapes for dist in DISTRIBUTIONS]
        except _Undrawable as e:
            return [
                Gate(n, "skipped", f"not applicable: {e}; the quality gate covers it") for n in GROUP_GATES
            ]
        captured = self._captured()
        if captured is not None:
            draws.append(captured)
        cases: list[_Case] = []
        responses: list[dict[str, Any]] = []
        for shape, dist, inputs, bindings in draws:
            want = self._reference(inputs, bindings)
            stock = self.run_group(inputs, bindings, stock=True)["outputs"]
            r = self.run_group(inputs, bindings)
            responses.append(r)
            cases.append(_Case(shape, dist, inputs, bindings, want, stock, r["outputs"]))
        unchanged = _inputs_unchanged(responses, list(self.info["inputs"]), set(self.graph.params))
        # A weight written in place damaged the engine itself: nothing it runs counts any more.
        self.tainted = unchanged.verdict == "fail" and "weight" in unchanged.cause
        gates = [self._numerics(cases), unchanged, _input_dependence(cases)]
        # Extra runs on the first case: prefill, completion and determinism.
        first = cases[0]
        self.current = OUTPUT_PREFILL
        zero = self.run_group(first.inputs, first.bindings, fill=0.0)["outputs"]
        settled = self.run_group(first.inputs, first.bindings, fill=-7.5, settle_s=SETTLE_S)
        # Once more on other inputs: a late write the host's scheduler happened to hide (the worker
        # preempted between the launch's return and its copy) shows on the next try.
        second = cases[1]
        settled_again = self.run_group(second.inputs, second.bindings, fill=-7.5, settle_s=SETTLE_S)
        self.current = DETERMINISM
        again = self.run_group(first.inputs, first.bindings)["outputs"]
        stock_again = self.run_group(first.inputs, first.bindings, stock=True)["outputs"]
        deterministic = _same(first.stock, stock_again)
        gates.append(_output_prefill(zero, settled["outputs"], deterministic, self._allowed(first)[0]))
        gates.append(_completion([settled, settled_again]))
        gates.append(_determinism(first.got, again, deterministic))
        return gates

    def _draw(self, shape: tuple[int, int], dist: str) -> tuple[list[np.ndarray | None], dict[str, int]]:
        """Inputs for one case: activations (and caches) from `dist`; token ids, positions and block
        tables as a serving step has them (ragged contexts, blocks scattered through a small pool);
        None for a weight, which the worker takes from the engine (the model's, as served)."""
        batch, seq = shape
        loaded = self.engine.loaded
        block_size = int(loaded["block_size"])
        ctx_blocks = max(1, int(loaded["bucket"]["ctx"]) // block_size)
        per_seq = min(ctx_blocks, -(-(seq + 2 * block_size) // block_size))
        cache = PagedKVCache(block_size, batch * per_seq + 1, ctx_blocks)
        positions = []
        for b in range(batch):
            cache.reserve(b, int(self.rng.integers(0, per_seq * block_size - seq + 1)))
            positions.append(cache.reserve(b, seq))
        bindings = {"batch": batch, "seq": seq, "ctx_blocks": ctx_blocks, "cache_blocks": batch * per_seq + 1}
        ints = {
            "positions": np.stack(positions),
            "block_table": cache.block_table(list(range(batch))),
            "tokens": self.rng.integers(0, self.engine.vocab, size=(batch, seq), dtype=np.int32),
        }
        inputs = []
        for v in self.info["inputs"]:
            t = self.types[v]
            unbound = [d for d in t.shape if isinstance(d, str) and d not in bindings]
            if unbound:
                raise _Undrawable(f"input `{v}` has dims {unbound} the gate cannot choose")
            if v in self.graph.params:
                inputs.append(None)  # the engine's weights: kernels may rely on them staying put
            elif t.dtype.is_float:
                inputs.append(_draw_float(self.rng, dist, concrete(t.shape, bindings)).astype(t.dtype.numpy))
            elif v in ints:
                inputs.append(ints[v].astype(t.dtype.numpy))
            else:
                raise _Undrawable(f"integer input `{v}` has no known meaning to draw from")
        return inputs, {k: n for k, n in bindings.items() if k in self.graph.symbols()}

    def _captured(self) -> tuple[tuple[int, int], str, list[np.ndarray | None], dict[str, int]] | None:
        """A case on the activations the reference computed for this group's inputs in a run of the
        whole model (the scenario's last run, as real tokens give them: not a synthetic distribution),
        or None where that run has no value of some input (the last-token slice's, say)."""
        values = next((s.values for s in self.scenario if s.values), None)
        if not values:
            return None
        inputs: list[np.ndarray | None] = []
        bindings: dict[str, int] = {}
        for v in self.info["inputs"]:
            if v in self.graph.params:
                inputs.append(None)
                continue
            t = self.types[v]
            a = values.get(v)
            if a is None or np.ndim(a) != len(t.shape):
                return None
            for dim, n in zip(t.shape, np.shape(a), strict=True):
                if isinstance(dim, str) and bindings.setdefault(dim, int(n)) != int(n):
                    return None  # dims the run bound apart: not one step's values
                if isinstance(dim, int) and dim != n:
                    return None  # the same name for another value (the whole-sequence graph's, unsliced)
            inputs.append(np.array(a, dtype=t.dtype.numpy))  # a copy: a cache write updates in place
        bindings = {k: n for k, n in bindings.items() if k in self.graph.symbols()}
        shape = (bindings.get("batch", 1), bindings.get("seq", 1))
        return shape, CAPTURED, inputs, bindings

    def _reference(self, inputs: list[np.ndarray | None], bindings: dict[str, int]) -> list[np.ndarray]:
        from polymorph import reference

        weights, wide = self.engine.weights, self.engine.wide_weights
        # Weights as the reference holds them (only read: no op writes a weight); the rest copied, since
        # a cache write updates its input in place.
        env = {
            v: weights[v] if a is None else a.copy() for v, a in zip(self.info["inputs"], inputs, strict=True)
        }
        by_name = {n.name: n for n in self.graph.nodes}
        for name in self.info["nodes"]:
            with np.errstate(over="ignore"):  # exp(-x) of large inputs: inf, and silu(x) = 0 right
                reference.run_node(by_name[name], env, self.types, bindings, wide)
        return [np.asarray(env[v]) for v in self.info["outputs"]]

    def _allowed(self, case: _Case) -> tuple[float, float]:
        """(the error a candidate may have on this case, the stock kernel's own error on it)."""
        dtype = self.types[self.info["outputs"][0]].dtype
        stock_err = max(_error(s, w) for s, w in zip(case.stock, case.want, strict=True))
        return max(op_tolerance(dtype).rtol, STOCK_ERROR_FACTOR * stock_err), stock_err

    def _numerics(self, cases: list[_Case]) -> Gate:
        worst = 0.0
        for case in cases:
            allowed, stock_err = self._allowed(case)
            for i, (got, want) in enumerate(zip(case.got, case.want, strict=True)):
                err = _error(got, want)
                worst = max(worst, err)
                if err <= allowed:
                    continue
                where = f"output {i} on {case.dist} inputs at batch {case.shape[0]}, seq {case.shape[1]}"
                if np.isnan(got).any():
                    n = int(np.isnan(got).sum())
                    return Gate(
                        NUMERICS, "fail", f"NaN in {where}: {n}/{got.size} elements (poisoned, unwritten?)"
                    )
                dtype = self.types[self.info["outputs"][i]].dtype
                return Gate(
                    NUMERICS,
                    "fail",
                    f"{where}: max error {err:.3g} of the output's row scale, allowed {allowed:.3g} "
                    f"(the stock kernel's: {stock_err:.3g}){_precision_hint(err, dtype)}",
                )
        shapes = sorted({c.shape for c in cases if c.dist != CAPTURED})
        captured = [c.shape for c in cases if c.dist == CAPTURED]
        also = f"; activations captured from a run of the model at {captured[0]}" if captured else ""
        return Gate(
            NUMERICS,
            "pass",
            f"{len(cases)} cases ({', '.join(DISTRIBUTIONS)} at (batch, seq) {shapes}{also}): "
            f"worst error {worst:.3g}",
        )

    # --- the whole model -----------------------------------------------------------------------------

    def model_gates(self) -> list[Gate]:
        scenario = self.scenario
        blame = {self.group: self.kernel}
        self.current = QUALITY
        result, raw = self.engine.judge_scenario(scenario, blame, group=self.group, swapped=[self.group])
        self.steps = result.steps
        if "failed_step" in raw:
            quality = Gate(
                QUALITY, "fail", f"the candidate raised at step {raw['failed_step']}: {raw['cause']}"
            )
            return [quality, Gate(KV_ISOLATION, "not run", "the candidate raised in the quality run")]
        failure = result.first_failure()
        if failure is not None:
            quality = Gate(QUALITY, "fail", f"{failure.step}: {failure.comparison}")
        else:
            worst = max(s.comparison.max_abs for s in result.steps)
            quality = Gate(
                QUALITY, "pass", f"{len(result.steps)} teacher-forced steps, max abs err {worst:.3g}"
            )
        self.current = KV_ISOLATION
        return [quality, self._kv_isolation(scenario, raw)]

    def _kv_isolation(self, scenario: list[ScenarioStep], interleaved: dict[str, Any]) -> Gate:
        from polymorph.engine.controller import EngineError, answer_logits, scenario_ctx, scenario_steps

        tol = model_tolerance(DType.parse(self.graph.meta.get("dtype", "f32")))
        if interleaved["guard_nonzero"]:
            return Gate(
                KV_ISOLATION,
                "fail",
                f"cache guard regions written: {interleaved['guard_nonzero']} elements{GUARD_WHERE}",
            )
        prefills = [s for s in scenario if len(s.seqs) == 1]
        decodes = [s for s in scenario if len(s.seqs) > 1]
        got = [np.asarray(x) for x in interleaved["logits"]]
        # Each sequence alone, on a fresh cache, with the tokens it had in the batch.
        for row, prefill in enumerate(prefills):
            (seq,) = prefill.seqs
            alone = [prefill] + [
                ScenarioStep(d.name, [seq], d.tokens[row : row + 1], d.want[row : row + 1], None)
                for d in decodes
            ]
            steps = scenario_steps(alone)
            r = self.request("verify", steps=steps, max_ctx=scenario_ctx(alone), group=self.group)
            if "failed_step" in r:
                return Gate(KV_ISOLATION, "fail", f"sequence {seq} alone: the candidate raised {r['cause']}")
            if r["guard_nonzero"]:
                return Gate(
                    KV_ISOLATION,
                    "fail",
                    f"cache guard regions written: {r['guard_nonzero']} elements{GUARD_WHERE}",
                )
            for i, d in enumerate(decodes):
                if d.router_margin is not None and d.router_margin < NEAR_TIE_EPS * _eps(self.graph):
                    break  # an MoE router near-tie: batch and alone may route apart; inconclusive from here
                c = compare(np.asarray(r["logits"][i + 1]), got[len(prefills) + i][row : row + 1], tol)
                if not c.ok:
                    return Gate(
                        KV_ISOLATION,
                        "fail",
                        f"sequence {seq} decodes differently alone than in the batch at {d.name}: {c}",
                    )
        # Blocks written by the stock kernel before the swap, decoded by the candidate after it. A real
        # swap back (the file loaded afresh), not a held candidate: nothing it kept from the runs above
        # survives into these decodes, which must read what the cache holds.
        self.request("swap", group=self.group, path=None)
        steps = scenario_steps(prefills)
        self.request("verify", steps=steps, max_ctx=scenario_ctx(scenario), group=None)
        self.request("swap", group=self.group, path=self.kernel, config=self.config)
        steps = scenario_steps(decodes)
        r = self.request("verify", steps=steps, max_ctx=scenario_ctx(scenario), group=self.group, fresh=False)
        try:
            after = answer_logits(r, len(decodes))
        except EngineError as e:  # a short answer without a raise: nothing to judge
            return Gate(KV_ISOLATION, "fail", f"blocks written before the swap: {e}")
        dtype = DType.parse(self.graph.meta.get("dtype", "f32"))
        judged = judge(decodes, after, dtype, tol)
        if not judged.ok and "failed_step" not in r:  # the stock plan over the same steps sets the bar
            stock = interleaved.get("stock_logits") or self.engine.stock_logits(scenario, [self.group])
            judged = judge_beside(decodes, after, stock[len(prefills) :], dtype, tol)
        failure = judged.first_failure()
        if failure is not None or len(judged.steps) < len(decodes):
            what = f"{failure.step}: {failure.comparison}" if failure else "too few steps"
            return Gate(KV_ISOLATION, "fail", f"blocks written before the swap decode wrong after it: {what}")
        if r["guard_nonzero"]:
            return Gate(
                KV_ISOLATION,
                "fail",
                f"cache guard regions written: {r['guard_nonzero']} elements{GUARD_WHERE}",
            )
        return Gate(
            KV_ISOLATION,
            "pass",
            f"{len(prefills)} sequences alone = interleaved; cache guard regions zero; "
            f"{len(decodes)} decode steps right over blocks written before the swap",
        )

    # --- timing --------------------------------------------------------------------------------------

    def timing_gates(self, report: GateReport) -> list[Gate]:
        self.engine.quiet()  # no scenario drawn on the host while the candidate is timed
        covered, detail, measured = self._wall_clock()
        if covered < WALL_CLOCK_FRACTION and "replaced by a candidate" not in measured["timer"]:
            # Not the timer this candidate could have replaced since its swap: something an earlier
            # candidate left behind, perhaps. Once more on a fresh worker with this candidate in.
            self.engine.replace_worker(())
            covered, detail, measured = self._wall_clock()
        if covered < WALL_CLOCK_FRACTION:
            self.tainted = True
            clock = Gate(
                WALL_CLOCK,
                "fail",
                f"timer disagrees with the host wall clock: {detail} ({covered:.0%}); the worker's "
                f"timer: {measured['timer']}; the worker is replaced",
            )
            return [clock, Gate(ROOFLINE, "not run", "no trustworthy measurement")]
        clock = Gate(WALL_CLOCK, "pass", f"the worker's timer covers {covered:.0%} of the host's wall clock")
        self.current = ROOFLINE
        timed = measured["groups"][self.group]
        roofline = self._roofline(timed["median_s"], measured["bindings"])
        if roofline.ok:
            report.measurement = {"tier": "fast", "group": self.group, "trials": measured["trials"], **timed}
        return [clock, roofline]

    def _wall_clock(self) -> tuple[float, str, dict[str, Any]]:
        """How much of the host's wall clock the worker's timed trials account for, over the trials
        one measurement has beyond another (fixed costs cancel); a description; the larger one."""
        self.current = WALL_CLOCK
        base_trials = 5
        t0 = time.perf_counter()
        first = self._measure(base_trials)
        wall_first = time.perf_counter() - t0
        extra = 200
        while True:
            t0 = time.perf_counter()
            second = self._measure(base_trials + extra)
            wall_extra = time.perf_counter() - t0 - wall_first
            if wall_extra >= WALL_CLOCK_MIN_S or extra >= 51_200:
                break
            extra *= 4
        reported = second["groups"][self.group]["total_s"] - first["groups"][self.group]["total_s"]
        covered = reported / wall_extra if wall_extra > 0 else 1.0
        detail = (
            f"{extra} extra launches took {wall_extra:.3g} s on the host, "
            f"the worker's timer reported {reported:.3g} s"
        )
        return covered, detail, second

    def _measure(self, trials: int) -> dict[str, Any]:
        return self.request("measure", tier="fast", trials=trials, group=self.group)

    def _roofline(self, median_s: float, bindings: dict[str, int]) -> Gate:
        from polymorph.hw import roofline_seconds
        from polymorph.plan import KernelChoice, PlanGroup
        from polymorph.predict import group_cost

        profile = self.engine.gate_profile()
        if not profile.has_figures:
            return Gate(ROOFLINE, "skipped", f"profile `{profile.id}` has no figures to hold the time to")
        info = self.info
        plan_group = PlanGroup(
            info["id"],
            info["pattern"],
            tuple(info["nodes"]),
            tuple(info["inputs"]),
            tuple(info["outputs"]),
            KernelChoice(info["kernel"], "", {}),
        )
        cost = group_cost(self.graph, plan_group, self.types, bindings)
        dtype = next(
            (self.types[v].dtype.value for v in info["inputs"] if self.types[v].dtype.is_float), "f32"
        )
        try:
            floor = roofline_seconds(profile, cost.flops, cost.bytes, dtype)
        except UserError as e:
            return Gate(ROOFLINE, "skipped", str(e))
        rates = (
            f"{cost.bytes / max(median_s, 1e-12) / 1e9:.3g} GB/s and "
            f"{cost.flops / max(median_s, 1e-12) / 1e9:.3g} GFLOP/s"
        )
        if median_s * ROOFLINE_SLACK < floor.floor_s:
            return Gate(
                ROOFLINE,
                "fail",
                f"impossible: {median_s:.3g} s for {cost.bytes:.3g} B and {cost.flops:.3g} FLOP implies {rates}; "
                f"the profile's roofline floor is {floor.floor_s:.3g} s ({floor.bound}-bound)",
            )
        return Gate(ROOFLINE, "pass", f"{median_s:.3g} s ({rates}) >= roofline floor {floor.floor_s:.3g} s")


class _Undrawable(Exception):
    """The gate cannot draw meaningful inputs for this group."""


def _eps(graph: Any) -> float:
    import ml_dtypes

    dtype = DType.parse(graph.meta.get("dtype", "f32"))
    return float(ml_dtypes.finfo(dtype.numpy).eps) if dtype.is_float else 0.0


# A step of more rows than this is lowered with other fusions on GPUs (backends/gpu/backend.py,
# FUSED_NORM_MAX_ROWS): the decode step's groups do not exist there, so no case goes above it.
MAX_CASE_ROWS = 64


def _shapes(batch: int) -> list[tuple[int, int]]:
    """(batch, seq) cases from the loaded bucket: its decode step, an odd chunk of prompt at its
    batch (fewer sequences where that would pass MAX_CASE_ROWS), one odd prompt alone, and an odd
    smaller batch where there is one."""

    def fit(b: int, seq: int) -> tuple[int, int]:
        return max(1, min(b, MAX_CASE_ROWS // seq)), seq

    shapes = [(batch, 1), fit(batch, 5), (1, 13)]
    if batch > 2:
        shapes.append(fit(batch - 1 if batch % 2 == 0 else batch - 2, 3))
    return list(dict.fromkeys(shapes))


def _draw_float(rng: np.random.Generator, dist: str, shape: tuple[int, ...]) -> np.ndarray:
    if dist == DISTRIBUTIONS[0]:
        return rng.standard_normal(shape)
    if dist == DISTRIBUTIONS[1]:
        return rng.uniform(-1e3, 1e3, shape)
    x = rng.standard_normal(shape)
    n = max(1, x.size // 200)
    x.flat[rng.choice(x.size, n, replace=False)] = rng.choice([-1e4, 1e4], n)
    return x


def _error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error relative to the scale of its row (the last axis), over the whole output; inf
    where the output is NaN or not finite where the reference is."""
    a = np.asarray(got, dtype=np.float64)
    e = np.asarray(want, dtype=np.float64)
    if a.shape != e.shape or np.isnan(a).any() or (np.isfinite(e) & ~np.isfinite(a)).any():
        return float("inf")
    if e.size == 0:
        return 0.0
    e = np.where(np.isfinite(e), e, 0.0)
    a = np.where(np.isfinite(a), a, 0.0)
    rows = np.abs(e).max(axis=-1, keepdims=True) if e.ndim else np.abs(e)
    scale = np.maximum(rows, max(float(np.abs(e).max()) * 1e-3, 1e-30))
    return float((np.abs(a - e) / scale).max())


def _precision_hint(err: float, dtype: DType) -> str:
    """When the error looks like the rounding of a narrower format than the group declares."""
    declared = _EPS.get(dtype.value)
    if declared is None or not np.isfinite(err):
        return ""
    name = min(_EPS, key=lambda k: abs(np.log10(_EPS[k]) - np.log10(2 * err)))
    # Only an error of the size a narrower format's rounding makes (within a factor of 5), not a
    # plain wrong answer.
    if _EPS[name] <= declared or abs(np.log10(_EPS[name]) - np.log10(2 * err)) > 0.7:
        return ""
    return (
        f"; about the rounding of {name} arithmetic (eps {_EPS[name]:.2g}), the group declares {dtype.value}"
    )


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def _inputs_unchanged(responses: list[dict[str, Any]], names: list[str], weights: set[str]) -> Gate:
    for r in responses:
        for i, (before, after) in enumerate(zip(r["checksums_before"], r["checksums_after"], strict=True)):
            if before == after or i in r["in_place"]:
                continue
            if names[i] in weights:
                cause = (
                    f"mutated inputs: the engine's weight `{names[i]}` was written; the worker is replaced"
                )
            else:
                cause = f"mutated inputs: input {i} (`{names[i]}`) changed during the launch"
            return Gate(INPUTS_UNCHANGED, "fail", cause)
    return Gate(INPUTS_UNCHANGED, "pass", f"every input of {len(responses)} launches unchanged")


def _input_dependence(cases: list[_Case]) -> Gate:
    for i, a in enumerate(cases):
        for b in cases[i + 1 :]:
            if a.shape != b.shape or _same(a.stock, b.stock):
                continue
            if _same(a.got, b.got):
                return Gate(
                    INPUT_DEPENDENCE,
                    "fail",
                    f"the output did not change when the inputs did ({a.dist} vs {b.dist} inputs at "
                    f"batch {a.shape[0]}, seq {a.shape[1]}): a constant or cached answer",
                )
    return Gate(INPUT_DEPENDENCE, "pass", "the output follows the inputs in every case")


def _output_prefill(
    zero: list[np.ndarray], other: list[np.ndarray], deterministic: bool, allowed: float
) -> Gate:
    for i, (a, b) in enumerate(zip(zero, other, strict=True)):
        if a.tobytes() == b.tobytes():
            continue
        if not deterministic and _error(a, b) <= allowed:
            continue
        differ = int((a != b).sum())
        return Gate(
            OUTPUT_PREFILL,
            "fail",
            f"output {i} depends on the buffer's prior contents: {differ}/{a.size} elements differ "
            "between buffers prefilled with 0 and with -7.5 (not every element is written)",
        )
    return Gate(OUTPUT_PREFILL, "pass", "the same output whatever the buffers held before")


def _completion(settled: list[dict[str, Any]]) -> Gate:
    late = [i for r in settled for i, changed in enumerate(r["late"]) if changed]
    if late:
        return Gate(
            COMPLETION,
            "fail",
            f"output {late[0]} changed within {SETTLE_S:g} s after the launch returned: work still running "
            "after return (another thread, an unsynchronized stream)",
        )
    return Gate(
        COMPLETION, "pass", f"outputs unchanged {SETTLE_S:g} s after {len(settled)} launches returned"
    )


def _determinism(first: list[np.ndarray], again: list[np.ndarray], stock_deterministic: bool) -> Gate:
    if not stock_deterministic:
        return Gate(DETERMINISM, "skipped", "the stock kernel is not bitwise deterministic here either")
    if not _same(first, again):
        return Gate(
            DETERMINISM, "fail", "two runs on the same inputs differ; the stock kernel's agree bitwise"
        )
    return Gate(DETERMINISM, "pass", "two runs on the same inputs agree bitwise")
