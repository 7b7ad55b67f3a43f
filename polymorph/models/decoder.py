"""Graph builders for decoder-only transformers: the dense Llama (2, 3, 3.1, 3.2), Mistral, Qwen2 and
Qwen3, and the MoE Mixtral and Qwen3-MoE.

One step of the model, for any mix of prefill and decode: `seq` new tokens per sequence at absolute
`positions`, written into the paged KV cache and attended causally over everything the cache holds
up to each token's position. Parameter names are the Hugging Face checkpoint's, except the experts
of an MoE layer, which are stacked per layer (see `weights.expert_param_names`).

Symbols: batch, seq, ctx_blocks (blocks per sequence in the block table), cache_blocks (the pool).
"""

from __future__ import annotations

from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.models.config import ModelConfig

DEFAULT_BLOCK_SIZE = 16


def expert_param_names(prefix: str) -> tuple[str, str, str]:
    """Stacked expert weights of one MoE layer: w_gate [E, F, D], w_up [E, F, D], w_down [E, D, F]."""
    return f"{prefix}.experts.w_gate", f"{prefix}.experts.w_up", f"{prefix}.experts.w_down"


def moe_prefix(cfg: ModelConfig, layer: int) -> str:
    block = "block_sparse_moe" if cfg.model_type == "mixtral" else "mlp"
    return f"model.layers.{layer}.{block}"


