"""The neuron backend: AWS Trainium2 (trn2) through JAX/XLA. HLO and StableHLO on any machine, a NEFF
where neuronx-cc is installed, runs on a NeuronCore through jax-neuronx (unproven here) or on XLA's
CPU backend for numerics."""

from polymorph.backends.neuron.backend import NeuronBackend

BACKEND = NeuronBackend

__all__ = ["BACKEND", "NeuronBackend"]
