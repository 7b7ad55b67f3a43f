"""Small models of many layer kinds, built at test time with random weights, and their example inputs:
the breadth battery of tests/export/test_breadth.py (each one forward against PyTorch eager)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


class ResNetBN(nn.Module):
    """A ResNet-style CNN: strided conv, BatchNorm (eval, running stats), residual blocks, a 1x1
    projection shortcut, max pool with padding, adaptive avg pool and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 5, stride=2, padding=2, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.c1 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.proj = nn.Conv2d(8, 16, 1, stride=2)
        self.head = nn.Linear(16, 5)
        for bn in (self.bn0, self.bn1, self.bn2):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, 3, H, W]
        h = F.relu(self.bn0(self.stem(x)))
        h = F.max_pool2d(h, 3, stride=2, padding=1)
        y = F.relu(self.bn1(self.c1(h)))
        y = self.bn2(self.c2(y))
        h = F.relu(y + self.proj(h))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class UNet(nn.Module):
    """A UNet: ConvTranspose2d upsampling, skip concatenations, nearest and bilinear interpolation
    (with and without align_corners), max pool with ceil_mode on an odd size."""

    def __init__(self) -> None:
        super().__init__()
        self.d1 = nn.Conv2d(2, 8, 3, padding=1)
        self.d2 = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.u1 = nn.Conv2d(16, 8, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.out = nn.Conv2d(4 + 8 + 2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, 2, 12, 12]
        a = F.relu(self.d1(x))  # [B, 8, 12, 12]
        b = F.max_pool2d(a, 2)  # [B, 8, 6, 6]
        b = F.relu(self.d2(b))  # [B, 16, 6, 6]
        c = F.max_pool2d(b, 2, ceil_mode=True)  # [B, 16, 3, 3]
        c = F.interpolate(c, size=(6, 6), mode="bilinear", align_corners=True)
        u = self.up(c + b)  # [B, 8, 12, 12]
        u = F.relu(self.u1(torch.cat([u, a], dim=1)))  # [B, 8, 12, 12]
        v = self.up2(F.avg_pool2d(u, 2))  # [B, 4, 12, 12]
        n = F.interpolate(F.avg_pool2d(a, 4), scale_factor=4, mode="nearest")  # [B, 8, 12, 12]
        s = F.interpolate(F.avg_pool2d(x, 2), scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.out(torch.cat([v, n, s], dim=1))


class TCN(nn.Module):
    """A 1-d conv time-series model: dilated causal convs (left padding), a depthwise conv (groups =
    channels) with stride, a pointwise conv, max/avg pooling 1-d, linear interpolation back up."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Conv1d(3, 12, 1)
        self.dil = nn.Conv1d(12, 12, 3, dilation=2)
        self.dw = nn.Conv1d(12, 12, 5, stride=2, padding=2, groups=12)
        self.pw = nn.Conv1d(12, 6, 1)
        self.grp = nn.Conv1d(6, 6, 3, padding=1, groups=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, 3, T]
        h = self.inp(x)
        h = h + F.leaky_relu(self.dil(F.pad(h, (4, 0))), 0.1)  # causal: [B, 12, T]
        h = F.elu(self.dw(h))  # [B, 12, T/2]
        h = self.grp(F.hardswish(self.pw(h)))
        p = F.max_pool1d(h, 2) + F.avg_pool1d(h, 2)
        return F.interpolate(p, scale_factor=4, mode="linear", align_corners=False)


class Conv3d(nn.Module):
    """3-d convolution with stride, padding and groups; 3-d pooling; trilinear upsampling; InstanceNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv3d(2, 4, 3, padding=1)
        self.c2 = nn.Conv3d(4, 8, 3, stride=2, padding=1, groups=2)
        self.norm = nn.InstanceNorm3d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, 2, D, H, W]
        h = F.silu(self.c1(x))
        h = self.norm(self.c2(h))
        m = F.max_pool3d(h, 2) + F.avg_pool3d(h, 2)
        return F.interpolate(m, scale_factor=2, mode="trilinear", align_corners=False)


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer (batch first, gelu, norm first) with a key padding mask from lengths,
    over embeddings plus positions from arange; mean pooling over the unmasked positions."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.pos = nn.Embedding(10, 16)
        self.layer = nn.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True, activation="gelu", norm_first=True
        )
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # ids: [B, S] token ids; lengths: [B] in [1, S]
        pos = torch.arange(ids.shape[1])
        pad = pos[None, :] >= lengths[:, None]  # [B, S] True where padded
        h = self.embed(ids) + self.pos(pos)[None]
        h = self.layer(h, src_key_padding_mask=pad)
        keep = (~pad).to(h.dtype)[..., None]
        return self.head((h * keep).sum(1) / keep.sum(1))


