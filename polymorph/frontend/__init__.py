"""Frontends: models from other frameworks into polymorph's IR (torch.export today)."""

from polymorph.frontend.torch_export import ExportedModel, from_program, from_torch, load_pt2

__all__ = ["ExportedModel", "from_program", "from_torch", "load_pt2"]
