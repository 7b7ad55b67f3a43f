"""The LLM patterns of an imported program (polymorph/passes/recognize.py): an exported transformers
Llama gets the builder's kernels, group for group, and a subgraph that only resembles a pattern stays
general; every graph still matches PyTorch eager on fresh random inputs."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from polymorph import api
from polymorph.frontend import from_torch
from polymorph.frontend.tensors import run_on
from polymorph.ir import reference
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import compare, model_tolerance

PROMPT = 7  # the prompt length P: the exported forward's sequence and the builder plan's prefill
LLAMA = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: two query heads per kv head
    max_position_embeddings=64,
    rope_theta=500000.0,  # not the default base: the rope rule derives it from inv_freq
    rms_norm_eps=1e-5,
    use_cache=False,
)


def _needs_transformers() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    result = compare(got.astype(np.float32), want, model_tolerance(DType.F32))
    assert result.ok, f"{what}: {result}"


def _matches_eager(module: nn.Module, model: Any, args: list[torch.Tensor], engines: tuple[str, ...]) -> None:
    inputs = {n: a.numpy() for n, a in zip(model.input_names, args, strict=True)}
    with torch.no_grad():
        out = module(*args)
    want = (out.logits if hasattr(out, "logits") else out).numpy()
    for engine in engines:
        if engine == "reference":
            got = reference.run(model.graph, model.weights(), inputs, {})["output_0"]
        else:
            got = run_on(model, inputs, engine)["output_0"]
        _close(got, want, engine)


def _fresh(shape: tuple[int, ...]) -> torch.Tensor:
    """A new standard-normal draw on every run (the modules' weights are seeded, the inputs not)."""
    return torch.from_numpy(np.random.default_rng().standard_normal(shape).astype(np.float32))


def _computing(plan: Any) -> list[tuple[str, dict]]:
    """(kernel file, config) of every group that computes, in plan order: the layout groups (head
    splits and merges) and the builder's cache writes aside."""
    return [
        (g.kernel.file, dict(g.kernel.config))
        for g in plan.groups
        if not g.kernel.file.endswith("/layout.py") and g.pattern != "kv_write"
    ]


@pytest.fixture(scope="module")
def llama() -> tuple[Any, Any, Any]:
    """(eager LlamaForCausalLM, its import at [1, PROMPT], its transformers config)."""
    _needs_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    cfg = LlamaConfig(**LLAMA)
    module = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights: a norm that dropped its weight would show
        for name, p in module.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return module, from_torch(module, (torch.randint(0, LLAMA["vocab_size"], (1, PROMPT)),)), cfg


@pytest.mark.parametrize("backend", ["cpu", "neuron"])
def test_imported_llama_gets_the_builders_prefill_kernels(llama: Any, backend: str) -> None:
    from polymorph.models.config import ModelConfig
    from polymorph.models.decoder import build_decoder
    from polymorph.models.zoo import Model

    _, model, cfg = llama
    ops = {n.op for n in model.graph.nodes}
    assert ops <= {"embedding", "rmsnorm", "linear", "reshape", "rope", "attention", "add", "silu", "mul"}, (
        ops
    )
    imported = api.compile(model, backend).plan
    config = ModelConfig.from_hf(cfg.to_dict(), "test_llm_patterns")
    graph = build_decoder(config, name="llama-built", all_logits=True)  # every position's logits, as HF
    built = api.compile(
        Model("llama-built", graph, "llama-built", config=config), backend, prefill=PROMPT
    ).plan
    assert _computing(imported) == _computing(built)
    # the groups are the builder's kinds, layer by layer: norm, q/k/v, rope, attention, o + residual, MLP
    patterns = [g.pattern for g in imported.groups if not g.kernel.file.endswith("/layout.py")]
    layer = ["rmsnorm", "linear", "linear", "linear", "rope", "rope", "attention", "linear+residual",
             "rmsnorm", "linear+silu*mul", "linear+residual"]  # fmt: skip
    assert patterns == ["embedding", *layer * LLAMA["num_hidden_layers"], "rmsnorm", "linear"]


def test_imported_llama_matches_eager(llama: Any) -> None:
    module, model, _ = llama
    rng = np.random.default_rng()
    ids = torch.from_numpy(rng.integers(0, LLAMA["vocab_size"], (1, PROMPT)))
    _matches_eager(module, model, [ids], ("reference", "cpu", "neuron"))


@pytest.mark.parametrize("variant", ["batch_2", "eager_attention"])
def test_other_export_forms_are_raised_whole(variant: str) -> None:
    """At batch 2 the o-projection reads a non-contiguous input, which aten.linear decomposes to a
    batched matmul with the weight expanded (a linear all the same; the rope positions repeat), and
    transformers' eager attention scales the scores, not q and k, and has no safe-softmax rows."""
    _needs_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(17)
    cfg = {**LLAMA, "num_hidden_layers": 1}
    if variant == "eager_attention":
        cfg["attn_implementation"] = "eager"
    batch = 2 if variant == "batch_2" else 1
    module = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    model = from_torch(module, (torch.randint(0, LLAMA["vocab_size"], (batch, PROMPT)),))
    ops = {n.op for n in model.graph.nodes}
    assert ops <= {"embedding", "rmsnorm", "linear", "reshape", "rope", "attention", "add", "silu", "mul"}, (
        ops
    )
    ids = torch.from_numpy(np.random.default_rng().integers(0, LLAMA["vocab_size"], (batch, PROMPT)))
    _matches_eager(module, model, [ids], ("reference", "cpu"))


ROPE_SCALING = {
    "llama3": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},  # stays general
}  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")  # transformers on the tiny contexts of these configs
@pytest.mark.parametrize("scaling", list(ROPE_SCALING))
def test_rope_scaling_of_an_imported_llama(scaling: str) -> None:
    """A Llama 3.2-like llama3 scaling (head_dim 64, factor 32) and a linear one become rope ops of
    that type, their parameters read off inv_freq; yarn (attention factor, ramp) stays general."""
    _needs_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(13)
    want = ROPE_SCALING[scaling]
    cfg = {
        **LLAMA,
        "hidden_size": 256,
        "num_hidden_layers": 1,
        "rope_scaling": dict(want),
    }  # a copy: it grows
    module = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    model = from_torch(module, (torch.randint(0, LLAMA["vocab_size"], (1, PROMPT)),))
    ropes = [n.attrs for n in model.graph.nodes if n.op == "rope"]
    if scaling == "yarn":
        assert not ropes
    else:
        assert len(ropes) == 2 and all({k: r[k] for k in want} == want for r in ropes), ropes
    ids = torch.from_numpy(np.random.default_rng().integers(0, LLAMA["vocab_size"], (1, PROMPT)))
    _matches_eager(module, model, [ids], ("cpu",))