class CausalMHA(nn.Module):
    """nn.MultiheadAttention with a float attn mask (causal, -inf above the diagonal) and the averaged
    attention weights as a second output; post-norm encoder layer with relu; a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(12, 3, batch_first=True)
        self.layer = nn.TransformerEncoderLayer(12, 2, 24, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        # x: [B, S, E]; memory: [B, M, E]
        s = x.shape[1]
        mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
        y, _ = self.mha(x, x, x, attn_mask=mask, need_weights=False)
        z, w = self.mha(y, memory, memory)
        return {"out": self.layer(z), "weights": w}


class Activations(nn.Module):
    """Elementwise activations and math ops, each on a linear's output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        terms = [
            F.gelu(h, approximate="tanh"),
            F.silu(h),
            F.mish(h),
            F.softplus(h),
            F.softplus(h, beta=2.0, threshold=1.0),
            F.leaky_relu(h, 0.2),
            F.hardswish(h),
            F.hardsigmoid(h),
            F.elu(h),
            F.selu(h),
            F.celu(h, 0.5),
            F.relu6(h * 4),
            F.hardtanh(h, -0.5, 0.5),
            torch.clamp(h, -0.3, 0.7),
            torch.sign(h) * torch.abs(h),
            torch.abs(h).pow(1.5),
            torch.rsqrt(h * h + 1),
            torch.log1p(torch.abs(h)),
            torch.erf(h),
            torch.expm1(h.clamp(max=2)),
            torch.sigmoid(h) * torch.tanh(h),
            torch.exp2(h.clamp(max=3)),
            torch.log2(h.abs() + 1),
            torch.square(h),
            torch.reciprocal(h.abs() + 0.5),
            F.logsigmoid(h),
            F.softsign(h),
            F.rrelu(h, 0.1, 0.3, training=False),
            F.tanhshrink(h),
            # steps (floor, remainder, ...) on the input itself: on a computed value a rounding
            # difference at a step would jump the output
            torch.floor(x * 3) + torch.ceil(x * 2) + torch.round(x * 5) + torch.trunc(x * 4),
            torch.remainder(x * 5, 1.5),
            torch.fmod(x * 5, 1.5),
            torch.sin(h) + torch.cos(h),
        ]
        return torch.stack(terms, dim=1)


class Reductions(nn.Module):
    """amax/amin, logsumexp, var/std with corrections, norms, prod, mean, argmax/argmin, cumsum and
    cumprod along different dims, any/all over comparisons; a tuple output."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # x: [B, C, L]
        a = x.amax(dim=-1) - x.amin(dim=(0, 2), keepdim=True)[0, :, 0]
        lse = torch.logsumexp(x, dim=-1)
        v = x.var(dim=2, unbiased=True) + x.var(dim=(1, 2), correction=0, keepdim=True)[..., 0]
        s = x.std(dim=1, correction=2) + x.std()
        n = torch.linalg.vector_norm(x, dim=-1) + x.norm(p=1, dim=-1) + torch.norm(x, dim=(1, 2))[:, None]
        p = torch.prod(torch.tanh(x) + 1.5, dim=1)
        cs = torch.cumsum(x, dim=2) + torch.cumsum(x, dim=1)
        cp = torch.exp(torch.cumsum(torch.log(torch.sigmoid(x) + 0.5), dim=-1))
        arg = x.argmax(dim=1, keepdim=True) + x.argmin(dim=-1, keepdim=True)  # int64 [B, L]
        flags = ((x > 0).any(dim=1) & (x < 3).all(dim=1)).to(torch.float32)
        mx, _ = x.max(dim=-1)
        mn = x.min()
        return a + lse + v + n + mx + mn, s, p, cs * cp, arg, flags


class Indexing(nn.Module):
    """A GNN-like block: gather, scatter_add, index_add, index_select with realistic indices, and
    embedding bags built from them; plus advanced indexing and masked_fill."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [N, F]; idx: [E] in [0, N)
        h = self.lin(x)
        g = torch.gather(h, 0, idx[:, None].expand(-1, h.shape[1]))  # [E, F]
        agg = torch.zeros_like(h).scatter_add(0, idx[:, None].expand(-1, h.shape[1]), g * 2)
        agg = agg.index_add(0, idx, g, alpha=0.5)
        sel = h.index_select(0, idx.flip(0))  # [E, F]
        cols = torch.gather(h, 1, (idx[: h.shape[0], None] % h.shape[1]).expand(-1, 2))  # [N, 2]
        adv = h[idx[:3]]  # [3, F]
        masked = h.masked_fill(x < 0, -1.0)
        return agg + masked + cols.sum(-1, keepdim=True), sel + adv.mean(0)


