"""Kernel variants of the Llama-3.2-1B decode step, each built, checked and timed in one process on one
NVIDIA GPU (issue #20), against torch.compile of the peer on the same weights and cache content:

    python bench/h200_variants.py --out $OUT/variants.json --deadline 500
    python bench/h200_variants.py --points 1x1024 32x8192 --variants default prefetch attn-c4

A variant is a set of config keys per kernel file (bench/decode.py `with_overrides`) laid over the
plan's own choice, so every variant is a point of the files' config spaces (the keys each file's
docstring lists: `gemv_prefetch` of the projection files, `one_kernel`, `ctas_per_cu`, `one_block_n`,
num_warps, num_stages of decode_attention). At each (batch, context) point the variants share one KV
cache and block table; each is checked teacher-forced (the same tokens at the same position over the
same cache) against the bf16 peer and a float32 run of it, then every system's CUDA graph is timed in
alternated rounds (one CUDA-event pair per step, the median over all rounds), with the copy bandwidth
measured in this run at its start and end. A point's roofline is (weight bytes + KV bytes read) over
the copy bandwidth; "of copy BW" is that floor over the step time. Points and variants run in the
order given until the deadline; what did not fit is listed as unrun. Results go to --out as they come.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import PolymorphRunner, copy_bandwidth, random_weights, step_weight_bytes, with_overrides
from peer_llama import PeerLlama

from polymorph.ir.dtypes import DType
from polymorph.models import load_model
from polymorph.verify.tolerance import compare, model_tolerance

ATTN = "triton/decode_attention.py"
PROJECTIONS = ("triton/rmsnorm_qkv_rope.py", "triton/linear_residual.py", "triton/rmsnorm_swiglu.py",
               "triton/rmsnorm_linear.py")  # fmt: skip
PF = {"gemv_prefetch": True}
GEMV_MAX_M = 2  # kernels/triton/_projection.py: the GEMV (and gemv_* keys) only at M <= 2

# name -> (the largest batch it changes anything at, or 0 for every batch; overrides). In the order of
# the expected gain; `default` first, since every point compares against it.
VARIANTS: dict[str, tuple[int, dict[str, dict]]] = {
    "default": (0, {}),
    # first K chunk of the weights loaded before the PDL wait (small projections: all programs resident)
    "pf-qkv-o": (GEMV_MAX_M, {"triton/rmsnorm_qkv_rope.py": PF, "triton/linear_residual.py@attn.o": PF}),
    "pf-all": (GEMV_MAX_M, {f: PF for f in PROJECTIONS}),
    "pf-qkv2048-o": (
        GEMV_MAX_M,
        {"triton/rmsnorm_qkv_rope.py": {**PF, "gemv_block_k": 2048}, "triton/linear_residual.py@attn.o": PF},
    ),
    "pf-small-down": (GEMV_MAX_M, {"triton/rmsnorm_qkv_rope.py": PF, "triton/linear_residual.py": PF}),
    # the down projection with 4 rows x 1024 of K a program (11.8 against 12.2 us alone on an H200,
    # 2026-11-30), alone and with the prefetch of the small projections
    "down-4x1024": (
        GEMV_MAX_M,
        {"triton/linear_residual.py@mlp.down": {"gemv_block_n": 4, "gemv_block_k": 1024}},
    ),
    "pf-qkv-o+down-4x1024": (
        GEMV_MAX_M,
        {
            "triton/rmsnorm_qkv_rope.py": PF,
            "triton/linear_residual.py@attn.o": PF,
            "triton/linear_residual.py@mlp.down": {"gemv_block_n": 4, "gemv_block_k": 1024},
        },
    ),
    # decode attention: the general split kernel (runtime loop, 128-token tiles; the 2026-11-30 default)
    "attn-split": (0, {ATTN: {"one_kernel": False}}),
    "attn-c4": (0, {ATTN: {"ctas_per_cu": 4}}),
    # The default before 2026-12-02 (ctas_per_cu 2, 256-token one-token tiles), and its tile alone.
    "attn-c2-t256": (0, {ATTN: {"ctas_per_cu": 2, "one_block_n": 256}}),
    "attn-t256": (0, {ATTN: {"one_block_n": 256}}),
    "attn-c4-t128-s3": (0, {ATTN: {"ctas_per_cu": 4, "one_block_n": 128, "num_stages": 3}}),
    "attn-split-c4-s3": (0, {ATTN: {"one_kernel": False, "ctas_per_cu": 4, "num_stages": 3}}),
}
POINTS = ["1x1024", "32x8192", "8x1024", "64x1024", "1x8192"]  # the bar's point and the slower one first


def applies(name: str, batch: int) -> bool:
    most, _ = VARIANTS[name]
    return most == 0 or batch <= most


def effective(plan, batch: int, kv_heads: int, block: int) -> str:
    """What a variant's plan runs, for telling apart variants that differ only in keys without effect
    at a shape: decode attention by its kernel, splits, tile, warps and stages; the rest by config."""
    from polymorph.pipeline.kernel_files import load_choice

    traits = plan.kernel_target()
    parts = []
    for g in plan.groups:
        if g.kernel.file != ATTN:
            parts.append((g.id, json.dumps(g.kernel.config, sort_keys=True)))
            continue
        module = load_choice(g.kernel.file, g.kernel.sha256).module
        c = g.kernel.config
        occ = module.occupancy(batch, kv_heads, plan.bindings["ctx_blocks"] * block, c, traits)
        parts.append((g.id, repr((c.get("one_kernel", True), occ["splits"], occ["split_tokens"], occ["block_n"],
                                  c["num_warps"], c["num_stages"]))))  # fmt: skip
    return repr(parts)


def draw_checks(peer, truth, batch: int, pos: int, vocab: int, n: int = 2) -> list[dict]:
    """Token draws with the peer's and the float32 run's logits for them (teacher-forced)."""
    input_pos = torch.tensor([pos], device="cuda")
    out = []
    for _ in range(n):
        t = torch.randint(0, vocab, (batch, 1), device="cuda", dtype=torch.int64)
        out.append({"tokens": t, "peer": peer(t, input_pos).float(), "f32": truth(t, input_pos).float()})
    return out


def check(runner: PolymorphRunner, draws: list[dict], pos: int, tol) -> dict:
    """The variant's logits against the peer and the float32 run: max abs errors, elements out of the
    bf16 model tolerance, and whether it is at least as close to float32 as the bf16 peer is (10%
    slack on the max error: variants reorder bf16 sums), with no NaN."""
    worst = {"vs_peer_max_abs": 0.0, "vs_f32_max_abs": 0.0, "peer_vs_f32_max_abs": 0.0, "vs_f32_mismatched": 0,
             "peer_vs_f32_mismatched": 0, "finite": True}  # fmt: skip
    for d in draws:
        got = runner.step(d["tokens"].to(torch.int32), pos).float()
        worst["finite"] &= bool(torch.isfinite(got).all())
        g, p, f = (x.cpu().numpy() for x in (got, d["peer"], d["f32"]))
        vp, vf, pf = compare(g, p, tol), compare(g, f, tol), compare(p, f, tol)
        worst["vs_peer_max_abs"] = max(worst["vs_peer_max_abs"], vp.max_abs)
        worst["vs_f32_max_abs"] = max(worst["vs_f32_max_abs"], vf.max_abs)
        worst["peer_vs_f32_max_abs"] = max(worst["peer_vs_f32_max_abs"], pf.max_abs)
        worst["vs_f32_mismatched"] = max(worst["vs_f32_mismatched"], vf.mismatched)
        worst["peer_vs_f32_mismatched"] = max(worst["peer_vs_f32_mismatched"], pf.mismatched)
    worst["ok"] = worst["finite"] and worst["vs_f32_max_abs"] <= 1.1 * worst["peer_vs_f32_max_abs"]
    return worst


def alternated(systems: dict, make_tokens, rounds: int, steps: int) -> dict[str, list[float]]:
    """Each system's step times over `rounds` rounds of `steps` steps, the order rotated every round."""
    names = list(systems)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = systems[name]
            for _ in range(steps):
                tokens = make_tokens()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(tokens)
                b.record()
                b.synchronize()
                times[name].append(a.elapsed_time(b) * 1e-3)
    return times


