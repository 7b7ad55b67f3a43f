"""The transformers oracle for the families, rope types and activations of issues 15 (dense) and 16
(MoE: OLMoE, GLM-4.5, MiniMax-M2, gpt-oss, Llama 4, Qwen3-MoE with dense layers): tiny random
checkpoints built and saved by transformers at test time (built once per session and shared by every
engine), loaded through polymorph from their config.json + safetensors, must give transformers'
prefill logits (f32 model tolerance) and its greedy tokens through the KV cache, on the reference
engine, the cpu backend and the neuron backend (JAX on XLA's CPU here); in bf16, the prefill logits
of the model transformers loads in bf16 within the bf16 model tolerance. Every prompt is longer than
every sliding window, and the shapes vary: one KV head, head_dim != hidden / heads, odd head counts.

`polymorph run DIR --prompt ... --new-tokens N --dtype f32` on cpu prints transformers' greedy tokens
for two windowed families (Gemma 2, Mistral) and every MoE family.

The MoE shapes exercise what each family adds: GLM-4.5 with 4 expert groups of which 2 are kept, 3 of 8
experts, routed scaling 2.5, a shared expert, a first dense layer, q/k norms and partial rotary;
gpt-oss with a 5-token window on alternate layers, sinks and a SwiGLU clamp (0.5) that real activations
cross; Llama 4 with 5-token chunks, its temperature from position 3 on (floor_scale 4) and dense/MoE
layers interleaved. Router correction biases, sinks and biases are moved off their initial values. In
bf16 a token whose router margin is within rounding (verify.numerics.token_margins) may route apart
from transformers: such a mismatch is reported by a skip that names the token and margin, any other
fails."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

PROMPT = 13  # longer than every window below
NEW_TOKENS = 6
BASE = dict(vocab_size=96, hidden_size=48, num_hidden_layers=2, max_position_embeddings=256,
            initializer_range=0.08)  # fmt: skip


def _gemma2() -> tuple[Any, Any]:
    cfg = transformers.Gemma2Config(**BASE, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
                                    attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
    return cfg, transformers.Gemma2ForCausalLM


def _gemma3(form: str) -> tuple[Any, Any]:
    layers = ["sliding_attention", "sliding_attention", "full_attention"]
    rope = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    cfg = transformers.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 3}, intermediate_size=64,
                                        num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                                        query_pre_attn_scalar=32, sliding_window=6, layer_types=layers,
                                        rope_parameters=rope, tie_word_embeddings=form == "v5")  # fmt: skip
    return cfg, transformers.Gemma3ForCausalLM


def _phi3() -> tuple[Any, Any]:
    # head_dim 16, rotary_dim 8: longrope factors for 4 frequencies; the prompt passes the original
    # context (8), so prefill and decode use the long factors, as transformers does there
    rng = np.random.default_rng(3)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": (1 + rng.random(4)).round(3).tolist(), "long_factor": (1 + 4 * rng.random(4)).round(3).tolist()}  # fmt: skip
    cfg = transformers.Phi3Config(**{**BASE, "max_position_embeddings": 64}, intermediate_size=80,
                                  num_attention_heads=3, num_key_value_heads=1, head_dim=16,
                                  original_max_position_embeddings=8, sliding_window=7, rope_parameters=rope,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    return cfg, transformers.Phi3ForCausalLM


def _granite() -> tuple[Any, Any]:
    cfg = transformers.GraniteConfig(**BASE, intermediate_size=80, num_attention_heads=4, num_key_value_heads=1,
                                     attention_multiplier=0.2, embedding_multiplier=6.0, residual_multiplier=0.4,
                                     logits_scaling=2.5, tie_word_embeddings=True)  # fmt: skip
    return cfg, transformers.GraniteForCausalLM


def _mistral_window() -> tuple[Any, Any]:
    cfg = transformers.MistralConfig(**BASE, intermediate_size=80, num_attention_heads=4, num_key_value_heads=1,
                                     head_dim=16, sliding_window=4)  # fmt: skip
    return cfg, transformers.MistralForCausalLM


def _qwen2_window() -> tuple[Any, Any]:
    cfg = transformers.Qwen2Config(**BASE, intermediate_size=80, num_attention_heads=6, num_key_value_heads=2,
                                   use_sliding_window=True, sliding_window=5, max_window_layers=1)  # fmt: skip
    return cfg, transformers.Qwen2ForCausalLM


def _llama_rope(rope: dict[str, Any], act: str = "silu", max_pos: int = 256) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        cfg = transformers.LlamaConfig(**{**BASE, "max_position_embeddings": max_pos}, intermediate_size=80,
                                       num_attention_heads=4, num_key_value_heads=2, hidden_act=act,
                                       rope_parameters={"rope_theta": 10000.0, **rope})  # fmt: skip
        return cfg, transformers.LlamaForCausalLM

    return build


FAMILIES: dict[str, Callable[[], tuple[Any, Any]]] = {
    "gemma2": _gemma2,
    "gemma3": lambda: _gemma3("v5"),
    "gemma3-v4form": lambda: _gemma3("v4"),
    "phi3": _phi3,
    "granite": _granite,
    "mistral-window": _mistral_window,
    "qwen2-window": _qwen2_window,
    "rope-linear": _llama_rope({"rope_type": "linear", "factor": 2.0}),
    # max_position_embeddings 8 < the prompt: the dynamic base grows at prefill and every decode step
    "rope-dynamic": _llama_rope({"rope_type": "dynamic", "factor": 3.0}, max_pos=8),
    "rope-yarn": _llama_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "act-gelu": _llama_rope({"rope_type": "default"}, act="gelu"),
    "act-gelu-tanh": _llama_rope({"rope_type": "default"}, act="gelu_pytorch_tanh"),
}
MOE_SHAPE = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
MOE_FAMILIES: dict[str, Callable[[], tuple[Any, Any]]] = {
    "qwen3-moe-dense": lambda: (transformers.Qwen3MoeConfig(
        **{**BASE, "num_hidden_layers": 3}, **MOE_SHAPE, intermediate_size=80, moe_intermediate_size=24,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[2]),
        transformers.Qwen3MoeForCausalLM),
    "olmoe": lambda: (transformers.OlmoeConfig(
        **BASE, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, num_experts=8,
        num_experts_per_tok=2), transformers.OlmoeForCausalLM),
    "glm4-moe": lambda: (transformers.Glm4MoeConfig(
        **{**BASE, "num_hidden_layers": 3}, **MOE_SHAPE, intermediate_size=80, moe_intermediate_size=24,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2,
        first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True),
        transformers.Glm4MoeForCausalLM),
    "minimax-m2": lambda: (transformers.MiniMaxM2Config(
        **BASE, **MOE_SHAPE, intermediate_size=24, num_local_experts=8, num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}),
        transformers.MiniMaxM2ForCausalLM),
    "gpt-oss": lambda: (transformers.GptOssConfig(
        **BASE, **MOE_SHAPE, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=5, swiglu_limit=0.5), transformers.GptOssForCausalLM),
    "llama4": lambda: (transformers.Llama4TextConfig(
        **{**BASE, "num_hidden_layers": 4}, **MOE_SHAPE, intermediate_size=24, intermediate_size_mlp=80,
        num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2, attention_chunk_size=5,
        floor_scale=4, attn_scale=0.3), transformers.Llama4ForCausalLM),
    # issue 17: latent attention (q low rank or not), yarn with its attention scale, GLM-4.5's MoE
    "deepseek-v3": lambda: (transformers.DeepseekV3Config(
        **{**BASE, "num_hidden_layers": 3}, intermediate_size=80, moe_intermediate_size=24,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
        kv_lora_rank=24, q_lora_rank=20, qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 64}),
        transformers.DeepseekV3ForCausalLM),
    "deepseek-v3-plain-q": lambda: (transformers.DeepseekV3Config(
        **BASE, intermediate_size=80, moe_intermediate_size=24, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=8), transformers.DeepseekV3ForCausalLM),
    # sparse attention: an indexer keeps 6 of the 13+ positions (8 heads: relu scores rarely tie at 0)
    "deepseek-v32": lambda: (transformers.DeepseekV32Config(
        **{**BASE, "num_hidden_layers": 3}, intermediate_size=80, moe_intermediate_size=24,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=24,
        q_lora_rank=20, qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16, index_topk=6,
        index_n_heads=8, index_head_dim=16), transformers.DeepseekV32ForCausalLM),
    # GLM-5: interleaved indexer rope, layers 1 and 3 reuse the indexer of layers 0 and 2, rms eps 1e-5
    "glm-moe-dsa": lambda: (transformers.GlmMoeDsaConfig(
        **{**BASE, "num_hidden_layers": 4}, intermediate_size=80, moe_intermediate_size=24,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=24, q_lora_rank=20, qk_rope_head_dim=8,
        v_head_dim=12, qk_nope_head_dim=16, index_topk=6, index_n_heads=8, index_head_dim=16,
        indexer_types=["full", "shared", "full", "shared"]), transformers.GlmMoeDsaForCausalLM),
}  # fmt: skip
FAMILIES.update(MOE_FAMILIES)
# the config.json rewritten in the transformers-4 form after saving (rope_theta + rope_scaling, and
# for Gemma 3 rope_local_base_freq + sliding_window_pattern instead of layer_types)
TRANSFORMERS4_FORM = ("gemma3-v4form", "mistral-window", "rope-yarn", "act-gelu")


def _to_transformers4_form(path: Path) -> None:
    d = json.loads(path.read_text())
    rope = d.pop("rope_parameters", None) or {}
    if d["model_type"] == "gemma3_text":
        full, local = rope["full_attention"], rope["sliding_attention"]
        d["rope_theta"] = full.pop("rope_theta")
        d["rope_local_base_freq"] = local.pop("rope_theta")
        kind = full.pop("rope_type")
        d["rope_scaling"] = None if kind == "default" else {"rope_type": kind, **full}
        types = d.pop("layer_types")
        d["sliding_window_pattern"] = types.index("full_attention") + 1
        assert all(
            (t == "full_attention") == ((i + 1) % d["sliding_window_pattern"] == 0)
            for i, t in enumerate(types)
        )
    else:
        d["rope_theta"] = rope.pop("rope_theta")
        kind = rope.pop("rope_type", "default")
        d["rope_scaling"] = None if kind == "default" else {"type": kind, **rope}
    path.write_text(json.dumps(d))


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Any, Path]]:
    """family -> (a fresh transformers f32 model from_pretrained loads from the saved directory, the
    directory); each family's checkpoint built once per session."""
    cache: dict[str, Path] = {}

    def get(family: str) -> tuple[Any, Path]:
        if family not in cache:
            torch.manual_seed(1234)
            cfg, cls = FAMILIES[family]()
            model = cls(cfg).eval()
            with torch.no_grad():  # norms and biases away from their init, so a missing one cannot pass
                for name, p in model.named_parameters():
                    if name.endswith(("norm.weight", ".bias", "_bias", ".sinks")):
                        p.add_(0.2 * torch.randn_like(p))
                for name, b in model.named_buffers():  # GLM-4.5's and MiniMax-M2's router correction
                    if name.endswith("e_score_correction_bias"):
                        b.copy_(0.05 * torch.randn_like(b))
            out = tmp_path_factory.mktemp(family)
            model.save_pretrained(out)
            if family in TRANSFORMERS4_FORM:
                _to_transformers4_form(out / "config.json")
            cache[family] = out
        # A fresh oracle per test: transformers' dynamic rope keeps the longest length it has seen in
        # the model (a later, shorter prefill would reuse those frequencies), so no test may inherit
        # another's generate().
        oracle = transformers.AutoModelForCausalLM.from_pretrained(cache[family], dtype=torch.float32).eval()
        return oracle, cache[family]

    return get


