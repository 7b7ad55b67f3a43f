"""Per-target launch settings that the small memory-bound kernel files share (elementwise, embedding,
kv_write, rmsnorm, rope, silu_mul). Not a kernel file: kernel files take it with
`depend("triton/_targets.py", <sha256>)`.

CDNA configs are derived from a file's CUDA list: half the warps, since a wave64 has twice a warp's
lanes and each lane's accesses then stay as wide; waves_per_eu 0 leaves occupancy to the compiler.
Not measured on a device. CUDA launches take num_warps alone, as before these settings existed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def rocm_configs(cuda: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**c, "num_warps": max(1, c["num_warps"] // 2), "waves_per_eu": 0} for c in cuda]


def configs_by_target(cuda: list[dict[str, Any]]) -> Callable[[Any], list[dict[str, Any]]]:
    """A kernel file's `configs(target)`: the CUDA list, or the CDNA one derived from it on rocm."""
    rocm = rocm_configs(cuda)
    return lambda target: rocm if target.family == "rocm" else cuda


def launch_options(config: dict[str, Any], target: Any) -> dict[str, Any]:
    """Launch options: warps, and waves_per_eu on rocm (compile units add num_stages 1)."""
    opts = {"num_warps": config["num_warps"]}
    if target.family == "rocm":
        opts["waves_per_eu"] = config.get("waves_per_eu", 0)
    return opts
