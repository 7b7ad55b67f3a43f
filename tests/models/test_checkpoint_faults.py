"""Checkpoints whose bytes cannot be the model's weights are refused with the tensor's name, never read
as garbage: a tensor stored in another dtype of the same byte size (F16 where BF16 is meant, I32 where
F32), a tensor that is NaN or infinite in every element, and the output head of an untied model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from polymorph.cli import main
from polymorph.errors import UserError
from polymorph.models import load_model
from polymorph.models.checkpoint import load_checkpoint, save_checkpoint
from polymorph.models.weights import EMBED
from polymorph.models.zoo import zoo_config

VICTIM = "model.layers.0.mlp.down_proj.weight"


def model_dir(path: Path, torch_dtype: str | None, stored: dict[str, np.dtype] | None = None,
              values: dict[str, float] | None = None) -> Path:  # fmt: skip
    """llama-tiny as a Hugging Face directory: seeded weights stored as `torch_dtype` (F32 when None),
    the tensors of `stored` in their own dtype and those of `values` filled with one value."""
    cfg = replace(zoo_config("llama-tiny"), dtype=torch_dtype)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    base = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype("<f2")}.get(
        torch_dtype or "", np.float32
    )
    weights = load_model("llama-tiny").weights()
    tensors = {}
    for name, w in weights.items():
        arr = np.full_like(w, values[name]) if values and name in values else w
        dtype = (stored or {}).get(name, base)
        # a mislabelled tensor: its bytes are the model's dtype, its header says another of the same size
        tensors[name] = (
            arr.astype(base).view(dtype)
            if np.dtype(dtype).itemsize == np.dtype(base).itemsize
            else arr.astype(dtype)
        )
    save_checkpoint(path, tensors)
    return path


def refusal(path: Path, *needles: str, dtype: str = "f32") -> str:
    with pytest.raises(UserError) as e:
        load_model(path, dtype=dtype).weights()
    text = str(e.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text
    return text


def test_a_well_formed_checkpoint_loads(tmp_path: Path) -> None:
    for torch_dtype in (None, "bfloat16", "float16"):
        d = model_dir(tmp_path / str(torch_dtype), torch_dtype)
        assert np.isfinite(load_model(d).weights()[VICTIM]).all()
    # F32 norms in a BF16 checkpoint are a cast, not a fault
    norms = {n: np.dtype(np.float32) for n in load_model("llama-tiny").graph.params if "norm" in n}
    load_model(model_dir(tmp_path / "mixed", "bfloat16", norms)).weights()


def test_f16_stored_where_bf16_is_needed_names_the_tensor(tmp_path: Path) -> None:
    d = model_dir(tmp_path / "m", "bfloat16", {VICTIM: np.dtype("<f2")})
    refusal(d, VICTIM, "F16", "BF16", dtype="bf16")
    refusal(d, VICTIM, "F16", "BF16")  # whatever dtype it is loaded at


def test_a_mislabelled_tensor_without_a_declared_dtype_names_the_tensor(tmp_path: Path) -> None:
    d = model_dir(tmp_path / "m", None, {VICTIM: np.dtype("<i4")})
    refusal(d, VICTIM, "I32", "floating point")
    d = model_dir(tmp_path / "b", "bfloat16", {VICTIM: np.dtype("<i2")})
    refusal(d, VICTIM, "I16")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_a_wholly_non_finite_tensor_is_refused(tmp_path: Path, value: float) -> None:
    d = model_dir(tmp_path / "m", "bfloat16", values={VICTIM: value})
    refusal(d, VICTIM, "NaN or infinite in every element")


def test_the_cli_refuses_non_finite_weights_in_one_line_exit_2(tmp_path: Path, capsys) -> None:
    d = model_dir(tmp_path / "m", None, values={VICTIM: np.nan})
    assert main(["run", str(d), "--prompt", "1 2", "--new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and VICTIM in err and err.startswith("polymorph: error:")


def _llama_dir(path: Path, tied: bool, drop: str, tie_key: bool = True) -> Path:
    """llama-tiny (tied or not) as a Hugging Face directory whose checkpoint lacks the tensor `drop`."""
    cfg = replace(zoo_config("llama-tiny"), tie_word_embeddings=tied)
    path.mkdir()
    d = cfg.to_hf()
    if not tie_key:
        del d["tie_word_embeddings"]  # LlamaConfig's default: false
    (path / "config.json").write_text(json.dumps(d))
    weights = dict(load_model("llama-tiny").weights())
    weights["lm_head.weight"] = np.random.default_rng(3).standard_normal(weights[EMBED].shape, np.float32) / 8
    save_checkpoint(path, {k: v for k, v in weights.items() if k != drop})
    return path


@pytest.mark.parametrize("tie_key", [True, False], ids=["untied", "tie-absent"])
def test_an_untied_checkpoint_without_its_head_is_refused(tmp_path: Path, capsys, tie_key: bool) -> None:
    d = _llama_dir(tmp_path / "m", tied=False, drop="lm_head.weight", tie_key=tie_key)
    refusal(d, "`lm_head.weight`", "tie_word_embeddings", "at random")
    assert main(["run", str(d), "--prompt", "1 2", "--new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "lm_head.weight" in err and err.startswith("polymorph: error:")
    # what the message says of transformers: it reports the head missing and initializes it
    transformers = pytest.importorskip("transformers")
    _, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
    assert info["missing_keys"] == {"lm_head.weight"}


def test_a_tied_checkpoint_storing_only_its_head_ties_the_embedding_to_it(tmp_path: Path) -> None:
    d = _llama_dir(tmp_path / "m", tied=True, drop=EMBED)
    model = load_model(d)
    assert "lm_head.weight" not in model.graph.params
    stored = load_checkpoint(d)["lm_head.weight"]
    np.testing.assert_array_equal(model.weights()[EMBED], stored)
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(d)  # ties the embedding to the stored head
    np.testing.assert_array_equal(hf.model.embed_tokens.weight.detach().numpy(), stored)


def test_a_tied_checkpoint_storing_its_embedding_twice_stays_tied(tmp_path: Path) -> None:
    """Both tensors stored and equal (torch `.bin` conversions do this): transformers ties them."""
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(zoo_config("llama-tiny").to_hf()))
    weights = dict(load_model("llama-tiny").weights())
    save_checkpoint(path, {**weights, "lm_head.weight": weights[EMBED].copy()})
    model = load_model(path)
    assert model.config is not None and model.config.tie_word_embeddings
    assert "lm_head.weight" not in model.graph.params
