"""The transformers oracle: tiny random checkpoints of each family, made and saved by transformers,
loaded through polymorph, must give transformers' logits at prefill and at every cached greedy
decode step, on the reference engine and on the cpu backend. The oracle is the model transformers'
`from_pretrained` loads from the same directory, so checkpoints edited after saving (a tied config
storing its own head, a config.json with both rope forms) are judged by what transformers does with
them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from polymorph.api import compile as compile_model
from polymorph.ir.dtypes import DType
from polymorph.models import load_model
from polymorph.pipeline.backend import registry
from polymorph.serving.session import ReferenceExecutable, Session
from polymorph.verify.tolerance import compare, model_tolerance

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(vocab_size=96, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, initializer_range=0.08)  # fmt: skip


def _llama(tied: bool, llama3: bool):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 50000.0} if llama3 else None  # fmt: skip
    kwargs = dict(SMALL, intermediate_size=80, tie_word_embeddings=tied)
    if rope is not None:
        kwargs["rope_parameters"] = rope
    return transformers.LlamaConfig(**kwargs), transformers.LlamaForCausalLM


def _mixtral():
    cfg = transformers.MixtralConfig(
        **SMALL, intermediate_size=40, num_local_experts=4, num_experts_per_tok=2
    )
    return cfg, transformers.MixtralForCausalLM


def _qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(**SMALL, head_dim=16, intermediate_size=64, moe_intermediate_size=24,
                                      num_experts=6, num_experts_per_tok=2, norm_topk_prob=True)  # fmt: skip
    return cfg, transformers.Qwen3MoeForCausalLM


def _qwen2():
    return transformers.Qwen2Config(**SMALL, intermediate_size=80), transformers.Qwen2ForCausalLM


def _qwen3():
    cfg = transformers.Qwen3Config(**SMALL, head_dim=16, intermediate_size=80,  # head_dim != 48 / 4
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})  # fmt: skip
    return cfg, transformers.Qwen3ForCausalLM


def _mistral():
    cfg = transformers.MistralConfig(**SMALL, intermediate_size=80, sliding_window=None)
    return cfg, transformers.MistralForCausalLM


FAMILIES = {
    "llama3-tied": lambda: _llama(tied=True, llama3=True),
    "llama2-untied": lambda: _llama(tied=False, llama3=False),
    "mixtral": _mixtral,
    "qwen3-moe": _qwen3_moe,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mistral": _mistral,
    # the silent cases: a tied config whose checkpoint stores its own, different head; a config.json
    # with rope_parameters (default) and rope_scaling (llama3) both
    "tied-stored-head": lambda: _llama(tied=True, llama3=False),
    "rope-both-forms": lambda: _llama(tied=False, llama3=False),
}
TRANSFORMERS4_FORM = ("llama3-tied", "mixtral", "qwen2", "mistral")  # the others stay in the 5 form
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}  # fmt: skip


def _to_transformers4_form(config_path: Path) -> None:
    """Rewrite a transformers-5 config.json (`rope_parameters`) in the transformers-4 form."""
    d = json.loads(config_path.read_text())
    rope = d.pop("rope_parameters", None) or {}
    d["rope_theta"] = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", "default")
    if rope_type != "default":
        d["rope_scaling"] = {"type": rope_type, **rope}  # the oldest spelling: "type", not "rope_type"
    config_path.write_text(json.dumps(d))


def _store_own_head(out: Path) -> None:
    """Write a distinct `lm_head.weight` into a tied checkpoint saved without one."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in tensors
    embed = tensors["model.embed_tokens.weight"]
    head = np.random.default_rng(7).standard_normal(embed.shape).astype(embed.dtype) / np.sqrt(embed.shape[1])
    save_file({**tensors, "lm_head.weight": head}, out / "model.safetensors", metadata={"format": "pt"})


def _add_rope_scaling(out: Path) -> None:
    """Add a transformers-4 `rope_scaling` (llama3) beside the transformers-5 `rope_parameters`."""
    d = json.loads((out / "config.json").read_text())
    assert d["rope_parameters"]["rope_type"] == "default"
    d["rope_scaling"] = dict(LLAMA3_SCALING)
    (out / "config.json").write_text(json.dumps(d))


