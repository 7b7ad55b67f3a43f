"""polymorph: one loop to compile, run, verify and tune ML inference on any chip."""

__version__ = "0.1.0"

from polymorph.api import compile, load, load_compiled, run, verify
from polymorph.models import Model, load_model

__all__ = ["Model", "__version__", "compile", "load", "load_compiled", "load_model", "run", "verify"]
