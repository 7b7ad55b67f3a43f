"""The cpu stock plan now against the stock kernels of an earlier revision: whole llama-tiny decode
steps, the two arms interleaved in one executable, so a change to the library cannot have slowed the
default configs unseen.

    python bench/cpu_stock_ab.py --base 0b219d8 --out stock-ab.json

The base revision's kernel files (`git show REV:kernels/torch/<file>`) are loaded by path and built
at the plan's stock configs (a file's shared modules ride along as `<sha256>.py` copies beside it);
each pair of rounds times `--steps` whole steps of each arm back to back, the order alternating, and
the tuned-style ratio (now / base) with its 95% bootstrap interval comes from polymorph.search.ab.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from costmodel_cpu import decode_step

from polymorph.hardware.target import Target
from polymorph.pipeline.kernel_files import kernels_root, load_kernel, source_hash
from polymorph.pipeline.lowering import kernel_spec
from polymorph.search.ab import paired_ratio


def base_file(rev: str, name: str, folder: Path) -> Path:
    """kernels/<name> as it was at `rev`, with every shared module of that revision beside it."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{rev}:kernels/{name}"], cwd=root, check=True,
                          capture_output=True).stdout  # fmt: skip
    language = name.split("/", 1)[0]
    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:kernels/{language}"], cwd=root,
                             check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    for shared in (n for n in listing if n.startswith("_") and n.endswith(".py") and n != "__init__.py"):
        body = subprocess.run(["git", "show", f"{rev}:kernels/{language}/{shared}"], cwd=root, check=True,
                              capture_output=True).stdout  # fmt: skip
        (folder / f"{source_hash(body)}.py").write_bytes(body)
    path = folder / name.replace("/", "__")
    path.write_bytes(text)
    return path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="the revision whose stock kernels are the other arm")
    p.add_argument("--ctx", type=int, default=768)
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="stock-ab.json")
    args = p.parse_args()
    exe, inputs = decode_step("llama-tiny", args.ctx)
    plan = exe.plan
    types, target = plan.graph.types(), Target.parse(plan.target)
    now = list(exe.launches)
    base, files = [], {}
    with tempfile.TemporaryDirectory(prefix="polymorph-base-") as tmp:
        for group, _ in now:
            name = group.kernel.file
            if name not in files:
                files[name] = load_kernel(base_file(args.base, name, Path(tmp)))
            spec = kernel_spec(plan.graph, group, types, target)
            base.append((group, files[name].build(spec, group.kernel.config, target)))
    changed = sorted(
        n for n, k in files.items() if k.sha256 != source_hash((kernels_root() / n).read_bytes())
    )

    def steps(launches) -> float:
        exe.launches = launches
        t0 = time.perf_counter()
        for _ in range(args.steps):
            exe.run(inputs())
        return (time.perf_counter() - t0) / args.steps

    for launches in (now, base, now, base):  # warm both
        steps(launches)
    now_s, base_s = [], []
    for i in range(args.pairs):
        for arm in ("now", "base") if i % 2 == 0 else ("base", "now"):
            (now_s if arm == "now" else base_s).append(steps(now if arm == "now" else base))
    r = paired_ratio(base_s, now_s)
    result = {"base": args.base, "ctx": args.ctx, "pairs": args.pairs, "steps": args.steps,
              "changed_files": changed, "base_s": base_s, "now_s": now_s, **r.to_json()}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"llama-tiny decode, b1 ctx {args.ctx}, stock configs; kernel files changed since {args.base}: "
          f"{', '.join(changed) or 'none'}")  # fmt: skip
    print(f"  base {statistics.median(base_s) * 1e6:.0f} us, now {statistics.median(now_s) * 1e6:.0f} us a step: "
          f"now/base {r.ratio:.3f}x (95% interval {r.low:.3f}-{r.high:.3f}, {r.pairs} pairs): {r.verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
