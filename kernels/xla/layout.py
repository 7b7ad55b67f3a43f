"""Layout ops: reshape, transpose, slice, concat (HLO reshape/transpose/slice/concatenate)."""

import jax.numpy as jnp

IMPLEMENTS = ("reshape", "transpose", "slice", "concat")
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op
    shape = tuple(int(d) for d in spec.types[node.outputs[0]].shape)  # concrete: the spec is specialized

    def launch(*inputs):
        x = inputs[args[0]]
        if op == "reshape":
            return (x.reshape(shape),)
        if op == "transpose":
            return (jnp.transpose(x, attrs["perm"]),)
        if op == "slice":
            index = [slice(None)] * x.ndim
            index[attrs["axis"] % x.ndim] = slice(attrs["start"], attrs["end"])
            return (x[tuple(index)],)
        return (jnp.concatenate([inputs[i] for i in args], axis=attrs["axis"]),)

    return launch
