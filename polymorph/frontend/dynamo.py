"""`torch.compile(model, backend="polymorph")`: each graph TorchDynamo captures is exported, imported
(torch_export.py) and run by polymorph's default backend for the tensors' device (cpu on a host);
graph breaks stay PyTorch's. Registered under the name `polymorph` by `register()` (which `import
polymorph` calls when torch is already imported) and through the `torch_dynamo_backends` entry point
(`polymorph = "polymorph.frontend.dynamo:polymorph_backend"`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def polymorph_backend(gm: Any, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """A Dynamo backend: the captured graph as an imported model on its device's default backend."""
    import numpy as np
    import torch
    import torch.utils._pytree as pytree

    from polymorph import api
    from polymorph.frontend.torch_export import from_program
    from polymorph.pipeline.backend import registry

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if len(tensors) != len(example_inputs) or any(t.device.type != "cpu" for t in tensors):
        return gm.forward  # symbolic sizes or non-host tensors: PyTorch runs this graph (cpu only here)
    program = torch.export.export(gm, tuple(example_inputs), strict=False)
    model = from_program(program, name="dynamo")
    artifact = api.compile(model, "cpu")
    threads = torch.get_num_threads()
    exe = registry.get(artifact.plan.backend).load(artifact, model.weights())
    torch.set_num_threads(threads)  # the cpu executable sets it; Dynamo refuses a change while tracing
    with torch.no_grad():
        structure = pytree.tree_structure(gm(*example_inputs))
    names = list(model.input_names)

    def run(*args: Any) -> Any:
        inputs = {n: np.ascontiguousarray(a.detach().numpy()) for n, a in zip(names, args, strict=True)}
        outs = exe.run(inputs)
        leaves = [torch.from_numpy(outs[f"output_{i}"]) for i in range(len(outs))]
        return pytree.tree_unflatten(leaves, structure)

    return run


def register() -> None:
    """The backend under the name `polymorph` in TorchDynamo's registry (idempotent)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "polymorph" not in _COMPILER_FNS:
        register_backend(polymorph_backend, name="polymorph")
