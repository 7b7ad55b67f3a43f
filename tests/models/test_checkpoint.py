"""safetensors reading and writing against the safetensors library and transformers checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.models.checkpoint import (
    DTYPES,
    INDEX_FILE,
    SINGLE_FILE,
    list_checkpoint,
    load_checkpoint,
    read_safetensors,
    read_safetensors_metadata,
    save_checkpoint,
    write_safetensors,
)
from polymorph.models.config import ModelConfig, load_config

TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _sample(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 4).astype(dtype)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (so NaN payloads and -0.0 count)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _all_dtypes(rng: np.random.Generator) -> dict[str, np.ndarray]:
    tensors = {f"t.{name}": _sample(dt, (3, 5), rng) for name, dt in DTYPES.items()}
    tensors["scalar"] = np.array(1.5, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 4), dtype=ml_dtypes.bfloat16)
    tensors["odd"] = _sample(np.dtype(np.int8), (7,), rng)  # odd byte count before aligned tensors
    return tensors


def test_round_trip_every_dtype(tmp_path: Path) -> None:
    tensors = _all_dtypes(np.random.default_rng(0))
    path = tmp_path / "all.safetensors"
    write_safetensors(path, tensors, metadata={"format": "pt", "note": "x"})
    back = read_safetensors(path)
    assert back.keys() == tensors.keys()
    for name, arr in tensors.items():
        assert _same(back[name], arr), name
        assert not back[name].flags.writeable
    assert read_safetensors_metadata(path) == {"format": "pt", "note": "x"}

    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    for name, entry in header.items():
        if name != "__metadata__":
            begin = entry["data_offsets"][0]
            assert (8 + n + begin) % DTYPES[entry["dtype"]].itemsize == 0, name


def test_write_accepts_views_and_big_endian(tmp_path: Path) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    tensors = {"t": base.T, "s": base[:, ::2], "be": base.astype(">f4")}
    write_safetensors(tmp_path / "v.safetensors", tensors)
    back = read_safetensors(tmp_path / "v.safetensors")
    np.testing.assert_array_equal(back["t"], base.T)
    np.testing.assert_array_equal(back["s"], base[:, ::2])
    np.testing.assert_array_equal(back["be"], base)
    assert back["be"].dtype == np.float32


def test_write_rejects_unsupported_dtype(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="complex64"):
        write_safetensors(tmp_path / "c.safetensors", {"c": np.zeros(2, dtype=np.complex64)})


def test_reads_files_written_by_safetensors(tmp_path: Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(1)
    plain = {k: v for k, v in _all_dtypes(rng).items() if v.dtype.kind != "V" and "BF16" not in k}
    plain = {
        k: v for k, v in plain.items() if v.dtype not in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
    }
    path = tmp_path / "np.safetensors"
    st_numpy.save_file(plain, str(path), metadata={"format": "np"})
    back = read_safetensors(path)
    assert back.keys() == plain.keys()
    for name, arr in plain.items():
        assert _same(back[name], arr), name
    assert read_safetensors_metadata(path) == {"format": "np"}


def test_reads_bf16_and_fp8_written_by_safetensors_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    tensors = {
        "bf16": torch.randn(4, 6).to(torch.bfloat16),
        "e4m3": torch.randn(3, 2).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(5).to(torch.float8_e5m2),
    }
    path = tmp_path / "torch.safetensors"
    st_torch.save_file(tensors, str(path))
    back = read_safetensors(path)
    assert back["bf16"].dtype == ml_dtypes.bfloat16
    assert back["e4m3"].dtype == ml_dtypes.float8_e4m3fn and back["e5m2"].dtype == ml_dtypes.float8_e5m2
    for name, t in tensors.items():
        expected = t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy()
        assert back[name].tobytes() == expected.tobytes(), name
    np.testing.assert_array_equal(back["bf16"].astype(np.float32), tensors["bf16"].float().numpy())


def test_safetensors_reads_files_we_write(tmp_path: Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    tensors = _all_dtypes(np.random.default_rng(2))
    numpy_only = ("t.BF16", "t.F8_E4M3", "t.F8_E5M2", "empty")  # numpy has no bf16/fp8 of its own
    plain = {k: v for k, v in tensors.items() if k not in numpy_only}
    path = tmp_path / "plain.safetensors"
    write_safetensors(path, plain, metadata={"format": "np"})
    back = st_numpy.load_file(str(path))
    assert back.keys() == plain.keys()
    for name, arr in plain.items():
        assert _same(back[name], arr), name

    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "all.safetensors"
    write_safetensors(path, tensors, metadata={"format": "pt"})
    loaded = st_torch.load_file(str(path))
    assert loaded.keys() == tensors.keys()
    for name, arr in tensors.items():
        t = loaded[name]
        assert tuple(t.shape) == arr.shape, name
        if name in numpy_only:
            t = t.view(torch.uint8 if t.element_size() == 1 else torch.int16)
        assert t.numpy().tobytes() == np.ascontiguousarray(arr).tobytes(), name


def _hf_model(transformers: Any, family: str, tied: bool = False) -> Any:
    import torch

    torch.manual_seed(0)
    if family == "llama":
        hf = transformers.LlamaConfig(**TINY, tie_word_embeddings=tied)
    elif family == "mixtral":
        hf = transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2)
    else:
        hf = transformers.Qwen3MoeConfig(
            **TINY, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16
        )
    return transformers.AutoModelForCausalLM.from_config(hf)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_load_sharded_transformers_checkpoint(tmp_path: Path, tied: bool) -> None:
    transformers = pytest.importorskip("transformers")
    model = _hf_model(transformers, "llama", tied)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="50KB")
    assert (tmp_path / INDEX_FILE).exists() and not (tmp_path / SINGLE_FILE).exists()
    assert len(json.loads((tmp_path / INDEX_FILE).read_text())["weight_map"]) > 0
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1

    weights = load_checkpoint(tmp_path)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    expected = set(state) - ({"lm_head.weight"} if tied else set())
    assert set(weights) == expected
    for name in expected:
        assert _same(weights[name], state[name]), name
    assert {k: (dt, shape) for k, (dt, shape) in list_checkpoint(tmp_path).items()} == {
        k: (v.dtype, v.shape) for k, v in weights.items()
    }
    assert load_config(tmp_path).tie_word_embeddings is tied


def _expert_weights(
    weights: dict[str, np.ndarray], prefix: str, names: tuple[str, str, str]
) -> tuple[np.ndarray, np.ndarray]:
    """Stack per-expert (gate, up, down) file tensors into transformers' fused in-memory form."""
    gate, up, down = names
    count = len({k for k in weights if k.startswith(prefix) and k.endswith(f".{gate}.weight")})
    gate_up = np.stack(
        [
            np.concatenate([weights[f"{prefix}{e}.{gate}.weight"], weights[f"{prefix}{e}.{up}.weight"]])
            for e in range(count)
        ]
    )  # [E, 2 * I, H]
    down_proj = np.stack([weights[f"{prefix}{e}.{down}.weight"] for e in range(count)])  # [E, H, I]
    return gate_up, down_proj


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_load_moe_transformers_checkpoint(tmp_path: Path, family: str) -> None:
    """The expert parameter names in the file, and how they map to transformers' module state.

    transformers 5 writes per-expert tensors (Mixtral `block_sparse_moe.experts.N.w1/w2/w3`, Qwen3-MoE
    `mlp.experts.N.gate_proj/up_proj/down_proj`) while its modules hold them fused as
    `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and `mlp.experts.down_proj` [E, H, I].
    """
    transformers = pytest.importorskip("transformers")
    model = _hf_model(transformers, family)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="50KB")
    weights = load_checkpoint(tmp_path)
    assert load_config(tmp_path).model_type == family
    if family == "mixtral":
        prefix, names, router = (
            "model.layers.0.block_sparse_moe.experts.",
            ("w1", "w3", "w2"),
            "block_sparse_moe",
        )
    else:
        prefix, names, router = "model.layers.0.mlp.experts.", ("gate_proj", "up_proj", "down_proj"), "mlp"
    assert f"model.layers.0.{router}.gate.weight" in weights
    assert f"{prefix}3.{names[0]}.weight" in weights
    if family == "qwen3_moe":
        assert "model.layers.0.self_attn.q_norm.weight" in weights

    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for layer in range(TINY["num_hidden_layers"]):
        fused = f"model.layers.{layer}.mlp.experts.gate_up_proj"
        if fused not in state:  # transformers 4 keeps per-expert modules: names match the file
            continue
        gate_up, down = _expert_weights(weights, prefix.replace(".0.", f".{layer}."), names)
        assert _same(gate_up, state[fused])
        assert _same(down, state[f"model.layers.{layer}.mlp.experts.down_proj"])
        np.testing.assert_array_equal(
            weights[f"model.layers.{layer}.{router}.gate.weight"],
            state[f"model.layers.{layer}.mlp.gate.weight"],
        )
    for name, arr in state.items():
        if name in weights:
            assert _same(weights[name], arr), name
    cfg = load_config(tmp_path)
    assert sum(int(np.prod(v.shape)) for v in weights.values()) == cfg.param_count()


