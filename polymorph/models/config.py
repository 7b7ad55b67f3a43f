"""Model configuration parsed from a Hugging Face `config.json`.

Dense families: Llama (`model_type` "llama": Llama 2, 3, 3.1, 3.2), Mistral ("mistral", with or
without its sliding window), Qwen2 ("qwen2": q/k/v biases), Qwen3 ("qwen3": per-head q/k RMSNorm,
head_dim independent of the width), Gemma 2 and Gemma 3 ("gemma2", "gemma3_text": soft-capping,
alternating local/global layers with their own rope, (1 + w) RMSNorm, scaled embeddings, pre/post
feed-forward norms), Phi-3 ("phi3": fused qkv and gate_up weights, longrope, partial rotary) and
Granite ("granite": embedding, residual, attention and logits multipliers); MoE: Mixtral ("mixtral"),
Qwen3-MoE ("qwen3_moe", with dense layers by `mlp_only_layers` and `decoder_sparse_step`), OLMoE
("olmoe": q/k RMSNorm over the whole projection), GLM-4.5 ("glm4_moe": sigmoid router with a correction
bias, grouped top-k, routed scaling, shared experts, first dense layers, partial rotary), MiniMax-M2
("minimax_m2": sigmoid router with a correction bias, whole-projection q/k norms, partial rotary),
gpt-oss ("gpt_oss": attention sinks, alternating sliding and full layers, biases on every projection and
expert, its clamped SwiGLU, a router bias) and Llama 4 ("llama4_text": chunked attention, layers without
rope with an attention temperature, an L2 norm of q and k on the others, interleaved rope, dense and MoE
layers interleaved, a shared expert, sigmoid top-k routing that weighs each expert's input);
DeepSeek-V3 and Kimi-K2 ("deepseek_v3": multi-head latent attention over a paged latent cache, decoded
in latent space with the absorbed up-projections, interleaved rope, yarn's attention scale, and
GLM-4.5's MoE), DeepSeek-V3.2 ("deepseek_v32") and GLM-5 ("glm_moe_dsa": its indexer's rope interleaved,
layers that reuse the previous indexer's choice): the same attention restricted to the positions a
lightning indexer with its own one-head cache selects. Rope types
default, linear, dynamic, yarn, longrope and llama3; activations silu, gelu and gelu-tanh.

Both forms that transformers writes are read: the transformers-4 form (`rope_theta` + `rope_scaling`,
`torch_dtype`, Gemma 3's `rope_local_base_freq` and `sliding_window_pattern`) and the transformers-5
form (`rope_parameters`, nested per layer type for Gemma 3, `dtype`, `layer_types`); where a
config.json has both, transformers' precedence is kept (a non-empty `rope_scaling` replaces
`rope_parameters`). `ModelConfig.to_hf` writes the transformers-4 form, which transformers 4 and 5
both read, and which `ModelConfig.from_hf` reads back to an equal config.

Keys that are absent take the default of the transformers config class of that model type, so that a
checkpoint gives the same model here as in transformers; the sizes that have no sensible default
(vocabulary, widths, depth, heads, experts) are required. A key that changes the model's math in a way
the graph builder does not implement is refused by name with a non-neutral value, never ignored
(`_UNIMPLEMENTED`), and so is a feature the IR of this build lacks (`_require_ir`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from polymorph.errors import UserError

ModelType = Literal[
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "granite", "mixtral", "qwen3_moe",
    "olmoe", "glm4_moe", "minimax_m2", "gpt_oss", "llama4_text", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
]  # fmt: skip
RopeType = Literal["default", "linear", "dynamic", "yarn", "longrope", "llama3"]
Activation = Literal["silu", "gelu", "gelu_tanh"]
RouterStyle = Literal["topk_softmax", "softmax_topk", "sigmoid_topk", "topk_sigmoid"]

MODEL_TYPES: tuple[ModelType, ...] = (
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "granite", "mixtral", "qwen3_moe",
    "olmoe", "glm4_moe", "minimax_m2", "gpt_oss", "llama4_text", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
)  # fmt: skip
MOE_TYPES: tuple[ModelType, ...] = (
    "mixtral", "qwen3_moe", "olmoe", "glm4_moe", "minimax_m2", "gpt_oss", "llama4_text", "deepseek_v3",
    "deepseek_v32", "glm_moe_dsa",
)  # fmt: skip
# q/k RMSNorm over each head (Qwen3, Gemma 3; GLM-4.5 with use_qk_norm) or over the whole projection
# before it is split into heads (OLMoE, MiniMax-M2)
_HEAD_QK_NORM: tuple[ModelType, ...] = ("qwen3", "qwen3_moe", "gemma3_text")
_FULL_QK_NORM: tuple[ModelType, ...] = ("olmoe", "minimax_m2")
GEMMA_TYPES: tuple[ModelType, ...] = ("gemma2", "gemma3_text")
ROPE_TYPES: tuple[RopeType, ...] = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"

# transformers' ACT2FN names -> the activation they compute (gelu_new and gelu_fast are the tanh
# approximation written out; silu and swish are both x * sigmoid(x)).
_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
}  # fmt: skip

# Defaults of the transformers (5.x) config classes for keys a config.json may leave out.
# `head_dim` None: hidden_size // num_attention_heads. `sliding_window`: the class default, before
# `use_sliding_window` (Qwen) turns it off.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0},
    "mistral": {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096 * 32, "rope_theta": 10000.0,
                "sliding_window": 4096},
    "qwen2": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 10000.0,
              "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 10000.0,
              "head_dim": 128, "sliding_window": 4096, "max_window_layers": 28},
    "gemma2": {"rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "rope_theta": 10000.0,
               "head_dim": 256, "sliding_window": 4096, "tie_word_embeddings": True,
               "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window_pattern": 2},
    "gemma3_text": {"rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "rope_theta": 1e6,
                    "rope_local_base_freq": 10000.0, "head_dim": 256, "sliding_window": 4096,
                    "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
                    "query_pre_attn_scalar": 256, "attn_logit_softcapping": None,
                    "final_logit_softcapping": None, "sliding_window_pattern": 6},
    "phi3": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "rope_theta": 10000.0,
             "original_max_position_embeddings": 4096, "sliding_window": None},
    "granite": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0,
                "attention_multiplier": 1.0, "embedding_multiplier": 1.0, "residual_multiplier": 1.0,
                "logits_scaling": 1.0},
    "mixtral": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096 * 32, "rope_theta": 1e6},
    "qwen3_moe": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 10000.0,
                  "sliding_window": 4096},
    # transformers 5.24's OlmoeConfig, Glm4MoeConfig, MiniMaxM2Config and GptOssConfig defaults
    "olmoe": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "rope_theta": 10000.0},
    "glm4_moe": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "rope_theta": 10000.0,
                 "partial_rotary_factor": 0.5, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
                 "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1},
    "minimax_m2": {"rms_norm_eps": 1e-6, "max_position_embeddings": 196608, "rope_theta": 5e6,
                   "head_dim": 128},
    "gpt_oss": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "rope_theta": 150000.0,
                "head_dim": 64, "sliding_window": 128, "attention_bias": True, "swiglu_limit": 7.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "truncate": False, "original_max_position_embeddings": 4096}},
    "llama4_text": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                    "head_dim": 128, "attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1,
                    "no_rope_layer_interval": 4, "interleave_moe_layer_step": 1},
    # transformers 5.24's DeepseekV3Config
    "deepseek_v3": {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000.0,
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                    "first_k_dense_replace": 3, "n_shared_experts": 1, "kv_lora_rank": 512,
                    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128},
    # DeepseekV32Config: DeepseekV3Config's, and its indexer's
    "deepseek_v32": {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000.0,
                     "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                     "first_k_dense_replace": 3, "n_shared_experts": 1, "kv_lora_rank": 512,
                     "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                     "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128},
    # GlmMoeDsaConfig
    "glm_moe_dsa": {"rms_norm_eps": 1e-5, "max_position_embeddings": 202752, "rope_theta": 10000.0,
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
                    "first_k_dense_replace": 3, "n_shared_experts": 1, "kv_lora_rank": 512,
                    "q_lora_rank": 2048, "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192,
                    "index_topk": 2048, "index_n_heads": 32, "index_head_dim": 128},
}  # fmt: skip
_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding: base `theta`, the scaling of `rope_type`, and how much of each head
    it rotates (`rotary_dim`, 0: all of it).

    Fields a type does not use keep their defaults (None or neutral). `attention_factor` multiplies
    cos and sin (yarn's mscale, longrope's factor), computed here as transformers computes it.
    "dynamic" reads `max_position_embeddings`, the length past which its base grows.
    """

    theta: float
    rope_type: RopeType = "default"
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    attention_factor: float = 1.0
    truncate: bool = True
    rotary_dim: int = 0
    max_position_embeddings: int | None = None

    def op_attrs(self) -> dict[str, Any]:
        """The attributes of the IR's `rope` op for this configuration (defaults left out)."""
        attrs: dict[str, Any] = {"theta": float(self.theta), "rope_type": self.rope_type}
        optional = {
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
            "short_factor": list(self.short_factor) if self.short_factor is not None else None,
            "long_factor": list(self.long_factor) if self.long_factor is not None else None,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        if self.attention_factor != 1.0:
            attrs["attention_factor"] = float(self.attention_factor)
        if not self.truncate:
            attrs["truncate"] = False
        if self.rotary_dim:
            attrs["rotary_dim"] = int(self.rotary_dim)
        return attrs

    def inv_freq(self, head_dim: int, seq_len: int | None = None) -> np.ndarray:
        """Inverse frequencies, float64 of shape [rotary_dim // 2], as transformers computes them
        (`seq_len`: the length the sequence-dependent types, dynamic and longrope, see)."""
        from polymorph.ir import reference
        from polymorph.ir.ops import OPS, normalize_attrs

        attrs = normalize_attrs(OPS["rope"], self.op_attrs())
        return reference.rope_inv_freq(head_dim, attrs, np.float64, seq_len=seq_len)

    def to_hf_scaling(self) -> dict[str, Any] | None:
        """The transformers-4 `rope_scaling` value: None for "default", else the scaling dict."""
        if self.rope_type == "default":
            return None
        d: dict[str, Any] = {"rope_type": self.rope_type}
        if self.rope_type in ("linear", "dynamic", "yarn", "longrope", "llama3"):
            d["factor"] = self.factor
        if self.rope_type == "llama3":
            d.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor)
        if self.rope_type == "yarn":
            d.update(beta_fast=self.beta_fast, beta_slow=self.beta_slow,
                     attention_factor=self.attention_factor, truncate=self.truncate)  # fmt: skip
        if self.rope_type == "longrope":
            d.update(short_factor=list(self.short_factor or ()), long_factor=list(self.long_factor or ()),
                     attention_factor=self.attention_factor)  # fmt: skip
        if self.rope_type in ("yarn", "longrope", "llama3"):
            d["original_max_position_embeddings"] = self.original_max_position_embeddings
        return d


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only model's shape and numerics, independent of the model type where the types agree.

    MoE fields (`num_experts`, `num_experts_per_tok`, `router`) are None for the dense families;
    `moe_intermediate_size` is the experts' width where it differs from `intermediate_size` (see
    `expert_intermediate_size`; `intermediate_size` is then the dense layers'). `router` says how
    routing weights are formed from the router logits (the IR's topk_router modes, ops._ROUTER):
    "topk_softmax" (Mixtral, gpt-oss) takes the top-k logits and softmaxes over them; "softmax_topk"
    (Qwen3-MoE, OLMoE) softmaxes over all experts, takes the top-k probabilities and renormalizes them
    to sum 1 only when `norm_topk_prob`; "sigmoid_topk" (GLM-4.5, MiniMax-M2) chooses by sigmoid scores
    plus `mlp.gate.e_score_correction_bias` (`selection_bias`), within the `router_topk_groups` best of
    `router_groups` groups, and weighs by the scores, renormalized when `norm_topk_prob`, times
    `routed_scaling`. `dense_layers`: the layers of an MoE model with a dense MLP of
    `intermediate_size`; `shared_expert_size`: the width of the shared experts' MLP added to the routed
    ones (0: none). gpt-oss: `router_bias`, `expert_bias` and `expert_activation` "swiglu_clamp"
    (`swiglu_alpha`, `swiglu_limit`), `attention_sinks`.

    `layer_types` gives each layer "full_attention" or "sliding_attention" (empty: all full); sliding
    layers attend through `sliding_window` tokens (the token itself counted) and use `rope_local` when
    set (Gemma 3's local base). `attention_scale` None: head_dim ** -0.5. Softcaps 0: none.
    """

    model_type: ModelType
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    dtype: str | None = None
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    router: RouterStyle | None = None
    dense_layers: tuple[int, ...] = field(default=())
    shared_expert_size: int = 0
    router_groups: int = 1
    router_topk_groups: int = 0
    routed_scaling: float = 1.0
    router_bias: bool = False
    selection_bias: bool = False
    expert_bias: bool = False
    expert_activation: Literal["silu", "swiglu_clamp"] = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_sinks: bool = False
    use_qk_norm: bool = False
    expert_weight_input: bool = False
    attention_chunk: int = 0
    nope_layers: tuple[int, ...] = field(default=())
    attn_temperature: tuple[float, float] | None = None
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    indexer_rope_interleave: bool = False
    indexer_shared_layers: tuple[int, ...] = field(default=())
    hidden_act: Activation = "silu"
    layer_types: tuple[str, ...] = field(default=())
    sliding_window: int | None = None
    rope_local: RopeConfig | None = None
    attention_scale: float | None = None
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    @property
    def is_moe(self) -> bool:
        return self.model_type in MOE_TYPES

    @property
    def is_gemma(self) -> bool:
        """(1 + w) RMSNorms, sqrt(hidden)-scaled embeddings, norms before and after the feed-forward."""
        return self.model_type in GEMMA_TYPES

    @property
    def qk_norm(self) -> bool:
        """Whether attention applies an RMSNorm over head_dim to q and k (Qwen3, Gemma 3, GLM-4.5's
        use_qk_norm)."""
        return self.model_type in _HEAD_QK_NORM or (self.use_qk_norm and self.model_type == "glm4_moe")

    @property
    def qk_norm_full(self) -> bool:
        """Whether attention applies an RMSNorm to the whole q and k projections (OLMoE, MiniMax-M2)."""
        return self.model_type in _FULL_QK_NORM

    @property
    def qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases (always for Qwen2, else `attention_bias`)."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def o_bias(self) -> bool:
        """Whether the output projection has a bias (`attention_bias`; never for Qwen2 or GLM-4.5)."""
        return self.attention_bias and self.model_type != "glm4_moe"

    @property
    def expert_intermediate_size(self) -> int | None:
        """The hidden width of one expert's MLP; None for dense models."""
        if not self.is_moe:
            return None
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def router_in_f32(self) -> bool:
        """GLM-4.5's router and the DeepSeek-V3 line's (Glm4MoeTopkRouter, DeepseekV3TopkRouter and
        their heirs) keep their weight in f32 and project the f32 activations, whatever the model dtype."""
        return self.model_type in _GLM_MOE

    def layer_is_moe(self, layer: int) -> bool:
        """Whether `layer`'s feed-forward is the routed experts (else a dense MLP)."""
        return self.is_moe and layer not in self.dense_layers

    @property
    def scale(self) -> float:
        """The attention's q.k scale."""
        return self.head_dim**-0.5 if self.attention_scale is None else self.attention_scale

    def layer_chunk(self, layer: int) -> int:
        """The attention chunk of `layer` (0: none), the IR's `chunk` attribute (Llama 4)."""
        if not self.attention_chunk or not self.layer_types or self.layer_types[layer] != CHUNKED:
            return 0
        return self.attention_chunk

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V3): `head_dim` is the q/k head (nope + rope part),
        the cache holds kv_lora_rank + qk_rope_head_dim per token, values are v_head_dim wide."""
        return self.kv_lora_rank > 0

    def layer_uses_rope(self, layer: int) -> bool:
        return layer not in self.nope_layers

    @property
    def qk_l2_norm(self) -> bool:
        """Llama 4's use_qk_norm: an RMSNorm without weight of each head of q and k on its rope layers."""
        return self.model_type == "llama4_text" and self.use_qk_norm

    def layer_window(self, layer: int) -> int:
        """The sliding window of `layer` (0: full attention), the IR's `window` attribute."""
        if self.sliding_window is None or not self.layer_types or self.layer_types[layer] != SLIDING:
            return 0
        return self.sliding_window

    def layer_rope(self, layer: int) -> RopeConfig:
        """The rope of `layer`: `rope_local` for sliding layers where the model has one."""
        if self.rope_local is not None and self.layer_types and self.layer_types[layer] == SLIDING:
            return self.rope_local
        return self.rope

    @classmethod
    def from_hf(cls, d: dict[str, Any], source: str) -> ModelConfig:
        """Parse a Hugging Face config dict; `source` names it (a path) in error messages.

        Raises UserError for an unknown `model_type`, a missing required key, a value of the wrong
        type, and for features the graph builders do not implement (see `_UNIMPLEMENTED`,
        `_require_ir`), naming the key.
        """
        if not isinstance(d, dict):
            raise UserError(f"{source}: a model config must be a JSON object, got {type(d).__name__}")
        r = _Reader(d, source)
        model_type = r.str_("model_type")
        if model_type not in MODEL_TYPES:
            raise UserError(
                f"{source}: model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
            )
        kind: ModelType = model_type  # type: ignore[assignment]
        defaults = _DEFAULTS[kind]
        hidden_act = _parse_activation(r, kind)

        hidden = r.int_("hidden_size")
        heads = r.int_("num_attention_heads")
        kv_heads = r.int_("num_key_value_heads", heads)
        head_dim = r.int_("head_dim", defaults.get("head_dim"))
        if head_dim is None:
            if hidden % heads:
                raise UserError(
                    f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                    "and there is no head_dim; add `head_dim` to the config"
                )
            head_dim = hidden // heads
        if heads % kv_heads:
            raise UserError(
                f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        layers = r.int_("num_hidden_layers")
        max_positions = r.int_("max_position_embeddings", defaults["max_position_embeddings"])
        _refuse_unimplemented(d, source, kind, head_dim)
        layer_types, window = _parse_windows(r, kind, layers)
        mla = _parse_mla(r, kind) if kind in _MLA else {}
        if mla:  # the q/k head is the nope and rope parts; rope turns the rope part only
            head_dim = r.int_("qk_nope_head_dim", defaults["qk_nope_head_dim"]) + mla["qk_rope_head_dim"]
        rope_dim = mla.get("qk_rope_head_dim", head_dim)
        rope, rope_local = _parse_ropes(d, source, kind, max_positions, rope_dim)

        fields: dict[str, Any] = {
            "model_type": kind,
            "vocab_size": r.int_("vocab_size"),
            "hidden_size": hidden,
            "intermediate_size": r.int_("intermediate_size"),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": r.float_("rms_norm_eps", defaults["rms_norm_eps"]),
            "max_position_embeddings": max_positions,
            "rope": rope,
            "rope_local": rope_local,
            "tie_word_embeddings": r.bool_("tie_word_embeddings", defaults.get("tie_word_embeddings", False)),
            # the families whose transformers classes read them; the others have no such biases
            "attention_bias": (
                r.bool_("attention_bias", defaults.get("attention_bias", False))
                if kind in _ATTENTION_BIAS
                else False
            ),
            "mlp_bias": r.bool_("mlp_bias", False) if kind in ("llama", "granite") else False,
            "dtype": _parse_dtype(r),
            "hidden_act": hidden_act,
            "layer_types": layer_types,
            "sliding_window": window,
        }
        if kind in GEMMA_TYPES:
            fields.update(
                attention_scale=_positive(r, "query_pre_attn_scalar", defaults) ** -0.5,
                attn_softcap=_softcap(r, "attn_logit_softcapping", defaults),
                final_softcap=_softcap(r, "final_logit_softcapping", defaults),
            )
        elif kind == "granite":
            fields.update(
                attention_scale=_positive(r, "attention_multiplier", defaults),
                embedding_multiplier=_positive(r, "embedding_multiplier", defaults),
                residual_multiplier=_positive(r, "residual_multiplier", defaults),
                logits_scaling=_positive(r, "logits_scaling", defaults),
            )

        fields.update(mla)
        if mla:
            fields["attention_scale"] = _mla_scale(d, head_dim, rope)
        if kind in MOE_TYPES:
            fields.update(_parse_moe(r, kind, layers))
        if kind == "llama4_text":
            fields.update(_parse_llama4(r, layers))
        cfg = cls(**fields)
        _require_ir(cfg, source)
        return cfg

    def to_hf(self) -> dict[str, Any]:
        """The transformers-4 form of this config; `from_hf(to_hf())` gives an equal config."""
        act = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[self.hidden_act]
        d: dict[str, Any] = {
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": act,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope.theta,
            "rope_scaling": self.rope.to_hf_scaling(),
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.model_type in _ATTENTION_BIAS:
            d["attention_bias"] = self.attention_bias
        if self.model_type in ("llama", "granite"):
            d["mlp_bias"] = self.mlp_bias
        windowed = self.sliding_window is not None and SLIDING in self.layer_types
        window = self.sliding_window if windowed else None
        if self.model_type in ("mistral", "mixtral", "phi3"):
            d["sliding_window"] = window
        if self.model_type == "gpt_oss":
            d.update(
                sliding_window=self.sliding_window,
                layer_types=list(self.layer_types or [FULL] * self.num_hidden_layers),
            )
        if self.model_type in ("qwen2", "qwen3", "qwen3_moe"):
            d.update(use_sliding_window=windowed, sliding_window=window)
            if windowed and self.model_type != "qwen3_moe":
                d.update(layer_types=list(self.layer_types), max_window_layers=self.num_hidden_layers)
        if self.rope.rotary_dim or self.model_type in _PARTIAL_ROTARY:  # glm4_moe's default is 0.5
            d["partial_rotary_factor"] = (self.rope.rotary_dim or self.head_dim) / self.head_dim
        if self.model_type == "phi3" and self.rope.original_max_position_embeddings is not None:
            d["original_max_position_embeddings"] = self.rope.original_max_position_embeddings
        if self.model_type in GEMMA_TYPES:
            d.update(
                hidden_activation=act,
                sliding_window=self.sliding_window,
                layer_types=list(self.layer_types),
                query_pre_attn_scalar=_integral(self.scale**-2),
                attn_logit_softcapping=self.attn_softcap or None,
                final_logit_softcapping=self.final_softcap or None,
            )
            if self.model_type == "gemma3_text":
                d["rope_local_base_freq"] = (self.rope_local or self.rope).theta
        if self.model_type == "granite":
            d.update(
                attention_multiplier=self.scale,
                embedding_multiplier=self.embedding_multiplier,
                residual_multiplier=self.residual_multiplier,
                logits_scaling=self.logits_scaling,
            )
        if self.is_moe:
            d.update(_moe_to_hf(self))
        if self.dtype is not None:
            d["torch_dtype"] = self.dtype
        return d

    def param_count(self) -> int:
        """Total parameters; tied input and output embeddings count once."""
        h, layers = self.hidden_size, self.num_hidden_layers
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        attn = h * q_width + 2 * h * kv_width + q_width * h
        if self.qkv_bias:
            attn += q_width + 2 * kv_width
        if self.o_bias:
            attn += h
        if self.is_mla:  # q (low rank or not), kv_a (latent + shared rope key), kv_b, o, two norms
            r, q_rank, nh = self.kv_lora_rank, self.q_lora_rank, self.num_attention_heads
            q = h * q_rank + q_rank + q_rank * q_width if q_rank else h * q_width
            nope = self.head_dim - self.qk_rope_head_dim
            attn = q + h * (r + self.qk_rope_head_dim) + r + r * nh * (nope + self.v_head_dim)
            attn += nh * self.v_head_dim * h
            if self.attention_bias:
                attn += (q_rank if q_rank else 0) + r + self.qk_rope_head_dim + h
        indexer = 0
        if self.index_topk:  # wq_b, wk, k_norm (weight and bias), weights_proj; shared layers have none
            hi, di = self.index_n_heads, self.index_head_dim
            indexer = self.q_lora_rank * hi * di + h * di + 2 * di + h * hi
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.qk_norm_full:
            attn += q_width + kv_width
        if self.attention_sinks:
            attn += self.num_attention_heads
        dense = 3 * h * self.intermediate_size
        if self.mlp_bias:
            dense += 2 * self.intermediate_size + h
        moe = 0
        if self.is_moe:
            e, f = self.num_experts or 0, self.expert_intermediate_size or 0
            moe = e * h + e * 3 * h * f + 3 * h * self.shared_expert_size
            moe += e * (self.router_bias + self.selection_bias) + (e * (2 * f + h) if self.expert_bias else 0)
        moe_layers = sum(self.layer_is_moe(i) for i in range(layers))
        norms = 4 if self.is_gemma else 2  # Gemma adds pre/post feed-forward norms
        body = layers * (attn + norms * h) + moe_layers * moe + (layers - moe_layers) * dense
        body += (layers - len(self.indexer_shared_layers)) * indexer
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + body + h  # + final RMSNorm

    def weight_bytes(self, dtype_bytes: float) -> int:
        """Bytes the weights take at `dtype_bytes` per parameter (2 for bf16, 1 for fp8)."""
        return math.ceil(self.param_count() * dtype_bytes)


def load_config(path: str | Path) -> ModelConfig:
    """Read a `config.json` (or a model directory holding one) into a ModelConfig; UserError if bad."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{p}: no such file; pass a model directory with a config.json or the file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read the model config ({e})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); fix or re-download it"
        ) from None
    except RecursionError:
        raise UserError(f"{p}: JSON nested too deeply to be a model config; fix or re-download it") from None
    return ModelConfig.from_hf(d, str(p))


class _Reader:
    """Typed access to a config dict; errors name the source and the key."""

    _MISSING = object()

    def __init__(self, d: dict[str, Any], source: str) -> None:
        self.d = d
        self.source = source

    def _get(self, keys: str | tuple[str, ...], default: Any) -> tuple[str, Any]:
        names = (keys,) if isinstance(keys, str) else keys
        found = [(k, self.d[k]) for k in names if self.d.get(k) is not None]
        if len({json.dumps(v) for _, v in found}) > 1:
            raise UserError(
                f"{self.source}: keys {' and '.join(k for k, _ in found)} disagree "
                f"({', '.join(f'{k}={v!r}' for k, v in found)}); keep one"
            )
        if found:
            return found[0]
        if default is self._MISSING:
            raise UserError(f"{self.source}: required key `{names[0]}` is missing; add it to the config")
        return names[0], default

    def _bad(self, key: str, value: Any, want: str) -> UserError:
        return UserError(f"{self.source}: key `{key}` must be {want}, got {value!r}")

    def int_(self, keys: str | tuple[str, ...], default: Any = _MISSING) -> Any:
        key, v = self._get(keys, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise self._bad(key, v, "a positive integer")
        return v

    def float_(self, key: str, default: Any = _MISSING) -> float:
        key, v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._bad(key, v, "a number")
        return float(v)

    def bool_(self, key: str, default: Any = _MISSING) -> bool:
        key, v = self._get(key, default)
        if not isinstance(v, bool):
            raise self._bad(key, v, "true or false")
        return v

    def str_(self, key: str, default: Any = _MISSING) -> str:
        key, v = self._get(key, default)
        if not isinstance(v, str):
            raise self._bad(key, v, "a string")
        return v


def _parse_llama4(r: _Reader, layers: int) -> dict[str, Any]:
    """Llama 4's attention layout, as Llama4TextConfig fills it in: `no_rope_layers` (1: the layer uses
    rope; default every no_rope_layer_interval-th layer without), chunked attention on the rope layers
    (`layer_types`, `attention_chunk_size`), the temperature of the other layers, the dense width."""
    d, defaults = r.d, _DEFAULTS["llama4_text"]
    flags = d.get("no_rope_layers")
    if not flags:
        interval = r.int_("no_rope_layer_interval", defaults["no_rope_layer_interval"])
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) != layers or not all(f in (0, 1) for f in flags):
        raise r._bad("no_rope_layers", flags, f"a list of {layers} zeros and ones")
    chunk = d.get("attention_chunk_size", defaults["attention_chunk_size"])
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise r._bad("attention_chunk_size", chunk, "a positive integer or null")
    types = d.get("layer_types")
    if types is None:
        types = [CHUNKED if f and chunk is not None else FULL for f in flags]
    if not isinstance(types, list) or len(types) != layers or not all(t in (FULL, CHUNKED) for t in types):
        raise r._bad("layer_types", types, f'a list of {layers} "{FULL}" and "{CHUNKED}"')
    if CHUNKED in types and chunk is None:
        raise UserError(f"{r.source}: layer_types names chunked layers but attention_chunk_size is null")
    temperature = None
    if r.bool_("attn_temperature_tuning", True):
        temperature = (_positive(r, "floor_scale", defaults), r.float_("attn_scale", defaults["attn_scale"]))
    return {
        "intermediate_size": r.int_("intermediate_size_mlp", 16384),
        "nope_layers": tuple(i for i, f in enumerate(flags) if not f),
        "layer_types": tuple(types) if CHUNKED in types else (),
        "attention_chunk": chunk or 0,
        "attn_temperature": temperature,
        "use_qk_norm": r.bool_("use_qk_norm", True),
    }


_MLA = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")


def _parse_mla(r: _Reader, kind: str) -> dict[str, Any]:
    """The latent attention sizes (DeepseekV3Config; q_lora_rank null: a plain q_proj), and the indexer
    of DeepSeek-V3.2 and GLM-5 (whose attention always has the q low rank and interleaved rope; GLM-5's
    indexer rope is interleaved too, and its `indexer_types` "shared" layers reuse the last "full"
    layer's selection)."""
    defaults = _DEFAULTS[kind]
    q_rank = r.d.get("q_lora_rank", defaults["q_lora_rank"])
    if q_rank is not None and (isinstance(q_rank, bool) or not isinstance(q_rank, int) or q_rank <= 0):
        raise r._bad("q_lora_rank", q_rank, "a positive integer or null")
    f: dict[str, Any] = {
        "kv_lora_rank": r.int_("kv_lora_rank", defaults["kv_lora_rank"]),
        "q_lora_rank": q_rank or 0,
        "qk_rope_head_dim": r.int_("qk_rope_head_dim", defaults["qk_rope_head_dim"]),
        "v_head_dim": r.int_("v_head_dim", defaults["v_head_dim"]),
        "rope_interleave": r.bool_("rope_interleave", True) if kind == "deepseek_v3" else True,
    }
    if kind == "deepseek_v3":
        return f
    if not f["q_lora_rank"]:
        raise UserError(f"{r.source}: {kind} needs q_lora_rank (its indexer reads the q latent), got null")
    layers = r.int_("num_hidden_layers")
    types = r.d.get("indexer_types")
    if kind == "glm_moe_dsa" and types is None:  # GlmMoeDsaConfig's pattern from its frequency keys
        freq = max(int(r.d.get("index_topk_freq", 1) or 1), 1)
        offset = int(r.d.get("index_skip_topk_offset", 2))
        types = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(layers)]
    types = types or ["full"] * layers
    if not isinstance(types, list) or len(types) != layers or not all(t in ("full", "shared") for t in types):
        raise r._bad("indexer_types", types, f'a list of {layers} "full" and "shared"')
    if types[0] != "full":
        raise UserError(
            f"{r.source}: indexer_types starts with a shared layer, which has no indexer to share"
        )
    f.update(
        index_topk=r.int_("index_topk", defaults["index_topk"]),
        index_n_heads=r.int_("index_n_heads", defaults["index_n_heads"]),
        index_head_dim=r.int_("index_head_dim", defaults["index_head_dim"]),
        indexer_rope_interleave=kind == "glm_moe_dsa",
        indexer_shared_layers=tuple(i for i, t in enumerate(types) if t == "shared"),
    )
    return f


def _mla_scale(d: dict[str, Any], head_dim: int, rope: RopeConfig) -> float:
    """DeepseekV3Attention's scaling: head_dim ** -0.5, times mscale(factor, mscale_all_dim) squared
    under a scaled rope (yarn_apply_mscale)."""
    scale = head_dim**-0.5
    params = d.get("rope_scaling") or d.get("rope_parameters") or {}
    all_dim = params.get("mscale_all_dim") or 0
    if rope.rope_type != "default" and all_dim and rope.factor and rope.factor > 1:
        m = 0.1 * all_dim * math.log(rope.factor) + 1.0
        scale *= m * m
    return scale


def _moe_to_hf(c: ModelConfig) -> dict[str, Any]:
    """The MoE keys of `c`'s config.json (the inverse of `_parse_moe`)."""
    kind = c.model_type
    d: dict[str, Any] = {"num_experts_per_tok": c.num_experts_per_tok}
    d["n_routed_experts" if kind in _GLM_MOE else "num_experts" if kind in ("qwen3_moe", "olmoe")
      else "num_local_experts"] = c.num_experts  # fmt: skip
    if kind in ("qwen3_moe", "olmoe", *_GLM_MOE):
        d["norm_topk_prob"] = c.norm_topk_prob
    if kind in ("qwen3_moe", *_GLM_MOE):
        d["moe_intermediate_size"] = c.moe_intermediate_size
    if kind == "qwen3_moe":
        d.update(decoder_sparse_step=1, mlp_only_layers=list(c.dense_layers))
    elif kind in _GLM_MOE:
        first = len(c.dense_layers)
        if kind in ("deepseek_v32", "glm_moe_dsa"):
            d["mlp_layer_types"] = [
                "dense" if i in c.dense_layers else "sparse" for i in range(c.num_hidden_layers)
            ]
        else:
            assert c.dense_layers == tuple(range(first)), c.dense_layers
        assert c.moe_intermediate_size and c.shared_expert_size % c.moe_intermediate_size == 0
        d.update(
            first_k_dense_replace=first, n_group=c.router_groups, topk_group=c.router_topk_groups,
            routed_scaling_factor=c.routed_scaling, n_shared_experts=c.shared_expert_size // c.moe_intermediate_size,
        )  # fmt: skip
        if kind == "glm4_moe":
            d["use_qk_norm"] = c.use_qk_norm
        else:
            d.update(
                kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank or None, v_head_dim=c.v_head_dim,
                qk_rope_head_dim=c.qk_rope_head_dim, qk_nope_head_dim=c.head_dim - c.qk_rope_head_dim,
                rope_interleave=c.rope_interleave, head_dim=c.qk_rope_head_dim,
            )  # fmt: skip
            if c.index_topk:
                d.update(
                    index_topk=c.index_topk, index_n_heads=c.index_n_heads, index_head_dim=c.index_head_dim,
                    indexer_types=["shared" if i in c.indexer_shared_layers else "full"
                                   for i in range(c.num_hidden_layers)],
                )  # fmt: skip
    elif kind == "gpt_oss":
        d.update(swiglu_alpha=c.swiglu_alpha, swiglu_limit=c.swiglu_limit)
    elif kind == "llama4_text":
        layers = c.num_hidden_layers
        d.update(
            intermediate_size=c.moe_intermediate_size, intermediate_size_mlp=c.intermediate_size,
            moe_layers=[i for i in range(layers) if i not in c.dense_layers],
            no_rope_layers=[int(c.layer_uses_rope(i)) for i in range(layers)],
            layer_types=list(c.layer_types or [FULL] * layers), attention_chunk_size=c.attention_chunk or None,
            attn_temperature_tuning=c.attn_temperature is not None, use_qk_norm=c.use_qk_norm,
        )  # fmt: skip
        if c.attn_temperature is not None:
            d.update(floor_scale=_integral(c.attn_temperature[0]), attn_scale=c.attn_temperature[1])
    return d


# GLM-4.5's MoE, which the DeepSeek-V3 line shares (its keys, router and shared experts)
_GLM_MOE = ("glm4_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")


def _parse_moe(r: _Reader, kind: str, layers: int) -> dict[str, Any]:
    """The MoE fields of `kind`, read as its transformers class reads them."""
    d, source, defaults = r.d, r.source, _DEFAULTS[kind]
    experts_key = ("n_routed_experts",) if kind in _GLM_MOE else ("num_local_experts", "num_experts")
    f: dict[str, Any] = {
        "num_experts": r.int_(experts_key),
        "num_experts_per_tok": r.int_("num_experts_per_tok"),
    }
    if f["num_experts_per_tok"] > f["num_experts"]:
        raise UserError(
            f"{source}: num_experts_per_tok {f['num_experts_per_tok']} exceeds the {f['num_experts']} experts"
        )
    if kind in ("mixtral", "gpt_oss"):
        f.update(router="topk_softmax", norm_topk_prob=True)
    elif kind == "llama4_text":
        f.update(router="topk_sigmoid", expert_weight_input=True)
    elif kind in ("qwen3_moe", "olmoe"):
        f.update(router="softmax_topk", norm_topk_prob=r.bool_("norm_topk_prob", False))
    else:  # glm4_moe, minimax_m2
        f.update(router="sigmoid_topk", selection_bias=True)
        f["norm_topk_prob"] = (
            r.bool_("norm_topk_prob", defaults["norm_topk_prob"]) if kind in _GLM_MOE else True
        )
    if kind in ("qwen3_moe", *_GLM_MOE):
        f["moe_intermediate_size"] = r.int_("moe_intermediate_size")
    if kind == "qwen3_moe":
        # Qwen3MoeDecoderLayer: experts where the layer is not in mlp_only_layers and
        # (layer + 1) % decoder_sparse_step == 0, else a dense MLP of intermediate_size
        step = r.int_("decoder_sparse_step", 1)
        only = d.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in only
        ):
            raise r._bad("mlp_only_layers", only, "a list of layer indices")
        f["dense_layers"] = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    elif kind in _GLM_MOE:
        first = d.get("first_k_dense_replace", defaults["first_k_dense_replace"])
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise r._bad("first_k_dense_replace", first, "a non-negative integer")
        groups = r.int_("n_group", defaults["n_group"])
        chosen = r.int_("topk_group", defaults["topk_group"])
        if f["num_experts"] % groups or chosen > groups:
            raise UserError(
                f"{source}: n_group {groups} must divide n_routed_experts {f['num_experts']} and be at least "
                f"topk_group {chosen}"
            )
        shared = d.get("n_shared_experts", defaults["n_shared_experts"])
        if shared is not None and (isinstance(shared, bool) or not isinstance(shared, int) or shared < 0):
            raise r._bad("n_shared_experts", shared, "a non-negative integer or null")
        dense = tuple(range(min(first, layers)))
        mlp_types = d.get("mlp_layer_types")
        if mlp_types is not None and kind in ("deepseek_v32", "glm_moe_dsa"):
            if (
                not isinstance(mlp_types, list)
                or len(mlp_types) != layers
                or not set(mlp_types) <= {"dense", "sparse"}
            ):
                raise r._bad("mlp_layer_types", mlp_types, f'a list of {layers} "dense" and "sparse"')
            dense = tuple(i for i, t in enumerate(mlp_types) if t == "dense")
        f.update(
            dense_layers=dense,
            router_groups=groups,
            router_topk_groups=chosen,
            routed_scaling=_positive(r, "routed_scaling_factor", defaults),
            shared_expert_size=f["moe_intermediate_size"] * (shared or 0),
            use_qk_norm=r.bool_("use_qk_norm", False) if kind == "glm4_moe" else False,
        )
    elif kind == "llama4_text":
        # Llama4TextConfig: moe_layers, else every interleave_moe_layer_step-th layer from step - 1;
        # experts and the shared expert are intermediate_size wide, dense layers intermediate_size_mlp
        moe = d.get("moe_layers")
        if moe is None:
            step = r.int_("interleave_moe_layer_step", defaults["interleave_moe_layer_step"])
            moe = list(range(step - 1, layers, step))
        if not isinstance(moe, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in moe):
            raise r._bad("moe_layers", moe, "a list of layer indices")
        f.update(
            dense_layers=tuple(i for i in range(layers) if i not in moe),
            moe_intermediate_size=r.int_("intermediate_size"),
            shared_expert_size=r.int_("intermediate_size"),
        )
    elif kind == "gpt_oss":
        limit = _positive(r, "swiglu_limit", defaults)
        f.update(
            router_bias=True, expert_bias=True, expert_activation="swiglu_clamp", swiglu_limit=limit,
            swiglu_alpha=r.float_("swiglu_alpha", 1.702), attention_sinks=True,
        )  # fmt: skip
    return f


def _parse_dtype(r: _Reader) -> str | None:
    _, v = r._get(("dtype", "torch_dtype"), None)
    if v is None:
        return None
    if not isinstance(v, str):
        raise r._bad("dtype", v, 'a string such as "bfloat16"')
    return v.removeprefix("torch.")


def _integral(v: float) -> float | int:
    """`v` as an int when it is one up to rounding (transformers types query_pre_attn_scalar as int)."""
    return round(v) if math.isclose(v, round(v), rel_tol=1e-9) else v


def _parse_activation(r: _Reader, kind: str) -> Activation:
    """The MLP activation: Gemma's classes read `hidden_activation`, the others `hidden_act`."""
    source = r.source
    if kind in GEMMA_TYPES:
        key, name = r._get("hidden_activation", _DEFAULTS[kind]["hidden_activation"])
    else:
        key, name = r._get("hidden_act", "silu")
        other = r.d.get("hidden_activation")
        if other is not None and _ACTIVATIONS.get(other) != _ACTIVATIONS.get(name):
            raise UserError(
                f"{source}: `hidden_activation`={other!r} disagrees with hidden_act {name!r}, and {kind} "
                "reads only hidden_act; remove one"
            )
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise UserError(f"{source}: {key} {name!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _positive(r: _Reader, key: str, defaults: dict[str, Any]) -> float:
    value = r.float_(key, defaults[key])
    if value <= 0:
        raise r._bad(key, value, "a positive number")
    return value


def _softcap(r: _Reader, key: str, defaults: dict[str, Any]) -> float:
    """A soft-capping value; 0.0 for none (null, as transformers treats it)."""
    if key in r.d and r.d[key] is None:
        return 0.0
    if key not in r.d and defaults[key] is None:
        return 0.0
    return _positive(r, key, defaults)


def _parse_windows(r: _Reader, kind: str, layers: int) -> tuple[tuple[str, ...], int | None]:
    """(layer_types, sliding_window) as transformers' attention layers of `kind` see them: () and None
    when every layer attends fully. Mistral, Mixtral, Phi-3 and Qwen3-MoE window every layer with
    `sliding_window` (Qwen only with `use_sliding_window`); Qwen2/Qwen3 window the layers
    `layer_types` names, else those from `max_window_layers` on; Gemma windows the layers
    `layer_types` names, else every layer but each `sliding_window_pattern`-th (Gemma 2: 2)."""
    d, source = r.d, r.source
    if kind == "llama4_text":
        return (), None  # chunked, not sliding: _parse_llama4
    if kind in _MLA:
        return (), None  # no sliding windows; layer_types names "indexed_attention" for the cache
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(t in (FULL, SLIDING) for t in types):
            raise r._bad("layer_types", types, f'a list of "{FULL}" and "{SLIDING}"')
        if len(types) != layers:
            raise UserError(
                f"{source}: layer_types has {len(types)} entries for {layers} layers (num_hidden_layers)"
            )
    window = d.get("sliding_window", _DEFAULTS[kind].get("sliding_window"))
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise r._bad("sliding_window", window, "a positive integer or null")
    if kind in ("llama", "granite", "olmoe", "glm4_moe", "minimax_m2", *_MLA):
        if window is not None:
            raise UserError(
                f"{source}: sliding_window={window!r} asks for sliding-window attention, which {kind} does "
                "not have in transformers; set sliding_window to null or use model_type mistral"
            )
        if types is not None and SLIDING in types:
            raise UserError(f"{source}: layer_types names sliding layers, which {kind} does not have")
        return (), None
    if kind in ("qwen2", "qwen3", "qwen3_moe") and not r.bool_("use_sliding_window", False):
        window = None  # transformers sets sliding_window to None
    if window is None:
        return (), None
    if kind in ("mistral", "mixtral", "phi3", "qwen3_moe"):
        chosen = [SLIDING] * layers  # transformers windows every layer; layer_types is not read
    elif types is not None:
        chosen = list(types)
    elif kind == "gpt_oss":  # GptOssConfig: sliding, full, sliding, ...
        chosen = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    elif kind in ("qwen2", "qwen3"):
        first = d.get("max_window_layers", _DEFAULTS[kind]["max_window_layers"])
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise r._bad("max_window_layers", first, "a non-negative integer")
        chosen = [SLIDING if i >= first else FULL for i in range(layers)]
    else:  # gemma: every `pattern`-th layer is global
        pattern = r.int_("sliding_window_pattern", _DEFAULTS[kind]["sliding_window_pattern"])
        chosen = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    if SLIDING not in chosen:
        return (), None
    return tuple(chosen), window


def _parse_ropes(
    d: dict[str, Any], source: str, kind: str, max_positions: int, head_dim: int
) -> tuple[RopeConfig, RopeConfig | None]:
    """(rope of the full layers, rope of the sliding layers where it differs: Gemma 3)."""
    scaling_raw, params_raw = d.get("rope_scaling"), d.get("rope_parameters")
    for key, value in (("rope_scaling", scaling_raw), ("rope_parameters", params_raw)):
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{source}: {key} must be an object or null, got {value!r}")
    top_theta = d.get("rope_theta", _DEFAULTS[kind]["rope_theta"])
    if kind == "gemma3_text":
        # transformers 5 (Gemma3TextConfig.convert_rope_params_to_dict): rope_parameters nested per layer
        # type; rope_scaling (the transformers-4 form) updates the global layers' entry only; thetas fill
        # from rope_theta (global) and rope_local_base_freq (local).
        params = dict(params_raw or {})
        if params and not {FULL, SLIDING} >= params.keys():
            raise UserError(
                f"{source}: rope_parameters for gemma3_text must be nested by layer type ({FULL}, {SLIDING}), "
                f"got keys {sorted(params)}"
            )
        full = dict(params.get(FULL) or {"rope_type": "default"})
        local = dict(params.get(SLIDING) or {"rope_type": "default"})
        if scaling_raw:
            full.update(scaling_raw)
        full.setdefault("rope_theta", top_theta)
        local.setdefault("rope_theta", d.get("rope_local_base_freq", _DEFAULTS[kind]["rope_local_base_freq"]))
        return (
            _rope_from(full, d, source, f"{source}: rope_parameters.{FULL}", kind, max_positions, head_dim),
            _rope_from(
                local, d, source, f"{source}: rope_parameters.{SLIDING}", kind, max_positions, head_dim
            ),
        )
    key = "rope_scaling" if scaling_raw else "rope_parameters"
    scaling: dict[str, Any] = dict((scaling_raw if scaling_raw else params_raw) or {})
    if not scaling_raw and not (params_raw or {}).get("rope_type") and "rope_scaling" in _DEFAULTS[kind]:
        scaling = {**_DEFAULTS[kind]["rope_scaling"], **scaling}  # gpt-oss: yarn unless told otherwise
    nested = [k for k, v in scaling.items() if isinstance(v, dict)]
    if nested:
        raise UserError(
            f"{source}: {key} gives rope per layer type ({', '.join(nested)}), which {kind} does not have "
            "in transformers (one rope for every layer); use a model with a single rope configuration"
        )
    scaling.setdefault("rope_theta", top_theta)
    return _rope_from(scaling, d, source, f"{source}: {key}", kind, max_positions, head_dim), None


_PARTIAL_ROTARY = ("phi3", "glm4_moe", "minimax_m2")


def _number(where: str, name: str, v: Any, positive: bool = True) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (positive and v <= 0)
    ):
        raise UserError(f"{where}: `{name}` must be a {'positive ' if positive else ''}number, got {v!r}")
    return float(v)


def _rope_from(
    s: dict[str, Any],
    d: dict[str, Any],
    source: str,
    where: str,
    kind: str,
    max_positions: int,
    head_dim: int,
) -> RopeConfig:
    """One rope configuration from its (flat) dict `s`, as transformers' ROPE_INIT_FUNCTIONS read it."""
    theta = _number(source, "rope_theta", s["rope_theta"])
    rope_type = s.get("rope_type", s.get("type", "default"))
    if kind == "phi3" and rope_type in ("su", "yarn"):
        rope_type = "longrope"  # Phi3Config renames both
    if rope_type not in ROPE_TYPES:
        raise UserError(
            f"{where}: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    partial = s.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if partial is None and kind == "minimax_m2" and d.get("rotary_dim") is not None:
        partial = _number(source, "rotary_dim", d["rotary_dim"]) / head_dim  # its released configs' key
    if partial is None:
        partial = _DEFAULTS[kind].get("partial_rotary_factor", 1.0)
    partial = _number(where, "partial_rotary_factor", partial)
    if partial != 1.0 and kind not in _PARTIAL_ROTARY:
        raise UserError(
            f"{where}: partial_rotary_factor={partial!r} (rope on part of each head) is not implemented for "
            f"{kind}; only {', '.join(_PARTIAL_ROTARY)} rotate part of the head"
        )
    dim = int(head_dim * partial)
    if dim % 2 or dim <= 0 or dim > head_dim:
        raise UserError(f"{where}: partial_rotary_factor {partial} gives an odd or empty rotary dim {dim}")
    rotary_dim = 0 if dim == head_dim else dim
    if rope_type == "default":
        return RopeConfig(theta=theta, rotary_dim=rotary_dim)

    def get(name: str, default: Any = None) -> Any:
        return s.get(name, default)

    # transformers' standardize_rope_params: a top-level original_max_position_embeddings wins for the
    # types that use it (Phi-3 stores it there); else the dict's, else max_position_embeddings
    original = get("original_max_position_embeddings", max_positions)
    original = d.get(
        "original_max_position_embeddings", _DEFAULTS[kind].get("original_max_position_embeddings", original)
    )
    bad_original = isinstance(original, bool) or not isinstance(original, int) or original <= 0
    if rope_type in ("llama3", "yarn", "longrope") and bad_original:
        raise UserError(
            f"{where}: `original_max_position_embeddings` must be a positive integer, got {original!r}"
        )
    fields: dict[str, Any] = {"theta": theta, "rope_type": rope_type, "rotary_dim": rotary_dim}
    if rope_type in ("linear", "dynamic"):
        if get("factor") is None:
            raise UserError(f"{where}: {rope_type} rope scaling needs `factor`, which is missing")
        fields["factor"] = _number(where, "factor", get("factor"))
        if rope_type == "dynamic":  # dynamic NTK grows the base past max_position_embeddings
            fields["max_position_embeddings"] = max_positions
    elif rope_type == "llama3":
        for name in _LLAMA3_KEYS[:3]:
            if get(name) is None:
                raise UserError(f"{where}: llama3 rope scaling needs `{name}`, which is missing")
            fields[name] = _number(where, name, get(name))
        fields["original_max_position_embeddings"] = original
    elif rope_type == "yarn":
        factor = get("factor")
        factor = max_positions / original if factor is None else _number(where, "factor", factor)
        attention = get("attention_factor")
        mscale, mscale_all = get("mscale"), get("mscale_all_dim")

        def yarn_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attention is None:
            attention = (
                yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
                if mscale and mscale_all
                else yarn_mscale(factor)
            )
        truncate = get("truncate", True)
        if not isinstance(truncate, bool):
            raise UserError(f"{where}: `truncate` must be true or false, got {truncate!r}")
        fields.update(
            factor=float(factor),
            beta_fast=_number(where, "beta_fast", get("beta_fast") or 32),
            beta_slow=_number(where, "beta_slow", get("beta_slow") or 1),
            attention_factor=_number(where, "attention_factor", attention),
            original_max_position_embeddings=original,
            truncate=truncate,
        )
    else:  # longrope
        lists = {}
        for name in ("short_factor", "long_factor"):
            v = get(name)
            if not isinstance(v, list) or len(v) != dim // 2:
                raise UserError(f"{where}: longrope needs `{name}`, a list of {dim // 2} numbers, got {v!r}")
            lists[name] = tuple(_number(where, name, x) for x in v)
        factor = get("factor")
        factor = max_positions / original if factor is None else _number(where, "factor", factor)
        attention = get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        fields.update(
            **lists,
            factor=float(factor),
            attention_factor=_number(where, "attention_factor", attention),
            original_max_position_embeddings=original,
        )
    return RopeConfig(**fields)


def _require_ir(cfg: ModelConfig, source: str) -> None:
    """UserError when the model needs an op or attribute the IR of this build does not define (so that
    a model is refused by name rather than built wrong); every feature a config can ask for is listed."""
    from polymorph.ir.ops import OPS

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise UserError(f"{source}: the model needs {what}, which this build's IR does not define yet")

    rope_spec = OPS["rope"].attrs
    for rope in {cfg.layer_rope(i) for i in range(cfg.num_hidden_layers)}:
        choices = rope_spec["rope_type"].choices or ()
        need(rope.rope_type in choices, f"rope type {rope.rope_type!r} (the rope op's rope_type)")
        for attr in rope.op_attrs():
            need(attr in rope_spec, f"the rope op's `{attr}` attribute ({rope.rope_type} rope)")
    attention = OPS["cache_attention"].attrs
    if cfg.sliding_window is not None:
        need("window" in attention, f"sliding-window attention (sliding_window={cfg.sliding_window})")
    if cfg.attn_softcap:
        need("softcap" in attention, f"soft-capped attention (attn_logit_softcapping={cfg.attn_softcap})")
    if cfg.final_softcap:
        need("softcap" in OPS, f"the softcap op (final_logit_softcapping={cfg.final_softcap})")
    if cfg.attention_chunk:
        need("chunk" in attention, f"chunked attention (attention_chunk_size={cfg.attention_chunk})")
    if cfg.attention_sinks:
        need(OPS["cache_attention"].arity[1] >= 6, "attention sinks (the cache_attention op's sinks input)")
    if cfg.is_mla:
        need("head_linear" in OPS, "the head_linear op (latent attention's absorbed up-projections)")
    if cfg.index_topk:
        need("indexer_topk" in OPS and "index_attention" in OPS, "the indexer_topk and index_attention ops")
    if cfg.attn_temperature is not None:
        need("attn_temperature" in OPS, "the attn_temperature op (Llama 4's attn_temperature_tuning)")
    if cfg.router is not None:
        router = OPS["topk_router"].attrs
        need(cfg.router in (router["mode"].choices or ()), f"the {cfg.router} router (topk_router mode)")
        need(cfg.router_groups == 1 or "groups" in router, "grouped expert selection (n_group)")
        experts = OPS["moe_ffn"].attrs
        need(
            cfg.expert_activation in (experts["activation"].choices or ()), f"{cfg.expert_activation} experts"
        )
    multipliers = (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scaling)
    if cfg.is_gemma or any(m != 1.0 for m in multipliers):
        need("scale" in OPS, "the scale op (scaled embeddings, residuals or logits)")
        if cfg.is_gemma:
            need("round_factor_to_dtype" in OPS["scale"].attrs, "the scale op's round_factor_to_dtype")


# Families whose transformers classes read `attention_bias` (bias on q, k, v and o).
_ATTENTION_BIAS = (
    "llama", "qwen3", "qwen3_moe", "granite", "gemma2", "gemma3_text", "olmoe", "glm4_moe", "gpt_oss", "llama4_text",
    "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
)  # fmt: skip


def _is_one(v: Any, head_dim: int) -> bool:
    return v is None or (not isinstance(v, bool) and isinstance(v, (int, float)) and v == 1)


def _is_off(v: Any, head_dim: int) -> bool:
    return v is None or v is False


def _is_head_dim(v: Any, head_dim: int) -> bool:  # Gemma: scale = query_pre_attn_scalar ** -0.5
    return v is None or (not isinstance(v, bool) and v == head_dim)


def _is_inv_sqrt_head_dim(v: Any, head_dim: int) -> bool:  # Granite: scale = attention_multiplier
    return v is None or (
        not isinstance(v, bool) and isinstance(v, (int, float)) and math.isclose(v, head_dim**-0.5)
    )


# config.json keys that change the model's math in some transformers family and that the graph builder
# does not implement for the family at hand: key -> (what it does, whether a value is neutral (the math
# polymorph does), the families that read and implement it).
_UNIMPLEMENTED: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    "attn_logit_softcapping": ("soft-capped attention logits", _is_off, GEMMA_TYPES),
    "final_logit_softcapping": ("soft-capped output logits", _is_off, GEMMA_TYPES),
    "query_pre_attn_scalar": ("an attention scale other than head_dim**-0.5", _is_head_dim, GEMMA_TYPES),
    "attention_multiplier": ("an attention scale other than head_dim**-0.5", _is_inv_sqrt_head_dim, ("granite",)),
    "embedding_multiplier": ("scaled embeddings", _is_one, ("granite",)),
    "residual_multiplier": ("scaled residual branches", _is_one, ("granite",)),
    "logits_scaling": ("scaled output logits", _is_one, ("granite",)),
    "partial_rotary_factor": ("rope on part of each head", _is_one, ("phi3", "glm4_moe", "minimax_m2")),
    "logit_scale": ("scaled output logits", _is_one, ()),
    "clip_qkv": ("clipped q/k/v activations", _is_off, ()),
    "attention_chunk_size": ("chunked local attention", _is_off, ("llama4_text",)),
    "use_qk_norm": ("an RMSNorm of q and k", _is_off, ("glm4_moe", "minimax_m2", "llama4_text")),
    "use_bidirectional_attention": ("bidirectional attention", _is_off, ()),
    "rope_local_base_freq": ("a second rope base for local layers", _is_off, ("gemma3_text",)),
}  # fmt: skip


def _refuse_unimplemented(d: dict[str, Any], source: str, kind: str, head_dim: int) -> None:
    """UserError naming the first key whose value asks for math polymorph does not implement."""
    for key in ("quantization_config", "compression_config"):
        q = d.get(key)
        if q is not None:
            method = q.get("quant_method", q.get("format")) if isinstance(q, dict) else None
            what = f" (quant_method {method!r})" if method is not None else ""
            raise UserError(
                f"{source}: `{key}`{what}: quantized checkpoints (FP8 block-scaled, MXFP4, AWQ, GPTQ) are "
                "not supported yet; use the model's unquantized bf16/f16/f32 checkpoint"
            )
    for key, (what, neutral, families) in _UNIMPLEMENTED.items():
        if kind not in families and key in d and not neutral(d[key], head_dim):
            raise UserError(
                f"{source}: `{key}`={d[key]!r} ({what}) is not implemented for {kind}; polymorph refuses "
                "rather than compute another model: use a model without it"
            )
