"""The cuda backend (NVIDIA GPUs through Triton): targets and an honest probe so far."""

from polymorph.backends.cuda.backend import CudaBackend

BACKEND = CudaBackend

__all__ = ["BACKEND", "CudaBackend"]
