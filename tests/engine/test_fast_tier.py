"""The fast tier's few-layer engine: a model with more layers than FAST_LAYERS gets a second, small
engine on the same weights; fast-tier timing of a group it has runs there, of one it lacks in the full
engine; a swap reaches both, and a reset restores both."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from polymorph.engine.controller import Controller
from polymorph.engine.worker import FAST_LAYERS
from polymorph.kernel_files import kernels_root
from polymorph.models import Model, load_model
from polymorph.models.checkpoint import save_checkpoint
from polymorph.models.decoder import build_decoder

LAYERS = FAST_LAYERS + 2


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("llama-4l")
    tiny = load_model("llama-tiny")
    cfg = dataclasses.replace(tiny.config, num_hidden_layers=LAYERS)
    deep = Model(name="llama-4l", graph=build_decoder(cfg, name="llama-4l"), source="llama-4l", config=cfg)
    save_checkpoint(folder, deep.weights())
    with resources.as_file(resources.files("polymorph.models") / "configs" / "llama-tiny.json") as p:
        config = json.loads(Path(p).read_text())
    config["num_hidden_layers"] = LAYERS
    (folder / "config.json").write_text(json.dumps(config))
    e = Controller.start(str(folder), "cpu", batch=1, ctx=64)
    yield e
    e.close()


def test_fast_tier_times_the_few_layer_engine_where_it_has_the_group(engine: Controller) -> None:
    assert engine.loaded["fast_tier"] == f"{FAST_LAYERS}-layer engine"
    near = engine.measure("fast", trials=3, group="layers.0.mlp.down+residual")
    far = engine.measure("fast", trials=3, group=f"layers.{LAYERS - 1}.mlp.down+residual")
    assert near["engine"] == f"{FAST_LAYERS}-layer engine" and far["engine"] == "full engine"
    assert near["groups"]["layers.0.mlp.down+residual"]["median_s"] > 0


def test_a_swap_reaches_both_engines_and_reset_restores_them(engine: Controller, tmp_path: Path) -> None:
    group = "layers.0.mlp.down+residual"
    src = tmp_path / "linear_residual_copy.py"
    shutil.copy(kernels_root() / "torch" / "linear_residual.py", src)
    swap, report = engine.try_candidate(group, src, None)
    assert swap.ok and report is not None and report.ok, report and [g for g in report.gates if not g.ok]
    assert report.measurement is not None and report.measurement["median_s"] > 0
    assert engine.reset() == [group]
    assert not engine.status()["groups"][group]["candidate"]
    assert engine.measure("fast", trials=3, group=group)["engine"] == f"{FAST_LAYERS}-layer engine"


def test_the_fast_engine_runs_the_swapped_candidate(engine: Controller, tmp_path: Path) -> None:
    """A candidate that sleeps 5 ms a launch shows its 5 ms in the fast tier: the few-layer engine
    runs the candidate, not its stock kernel."""
    group = "layers.1.mlp.down+residual"
    text = (kernels_root() / "torch" / "linear_residual.py").read_text()
    slow = text.replace("    def launch(inputs, outputs, scratch):\n",
                        "    def launch(inputs, outputs, scratch):\n        __import__('time').sleep(0.005)\n")  # fmt: skip
    assert slow != text
    src = tmp_path / "sleepy.py"
    src.write_text(slow)
    assert engine.swap(group, src, None).ok
    timed = engine.measure("fast", trials=3, group=group)
    assert timed["engine"] == f"{FAST_LAYERS}-layer engine"
    assert timed["groups"][group]["median_s"] >= 0.005
    engine.restore(group)
    assert engine.measure("fast", trials=3, group=group)["groups"][group]["median_s"] < 0.005


def test_no_two_timed_calls_in_a_row_see_the_same_inputs(engine: Controller, tmp_path: Path) -> None:
    """The fast tier rotates its timed calls over input sets of other content: a kernel that keeps its
    last answer for the same input gains nothing. The candidate logs a fingerprint of its activation
    input at every call."""
    log = tmp_path / "calls.txt"
    source = (kernels_root() / "torch" / "linear_residual.py").read_text()
    path = tmp_path / "logging_candidate.py"
    path.write_text(
        source
        + f"""

_build = build


def build(spec, config, target):
    launch = _build(spec, config, target)
    x_i, _ = spec.args(spec.node("linear"))

    def logged(inputs, outputs, scratch):
        with open({str(log)!r}, "a") as f:
            f.write(f"{{float(inputs[x_i].double().sum())!r}}\\n")
        return launch(inputs, outputs, scratch)

    return logged
"""
    )
    group = "layers.0.mlp.down+residual"
    assert engine.swap(group, path).ok
    log.unlink(missing_ok=True)
    engine.measure("fast", 12, group)
    sums = log.read_text().split()
    assert len(sums) >= 12
    assert all(a != b for a, b in itertools.pairwise(sums)), sums
    engine.restore(group)
