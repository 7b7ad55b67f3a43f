"""The neuron backend (AWS Trainium2 through XLA): targets and an honest probe so far."""

from polymorph.backends.neuron.backend import NeuronBackend

BACKEND = NeuronBackend

__all__ = ["BACKEND", "NeuronBackend"]
