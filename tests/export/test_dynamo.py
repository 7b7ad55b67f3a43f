"""`torch.compile(model, backend="polymorph")` on a conv model: the captured graph runs through the
import on the cpu backend and matches eager."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import polymorph  # noqa: F401  (registers the `polymorph` backend: torch is imported already)
from polymorph.frontend.dynamo import polymorph_backend
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import compare, model_tolerance


def test_backend_runs_a_captured_graph(zoo: Any) -> None:
    torch.manual_seed(3)
    module, (x,) = zoo.conv()
    gm = torch.fx.symbolic_trace(module)
    run = polymorph_backend(gm, [x])
    assert run is not gm.forward  # polymorph took the graph, PyTorch did not
    fresh = torch.randn_like(x)
    with torch.no_grad():
        want = module(fresh).numpy()
    assert compare(run(fresh).numpy(), want, model_tolerance(DType.F32)).ok


def test_torch_compile_matches_eager(zoo: Any) -> None:
    torch.manual_seed(4)
    module, (x,) = zoo.conv()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="polymorph")
    for _ in range(2):  # the second call reuses the compiled graph
        fresh = torch.randn_like(x)
        with torch.no_grad():
            got, want = compiled(fresh).numpy(), module(fresh).numpy()
        assert np.isfinite(got).all()
        assert compare(got, want, model_tolerance(DType.F32)).ok
