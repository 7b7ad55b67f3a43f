"""Model configuration parsed from a Hugging Face `config.json`.

Three families are supported: Llama (`model_type` "llama": Llama 2, 3, 3.1, 3.2), Mixtral ("mixtral")
and Qwen3-MoE ("qwen3_moe"). Both forms that transformers writes are read: the transformers-4 form
(`rope_theta` + `rope_scaling`, `torch_dtype`) and the transformers-5 form (`rope_parameters`, `dtype`,
and `num_local_experts` for Qwen3-MoE). `ModelConfig.to_hf` writes the transformers-4 form, which
transformers 4 and 5 both read, and which `ModelConfig.from_hf` reads back to an equal config.

Keys that are absent take the default of the transformers config class of that model type, so that a
checkpoint gives the same model here as in transformers; the sizes that have no sensible default
(vocabulary, widths, depth, heads, experts) are required.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from polymorph.errors import UserError

ModelType = Literal["llama", "mixtral", "qwen3_moe"]
RopeType = Literal["default", "llama3"]
RouterStyle = Literal["topk_softmax", "softmax_topk"]

MODEL_TYPES: tuple[ModelType, ...] = ("llama", "mixtral", "qwen3_moe")
ROPE_TYPES: tuple[RopeType, ...] = ("default", "llama3")

# Defaults of the transformers config classes for keys a config.json may leave out.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0},
    "mixtral": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096 * 32, "rope_theta": 1e6},
    "qwen3_moe": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 10000.0},
}
_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
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

    MoE fields (`num_experts`, `num_experts_per_tok`, `router`) are None for llama;
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
        return self.model_type != "llama"

    @property
    def qk_norm(self) -> bool:
        """Whether attention applies an RMSNorm over head_dim to q and k (always on for Qwen3)."""
        return self.model_type == "qwen3_moe"

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
        llama3, activations other than silu, sliding-window attention, Qwen3-MoE dense layers).
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
        if hidden_act != "silu":
            raise UserError(f"{source}: hidden_act {hidden_act!r} is not supported; supported: silu")

        hidden = r.int_("hidden_size")
        heads = r.int_("num_attention_heads")
        kv_heads = r.int_("num_key_value_heads", heads)
        head_dim = r.int_("head_dim", None)
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

        fields: dict[str, Any] = {
            "model_type": kind,
            "vocab_size": r.int_("vocab_size"),
            "hidden_size": hidden,
            "intermediate_size": r.int_("intermediate_size"),
            "num_hidden_layers": r.int_("num_hidden_layers"),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": r.float_("rms_norm_eps", defaults["rms_norm_eps"]),
            "max_position_embeddings": r.int_("max_position_embeddings", defaults["max_position_embeddings"]),
            "rope": _parse_rope(d, source, defaults["rope_theta"]),
            "tie_word_embeddings": r.bool_("tie_word_embeddings", False),
            "attention_bias": r.bool_("attention_bias", False) if kind != "mixtral" else False,
            "mlp_bias": r.bool_("mlp_bias", False) if kind == "llama" else False,
            "dtype": _parse_dtype(r),
        }

        if kind == "mixtral":
            sliding = d.get("sliding_window")
            if sliding is not None:
                raise UserError(
                    f"{source}: sliding_window={sliding!r} is not supported; set it to null "
                    "(full attention) if the model was trained without it"
                )
            fields.update(
                num_experts=r.int_(("num_local_experts", "num_experts")),
                num_experts_per_tok=r.int_("num_experts_per_tok"),
                router="topk_softmax",
                norm_topk_prob=True,
            )
        elif kind == "qwen3_moe":
            if r.bool_("use_sliding_window", False):
                raise UserError(
                    f"{source}: use_sliding_window=true is not supported; set it to false (full attention)"
                )
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
        if self.model_type != "mixtral":
            d["attention_bias"] = self.attention_bias
        if self.model_type == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.model_type == "mixtral":
            d.update(
                num_local_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                sliding_window=None,
            )
        elif self.model_type == "qwen3_moe":
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                use_sliding_window=False,
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
        if self.attention_bias:
            attn += q_width + 2 * kv_width + h
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


def _parse_rope(d: dict[str, Any], source: str, default_theta: float) -> RopeConfig:
    """Read rope from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (4)."""
    params = d.get("rope_parameters")
    if params is not None:
        where = f"{source}: rope_parameters"
        if not isinstance(params, dict):
            raise UserError(f"{where} must be an object, got {params!r}")
        scaling: dict[str, Any] = dict(params)
        theta_value = scaling.get("rope_theta", d.get("rope_theta", default_theta))
    else:
        where = f"{source}: rope_scaling"
        raw = d.get("rope_scaling")
        if raw is not None and not isinstance(raw, dict):
            raise UserError(f"{where} must be an object or null, got {raw!r}")
        scaling = dict(raw or {})
        theta_value = d.get("rope_theta", default_theta)
    if isinstance(theta_value, bool) or not isinstance(theta_value, (int, float)) or theta_value <= 0:
        raise UserError(f"{source}: rope_theta must be a positive number, got {theta_value!r}")

    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise UserError(
            f"{where}: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return RopeConfig(theta=float(theta_value))

    values: dict[str, Any] = {}
    for key in _LLAMA3_KEYS:
        v = scaling.get(key)
        if v is None:
            raise UserError(f"{where}: llama3 rope scaling needs `{key}`, which is missing")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise UserError(f"{where}: `{key}` must be a positive number, got {v!r}")
        values[key] = v
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