class Spectral(nn.Module):
    """torch.fft on real and complex values: rfft2/irfft2 with a spectral weight (ortho), fft/ifft with
    norm forward, rfft along one dim with n, complex mul, abs and angle-free real/imag."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, 5, dtype=torch.cfloat) * 0.3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, 4, 8, 8]
        f = torch.fft.rfft2(x, norm="ortho")  # [B, 4, 8, 5]
        f = f[:, :, :4, :] * self.w[None, :, :, :]  # low modes
        spec = torch.zeros(x.shape[0], 4, 8, 5, dtype=torch.cfloat)
        spec[:, :, :4, :] = f
        y = torch.fft.irfft2(spec, s=(8, 8), norm="ortho")
        c = torch.fft.fft(x.to(torch.cfloat), dim=-1, norm="forward")
        c2 = torch.fft.ifft(c * 2, dim=-2)
        r = torch.fft.rfft(x, dim=1)
        mag = r.abs() + torch.real(c2).sum() + torch.imag(c).mean()
        back = torch.fft.irfft(r, n=4, dim=1, norm="backward")
        return y + back, mag, torch.view_as_real(c2)


class Shapes(nn.Module):
    """chunk, split, unbind, stack, flip, roll, repeat, expand, pixel_shuffle, transpose, narrow,
    einsum, bmm, and a dtype round trip through f16-free casts (int and bool)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 16, 3, padding=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, 4, 6, 6]; y: [B, 6, 5]
        p = F.pixel_shuffle(self.conv(x), 2)  # [B, 4, 12, 12]
        u = F.pixel_unshuffle(p, 2)  # [B, 16, 6, 6]
        a, b = u.chunk(2, dim=1)
        parts = torch.split(a, [3, 5], dim=1)
        rows = torch.unbind(b, dim=2)
        z = torch.stack(rows[:3], dim=-1).sum(-1)  # [B, 8, 6]
        q = parts[0].flip(-1).roll(2, dims=-2) + parts[1][:, :3].roll((-1, 1), dims=(2, 3))
        e = torch.einsum("bchw,bwk->bchk", q, y)  # [B, 3, 6, 5]
        m = torch.bmm(z.transpose(1, 2), z)  # [B, 6, 6]
        r = y.repeat(1, 2, 1)[:, :6].narrow(1, 1, 4)  # [B, 4, 5]
        t = y[:, None].expand(-1, 3, -1, -1) * 2  # [B, 3, 6, 5]
        ints = (y * 3).to(torch.int32)  # [B, 6, 5]: casts of the input (exact), not of computed values
        back = e + ints.to(torch.float32)[:, None, :, :] + (y > 0).to(torch.float32)[:, None]
        return back + t + e.movedim(1, -1).permute(0, 3, 1, 2), m.sum(-1, keepdim=True) + r.mean()


