"""The rope kernel's `angles: table` config (cos and sin rows kept across calls, grown on demand) gives
the per-call config's numbers bit for bit, at any position: a table grown past its first size, a
batch of ragged positions, and the first call at position 0. What makes it a choice the exact gate
passes, not only one within tolerance."""

from __future__ import annotations

import numpy as np
import torch

from polymorph import api
from polymorph.pipeline.kernel_files import load_choice
from polymorph.pipeline.lowering import kernel_spec


def test_rope_table_equals_per_call_bitwise() -> None:
    plan = api.lower("llama-tiny", "cpu", batch=4, ctx=1024).plan
    graph, types = plan.concrete()
    group = next(g for g in plan.groups if g.pattern == "rope")
    kernel = load_choice(group.kernel.file, group.kernel.sha256)
    spec = kernel_spec(graph, group, types, plan.kernel_target())
    per_call = kernel.build(spec, {"angles": "per_call"}, plan.kernel_target())
    table = kernel.build(spec, {"angles": "table"}, plan.kernel_target())
    rng = np.random.default_rng()
    (x_name, pos_name) = group.inputs[:2]
    heads, head_dim = types[x_name].shape[-2:]
    for top in (1, 40, 700, 5000):  # the table starts empty and doubles past each
        b, s = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        x = torch.from_numpy(rng.standard_normal((b, s, heads, head_dim)).astype(np.float32))
        pos = torch.from_numpy(rng.integers(0, top, (b, s)).astype(np.int32))
        pos[0, 0] = top - 1
        inputs = {x_name: x, pos_name: pos}
        args = [inputs[v] for v in group.inputs]
        want, got = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        per_call(args, [want], None)
        table(args, [got], None)
        assert torch.equal(want.view(torch.int32), got.view(torch.int32)), f"positions below {top}"
