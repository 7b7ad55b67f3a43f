"""Model zoo: Hugging Face configs and checkpoints to polymorph graphs."""

from polymorph.models.zoo import Model, load_model, zoo_names

__all__ = ["Model", "load_model", "zoo_names"]
