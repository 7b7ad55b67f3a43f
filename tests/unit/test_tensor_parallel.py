"""Tensor parallelism on CPU over gloo: llama-tiny split over 2 ranks gives the single-process plan's
logits (prefill and cached decode steps, fresh random tokens) within the f32 model tolerance; the
shards partition the weights; bad degrees are refused in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.models import load_model
from polymorph.serving.tensor_parallel import shard_config, shard_weights

RANK_SCRIPT = """
import sys
import numpy as np
import torch.distributed as dist
from polymorph.pipeline.backend import registry
from polymorph.hardware.profile import load_profile
from polymorph.models import load_model
from polymorph.serving.tensor_parallel import TensorParallel

rank, world, store, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
model = load_model("llama-tiny")
data = np.load(f"{folder}/steps.npz")
bindings = {"batch": 2, "seq": 1, "ctx_blocks": 2, "cache_blocks": 5}
exe = TensorParallel(registry.get("cpu"), model.graph, model.config, model.weights(), load_profile("cpu"), bindings)
exe.allocate_state(5)
outs = []
for i in range(int(data["n"])):
    step = {k: data[f"{k}{i}"] for k in ("tokens", "positions", "block_table")}
    outs.append(exe.run(step)["logits"])
if rank == 0:
    np.savez(f"{folder}/tp.npz", *outs)
dist.destroy_process_group()
"""


def _steps(rng: np.random.Generator, vocab: int) -> list[dict[str, np.ndarray]]:
    table = np.array([[1, 2], [3, 4]], dtype=np.int32)
    steps = [{"tokens": rng.integers(0, vocab, (2, 7), dtype=np.int32),
              "positions": np.tile(np.arange(7, dtype=np.int32), (2, 1)), "block_table": table}]  # fmt: skip
    for pos in (7, 8, 9):
        steps.append({"tokens": rng.integers(0, vocab, (2, 1), dtype=np.int32),
                      "positions": np.full((2, 1), pos, np.int32), "block_table": table})  # fmt: skip
    return steps


@pytest.mark.slow
def test_tp2_over_gloo_matches_the_single_process_plan(tmp_path: Path) -> None:
    import subprocess

    from polymorph import api
    from polymorph.ir.dtypes import DType
    from polymorph.verify.tolerance import compare, model_tolerance

    model = load_model("llama-tiny")
    steps = _steps(np.random.default_rng(), model.config.vocab_size)
    np.savez(tmp_path / "steps.npz", n=len(steps),
             **{f"{k}{i}": v for i, s in enumerate(steps) for k, v in s.items()})  # fmt: skip
    single = api.load(api.lower(model, "cpu", batch=2, ctx=32), model)
    single.allocate_state(5)
    want = [single.run(s)["logits"] for s in steps]
    store = tmp_path / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(r), "2", str(store), str(tmp_path)],
                              env=env, stderr=subprocess.PIPE, text=True) for r in range(2)]  # fmt: skip
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    got = np.load(tmp_path / "tp.npz")
    for i, w in enumerate(want):
        check = compare(got[f"arr_{i}"], w, model_tolerance(DType.F32))
        assert check.ok, f"step {i}: {check}"


def test_shards_partition_the_weights() -> None:
    model = load_model("llama-tiny")
    cfg, weights = model.config, model.weights()
    shards = [shard_weights(weights, cfg, 2, r) for r in range(2)]
    q = "model.layers.0.self_attn.q_proj.weight"
    o = "model.layers.0.self_attn.o_proj.weight"
    down = "model.layers.0.mlp.down_proj.weight"
    np.testing.assert_array_equal(np.concatenate([s[q] for s in shards], axis=0), weights[q])
    np.testing.assert_array_equal(np.concatenate([s[o] for s in shards], axis=1), weights[o])
    np.testing.assert_array_equal(np.concatenate([s[down] for s in shards], axis=1), weights[down])
    assert shards[0]["model.norm.weight"] is weights["model.norm.weight"]  # replicated
    half = shard_config(cfg, 2)
    assert (half.num_attention_heads, half.num_key_value_heads, half.head_dim) == (2, 1, cfg.head_dim)


def test_a_degree_that_does_not_divide_the_heads_is_refused() -> None:
    cfg = load_model("llama-tiny").config
    with pytest.raises(UserError, match="TP=3 does not divide attention heads"):
        shard_config(cfg, 3)
    with pytest.raises(UserError, match="built for llama"):
        shard_config(load_model("moe-tiny").config, 2)