def build_decoder(
    cfg: ModelConfig,
    *,
    name: str,
    dtype: DType = DType.F32,
    block_size: int = DEFAULT_BLOCK_SIZE,
    all_logits: bool = False,
    num_layers: int | None = None,
) -> Graph:
    """The forward step of `cfg` as a verified graph.

    Inputs: tokens [batch, seq] i32, positions [batch, seq] i32, block_table [batch, ctx_blocks] i32.
    Output `logits`: f32 [batch, seq, vocab] with `all_logits`, else [batch, 1, vocab] (last token).
    `num_layers` builds only the first layers (the engine's fast tier); default: all of them.
    """
    layers = cfg.num_hidden_layers if num_layers is None else num_layers
    g = GraphBuilder(
        name,
        meta={
            "model_type": cfg.model_type,
            "dtype": dtype.value,
            "block_size": block_size,
            "layers": layers,
            "all_logits": all_logits,
        },
    )
    d, hd = cfg.hidden_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    tokens = g.input("tokens", DType.I32, ("batch", "seq"))
    positions = g.input("positions", DType.I32, ("batch", "seq"))
    table = g.input("block_table", DType.I32, ("batch", "ctx_blocks"))
    embed = g.param("model.embed_tokens.weight", dtype, (cfg.vocab_size, d))
    x = g.op("embedding", "embed", embed, tokens)  # [B, S, D]
    rope = cfg.rope.op_attrs()
    eps = cfg.rms_norm_eps

    def linear(node: str, x: str, weight: str, n_out: int, n_in: int, bias: bool) -> str:
        w = g.param(f"{weight}.weight", dtype, (n_out, n_in))
        if bias:
            b = g.param(f"{weight}.bias", dtype, (n_out,))
            return g.op("linear", node, x, w, b)
        return g.op("linear", node, x, w)

    for i in range(layers):
        p, n = f"model.layers.{i}", f"layers.{i}"
        # --- attention
        h = g.op("rmsnorm", f"{n}.attn.norm", x, g.param(f"{p}.input_layernorm.weight", dtype, (d,)), eps=eps)
        qkv_bias = cfg.qkv_bias
        q = linear(f"{n}.attn.q", h, f"{p}.self_attn.q_proj", nh * hd, d, qkv_bias)
        k = linear(f"{n}.attn.k", h, f"{p}.self_attn.k_proj", nkv * hd, d, qkv_bias)
        v = linear(f"{n}.attn.v", h, f"{p}.self_attn.v_proj", nkv * hd, d, qkv_bias)
        q = g.op("reshape", f"{n}.attn.q_heads", q, shape=("batch", "seq", nh, hd))  # [B, S, H, Dh]
        k = g.op("reshape", f"{n}.attn.k_heads", k, shape=("batch", "seq", nkv, hd))
        v = g.op("reshape", f"{n}.attn.v_heads", v, shape=("batch", "seq", nkv, hd))
        if cfg.qk_norm:  # per-head RMSNorm of q and k before rope (Qwen3)
            q = g.op(
                "rmsnorm",
                f"{n}.attn.q_norm",
                q,
                g.param(f"{p}.self_attn.q_norm.weight", dtype, (hd,)),
                eps=eps,
            )
            k = g.op(
                "rmsnorm",
                f"{n}.attn.k_norm",
                k,
                g.param(f"{p}.self_attn.k_norm.weight", dtype, (hd,)),
                eps=eps,
            )
        q = g.op("rope", f"{n}.attn.q_rope", q, positions, **rope)
        k = g.op("rope", f"{n}.attn.k_rope", k, positions, **rope)
        kc = g.state(f"layers.{i}.k_cache", dtype, ("cache_blocks", block_size, nkv, hd))
        vc = g.state(f"layers.{i}.v_cache", dtype, ("cache_blocks", block_size, nkv, hd))
        kc = g.op("kv_write", f"{n}.attn.k_write", kc, k, table, positions)
        vc = g.op("kv_write", f"{n}.attn.v_write", vc, v, table, positions)
        g.update(f"layers.{i}.k_cache", kc)
        g.update(f"layers.{i}.v_cache", vc)
        a = g.op("cache_attention", f"{n}.attn.sdpa", q, kc, vc, table, positions, scale=hd**-0.5)
        a = g.op("reshape", f"{n}.attn.merge", a, shape=("batch", "seq", nh * hd))
        o = linear(f"{n}.attn.o", a, f"{p}.self_attn.o_proj", d, nh * hd, cfg.o_bias)
        x = g.op("add", f"{n}.attn.residual", x, o)
        # --- feed-forward
        h = g.op(
            "rmsnorm",
            f"{n}.mlp.norm",
            x,
            g.param(f"{p}.post_attention_layernorm.weight", dtype, (d,)),
            eps=eps,
        )
        if not cfg.is_moe:
            f, mb = cfg.intermediate_size, cfg.mlp_bias
            gate = linear(f"{n}.mlp.gate", h, f"{p}.mlp.gate_proj", f, d, mb)
            up = linear(f"{n}.mlp.up", h, f"{p}.mlp.up_proj", f, d, mb)
            act = g.op("mul", f"{n}.mlp.swiglu", g.op("silu", f"{n}.mlp.silu", gate), up)
            y = linear(f"{n}.mlp.down", act, f"{p}.mlp.down_proj", d, f, mb)
        else:
            mp, e, f = moe_prefix(cfg, i), cfg.num_experts, cfg.expert_intermediate_size
            logits = linear(f"{n}.moe.router", h, f"{mp}.gate", e, d, False)  # [B, S, E]
            mode = "topk_softmax" if cfg.model_type == "mixtral" else "softmax_topk"
            w, idx = g.op(
                "topk_router",
                f"{n}.moe.topk",
                logits,
                outputs=(f"{n}.moe.topk.weights", f"{n}.moe.topk.indices"),
                k=cfg.num_experts_per_tok,
                mode=mode,
                normalize=bool(cfg.norm_topk_prob),
            )
            wg, wu, wd = expert_param_names(mp)
            y = g.op(
                "moe_ffn",
                f"{n}.moe.experts",
                h,
                w,
                idx,
                g.param(wg, dtype, (e, f, d)),
                g.param(wu, dtype, (e, f, d)),
                g.param(wd, dtype, (e, d, f)),
            )
        x = g.op("add", f"{n}.mlp.residual", x, y)

    if not all_logits:  # the norm is per token: slice first, normalize one row per sequence
        x = g.op("slice", "last_token", x, axis=1, start=-1, end=None)  # [B, 1, D]
    x = g.op("rmsnorm", "final_norm", x, g.param("model.norm.weight", dtype, (d,)), eps=eps)
    head = embed if cfg.tie_word_embeddings else g.param("lm_head.weight", dtype, (cfg.vocab_size, d))
    logits = g.op("linear", "lm_head", x, head)
    if dtype != DType.F32:
        logits = g.op("cast", "logits_f32", logits, dtype="f32")
    g.output("logits", logits)
    return g.build(check=False)  # verified by the compile stages (tests/models verify every family)
