"""Model configuration parsed from a Hugging Face `config.json`.

Six families are supported: the dense Llama (`model_type` "llama": Llama 2, 3, 3.1, 3.2), Mistral
("mistral", full attention only), Qwen2 ("qwen2": q/k/v biases) and Qwen3 ("qwen3": per-head q/k
RMSNorm, head_dim independent of the width), and the MoE Mixtral ("mixtral") and Qwen3-MoE
("qwen3_moe"). Both forms that transformers writes are read: the transformers-4 form (`rope_theta` +
`rope_scaling`, `torch_dtype`) and the transformers-5 form (`rope_parameters`, `dtype`, and
`num_local_experts` for Qwen3-MoE); where a config.json has both, transformers' precedence is kept (a
non-empty `rope_scaling` replaces `rope_parameters`). `ModelConfig.to_hf` writes the transformers-4
form, which transformers 4 and 5 both read, and which `ModelConfig.from_hf` reads back to an equal
config.

Keys that are absent take the default of the transformers config class of that model type, so that a
checkpoint gives the same model here as in transformers; the sizes that have no sensible default
(vocabulary, widths, depth, heads, experts) are required. A key that changes the model's math in a way
the graph builder does not implement (sliding windows, soft-capping, partial rotary, multipliers,
quantization, ...) is refused by name with a non-neutral value, never ignored (`_UNIMPLEMENTED`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from polymorph.errors import UserError

ModelType = Literal["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"]
RopeType = Literal["default", "llama3"]
RouterStyle = Literal["topk_softmax", "softmax_topk"]

MODEL_TYPES: tuple[ModelType, ...] = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe")
MOE_TYPES: tuple[ModelType, ...] = ("mixtral", "qwen3_moe")
ROPE_TYPES: tuple[RopeType, ...] = ("default", "llama3")

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
    "mixtral": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096 * 32, "rope_theta": 1e6},
    "qwen3_moe": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 10000.0,
                  "sliding_window": 4096},
}  # fmt: skip
_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding: base `theta` and, for "llama3", the Llama 3.1 frequency scaling.

    The four scaling fields are None for "default" and all set for "llama3".
    """

    theta: float
    rope_type: RopeType = "default"
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def op_attrs(self) -> dict[str, Any]:
        """The attributes of the IR's `rope` op for this configuration (defaults for the unset fields)."""
        attrs: dict[str, Any] = {"theta": float(self.theta), "rope_type": self.rope_type}
        scaling = {
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }
        attrs.update({k: v for k, v in scaling.items() if v is not None})
        return attrs

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """Inverse frequencies, float64 of shape [head_dim // 2], as transformers computes them."""
        from polymorph.ir.ops import OPS, normalize_attrs
        from polymorph.ir.reference import rope_inv_freq

        return rope_inv_freq(head_dim, normalize_attrs(OPS["rope"], self.op_attrs()), np.float64)

    def to_hf_scaling(self) -> dict[str, Any] | None:
        """The transformers-4 `rope_scaling` value: None for "default", else the scaling dict."""
        if self.rope_type == "default":
            return None
        return {
            "rope_type": self.rope_type,
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only model's shape and numerics, independent of the model type where the types agree.

    MoE fields (`num_experts`, `num_experts_per_tok`, `router`) are None for the dense families;
    `moe_intermediate_size` is set for qwen3_moe only (Mixtral's experts use `intermediate_size`, see
    `expert_intermediate_size`). `router` says how routing weights are formed from the router logits:
    "topk_softmax" (Mixtral) takes the top-k logits and softmaxes over them; "softmax_topk" (Qwen3-MoE)
    softmaxes over all experts, takes the top-k probabilities and renormalizes them to sum 1 only when
    `norm_topk_prob`. (Mixtral's form equals "softmax_topk" with renormalization.)
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

    @property
    def is_moe(self) -> bool:
        return self.model_type in MOE_TYPES

    @property
    def qk_norm(self) -> bool:
        """Whether attention applies an RMSNorm over head_dim to q and k (always on for Qwen3)."""
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases (always for Qwen2, else `attention_bias`)."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def o_bias(self) -> bool:
        """Whether the output projection has a bias (`attention_bias`; never for Qwen2)."""
        return self.attention_bias

    @property
    def expert_intermediate_size(self) -> int | None:
        """The hidden width of one expert's MLP; None for dense models."""
        if self.model_type == "mixtral":
            return self.intermediate_size
        return self.moe_intermediate_size

    @classmethod
    def from_hf(cls, d: dict[str, Any], source: str) -> ModelConfig:
        """Parse a Hugging Face config dict; `source` names it (a path) in error messages.

        Raises UserError for an unknown `model_type`, a missing required key, a value of the wrong
        type, and for features the graph builders do not implement (rope types other than default and
        llama3, activations other than silu, sliding-window attention, soft-capping, multipliers,
        quantized weights, Qwen3-MoE dense layers: see `_UNIMPLEMENTED`), naming the key.
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

        hidden_act = r.str_("hidden_act", "silu")
        if hidden_act not in ("silu", "swish"):  # transformers' ACT2FN: both are x * sigmoid(x)
            raise UserError(
                f"{source}: hidden_act {hidden_act!r} is not supported; supported: silu (the gated MLP "
                "with another activation has no graph builder yet)"
            )

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
        _refuse_sliding_window(r, kind, layers)

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
            "rope": _parse_rope(d, source, defaults["rope_theta"], max_positions),
            "tie_word_embeddings": r.bool_("tie_word_embeddings", False),
            # the families whose transformers classes read them; the others have no such biases
            "attention_bias": r.bool_("attention_bias", False) if kind in _ATTENTION_BIAS else False,
            "mlp_bias": r.bool_("mlp_bias", False) if kind == "llama" else False,
            "dtype": _parse_dtype(r),
        }

        if kind == "mixtral":
            fields.update(
                num_experts=r.int_(("num_local_experts", "num_experts")),
                num_experts_per_tok=r.int_("num_experts_per_tok"),
                router="topk_softmax",
                norm_topk_prob=True,
            )
        elif kind == "qwen3_moe":
            step = r.int_("decoder_sparse_step", 1)
            dense_layers = d.get("mlp_only_layers") or []
            if step != 1 or dense_layers:
                raise UserError(
                    f"{source}: only all-MoE Qwen3-MoE models are supported (decoder_sparse_step=1, "
                    f"mlp_only_layers=[]), got decoder_sparse_step={step}, mlp_only_layers={dense_layers}"
                )
            fields.update(
                num_experts=r.int_(("num_experts", "num_local_experts")),
                num_experts_per_tok=r.int_("num_experts_per_tok"),
                moe_intermediate_size=r.int_("moe_intermediate_size"),
                norm_topk_prob=r.bool_("norm_topk_prob", False),
                router="softmax_topk",
            )
        if fields.get("num_experts") is not None and fields["num_experts_per_tok"] > fields["num_experts"]:
            raise UserError(
                f"{source}: num_experts_per_tok {fields['num_experts_per_tok']} exceeds the "
                f"{fields['num_experts']} experts"
            )
        return cls(**fields)

    def to_hf(self) -> dict[str, Any]:
        """The transformers-4 form of this config; `from_hf(to_hf())` gives an equal config."""
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
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope.theta,
            "rope_scaling": self.rope.to_hf_scaling(),
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.model_type in _ATTENTION_BIAS:
            d["attention_bias"] = self.attention_bias
        if self.model_type == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.model_type in ("mistral", "mixtral"):
            d["sliding_window"] = None
        if self.model_type in ("qwen2", "qwen3", "qwen3_moe"):
            d.update(use_sliding_window=False, sliding_window=None)
        if self.model_type == "mixtral":
            d.update(num_local_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok)
        elif self.model_type == "qwen3_moe":
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
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
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.is_moe:
            assert self.num_experts is not None and self.expert_intermediate_size is not None
            mlp = self.num_experts * h + self.num_experts * 3 * h * self.expert_intermediate_size
        else:
            mlp = 3 * h * self.intermediate_size
            if self.mlp_bias:
                mlp += 2 * self.intermediate_size + h
        per_layer = attn + mlp + 2 * h  # + input and post-attention RMSNorm
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + layers * per_layer + h  # + final RMSNorm

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


def _parse_dtype(r: _Reader) -> str | None:
    _, v = r._get(("dtype", "torch_dtype"), None)
    if v is None:
        return None
    if not isinstance(v, str):
        raise r._bad("dtype", v, 'a string such as "bfloat16"')
    return v.removeprefix("torch.")


def _parse_rope(d: dict[str, Any], source: str, default_theta: float, max_positions: int) -> RopeConfig:
    """Read rope from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (4).

    With both present, transformers 5 (`convert_rope_params_to_dict`) takes a non-empty `rope_scaling`
    in place of `rope_parameters`, whatever the latter says; theta is the chosen dict's `rope_theta`,
    else the top-level `rope_theta`, else the family's default. llama3 scaling without
    `original_max_position_embeddings` uses `max_position_embeddings`, as transformers does.
    """
    scaling_raw, params_raw = d.get("rope_scaling"), d.get("rope_parameters")
    for key, value in (("rope_scaling", scaling_raw), ("rope_parameters", params_raw)):
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{source}: {key} must be an object or null, got {value!r}")
    key = "rope_scaling" if scaling_raw else "rope_parameters"
    scaling: dict[str, Any] = dict((scaling_raw if scaling_raw else params_raw) or {})
    where = f"{source}: {key}"
    nested = [k for k, v in scaling.items() if isinstance(v, dict)]
    if nested:
        raise UserError(
            f"{where} gives rope per layer type ({', '.join(nested)}), which polymorph does not "
            "implement (one rope for every layer); use a model with a single rope configuration"
        )
    theta_value = scaling["rope_theta"] if "rope_theta" in scaling else d.get("rope_theta", default_theta)
    if isinstance(theta_value, bool) or not isinstance(theta_value, (int, float)) or theta_value <= 0:
        raise UserError(f"{source}: rope_theta must be a positive number, got {theta_value!r}")
    partial = scaling.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        raise UserError(
            f"{where}: partial_rotary_factor={partial!r} (rope on part of each head) is not implemented; "
            "polymorph rotates the whole head (partial_rotary_factor 1.0)"
        )

    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise UserError(
            f"{where}: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return RopeConfig(theta=float(theta_value))

    values: dict[str, Any] = {}
    for name in _LLAMA3_KEYS:
        v = scaling.get(name, max_positions if name == "original_max_position_embeddings" else None)
        if v is None:
            raise UserError(f"{where}: llama3 rope scaling needs `{name}`, which is missing")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise UserError(f"{where}: `{name}` must be a positive number, got {v!r}")
        values[name] = v
    if values["high_freq_factor"] == values["low_freq_factor"]:
        raise UserError(f"{where}: high_freq_factor must differ from low_freq_factor")
    if values["original_max_position_embeddings"] != int(values["original_max_position_embeddings"]):
        raise UserError(f"{where}: original_max_position_embeddings must be an integer")
    return RopeConfig(
        theta=float(theta_value),
        rope_type="llama3",
        factor=float(values["factor"]),
        low_freq_factor=float(values["low_freq_factor"]),
        high_freq_factor=float(values["high_freq_factor"]),
        original_max_position_embeddings=int(values["original_max_position_embeddings"]),
    )


# Families whose transformers classes read `attention_bias` (bias on q, k, v and o).
_ATTENTION_BIAS = ("llama", "qwen3", "qwen3_moe")


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


def _is_silu(v: Any, head_dim: int) -> bool:
    return v is None or v in ("silu", "swish")


# config.json keys that change the model's math in some transformers family and that the graph builder
# does not implement: key -> (what it does, whether a value is neutral (the math polymorph does)).
_UNIMPLEMENTED: dict[str, tuple[str, Any]] = {
    "attn_logit_softcapping": ("soft-capped attention logits", _is_off),
    "final_logit_softcapping": ("soft-capped output logits", _is_off),
    "query_pre_attn_scalar": ("an attention scale other than head_dim**-0.5", _is_head_dim),
    "attention_multiplier": ("an attention scale other than head_dim**-0.5", _is_inv_sqrt_head_dim),
    "partial_rotary_factor": ("rope on part of each head", _is_one),
    "hidden_activation": ("an MLP activation other than silu", _is_silu),
    "embedding_multiplier": ("scaled embeddings", _is_one),
    "residual_multiplier": ("scaled residual branches", _is_one),
    "logits_scaling": ("scaled output logits", _is_one),
    "logit_scale": ("scaled output logits", _is_one),
    "clip_qkv": ("clipped q/k/v activations", _is_off),
    "attention_chunk_size": ("chunked local attention", _is_off),
    "use_qk_norm": ("an RMSNorm of q and k", _is_off),
    "use_bidirectional_attention": ("bidirectional attention", _is_off),
}


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
    for key, (what, neutral) in _UNIMPLEMENTED.items():
        if key in d and not neutral(d[key], head_dim):
            raise UserError(
                f"{source}: `{key}`={d[key]!r} ({what}) is not implemented for {kind}; polymorph refuses "
                "rather than compute another model: use a model without it"
            )


def _refuse_sliding_window(r: _Reader, kind: str, layers: int) -> None:
    """UserError when any layer would attend through a sliding window, as transformers decides it:
    Mistral/Mixtral/Llama use `sliding_window` (Mistral's default is 4096); Qwen's apply it only with
    `use_sliding_window`, to the layers from `max_window_layers` on (or the ones `layer_types` names)."""
    d, source = r.d, r.source
    fix = "polymorph has no windowed attention yet; only full-attention models load"
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise r._bad("layer_types", types, "a list of strings")
        windowed = [i for i, t in enumerate(types) if t != "full_attention"]
        if windowed:
            kinds = sorted({types[i] for i in windowed})
            raise UserError(
                f"{source}: layer_types makes {len(windowed)} of {len(types)} layers {'/'.join(kinds)} "
                f"(first: layer {windowed[0]}); {fix}"
            )
    default = _DEFAULTS[kind].get("sliding_window")
    window = d.get("sliding_window", default)
    if window is None:
        return
    if kind in ("qwen2", "qwen3", "qwen3_moe"):
        if not r.bool_("use_sliding_window", False):
            return  # transformers sets sliding_window to None
        if kind != "qwen3_moe":  # Qwen3-MoE windows every layer
            if types is not None:
                return  # layer_types (all full attention, checked above) decides
            first = d.get("max_window_layers", _DEFAULTS[kind]["max_window_layers"])
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                raise r._bad("max_window_layers", first, "a non-negative integer")
            if first >= layers:
                return  # no layer reaches max_window_layers
        raise UserError(
            f"{source}: use_sliding_window=true with sliding_window={window!r} makes layers attend "
            f"through a window; {fix}: set use_sliding_window to false if the model was trained without it"
        )
    absent = (
        " (absent from config.json: transformers' default for mistral)" if "sliding_window" not in d else ""
    )
    raise UserError(
        f"{source}: sliding_window={window!r}{absent} asks for sliding-window attention; {fix}: set "
        "sliding_window to null if the model was trained with full attention"
    )