class Norms(nn.Module):
    """GroupNorm, LayerNorm and InstanceNorm without affine, LayerNorm over two dims, BatchNorm1d,
    GroupNorm with one group, F.normalize, local statistics via unfold-free means."""

    def __init__(self) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(4, 8, affine=False)
        self.gn1 = nn.GroupNorm(1, 8)
        self.ln = nn.LayerNorm(10, elementwise_affine=False)
        self.ln2 = nn.LayerNorm((8, 10))
        self.inorm = nn.InstanceNorm1d(8, affine=True)
        self.bn = nn.BatchNorm1d(8)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, 8, 10]
        a = self.gn(x) + self.gn1(x)
        b = self.ln(x) + self.ln2(x)
        c = self.inorm(x) + self.bn(x)
        d = F.normalize(x, dim=-1) + F.layer_norm(x, (10,), eps=1e-3)
        return a * b + c - d


class Recurrent(nn.Module):
    """A two-layer GRU and a bidirectional LSTM (batch first), as torch.export decomposes them."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 8, num_layers=2, batch_first=True)
        self.lstm = nn.LSTM(8, 6, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, _ = self.gru(x)
        y, (hn, _) = self.lstm(h)
        return y, hn


class Masked(nn.Module):
    """Comparisons and where with broadcasting, integer arithmetic on an int input, bool flow, and
    masked softmax / log_softmax; masks built from an int64 input and arange."""

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, S, S]; k: [B] int64 in [1, S]
        s = x.shape[-1]
        cols = torch.arange(s)
        band = (cols[None, :] - cols[:, None]).abs() <= 1  # [S, S] bool
        valid = cols[None, :] < k[:, None]  # [B, S]
        mask = band[None] & valid[:, None, :]
        logits = torch.where(mask, x, torch.full_like(x, -1e9))
        p = torch.softmax(logits, dim=-1)
        lp = torch.log_softmax(x.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
        lp = torch.where(torch.isinf(lp), torch.zeros_like(lp), lp)
        count = (k * 2 - 1).clamp(min=1) // 2 + valid.sum(-1)  # int64 [B]
        eq = (x.ge(0) == x.le(0.5)).float() + (x != x.flip(-1)).float() + x.gt(0).logical_xor(x.lt(1)).float()
        return p + lp + eq, count


class Deconv(nn.Module):
    """Transposed convolutions 1-3d: stride, padding, output_padding, dilation, groups, no bias."""

    def __init__(self) -> None:
        super().__init__()
        self.t1 = nn.ConvTranspose1d(4, 6, 3, stride=3, padding=2, output_padding=1, groups=2, dilation=2)
        self.t2 = nn.ConvTranspose2d(4, 2, (3, 2), stride=(2, 1), padding=(0, 1), bias=False)
        self.t3 = nn.ConvTranspose3d(2, 3, 2, stride=2)

    def forward(self, x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, 4, L]; v: [B, 2, D, H, W]
        a = self.t1(x)
        b = self.t2(x[:, :, None, :].expand(-1, -1, 3, -1))
        return a, b, self.t3(v)


class ComplexWeights(nn.Module):
    """An FNO-style spectral layer whose weights are real [.., 2] pairs viewed as complex; complex
    arithmetic with real and complex operands, complex division, abs, a c2c round trip."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3, 4, 2) * 0.2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, 3, 16]
        f = torch.fft.rfft(x, norm="ortho")  # [B, 3, 9]
        w = torch.view_as_complex(self.w)  # [3, 3, 4]
        low = torch.einsum("bim,iom->bom", f[..., :4], w)
        g = torch.zeros_like(f)
        low2 = (f[:, :, None, :4] * w[None]).sum(1)  # the same contraction as a complex product and sum
        g[..., :4] = low + low2.mean(0) - torch.where(x[:, :1, :4] > 0, low, f[:, :1, :4])
        h = (g * 2.0 - f / (f.abs() + 1.0)[..., None, :].squeeze(-2) + 1j) / (f + (2 + 1j))
        y = torch.fft.irfft(h, n=16, norm="ortho")
        c = torch.fft.ifft(torch.fft.fft(x, norm="forward"), norm="forward")
        p = torch.polar(x[..., :9].abs(), x[..., 7:]) * torch.complex(x[..., :9], x[..., 3:12]).conj()
        return y + c.real, (-h).abs() + torch.view_as_real(p * f.conj()).sum(-1)