# The neuron backend's JAX lowering (on XLA's CPU backend here) runs the families new in issue 15.
NEURON_FAMILIES = ("qwen2", "qwen3", "mistral") if importlib.util.find_spec("jax") else ()
CASES = [
    (f, e) for f in FAMILIES for e in ("reference", "cpu", "neuron") if e != "neuron" or f in NEURON_FAMILIES
]


@pytest.fixture(scope="module")
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(1234)
    cfg, cls = FAMILIES[request.param]()
    model = cls(cfg).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so that a missing one cannot pass
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.add_(0.2 * torch.randn_like(p))
    out = tmp_path_factory.mktemp(request.param)
    sharded = request.param in ("llama2-untied", "mixtral")
    model.save_pretrained(out, max_shard_size="40KB" if sharded else "1GB")
    if request.param in TRANSFORMERS4_FORM:
        _to_transformers4_form(out / "config.json")
    if request.param == "tied-stored-head":
        _store_own_head(out)
    if request.param == "rope-both-forms":
        _add_rope_scaling(out)
    assert (out / "model.safetensors.index.json").exists() == sharded
    oracle = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return request.param, oracle, out


def _check_edit(family: str, hf_model, model) -> None:
    """The edited checkpoints differ from their plain form in transformers itself (so that the logit
    comparison tests the edit), and polymorph reads them the same way."""
    if family == "tied-stored-head":
        assert not torch.equal(hf_model.lm_head.weight, hf_model.model.embed_tokens.weight)
        assert "lm_head.weight" in model.graph.params and model.config.tie_word_embeddings is False
    elif family == "rope-both-forms":
        assert hf_model.config.rope_parameters["rope_type"] == "llama3"
        assert model.config.rope.rope_type == "llama3"
        inv_freq = hf_model.model.rotary_emb.inv_freq.double().numpy()
        np.testing.assert_allclose(model.config.rope.inv_freq(model.config.head_dim), inv_freq, rtol=1e-6)


def _engine(kind: str, model):
    if kind == "reference":
        return ReferenceExecutable(model.graph, model.weights())
    artifact = compile_model(model, kind)
    return registry.get(kind).load(artifact, model.weights())


@pytest.mark.parametrize(
    ("checkpoint", "engine"), CASES, indirect=["checkpoint"], ids=[f"{f}-{e}" for f, e in CASES]
)
def test_logits_match_transformers(checkpoint, engine):
    family, hf_model, path = checkpoint
    model = load_model(path, all_logits=True)
    _check_edit(family, hf_model, model)
    tol = model_tolerance(DType.F32)
    rng = np.random.default_rng()
    prompt = rng.integers(0, hf_model.config.vocab_size, size=(1, 11))
    new_tokens = 6
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        want_prefill = hf_model(ids).logits.numpy()
        hf_model.generation_config.eos_token_id = None
        # An explicit mask: generate() would otherwise treat prompt tokens equal to pad_token_id as padding.
        gen = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                do_sample=False, output_logits=True, return_dict_in_generate=True,
                                pad_token_id=0)  # fmt: skip
    want_tokens = gen.sequences[0, prompt.shape[1] :].tolist()

    session = Session(_engine(engine, model), model.graph, batch=1, max_ctx=prompt.shape[1] + new_tokens)
    got = session.step([0], prompt.astype(np.int32))
    check = compare(got, want_prefill, tol)
    assert check.ok, f"{family} prefill on {engine}: {check}"
    tokens = [int(np.argmax(got[0, -1]))]
    for step in range(new_tokens - 1):
        check = compare(got[0, -1], gen.logits[step][0].numpy(), tol)
        assert check.ok, f"{family} decode step {step} on {engine}: {check}"
        got = session.step([0], np.array([[tokens[-1]]], dtype=np.int32))
        tokens.append(int(np.argmax(got[0, -1])))
    assert tokens == want_tokens, (
        f"{family} greedy tokens on {engine}: {tokens} != transformers {want_tokens}"
    )
