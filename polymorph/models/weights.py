"""Weights for a graph's params: from a Hugging Face checkpoint by name, or seeded random.

Random weights have the real shapes and scales that keep activations near unit size through any
depth (projections ~ N(0, 1/fan_in), norms ~ 1, embeddings ~ N(0, 1/dim)), so a random model's logits
and numerics look like a trained one's to every kernel. Each tensor is drawn from its own stream,
seeded by (seed, name), so one weight does not depend on which others were drawn.

Checkpoints keep their parameter names. The output head follows transformers 5: a tied model reads the
embedding (or, when only `lm_head.weight` is stored, that tensor for both); an untied model needs its
`lm_head.weight` and is refused without it, never given the embedding. MoE experts differ: the hub layout stores one tensor per
expert (`experts.3.w1.weight`, `experts.3.gate_proj.weight`) and transformers 5 keeps them fused in
memory (`experts.gate_up_proj`), while the graph reads one stacked tensor per layer and projection.
gpt-oss stores them fused and input-major (`experts.gate_up_proj` [E, D, 2F] with gate and up in
alternating columns, `experts.down_proj` [E, F, D], and their biases), transposed and split at load.
Phi-3 stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`: split by rows at load. Gemma's
norm weights w (of x / rms(x) * (1 + w)) are loaded as 1 + w (graph meta `norm_weight_offset`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

import numpy as np

from polymorph.errors import UserError
from polymorph.ir.graph import Graph, TensorType
from polymorph.ir.shapes import concrete

# Hub names of the three expert projections, per model type: (gate, up, down).
_EXPERT_NAMES = {
    "block_sparse_moe": ("w1", "w3", "w2"),  # Mixtral
    "mlp": ("gate_proj", "up_proj", "down_proj"),  # Qwen3-MoE
}
# Phi-3's fused projections, read as the separate ones the graph has.
_FUSED = re.compile(
    r"^(?P<prefix>model\.layers\.\d+)\.(?:self_attn|mlp)\.(?P<proj>q|k|v|gate|up)_proj\.weight$"
)
_STACKED = re.compile(
    r"^(?P<prefix>.+\.(?P<block>block_sparse_moe|mlp|feed_forward))\.experts\.(?P<kind>w|b)_(?P<proj>gate|up|down)$"
)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def random_tensor(name: str, t: TensorType, seed: int) -> np.ndarray:
    """One seeded random weight with a scale that suits its role (read from its name and shape)."""
    shape = concrete(t.shape)
    rng = _rng(seed, name)
    if name.endswith(".self_attn.qk_norm.weight"):  # Llama 4's L2 norm: an RMSNorm of weight 1
        values = np.ones(shape, dtype=np.float32)
    elif name.endswith(("e_score_correction_bias", ".sinks")):  # selection biases, attention sink logits
        values = 0.5 * rng.standard_normal(shape, dtype=np.float32)
    elif re.search(r"\.experts\.b_(gate|up|down)$", name):  # expert biases
        values = 0.02 * rng.standard_normal(shape, dtype=np.float32)
    elif len(shape) == 1:
        if name.endswith(".bias"):
            values = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        else:  # norm weights
            values = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    elif "embed_tokens" in name:
        values = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])
    else:  # [out, in] or [experts, out, in]: fan-in scaling
        values = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])
    return values.astype(t.dtype.numpy)


def random_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    return {name: random_tensor(name, t, seed) for name, t in graph.params.items()}


def checkpoint_weights(
    graph: Graph, tensors: Mapping[str, np.ndarray], source: str, declared: str | None = None
) -> dict[str, np.ndarray]:
    """Map checkpoint tensors onto `graph.params` (cast to the graph's dtype). UserError naming the
    tensor when one is missing, has another shape, is stored in a dtype the model cannot mean (see
    `_stored_dtype_fault`; `declared`: config.json's `torch_dtype`), or is wholly NaN or infinite."""
    expected = _expected_dtype(tensors, declared)
    offset = float(graph.meta.get("norm_weight_offset", 0.0))
    out: dict[str, np.ndarray] = {}
    for name, t in graph.params.items():
        arr = _rope_halves(name, _find(name, tensors, graph, source), graph)
        arr = _indexer_rope_halves(name, _mla_rope_halves(name, arr, graph), graph)
        shape = concrete(t.shape)
        if tuple(arr.shape) != shape:
            raise UserError(
                f"{source}: `{name}` has shape {list(arr.shape)}, the model expects {list(shape)}"
            )
        fault = _stored_dtype_fault(arr.dtype, expected, declared) if t.dtype.is_float else ""
        if fault:
            raise UserError(f"{source}: `{name}` {fault}")
        if t.dtype.is_float and arr.size and not _any_finite(arr):
            raise UserError(
                f"{source}: `{name}` is NaN or infinite in every element; the checkpoint is corrupt (a "
                "failed training run or conversion): re-download or re-export it"
            )
        if offset and name.endswith("norm.weight"):
            # Gemma's x / rms(x) * (1 + w): the 1 is added in f32, then cast once (the contract's fold)
            out[name] = np.ascontiguousarray(
                (arr.astype(np.float32) + np.float32(offset)).astype(t.dtype.numpy)
            )
            continue
        out[name] = np.ascontiguousarray(
            arr.astype(np.float32).astype(t.dtype.numpy) if arr.dtype != t.dtype.numpy else arr
        )
    return out


# torch dtype names in config.json -> the safetensors name of the same dtype
_TORCH_NAMES = {"float32": "F32", "float": "F32", "float16": "F16", "half": "F16", "bfloat16": "BF16",
                "float64": "F64", "double": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}  # fmt: skip
_FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def _safetensors_name(dtype: np.dtype) -> str | None:
    from polymorph.models.checkpoint import DTYPES

    return next((n for n, d in DTYPES.items() if d == dtype), None)


def _expected_dtype(tensors: Mapping[str, np.ndarray], declared: str | None) -> str | None:
    """The floating dtype the checkpoint's weights are stored in: config.json's, else the one most of
    its floating tensors have (None: no floating tensor)."""
    if declared is not None and declared in _TORCH_NAMES:
        return _TORCH_NAMES[declared]
    counts: dict[str, int] = {}
    for arr in tensors.values():
        name = _safetensors_name(arr.dtype)
        if name in _FLOATS:
            counts[name] = counts.get(name, 0) + 1
    return max(counts, key=lambda n: counts[n]) if counts else None


def _stored_dtype_fault(dtype: np.dtype, expected: str | None, declared: str | None) -> str:
    """Why a weight stored as `dtype` cannot be read as the model's weight ("" when it can): an integer
    or boolean dtype (a weight is a float), or a float of the checkpoint's byte size but another format
    (F16 bytes where BF16 is meant read as numbers of the wrong scale). A float of another byte size
    (F32 norms in a BF16 checkpoint) is a plain cast."""
    stored = _safetensors_name(dtype) or str(dtype)
    where = (
        f"config.json's torch_dtype {declared}"
        if declared in _TORCH_NAMES
        else "the checkpoint's other weights"
    )
    if stored not in _FLOATS:
        return (
            f"is stored as {stored}, but the model's weights are floating point ({expected or 'F32'} per "
            f"{where}); the checkpoint is mislabelled or not this model's: re-export it"
        )
    if expected is not None and stored != expected:
        from polymorph.models.checkpoint import DTYPES

        if DTYPES[stored].itemsize == DTYPES[expected].itemsize:
            return (
                f"is stored as {stored} but the model needs {expected} (per {where}); the same byte size "
                f"in another format would be read as garbage: re-export the checkpoint in {expected}"
            )
    return ""


def _any_finite(arr: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Whether any element is finite, reading chunk by chunk (a real weight answers in the first)."""
    flat = arr.reshape(-1)
    return any(np.isfinite(flat[i : i + chunk].astype(np.float32)).any() for i in range(0, flat.size, chunk))


HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


def stored_head_differs(tensors: Mapping[str, np.ndarray], chunk_rows: int = 4096) -> bool:
    """Whether the checkpoint stores an `lm_head.weight` other than its embedding (another shape or any
    other value). transformers 5 then does not tie them even when config.json says
    `tie_word_embeddings: true` (`PreTrainedModel.tie_weights`: "both are present in the checkpoints
    with different values, so we will NOT tie them"), and the stored head is the output projection."""
    head, embed = tensors.get(HEAD), tensors.get(EMBED)
    if head is None or embed is None:
        return False
    if head.shape != embed.shape:
        return True
    for i in range(0, head.shape[0], chunk_rows):  # row blocks: no full-size float32 copies
        a = head[i : i + chunk_rows].astype(np.float32)
        b = embed[i : i + chunk_rows].astype(np.float32)
        if not np.array_equal(a, b):
            return True
    return False


def _find(name: str, tensors: Mapping[str, np.ndarray], graph: Graph, source: str) -> np.ndarray:
    if name in tensors:
        return tensors[name]
    if name == EMBED and HEAD in tensors and HEAD not in graph.params:
        # Tied, with only the head stored: transformers ties the embedding to the tensor that exists.
        return tensors[HEAD]
    if name == HEAD:
        # An untied model (the graph has its own head) whose checkpoint lacks the head: transformers
        # would initialize it at random (a MISSING key), the embedding is not it.
        raise UserError(
            f"{source}: the checkpoint has no tensor `{HEAD}` and config.json does not tie the output head "
            "to the input embedding (tie_word_embeddings is false or absent; transformers would initialize "
            'the head at random); if the model shares its embedding as output head, set "tie_word_embeddings": '
            "true in config.json, else the checkpoint is incomplete: re-download it"
        )
    if name.endswith(".self_attn.qk_norm.weight") and graph.meta.get("model_type") == "llama4_text":
        return np.ones(concrete(graph.params[name].shape), dtype=np.float32)  # L2 norm: no weight stored
    m = _ABSORBED.match(name)
    if m:
        return _absorbed(m["prefix"], m["which"], tensors, graph, source)
    m = _FUSED.match(name)
    if m:
        return _split_fused(name, m["prefix"], m["proj"], tensors, graph, source)
    m = _STACKED.match(name)
    if m:
        if graph.meta.get("model_type") == "gpt_oss":
            return _gpt_oss_experts(m["prefix"], m["kind"], m["proj"], tensors, source)
        if graph.meta.get("model_type") == "llama4_text":
            return _llama4_experts(m["prefix"], m["proj"], tensors, source)
        if m["kind"] == "w":
            return _stack_experts(m["prefix"], m["block"], m["proj"], tensors, graph.params[name], source)
    raise UserError(f"{source}: the checkpoint has no tensor `{name}`; is it a checkpoint of this model?")


def _split_fused(
    name: str, prefix: str, proj: str, tensors: Mapping[str, np.ndarray], graph: Graph, source: str
) -> np.ndarray:
    """One projection's rows of Phi-3's fused weights: `qkv_proj` holds q, k, v rows in that order,
    `gate_up_proj` gate rows then up rows (transformers' Phi3Attention and Phi3MLP slice them so)."""
    attn = proj in ("q", "k", "v")
    parts = ("q", "k", "v") if attn else ("gate", "up")
    fused = f"{prefix}.{'self_attn.qkv_proj' if attn else 'mlp.gate_up_proj'}.weight"
    if fused not in tensors:
        raise UserError(f"{source}: the checkpoint has no tensor `{name}` (nor the fused `{fused}`)")
    where = "self_attn" if attn else "mlp"
    rows = [int(graph.params[f"{prefix}.{where}.{part}_proj.weight"].shape[0]) for part in parts]
    arr = tensors[fused]
    if arr.ndim != 2 or arr.shape[0] != sum(rows):
        raise UserError(
            f"{source}: `{fused}` has shape {list(arr.shape)}, the model expects {sum(rows)} rows "
            f"({' + '.join(map(str, rows))}: {', '.join(parts)})"
        )
    start = sum(rows[: parts.index(proj)])
    return arr[start : start + rows[parts.index(proj)]]


def _gpt_oss_experts(
    prefix: str, kind: str, proj: str, tensors: Mapping[str, np.ndarray], source: str
) -> np.ndarray:
    """One stacked expert weight or bias from gpt-oss's fused tensors (GptOssExperts: gate_up_proj
    [E, D, 2F], gate = columns 0::2, up = 1::2; down_proj [E, F, D]; x @ W + bias)."""
    suffix = "_bias" if kind == "b" else ""
    fused = f"{prefix}.experts.{'down_proj' if proj == 'down' else 'gate_up_proj'}{suffix}"
    if fused not in tensors:
        raise UserError(f"{source}: the checkpoint has no tensor `{fused}`; is it a gpt-oss checkpoint?")
    arr = tensors[fused]
    if proj != "down":
        arr = arr[..., 0::2] if proj == "gate" else arr[..., 1::2]
    return arr if kind == "b" else np.swapaxes(arr, 1, 2)  # weights to [E, out, in]


def _llama4_experts(prefix: str, proj: str, tensors: Mapping[str, np.ndarray], source: str) -> np.ndarray:
    """One stacked expert weight from Llama 4's fused tensors (Llama4TextExperts: gate_up_proj
    [E, D, 2F], gate the first F columns, up the last; down_proj [E, F, D]; x @ W)."""
    fused = f"{prefix}.experts.{'down_proj' if proj == 'down' else 'gate_up_proj'}"
    if fused not in tensors:
        raise UserError(f"{source}: the checkpoint has no tensor `{fused}`; is it a Llama 4 checkpoint?")
    arr = tensors[fused]
    if proj != "down":
        half = arr.shape[-1] // 2
        arr = arr[..., :half] if proj == "gate" else arr[..., half:]
    return np.swapaxes(arr, 1, 2)


_ABSORBED = re.compile(r"^(?P<prefix>model\.layers\.\d+\.self_attn)\.w_(?P<which>uk|uv)$")


def _absorbed(
    prefix: str, which: str, tensors: Mapping[str, np.ndarray], graph: Graph, source: str
) -> np.ndarray:
    """MLA's per-head up-projections from `kv_b_proj.weight` [H * (nope + v), r] (DeepseekV3Attention:
    each head's rows are its key's nope part, then its value): w_uk [H, r, nope] (the key rows, transposed:
    it takes a query's nope part into latent space), w_uv [H, v, r] (the value rows)."""
    fused = f"{prefix}.kv_b_proj.weight"
    if fused not in tensors:
        raise UserError(f"{source}: the checkpoint has no tensor `{fused}`; is it a DeepSeek-V3 checkpoint?")
    uk, uv = graph.params[f"{prefix}.w_uk"].shape, graph.params[f"{prefix}.w_uv"].shape
    heads, rank, nope, v = int(uk[0]), int(uk[1]), int(uk[2]), int(uv[1])
    arr = tensors[fused]
    if tuple(arr.shape) != (heads * (nope + v), rank):
        raise UserError(
            f"{source}: `{fused}` has shape {list(arr.shape)}, the model expects {[heads * (nope + v), rank]}"
        )
    per_head = arr.reshape(heads, nope + v, rank)
    return np.swapaxes(per_head[:, :nope], 1, 2) if which == "uk" else per_head[:, nope:]


_MLA_ROPE_ROWS = re.compile(
    r"^model\.layers\.\d+\.self_attn\.(?P<proj>q_proj|q_b_proj|kv_a_proj_with_mqa)\.weight$"
)


def _mla_rope_halves(name: str, arr: np.ndarray, graph: Graph) -> np.ndarray:
    """DeepSeek-V3 with rope_interleave: the rope part's rows reordered from adjacent pairs to halves (even
    dims, then odd), per head of q (its last qk_rope_head_dim rows) and in the shared key (the last rows of
    kv_a_proj_with_mqa): the rope op then rotates them as the checkpoint's interleaved rope does."""
    m = _MLA_ROPE_ROWS.match(name)
    if m is None or not graph.meta.get("mla_rope_interleaved"):
        return arr
    rope = int(graph.meta["qk_rope_head_dim"])
    order = np.concatenate([np.arange(0, rope, 2), np.arange(1, rope, 2)])
    out = np.array(arr)
    if m["proj"] == "kv_a_proj_with_mqa":
        out[-rope:] = arr[-rope:][order]
        return out
    hd = int(graph.meta["head_dim"])
    heads = out.reshape(-1, hd, arr.shape[-1])
    heads[:, hd - rope :] = heads[:, hd - rope :][:, order]
    return heads.reshape(arr.shape)


_INDEXER_ROWS = re.compile(
    r"^model\.layers\.\d+\.self_attn\.indexer\.(?P<part>wq_b\.weight|wk\.weight|k_norm\.weight|k_norm\.bias)$"
)


def _indexer_rope_halves(name: str, arr: np.ndarray, graph: Graph) -> np.ndarray:
    """GLM-5's indexer rotates adjacent pairs of the first qk_rope_head_dim dims of each head: those rows
    of wq_b (per head), wk and the k LayerNorm's weight and bias reordered to halves (a LayerNorm over the
    head is indifferent to the order of its dims, once its weight and bias move with them)."""
    m = _INDEXER_ROWS.match(name)
    if m is None or not graph.meta.get("indexer_rope_interleaved"):
        return arr
    rope, di = int(graph.meta["qk_rope_head_dim"]), int(graph.meta["index_head_dim"])
    order = np.concatenate([np.arange(0, rope, 2), np.arange(1, rope, 2)])
    heads = np.array(arr).reshape(-1, di, *arr.shape[1:])  # wq_b: [H, Di, q_lora]; the others: one head
    heads[:, :rope] = heads[:, :rope][:, order]
    return heads.reshape(arr.shape)


_QK_PROJ = re.compile(r"^model\.layers\.(?P<layer>\d+)\.self_attn\.[qk]_proj\.(weight|bias)$")


def _rope_halves(name: str, arr: np.ndarray, graph: Graph) -> np.ndarray:
    """`arr` with each head's rows reordered from adjacent rope pairs to halves (even dims, then odd)
    on the layers the graph meta `rope_interleaved_layers` names (Llama 4); else `arr`."""
    m = _QK_PROJ.match(name)
    if m is None or int(m["layer"]) not in graph.meta.get("rope_interleaved_layers", ()):
        return arr
    hd = int(graph.meta["head_dim"])
    order = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    heads = arr.reshape(-1, hd, *arr.shape[1:])
    return heads[:, order].reshape(arr.shape)


def _stack_experts(
    prefix: str, block: str, proj: str, tensors: Mapping[str, np.ndarray], t: TensorType, source: str
) -> np.ndarray:
    experts = int(t.shape[0])
    gate, up, down = _EXPERT_NAMES[block]
    hub = {"gate": gate, "up": up, "down": down}[proj]
    per_expert = [f"{prefix}.experts.{e}.{hub}.weight" for e in range(experts)]
    if all(k in tensors for k in per_expert):
        return np.stack([tensors[k] for k in per_expert])
    fused = f"{prefix}.experts.gate_up_proj"
    if proj in ("gate", "up") and fused in tensors:
        gate_up = tensors[fused]  # [E, 2F, D]: gate rows first, then up
        half = gate_up.shape[1] // 2
        return gate_up[:, :half] if proj == "gate" else gate_up[:, half:]
    if proj == "down" and f"{prefix}.experts.down_proj" in tensors:
        return tensors[f"{prefix}.experts.down_proj"]
    raise UserError(f"{source}: no expert weights for `{prefix}` ({per_expert[0]} or {fused} not found)")
