"""Cheap, side-effect-free facts about this machine that backends' probes share.

Nothing here imports a vendor runtime or opens a device: a probe must not initialize a context
(a CUDA context costs hundreds of MB and seconds, and breaks fork-based workers)."""

from __future__ import annotations

import importlib.util
import os
import shutil


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def nvidia_device() -> bool:
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def amd_device() -> bool:
    return os.path.exists("/dev/kfd")


def neuron_device() -> bool:
    return os.path.exists("/dev/neuron0")


def executable(name: str) -> bool:
    return shutil.which(name) is not None
