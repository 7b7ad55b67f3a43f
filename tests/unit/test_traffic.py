"""polymorph.serving.traffic: the traffic-shape format, its validation, buckets and synthetic requests."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.serving.traffic import Bucket, LengthDistribution, Request, TrafficError, TrafficShape

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traffic"


def chat_dict() -> dict[str, Any]:
    return {
        "name": "chat",
        "batch": {"sizes": [1, 8, 32], "weights": [0.5, 0.3, 0.2]},
        "prompt": {"distribution": "lognormal", "mean": 1024, "sigma": 0.6, "max": 8192},
        "output": {"distribution": "fixed", "value": 256},
        "prefix_cache": {"hit_rate": 0.3},
        "buckets": {"context_edges": [512, 2048, 8192]},
    }


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shape.toml"
    path.write_text(text)
    return path


# ---- loading and round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["chat.toml", "decode-b1-1k.toml"])
def test_examples_load_and_round_trip(name: str) -> None:
    shape = TrafficShape.load(EXAMPLES / name)
    assert shape.source == str(EXAMPLES / name)
    assert TrafficShape.from_dict(shape.to_dict()) == shape


def test_chat_example_matches_its_description() -> None:
    shape = TrafficShape.load(EXAMPLES / "chat.toml")
    assert shape == TrafficShape.from_dict(chat_dict())
    assert shape.batch_sizes == (1, 8, 32)
    assert shape.prompt == LengthDistribution.lognormal(1024.0, 0.6, hi=8192)
    assert shape.output == LengthDistribution.fixed(256)
    assert shape.prefix_hit_rate == 0.3
    assert shape.context_edges == (512, 2048, 8192)


def test_decode_example_is_one_bucket() -> None:
    shape = TrafficShape.load(EXAMPLES / "decode-b1-1k.toml")
    # decode steps have contexts 1025..1151: all in (1024, 2048]
    assert shape.buckets() == [Bucket(1, 1024, 2048, 1.0)]
    assert shape.max_context == 1024 + 128 - 1


def test_toml_text_round_trip(tmp_path: Path) -> None:
    for shape in (
        TrafficShape.from_dict(chat_dict()),
        TrafficShape.single(4, 3000),
        TrafficShape(
            "u",
            (2, 16),
            (0.25, 0.75),
            LengthDistribution.uniform(10, 900),
            LengthDistribution.lognormal(200.0, 1.1, lo=4),
        ),
    ):
        loaded = TrafficShape.load(write(tmp_path, shape.to_toml()))
        assert loaded == shape
        assert loaded.to_dict() == shape.to_dict()


def test_loader_accepts_any_path_and_defaults_name_to_stem(tmp_path: Path) -> None:
    data = chat_dict()
    del data["name"]
    path = tmp_path / "nested" / "my-shape.toml"
    path.parent.mkdir()
    path.write_text(TrafficShape.from_dict(data | {"name": "x"}).to_toml().replace('name = "x"\n', ""))
    assert TrafficShape.load(str(path)).name == "my-shape"


def test_missing_file_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        TrafficShape.load(tmp_path / "nope.toml")


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "name = \n")
    with pytest.raises(UserError, match="not valid TOML") as err:
        TrafficShape.load(path)
    assert str(path) in str(err.value)


# ---- validation ------------------------------------------------------------------------------------

BAD_FILES = [
    ("[batch]\nweights = [1.0]\n", "batch.sizes"),
    ("[batch]\nsizes = [1, 8]\nweights = [0.5, 0.4]\n", "batch.weights"),
    ("[batch]\nsizes = [1, 8]\nweights = [1.0]\n", "batch.weights"),
    ("[batch]\nsizes = [0, 8]\nweights = [0.5, 0.5]\n", "batch.sizes"),
    ("[batch]\nsizes = [-4]\nweights = [1.0]\n", "batch.sizes"),
    ("[batch]\nsizes = [8, 8]\nweights = [0.5, 0.5]\n", "batch.sizes"),
    ("[batch]\nsizes = [1.5]\nweights = [1.0]\n", "batch.sizes"),
    ("[batch]\nsizes = [1, 2]\nweights = [1.5, -0.5]\n", "batch.weights"),
    ('[prompt]\ndistribution = "gamma"\nmean = 3\n', "prompt.distribution"),
    ('[prompt]\ndistribution = "lognormal"\nmean = 1024\n', "prompt.sigma"),
    ('[prompt]\ndistribution = "lognormal"\nmean = 1024\nsigma = -1\n', "prompt.sigma"),
    ('[prompt]\ndistribution = "lognormal"\nmean = 0\nsigma = 1\n', "prompt.mean"),
    ('[prompt]\ndistribution = "lognormal"\nmean = 10\nsigma = 1\nsigam = 1\n', "prompt.sigam"),
    ('[prompt]\ndistribution = "uniform"\nmin = 10\n', "prompt.max"),
    ('[prompt]\ndistribution = "uniform"\nmin = 10\nmax = 5\n', "prompt.max"),
    ('[prompt]\ndistribution = "fixed"\nvalue = 0\n', "prompt.value"),
    ('[prompt]\ndistribution = "fixed"\nvalue = "long"\n', "prompt.value"),
    ('[prompt]\ndistribution = "fixed"\nvalue = 8\nsigma = 1\n', "prompt.sigma"),
    ("[prompt]\nvalue = 8\n", "prompt.distribution"),
    ('[output]\ndistribution = "fixed"\nvalue = 1\n', "output"),
    ("[prefix_cache]\nhit_rate = 1.5\n", "prefix_cache.hit_rate"),
    ("[prefix_cache]\nhit_rate = -0.1\n", "prefix_cache.hit_rate"),
    ('[prefix_cache]\nhit_rate = "high"\n', "prefix_cache.hit_rate"),
    ("[buckets]\ncontext_edges = [2048, 512]\n", "buckets.context_edges"),
    ("[buckets]\ncontext_edges = [0, 512]\n", "buckets.context_edges"),
    ("[buckets]\ncontext_edges = []\n", "buckets.context_edges"),
    ("[buckets]\nedges = [512]\n", "buckets.edges"),
]


def _override(base: dict[str, Any], patch_toml: str) -> str:
    """`base` as TOML text, with the tables in `patch_toml` replacing its own; written unchecked."""
    data = base | tomllib.loads(patch_toml)

    def value(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"name = {value(data['name'])}"]
    for table, fields in data.items():
        if table != "name":
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {value(v)}" for k, v in fields.items())
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("patch", "field"), BAD_FILES, ids=[f for _, f in BAD_FILES])
def test_bad_file_names_file_and_field(tmp_path: Path, patch: str, field: str) -> None:
    path = write(tmp_path, _override(chat_dict(), patch))
    with pytest.raises(UserError) as err:
        TrafficShape.load(path)
    message = str(err.value)
    assert f"`{field}`" in message
    assert str(path) in message
    assert "expected" in message
    assert "\n" not in message
    assert isinstance(err.value, TrafficError) and err.value.field == field


@pytest.mark.parametrize("table", ["batch", "prompt", "output"])
def test_missing_required_table(table: str) -> None:
    data = chat_dict()
    del data[table]
    with pytest.raises(TrafficError, match=f"`{table}` is missing"):
        TrafficShape.from_dict(data)


def test_unknown_top_level_field() -> None:
    with pytest.raises(TrafficError, match="`promt`"):
        TrafficShape.from_dict(chat_dict() | {"promt": {}})


def test_weights_within_tolerance_accepted() -> None:
    data = chat_dict()
    data["batch"]["weights"] = [0.5, 0.3, 0.2 + 5e-7]
    assert TrafficShape.from_dict(data).batch_weights[2] == 0.2 + 5e-7


def test_optional_tables_default() -> None:
    data = chat_dict()
    del data["prefix_cache"], data["buckets"]
    shape = TrafficShape.from_dict(data)
    assert shape.prefix_hit_rate == 0.0
    assert shape.context_edges is None
    assert TrafficShape.from_dict(shape.to_dict()) == shape


# ---- buckets ---------------------------------------------------------------------------------------


def test_chat_buckets() -> None:
    shape = TrafficShape.from_dict(chat_dict())
    buckets = shape.buckets()
    assert math.isclose(sum(b.weight for b in buckets), 1.0, abs_tol=1e-12)
    assert all(b.weight > 0 for b in buckets)
    assert [b.id for b in buckets if b.batch == 8][:3] == ["b8-ctx0-512", "b8-ctx512-2048", "b8-ctx2048-8192"]
    # contexts beyond the last edge get one more bucket ending at the longest context
    assert buckets[-1].ctx_hi == shape.max_context == 8192 + 256 - 1
    # each batch size keeps its share of steps
    for size, weight in zip(shape.batch_sizes, shape.batch_weights, strict=True):
        share = sum(b.weight for b in buckets if b.batch == size)
        assert math.isclose(share, weight, rel_tol=1e-9)

    # a larger batch is specialized for its longest sequence: its weight moves to longer contexts
    def mean_ctx(size: int) -> float:
        own = [b for b in buckets if b.batch == size]
        return sum(b.ctx_hi * b.weight for b in own) / sum(b.weight for b in own)

    assert mean_ctx(1) < mean_ctx(8) < mean_ctx(32)


def test_default_edges_are_powers_of_two() -> None:
    data = chat_dict()
    del data["buckets"]
    buckets = TrafficShape.from_dict(data).buckets()
    for b in buckets:
        assert b.ctx_hi & (b.ctx_hi - 1) == 0
        assert b.ctx_lo in (0, b.ctx_hi // 2)
        assert b.ctx == b.ctx_hi
    assert max(b.ctx_hi for b in buckets) == 16384
    assert math.isclose(sum(b.weight for b in buckets), 1.0, abs_tol=1e-12)


def test_zero_weight_buckets_dropped() -> None:
    shape = TrafficShape(
        "t",
        (1, 4, 8),
        (0.0, 0.5, 0.5),
        LengthDistribution.uniform(100, 200),
        LengthDistribution.fixed(50),
    )
    buckets = shape.buckets()
    # contexts 101..249: buckets (64,128], (128,256]; batch 1 has weight 0
    assert {b.batch for b in buckets} == {4, 8}
    assert {(b.ctx_lo, b.ctx_hi) for b in buckets} == {(64, 128), (128, 256)}
    assert math.isclose(sum(b.weight for b in buckets), 1.0)


def test_min_weight_drops_and_renormalizes() -> None:
    shape = TrafficShape.from_dict(chat_dict())
    kept = shape.buckets(min_weight=0.01)
    assert len(kept) < len(shape.buckets())
    assert math.isclose(sum(b.weight for b in kept), 1.0, abs_tol=1e-12)


def test_bucket_weights_match_sampled_steps() -> None:
    shape = TrafficShape(
        "t",
        (1,),
        (1.0,),
        LengthDistribution.lognormal(600.0, 0.5, hi=4000),
        LengthDistribution.uniform(2, 200),
        context_edges=(256, 512, 1024, 2048),
    )
    reqs = shape.sample_requests(20_000, seed=3)
    contexts = np.concatenate([r.prompt_len + np.arange(1, r.output_len) for r in reqs])
    for b in shape.buckets():
        sampled = np.mean((contexts > b.ctx_lo) & (contexts <= b.ctx_hi))
        assert abs(sampled - b.weight) < 0.01, b


def test_bucket_id_and_frozen() -> None:
    b = Bucket(8, 1024, 2048, 0.25)
    assert b.id == "b8-ctx1024-2048"
    with pytest.raises(AttributeError):
        b.batch = 2  # type: ignore[misc]


# ---- single ----------------------------------------------------------------------------------------


def test_single() -> None:
    shape = TrafficShape.single(8, 1024)
    assert shape.buckets() == [Bucket(8, 512, 1024, 1.0)]
    assert shape.buckets()[0].id == "b8-ctx512-1024"
    assert shape.buckets()[0].ctx == 1024
    assert shape.max_context == 1024


def test_single_non_power_of_two() -> None:
    [bucket] = TrafficShape.single(1, 1000).buckets()
    assert (bucket.batch, bucket.ctx_lo, bucket.ctx_hi, bucket.weight) == (1, 512, 1000, 1.0)


@pytest.mark.parametrize(
    ("batch", "ctx", "flag"), [(0, 1024, "--batch"), (1, 1, "--ctx"), (2, 10**9, "--ctx")]
)
def test_single_rejects_bad_flags(batch: int, ctx: int, flag: str) -> None:
    with pytest.raises(UserError, match=flag):
        TrafficShape.single(batch, ctx)


# ---- requests --------------------------------------------------------------------------------------


def test_sample_requests_deterministic() -> None:
    shape = TrafficShape.from_dict(chat_dict())
    a = shape.sample_requests(500, seed=42)
    assert a == shape.sample_requests(500, seed=42)
    assert a != shape.sample_requests(500, seed=43)
    assert len(a) == 500 and all(isinstance(r, Request) for r in a)
    assert all(1 <= r.prompt_len <= 8192 and r.output_len == 256 for r in a)
    assert all(type(r.prompt_len) is int and type(r.prefix_hit) is bool for r in a)
    hits = sum(r.prefix_hit for r in a) / len(a)
    assert 0.2 < hits < 0.4
    mean_prompt = sum(r.prompt_len for r in a) / len(a)
    assert 900 < mean_prompt < 1150


def test_sample_requests_edge_cases() -> None:
    shape = TrafficShape.single(1, 64)
    assert shape.sample_requests(0, seed=0) == []
    assert shape.sample_requests(2, seed=0) == [Request(63, 2, False)] * 2
    with pytest.raises(UserError):
        shape.sample_requests(-1, seed=0)


def test_uniform_samples_stay_in_range() -> None:
    dist = LengthDistribution.uniform(5, 9)
    values = dist.sample(np.random.default_rng(0), 2000)
    assert set(values.tolist()) == {5, 6, 7, 8, 9}
    assert np.allclose(dist.pmf()[5:10], 0.2)


def test_lognormal_pmf_sums_to_one_and_open_tail_is_bounded() -> None:
    dist = LengthDistribution.lognormal(100.0, 1.0)
    pmf = dist.pmf()
    assert math.isclose(pmf.sum(), 1.0, abs_tol=1e-12)
    assert 100 < dist.upper() < 100 * math.exp(6)
    assert dist.sample(np.random.default_rng(1), 10_000).max() <= dist.upper()
