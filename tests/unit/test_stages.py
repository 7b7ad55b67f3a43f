"""The compile stages (polymorph/pipeline/stages.py): one ordered table for every backend, each stage
run once per compile (verify, specialize and the profile load once each), each stage's product
dumpable with --stages DIR, dce in the real path, and prefill buckets from the CLI."""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polymorph import api
from polymorph.hardware import profile as hw_profile
from polymorph.ir import serialize
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.spec import verify
from polymorph.models import load_model
from polymorph.models.zoo import zoo_names
from polymorph.passes import dce as dce_module
from polymorph.passes import fuse as fuse_module
from polymorph.passes import specialize as specialize_module
from polymorph.pipeline.stages import STAGE_NAMES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traffic"


class Walk:
    """Counts calls of the functions whose repetition the issue named, by code object (a name bound
    with `from x import f` is the same function, so every caller is seen)."""

    def __init__(self) -> None:
        self.codes = {
            verify.__code__: "verify",
            sys.modules[specialize_module.__module__].specialize.__code__: "specialize",
            sys.modules[dce_module.__module__].dce.__code__: "dce",
            sys.modules[fuse_module.__module__].fuse.__code__: "fuse",
            hw_profile.load_profile.__code__: "load_profile",
            hw_profile._parse_profile.__code__: "parse_profile",
        }
        self.count: collections.Counter[str] = collections.Counter()

    def __call__(self, frame, event, arg):  # sys.setprofile calls it with these
        if event == "call" and frame.f_code in self.codes:
            self.count[self.codes[frame.f_code]] += 1


@pytest.fixture
def walk() -> Iterator[Walk]:
    w = Walk()
    sys.setprofile(w)
    try:
        yield w
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize(
    ("model", "backend", "target", "options"),
    [
        ("llama-3.2-1b", "cpu", "cpu", {"batch": 4}),
        ("llama-tiny", "rocm", "mi355x", {"batch": 32}),
        ("moe-tiny", "cuda", "h200", {"prefill": 64}),
    ],
    ids=["llama-1b-cpu", "llama-tiny-mi355x", "moe-tiny-h200-prefill"],
)
def test_a_compile_runs_each_stage_once(
    walk: Walk, tmp_path: Path, model: str, backend: str, target: str, options: dict
) -> None:
    """From the model's name to report.json on disk: the graph is verified once, specialized once, dce'd
    and fused once, and the profile is read from its file once."""
    dtype = "f32" if backend == "cpu" else "bf16"
    artifact = api.compile(load_model(model, dtype=dtype), backend, target, tmp_path / "out", **options)
    sys.setprofile(None)
    assert dict(walk.count) == {
        "verify": 1,
        "specialize": 1,
        "dce": 1,
        "fuse": 1,
        "load_profile": 1,
        "parse_profile": 1,
    }
    assert (tmp_path / "out" / "report.json").exists()
    assert artifact.plan.lowered_profile is not None and artifact.plan.lowered_profile.id == target


def test_stages_are_dumped_in_order_and_the_plan_is_the_one_written(tmp_path: Path) -> None:
    out, stages = tmp_path / "out", tmp_path / "stages"
    api.compile("llama-tiny", "cpu", out=out, batch=2, ctx=64, stages=stages)
    names = sorted(p.name for p in stages.iterdir() if p.name[:2].isdigit())
    assert [n.split(".")[0] for n in names if n.count(".") == 1] == [
        f"{i:02d}-{s}" for i, s in enumerate(STAGE_NAMES)
    ]
    assert json.loads((stages / "04-plan.json").read_text()) == json.loads((out / "plan.json").read_text())
    assert json.loads((stages / "06-report.json").read_text()) == json.loads(
        (out / "report.json").read_text()
    )
    specialized = serialize.load(stages / "02-specialized.json")
    assert specialized.symbols() == set()  # every dim bound at the bucket
    assert serialize.load(stages / "01-verified.json").symbols() >= {"batch", "ctx_blocks"}
    groups = json.loads((stages / "03-fused.json").read_text())
    assert [g["id"] for g in groups] == [
        g["id"] for g in json.loads((out / "plan.json").read_text())["groups"]
    ]


def test_dce_runs_in_the_real_path(tmp_path: Path) -> None:
    """A node whose value reaches no output and a param only it reads are gone from the plan."""
    b = GraphBuilder("with-dead-code")
    x = b.input("x", DType.F32, (4, 8))
    w = b.param("w", DType.F32, (8, 8))
    dead_w = b.param("dead_w", DType.F32, (8, 8))
    y = b.op("matmul", "live", x, w)
    b.op("matmul", "dead", x, dead_w)
    b.output("y", y)
    path = tmp_path / "g.json"
    serialize.save(b.build(), path)
    plan = api.compile(str(path), "cpu").plan
    assert [n.name for n in plan.graph.nodes] == ["live"]
    assert set(plan.graph.params) == {"w"}


@pytest.mark.parametrize("name", zoo_names())
def test_every_zoo_graph_verifies(name: str) -> None:
    """The model builders leave verification to the compile stages; the graphs they build verify."""
    verify(load_model(name).graph)


def test_prefill_from_the_cli_binds_the_prompt_length(tmp_path: Path) -> None:
    from polymorph.cli.command import main

    assert (
        main(["compile", "llama-tiny", "--prefill", "48", "--batch", "2", "--out", str(tmp_path / "o")]) == 0
    )
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["bindings"]["seq"] == 48 and plan["bindings"]["batch"] == 2


def test_a_traffic_file_gives_its_heaviest_prompt_bucket() -> None:
    bucket = api.pick_bucket(None, None, EXAMPLES / "chat.toml", phase="prefill")
    assert (bucket.batch, bucket.seq, bucket.ctx) == (1, 2048, 2048)  # (512, 2048] holds ~73% of prompts


@pytest.mark.parametrize(
    ("argv", "fault"),
    [
        (["--prefill", "0"], "--prefill"),
        (["--prefill", "64", "--ctx", "32"], "--ctx"),
        (["--prefill", "64", "--traffic", str(EXAMPLES / "chat.toml")], "not both"),
        (["--phase", "prefill"], "--traffic"),
    ],
)
def test_bad_prefill_requests_are_one_line_and_exit_2(
    argv: list[str], fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from polymorph.cli.command import main

    assert main(["compile", "llama-tiny", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fault in err and "\n" not in err
