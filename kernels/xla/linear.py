"""x[*, K] @ w[N, K]^T (+ bias) and batched matmul, as XLA dot_general accumulating in float32.

Operands keep their stored dtype (bf16 reaches the TensorEngine as bf16) and the products
accumulate in f32 (`preferred_element_type`): exactly what the reference computes, since a product
of two bf16 values is exact in f32. Operands of different dtypes are promoted to f32 first.
"""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = ("linear", "matmul")
CONFIGS = [{}]
HIGHEST = lax.Precision.HIGHEST  # no TF32-style shortcut on platforms that have one


def supports(spec):
    return len(spec.nodes) == 1 and spec.types[spec.single.outputs[0]].dtype.is_float


def same_dtype(a, b):
    if a.dtype != b.dtype:
        return a.astype(jnp.float32), b.astype(jnp.float32)
    return a, b


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    if node.op == "matmul":

        def launch_matmul(*inputs):
            a, b = same_dtype(inputs[args[0]], inputs[args[1]])  # [*, M, K], [*, K, N]
            y = jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=jnp.float32)
            return (y.astype(out),)

        return launch_matmul

    def launch(*inputs):
        x, w = same_dtype(inputs[args[0]], inputs[args[1]])  # x: [*, K], w: [N, K]
        dims = (((x.ndim - 1,), (1,)), ((), ()))
        y = lax.dot_general(x, w, dims, precision=HIGHEST, preferred_element_type=jnp.float32)  # [*, N]
        if len(args) == 3:
            y = y + inputs[args[2]].astype(jnp.float32)
        return (y.astype(out),)

    return launch