# --- near misses: close to a pattern, not it -----------------------------------------------------------


class Norm(nn.Module):
    """An RMSNorm as transformers writes it, or one change to it."""

    def __init__(self, variant: str, width: int = 16) -> None:
        super().__init__()
        self.variant = variant
        self.weight = nn.Parameter(torch.rand(width) + 0.5)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, D]
        power = 4 if self.variant == "fourth_power" else 2
        dim = -2 if self.variant == "positions_axis" else -1
        eps = 1e-6
        if self.variant == "eps_after_rsqrt":
            rms = torch.rsqrt(x.pow(2).mean(dim, keepdim=True)) + eps
        else:
            rms = torch.rsqrt(x.pow(power).mean(dim, keepdim=True) + eps)
        weight = 1.0 + self.weight if self.variant == "one_plus_weight" else self.weight  # Gemma's
        return self.proj(weight * (x * rms))


@pytest.mark.parametrize(
    "variant", ["rmsnorm", "one_plus_weight", "fourth_power", "positions_axis", "eps_after_rsqrt"]
)
def test_norm_variants(variant: str) -> None:
    torch.manual_seed(3)
    module = Norm(variant).eval()
    x = torch.randn(2, 5, 16)
    model = from_torch(module, (x,))
    ops = [n.op for n in model.graph.nodes]
    assert "linear" in ops  # the projection is recognized either way
    if variant in ("rmsnorm", "one_plus_weight"):
        assert "rmsnorm" in ops and "rsqrt" not in ops, ops
        (norm,) = (n for n in model.graph.nodes if n.op == "rmsnorm")
        want = (1.0 + module.weight if variant == "one_plus_weight" else module.weight).detach().numpy()
        np.testing.assert_array_equal(model.weights()[norm.inputs[1]], want)  # 1 + w folded as eager adds
    else:
        assert "rmsnorm" not in ops and "rsqrt" in ops, ops
    _matches_eager(module, model, [_fresh((2, 5, 16))], ("reference", "cpu"))


