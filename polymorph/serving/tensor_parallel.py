"""Tensor-parallel execution of a Llama plan over `tp` ranks (torch.distributed: NCCL on GPUs, gloo
on CPUs), Megatron-style: the q/k/v and gate/up projections are column-parallel (each rank holds
1/tp of the heads, kv heads and MLP width), the o and down projections row-parallel, and their
partial outputs are summed by one all-reduce each, before the residual add; norms, embeddings and the
lm_head are replicated. Two all-reduces per layer, as polymorph/cost/parallel.py prices them.

Each rank runs an ordinary plan: the decoder built for the rank's shard of the config
(`shard_config`), lowered by the backend without the fusion that would put the residual add inside
the row-parallel projection (`unfused`), its o/down groups followed by the all-reduce (`collective_groups`). The
weights are the full model's, sliced per rank (`shard_weights`).

Proven here: on CPU over gloo, TP=2 logits equal the single-process plan's (tests/unit/
test_tensor_parallel.py). On GPUs the same code runs over NCCL, launched kernel by kernel or, with
`capture=True`, with the all-reduces inside the step's CUDA graph. On two H200s (BENCHMARKS.md,
bench/tp_check.py) both ran; TP=2's bf16 logits stay further from the float32 reference than the
single GPU's (more logits out of tolerance, similar max error), for a reason not known: each rank's
partial sum is rounded to bf16 before the all-reduce, where one GPU rounds the f32 sum once, but that
rounding simulated in the bf16 reference engine barely moved its error (BENCHMARKS.md,
bench/tp_rounding.py), which settles nothing for the GPU plan's larger errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from polymorph.errors import UserError
from polymorph.ir.graph import Graph
from polymorph.models.config import ModelConfig
from polymorph.models.decoder import build_decoder

ROW_PARALLEL = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")


def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The config one rank builds: heads, kv heads and MLP width divided by `tp`."""
    if cfg.model_type != "llama":
        raise UserError(f"tensor parallelism is built for llama models, not {cfg.model_type}")
    for what, n in (("attention heads", cfg.num_attention_heads), ("kv heads", cfg.num_key_value_heads),
                    ("the MLP width", cfg.intermediate_size)):  # fmt: skip
        if n % tp:
            raise UserError(f"TP={tp} does not divide {what} ({n})")
    return dataclasses.replace(
        cfg,
        num_attention_heads=cfg.num_attention_heads // tp,
        num_key_value_heads=cfg.num_key_value_heads // tp,
        intermediate_size=cfg.intermediate_size // tp,
        head_dim=cfg.head_dim,
    )


def shard_graph(graph: Graph, cfg: ModelConfig, tp: int) -> Graph:
    meta = graph.meta
    return build_decoder(shard_config(cfg, tp), name=f"{graph.name}-tp{tp}", dtype=_dtype(graph),
                         block_size=int(meta.get("block_size", 16)))  # fmt: skip


def _dtype(graph: Graph) -> Any:
    from polymorph.ir.dtypes import DType

    return DType.parse(graph.meta.get("dtype", "f32"))


def shard_weights(
    weights: Mapping[str, np.ndarray], cfg: ModelConfig, tp: int, rank: int
) -> dict[str, np.ndarray]:
    """Rank `rank`'s slice of the full model's weights (HF names, as polymorph's graph uses them)."""
    hd = cfg.head_dim
    rows = {"q_proj": cfg.num_attention_heads * hd, "k_proj": cfg.num_key_value_heads * hd,
            "v_proj": cfg.num_key_value_heads * hd, "gate_proj": cfg.intermediate_size,
            "up_proj": cfg.intermediate_size}  # fmt: skip
    out = {}
    for name, w in weights.items():
        proj = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if any(name.endswith(p) for p in ROW_PARALLEL):
            n = w.shape[1] // tp
            out[name] = np.ascontiguousarray(w[:, rank * n : (rank + 1) * n])
        elif any(name.endswith(p.replace(".weight", ".bias")) for p in ROW_PARALLEL):
            out[name] = w if rank == 0 else np.zeros_like(w)  # added once: the all-reduce sums the ranks
        elif any(f"{c}." in name for c in COLUMN_PARALLEL):  # weight [out, in] or bias [out]
            n = rows[proj] // tp
            out[name] = np.ascontiguousarray(w[rank * n : (rank + 1) * n])
        else:
            out[name] = w
    return out


def collective_groups(plan: Any) -> list[str]:
    """The groups whose output is a row-parallel partial sum: the o and down projections."""
    by_name = {n.name: n for n in plan.graph.nodes}
    found = []
    for group in plan.groups:
        for node in (by_name[n] for n in group.nodes):
            if node.op == "linear" and any(v.endswith(ROW_PARALLEL) for v in node.inputs):
                found.append(group.id)
    return found


# The fusions that would add the residual inside a row-parallel projection, before the ranks' sum.
UNFUSED = ("linear+residual",)


class TensorParallel:
    """One rank's executable: the rank's plan on the backend, each collective group's output summed
    over the process group right after its launch. torch.distributed must be initialized."""

    def __init__(self, backend: Any, full_graph: Graph, cfg: ModelConfig, weights: Mapping[str, np.ndarray],
                 profile: Any, bindings: Mapping[str, int], *, group: Any = None,
                 capture: bool = False) -> None:  # fmt: skip
        import torch.distributed as dist

        from polymorph.cost.model import plan_report
        from polymorph.pipeline.backend import Artifact

        if not dist.is_initialized():
            raise UserError("tensor parallelism needs torch.distributed initialized (one process per rank)")
        self.tp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        graph = shard_graph(full_graph, cfg, self.tp)
        plan = backend.lower(graph, profile, dict(bindings), unfused=UNFUSED)
        self.plan = plan
        self.collectives = collective_groups(plan)
        if len(self.collectives) != 2 * cfg.num_hidden_layers:
            raise UserError(f"found {len(self.collectives)} row-parallel groups, expected 2 per layer")
        shard = shard_weights(weights, cfg, self.tp, self.rank)
        self.exe = backend.load(Artifact(plan, plan_report(plan, resources_of=lambda g: {}), None), shard)
        reduce = _all_reduce(group)
        if hasattr(self.exe, "launches"):  # cpu: wrap the launches in place
            self.exe.launches = [(g, _then(launch, reduce) if g.id in self.collectives else launch)
                                 for g, launch in self.exe.launches]  # fmt: skip
        else:  # GPU executables: the hook runs after the group's launch. With `capture`, decode steps
            # are captured in a CUDA graph with the all-reduces inside (NCCL collectives capture once
            # the communicator exists: the capture's warm-up steps create it).
            self.exe.capture = capture
            self.exe.collectives = {g: reduce for g in self.collectives}
            self.exe.lower = lambda graph, prof, bindings: backend.lower(
                graph, prof, bindings, unfused=UNFUSED
            )

    def allocate_state(self, cache_blocks: int) -> None:
        self.exe.allocate_state(cache_blocks)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.exe.run(inputs)


def _all_reduce(group: Any) -> Any:
    import torch.distributed as dist

    def reduce(outs: list[Any]) -> None:
        dist.all_reduce(outs[0], op=dist.ReduceOp.SUM, group=group)

    return reduce


def _then(launch: Any, after: Any) -> Any:
    def wrapped(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        launch(inputs, outputs, scratch)
        after(outputs)

    return wrapped
