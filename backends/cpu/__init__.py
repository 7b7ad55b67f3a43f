"""The cpu backend: the default, runs any graph on torch's CPU kernels through the full
lower -> compile -> load -> run path."""

from polymorph.backends.cpu.backend import CpuBackend

BACKEND = CpuBackend

__all__ = ["BACKEND", "CpuBackend"]