class GraphAttention(nn.Module):
    """A GAT layer: per-edge scores, a softmax over each node's incoming edges stabilised by a
    scatter_reduce amax (include_self=False), aggregation by index_add, and a scatter mean readout."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 8)
        self.att = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [N, 6]; edges: [2, E] (source, destination) in [0, N)
        src, dst = edges[0], edges[1]
        h = self.lin(x)
        e = F.leaky_relu(torch.cat([h[src], h[dst]], -1) @ self.att, 0.2)  # [E]
        top = torch.zeros(x.shape[0]).scatter_reduce(0, dst, e, reduce="amax", include_self=False)
        w = torch.exp(e - top[dst])
        den = torch.zeros(x.shape[0]).index_add(0, dst, w).clamp(min=1e-6)
        out = torch.zeros_like(h).index_add(0, dst, h[src] * (w / den[dst])[:, None])
        mean = torch.zeros_like(h).scatter_reduce(0, dst[:, None].expand(-1, 8), h[src], reduce="mean")
        low = h.scatter_reduce(0, src[:, None].expand(-1, 8), out[dst], reduce="amin", include_self=True)
        return F.elu(out) + mean, low


class Pools(nn.Module):
    """Pooling edge cases: avg pool with count_include_pad off and ceil_mode, divisor_override, max
    pool 1-d with padding and dilation, adaptive avg pools whose output does not divide the input,
    adaptive max pool, reflect/replicate/circular padding, nearest-exact and fractional scales."""

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # x: [B, C, 7, 9]; s: [B, C, 11]
        a = F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)
        b = F.avg_pool2d(x, 2, divisor_override=3)
        c = F.max_pool1d(s, 3, stride=2, padding=1, dilation=2)
        d = F.adaptive_avg_pool2d(x, (3, 4)) + F.adaptive_max_pool2d(x, (3, 4))
        e = F.adaptive_avg_pool1d(s, 4)
        f = F.pad(x, (1, 2, 2, 1), mode="reflect") + F.pad(x, (1, 2, 2, 1), mode="replicate")
        g = F.pad(s, (2, 3), mode="circular")
        h = F.interpolate(x, scale_factor=1.5, mode="nearest-exact")  # 7x9 -> 10x13: by the factor
        h = h + F.interpolate(x, scale_factor=1.5, mode="bilinear") + F.interpolate(x, scale_factor=1.5)
        i = F.interpolate(s, size=17, mode="nearest") + F.interpolate(
            s, size=17, mode="linear", align_corners=True
        )
        return a, b, c, d, e, f, g, h, i


class Attention(nn.Module):
    """F.scaled_dot_product_attention with is_causal, with a bool mask and with a float mask; tril on a
    computed tensor; GLU, PReLU, softmin, softshrink/hardshrink, threshold."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.prelu = nn.PReLU(16)
        self.glu = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        # x: [B, S, 16]; keep: [B, S] bool
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 4).permute(2, 0, 3, 1, 4)  # each [B, H, S, D]
        y1 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y2 = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep[:, None, None, :] | torch.eye(s, dtype=torch.bool)
        )
        bias = torch.tril(q @ k.transpose(-1, -2)) * 0.1
        y3 = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
        y = (y1 + y2 + y3).transpose(1, 2).reshape(b, s, 16)
        z = F.glu(self.glu(y), dim=-1) + self.prelu(y.transpose(1, 2)).transpose(1, 2)
        return F.softmin(z, dim=1) + F.softshrink(z, 0.3) + F.hardshrink(x, 0.2) + F.threshold(x, 0.1, -2.0)


