"""AMD Instinct GPUs (gfx942 MI300X, gfx950 MI355X) through the shared Triton kernel library.

Compiling needs Triton only (AMDGCN and HSACO for the target, with VGPR/SGPR/LDS/scratch and
occupancy read from the compiled code). Running needs an AMD GPU with PyTorch built for ROCm: torch
exposes HIP devices under the "cuda" device type and records HIP graphs through torch.cuda.CUDAGraph,
so backends/gpu/runtime.py runs unchanged there (HIP's hipStreamBeginCapture/hipGraphLaunch under
the hood). That path is written against the ROCm documentation and has not run here: no AMD machine
is reachable (README status table); its tests carry the `rocm` marker.
"""

from __future__ import annotations

from typing import ClassVar

from polymorph.backends import device_probe
from polymorph.backends.gpu.backend import DeviceFacts, TritonBackend, triton_probe
from polymorph.pipeline.backend import Probe


class RocmBackend(TritonBackend):
    name: ClassVar[str] = "rocm"
    targets: ClassVar[tuple[str, ...]] = ("mi355x", "mi300x")

    def probe(self) -> Probe:
        gpu = device_probe.amd_device()
        return triton_probe(self.name, DeviceFacts(
            extra="rocm", compiles="AMDGCN and HSACO for gfx942/gfx950", device_present=gpu,
            device_missing="no AMD GPU on this machine (/dev/kfd absent)",
            runs_with="AMD GPU through PyTorch-ROCm and Triton, HIP graphs",
            timer="HIP events through torch.cuda.Event",
            details={"hip-python": "installed" if device_probe.has_module("hip") else "missing",
                     "amd device": "present (/dev/kfd)" if gpu else "absent"},
        ))  # fmt: skip
