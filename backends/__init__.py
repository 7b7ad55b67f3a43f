"""In-tree backends, installed as `polymorph.backends.<family>`: cpu, cuda, rocm, neuron."""
