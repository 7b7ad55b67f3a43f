"""What the cpu executable tells the cost model about itself: the torch ops each group dispatches
(`host_ops`) and each group's time inside whole steps (`time_in_step`)."""

from __future__ import annotations

import numpy as np

from polymorph import api
from polymorph.models import load_model
from polymorph.pipeline.backend import registry
from polymorph.serving.kvcache import PagedKVCache


def decode(ctx: int = 40):
    m = load_model("llama-tiny")
    exe = registry.get("cpu").load(api.compile(m, "cpu", batch=1, ctx=ctx), m.weights())
    cache = PagedKVCache.for_batch(1, ctx, int(m.graph.meta["block_size"]))
    exe.allocate_state(cache.cache_blocks)
    positions, table = cache.decode_step(1, ctx)
    rng = np.random.default_rng()

    def inputs() -> dict[str, np.ndarray]:
        return {
            "tokens": rng.integers(0, 256, (1, 1), dtype=np.int32),
            "positions": positions,
            "block_table": table,
        }

    return exe, inputs


def test_host_ops_counts_every_group_and_leaves_the_launches_as_they_were() -> None:
    exe, inputs = decode()
    launches = list(exe.launches)
    step = inputs()
    want = exe.run(step)["logits"]
    counts = exe.host_ops(step)
    assert set(counts) == {g.id for g, _ in launches} and all(n >= 1 for n in counts.values())
    # The norm is several torch ops (upcast, square, mean, rsqrt, scale, copy); a head split is a copy.
    assert counts["layers.0.attn.norm"] > counts["layers.0.attn.q_heads"]
    assert [launch for _, launch in exe.launches] == [launch for _, launch in launches]
    np.testing.assert_array_equal(exe.run(step)["logits"], want)  # counting ran the same step


def test_time_in_step_times_each_group_where_it_runs() -> None:
    exe, inputs = decode()
    groups, step_s = exe.time_in_step(inputs, trials=5)
    assert set(groups) == {g.id for g, _ in exe.launches}
    assert all(t > 0 for t in groups.values()) and step_s > 0