class Integers(nn.Module):
    """Integer tensors flowing: int32 and int64 arithmetic, floor division, remainder, integer sums and
    cumsum, bool counts, one_hot, comparisons between ints, int -> float casts, clamp on ints,
    embedding with padding_idx, and an int output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 4, padding_idx=0)

    def forward(
        self, ids: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # ids: [B, S] int64 in [0, 12); counts: [B, S] int32 in [-5, 5)
        shifted = (ids * 3 + 1) // 2 % 12
        total = counts.sum(-1, keepdim=True) + counts.cumsum(-1)  # int64 by promotion
        pos = (counts > 0).sum(-1)  # int64 [B]
        hot = F.one_hot(ids, 12).float()  # [B, S, 12]
        e = self.embed(shifted) * total[..., None].float() + hot[..., :4]
        same = (ids[:, :, None] == ids[:, None, :]).sum(-1)  # [B, S]
        c = counts.clamp(-2, 3).to(torch.int64) * same + torch.abs(counts) - torch.sign(counts)
        return e, c, pos


class Mixed(nn.Module):
    """addcmul, lerp, baddbmm and addmm with alpha/beta, var_mean/std_mean, cosine similarity,
    pairwise distance, outer, diff, logcumsumexp-free running stats, cdist-free distances, triu/tril
    masks, einsum contractions, a reshape-heavy path, and a dict output of mixed shapes."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        # a: [B, N, D]; b: [B, N, D]
        m = torch.addcmul(a, a, b, value=0.5) + torch.lerp(a, b, 0.3)
        bb = torch.baddbmm(a[:, :, :3], a, b.transpose(1, 2)[:, :, :3], beta=0.5, alpha=2.0)
        flat = torch.addmm(a[0, 0, :3], a[0], b[0].t()[:, :3], beta=2.0, alpha=0.5)
        var, mean = torch.var_mean(a, dim=-1, correction=0)
        std, _ = torch.std_mean(b, dim=1)
        cos = F.cosine_similarity(a, b, dim=-1)
        dist = F.pairwise_distance(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]))
        outer = torch.outer(a[0, 0], b[0, 0])
        d = torch.diff(a, dim=1)
        tri = (
            torch.einsum("bnd,bmd->bnm", a, b).triu(1)
            + torch.cdist(a, b)
            + torch.hypot(a[..., :4], b[..., 1:])
            + torch.einsum("bii->bi", a[:, :, : a.shape[1]])[..., None]
        )
        return {
            "m": m.sum(-1) + cos + var + mean,
            "bb": bb,
            "flat": flat + outer[:4, :3],
            "std": std,
            "dist": dist,
            "d": d,
            "tri": tri,
        }


