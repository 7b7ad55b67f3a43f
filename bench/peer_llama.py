"""The torch peer for the benchmarks: a gpt-fast-style Llama (and Mixtral) on the same weights as
polymorph.

bf16, a static KV cache [B, Hkv, max_ctx, Dh] per layer written with index_copy_, SDPA with a boolean
mask and grouped-query attention, no graph breaks, so `torch.compile(fullgraph=True)` with
mode="reduce-overhead" (CUDA graphs) or "max-autotune" sees the whole decode step. Weights are the
Hugging Face names of polymorph's graph (experts stacked per layer as polymorph stacks them), so both
systems read the very same tensors.

Mixtral's experts, as gpt-fast does them: when the step routes fewer token-slots than there are experts
(batch-1 decode), the chosen experts' weights are gathered by index and applied with einsum, reading
only those experts; otherwise every expert runs on every token and a routing mask zeroes the
unchosen ones, which reads each expert's weights once, as a grouped GEMM would. Both are static in
shape, so the compiled step has no graph break. Qwen3-MoE (q/k norms) has no peer here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polymorph.ir.ops import OPS, normalize_attrs
from polymorph.ir.reference import rope_inv_freq
from polymorph.models.config import ModelConfig
from polymorph.models.decoder import expert_param_names, ffn_prefix


class PeerLlama(torch.nn.Module):
    def __init__(
        self, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, batch: int, max_ctx: int
    ) -> None:
        super().__init__()
        if cfg.model_type not in ("llama", "mixtral"):
            raise ValueError(f"the torch peer implements llama and mixtral, not {cfg.model_type}")
        self.cfg = cfg
        self.w = weights
        ref = weights["model.embed_tokens.weight"]
        dtype, device = ref.dtype, ref.device
        hd, hkv = cfg.head_dim, cfg.num_key_value_heads
        shape = (batch, hkv, max_ctx, hd)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        attrs = normalize_attrs(OPS["rope"], cfg.rope.op_attrs())
        inv = torch.from_numpy(rope_inv_freq(hd, attrs)).to(device)
        angles = torch.arange(max_ctx, device=device, dtype=torch.float32)[:, None] * inv  # [T, Dh/2]
        self.cos, self.sin = angles.cos(), angles.sin()
        self.mask = torch.tril(torch.ones(max_ctx, max_ctx, dtype=torch.bool, device=device))
        self.lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        self.last_only = False  # polymorph's graphs give the last token's logits; tests set this

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).to(x.dtype) * w

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: [B, S, H, Dh]; rotate-half, in float32
        cos, sin = self.cos[pos][None, :, None, :], self.sin[pos][None, :, None, :]
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, S], input_pos [S] (the same positions for every sequence) -> logits [B, S, V] f32."""
        cfg, w = self.cfg, self.w
        b, s = tokens.shape
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        x = F.embedding(tokens, w["model.embed_tokens.weight"])
        mask = self.mask[input_pos][None, None]  # [1, 1, S, T]
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}"
            h = self._rms(x, w[f"{p}.input_layernorm.weight"])
            q = F.linear(h, w[f"{p}.self_attn.q_proj.weight"]).view(b, s, nh, hd)
            k = F.linear(h, w[f"{p}.self_attn.k_proj.weight"]).view(b, s, nkv, hd)
            v = F.linear(h, w[f"{p}.self_attn.v_proj.weight"]).view(b, s, nkv, hd)
            q, k = self._rope(q, input_pos), self._rope(k, input_pos)
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc.index_copy_(2, input_pos, k.transpose(1, 2))
            vc.index_copy_(2, input_pos, v.transpose(1, 2))
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kc, vc, attn_mask=mask, enable_gqa=True)
            y = y.transpose(1, 2).reshape(b, s, nh * hd)
            x = x + F.linear(y, w[f"{p}.self_attn.o_proj.weight"])
            h = self._rms(x, w[f"{p}.post_attention_layernorm.weight"])
            if cfg.model_type == "llama":
                gate = F.linear(h, w[f"{p}.mlp.gate_proj.weight"])
                up = F.linear(h, w[f"{p}.mlp.up_proj.weight"])
                x = x + F.linear(F.silu(gate) * up, w[f"{p}.mlp.down_proj.weight"])
            else:
                x = x + self._experts(h, i)
        x = self._rms(x, w["model.norm.weight"])
        if self.last_only:
            x = x[:, -1:]
        return F.linear(x, self.lm_head).float()

    def _experts(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """Mixtral's sparse MLP: top-k of the router logits, softmax over the k, SwiGLU experts."""
        cfg, w = self.cfg, self.w
        mp = ffn_prefix(cfg, layer)
        wg, wu, wd = (w[n] for n in expert_param_names(mp))  # [E, F, D], [E, F, D], [E, D, F]
        logits = F.linear(h, w[f"{mp}.gate.weight"]).float()  # [B, S, E]
        vals, idx = logits.topk(cfg.num_experts_per_tok, dim=-1)
        weights = torch.softmax(vals, dim=-1).to(h.dtype)  # [B, S, k]
        if idx.numel() < cfg.num_experts:  # gather the chosen experts only
            g = torch.einsum("bsd,bskfd->bskf", h, wg[idx])
            u = torch.einsum("bsd,bskfd->bskf", h, wu[idx])
            y = torch.einsum("bskf,bskdf->bskd", F.silu(g) * u, wd[idx])
            return (y * weights[..., None]).sum(dim=2)
        mask = torch.zeros(*idx.shape[:-1], cfg.num_experts, dtype=h.dtype, device=h.device)
        mask.scatter_(-1, idx, weights)  # [B, S, E]: the routing weight, 0 where not chosen
        g = torch.einsum("bsd,efd->bsef", h, wg)
        u = torch.einsum("bsd,efd->bsef", h, wu)
        y = torch.einsum("bsef,edf->bsed", F.silu(g) * u, wd)
        return (y * mask[..., None]).sum(dim=2)
