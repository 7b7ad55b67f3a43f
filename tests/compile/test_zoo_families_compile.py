"""The decode plans of the dense-family (issue #15), MoE-family (issue #16) and latent/sparse-attention
(issue #17) zoo entries compile for every GPU target without a GPU: device code for every kernel,
resources stated, nothing spilled; those of the MoE and latent families lower to HLO for trn2 that the
checker passes (weights as parameters, no custom calls or host callbacks).

Each plan is built over the shortest prefix of the model's layers that holds every kind of layer the
whole model has (its window and rope, e.g. Gemma 3's five local layers then a global one), so the
plan's set of distinct kernels (file, config, shapes) is the whole model's: the remaining layers repeat
them. A layer's kind is its window, chunk, rope (or none) and whether its feed-forward is dense or
routed experts. A whole-model compile of a 48-layer model takes a minute of Python here, most of it the same
kernels again; `test_prefix_has_every_layer_kind` shows the prefix stands for the whole.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from polymorph import api
from polymorph.models import load_model
from polymorph.models.config import ModelConfig

pytest.importorskip("triton")

MODELS = ["qwen3-8b", "gemma-3-12b", "mistral-small-24b", "phi-4-mini", "granite-3.3-8b",
          "gpt-oss-20b", "gpt-oss-120b", "glm-4.5-air", "olmoe-1b-7b", "minimax-m2", "llama-4-scout",
          "deepseek-v3", "kimi-k2", "deepseek-v3.2", "glm-5"]  # fmt: skip
HLO_MODELS = MODELS[5:]
TARGETS = [("cuda", "h200", "cuda:sm_90"), ("cuda", "b200", "cuda:sm_100"),
           ("rocm", "mi300x", "rocm:gfx942"), ("rocm", "mi355x", "rocm:gfx950")]  # fmt: skip


def layer_kind(cfg: ModelConfig, layer: int) -> tuple[int, int, str, bool, bool]:
    rope = repr(cfg.layer_rope(layer)) if cfg.layer_uses_rope(layer) else "none"
    shares = layer in cfg.indexer_shared_layers  # GLM-5 style: reuses the last indexer's choice
    return cfg.layer_window(layer), cfg.layer_chunk(layer), rope, cfg.layer_is_moe(layer), shares


def kinds_prefix(cfg: ModelConfig) -> int:
    """The fewest leading layers that hold every (window, rope) kind of the model."""
    every = {layer_kind(cfg, i) for i in range(cfg.num_hidden_layers)}
    seen: set[tuple[int, int, str, bool, bool]] = set()
    for i in range(cfg.num_hidden_layers):
        seen.add(layer_kind(cfg, i))
        if seen == every:
            return i + 1
    raise AssertionError("unreachable")


@pytest.fixture(scope="module", params=MODELS)
def prefix_model(request):
    model = load_model(request.param, dtype="bf16")
    n = kinds_prefix(model.config)
    return dataclasses.replace(model, graph=model.rebuild(num_layers=n)), n


def test_prefix_has_every_layer_kind() -> None:
    gemma = load_model("gemma-3-12b", dtype="bf16").config
    assert kinds_prefix(gemma) == 6  # five sliding-window layers, then a global one (its own rope)
    assert {layer_kind(gemma, i) for i in range(6)} == {layer_kind(gemma, i) for i in range(48)}
    assert layer_kind(gemma, 0) != layer_kind(gemma, 5)
    assert kinds_prefix(load_model("qwen3-8b", dtype="bf16").config) == 1


@pytest.mark.parametrize(("backend", "chip", "target"), TARGETS, ids=[t[2] for t in TARGETS])
def test_decode_plan_compiles_without_spills(prefix_model, tmp_path: Path, backend: str, chip: str,
                                             target: str) -> None:  # fmt: skip
    model, layers = prefix_model
    artifact = api.compile(model, backend, chip, tmp_path, batch=1, ctx=4096)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"] == target
    assert len(report["kernels"]) == len(artifact.plan.groups)
    assert sum(1 for g in artifact.plan.groups if g.id.endswith("attn.sdpa")) == layers
    own = [k for k in report["kernels"] if k["library"] is None]
    assert own
    register = "registers" if backend == "cuda" else "vgprs"
    for k in own:
        res = k["resources"]
        assert res.get(register), f"{model.name} {k['group']}: no {register} in {res}"
        assert res.get("spill_bytes") == 0, (
            f"{model.name} {k['group']} spills {res.get('spill_bytes')} B on {target}"
        )
        assert k["predicted_s"] and k["predicted_s"] > 0
    code = {".cubin", ".ptx"} if backend == "cuda" else {".hsaco", ".amdgcn"}
    assert code <= {Path(f).suffix for f in artifact.files}
    assert not report["warnings"]


@pytest.mark.compile
@pytest.mark.parametrize("name", HLO_MODELS)
def test_trn2_hlo_of_the_moe_and_latent_families(name: str, tmp_path: Path) -> None:
    pytest.importorskip("jax", reason="the neuron backend lowers through JAX")
    from polymorph.backends.neuron import hlo

    model = load_model(name, dtype="bf16")
    model = dataclasses.replace(model, graph=model.rebuild(num_layers=kinds_prefix(model.config)))
    api.compile(model, "neuron", "trn2", tmp_path, batch=1, ctx=4096)
    check = hlo.check_hlo((tmp_path / "model.hlo.txt").read_text())
    assert check.ok, (name, check.faults)
