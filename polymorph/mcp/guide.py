"""The texts `polymorph mcp` serves as resources and prompts: the kernel-file contract, a guide for
agents (the roofline gap, the gates and what they reject), and the prompt that starts an agent on
the group with the largest gap. The gate table is the engine's own docstring, so it cannot drift."""

from __future__ import annotations

from typing import Any

from polymorph.search.external import CONTRACT


def kernel_contract() -> str:
    return f"""# polymorph's kernel-file contract

{CONTRACT}

- The file is plain Python, loaded by path as a fresh module on every load (the hot-reload primitive).
  `IMPLEMENTS` must equal the group's `pattern` (get_group gives it); `CONFIGS` is a list of JSON
  objects (the tunable space); a posted `config` must be one of them or {{}} for the first.
- `supports(spec)` answers from shapes, dtypes and the target alone; `build(spec, config, target)`
  runs once per load and may precompute (a transposed weight, a compiled function); `launch` runs on
  every call and must write every element of every output in place (outputs are poisoned with NaN
  before each call, and prefilled with different values to catch elements left unwritten).
- `spec.inputs` and `spec.outputs` are value names in the order `launch` receives the tensors;
  `spec.types[name].shape` holds ints and, for dynamic dims, symbols bound at load (batch, seq, ctx).
  `spec.node(op)` is the group's first node of op `op`, `spec.args(node)` where its inputs sit in
  `inputs`, `spec.attrs(node)` its attributes with defaults. get_group returns the spec as JSON.
- On the cpu backend kernels are torch code (kernels/torch/); on cuda and rocm Triton
  (kernels/triton/); on neuron JAX (kernels/xla/). Read the stock source (read_source) first: it is a
  working file for exactly this group.
- A file may use a shared module of the library only through `depend(name, sha256)`, pinned by
  content hash (the stock source shows the line); otherwise keep everything in the one file.
- The candidate runs in a sandbox with no network, no files outside its scratch folder, no
  processes left behind: a file that tries fails the `sandbox` gate.
"""


def agent_guide() -> str:
    from polymorph.engine import gates

    table = (gates.__doc__ or "").split("with its cause:", 1)[-1].split("The timing gates run only", 1)[0]
    return f"""# Tuning a polymorph node group: a guide for agents

## The loop
1. `list_tunes`: the running tunes and, per node group, its share of the decode step, the measured
   stock time (`measured_s`), the roofline floor the cost model gives (`floor_s`), the gap
   (`roofline_gap` = measured / floor) and the best time any candidate has reached (`best_s`).
2. Pick a group with a large share x gap: a group at 2% of the step cannot win much even at 10x.
3. `get_group` (spec, configs, alternatives), `read_source` (stock, best so far, registry champion),
   `group_history` (what was tried and why it failed: do not post the same idea twice), and
   `target_profile` (the chip's figures and microbenchmark curves: bandwidth by call size).
4. `post_candidate` with the complete file, a config, and your reasoning; then `wait_result`.
   `passed` comes with the median time (the controller's clock, fast tier) and the gate table;
   `rejected` names the gate; `failed` means it could not be built, loaded or run.
5. A candidate must beat the stock median by 2% to go into the tuned plan, and the tuned plan must
   beat the untuned one end to end (a paired A/B at the tune's end).

## Reading the roofline gap
The floor is max(bytes moved / memory bandwidth, FLOPs / peak rate) for the group's shapes, from the
chip profile (measured calibration where there is one). A gap near 1 means the group already runs
near what the memory or the arithmetic allows: look elsewhere. A gap of 5-50 at decode usually means
launch or dispatch overhead (many small ops, a copy per call, an upcast of the weight every call):
fuse, precompute in `build`, cache a transposed or packed weight. `bound` says which limit the floor
is (memory or compute). Where the profile has no figures (an uncalibrated cpu), the floor is unknown
and the gap is null: rank by share and measured time instead.

## What the gates reject, and why
Every candidate is treated as hostile. It runs in a sandboxed worker that is killed after its
verdict; it never sees the reference outputs or the inputs the gates draw, and it cannot tell a
timed call from a checked one. The gates, in order:
{table.rstrip()}

So: compute the real answer on every call, write every output element, leave inputs alone, keep no
state that depends on earlier inputs (caching a transform of a weight is fine: weights do not change
unless re-read through their version), no threads or processes left running, no files, no sockets.
A faster wrong kernel is rejected; a kernel that detects timing is rejected by timing.checked.
"""


def largest_gap_prompt(tunes: list[dict[str, Any]]) -> str:
    """The prompt that starts an agent on the group of the running tunes with the largest gap
    (measured / floor, times its share), or with the largest share times measured time where no
    floor is known."""
    best: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for t in tunes:
        if not t["running"]:
            continue
        for g in t["groups"]:
            score = (
                g["share"] * (g["roofline_gap"] or 0.0)
                or g["share"] * (g["measured_s"] or 0.0) * 1e-3
                or g["share"] * 1e-9
            )
            if best is None or score > best[0]:
                best = (score, t, g)
    if best is None:
        return ("No polymorph tune is running on this board. Start one with `polymorph tune MODEL "
                "--wait-for-posts --board FILE` and call list_tunes again.")  # fmt: skip
    _, t, g = best
    gap = f"roofline gap {g['roofline_gap']}x" if g["roofline_gap"] else "no roofline floor known"
    measured = f"{g['measured_s'] * 1e6:.1f} us" if g["measured_s"] else "not measured yet"
    return f"""You are tuning a kernel for polymorph, a framework that tunes ML inference on any chip.
Tune `{t["tune"]}` ({t["model"]} on backend {t["backend"]}, chip {t["target"]}, bucket {t["bucket"]}) is running.
Work on node group `{g["group"]}` (pattern {g["pattern"]}, op signature {g["signature"]}, {g["same_signature_groups"]}
groups share it): {g["share"]:.1%} of the decode step, stock time {measured}, {gap}.

Steps: read the resources polymorph://guide and polymorph://kernel-contract; call get_group and
read_source (which="stock", then "best") for this group, group_history to see what failed before,
target_profile for the chip's figures. Write a complete kernel file that computes exactly what the
stock kernel does, faster. post_candidate it with tune="{t["tune"]}", group="{g["group"]}", a config
and your reasoning; wait_result on the id; read the gate table, fix and post again. Keep every
candidate honest: the gates reject wrong, partial, stateful or timing-aware kernels."""