def _greedy(hf_model: Any, prompt: np.ndarray) -> tuple[np.ndarray, Any]:
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        want_prefill = hf_model(ids).logits.float().numpy()
        hf_model.generation_config.eos_token_id = None
        gen = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                do_sample=False, output_logits=True, return_dict_in_generate=True,
                                pad_token_id=0)  # fmt: skip
    return want_prefill, gen


def _engine(kind: str, model: Any) -> Any:
    if kind == "reference":
        return ReferenceExecutable(model.graph, model.weights())
    artifact = compile_model(model, kind)
    return registry.get(kind).load(artifact, model.weights())


ENGINES = ("reference", "cpu", "neuron") if importlib.util.find_spec("jax") else ("reference", "cpu")
CASES = [(f, e) for f in FAMILIES for e in ENGINES]


def _check_config(family: str, hf_model: Any, model: Any) -> None:
    """What polymorph read from the config.json is what transformers built (windows, ropes)."""
    cfg, hf = model.config, hf_model.config
    types = getattr(hf, "layer_types", None)
    window = getattr(hf, "sliding_window", None)
    for i in range(cfg.num_hidden_layers):
        if hf.model_type in ("mistral", "phi3"):
            want = window or 0
        else:
            want = window if types is not None and types[i] == "sliding_attention" and window else 0
        assert cfg.layer_window(i) == want, f"{family} layer {i} window"
    if family in ("gemma3", "gemma3-v4form"):
        rotary = hf_model.model.rotary_emb
        for layer_type, rope in (("full_attention", cfg.rope), ("sliding_attention", cfg.rope_local)):
            np.testing.assert_allclose(rope.inv_freq(cfg.head_dim), getattr(rotary, f"{layer_type}_inv_freq").double().numpy(), rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(("family", "engine"), CASES, ids=[f"{f}-{e}" for f, e in CASES])
def test_logits_and_greedy_tokens_match_transformers(built, family: str, engine: str) -> None:
    hf_model, path = built(family)
    model = load_model(path, all_logits=True)
    _check_config(family, hf_model, model)
    tol = model_tolerance(DType.F32)
    prompt = np.random.default_rng().integers(0, hf_model.config.vocab_size, size=(1, PROMPT))
    want_prefill, gen = _greedy(hf_model, prompt)
    want_tokens = gen.sequences[0, PROMPT:].tolist()

    session = Session(_engine(engine, model), model.graph, batch=1, max_ctx=PROMPT + NEW_TOKENS)
    got = session.step([0], prompt.astype(np.int32))
    check = compare(got, want_prefill, tol)
    assert check.ok, f"{family} prefill on {engine}: {check}"
    tokens = [int(np.argmax(got[0, -1]))]
    for step in range(NEW_TOKENS - 1):
        check = compare(got[0, -1], gen.logits[step][0].numpy(), tol)
        assert check.ok, f"{family} decode step {step} on {engine}: {check}"
        got = session.step([0], np.array([[tokens[-1]]], dtype=np.int32))
        tokens.append(int(np.argmax(got[0, -1])))
    assert tokens == want_tokens, (
        f"{family} greedy tokens on {engine}: {tokens} != transformers {want_tokens}"
    )


BF16_CASES = [(f, e) for f in FAMILIES for e in ("reference", "cpu")]


@pytest.mark.parametrize(("family", "engine"), BF16_CASES, ids=[f"{f}-{e}" for f, e in BF16_CASES])
def test_bf16_prefill_matches_transformers_bf16(built, family: str, engine: str) -> None:
    _, path = built(family)
    hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    model = load_model(path, dtype="bf16", all_logits=True)
    prompt = np.random.default_rng().integers(0, hf_bf16.config.vocab_size, size=(1, PROMPT))
    with torch.no_grad():
        want = hf_bf16(torch.from_numpy(prompt)).logits.float().numpy()
    session = Session(_engine(engine, model), model.graph, batch=1, max_ctx=PROMPT)
    got = session.step([0], prompt.astype(np.int32))
    check = compare(got, want, model_tolerance(DType.BF16))
    if not check.ok and model.config.is_moe:
        tol = model_tolerance(DType.BF16)
        bad = np.abs(got - want) > tol.atol + tol.rtol * np.abs(want)  # [1, S, V]
        tie = _router_near_tie(model, prompt, first_bad=int(np.argmax(bad[0].any(axis=-1))))
        if tie:
            pytest.skip(f"{family} bf16 prefill on {engine}: {check}; routing near-tie: {tie}")
    assert check.ok, f"{family} bf16 prefill on {engine}: {check}"


def _router_near_tie(model: Any, prompt: np.ndarray, first_bad: int) -> str:
    """The token up to the first mismatched one (a different expert at token t moves the tokens after
    it) whose router margin in polymorph's bf16 reference run is under 4 bf16 epsilons, or ""."""
    from polymorph.verify.numerics import token_margins

    ref = ReferenceExecutable(model.graph, model.weights(), keep_values=True)
    Session(ref, model.graph, batch=1, max_ctx=PROMPT).step([0], prompt.astype(np.int32))
    margins = token_margins(model.graph, ref.last_values)  # [tokens], the smallest over the layers
    if margins is None:
        return ""
    t = int(np.argmin(margins[: first_bad + 1]))
    return f"token {t} margin {margins[t]:.2g}" if margins[t] < 4 * 2.0**-8 else ""


CLI_CASES = [("gemma2", "cpu"), ("mistral-window", "cpu")] + [
    (f, b) for f in MOE_FAMILIES for b in ENGINES if b != "reference"
]


@pytest.mark.parametrize(("family", "backend"), CLI_CASES, ids=[f"{f}-{b}" for f, b in CLI_CASES])
def test_cli_run_gives_transformers_greedy_tokens(
    built, capsys: pytest.CaptureFixture[str], family: str, backend: str
) -> None:
    from polymorph.cli import command as cli

    hf_model, path = built(family)
    prompt = np.random.default_rng().integers(0, hf_model.config.vocab_size, size=(1, PROMPT))
    _, gen = _greedy(hf_model, prompt)
    want = gen.sequences[0, PROMPT:].tolist()
    argv = ["run", str(path), "--prompt", " ".join(map(str, prompt[0])), "--new-tokens", str(NEW_TOKENS),
            "--dtype", "f32", "--backend", backend]  # fmt: skip
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    line = re.search(r"^tokens: (.*)$", out, re.M)
    assert line is not None, out
    assert [int(t) for t in line.group(1).split()] == want
