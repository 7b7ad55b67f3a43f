"""The torch peer for the benchmarks: a gpt-fast-style Llama on the same weights as polymorph.

bf16, a static KV cache [B, Hkv, max_ctx, Dh] per layer written with index_copy_, SDPA with a boolean
mask and grouped-query attention, no graph breaks, so `torch.compile(fullgraph=True)` with
mode="reduce-overhead" (CUDA graphs) or "max-autotune" sees the whole decode step. Weights are the
Hugging Face names of polymorph's graph, so both systems read the very same tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polymorph.ir.ops import OPS, normalize_attrs
from polymorph.models.config import ModelConfig
from polymorph.reference import rope_inv_freq


class PeerLlama(torch.nn.Module):
    def __init__(
        self, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, batch: int, max_ctx: int
    ) -> None:
        super().__init__()
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
            gate = F.linear(h, w[f"{p}.mlp.gate_proj.weight"])
            up = F.linear(h, w[f"{p}.mlp.up_proj.weight"])
            x = x + F.linear(F.silu(gate) * up, w[f"{p}.mlp.down_proj.weight"])
        x = self._rms(x, w["model.norm.weight"])
        return F.linear(x, self.lm_head).float()