def run_point(args, model, weights, batch: int, ctx: int, copy_bw: float, deadline: float, log) -> dict:
    cfg = model.config
    pos = ctx - 1
    block = int(model.graph.meta["block_size"])
    weight_bytes = step_weight_bytes(model, batch)
    kv_bytes = 2 * cfg.num_hidden_layers * batch * ctx * cfg.num_key_value_heads * cfg.head_dim * 2
    floor_s = (weight_bytes + kv_bytes) / copy_bw
    point = {"batch": batch, "ctx": ctx, "roofline_s": floor_s, "variants": {}, "peers": {}, "unrun": []}
    peer = PeerLlama(cfg, weights, batch=batch, max_ctx=ctx + 16)
    gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + ctx)
    for kc, vc in zip(peer.k_cache, peer.v_cache, strict=True):
        kc.normal_(generator=gen)
        vc.normal_(generator=gen)
    truth = PeerLlama(cfg, {k: v.float() for k, v in weights.items()}, batch=batch, max_ctx=ctx + 16)
    for dst, src in zip(truth.k_cache + truth.v_cache, peer.k_cache + peer.v_cache, strict=True):
        dst.copy_(src)
    draws = draw_checks(peer, truth, batch, pos, cfg.vocab_size)
    del truth
    torch.cuda.empty_cache()
    tol = model_tolerance(DType.BF16)
    input_pos = torch.tensor([pos], device="cuda")

    def tokens() -> torch.Tensor:
        return torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda", dtype=torch.int64)

    systems = {}
    for mode in args.peers:
        if mode == "max-autotune" and (batch, ctx) not in args.autotune_at:
            continue
        if time.monotonic() > deadline - args.compile_margin:
            point["unrun"].append(f"compile:{mode}")
            continue
        t0 = time.monotonic()
        compiled = torch.compile(peer.forward, mode=mode, fullgraph=True)
        for _ in range(3):
            compiled(tokens(), input_pos)
        torch.cuda.synchronize()
        point["peers"][f"compile:{mode}"] = {"compile_s": time.monotonic() - t0}
        systems[f"compile:{mode}"] = lambda t, f=compiled: f(t, input_pos)
        log(f"  torch.compile {mode}: {time.monotonic() - t0:.0f} s")
    base = None
    seen: dict[str, str] = {}  # what a variant's plan runs -> the first variant that runs it
    for name in args.variants:
        if not applies(name, batch):
            continue
        if base is not None:
            what = effective(
                with_overrides(base.lowered, VARIANTS[name][1]), batch, cfg.num_key_value_heads, block
            )
            if what in seen:
                point["variants"][name] = {"overrides": VARIANTS[name][1], "same_as": seen[what]}
                continue
        if time.monotonic() > deadline - args.variant_margin:
            point["unrun"].append(name)
            continue
        t0 = time.monotonic()
        overrides = VARIANTS[name][1]
        try:
            runner = PolymorphRunner(model, weights, batch, ctx, overrides=overrides, share=base)
            if base is None:
                runner.load_cache(peer.k_cache, peer.v_cache, pos)
            checked = check(runner, draws, pos, tol)
        except Exception as exc:  # a variant that fails to build or run is reported, not fatal
            point["variants"][name] = {"overrides": overrides, "error": f"{type(exc).__name__}: {exc}"[:500]}
            log(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if base is None:
            base = runner
        seen.setdefault(effective(runner.plan, batch, cfg.num_key_value_heads, block), name)
        row = {"overrides": overrides, "check": checked, "build_s": time.monotonic() - t0,
               "configs": sorted({json.dumps(g.kernel.config, sort_keys=True) for g in runner.plan.groups
                                  if g.kernel.file == ATTN})}  # fmt: skip
        point["variants"][name] = row
        log(f"  {name}: built and checked in {row['build_s']:.0f} s, ok {checked['ok']} (vs f32 "
            f"{checked['vs_f32_max_abs']:.3f}, peer vs f32 {checked['peer_vs_f32_max_abs']:.3f})")  # fmt: skip
        if checked["ok"] or args.time_failed:
            systems[name] = lambda t, r=runner: r.step(t.to(torch.int32), pos)
    for fn in systems.values():  # warm-up: graphs captured, clocks up
        for _ in range(5):
            fn(tokens())
    torch.cuda.synchronize()
    times = alternated(systems, tokens, args.rounds, max(1, args.steps // args.rounds))
    best = min((statistics.median(v) for k, v in times.items() if k.startswith("compile:")), default=None)
    for name, ts in times.items():
        s = statistics.median(ts)
        row = {"step_s": s, "tokens_per_s": batch / s, "of_copy_bw": floor_s / s,
               "vs_best_compile": best / s if best else None,
               "spread": (max(ts) - min(ts)) / s, "p10_s": sorted(ts)[len(ts) // 10]}  # fmt: skip
        (point["peers"] if name.startswith("compile:") else point["variants"])[name].update(row)
    if args.kernels_at and (batch, ctx) in args.kernels_at and base is not None:
        point["kernels"] = kernel_rows(base, batch, pos, deadline)
    return point


def kernel_rows(runner: PolymorphRunner, batch: int, pos: int, deadline: float) -> list[dict]:
    """Layer 0's groups and those outside the layers, each timed alone (graph replay, cold L2)."""
    if time.monotonic() > deadline - 60:
        return []
    inputs = {"tokens": torch.randint(0, 1000, (batch, 1), device="cuda", dtype=torch.int32),
              "positions": torch.full((batch, 1), pos, dtype=torch.int32, device="cuda"),
              "block_table": runner.block_table}  # fmt: skip
    out = []
    for group, seconds, spread, _ in runner.exe.time_groups(inputs, reps=24, trials=5):
        if group.id.startswith("layers.") and not group.id.startswith("layers.0."):
            continue
        out.append({"group": group.id, "kernel": group.kernel.file, "s": seconds, "spread": spread})
    return out


def dry_run(args) -> list[str]:
    """What each variant changes at each point, from the plans alone (no device): the groups whose
    config differs from the plan's own, and decode attention's splits."""
    from polymorph.hardware.profile import load_profile
    from polymorph.hardware.target import Target
    from polymorph.hardware.traits import traits_for
    from polymorph.pipeline.backend import registry
    from polymorph.pipeline.kernel_files import load_choice

    model = load_model(args.model, dtype="bf16")
    block = int(model.graph.meta["block_size"])
    traits = traits_for(Target.parse("cuda:sm_90"))
    lines = []
    for batch, ctx in args.points:
        ctx_blocks = -(-(ctx + 16) // block)
        bindings = {
            "batch": batch,
            "seq": 1,
            "ctx_blocks": ctx_blocks,
            "cache_blocks": batch * ctx_blocks + 1,
        }
        plan = registry.get("cuda").lower(model.graph, load_profile("h200"), bindings)
        seen: dict[str, str] = {}
        for name in args.variants:
            if not applies(name, batch):
                continue
            varied = with_overrides(plan, VARIANTS[name][1])
            what = effective(varied, batch, model.config.num_key_value_heads, block)
            if what in seen:
                lines.append(f"{batch}x{ctx} {name}: runs what {seen[what]} runs (not built)")
                continue
            seen[what] = name
            changed = sorted({g.id.split(".", 2)[-1] for g, h in zip(plan.groups, varied.groups, strict=True)
                              if g.kernel.config != h.kernel.config})  # fmt: skip
            attn = next(g for g in varied.groups if g.kernel.file == ATTN)
            module = load_choice(attn.kernel.file, attn.kernel.sha256).module
            occ = module.occupancy(batch, model.config.num_key_value_heads, ctx_blocks * block, attn.kernel.config,
                                   traits)  # fmt: skip
            lines.append(f"{batch}x{ctx} {name}: changes {changed or 'nothing'}; attention {occ['splits']} splits"
                         f" of {occ['split_tokens']} tokens, {occ['ctas']} programs")  # fmt: skip
    return lines


def parse_point(text: str) -> tuple[int, int]:
    try:
        b, c = text.lower().split("x")
        return int(b), int(c)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a point is BATCHxCONTEXT, e.g. 1x1024; got {text!r}") from None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--points", type=parse_point, nargs="+", default=[parse_point(x) for x in POINTS])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument(
        "--peers", nargs="*", default=["reduce-overhead"], help="torch.compile modes (max-autotune: minutes)"
    )
    p.add_argument("--autotune-at", type=parse_point, nargs="*", default=[(1, 1024)],
                   help="points where max-autotune is compiled too (it takes minutes)")  # fmt: skip
    p.add_argument("--kernels-at", type=parse_point, nargs="*", default=[(1, 1024)])
    p.add_argument("--steps", type=int, default=100, help="timed steps per system and point")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--deadline", type=float, default=500, help="seconds from start for the whole run")
    p.add_argument("--variant-margin", type=float, default=40, help="seconds a variant needs, at least")
    p.add_argument("--compile-margin", type=float, default=90, help="seconds a torch.compile needs")
    p.add_argument("--time-failed", action="store_true", help="also time variants that fail the check")
    p.add_argument("--dry-run", action="store_true", help="no GPU: each variant's changed configs per point")
    p.add_argument("--out", default="variants.json")
    args = p.parse_args()
    if "default" in args.variants:
        args.variants.remove("default")
    args.variants.insert(0, "default")  # the first variant's runner holds the point's cache
    deadline = time.monotonic() + args.deadline
    if args.dry_run:
        for line in dry_run(args):
            print(line)
        return 0
    if not torch.cuda.is_available():
        print("h200_variants: no CUDA device visible", file=sys.stderr)
        return 2
    torch.manual_seed(0)

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    copy_bw = copy_bandwidth()
    log(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s (read + write)")
    model = load_model(args.model, dtype="bf16")
    weights = random_weights(model.graph, seed=0)
    import triton

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "copy_bandwidth": copy_bw, "variants": {k: v[1] for k, v in VARIANTS.items()}, "points": [],
               "unrun_points": []}  # fmt: skip
    out = Path(args.out)
    for batch, ctx in args.points:
        if time.monotonic() > deadline - 60:
            results["unrun_points"].append(f"{batch}x{ctx}")
            continue
        log(f"point batch {batch}, ctx {ctx}")
        try:
            results["points"].append(run_point(args, model, weights, batch, ctx, copy_bw, deadline, log))
        except torch.cuda.OutOfMemoryError as exc:
            results["points"].append({"batch": batch, "ctx": ctx, "error": str(exc)[:300]})
        torch.cuda.empty_cache()
        out.write_text(json.dumps(results, indent=1, default=str))
    results["copy_bandwidth_end"] = copy_bandwidth()
    out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    return 0


def print_table(results: dict) -> None:
    bw = results["copy_bandwidth"]
    print(
        f"\ncopy bandwidth {bw / 1e12:.3f} TB/s at the start, {results['copy_bandwidth_end'] / 1e12:.3f} at the end"
    )
    print(f"{'point':<9}{'system':<20}{'tok/s':>10}{'ms/step':>9}{'of copy BW':>12}{'vs compile':>12}  check")
    for pt in results["points"]:
        where = f"{pt['batch']}x{pt['ctx']}"
        if "error" in pt:
            print(f"{where:<9}error: {pt['error'][:100]}")
            continue
        rows = [(k, v) for k, v in pt["peers"].items()] + list(pt["variants"].items())
        for name, r in rows:
            if "step_s" not in r:
                why = r.get("error", "not timed (check failed)" if "check" in r else "not timed")
                if "same_as" in r:
                    why = f"runs what {r['same_as']} runs at this point"
                print(f"{where:<9}{name:<20}{why[:80]}")
                continue
            vs = f"{r['vs_best_compile']:.2f}x" if r.get("vs_best_compile") else "-"
            ok = "" if name.startswith("compile:") else ("ok" if r["check"]["ok"] else "FAILED")
            print(f"{where:<9}{name:<20}{r['tokens_per_s']:>10.0f}{r['step_s'] * 1e3:>9.3f}"
                  f"{r['of_copy_bw']:>12.0%}{vs:>12}  {ok}")  # fmt: skip
        if pt["unrun"]:
            print(f"{where:<9}unrun: {', '.join(pt['unrun'])}")
        for k in pt.get("kernels", []):
            print(f"{where:<9}  {k['group'][:48]:<50}{k['s'] * 1e6:8.1f} us")
    if results["unrun_points"]:
        print(f"unrun points: {', '.join(results['unrun_points'])}")


if __name__ == "__main__":
    sys.exit(main())