def test_save_checkpoint_single_and_sharded(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    tensors = {f"w{i}": rng.standard_normal((16, 16)).astype(np.float32) for i in range(5)}  # 1 KiB each
    written = save_checkpoint(tmp_path, tensors)
    assert written == [tmp_path / SINGLE_FILE]
    assert read_safetensors_metadata(tmp_path / SINGLE_FILE) == {"format": "pt"}
    assert all(_same(load_checkpoint(tmp_path)[k], v) for k, v in tensors.items())

    written = save_checkpoint(tmp_path, tensors, shard_bytes=2048)
    assert not (tmp_path / SINGLE_FILE).exists()
    assert [p.name for p in written] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)] + [
        INDEX_FILE
    ]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == 5 * 1024
    assert index["weight_map"]["w4"] == "model-00003-of-00003.safetensors"
    back = load_checkpoint(tmp_path)
    assert back.keys() == tensors.keys() and all(_same(back[k], v) for k, v in tensors.items())

    # saving again unsharded replaces the sharded checkpoint
    save_checkpoint(tmp_path, {"only": tensors["w0"]})
    assert set(load_checkpoint(tmp_path)) == {"only"}
    assert not list(tmp_path.glob("model-*")) and not (tmp_path / INDEX_FILE).exists()


def test_transformers_loads_checkpoint_we_save(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = ModelConfig.from_hf({"model_type": "llama", **TINY, "tie_word_embeddings": True}, "tiny")
    reference = _hf_model(transformers, "llama", tied=True)
    tensors = {k: v.detach().numpy() for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    save_checkpoint(tmp_path, tensors, shard_bytes=20_000)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf()))
    assert (tmp_path / INDEX_FILE).exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    for name, value in model.state_dict().items():
        key = "model.embed_tokens.weight" if name == "lm_head.weight" else name
        np.testing.assert_array_equal(value.detach().numpy(), tensors[key], err_msg=name)


