"""Checks of a backend against the reference engine (numerics today; the engine's gates join later)."""

from polymorph.verify.numerics import StepCheck, VerifyResult, verify_executable

__all__ = ["StepCheck", "VerifyResult", "verify_executable"]
