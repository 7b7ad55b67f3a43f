"""Traffic shapes: the one description of load that the specializer, engine, tuner and planner read.

A traffic shape is a TOML file (see examples/traffic/chat.toml):

    name = "chat"
    [batch]                  # batch-size mix: the fraction of decode steps run at each batch size
    sizes = [1, 8, 32]
    weights = [0.5, 0.3, 0.2]
    [prompt]                 # prompt length in tokens
    distribution = "lognormal"   # mean, sigma; optional min (default 1), max
    mean = 1024
    sigma = 0.6
    max = 8192
    [output]                 # output length in tokens
    distribution = "fixed"       # value
    value = 256
    [prefix_cache]           # optional; default hit_rate 0
    hit_rate = 0.3
    [buckets]                # optional explicit context edges; default powers of two
    context_edges = [512, 2048, 8192]

Distributions of lengths (integers, in tokens):
- `fixed`: always `value`.
- `uniform`: every integer in [`min`, `max`] equally likely.
- `lognormal`: `mean` is the arithmetic mean of the continuous distribution, `sigma` the standard deviation
  of its logarithm (so mu = ln(mean) - sigma**2 / 2); samples are rounded to the nearest integer and
  clipped to [`min`, `max`]. Without `max`, the upper clip is the 1 - 1e-6 quantile.

Buckets are derived analytically (no sampling, so they are exact and need no seed). A request with prompt
length p and output length o runs a prefill that emits the first token, then o - 1 decode steps; decode
step j (1 <= j <= o - 1) has context p + j, the prompt plus the tokens generated so far. Prompt and
output lengths are independent, so the distribution of a decode step's context is the convolution of the
prompt's distribution with the output's survival function, normalized by the mean number of decode steps.
A batched step of b sequences is specialized for its longest context, and the b sequences are taken as
independent draws, so P(longest context in (lo, hi]) = F(hi)**b - F(lo)**b with F the context CDF. A
bucket's weight is its batch size's weight times that probability: the fraction of decode steps it
serves. Context ranges are half-open (lo, hi]; a bucket is specialized at `ctx_hi`. Default edges are the
powers of two from 16 up; with explicit edges, contexts beyond the last edge fall into one more bucket
whose upper edge is the largest context the shape reaches (`max_context`). Prefix-cache hits do not move
the context (cached tokens are still attended to); they only mark requests in `sample_requests`.
"""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.errors import UserError

DISTRIBUTIONS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # name: (required fields, optional fields), besides `distribution` itself
    "fixed": (frozenset({"value"}), frozenset()),
    "uniform": (frozenset({"min", "max"}), frozenset()),
    "lognormal": (frozenset({"mean", "sigma"}), frozenset({"min", "max"})),
}
MAX_TOKENS = 1 << 22  # longest prompt or output a shape may describe; keeps the analytic arrays small
MIN_DEFAULT_EDGE = 16  # first default context edge: one KV block at the default block size
WEIGHT_TOLERANCE = 1e-6
_LOGNORMAL_TAIL_Z = 4.753424308822899  # standard normal quantile at 1 - 1e-6
_DIRECT_CONVOLVE_LIMIT = 50_000_000  # above this many multiply-adds, convolve by FFT
_TOP_KEYS = frozenset({"name", "batch", "prompt", "output", "prefix_cache", "buckets"})
_SECTION_KEYS = {"batch": {"sizes", "weights"}, "prefix_cache": {"hit_rate"}, "buckets": {"context_edges"}}


