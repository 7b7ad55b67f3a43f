"""Is an Inductor-compiled variant of a cpu group worth a config? Each kernel of llama-tiny's decode
plan (batch 1, ctx 768) run eagerly beside the same launch under torch.compile, with the compile time.

    python bench/inductor_group.py --out inductor.json

For each group pattern the first group of that pattern is built from the plan's stock kernel and
config, fed the inputs of a real decode step (the executable's own value table), then timed: eager
launches, and `torch.compile(launch, fullgraph=False)` launches (the first call, which compiles, timed
apart). Both in inference mode on one thread, as the cpu executable runs llama-tiny.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from costmodel_cpu import decode_step


def per_call_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ctx", type=int, default=768)
    p.add_argument("--out", default="inductor.json")
    args = p.parse_args()
    exe, inputs = decode_step("llama-tiny", args.ctx)
    env: dict[str, torch.Tensor] = {}
    exe.run(inputs())
    # the value table of one step: every group's inputs as the step left them
    with torch.inference_mode():
        env = {**exe.params, **exe.state}
        from polymorph.backends.torch_bridge import to_torch

        env.update({k: to_torch(v) for k, v in inputs().items()})
        bindings = next(iter(exe._bindings.values()))
        for group, launch in exe.launches:
            outs = [exe._output(v, bindings) for v in group.outputs]
            launch([env[v] for v in group.inputs], outs, None)
            env.update(zip(group.outputs, outs, strict=True))
    rows = []
    seen = set()
    for group, launch in exe.launches:
        if group.pattern in seen or group.pattern in ("kv_write",):  # kv_write writes the cache in place
            continue
        seen.add(group.pattern)
        ins = [env[v] for v in group.inputs]
        outs = [torch.empty_like(env[v]) for v in group.outputs]
        with torch.inference_mode():
            eager = per_call_us(lambda f=launch, a=ins, o=outs: f(a, o, None))
            compiled = torch.compile(launch)
            t0 = time.perf_counter()
            compiled(ins, outs, None)
            compile_s = time.perf_counter() - t0
            inductor = per_call_us(lambda f=compiled, a=ins, o=outs: f(a, o, None))
        rows.append({"group": group.id, "pattern": group.pattern, "kernel": group.kernel.file,
                     "eager_us": eager, "inductor_us": inductor, "compile_s": compile_s})  # fmt: skip
        print(
            f"{group.id:36s} eager {eager:7.1f} us  inductor {inductor:7.1f} us  compile {compile_s:5.1f} s"
        )
    Path(args.out).write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                                          "ctx": args.ctx, "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
