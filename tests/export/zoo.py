"""Models beyond LLMs, built at test time with random weights, and example inputs for each."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


class ConvEncoderDecoder(nn.Module):
    """A weather-style encoder/decoder: conv2d, group norm, pooling, bilinear and nearest upsampling."""

    def __init__(self, channels: int = 3, width: int = 8) -> None:
        super().__init__()
        self.enc1 = nn.Conv2d(channels, width, 3, padding=1)
        self.norm1 = nn.GroupNorm(2, width)
        self.enc2 = nn.Conv2d(width, 2 * width, 3, stride=1, padding=2, dilation=2, groups=2)
        self.norm2 = nn.BatchNorm2d(2 * width)
        self.mid = nn.Conv2d(2 * width, 2 * width, 1)
        self.dec = nn.Conv2d(3 * width, width, 3, padding=1)
        self.out = nn.Conv2d(width, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, H, W]
        h1 = F.gelu(self.norm1(self.enc1(x)))  # [B, w, H, W]
        h2 = F.max_pool2d(h1, 2)  # [B, w, H/2, W/2]
        h2 = F.silu(self.norm2(self.enc2(h2)))  # [B, 2w, H/2, W/2]
        h3 = F.avg_pool2d(self.mid(h2), 2)  # [B, 2w, H/4, W/4]
        up = F.interpolate(h3, scale_factor=2, mode="nearest")  # [B, 2w, H/2, W/2]
        up = F.interpolate(up + h2, scale_factor=2, mode="bilinear", align_corners=False)
        y = self.dec(torch.cat([up, h1], dim=1))
        return self.out(torch.relu(y)) + x


class MessagePassing(nn.Module):
    """A message-passing graph network: edge messages by index_select, aggregation by index_add and
    scatter_add (mean over in-degree)."""

    def __init__(self, features: int = 8, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(features, hidden)
        self.message = nn.ModuleList(nn.Linear(2 * hidden, hidden) for _ in range(layers))
        self.update = nn.ModuleList(nn.Linear(2 * hidden, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        # x: [N, F] node features; edges: [2, E] (source, destination) node ids
        src, dst = edges[0], edges[1]
        h = torch.tanh(self.embed(x))  # [N, H]
        ones = torch.ones_like(dst, dtype=h.dtype)
        degree = torch.zeros(h.shape[0], dtype=h.dtype).index_add(0, dst, ones).clamp(min=1.0)
        for message, update in zip(self.message, self.update, strict=True):
            m = F.relu(message(torch.cat([h.index_select(0, src), h.index_select(0, dst)], dim=-1)))
            agg = torch.zeros_like(h).scatter_add(0, dst[:, None].expand(-1, h.shape[1]), m)
            h = self.norm(h + update(torch.cat([h, agg / degree[:, None]], dim=-1)))
        return self.head(h).squeeze(-1)  # [N]


class SpectralConv2d(nn.Module):
    """The Fourier layer of an FNO, written with torch.fft (rfft2, complex weights, irfft2)."""

    def __init__(self, channels: int, modes: int) -> None:
        super().__init__()
        scale = 1 / (channels * channels)
        self.modes = modes
        self.w1 = nn.Parameter(scale * torch.randn(channels, channels, modes, modes, dtype=torch.cfloat))
        self.w2 = nn.Parameter(scale * torch.randn(channels, channels, modes, modes, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        m = self.modes
        x_ft = torch.fft.rfft2(x)  # [B, C, H, W/2+1] complex
        out = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m, :m], self.w1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m:, :m], self.w2)
        return torch.fft.irfft2(out, s=(h, w))


class HandFNO(nn.Module):
    """A two-layer Fourier neural operator (lift, spectral + pointwise layers, project)."""

    def __init__(self, channels: int = 8, modes: int = 4) -> None:
        super().__init__()
        self.lift = nn.Conv2d(3, channels, 1)
        self.spectral = nn.ModuleList(SpectralConv2d(channels, modes) for _ in range(2))
        self.pointwise = nn.ModuleList(nn.Conv2d(channels, channels, 1) for _ in range(2))
        self.project = nn.Conv2d(channels, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lift(x)
        for spectral, pointwise in zip(self.spectral, self.pointwise, strict=True):
            h = F.gelu(spectral(h) + pointwise(h))
        return self.project(h)


def fno() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return HandFNO().eval(), (torch.randn(2, 3, 16, 16),)


def neuralop_fno() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """neuraloperator's own FNO (pip install neuraloperator)."""
    from neuralop.models import FNO

    model = FNO(n_modes=(4, 4), in_channels=3, out_channels=1, hidden_channels=8, n_layers=2)
    return model.eval(), (torch.randn(2, 3, 16, 16),)


def conv() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model = ConvEncoderDecoder().eval()
    with torch.no_grad():  # non-trivial running statistics, so batch norm is not the identity
        model.norm2.running_mean.uniform_(-0.5, 0.5)
        model.norm2.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(2, 3, 16, 16),)


def gnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 12, (2, 40), generator=g)
    return MessagePassing().eval(), (torch.randn(12, 8), edges)


def esm() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import EsmConfig, EsmModel

    cfg = EsmConfig(
        vocab_size=33,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        position_embedding_type="rotary",
        pad_token_id=1,
        mask_token_id=32,
        token_dropout=False,
    )
    model = EsmModel(cfg, add_pooling_layer=False).eval()
    return model, (torch.randint(4, 30, (2, 12)),)


def patchtst() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    cfg = PatchTSTConfig(
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=16,
        num_attention_heads=2,
        num_hidden_layers=2,
        ffn_dim=32,
        dropout=0.0,
        attention_dropout=0.0,
        ff_dropout=0.0,
        head_dropout=0.0,
    )
    model = PatchTSTForPrediction(cfg).eval()
    return model, (torch.randn(2, 32, 3),)


def llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    return LlamaForCausalLM(cfg).eval(), (torch.randint(0, 64, (1, 9)),)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "fno": fno, "neuralop_fno": neuralop_fno, "conv": conv, "gnn": gnn, "esm": esm, "patchtst": patchtst, "llama": llama,
}  # fmt: skip
