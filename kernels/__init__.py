"""Kernel source files, installed as `polymorph.kernels`; loaded by path, never imported as modules."""