def _user_error(fn: Any, *args: Any) -> str:
    with pytest.raises(UserError) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def _raw_file(path: Path, header: dict[str, Any], data: bytes) -> Path:
    body = json.dumps(header).encode()
    path.write_bytes(len(body).to_bytes(8, "little") + body + data)
    return path


def test_malformed_files_name_the_file(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    write_safetensors(good, {"a": np.ones((64,), np.float32), "b": np.ones((4,), np.int64)})
    raw = good.read_bytes()

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(raw[:-10])
    msg = _user_error(read_safetensors, truncated)
    assert str(truncated) in msg and "truncated" in msg
    for cut in (4, 20):
        truncated.write_bytes(raw[:cut])
        assert "truncated" in _user_error(read_safetensors, truncated)

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((20).to_bytes(8, "little") + b"{not json at all!!!}")
    assert str(bad) in _user_error(read_safetensors, bad)
    bad.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    assert "header length" in _user_error(read_safetensors, bad)

    entry = {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}
    msg = _user_error(read_safetensors, _raw_file(bad, {"z": entry}, bytes(16)))
    assert "'C64'" in msg and "'z'" in msg and str(bad) in msg
    entry = {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}
    assert "needs 12 bytes" in _user_error(read_safetensors, _raw_file(bad, {"z": entry}, bytes(16)))
    entry = {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}
    assert "shape" in _user_error(read_safetensors, _raw_file(bad, {"z": entry}, bytes(4)))
    assert "entry" in _user_error(read_safetensors, _raw_file(bad, {"z": [1, 2]}, b""))
    assert "no such file" in _user_error(read_safetensors, tmp_path / "nope.safetensors")
    assert _raw_file(bad, {}, b"") and read_safetensors(bad) == {}


def test_malformed_checkpoints_name_the_file(tmp_path: Path) -> None:
    assert "no model.safetensors" in _user_error(load_checkpoint, tmp_path)
    assert "no such model directory" in _user_error(load_checkpoint, tmp_path / "absent")

    tensors = {f"w{i}": np.full((256,), i, np.float32) for i in range(4)}  # 1 KiB each
    save_checkpoint(tmp_path, tensors, shard_bytes=2048)
    index_path = tmp_path / INDEX_FILE
    index = json.loads(index_path.read_text())

    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.rename(tmp_path / "moved")
    msg = _user_error(load_checkpoint, tmp_path)
    assert str(shard) in msg and "missing" in msg
    assert "missing" in _user_error(list_checkpoint, tmp_path)
    (tmp_path / "moved").rename(shard)

    index_path.write_text(json.dumps({**index, "weight_map": {**index["weight_map"], "ghost": shard.name}}))
    msg = _user_error(load_checkpoint, tmp_path)
    assert "ghost" in msg and str(shard) in msg
    assert "ghost" in _user_error(list_checkpoint, tmp_path)

    index_path.write_text("{oops")
    assert str(index_path) in _user_error(load_checkpoint, tmp_path)
    index_path.write_text(json.dumps({"metadata": {}}))
    assert "weight_map" in _user_error(load_checkpoint, tmp_path)

    # a tensor stored in two shards
    write_safetensors(shard, {"w0": tensors["w0"], "w2": tensors["w2"], "w3": tensors["w3"]})
    index_path.write_text(json.dumps(index))
    assert "also appears" in _user_error(load_checkpoint, tmp_path)

    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1)
    msg = _user_error(load_checkpoint, tmp_path)
    assert str(shard) in msg and "truncated" in msg
