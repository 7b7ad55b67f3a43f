"""In-tree backends, installed as `polymorph.backends.<name>`: cpu, cuda, rocm, neuron."""
