"""The gates a candidate kernel passes before its timing counts, run by the controller.

The worker is hostile: it runs the candidate and leaves what came out in the controller's shared
memory; every comparison happens here, against the stock kernel and the numpy reference the
controller holds, and every time is taken by the controller's clock (`polymorph.engine.timing`).
`run_gates` takes a candidate already swapped into `group` and ends each gate in a named `Gate` with
its cause:

  numerics                  the group alone (op `run_group`) on fresh random inputs from several
                            distributions, over the shapes of the loaded bucket (odd sizes included,
                            and its decode step at batch >= 2 with ragged contexts up to the bucket's
                            longest), into output buffers poisoned with NaN: within the op tolerance
                            of the reference, or no worse than a few times the stock kernel's own
                            error. NaN only where the reference has NaN, an infinity only where it
                            has the same one; a stock kernel that misses the reference's NaN or
                            infinities sets no bar of its own (the candidate matches the reference or
                            the stock kernel within the op tolerance).
  honesty.inputs_unchanged  every input the controller wrote holds the same bytes after the launch
                            (a cache written in place by design excepted)
  honesty.input_dependence  where the stock kernel's output changes with the inputs (same shape,
                            other values), the candidate's changes too: no constant or cached answers
  honesty.output_prefill    the same inputs into buffers prefilled with 0 and with a value drawn for
                            the candidate give the output they gave into buffers poisoned with NaN:
                            every element is written, and a kernel right only in the poisoned
                            buffers every judged call has is not
  honesty.completion        the output does not change after the answer came (the worker thawed for
                            a moment and frozen again): no work left running
  honesty.determinism       where the stock kernel is bitwise deterministic, two runs of the candidate
                            on the same inputs agree bitwise
  quality                   teacher-forced logits of the whole model, prefill and decode steps (three
                            sequences, one as long as the bucket allows, decoded together), against
                            the reference; at a step the stock plan misses too, within STOCK_SLACK of
                            the stock plan's own error
  kv_isolation              interleaved sequences decode as they do alone; the guard regions stay
                            zero; blocks the stock kernel wrote before a swap decode right after it.
                            Under a sliding window a block that slid out of every window reading its
                            cache is released (`polymorph.engine.windows`): NaN from then on, in
                            this gate, the quality run and the numerics cases, and a guard region (a
                            write into it fails) that no kernel may read
  timing.checked            the calls the controller timed, some chosen after each round's answer,
                            match the reference: a kernel that skips work while timed fails here.
                            In bit-exact mode every timed call's outputs equal the stock kernel's
                            on the same inputs byte for byte (run on a clean fork after the clock)
  timing.roofline           the time implies no bandwidth or FLOP rate above the profile's roofline
                            (`hw.roofline_seconds`); on a profile without figures (cpu), no rate
                            above what this host copies and multiplies, measured here on the spot
  sandbox                   the candidate did nothing the sandbox blocks (a file, socket, signal or
                            process it may not reach; a forbidden system call) and left no process
                            running in the worker
  honesty.tamper            the worker's clocks and the functions of torch and numpy are the ones it
                            was loaded with
  state.weights             every weight holds the bytes it held at load
  exact                     bit-exact mode only (`--exact`): on every case of the group gates (fresh
                            inputs), on a case of each special float regime (signed zeros and
                            subnormals; infinities and NaN: `cases.SPECIALS`) and on a repeated run,
                            the candidate's outputs equal the stock kernel's byte for byte (-0.0
                            is not 0.0, NaN payloads count); a stock kernel that is not bitwise
                            deterministic here sets no bar, and fails it

An imported program (torch.export: no tokens, no cache) is gated at its example inputs' shapes, the
one shape it has: the group gates run on those (with two more regimes, normal about a common offset
and with outliers past float16's range: nothing else judges a program's group), and quality and
kv_isolation, which teacher-force tokens and read a cache, are "skipped" as not applicable. A program group whose inputs cannot be
drawn (an integer input of no known meaning) fails the group gates: nothing else would judge it.

The timing gates run only when every gate before them passed; their measurement is the one that
counts. The integrity gates (sandbox, tamper, weights) run last, whatever came before, unless the
worker was lost. A worker lost during a gate (hang, crash) fails that gate and is replaced without
the candidate; the gates after it are "not run". Whatever the verdict, the controller retires the
worker afterwards.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from polymorph.engine.cases import (
    DISTRIBUTIONS,
    PROGRAM_REGIMES,
    SPECIALS,
    GroupInfo,
    Undrawable,
    draw,
    reference_outputs,
)
from polymorph.engine.cases import error as _error
from polymorph.engine.timing import time_group
from polymorph.engine.verdict import Fault
from polymorph.engine.wire import VARIED, CandidateRaised, WorkerLost
from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.verify.numerics import ScenarioStep, StepCheck, judge, judge_beside
from polymorph.verify.tolerance import compare, model_tolerance, op_tolerance

if TYPE_CHECKING:
    from polymorph.engine.controller import Controller
    from polymorph.engine.link import CallsResult

NUMERICS = "numerics"
INPUTS_UNCHANGED = "honesty.inputs_unchanged"
INPUT_DEPENDENCE = "honesty.input_dependence"
OUTPUT_PREFILL = "honesty.output_prefill"
COMPLETION = "honesty.completion"
DETERMINISM = "honesty.determinism"
QUALITY = "quality"
KV_ISOLATION = "kv_isolation"
CHECKED = "timing.checked"
ROOFLINE = "timing.roofline"
SANDBOX = "sandbox"
TAMPER = "honesty.tamper"
WEIGHTS = "state.weights"
EXACT = "exact"
GROUP_GATES = (NUMERICS, INPUTS_UNCHANGED, INPUT_DEPENDENCE, OUTPUT_PREFILL, COMPLETION, DETERMINISM)
EXACT_GROUP_GATES = (*GROUP_GATES, EXACT)  # the group stage in bit-exact mode
MODEL_GATES = (QUALITY, KV_ISOLATION)
TIMING_GATES = (CHECKED, ROOFLINE)
INTEGRITY_GATES = (SANDBOX, TAMPER, WEIGHTS)
STAGES = {
    GROUP_GATES: "group",
    EXACT_GROUP_GATES: "group",
    MODEL_GATES: "model",
    TIMING_GATES: "timing",
    INTEGRITY_GATES: "integrity",
}

GUARD_WHERE = (
    " (the guard block, blocks no sequence owns, slots past a sequence's last token, or blocks that slid"
    " out of a sliding window)"
)
CAPTURED = "captured"  # the reference's own activations, from a run of the whole model (the scenario's)
LONGEST = "normal, ragged contexts up to the bucket's longest"
NEAR_TIE_EPS = 4  # a router margin under this many epsilons may route differently (verify.numerics)
STOCK_ERROR_FACTOR = 4.0  # a candidate may be this many times less accurate than the stock kernel
SETTLE_S = 0.05  # how long after a launch returned its outputs must stay as they were
# Calibrated figures are achievable rates, not peaks: a kernel may beat them a little, never by more.
ROOFLINE_SLACK = 1.25
# On a host measured on the spot (no profile figures): its copy and matmul rates are lower bounds of
# what it can do, not its peak; a kernel may beat them by this much, not more.
HOST_SLACK = 4.0

# Rounding unit of the float formats a kernel might secretly compute in, for a cause that names it.
_EPS = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7}
# What a candidate's error says when the sandbox stopped it: no permission (Landlock, seccomp), no
# network (an empty network namespace), no such process (a pid namespace hides everything outside).
_BLOCKED = re.compile(
    r"PermissionError|Operation not permitted|Permission denied|Network is unreachable|ProcessLookupError"
    r"|No such process|"
    + "|".join(f"\\[Errno {n}\\]" for n in (errno.EPERM, errno.EACCES, errno.ENETUNREACH))
)


def blocked_by_sandbox(cause: str) -> bool:
    return bool(_BLOCKED.search(cause))


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
    measurement: dict[str, Any] | None = None  # the timing that counts, when all passed
    steps: list[StepCheck] = field(default_factory=list)  # the quality gate's teacher-forced steps
    seconds: dict[str, float] = field(default_factory=dict)  # host time per stage: group, model, timing

    @property
    def ok(self) -> bool:
        return bool(self.gates) and all(g.ok for g in self.gates)

    def gate(self, name: str) -> Gate:
        return next(g for g in self.gates if g.name == name)

    def failed(self) -> list[Gate]:
        return [g for g in self.gates if g.verdict == "fail"]


def run_gates(
    engine: Controller,
    group: str,
    kernel: str,
    config: dict[str, Any] | None,
    *,
    seed: int | None = None,
    exact: bool = False,
) -> GateReport:
    """Every gate on the candidate swapped into `group` (with `exact`, the bit-exact gate too); the
    report's faults are the failed gates'. Swapping back (or accepting) and retiring the worker are
    the caller's."""
    run = _Run(engine, group, kernel, config, np.random.default_rng(seed), seed)
    run.exact = exact
    report = GateReport(group, kernel)
    stages: list[tuple[tuple[str, ...], Callable[[], list[Gate]]]] = [
        (EXACT_GROUP_GATES if exact else GROUP_GATES, run.group_gates),
        (MODEL_GATES, run.model_gates),
        (TIMING_GATES, lambda: run.timing_gates(report)),
        (INTEGRITY_GATES, run.integrity_gates),
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
        except CandidateRaised as e:
            cause = str(e)
            if blocked_by_sandbox(cause):
                gates = [
                    Gate(SANDBOX, "fail", f"the sandbox blocked the candidate in {run.current}: {cause}")
                ]
                gates += [Gate(n, "not run", "the candidate was stopped by the sandbox") for n in names]
            else:
                gates = _fail_rest(names, run.current, f"the candidate raised: {cause}")
            raised = e
        except WorkerLost as lost:
            name = SANDBOX if lost.how == "sandbox" else run.current
            report.gates += _fail_rest(names, name, f"{lost.how}: {lost}")
            report.faults.append(Fault(group, kernel, lost.how, f"{run.current}: {lost}"))
            engine.replace_worker({group})
            _not_run_rest(report, stages, f"the worker was lost in {run.current}")
            return report
        finally:
            report.seconds[STAGES[names]] = time.perf_counter() - t0
        gates = [g for g in gates if g.name not in {x.name for x in report.gates}]
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
    if not report.ok:
        report.measurement = None  # a time counts only for a candidate every gate passed
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
    after: list[np.ndarray | None]  # the inputs as the candidate's call left them


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
        self.ginfo = GroupInfo.of(self.info, self.graph, self.types)
        self.current = NUMERICS
        self.steps: list[StepCheck] = []
        self.allowed = 0.0  # the worst error the numerics gate allowed (the timed calls' bar)
        self._scenario: list[ScenarioStep] | None = None
        self.exact = False  # bit-exact mode: the `exact` gate runs with the group gates
        self._common: dict[str, int] = {}  # the draws' block size, context and vocabulary
        self.program = self.graph.meta.get("source") == "torch.export"  # no tokens, no cache

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
            raise CandidateRaised(r["__error__"]["message"])
        return r

    # --- the group alone -----------------------------------------------------------------------------

    def call(self, inputs: list[np.ndarray | None], bindings: dict[str, int], **fields: Any) -> CallsResult:
        """One launch of the candidate (the same request the timing sends many of)."""
        return self.engine.run_calls(self.ginfo, [inputs], bindings, **fields)

    def stock(self, inputs: list[np.ndarray | None], bindings: dict[str, int]) -> CallsResult:
        """One launch of the stock kernel, on a fork the candidate never touched."""
        return self.engine.stock_calls(self.ginfo, [inputs], bindings)

    def group_gates(self) -> list[Gate]:
        loaded = self.engine.loaded
        batch = int(loaded["bucket"]["batch"])
        common = {"block_size": int(loaded["block_size"]), "bucket_ctx": int(loaded["bucket"]["ctx"]),
                  "vocab": self.engine.vocab}  # fmt: skip
        self._common = common
        try:
            if self.program:
                return self._program_group_gates(common)
            ctx = int(loaded["bucket"]["ctx"])
            fixed = [shape for shape in _shapes(batch) if shape[1] <= ctx]  # no chunk past the context
            draws = [
                (shape, dist, *draw(self.ginfo, self.rng, shape, dist, **common))
                for shape in fixed
                for dist in DISTRIBUTIONS
            ]
            draws += [
                (shape, DISTRIBUTIONS[0], *draw(self.ginfo, self.rng, shape, DISTRIBUTIONS[0], **common))
                for shape in _random_shapes(batch, self.rng, fixed, ctx)
            ]
            # The decode step at batch >= 2, contexts ragged up to the bucket's longest.
            long_shape = (max(2, batch), 1)
            draws.append((long_shape, LONGEST, *draw(self.ginfo, self.rng, long_shape, "normal",
                                                     longest=True, **common)))  # fmt: skip
        except Undrawable as e:
            skipped = [
                Gate(n, "skipped", f"not applicable: {e}; the quality gate covers it") for n in GROUP_GATES
            ]
            if self.exact:  # no case to compare bytes on: bit-exactness cannot be shown
                skipped.append(Gate(EXACT, "fail", f"no inputs to compare the stock kernel's bytes on: {e}"))
            return skipped
        captured = self._captured()
        if captured is not None:
            draws.append(captured)
        return self._group_cases(draws)

    def _program_group_gates(self, common: dict[str, int]) -> list[Gate]:
        """A program's group at its one shape (its example inputs'): every distribution, normal draws about
        a common offset and with outliers past float16's range (`cases.PROGRAM_REGIMES`), and
        PROGRAM_DRAWS more fresh normal draws. Undrawable fails here: no model gate covers a program's group."""
        try:
            draws = [
                (PROGRAM_SHAPE, dist, *draw(self.ginfo, self.rng, PROGRAM_SHAPE, dist, **common))
                for dist in (*DISTRIBUTIONS, *PROGRAM_REGIMES, *[DISTRIBUTIONS[0]] * PROGRAM_DRAWS)
            ]
        except Undrawable as e:
            names = EXACT_GROUP_GATES if self.exact else GROUP_GATES
            return _fail_rest(names, NUMERICS, f"cannot judge this group of a program: {e}")
        return self._group_cases(draws)

    def _group_cases(
        self, draws: list[tuple[tuple[int, int], str, list[np.ndarray | None], dict[str, int]]]
    ) -> list[Gate]:
        cases: list[_Case] = []
        for shape, dist, inputs, bindings in draws:
            want = self._reference(inputs, bindings)
            stock = self.stock(inputs, bindings).output(0)
            done = self.call(inputs, bindings)
            cases.append(
                _Case(shape, dist, inputs, bindings, want, stock, done.output(0), done.inputs_after[0])
            )
        gates = [self._numerics(cases), self._inputs_unchanged(cases), _input_dependence(cases)]
        # Extra runs on the first case: prefill, completion and determinism.
        first = cases[0]
        self.current = OUTPUT_PREFILL
        fill = float(np.float32(self.rng.uniform(-1e3, 1e3)))  # drawn: no value a kernel could expect
        zero = self.call(first.inputs, first.bindings, fill=0.0).output(0)
        varied = self.call(first.inputs, first.bindings, fill=VARIED).output(0)  # not one value throughout
        settled = self.call(first.inputs, first.bindings, fill=fill).output(0)
        late = [_changed(settled, self.engine.settle(SETTLE_S))]
        # Once more on other inputs: a late write the host's scheduler happened to hide shows here.
        second = cases[1]
        answered = self.call(second.inputs, second.bindings, fill=fill).output(0)
        late.append(_changed(answered, self.engine.settle(SETTLE_S)))
        self.current = DETERMINISM
        again = self.call(first.inputs, first.bindings).output(0)
        stock_again = self.stock(first.inputs, first.bindings).output(0)
        deterministic = _same(first.stock, stock_again)
        prefilled = [("0", zero), ("varied numbers", varied), (f"{fill:g}", settled)]
        gates.append(_output_prefill(first.got, prefilled, deterministic, self._allowed(first)[0]))
        gates.append(_completion(late))
        gates.append(_determinism(first.got, again, deterministic))
        if self.exact:
            self.current = EXACT
            gates.append(_exact(cases + self._special_cases(first), again, stock_again, deterministic,
                                self.program))  # fmt: skip
        return gates

    def _special_cases(self, first: _Case) -> list[_Case]:
        """Bit-exact mode: a case of each special float regime (`cases.SPECIALS`: signed zeros and
        subnormals, infinities and NaN) at the first case's shape, the candidate's and the stock
        kernel's outputs only (no reference: the bytes are the bar)."""
        out = []
        for dist in SPECIALS:
            try:
                inputs, bindings = draw(self.ginfo, self.rng, first.shape, dist, **self._common)
            except Undrawable:
                return []
            stock = self.stock(inputs, bindings).output(0)
            done = self.call(inputs, bindings)
            out.append(_Case(first.shape, dist, inputs, bindings, [], stock, done.output(0),
                             done.inputs_after[0]))  # fmt: skip
        return out

    def _inputs_unchanged(self, cases: list[_Case]) -> Gate:
        alias = self.engine._aliases()
        producer = {v: n for n in self.graph.nodes if n.name in self.info["nodes"] for v in n.outputs}
        in_place = {
            self.info["inputs"].index(producer[v].inputs[0]) for v in self.info["outputs"] if v in alias
        }
        for case in cases:
            for j, (sent, after) in enumerate(zip(case.inputs, case.after, strict=True)):
                if sent is None or j in in_place or sent.tobytes() == after.tobytes():  # type: ignore[union-attr]
                    continue
                name = self.info["inputs"][j]
                return Gate(
                    INPUTS_UNCHANGED,
                    "fail",
                    f"mutated inputs: input {j} (`{name}`) changed during the launch",
                )
        return Gate(INPUTS_UNCHANGED, "pass", f"every input of {len(cases)} launches unchanged")

    def _captured(self) -> tuple[tuple[int, int], str, list[np.ndarray | None], dict[str, int]] | None:
        """A case on the activations the reference computed for this group's inputs in a run of the
        whole model (the scenario's last run, as real tokens give them: not a synthetic distribution),
        or None where that run has no value of some input (the last-token slice's, say)."""
        if self.program:
            return None  # no scenario: a program has no tokens to run the model on
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
        return reference_outputs(self.ginfo, self.engine.weights, self.engine.wide_weights, inputs, bindings)

    def _allowed(self, case: _Case) -> tuple[float, float]:
        """(the error a candidate may have on this case, the stock kernel's own error on it). A stock
        kernel whose error is not finite (it has NaN or an infinity where the reference has none, or
        the other way round) sets no bar of its own: the op tolerance stands, and `_numerics` lets a
        candidate that agrees with the stock kernel within it pass too."""
        dtype = self.types[self.info["outputs"][0]].dtype
        stock_err = max(_error(s, w) for s, w in zip(case.stock, case.want, strict=True))
        if not np.isfinite(stock_err):
            return op_tolerance(dtype).rtol, stock_err
        return max(op_tolerance(dtype).rtol, STOCK_ERROR_FACTOR * stock_err), stock_err

    def _numerics(self, cases: list[_Case]) -> Gate:
        worst = 0.0
        for case in cases:
            allowed, stock_err = self._allowed(case)
            if case.dist in (DISTRIBUTIONS[0], LONGEST):
                self.allowed = max(self.allowed, allowed)
            for i, (got, want) in enumerate(zip(case.got, case.want, strict=True)):
                err = _error(got, want)
                if err <= allowed:
                    worst = max(worst, err)
                    continue
                if not np.isfinite(stock_err) and _error(got, case.stock[i]) <= allowed:
                    continue  # the stock kernel misses the reference here too, and the candidate matches it
                where = f"output {i} on {case.dist} inputs {_at(case, self.program)}"
                if np.isnan(got).any() and not np.isnan(np.asarray(want, dtype=np.float64)).any():
                    n = int(np.isnan(got).sum())
                    return Gate(
                        NUMERICS, "fail", f"NaN in {where}: {n}/{got.size} elements (poisoned, unwritten?)"
                    )
                if not np.isfinite(err):
                    return Gate(
                        NUMERICS,
                        "fail",
                        f"{where}: not finite where the reference is, or not the reference's NaN or "
                        "infinity where it has one (the stock kernel's error: "
                        f"{stock_err:.3g})",
                    )
                dtype = self.types[self.info["outputs"][i]].dtype
                return Gate(
                    NUMERICS,
                    "fail",
                    f"{where}: max error {err:.3g} of the output's row scale, allowed {allowed:.3g} "
                    f"(the stock kernel's: {stock_err:.3g}){_precision_hint(err, dtype)}",
                )
        shapes = sorted({c.shape for c in cases if c.dist not in (CAPTURED, LONGEST)})
        captured = [c.shape for c in cases if c.dist == CAPTURED]
        also = f"; activations captured from a run of the model at {captured[0]}" if captured else ""
        if self.program:
            return Gate(NUMERICS, "pass", f"{len(cases)} cases ({', '.join((*DISTRIBUTIONS, *PROGRAM_REGIMES))} and fresh "
                        f"normal draws at the program's shapes): worst error {worst:.3g}")  # fmt: skip
        longest = next(c for c in cases if c.dist == LONGEST)
        return Gate(
            NUMERICS,
            "pass",
            f"{len(cases)} cases ({', '.join(DISTRIBUTIONS)} at (batch, seq) {shapes}; the decode step at "
            f"batch {longest.shape[0]} up to the bucket's longest context{also}): worst error {worst:.3g}",
        )

    # --- the whole model -----------------------------------------------------------------------------

    def model_gates(self) -> list[Gate]:
        if self.program:
            return [
                Gate(QUALITY, "skipped", "not applicable: an imported program has no tokens or logits to "
                     "teacher-force; its group was judged on fresh inputs at the program's shapes"),
                Gate(KV_ISOLATION, "skipped", "not applicable: an imported program has no cache"),
            ]  # fmt: skip
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
        self.current = CHECKED
        dtype = self.types[self.info["outputs"][0]].dtype
        allowed = max(self.allowed, op_tolerance(dtype).rtol)
        held = _BytesHeld(self.engine) if self.exact else None
        t = time_group(held or self.engine, self.ginfo, self.rng, allowed=allowed)
        if held is not None and held.differ:  # bit-exact mode: every timed call held to the stock bytes
            return [
                Gate(CHECKED, "fail", f"not bit-exact while timed: {held.differ[0]} ({len(held.differ)} of "
                     f"{held.calls} timed calls differ from the stock kernel's bytes)"),
                Gate(ROOFLINE, "not run", "no trustworthy measurement"),
            ]  # fmt: skip
        if t.failures:
            return [
                Gate(CHECKED, "fail", f"{len(t.failures)} of {t.checked} timed calls checked afterwards are "
                                      f"wrong: {t.failures[0]} (work skipped while timed?)"),
                Gate(ROOFLINE, "not run", "no trustworthy measurement"),
            ]  # fmt: skip
        harness = (
            f", harness {t.harness_s * 1e6:.3g} us a call taken off (measured on a clean worker)"
            if t.harness_s
            else ", no clean worker to measure the harness on: its cost is in the time"
        )
        checked = Gate(
            CHECKED,
            "pass",
            f"{len(t.per_call_s)} rounds of {t.calls} calls on fresh inputs by the controller's clock; "
            f"{t.checked} calls chosen afterwards match the reference{harness}",
        )
        self.current = ROOFLINE
        roofline = self._roofline(t.raw_median_s, t.bindings)
        if roofline.ok:
            report.measurement = {"tier": "fast", "group": self.group, **t.to_json()}
        return [checked, roofline]

    def _roofline(self, median_s: float, bindings: dict[str, int]) -> Gate:
        from polymorph.cost.model import group_cost
        from polymorph.hardware.profile import roofline_seconds
        from polymorph.pipeline.plan import KernelChoice, PlanGroup

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
        rates = (
            f"{cost.bytes / max(median_s, 1e-12) / 1e9:.3g} GB/s and "
            f"{cost.flops / max(median_s, 1e-12) / 1e9:.3g} GFLOP/s"
        )
        profile = self.engine.gate_profile()
        if not profile.has_figures:
            bandwidth, flop_rate = host_rates(int(cost.bytes))
            floor_s = max(cost.bytes / (HOST_SLACK * bandwidth), cost.flops / (HOST_SLACK * flop_rate))
            what = (f"this host's rates measured on the spot ({bandwidth / 1e9:.3g} GB/s copying "
                    f"{cost.bytes:.3g} B, {flop_rate / 1e9:.3g} GFLOP/s), {HOST_SLACK:g}x")  # fmt: skip
            if median_s < floor_s:
                return Gate(ROOFLINE, "fail", f"impossible: {median_s:.3g} s implies {rates}, above {what}")
            return Gate(ROOFLINE, "pass", f"{median_s:.3g} s ({rates}) within {what}")
        dtype = next(
            (self.types[v].dtype.value for v in info["inputs"] if self.types[v].dtype.is_float), "f32"
        )
        try:
            floor = roofline_seconds(profile, cost.flops, cost.bytes, dtype)
        except UserError as e:
            return Gate(ROOFLINE, "skipped", str(e))
        if median_s * ROOFLINE_SLACK < floor.floor_s:
            return Gate(
                ROOFLINE,
                "fail",
                f"impossible: {median_s:.3g} s for {cost.bytes:.3g} B and {cost.flops:.3g} FLOP implies {rates}; "
                f"the profile's roofline floor is {floor.floor_s:.3g} s ({floor.bound}-bound)",
            )
        return Gate(ROOFLINE, "pass", f"{median_s:.3g} s ({rates}) >= roofline floor {floor.floor_s:.3g} s")

    # --- integrity -----------------------------------------------------------------------------------

    def integrity_gates(self) -> list[Gate]:
        engine = self.engine
        # The weights first: reading their fingerprints is the last request that runs in the worker,
        # so a process started while it answers is counted below too.
        self.current = WEIGHTS
        changed = engine.weights_intact()
        weights = (
            Gate(WEIGHTS, "fail", f"{changed}: the worker is retired")
            if changed
            else Gate(WEIGHTS, "pass", "every weight holds the bytes it held at load")
        )
        self.current = TAMPER
        if engine.tampered:
            tamper = Gate(TAMPER, "fail", f"{engine.tampered} while the candidate was in")
        else:
            tamper = Gate(TAMPER, "pass", "clocks, torch and numpy functions as loaded")
        self.current = SANDBOX
        extra = engine.link.processes()
        if extra > 0:
            sandbox = Gate(SANDBOX, "fail", f"the candidate left {extra} process(es) running in the worker")
        else:
            sandbox = Gate(SANDBOX, "pass", "nothing blocked by the sandbox; no process left running")
        return [sandbox, tamper, weights]


class _BytesHeld:
    """The engine as `time_group` sees it in bit-exact mode: every timed request's calls are run again by
    the stock kernel on a fork the candidate never touched, after the clock stopped, and each call's
    outputs compared byte for byte (the group gates' few calls are not all a kernel is ever asked: one
    that turns inexact after some calls, or only in a request of many, shows here)."""

    def __init__(self, engine: Controller) -> None:
        self._engine = engine
        self.differ: list[str] = []
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def run_calls(
        self, group: GroupInfo, calls: list[list[np.ndarray | None]], bindings: dict[str, int], **fields: Any
    ) -> CallsResult:
        done = self._engine.run_calls(group, calls, bindings, **fields)
        if fields.get("stock"):
            return done
        stock = self._engine.stock_calls(group, calls, bindings)
        for i in range(len(calls)):
            self.calls += 1
            if not _same(done.output(i), stock.output(i)):
                self.differ.append(f"timed call {i + 1} of a request of {len(calls)}")
        return done


_HOST_RATES: dict[int, tuple[float, float]] = {}


def host_rates(nbytes: int) -> tuple[float, float]:
    """(bytes/s this host moves copying about `nbytes` (read and write), FLOP/s of a 256-square f32
    matmul), measured here, best of a few tries, cached by size class."""
    size = 1 << max(16, min(28, int(max(nbytes, 1)).bit_length()))
    if size not in _HOST_RATES:
        src = np.ones(size // 8, dtype=np.float64)
        dst = np.empty_like(src)
        a = np.ones((256, 256), dtype=np.float32)
        best_copy = best_mm = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best_copy = min(best_copy, time.perf_counter() - t0)
            t0 = time.perf_counter()
            a @ a
            best_mm = min(best_mm, time.perf_counter() - t0)
        _HOST_RATES[size] = (2 * size / max(best_copy, 1e-9), 2 * 256**3 / max(best_mm, 1e-9))
    return _HOST_RATES[size]


def _eps(graph: Any) -> float:
    import ml_dtypes

    dtype = DType.parse(graph.meta.get("dtype", "f32"))
    return float(ml_dtypes.finfo(dtype.numpy).eps) if dtype.is_float else 0.0


# A step of more rows than this is lowered with other fusions on GPUs (backends/gpu/backend.py,
# FUSED_NORM_MAX_ROWS): the decode step's groups do not exist there, so no case goes above it.
MAX_CASE_ROWS = 64


RANDOM_SHAPES = 4  # chunk shapes drawn afresh for every candidate, besides the fixed ones
# An imported program has one (static) shape, its example inputs'; its cases carry this placeholder.
PROGRAM_SHAPE = (1, 1)
PROGRAM_DRAWS = 2  # fresh normal draws of a program's group besides one of each distribution


def _at(case: _Case, program: bool) -> str:
    return "at the program's shapes" if program else f"at batch {case.shape[0]}, seq {case.shape[1]}"


def _shapes(batch: int) -> list[tuple[int, int]]:
    """(batch, seq) cases every candidate gets, from the loaded bucket: its decode step, an odd chunk
    of prompt at its batch (fewer sequences where that would pass MAX_CASE_ROWS), one odd prompt
    alone, and an odd smaller batch where there is one."""
    shapes = [(batch, 1), _fit(batch, 5), (1, 13)]
    if batch > 2:
        shapes.append(_fit(batch - 1 if batch % 2 == 0 else batch - 2, 3))
    return list(dict.fromkeys(shapes))


def _fit(b: int, seq: int) -> tuple[int, int]:
    return max(1, min(b, MAX_CASE_ROWS // seq)), seq


def _random_shapes(
    batch: int, rng: np.random.Generator, taken: list[tuple[int, int]], ctx: int
) -> list[tuple[int, int]]:
    """RANDOM_SHAPES more (batch, seq) shapes, drawn by the controller's generator for this candidate
    (a kernel wrong only at some row counts cannot know which it will be asked); a chunk never longer
    than the bucket's context."""
    out: list[tuple[int, int]] = []
    for _ in range(8 * RANDOM_SHAPES):
        if len(out) == RANDOM_SHAPES:
            break
        b = int(rng.integers(1, max(batch, 2) + 1))
        shape = _fit(b, int(rng.integers(1, max(1, min(MAX_CASE_ROWS // b, ctx)) + 1)))
        if shape not in taken and shape not in out:
            out.append(shape)
    return out


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
    poisoned: list[np.ndarray],
    prefilled: list[tuple[str, list[np.ndarray]]],
    deterministic: bool,
    allowed: float,
) -> Gate:
    """The outputs of the same inputs into buffers prefilled with each value of `prefilled` against
    those into buffers poisoned with NaN (the ones numerics judged): byte for byte where the stock kernel
    is deterministic, else within `allowed`."""
    for value, outputs in prefilled:
        for i, (a, b) in enumerate(zip(outputs, poisoned, strict=True)):
            if a.tobytes() == b.tobytes():
                continue
            if not deterministic and _error(a, b) <= allowed:
                continue
            differ = int(((a != b) & ~(_isnan(a) & _isnan(b))).sum())
            return Gate(
                OUTPUT_PREFILL,
                "fail",
                f"output {i} depends on the buffer's prior contents: {differ}/{a.size} elements differ "
                f"between buffers prefilled with {value} and buffers poisoned with NaN (not every element "
                "is written, or the answer is right only in a poisoned buffer)",
            )
    return Gate(OUTPUT_PREFILL, "pass", "the same output whatever the buffers held before")


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if a.dtype.kind in "fc" else np.zeros(a.shape, dtype=bool)


def _changed(answered: list[np.ndarray], later: list[np.ndarray]) -> list[bool]:
    return [a.tobytes() != b.tobytes() for a, b in zip(answered, later, strict=True)]


def _completion(late: list[list[bool]]) -> Gate:
    changed = [i for flags in late for i, flag in enumerate(flags) if flag]
    if changed:
        return Gate(
            COMPLETION,
            "fail",
            f"output {changed[0]} changed within {SETTLE_S:g} s after the launch returned: work still running "
            "after return (another thread, an unsynchronized stream, a child process)",
        )
    return Gate(COMPLETION, "pass", f"outputs unchanged {SETTLE_S:g} s after {len(late)} launches returned")


def _determinism(first: list[np.ndarray], again: list[np.ndarray], stock_deterministic: bool) -> Gate:
    if not stock_deterministic:
        return Gate(DETERMINISM, "skipped", "the stock kernel is not bitwise deterministic here either")
    if not _same(first, again):
        return Gate(
            DETERMINISM, "fail", "two runs on the same inputs differ; the stock kernel's agree bitwise"
        )
    return Gate(DETERMINISM, "pass", "two runs on the same inputs agree bitwise")


def _exact(
    cases: list[_Case],
    again: list[np.ndarray],
    stock_again: list[np.ndarray],
    deterministic: bool,
    program: bool,
) -> Gate:
    """Bit-exact mode: every case's outputs byte for byte the stock kernel's (run on a fork the
    candidate never touched), and a repeated run's too."""
    if not deterministic:
        return Gate(EXACT, "fail", "the stock kernel is not bitwise deterministic here: two of its runs on "
                    "the same inputs differ, so there are no stock bytes to match")  # fmt: skip
    runs = [(c.got, c.stock, f"{c.dist} inputs {_at(c, program)}") for c in cases]
    runs.append((again, stock_again, f"a repeated run on the {cases[0].dist} inputs"))
    for got, stock, where in runs:
        for i, (a, b) in enumerate(zip(got, stock, strict=True)):
            if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                what = f"{a.dtype}{list(a.shape)} where the stock kernel's is {b.dtype}{list(b.shape)}"
            else:
                ab, bb = (np.ascontiguousarray(t).view(np.uint8).reshape(t.size, -1) for t in (a, b))
                differ = int((ab != bb).any(axis=1).sum())
                worst = _max_difference(a, b)
                what = f"{differ}/{a.size} elements differ from the stock kernel's in their bytes{worst}"
            return Gate(EXACT, "fail", f"not bit-exact: output {i} on {where}: {what} (bit-exact mode "
                        "compares bytes: -0.0 is not 0.0, NaN payloads count)")  # fmt: skip
    return Gate(
        EXACT, "pass", f"byte for byte the stock kernel's outputs on {len(cases)} cases and a repeated run"
    )


def _max_difference(a: np.ndarray, b: np.ndarray) -> str:
    """ "; max abs difference X" over the elements finite in both, where there is one to give."""
    try:
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        x, y = a.astype(wide), b.astype(wide)
        both = np.isfinite(x) & np.isfinite(y)
        diff = np.abs(x[both] - y[both])
    except (TypeError, ValueError):
        return ""
    return f"; max abs difference {diff.max():.3g}" if diff.size and diff.max() > 0 else ""
