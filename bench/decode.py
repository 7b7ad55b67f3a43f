"""Decode and prefill benchmark on one NVIDIA GPU: polymorph's cuda backend against PyTorch eager and
torch.compile (a gpt-fast-style peer) on the same random bf16 weights, with the roofline.

    python bench/decode.py --model llama-3.2-1b --batch 1 --ctx 1024 8192 --peers eager reduce-overhead \
        max-autotune --kernels --prefill 2048 --out results.json
    python bench/decode.py --model mixtral-8x7b --layers 4 --batch 1 32 --ctx 1024 --out moe.json

Every point runs all its systems in this one process. Decode is timed by replaying each system's
CUDA graph (polymorph's captured step; torch.compile's "reduce-overhead" graphs; eager launches as
they are), one CUDA-event pair per step, fresh token ids every step, median over `--steps`. The
roofline is (weight bytes + KV bytes read) per step over the device-to-device copy bandwidth measured
at the start of this run. Logits of polymorph and the peer are compared teacher-forced (same cache
content, same tokens) within the bf16 model tolerance before any timing counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_llama import PeerLlama

from polymorph.backends.gpu.runtime import GpuExecutable
from polymorph.cost.model import group_cost
from polymorph.hardware.profile import load_profile
from polymorph.ir.dtypes import DType
from polymorph.ir.shapes import numel
from polymorph.models import Model, load_model
from polymorph.passes import specialize
from polymorph.pipeline.backend import registry
from polymorph.verify.tolerance import compare, model_tolerance


def copy_bandwidth(nbytes: int = 1 << 30, trials: int = 20) -> float:
    """Device-to-device copy, bytes read plus written, per second (median)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(trials + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) * 1e-3)
    return 2 * nbytes / statistics.median(times)


