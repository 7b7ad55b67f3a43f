"""The rocm backend (AMD Instinct through Triton): targets and an honest probe so far."""

from polymorph.backends.rocm.backend import RocmBackend

BACKEND = RocmBackend

__all__ = ["BACKEND", "RocmBackend"]