class Attend(nn.Module):
    """Scaled-dot-product attention over [B, H, S, Dh] heads, causal or under another mask."""

    def __init__(self, variant: str, s: int) -> None:
        super().__init__()
        self.variant = variant
        seen = torch.ones(s, s, dtype=torch.bool).tril()
        if variant == "window":  # a sliding window of 3: causal-like, not causal
            seen &= ~torch.ones(s, s, dtype=torch.bool).tril(-3)
        elif variant == "shifted":  # each query sees the keys before it and not itself (row 0: none)
            seen = torch.ones(s, s, dtype=torch.bool).tril(-1)
        self.register_buffer("seen", seen)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.variant == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.variant == "full":
            return F.scaled_dot_product_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.seen)


# "shifted" leaves query 0 no key: its softmax row is NaN until torch's safe softmax zeroes it
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("variant", ["causal", "window", "shifted", "full"])
def test_attention_variants(variant: str) -> None:
    torch.manual_seed(5)
    s = 6
    module = Attend(variant, s).eval()
    shape = (1, 4, s, 8)
    model = from_torch(module, tuple(torch.randn(shape) for _ in range(3)))
    ops = [n.op for n in model.graph.nodes]
    if variant == "causal":
        assert ops.count("attention") == 1 and "softmax" not in ops, ops
    else:
        assert "attention" not in ops and "softmax" in ops, ops
    _matches_eager(module, model, [_fresh(shape) for _ in range(3)], ("reference", "cpu"))


class Rotary(nn.Module):
    """transformers' rotary embedding on q ([B, H, S, Dh]) at positions 0..S-1, or one change to it."""

    def __init__(self, variant: str, head_dim: int = 8, theta: float = 10000.0) -> None:
        super().__init__()
        self.variant = variant
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if variant == "linear_scaling":  # every frequency divided by 4: the rope op's linear type
            inv = inv / 4.0
        elif variant == "scrambled_freqs":  # one middle frequency divided: no rope type does that
            inv = inv / torch.tensor([1.0, 1.0, 2.0, 1.0])
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        s = q.shape[2]
        positions = torch.arange(s)[None, :, None].float()  # [1, S, 1]
        freqs = positions * self.inv_freq  # [1, S, Dh / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [1, 1, S, Dh]
        half = q.shape[-1] // 2
        x1, x2 = q[..., :half], q[..., half:]
        if self.variant == "swapped_sign":
            rotated = torch.cat((x2, -x1), dim=-1)
        else:
            rotated = torch.cat((-x2, x1), dim=-1)
        return q * cos + rotated * sin


@pytest.mark.parametrize("variant", ["rope", "linear_scaling", "swapped_sign", "scrambled_freqs"])
def test_rope_variants(variant: str) -> None:
    module = Rotary(variant).eval()
    shape = (2, 3, 5, 8)
    model = from_torch(module, (torch.randn(shape),))
    ops = [n.op for n in model.graph.nodes]
    if variant in ("rope", "linear_scaling"):
        assert ops.count("rope") == 1 and "cos" not in ops, ops
        (rope,) = (n for n in model.graph.nodes if n.op == "rope")
        assert (rope.attrs["rope_type"], rope.attrs["factor"]) == (
            ("linear", 4.0) if variant == "linear_scaling" else ("default", 1.0)
        )
    else:
        assert "rope" not in ops and "cos" in ops, ops
    _matches_eager(module, model, [_fresh(shape)], ("reference", "cpu"))


@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_imported_llama_lowers_onto_the_gpu_kernels(backend: str) -> None:
    """No device needed: with the patterns raised, nothing of the program is left to the general ops
    (which the GPU backends do not run); head_dim 16, the Triton attention's smallest."""
    _needs_transformers()
    pytest.importorskip("triton")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    cfg = LlamaConfig(**{**LLAMA, "hidden_size": 64, "num_hidden_layers": 1})
    model = from_torch(LlamaForCausalLM(cfg).eval(), (torch.randint(0, LLAMA["vocab_size"], (1, PROMPT)),))
    plan = api.lower(model, backend).plan
    files = {g.pattern: g.kernel.file for g in plan.groups}
    assert all(f.startswith("triton/") for f in files.values()), files
    assert files["attention"] == "triton/prefill_attention.py" and files["rope"] == "triton/rope.py", files
