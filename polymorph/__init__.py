"""polymorph: one loop to compile, run, verify and tune ML inference on any chip."""

__version__ = "0.1.0"

from polymorph.api import compile, load, load_compiled, run, verify
from polymorph.frontend import from_torch
from polymorph.models import Model, load_model

if "torch" in __import__("sys").modules:  # torch.compile(..., backend="polymorph"); else the entry point
    from polymorph.frontend.dynamo import register as _register_dynamo

    _register_dynamo()

__all__ = [
    "Model",
    "__version__",
    "compile",
    "from_torch",
    "load",
    "load_compiled",
    "load_model",
    "run",
    "verify",
]
