"""Programmatic dependent launch (PDL): whether a kernel launch may overlap the tail of the kernel before
it in the stream (or in a captured CUDA graph), and the two device calls that make that safe. Not a
kernel file: kernel files take it with `depend("triton/_pdl.py", <sha256>)`.

A kernel launched with `launch_pdl=True` may start while its predecessor still runs; it must call
`gdc_wait()` (PTX `griddepcontrol.wait`: returns once every prerequisite grid has
completed and its memory is visible) before it reads anything the predecessor wrote, and before it
writes anything the predecessor may still read (a buffer the memory plan reuses). Weights may be read
before the wait: no kernel of a step writes them. `gdc_launch_dependents()` (`griddepcontrol.
launch_dependents`) lets the next kernel's programs be scheduled once every program of this one has
called it; calling it early costs nothing in correctness, since the next kernel still waits at its own
gdc_wait for this one to complete. Every kernel of the files here that launches with PDL calls the wait
unconditionally in every program, before any early exit, so that a grid completing implies its
predecessors completed.

`enabled(traits)` is true where the arch takes PDL (`traits.programmatic_dependent_launch`, from the
profile's `[compiler]` table), the installed Triton has both the device calls and the launch option
(3.6 and 3.9 do), and the kernels are compiled, not interpreted (Triton 3.9's interpreter has no
griddepcontrol). Kernels take `USE_GDC: tl.constexpr` = enabled(traits) and launch with
`launch_options(traits)`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

# Where Triton keeps the two device calls and the launch option (3.6-3.9): module paths, not a test of
# the target; whether a chip takes them is its trait.
_DEVICE_CALLS = "triton.language.extra.cuda"
_OPTIONS = ("triton.backends.nvidia.compiler", "CUDAOptions")


def _found(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:  # a Triton without that backend
        return None


# The device calls, for kernels to call as `_g.gdc_wait()` behind a USE_GDC constexpr (None where the
# installed Triton lacks them: the branch is then never compiled, since USE_GDC is off).
gdc_wait = _found(_DEVICE_CALLS, "gdc_wait")
gdc_launch_dependents = _found(_DEVICE_CALLS, "gdc_launch_dependents")


def _triton_has_pdl() -> bool:
    options = _found(*_OPTIONS)
    fields = {f.name for f in dataclasses.fields(options)} if options is not None else set()
    return gdc_wait is not None and gdc_launch_dependents is not None and "launch_pdl" in fields


AVAILABLE = _triton_has_pdl() and os.environ.get("TRITON_INTERPRET") != "1"


def enabled(traits: Any) -> bool:
    """Whether kernels for the chip `traits` describes call the GDC functions and launch with PDL."""
    return AVAILABLE and bool(getattr(traits, "programmatic_dependent_launch", False))


def launch_options(traits: Any) -> dict[str, Any]:
    """The launch option that turns PDL on, where `enabled(traits)`; else none."""
    return {"launch_pdl": True} if enabled(traits) else {}
