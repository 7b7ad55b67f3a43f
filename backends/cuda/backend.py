"""NVIDIA GPUs (sm_90 H100/H200, sm_100 B200, sm_103 GB300) through the shared Triton kernel library.

Compiling needs Triton only (PTX and cubin for the target, without a GPU); running needs an NVIDIA
GPU and a CUDA build of torch. The lowering, compile and runtime live in backends/gpu/, shared with
rocm; this file is the NVIDIA-specific part: targets, probe, device facts.
"""

from __future__ import annotations

from typing import Any, ClassVar

from polymorph.backends import device_probe
from polymorph.backends.gpu.backend import DeviceFacts, TritonBackend, triton_probe
from polymorph.pipeline.backend import Probe


class CudaBackend(TritonBackend):
    name: ClassVar[str] = "cuda"
    targets: ClassVar[tuple[str, ...]] = ("h200", "h100", "b200", "gb300")

    def probe(self) -> Probe:
        gpu = device_probe.nvidia_device()
        return triton_probe(self.name, DeviceFacts(
            extra="cuda", compiles="PTX and cubin for sm_90/sm_100", device_present=gpu,
            device_missing="no NVIDIA GPU on this machine",
            runs_with="NVIDIA GPU through torch and Triton, CUDA graphs", timer="CUDA events",
            details={"nvidia device": "present" if gpu else "absent"},
        ))  # fmt: skip


def device_facts(index: int = 0) -> dict[str, Any]:
    """Facts torch does not expose, read through cuda-python's driver API (cuda.bindings)."""
    from cuda.bindings import driver

    (err,) = driver.cuInit(0)
    _check(err)
    err, dev = driver.cuDeviceGet(index)
    _check(err)
    attrs = {
        "sm_count": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "l2_bytes": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
        "max_shared_per_block_optin": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        "memory_clock_khz": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
        "memory_bus_bits": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
    }
    out: dict[str, Any] = {}
    for key, attr in attrs.items():
        err, value = driver.cuDeviceGetAttribute(attr, dev)
        _check(err)
        out[key] = value
    err, name = driver.cuDeviceGetName(128, dev)
    _check(err)
    out["name"] = name.split(b"\0", 1)[0].decode()
    return out


def _check(err: Any) -> None:
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")
