"""Per-target configs, chosen in one place from the target's traits (polymorph/hardware/traits.py).
Not a kernel file: kernel files take it with `depend("triton/_targets.py", <sha256>)`.

A kernel file writes its config space once, as lists keyed by the warp width their warp counts were
written for (`{32: [...], 64: [...]}`; the 32-wide list measured on an H200 where a comment says so),
and `configs_for(spaces, traits, shared=...)` maps it onto one chip:
- the list written for the chip's warp width, else the nearest one with every `*warps` key rescaled
  so that lanes stay constant (a wave64 takes half the warps of a 32-wide list, a wave32 twice those
  of a 64-wide one), since a kernel's lanes, not its warps, set how wide each access is;
- every `*stages` key at most `traits.pipeline_stages` (the software-pipelining depth that suits the
  arch's async copies);
- the launch options the arch takes (`traits.launch_options`) filled with their neutral default where
  a config lacks them, and dropped where the arch has none;
- configs whose shared memory / LDS estimate (`shared(config)`, bytes) exceeds what one block may take
  (`traits.shared_per_block`) left out, so a chip with a larger LDS keeps tiles another cannot hold;
  when none fits, the smallest stays, so a file always has a config.
Launches take `extra_options(config, traits)` for the arch's extra options. None of this names an arch
or a vendor: a new chip is one profile file. Not measured on AMD: no AMD machine here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Each launch option a profile may list, with the value that leaves the choice to the compiler.
LAUNCH_DEFAULTS: dict[str, Any] = {"waves_per_eu": 0}


def configs_for(
    spaces: Mapping[int, Sequence[dict[str, Any]]],
    traits: Any,
    shared: Callable[[dict[str, Any]], int] | None = None,
) -> list[dict[str, Any]]:
    """A file's `configs(traits)`: `spaces` (configs by the warp width they were written for) mapped
    onto the chip `traits` describes; None traits (no GPU) take the narrowest list as written."""
    if traits is None:
        return [dict(c) for c in spaces[min(spaces)]]
    width = min(spaces, key=lambda w: (abs(w - traits.warp_size), w))
    out = [_onto(dict(c), width, traits) for c in spaces[width]]
    if shared is None:
        return out
    fits = [c for c in out if shared(c) <= traits.shared_per_block]
    return fits or [min(out, key=shared)]


def _onto(config: dict[str, Any], width: int, traits: Any) -> dict[str, Any]:
    for key, value in list(config.items()):
        if key.endswith("warps"):
            config[key] = max(1, value * width // traits.warp_size)
        elif key.endswith("stages"):
            config[key] = max(1, min(value, traits.pipeline_stages))
    for option, default in LAUNCH_DEFAULTS.items():
        if option in traits.launch_options:
            config.setdefault(option, default)
        else:
            config.pop(option, None)
    return config


def extra_options(config: Mapping[str, Any], traits: Any) -> dict[str, Any]:
    """The launch options beyond num_warps and num_stages that the arch takes, from the config (a
    config that lacks one leaves it to the compiler)."""
    if traits is None:
        return {}
    return {k: config[k] for k in sorted(traits.launch_options) if k in config}


def takes(option: str, traits: Any) -> bool:
    """Whether the arch takes a launch option (an occupancy hint such as waves_per_eu)."""
    return traits is not None and option in traits.launch_options


def gemm_shared(block_m: int, block_n: int, block_k: int, stages: int, elem: int = 2) -> int:
    """Shared memory / LDS a tl.dot K loop stages at most: the A and B tiles of every stage, in
    `elem`-byte elements (2: the bf16/f16 the models run in; an f32 GEMM takes twice this). An upper
    bound: a pipeliner that keeps one stage in registers takes less."""
    return (block_m + block_n) * block_k * elem * max(stages, 1)


# --- the small memory-bound files (elementwise, embedding, kv_write, rmsnorm, rope, silu_mul) --------


def configs_by_target(warp32: list[dict[str, Any]]) -> Callable[[Any], list[dict[str, Any]]]:
    """A memory-bound file's `configs(traits)`: its one list, written for 32-wide warps, mapped onto the
    chip (lanes constant: half the warps on a wave64; waves_per_eu 0 leaves occupancy to the
    compiler). Not measured on a wave64 device."""
    return lambda traits: configs_for({32: warp32}, traits)


def launch_options(config: Mapping[str, Any], traits: Any) -> dict[str, Any]:
    """Launch options of a memory-bound file: warps and the arch's extras (compile units add
    num_stages 1)."""
    return {"num_warps": config["num_warps"], **extra_options(config, traits)}
