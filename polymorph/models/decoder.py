"""Graph builders for decoder-only transformers: the dense Llama (2, 3, 3.1, 3.2), Mistral, Qwen2,
Qwen3, Gemma 2, Gemma 3, Phi-3 and Granite, and the MoE Mixtral, Qwen3-MoE, OLMoE, GLM-4.5, MiniMax-M2,
gpt-oss and Llama 4.

One step of the model, for any mix of prefill and decode: `seq` new tokens per sequence at absolute
`positions`, written into the paged KV cache and attended causally over everything the cache holds
up to each token's position (within the layer's sliding window, if it has one). Parameter names are
the Hugging Face checkpoint's, except the experts of an MoE layer, which are stacked per layer (see
`weights.expert_param_names`, `expert_bias_names`), and Phi-3's fused `qkv_proj` and `gate_up_proj`, which the graph reads
as the q/k/v and gate/up projections of the other families (split at load, `weights._find`).
Gemma's (1 + w) RMSNorm weights are folded at load (graph meta `norm_weight_offset`).

Symbols: batch, seq, ctx_blocks (blocks per sequence in the block table), cache_blocks (the pool).
"""

from __future__ import annotations

from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.models.config import ModelConfig

DEFAULT_BLOCK_SIZE = 16
# The latent norms of the DeepSeek-V3 line (q_a_layernorm, kv_a_layernorm) keep their class default
# eps, whatever rms_norm_eps says (DeepseekV3RMSNorm(rank) in DeepseekV3Attention and its heirs).
LATENT_EPS = 1e-6


def expert_param_names(prefix: str) -> tuple[str, str, str]:
    """Stacked expert weights of one MoE layer: w_gate [E, F, D], w_up [E, F, D], w_down [E, D, F]."""
    return f"{prefix}.experts.w_gate", f"{prefix}.experts.w_up", f"{prefix}.experts.w_down"


def expert_bias_names(prefix: str) -> tuple[str, str, str]:
    """Stacked expert biases (gpt-oss): b_gate [E, F], b_up [E, F], b_down [E, D]."""
    return f"{prefix}.experts.b_gate", f"{prefix}.experts.b_up", f"{prefix}.experts.b_down"


def ffn_prefix(cfg: ModelConfig, layer: int) -> str:
    """The feed-forward module of `layer`: `mlp` (Mixtral and MiniMax-M2 experts: `block_sparse_moe`;
    Llama 4: `feed_forward`)."""
    if cfg.model_type == "llama4_text":
        block = "feed_forward"
    elif cfg.model_type in ("mixtral", "minimax_m2") and cfg.layer_is_moe(layer):
        block = "block_sparse_moe"
    else:
        block = "mlp"
    return f"model.layers.{layer}.{block}"


def router_name(cfg: ModelConfig) -> str:
    """The router projection's module under the MoE block (`gate`; gpt-oss and Llama 4: `router`)."""
    return "router" if cfg.model_type in ("gpt_oss", "llama4_text") else "gate"


def l2_norm_name(layer: int) -> str:
    """Llama 4's q/k L2 norm as an RMSNorm of weight 1: a weight the checkpoint does not have, made
    at load (`weights.py`)."""
    return f"model.layers.{layer}.self_attn.qk_norm.weight"