class TrafficError(UserError):
    """A bad traffic shape: names the file (when there is one), the field, and what it expects."""

    def __init__(self, field: str, problem: str, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        where = f"traffic shape {source}" if source else "traffic shape"
        super().__init__(f"{where}: `{field}` {problem}")


@dataclass(frozen=True)
class LengthDistribution:
    """A distribution of token counts (prompt or output length). See the module docstring."""

    distribution: str
    value: int | None = None
    min: int | None = None
    max: int | None = None
    mean: float | None = None
    sigma: float | None = None

    def __post_init__(self) -> None:
        known = ", ".join(DISTRIBUTIONS)
        if self.distribution not in DISTRIBUTIONS:
            raise TrafficError("distribution", f"is {self.distribution!r}; expected one of: {known}")
        required, optional = DISTRIBUTIONS[self.distribution]
        for name in ("value", "min", "max", "mean", "sigma"):
            present = getattr(self, name) is not None
            if name in required and not present:
                need = ", ".join(sorted(required))
                raise TrafficError(
                    name, f"is missing; expected for a {self.distribution} distribution: {need}"
                )
            if present and name not in required | optional:
                allowed = ", ".join(sorted(required | optional))
                raise TrafficError(
                    name, f"does not apply to a {self.distribution} distribution; expected: {allowed}"
                )
        for name in ("value", "min", "max"):
            n = getattr(self, name)
            if n is not None and not (1 <= n <= MAX_TOKENS):
                raise TrafficError(name, f"is {n}; expected a token count in [1, {MAX_TOKENS}]")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise TrafficError("max", f"is {self.max}, below min {self.min}; expected max >= min")
        if self.mean is not None and not (math.isfinite(self.mean) and self.mean > 0):
            raise TrafficError("mean", f"is {self.mean}; expected a number of tokens > 0")
        if self.sigma is not None and not (math.isfinite(self.sigma) and self.sigma > 0):
            raise TrafficError("sigma", f"is {self.sigma}; expected a number > 0")

    @classmethod
    def fixed(cls, value: int) -> LengthDistribution:
        return cls("fixed", value=value)

    @classmethod
    def uniform(cls, lo: int, hi: int) -> LengthDistribution:
        return cls("uniform", min=lo, max=hi)

    @classmethod
    def lognormal(
        cls, mean: float, sigma: float, lo: int | None = None, hi: int | None = None
    ) -> LengthDistribution:
        return cls("lognormal", mean=mean, sigma=sigma, min=lo, max=hi)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LengthDistribution:
        """Parse one `[prompt]` or `[output]` table; TrafficError names the field relative to it."""
        if "distribution" not in data:
            raise TrafficError("distribution", f"is missing; expected one of: {', '.join(DISTRIBUTIONS)}")
        kind = data["distribution"]
        if not isinstance(kind, str):
            raise TrafficError("distribution", f"is {kind!r}; expected one of: {', '.join(DISTRIBUTIONS)}")
        if kind in DISTRIBUTIONS:
            required, optional = DISTRIBUTIONS[kind]
            for key in data:
                if key != "distribution" and key not in required | optional:
                    allowed = ", ".join(sorted(required | optional))
                    raise TrafficError(key, f"is not a field of a {kind} distribution; expected: {allowed}")
        return cls(
            distribution=kind,
            value=_opt_int(data, "value"),
            min=_opt_int(data, "min"),
            max=_opt_int(data, "max"),
            mean=_opt_float(data, "mean"),
            sigma=_opt_float(data, "sigma"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"distribution": self.distribution}
        for name in ("value", "mean", "sigma", "min", "max"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @property
    def _mu(self) -> float:
        assert self.mean is not None and self.sigma is not None
        return math.log(self.mean) - self.sigma**2 / 2

    def lower(self) -> int:
        """The shortest length this distribution produces."""
        if self.distribution == "fixed":
            assert self.value is not None
            return self.value
        return 1 if self.min is None else self.min

    def upper(self) -> int:
        """The longest length this distribution produces (the clip for an open lognormal)."""
        if self.distribution == "fixed":
            assert self.value is not None
            return self.value
        if self.max is not None:
            return self.max
        assert self.sigma is not None
        tail = math.ceil(math.exp(self._mu + self.sigma * _LOGNORMAL_TAIL_Z))
        return max(self.lower(), min(MAX_TOKENS, tail))

    def pmf(self) -> np.ndarray:
        """p[n] = P(length == n) for n in [0, upper()]; exact for the rounded, clipped lengths."""
        lo, hi = self.lower(), self.upper()
        p = np.zeros(hi + 1)
        if self.distribution == "fixed" or lo == hi:
            p[lo] = 1.0
        elif self.distribution == "uniform":
            p[lo : hi + 1] = 1.0 / (hi - lo + 1)
        else:
            assert self.sigma is not None
            # P(round(X) == n) = F(n + 0.5) - F(n - 0.5); clipped mass lands on lo and hi
            z = (np.log(np.arange(lo, hi) + 0.5) - self._mu) / (self.sigma * math.sqrt(2.0))
            cdf = 0.5 * (1.0 + _erf(z))  # cdf[i] = F(lo + i + 0.5)
            p[lo] = cdf[0]
            p[lo + 1 : hi] = np.diff(cdf)
            p[hi] = 1.0 - cdf[-1]
        return p

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths drawn from `rng`, as int64; the same distribution that `pmf` describes."""
        lo, hi = self.lower(), self.upper()
        if self.distribution == "fixed":
            return np.full(n, lo, dtype=np.int64)
        if self.distribution == "uniform":
            return rng.integers(lo, hi + 1, size=n, dtype=np.int64)
        assert self.sigma is not None
        return np.clip(np.rint(rng.lognormal(self._mu, self.sigma, size=n)), lo, hi).astype(np.int64)


@dataclass(frozen=True)
class Bucket:
    """A shape bucket: decode steps at `batch` sequences whose longest context is in (ctx_lo, ctx_hi]."""

    batch: int
    ctx_lo: int
    ctx_hi: int
    weight: float  # fraction of all decode steps this bucket serves

    @property
    def id(self) -> str:
        """Stable id, e.g. "b8-ctx1024-2048"; the registry and plans key on it."""
        return f"b{self.batch}-ctx{self.ctx_lo}-{self.ctx_hi}"

    @property
    def ctx(self) -> int:
        """The context the graph is specialized for: the bucket's upper edge."""
        return self.ctx_hi


@dataclass(frozen=True)
class Request:
    """One synthetic request."""

    prompt_len: int
    output_len: int
    prefix_hit: bool


@dataclass(frozen=True)
class TrafficShape:
    """A traffic shape: batch mix, prompt and output length distributions, prefix-cache hit rate.

    Construct with `load(path)`, `from_dict(data)` or `single(batch, ctx)`; invalid values raise
    TrafficError (a UserError) naming the file and the TOML field. `source` is where it was read from,
    kept for messages and not compared.
    """

    name: str
    batch_sizes: tuple[int, ...]
    batch_weights: tuple[float, ...]
    prompt: LengthDistribution
    output: LengthDistribution
    prefix_hit_rate: float = 0.0
    context_edges: tuple[int, ...] | None = None
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        object.__setattr__(self, "batch_weights", tuple(self.batch_weights))
        if self.context_edges is not None:
            object.__setattr__(self, "context_edges", tuple(self.context_edges))
        if not isinstance(self.name, str) or not self.name.strip():
            raise self._error("name", f"is {self.name!r}; expected a non-empty string")
        self._check_batch()
        if not (0.0 <= self.prefix_hit_rate <= 1.0):
            raise self._error(
                "prefix_cache.hit_rate", f"is {self.prefix_hit_rate}; expected a number in [0, 1]"
            )
        if self.output.upper() < 2:
            raise self._error(
                "output",
                "gives every request 1 token, which leaves no decode step to bucket; "
                "expected output lengths of 2 tokens or more",
            )
        edges = self.context_edges
        if edges is not None:
            if not edges:
                raise self._error(
                    "buckets.context_edges", "is empty; expected increasing token counts, or omit it"
                )
            if any(_bad_int(e) or e < 1 for e in edges):
                raise self._error("buckets.context_edges", f"is {list(edges)}; expected positive integers")
            if any(b <= a for a, b in itertools.pairwise(edges)):
                raise self._error(
                    "buckets.context_edges", f"is {list(edges)}; expected strictly increasing edges"
                )

    def _check_batch(self) -> None:
        sizes, weights = self.batch_sizes, self.batch_weights
        if not sizes:
            raise self._error("batch.sizes", "is empty; expected at least one batch size")
        if any(_bad_int(s) or s < 1 for s in sizes):
            raise self._error("batch.sizes", f"is {list(sizes)}; expected positive integers")
        if len(set(sizes)) != len(sizes):
            raise self._error("batch.sizes", f"is {list(sizes)}; expected each batch size once")
        if len(weights) != len(sizes):
            raise self._error(
                "batch.weights",
                f"has {len(weights)} entries for {len(sizes)} sizes; expected one weight per size",
            )
        if any(not math.isfinite(w) or w < 0 for w in weights):
            raise self._error("batch.weights", f"is {list(weights)}; expected numbers >= 0")
        total = math.fsum(weights)
        if abs(total - 1.0) > WEIGHT_TOLERANCE:
            raise self._error("batch.weights", f"sums to {total:.9g}; expected weights that sum to 1")

    def _error(self, field: str, problem: str) -> TrafficError:
        return TrafficError(field, problem, self.source)

    # ---- reading and writing ------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> TrafficShape:
        """Read a traffic-shape TOML file from any path. A missing `name` defaults to the file's stem."""
        path = Path(path)
        if not path.is_file():
            raise UserError(
                f"traffic shape file {path} not found; pass the path of a TOML file "
                "such as examples/traffic/chat.toml"
            )
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"traffic shape {path}: not valid TOML ({e}); fix the file's syntax") from None
        except RecursionError:
            raise UserError(f"traffic shape {path}: TOML nested too deeply to be a traffic shape") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> TrafficShape:
        """Build from the TOML structure (as `tomllib` returns it); `source` names the file in errors."""
        try:
            return cls._from_dict(data, source)
        except TrafficError as e:
            if e.source is not None:
                raise
            raise TrafficError(e.field, e.problem, source) from None

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], source: str | None) -> TrafficShape:
        for key in data:
            if key not in _TOP_KEYS:
                raise TrafficError(
                    key, f"is not a traffic-shape field; expected: {', '.join(sorted(_TOP_KEYS))}"
                )
        tables = {key: _table(data, key) for key in ("batch", "prompt", "output", "prefix_cache", "buckets")}
        for key, allowed in _SECTION_KEYS.items():
            for sub in tables[key] or {}:
                if sub not in allowed:
                    raise TrafficError(
                        f"{key}.{sub}", f"is not a field of [{key}]; expected: {', '.join(sorted(allowed))}"
                    )
        name = data.get("name", Path(source).stem if source else None)
        if name is None:
            raise TrafficError("name", 'is missing; expected a name such as "chat"')
        batch = tables["batch"]
        if batch is None:
            raise TrafficError("batch", "is missing; expected a [batch] table with sizes and weights")
        for key in ("sizes", "weights"):
            if key not in batch:
                raise TrafficError(f"batch.{key}", "is missing; expected a list, one entry per batch size")
        dists = {}
        for key in ("prompt", "output"):
            table = tables[key]
            if table is None:
                raise TrafficError(key, f"is missing; expected a [{key}] table with a distribution")
            try:
                dists[key] = LengthDistribution.from_dict(table)
            except TrafficError as e:
                raise TrafficError(f"{key}.{e.field}", e.problem, source) from None
        hit_rate = (
            0.0
            if tables["prefix_cache"] is None
            else _opt_float(tables["prefix_cache"], "hit_rate", "prefix_cache.")
        )
        edges = None if tables["buckets"] is None else tables["buckets"].get("context_edges")
        return cls(
            name=name,
            batch_sizes=_int_list(batch["sizes"], "batch.sizes"),
            batch_weights=_float_list(batch["weights"], "batch.weights"),
            prompt=dists["prompt"],
            output=dists["output"],
            prefix_hit_rate=0.0 if hit_rate is None else hit_rate,
            context_edges=None if edges is None else _int_list(edges, "buckets.context_edges"),
            source=source,
        )

    def to_dict(self) -> dict[str, Any]:
        """The TOML structure; `from_dict(shape.to_dict()) == shape`."""
        out: dict[str, Any] = {
            "name": self.name,
            "batch": {"sizes": list(self.batch_sizes), "weights": list(self.batch_weights)},
            "prompt": self.prompt.to_dict(),
            "output": self.output.to_dict(),
            "prefix_cache": {"hit_rate": self.prefix_hit_rate},
        }
        if self.context_edges is not None:
            out["buckets"] = {"context_edges": list(self.context_edges)}
        return out

    def to_toml(self) -> str:
        """TOML text that `load` reads back to an equal shape."""
        data = self.to_dict()
        lines = [f"name = {_toml_value(data.pop('name'))}"]
        for table, values in data.items():
            lines.append(f"\n[{table}]")
            lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        return "\n".join(lines) + "\n"

    @classmethod
    def single(cls, batch: int, ctx: int) -> TrafficShape:
        """One bucket, batch `batch` at context `ctx` (the CLI's `--batch N --ctx N`).

        Built as prompt ctx - 1 and output 2 (one decode step, at context ctx), with edges that make the
        bucket (largest power of two below ctx, ctx], so `--ctx 1024` gives the id "b1-ctx512-1024" that a
        traffic file with default edges gives too.
        """
        if _bad_int(batch) or batch < 1:
            raise UserError(f"--batch {batch} is not valid; expected an integer >= 1")
        if _bad_int(ctx) or not (2 <= ctx <= MAX_TOKENS):
            raise UserError(f"--ctx {ctx} is not valid; expected an integer in [2, {MAX_TOKENS}]")
        below = 1 << ((ctx - 1).bit_length() - 1)
        return cls(
            name=f"b{batch}-ctx{ctx}",
            batch_sizes=(batch,),
            batch_weights=(1.0,),
            prompt=LengthDistribution.fixed(ctx - 1),
            output=LengthDistribution.fixed(2),
            context_edges=(below, ctx),
        )

    # ---- derived views ------------------------------------------------------------------------------

    @property
    def max_context(self) -> int:
        """The longest context any decode step reaches: the KV capacity one sequence needs."""
        return self.prompt.upper() + self.output.upper() - 1

    def decode_context_pmf(self) -> np.ndarray:
        """f[c] = fraction of decode steps (of one sequence) whose context is c, for c in [0, max_context]."""
        p = self.prompt.pmf()
        tail = np.cumsum(self.output.pmf()[::-1])[::-1]  # tail[k] = P(output >= k)
        # steps[j] = P(a request has a decode step j) = P(output >= j + 1), for j >= 1
        steps = np.zeros(len(tail) - 1)
        steps[1:] = tail[2:]
        counts = _convolve(p, steps)[: self.max_context + 1]
        return counts / counts.sum()

    def buckets(self, min_weight: float = 0.0) -> list[Bucket]:
        """The shape buckets, ordered by batch then context, weights summing to 1.

        Buckets of weight 0 are dropped; so are those below `min_weight` (then the rest renormalize).
        """
        cdf = np.cumsum(self.decode_context_pmf())
        cdf /= cdf[-1]
        last = len(cdf) - 1
        found = []
        for batch, batch_weight in sorted(zip(self.batch_sizes, self.batch_weights, strict=True)):
            for lo, hi in self._context_ranges():
                share = cdf[min(hi, last)] ** batch - (cdf[min(lo, last)] ** batch if lo > 0 else 0.0)
                weight = batch_weight * float(share)
                if weight > 0.0 and weight >= min_weight:
                    found.append(Bucket(batch, lo, hi, weight))
        if not found:
            raise UserError(
                f"traffic shape {self.name}: no bucket has weight >= {min_weight}; lower min_weight"
            )
        total = math.fsum(b.weight for b in found)
        return [Bucket(b.batch, b.ctx_lo, b.ctx_hi, b.weight / total) for b in found]

    def prefill_buckets(self) -> list[Bucket]:
        """Prefill buckets: one prompt per step (batch 1), by prompt length in the same context ranges
        as the decode buckets, each at most the longest prompt; weights are the fraction of prefills
        (of requests) whose prompt falls in the range, summing to 1. Prefix-cache hits are not taken
        off the prompt: a hit still runs its prefill here (the cached tokens' attention is not free)."""
        pmf = self.prompt.pmf()
        cdf = np.cumsum(pmf) / pmf.sum()
        last, top = len(cdf) - 1, self.prompt.upper()
        found = []
        for lo, hi in self._context_ranges():
            if lo >= top:
                break
            share = float(cdf[min(hi, last)] - (cdf[min(lo, last)] if lo > 0 else 0.0))
            if share > 0.0:
                found.append(Bucket(1, lo, min(hi, top), share))
        total = math.fsum(b.weight for b in found)
        return [Bucket(b.batch, b.ctx_lo, b.ctx_hi, b.weight / total) for b in found]

    def _context_ranges(self) -> list[tuple[int, int]]:
        top = self.max_context
        if self.context_edges is None:
            edges = [MIN_DEFAULT_EDGE]
            while edges[-1] < top:
                edges.append(edges[-1] * 2)
        else:
            edges = list(self.context_edges)
            if edges[-1] < top:
                edges.append(top)
        return list(zip([0, *edges[:-1]], edges, strict=True))

    def sample_requests(self, n: int, seed: int) -> list[Request]:
        """n synthetic requests, drawn with `numpy.random.default_rng(seed)`: same seed, same list."""
        if _bad_int(n) or n < 0:
            raise UserError(f"cannot sample {n!r} requests; expected a count >= 0")
        rng = np.random.default_rng(seed)
        prompts = self.prompt.sample(rng, n)
        outputs = self.output.sample(rng, n)
        hits = rng.random(n) < self.prefix_hit_rate
        return [Request(int(p), int(o), bool(h)) for p, o, h in zip(prompts, outputs, hits, strict=True)]