def random_weights(graph, seed: int) -> dict[str, torch.Tensor]:
    """polymorph's random-weight scales (models/weights.py), drawn on the GPU: norms ~1, embeddings
    ~N(0, 1/D), projections ~N(0, 1/fan_in)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, t in graph.params.items():
        shape = tuple(int(d) for d in t.shape)
        x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
        if len(shape) == 1:
            x = 1.0 + 0.1 * x
        else:
            x = x / math.sqrt(shape[-1])
        out[name] = x.to(torch.bfloat16)
    return out


def timed_steps(step, make_tokens, steps: int) -> float:
    """Median seconds of `step(tokens)` over `steps` calls, one event pair per call."""
    times = []
    for _ in range(steps):
        tokens = make_tokens()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(tokens)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def with_overrides(plan, overrides: dict[str, dict]):
    """The plan with config keys replaced per kernel: `overrides` maps a kernel file
    ("triton/linear_residual.py"), or a file and a group-id substring ("triton/linear_residual.py@attn.o"),
    to the keys its groups' configs take on top of the plan's choice (a variant of bench/h200_variants.py)."""
    groups = []
    for g in plan.groups:
        config = dict(g.kernel.config)
        for key, keys in overrides.items():
            file, _, part = key.partition("@")
            if g.kernel.file == file and part in g.id:
                config.update(keys)
        kernel = g.kernel if config == g.kernel.config else dataclasses.replace(g.kernel, config=config)
        groups.append(dataclasses.replace(g, kernel=kernel))
    return dataclasses.replace(plan, groups=groups)


class PolymorphRunner:
    def __init__(self, model, weights, batch: int, ctx: int, overrides: dict[str, dict] | None = None,
                 share: PolymorphRunner | None = None) -> None:  # fmt: skip
        """`overrides`: config keys per kernel file (with_overrides); `share`: a runner of the same
        model and shape whose KV cache and block table this one uses too (variants of one point)."""
        block = int(model.graph.meta["block_size"])
        self.ctx_blocks = -(-(ctx + 16) // block)
        cache_blocks = batch * self.ctx_blocks + 1
        bindings = {"batch": batch, "seq": 1, "ctx_blocks": self.ctx_blocks, "cache_blocks": cache_blocks}
        backend = registry.get("cuda")
        if share is not None:  # the same shape: its plan before overrides, not lowered again
            self.plan = self.lowered = share.lowered
        else:
            self.plan = self.lowered = backend.lower(model.graph, load_profile("h200"), bindings)
        if overrides:
            self.plan = with_overrides(self.plan, overrides)
        self.exe = GpuExecutable(backend, self.plan, weights)
        if share is not None:
            self.exe.state = share.exe.state
            self.exe.allocated = True
            self.block_table = share.block_table
        else:
            self.exe.allocate_state(cache_blocks)
            perm = (
                torch.randperm(cache_blocks - 1, device="cuda")[: batch * self.ctx_blocks] + 1
            )  # block 0: guard
            self.block_table = perm.view(batch, self.ctx_blocks).to(torch.int32)
        self.block = block
        self.batch = batch

    def load_cache(self, k: list[torch.Tensor], v: list[torch.Tensor], length: int) -> None:
        """Copy contiguous caches [B, Hkv, T, Dh] (the peer's layout) into the paged cache."""
        for i, (kl, vl) in enumerate(zip(k, v, strict=True)):
            for name, src in ((f"layers.{i}.k_cache", kl), (f"layers.{i}.v_cache", vl)):
                dst = self.exe.state[name]  # [NB, BS, Hkv, Dh]
                pos = torch.arange(length, device="cuda")
                blocks = self.block_table[:, pos // self.block].long()  # [B, T]
                dst[blocks, (pos % self.block)[None, :]] = src[:, :, :length].transpose(1, 2)

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        positions = torch.full((self.batch, tokens.shape[1]), pos, dtype=torch.int32, device="cuda")
        if tokens.shape[1] > 1:
            positions = positions + torch.arange(tokens.shape[1], dtype=torch.int32, device="cuda")
        inputs = {"tokens": tokens, "positions": positions, "block_table": self.block_table}
        return self.exe.run_device(inputs)["logits"]


def step_weight_bytes(model, batch: int) -> float:
    """Weight bytes one decode step must read: every dense weight, and of an MoE layer's experts the
    expected number of distinct experts that `batch` tokens choose under uniform routing,
    E * (1 - (1 - k/E)^batch) (random weights route about uniformly)."""
    cfg = model.config
    total = 0.0
    for name, t in model.graph.params.items():
        nbytes = numel(t.shape) * t.dtype.itemsize
        if ".experts." in name and cfg.num_experts:
            e, k = cfg.num_experts, cfg.num_experts_per_tok
            nbytes *= 1 - (1 - k / e) ** batch
        total += nbytes
    return total


def decode_point(args, model, weights, batch: int, ctx: int, copy_bw: float) -> list[dict]:
    cfg = model.config
    vocab = cfg.vocab_size
    pos = ctx - 1  # the step that reads a context of `ctx` tokens
    rows = []
    weight_bytes = step_weight_bytes(model, batch)
    kv_bytes = 2 * cfg.num_hidden_layers * batch * ctx * cfg.num_key_value_heads * cfg.head_dim * 2
    floor_s = (weight_bytes + kv_bytes) / copy_bw

    def tokens() -> torch.Tensor:
        return torch.randint(0, vocab, (batch, 1), device="cuda", dtype=torch.int64)

    peer = PeerLlama(cfg, weights, batch=batch, max_ctx=ctx + 16)
    gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + ctx)
    for kc, vc in zip(peer.k_cache, peer.v_cache, strict=True):
        kc.normal_(generator=gen)
        vc.normal_(generator=gen)
    ours = PolymorphRunner(model, weights, batch, ctx)
    ours.load_cache(peer.k_cache, peer.v_cache, pos)

    # Teacher-forced agreement: the same tokens at the same position over the same cache content, each
    # bf16 system also against the float32 truth (the peer on the same weights and cache, upcast).
    tol = model_tolerance(DType.BF16)
    input_pos = torch.tensor([pos], device="cuda")
    truth = PeerLlama(cfg, {k: v.float() for k, v in weights.items()}, batch=batch, max_ctx=ctx + 16)
    for dst, src in zip(truth.k_cache + truth.v_cache, peer.k_cache + peer.v_cache, strict=True):
        dst.copy_(src)
    agree, ours_truth, peer_truth = [], [], []
    for _ in range(3):
        t = tokens()
        want = peer(t, input_pos).float().cpu().numpy()
        exact = truth(t, input_pos).float().cpu().numpy()
        got = ours.step(t.to(torch.int32), pos).float().cpu().numpy()
        agree.append(compare(got, want, tol))
        ours_truth.append(compare(got, exact, tol))
        peer_truth.append(compare(want, exact, tol))
    del truth
    torch.cuda.empty_cache()
    worst = max(agree, key=lambda c: c.max_abs)
    ok = all(c.ok for c in agree)
    print(f"agreement b{batch} ctx{ctx}: polymorph vs peer {worst}", flush=True)
    for name, checks in (("polymorph", ours_truth), ("peer (bf16)", peer_truth)):
        print(f"  {name} vs float32 truth: {max(checks, key=lambda c: c.max_abs)}", flush=True)
    # At 16 layers both bf16 systems can stray past the model tolerance from the f32 truth at a few
    # logits; polymorph must then be no further from it than the bf16 peer is.
    as_accurate = all(
        o.max_abs <= p.max_abs and o.mismatched <= p.mismatched
        for o, p in zip(ours_truth, peer_truth, strict=True)
    )
    print(f"  polymorph at least as close to the f32 truth as the bf16 peer: {as_accurate}", flush=True)

    systems = {"polymorph": lambda t: ours.step(t.to(torch.int32), pos)}
    for mode in args.peers:
        if mode == "max-autotune" and batch not in (1, 32):
            continue
        if mode == "eager":
            systems["eager"] = lambda t, p=peer: p(t, input_pos)
            continue
        compiled = torch.compile(peer.forward, mode=mode, fullgraph=True)
        t0 = time.perf_counter()
        for _ in range(3):
            compiled(tokens(), input_pos)
        torch.cuda.synchronize()
        print(
            f"torch.compile {mode} b{batch} ctx{ctx}: compiled in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        systems[f"compile:{mode}"] = lambda t, f=compiled: f(t, input_pos)
    for name, fn in systems.items():
        for _ in range(5):
            fn(tokens())
        s = timed_steps(fn, tokens, args.steps)
        rows.append({"system": name, "batch": batch, "ctx": ctx, "step_s": s, "tokens_per_s": batch / s,
                     "roofline_s": floor_s, "roofline_fraction": floor_s / s, "agree": ok, "as_accurate_as_peer": as_accurate,
                     "agree_max_abs": worst.max_abs,
                     "vs_f32_max_abs": max(c.max_abs for c in (ours_truth if name == "polymorph" else peer_truth)),
                     })  # fmt: skip
    best = min((r["step_s"] for r in rows if r["system"].startswith("compile:")), default=None)
    for r in rows:
        r["vs_best_compile"] = best / r["step_s"] if best else None
    if args.kernels:
        rows_k = kernel_table(model, ours, batch, pos, copy_bw, args.sweep)
        rows.append({"system": "kernels", "batch": batch, "ctx": ctx, "kernels": rows_k})
    return rows


def kernel_table(
    model, ours: PolymorphRunner, batch: int, pos: int, copy_bw: float, sweep: bool
) -> list[dict]:
    """Every group of the decode step timed alone (graph replay, cold L2); with `sweep`, the groups of
    layer 0 and outside the layers also under every config their kernel file declares."""
    inputs = {"tokens": torch.randint(0, 1000, (batch, 1), device="cuda", dtype=torch.int32),
              "positions": torch.full((batch, 1), pos, dtype=torch.int32, device="cuda"),
              "block_table": ours.block_table}  # fmt: skip
    bindings = ours.exe.bindings_of(inputs)
    graph = specialize(model.graph, bindings)
    types = graph.types()
    out = []
    for group, seconds, spread, _ in ours.exe.time_groups(inputs):
        cost = group_cost(graph, group, types, {})
        row = {"group": group.id, "pattern": group.pattern, "kernel": group.kernel.file, "s": seconds,
               "spread": spread, "bytes": cost.bytes, "gb_s": cost.bytes / seconds / 1e9,
               "copy_fraction": cost.bytes / seconds / copy_bw, "config": group.kernel.config}  # fmt: skip
        if sweep and (group.id.startswith("layers.0.") or not group.id.startswith("layers.")):
            row["sweep"] = [
                {"config": c, "s": s, "spread": sp} for c, s, sp in ours.exe.time_configs(inputs, group.id)
            ]
        out.append(row)
    return out


def prefill_point(args, model, weights, length: int) -> list[dict]:
    cfg = model.config
    peer = PeerLlama(cfg, weights, batch=1, max_ctx=length + 16)
    ours = PolymorphRunner(model, weights, 1, length + 16)
    tokens = torch.randint(0, cfg.vocab_size, (1, length), device="cuda")
    input_pos = torch.arange(length, device="cuda")
    got = ours.step(tokens.to(torch.int32), 0)[:, -1:].float().cpu().numpy()
    want = peer(tokens, input_pos)[:, -1:].float().cpu().numpy()
    check = compare(got, want, model_tolerance(DType.BF16))
    print(f"prefill {length} agreement: {check}", flush=True)
    systems = {
        "polymorph": lambda: ours.step(tokens.to(torch.int32), 0),
        "eager": lambda: peer(tokens, input_pos),
    }
    if "reduce-overhead" in args.peers or "max-autotune" in args.peers:
        compiled = torch.compile(peer.forward, fullgraph=True)
        systems["compile:default"] = lambda: compiled(tokens, input_pos)
    rows = []
    for name, fn in systems.items():
        for _ in range(3):
            fn()
        s = timed_steps(lambda _t, f=fn: f(), lambda: None, 10)
        rows.append(
            {"system": name, "prefill": length, "s": s, "tokens_per_s": length / s, "agree": check.ok}
        )
    if args.kernels:
        inputs = {"tokens": tokens.to(torch.int32), "block_table": ours.block_table,
                  "positions": torch.arange(length, dtype=torch.int32, device="cuda")[None]}  # fmt: skip
        ktab = [{"group": g.id, "kernel": g.kernel.file, "s": sec, "spread": sp, "config": g.kernel.config}
                for g, sec, sp, _ in ours.exe.time_groups(inputs, reps=8)]  # fmt: skip
        rows.append({"system": "prefill-kernels", "prefill": length, "kernels": ktab})
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all)")
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--peers", nargs="*", default=["eager", "reduce-overhead", "max-autotune"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prefill", type=int, default=0)
    p.add_argument("--kernels", action="store_true", help="time every kernel of the decode step alone")
    p.add_argument(
        "--sweep", action="store_true", help="with --kernels: time every config of layer 0's kernels"
    )
    p.add_argument("--out", default="bench-results.json")
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    try:  # what torch does not say: SM count, L2, memory clock and bus, through cuda-python
        from polymorph.backends.cuda.backend import device_facts

        print(f"device facts: {device_facts()}", flush=True)
    except ImportError:
        print("device facts: cuda-python is not installed", flush=True)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s (read + write)", flush=True)
    model = load_model(args.model, dtype="bf16")
    if args.layers:  # the same model with fewer layers (a Mixtral scaled to fit one GPU with its f32 check)
        cfg = dataclasses.replace(model.config, num_hidden_layers=args.layers)
        model = Model(name=f"{args.model}-{args.layers}l", graph=model.rebuild(num_layers=args.layers),
                      source=args.model, config=cfg)  # fmt: skip
    weights = random_weights(model.graph, seed=0)
    results = {"copy_bandwidth": copy_bw, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "points": []}  # fmt: skip
    for batch in args.batch:
        for ctx in args.ctx:
            results["points"] += decode_point(args, model, weights, batch, ctx, copy_bw)
            Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    if args.prefill:
        results["points"] += prefill_point(args, model, weights, args.prefill)
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    return 0