class Edges(nn.Module):
    """Shape and value edge cases: batch 1, size-1 dims, a 0-d output, softmax over dim 0, layer norm
    over (C, H, W), group norm on 5-d, 'same' and reflect/circular padding modes of nn.Conv2d, unfold
    and fold, clamp with tensor bounds, negative and integer powers, round with decimals, where with a
    scalar branch, masked_fill with a 0-d tensor value, cells of GRU and LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.same = nn.Conv2d(2, 2, 3, padding="same", dilation=2)
        self.refl = nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")
        self.circ = nn.Conv2d(2, 2, (3, 1), padding=(1, 0), padding_mode="circular")
        self.ln = nn.LayerNorm((2, 4, 5))
        self.gn = nn.GroupNorm(1, 2)
        self.gru = nn.GRUCell(5, 5)
        self.lstm = nn.LSTMCell(5, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # x: [1, 2, 4, 5]
        h = self.same(x) + self.refl(x) + self.circ(x)
        h = self.ln(h) + torch.softmax(h, dim=0) + self.gn(h[:, :, None]).squeeze(2)
        patches = F.unfold(h, 2, stride=1, padding=1)  # [1, 8, 30]
        back = F.fold(patches, (4, 5), 2, padding=1)  # [1, 2, 4, 5]
        lo, hi = -h.abs(), h.abs() * 0.5
        c = (
            torch.clamp(x, min=lo, max=hi)
            + h.abs().add(0.1).pow(-0.5)
            + h.pow(3)
            + torch.round(x, decimals=1)
        )
        w = torch.where(h > 0, h, 0.0).masked_fill(x < -1, torch.tensor(-0.5))
        seq = w[0, 0]  # [4, 5]
        g = self.gru(seq, (seq * seq.flip(0)).repeat(1, 2)[:, 3:8])
        l1, _ = self.lstm(seq, (g, g))
        return back + c + w, g + l1, w.sum(), x.mT.squeeze(0)


class Decoder(nn.Module):
    """nn.TransformerDecoderLayer with a causal tgt mask and a memory key padding mask; nn.Transformer-
    style encoder stack (two layers, final norm)."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)
        self.dec = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # src: [B, S, 8]; tgt: [B, T, 8]; lengths: [B] in [1, S]
        src_pad = torch.arange(src.shape[1])[None, :] >= lengths[:, None]  # [B, S] True where padded
        memory = self.enc(src)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.dec(tgt, memory, tgt_mask=mask, tgt_is_causal=True, memory_key_padding_mask=src_pad)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "resnet_bn": lambda: (ResNetBN(), (torch.randn(2, 3, 16, 16),)),
    "unet": lambda: (UNet(), (torch.randn(2, 2, 12, 12),)),
    "tcn": lambda: (TCN(), (torch.randn(2, 3, 16),)),
    "conv3d": lambda: (Conv3d(), (torch.randn(1, 2, 6, 6, 6),)),
    "encoder": lambda: (Encoder(), (torch.randint(0, 20, (2, 7)), torch.tensor([7, 4]))),
    "mha": lambda: (CausalMHA(), (torch.randn(2, 5, 12), torch.randn(2, 4, 12))),
    "activations": lambda: (Activations(), (torch.randn(4, 8),)),
    "reductions": lambda: (Reductions(), (torch.randn(2, 3, 5),)),
    "indexing": lambda: (Indexing(), (torch.randn(5, 6), torch.tensor([0, 4, 1, 1, 3, 2, 0, 4]))),
    "spectral": lambda: (Spectral(), (torch.randn(2, 4, 8, 8),)),
    "shapes": lambda: (Shapes(), (torch.randn(2, 4, 6, 6), torch.randn(2, 6, 5))),
    "norms": lambda: (Norms(), (torch.randn(3, 8, 10),)),
    "recurrent": lambda: (Recurrent(), (torch.randn(2, 5, 4),)),
    "masked": lambda: (Masked(), (torch.randn(2, 6, 6), torch.tensor([6, 3]))),
    "deconv": lambda: (Deconv(), (torch.randn(2, 4, 5), torch.randn(1, 2, 2, 3, 2))),
    "complex": lambda: (ComplexWeights(), (torch.randn(2, 3, 16),)),
    "pools": lambda: (Pools(), (torch.randn(2, 3, 7, 9), torch.randn(2, 3, 11))),
    "attention": lambda: (
        Attention(),
        (torch.randn(2, 6, 16), torch.tensor([[1, 1, 1, 0, 0, 1], [1, 0, 1, 1, 1, 1]]).bool()),
    ),
    "integers": lambda: (
        Integers(),
        (torch.randint(0, 12, (2, 5)), torch.randint(-5, 5, (2, 5), dtype=torch.int32)),
    ),
    "mixed": lambda: (Mixed(), (torch.randn(2, 4, 5), torch.randn(2, 4, 5))),
    "edges": lambda: (Edges(), (torch.randn(1, 2, 4, 5),)),
    "decoder": lambda: (Decoder(), (torch.randn(2, 5, 8), torch.randn(2, 4, 8), torch.tensor([3, 5]))),
    "gat": lambda: (
        GraphAttention(),
        (torch.randn(6, 6), torch.tensor([[0, 1, 2, 3, 4, 0, 2, 5], [1, 2, 3, 4, 0, 3, 1, 1]])),
    ),
}

# Integer inputs' legal ranges, per model and input position: [lo, hi) draws for fresh inputs.
INT_RANGES: dict[tuple[str, int], tuple[int, int]] = {
    ("encoder", 0): (0, 20),
    ("encoder", 1): (1, 8),
    ("indexing", 1): (0, 5),
    ("masked", 1): (1, 7),
    ("attention", 1): (0, 2),
    ("gat", 1): (0, 6),
    ("decoder", 2): (1, 6),
    ("integers", 0): (0, 12),
    ("integers", 1): (-5, 5),
}