# ---- parsing helpers --------------------------------------------------------------------------------


def _bad_int(x: object) -> bool:
    return isinstance(x, bool) or not isinstance(x, (int, np.integer))


def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise TrafficError(key, f"is {value!r}; expected a [{key}] table")
    return value


def _as_int(x: object, where: str) -> int:
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if _bad_int(x):
        raise TrafficError(where, f"is {x!r}; expected an integer")
    return int(x)  # type: ignore[call-overload]


def _as_float(x: object, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TrafficError(where, f"is {x!r}; expected a number")
    return float(x)


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    return None if data.get(key) is None else _as_int(data[key], key)


def _opt_float(data: Mapping[str, Any], key: str, prefix: str = "") -> float | None:
    return None if data.get(key) is None else _as_float(data[key], prefix + key)


def _int_list(x: object, where: str) -> tuple[int, ...]:
    if not isinstance(x, (list, tuple)):
        raise TrafficError(where, f"is {x!r}; expected a list of integers")
    return tuple(_as_int(v, where) for v in x)


def _float_list(x: object, where: str) -> tuple[float, ...]:
    if not isinstance(x, (list, tuple)):
        raise TrafficError(where, f"is {x!r}; expected a list of numbers")
    return tuple(_as_float(v, where) for v in x)


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


# ---- numerics ----------------------------------------------------------------------------------------

_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def _erf(z: np.ndarray) -> np.ndarray:
    return _erf_scalar(z).astype(np.float64)


def _convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Full linear convolution of two non-negative arrays; exact (direct) unless that would be slow."""
    if len(a) * len(b) <= _DIRECT_CONVOLVE_LIMIT:
        return np.convolve(a, b)
    size = len(a) + len(b) - 1
    n = 1 << (size - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(a, n) * np.fft.rfft(b, n), n)[:size]
    out[out < 1e-12 * out.max()] = 0.0  # FFT round-off is ~1e-16 of the peak: not real probability mass
    return out