def print_table(results: dict) -> None:
    print(
        f"\n{'system':<24}{'batch':>6}{'ctx':>7}{'tok/s':>11}{'ms/step':>9}{'roofline':>10}{'vs best compile':>17}"
    )
    for r in results["points"]:
        if r["system"] == "kernels":
            total = sum(k["s"] for k in r["kernels"])
            print(
                f"\nkernels at batch {r['batch']}, ctx {r['ctx']} (graph replay, cold L2; sum {total * 1e3:.3f} ms; "
                "range: (max - min) / median of the replay trials):"
            )
            for k in r["kernels"]:
                print(
                    f"  {k['group'][:52]:<54}{k['s'] * 1e6:8.1f} us {k['gb_s']:8.0f} GB/s {k['copy_fraction']:6.0%}"
                    f" range {k['spread']:.0%}"
                )
                sweep = k.get("sweep", [])
                for i, c in enumerate(sweep):
                    print(f"      #{i} {c['s'] * 1e6:8.1f} us  {c['config']}")
                if len(sweep) > 1:  # config #0 is the file's default
                    best = min(range(len(sweep)), key=lambda i: sweep[i]["s"])
                    print(f"      best #{best}: {sweep[0]['s'] / sweep[best]['s']:.2f}x the default")
            continue
        if r["system"] == "prefill-kernels":
            total = sum(k["s"] for k in r["kernels"])
            print(
                f"\nprefill {r['prefill']} kernels (graph replay; sum {total * 1e3:.2f} ms; range: (max - min) / median):"
            )
            for k in r["kernels"]:
                if not k["group"].startswith("layers.") or k["group"].startswith("layers.0."):
                    print(
                        f"  {k['group'][:52]:<54}{k['s'] * 1e6:9.1f} us range {k['spread']:.0%}  {k['kernel']}"
                    )
            continue
        if "prefill" in r:
            print(
                f"prefill {r['prefill']:<16}{r['system']:<24}{r['tokens_per_s']:>11.0f} tok/s {r['s'] * 1e3:8.2f} ms"
            )
            continue
        vs = f"{r['vs_best_compile']:.2f}x" if r.get("vs_best_compile") else "-"
        print(f"{r['system']:<24}{r['batch']:>6}{r['ctx']:>7}{r['tokens_per_s']:>11.0f}{r['step_s'] * 1e3:>9.3f}"
              f"{r['roofline_fraction']:>10.0%}{vs:>17}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