def selection_bias_name(cfg: ModelConfig, layer: int) -> str:
    """The correction bias of a sigmoid router: under the router (GLM-4.5) or the block (MiniMax-M2)."""
    under = "" if cfg.model_type == "minimax_m2" else ".gate"
    return f"{ffn_prefix(cfg, layer)}{under}.e_score_correction_bias"


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
    meta: dict[str, object] = {
        "model_type": cfg.model_type,
        "dtype": dtype.value,
        "block_size": block_size,
        "layers": layers,
        "all_logits": all_logits,
    }
    if cfg.is_gemma:  # the checkpoint stores w of x / rms(x) * (1 + w): the loader adds the 1
        meta["norm_weight_offset"] = 1.0
    if cfg.is_mla and cfg.rope_interleave:  # the same reordering of the rope rows (weights.py)
        meta.update(mla_rope_interleaved=True, head_dim=cfg.head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim)
    if cfg.indexer_rope_interleave:  # GLM-5's indexer: its rope rows too
        meta.update(indexer_rope_interleaved=True, index_head_dim=cfg.index_head_dim)
    if cfg.model_type == "llama4_text":
        # Llama 4 rotates pairs of adjacent dims (complex rope); the rope op rotates halves. The loader
        # reorders each head's q and k projection rows (even dims, then odd) on these layers, which
        # gives the same scores: q and k move alike, v and the output do not move.
        meta["rope_interleaved_layers"] = [i for i in range(layers) if cfg.layer_uses_rope(i)]
        meta["head_dim"] = cfg.head_dim
    g = GraphBuilder(name, meta=meta)
    d, hd = cfg.hidden_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    tokens = g.input("tokens", DType.I32, ("batch", "seq"))
    positions = g.input("positions", DType.I32, ("batch", "seq"))
    table = g.input("block_table", DType.I32, ("batch", "ctx_blocks"))
    embed = g.param("model.embed_tokens.weight", dtype, (cfg.vocab_size, d))
    x = g.op("embedding", "embed", embed, tokens)  # [B, S, D]
    if cfg.is_gemma:  # Gemma rounds its normalizer sqrt(hidden) to the activation dtype first
        x = g.op("scale", "embed_scale", x, factor=d**0.5, round_factor_to_dtype=True)
    elif cfg.embedding_multiplier != 1.0:
        x = g.op("scale", "embed_scale", x, factor=cfg.embedding_multiplier)
    eps = cfg.rms_norm_eps

    def linear(node: str, x: str, weight: str, n_out: int, n_in: int, bias: bool) -> str:
        w = g.param(f"{weight}.weight", dtype, (n_out, n_in))
        if bias:
            b = g.param(f"{weight}.bias", dtype, (n_out,))
            return g.op("linear", node, x, w, b)
        return g.op("linear", node, x, w)

    def norm(node: str, x: str, weight: str, width: int, at: float | None = None) -> str:
        return g.op(
            "rmsnorm", node, x, g.param(f"{weight}.weight", dtype, (width,)), eps=eps if at is None else at
        )

    def residual(node: str, x: str, branch: str) -> str:
        if cfg.residual_multiplier != 1.0:  # Granite scales each branch before adding it
            branch = g.op("scale", f"{node}_scale", branch, factor=cfg.residual_multiplier)
        return g.op("add", node, x, branch)

    def mlp(node: str, h: str, prefix: str, f: int) -> str:
        """A dense gated MLP: down(act(gate h) * up h)."""
        mb = cfg.mlp_bias
        gate = linear(f"{node}.gate", h, f"{prefix}.gate_proj", f, d, mb)
        up = linear(f"{node}.up", h, f"{prefix}.up_proj", f, d, mb)
        if cfg.hidden_act == "silu":
            act = g.op("silu", f"{node}.silu", gate)
        else:
            approximate = "tanh" if cfg.hidden_act == "gelu_tanh" else "none"
            act = g.op("gelu", f"{node}.gelu", gate, approximate=approximate)
        act = g.op("mul", f"{node}.{'swiglu' if cfg.hidden_act == 'silu' else 'geglu'}", act, up)
        return linear(f"{node}.down", act, f"{prefix}.down_proj", d, f, mb)

    def moe(n: str, i: int, h: str) -> str:
        """The routed experts of layer i: the router's top-k, then each token's experts, weighted."""
        mp, e, f = ffn_prefix(cfg, i), cfg.num_experts, cfg.expert_intermediate_size
        assert e is not None and f is not None
        router = f"{mp}.{router_name(cfg)}"
        if cfg.router_in_f32 and dtype != DType.F32:
            h32 = g.op("cast", f"{n}.moe.router_in", h, dtype="f32")
            logits = g.op("linear", f"{n}.moe.router", h32, g.param(f"{router}.weight", DType.F32, (e, d)))
        else:
            logits = linear(f"{n}.moe.router", h, router, e, d, cfg.router_bias)  # [B, S, E]
        bias = (g.param(selection_bias_name(cfg, i), DType.F32, (e,)),) if cfg.selection_bias else ()
        router_attrs: dict[str, object] = {
            "k": cfg.num_experts_per_tok, "mode": cfg.router, "normalize": bool(cfg.norm_topk_prob),
        }  # fmt: skip
        if cfg.router_groups > 1:
            router_attrs.update(groups=cfg.router_groups, topk_groups=cfg.router_topk_groups)
        if cfg.routed_scaling != 1.0:
            router_attrs["scaling"] = cfg.routed_scaling
        w, idx = g.op(
            "topk_router",
            f"{n}.moe.topk",
            logits,
            *bias,
            outputs=(f"{n}.moe.topk.weights", f"{n}.moe.topk.indices"),
            **router_attrs,
        )
        wg, wu, wd = expert_param_names(mp)
        experts = [
            g.param(wg, dtype, (e, f, d)),
            g.param(wu, dtype, (e, f, d)),
            g.param(wd, dtype, (e, d, f)),
        ]
        if cfg.expert_bias:
            bg, bu, bd = expert_bias_names(mp)
            experts += [g.param(bg, dtype, (e, f)), g.param(bu, dtype, (e, f)), g.param(bd, dtype, (e, d))]
        expert_attrs: dict[str, object] = {"weight_input": True} if cfg.expert_weight_input else {}
        if cfg.expert_activation != "silu":
            expert_attrs.update(
                activation=cfg.expert_activation, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit
            )
        return g.op("moe_ffn", f"{n}.moe.experts", h, w, idx, *experts, **expert_attrs)

    def mla(n: str, p: str, i: int, h: str) -> str:
        """DeepSeek-V3's multi-head latent attention, decoded in latent space: the cache holds per token
        the normalized KV latent (kv_lora_rank) and the roped shared key part (qk_rope_head_dim); each
        head's query is its nope part taken into latent space by the absorbed key up-projection (w_uk)
        next to its roped part, attends over the cache as one KV head (values: the latent part), and
        the value up-projection (w_uv) brings the output back per head."""
        r, rope_d, vd = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim
        nope = hd - rope_d
        bias = cfg.attention_bias
        cq = ""
        if cfg.q_lora_rank:
            cq = linear(f"{n}.attn.q_a", h, f"{p}.self_attn.q_a_proj", cfg.q_lora_rank, d, bias)
            cq = norm(f"{n}.attn.q_a_norm", cq, f"{p}.self_attn.q_a_layernorm", cfg.q_lora_rank, LATENT_EPS)
            q = linear(f"{n}.attn.q", cq, f"{p}.self_attn.q_b_proj", nh * hd, cfg.q_lora_rank, False)
        else:
            q = linear(f"{n}.attn.q", h, f"{p}.self_attn.q_proj", nh * hd, d, False)
        q = g.op("reshape", f"{n}.attn.q_heads", q, shape=("batch", "seq", nh, hd))
        q_nope = g.op("slice", f"{n}.attn.q_nope", q, axis=-1, start=0, end=nope)
        q_pe = g.op("slice", f"{n}.attn.q_pe", q, axis=-1, start=nope, end=None)
        q_pe = g.op("rope", f"{n}.attn.q_rope", q_pe, positions, **cfg.layer_rope(i).op_attrs())
        w_uk = g.param(f"{p}.self_attn.w_uk", dtype, (nh, r, nope))
        q_lat = g.op("head_linear", f"{n}.attn.q_absorb", q_nope, w_uk)  # [B, S, H, r]
        q_all = g.op("concat", f"{n}.attn.q_latent", q_lat, q_pe, axis=-1)  # [B, S, H, r + rope]
        kv = linear(f"{n}.attn.kv_a", h, f"{p}.self_attn.kv_a_proj_with_mqa", r + rope_d, d, bias)
        c = g.op("slice", f"{n}.attn.kv_latent", kv, axis=-1, start=0, end=r)
        c = norm(f"{n}.attn.kv_a_norm", c, f"{p}.self_attn.kv_a_layernorm", r, LATENT_EPS)
        c = g.op("reshape", f"{n}.attn.kv_latent_head", c, shape=("batch", "seq", 1, r))
        k_pe = g.op("slice", f"{n}.attn.k_pe", kv, axis=-1, start=r, end=None)
        k_pe = g.op("reshape", f"{n}.attn.k_pe_head", k_pe, shape=("batch", "seq", 1, rope_d))
        k_pe = g.op("rope", f"{n}.attn.k_rope", k_pe, positions, **cfg.layer_rope(i).op_attrs())
        entry = g.op("concat", f"{n}.attn.latent_entry", c, k_pe, axis=-1)  # [B, S, 1, r + rope]
        name = f"layers.{i}.latent_cache"
        cache = g.state(name, dtype, ("cache_blocks", block_size, 1, r + rope_d))
        kinds[name] = "latent"
        cache = g.op("kv_write", f"{n}.attn.latent_write", cache, entry, table, positions)
        g.update(name, cache)
        if cfg.index_topk:  # DeepSeek-V3.2, GLM-5: attend only where the indexer points
            if i not in cfg.indexer_shared_layers:
                selected[0] = indexer(n, p, i, h, cq)
            a = g.op("index_attention", f"{n}.attn.sdpa", q_all, cache, cache, table, positions, selected[0],
                     scale=cfg.scale)  # fmt: skip
        else:
            a = g.op(
                "cache_attention", f"{n}.attn.sdpa", q_all, cache, cache, table, positions, scale=cfg.scale
            )
        a = g.op("slice", f"{n}.attn.out_latent", a, axis=-1, start=0, end=r)  # [B, S, H, r]
        w_uv = g.param(f"{p}.self_attn.w_uv", dtype, (nh, vd, r))
        a = g.op("head_linear", f"{n}.attn.v_absorb", a, w_uv)  # [B, S, H, v]
        a = g.op("reshape", f"{n}.attn.merge", a, shape=("batch", "seq", nh * vd))
        return linear(f"{n}.attn.o", a, f"{p}.self_attn.o_proj", d, nh * vd, bias)

    selected = [""]  # the last indexer's choice, which GLM-5's shared layers reuse
    # Each state's kind (graph meta `state_kinds`): "kv" (a layer's keys or values), "latent" (MLA's
    # latent and shared rope key), "indexer" (DSA's indexer keys). All are paged caches of one layout,
    # [cache_blocks, block_size, heads, dim], written only by kv_write at the step's positions, so
    # the slot ownership, guard regions and isolation checks of a KV cache hold each of them.
    kinds: dict[str, str] = {}

    def indexer(n: str, p: str, i: int, h: str, cq: str) -> str:
        """DeepSeek-V3.2's lightning indexer: per-head queries from the q latent and one shared key per
        token (LayerNorm, rope on the first qk_rope_head_dim dims) into a one-head paged indexer cache;
        the k best positions by weighted relu scores (weights_proj in f32, times heads ** -0.5)."""
        hi, di, rope_d = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        ip = f"{p}.self_attn.indexer"
        rope = {**cfg.layer_rope(i).op_attrs(), "rotary_dim": rope_d}
        iq = linear(f"{n}.index.q", cq, f"{ip}.wq_b", hi * di, cfg.q_lora_rank, False)
        iq = g.op("reshape", f"{n}.index.q_heads", iq, shape=("batch", "seq", hi, di))
        iq = g.op("rope", f"{n}.index.q_rope", iq, positions, **rope)
        ik = linear(f"{n}.index.k", h, f"{ip}.wk", di, d, False)
        ik = g.op("layernorm", f"{n}.index.k_norm", ik, g.param(f"{ip}.k_norm.weight", dtype, (di,)),
                  g.param(f"{ip}.k_norm.bias", dtype, (di,)), eps=1e-6)  # fmt: skip
        ik = g.op("reshape", f"{n}.index.k_head", ik, shape=("batch", "seq", 1, di))
        ik = g.op("rope", f"{n}.index.k_rope", ik, positions, **rope)
        name = f"layers.{i}.indexer_cache"
        cache = g.state(name, dtype, ("cache_blocks", block_size, 1, di))
        kinds[name] = "indexer"
        cache = g.op("kv_write", f"{n}.index.write", cache, ik, table, positions)
        g.update(name, cache)
        hw = h if dtype == DType.F32 else g.op("cast", f"{n}.index.weights_in", h, dtype="f32")
        w = g.op("linear", f"{n}.index.weights", hw, g.param(f"{ip}.weights_proj.weight", DType.F32, (hi, d)))
        w = g.op("scale", f"{n}.index.weights_scale", w, factor=hi**-0.5)
        return g.op("indexer_topk", f"{n}.index.topk", iq, cache, w, table, positions, k=cfg.index_topk,
                    scale=di**-0.5)  # fmt: skip

    # Gemma: input_layernorm, post_attention_layernorm (on the attention's output), then
    # pre_feedforward_layernorm and post_feedforward_layernorm around the MLP; the others normalize the
    # MLP's input with post_attention_layernorm.
    mlp_norm = "pre_feedforward_layernorm" if cfg.is_gemma else "post_attention_layernorm"
    for i in range(layers):
        p, n = f"model.layers.{i}", f"layers.{i}"
        rope = cfg.layer_rope(i).op_attrs()
        # --- attention
        h = norm(f"{n}.attn.norm", x, f"{p}.input_layernorm", d)
        if cfg.is_mla:
            o = mla(n, p, i, h)
        else:
            qkv_bias = cfg.qkv_bias
            q = linear(f"{n}.attn.q", h, f"{p}.self_attn.q_proj", nh * hd, d, qkv_bias)
            k = linear(f"{n}.attn.k", h, f"{p}.self_attn.k_proj", nkv * hd, d, qkv_bias)
            v = linear(f"{n}.attn.v", h, f"{p}.self_attn.v_proj", nkv * hd, d, qkv_bias)
            if cfg.qk_norm_full:  # RMSNorm over the whole q and k projections (OLMoE, MiniMax-M2)
                q = norm(f"{n}.attn.q_norm", q, f"{p}.self_attn.q_norm", nh * hd)
                k = norm(f"{n}.attn.k_norm", k, f"{p}.self_attn.k_norm", nkv * hd)
            q = g.op("reshape", f"{n}.attn.q_heads", q, shape=("batch", "seq", nh, hd))  # [B, S, H, Dh]
            k = g.op("reshape", f"{n}.attn.k_heads", k, shape=("batch", "seq", nkv, hd))
            v = g.op("reshape", f"{n}.attn.v_heads", v, shape=("batch", "seq", nkv, hd))
            if cfg.qk_norm:  # per-head RMSNorm of q and k before rope (Qwen3, Gemma 3)
                q = norm(f"{n}.attn.q_norm", q, f"{p}.self_attn.q_norm", hd)
                k = norm(f"{n}.attn.k_norm", k, f"{p}.self_attn.k_norm", hd)
            if cfg.layer_uses_rope(i):
                if cfg.qk_l2_norm:  # Llama 4 normalizes after rope; a rotation keeps the norm: same result
                    unit = g.param(l2_norm_name(i), dtype, (hd,))
                    q = g.op("rmsnorm", f"{n}.attn.q_norm", q, unit, eps=eps)
                    k = g.op("rmsnorm", f"{n}.attn.k_norm", k, unit, eps=eps)
                q = g.op("rope", f"{n}.attn.q_rope", q, positions, **rope)
                k = g.op("rope", f"{n}.attn.k_rope", k, positions, **rope)
            elif cfg.attn_temperature is not None:  # Llama 4's layers without rope
                floor_scale, temperature = cfg.attn_temperature
                q = g.op("attn_temperature", f"{n}.attn.q_temperature", q, positions, floor_scale=floor_scale,
                         scale=temperature)  # fmt: skip
            kc = g.state(f"layers.{i}.k_cache", dtype, ("cache_blocks", block_size, nkv, hd))
            vc = g.state(f"layers.{i}.v_cache", dtype, ("cache_blocks", block_size, nkv, hd))
            kinds[f"layers.{i}.k_cache"] = kinds[f"layers.{i}.v_cache"] = "kv"
            kc = g.op("kv_write", f"{n}.attn.k_write", kc, k, table, positions)
            vc = g.op("kv_write", f"{n}.attn.v_write", vc, v, table, positions)
            g.update(f"layers.{i}.k_cache", kc)
            g.update(f"layers.{i}.v_cache", vc)
            attn_attrs: dict[str, object] = {"scale": cfg.scale}
            if cfg.layer_window(i):
                attn_attrs["window"] = cfg.layer_window(i)
            if cfg.attn_softcap:
                attn_attrs["softcap"] = cfg.attn_softcap
            if cfg.layer_chunk(i):
                attn_attrs["chunk"] = cfg.layer_chunk(i)
            sinks = (g.param(f"{p}.self_attn.sinks", dtype, (nh,)),) if cfg.attention_sinks else ()
            a = g.op("cache_attention", f"{n}.attn.sdpa", q, kc, vc, table, positions, *sinks, **attn_attrs)
            a = g.op("reshape", f"{n}.attn.merge", a, shape=("batch", "seq", nh * hd))
            o = linear(f"{n}.attn.o", a, f"{p}.self_attn.o_proj", d, nh * hd, cfg.o_bias)
        if cfg.is_gemma:
            o = norm(f"{n}.attn.post_norm", o, f"{p}.post_attention_layernorm", d)
        x = residual(f"{n}.attn.residual", x, o)
        # --- feed-forward
        h = norm(f"{n}.mlp.norm", x, f"{p}.{mlp_norm}", d)
        if cfg.layer_is_moe(i):
            y = moe(n, i, h)
            if cfg.shared_expert_size:  # GLM-4.5, Llama 4: shared experts on every token, added
                module = "shared_expert" if cfg.model_type == "llama4_text" else "shared_experts"
                shared = f"{ffn_prefix(cfg, i)}.{module}"
                y = g.op(
                    "add", f"{n}.moe.shared_add", y, mlp(f"{n}.moe.shared", h, shared, cfg.shared_expert_size)
                )
        else:
            y = mlp(f"{n}.mlp", h, ffn_prefix(cfg, i), cfg.intermediate_size)
        if cfg.is_gemma:
            y = norm(f"{n}.mlp.post_norm", y, f"{p}.post_feedforward_layernorm", d)
        x = residual(f"{n}.mlp.residual", x, y)

    if not all_logits:  # the norm is per token: slice first, normalize one row per sequence
        x = g.op("slice", "last_token", x, axis=1, start=-1, end=None)  # [B, 1, D]
    x = norm("final_norm", x, "model.norm", d)
    head = embed if cfg.tie_word_embeddings else g.param("lm_head.weight", dtype, (cfg.vocab_size, d))
    logits = g.op("linear", "lm_head", x, head)
    if cfg.logits_scaling != 1.0:  # Granite divides the logits
        logits = g.op("scale", "logits_scale", logits, factor=1.0 / cfg.logits_scaling)
    if cfg.final_softcap:
        logits = g.op("softcap", "logits_softcap", logits, cap=cfg.final_softcap)
    if dtype != DType.F32:
        logits = g.op("cast", "logits_f32", logits, dtype="f32")
    g.output("logits", logits)
    g.graph.meta["state_kinds"] = kinds
    return g.build(check=False)  # verified by the compile stages (tests/models verify every family)
