"""The top-k router: logits[*, E] -> routing weights[*, k] f32, expert indices[*, k] i32.

Top-k is k rounds of argmax over the experts not yet taken (ties go to the lower expert index, as in
the reference): no sort and no TopK custom call in the HLO, and k is small (2 to 8).
"""

import jax.numpy as jnp
from jax import lax

IMPLEMENTS = "topk_router"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def topk(x, k):
    """x[*, E] -> (values [*, k], indices [*, k] i32), largest first, lower index first on ties."""
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    taken = jnp.zeros(x.shape, dtype=bool)
    values, indices = [], []
    for _ in range(k):
        i = jnp.argmax(jnp.where(taken, -jnp.inf, x), axis=-1).astype(jnp.int32)  # [*]
        hit = iota == i[..., None]
        values.append(jnp.sum(jnp.where(hit, x, 0.0), axis=-1))
        indices.append(i)
        taken = taken | hit
    return jnp.stack(values, axis=-1), jnp.stack(indices, axis=-1)


def softmax(x):
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def build(spec, config, target):
    node = spec.single
    (logits_i,) = spec.args(node)
    attrs = spec.attrs()
    k = attrs["k"]

    def launch(*inputs):
        logits = inputs[logits_i].astype(jnp.float32)  # [*, E]
        if attrs["mode"] == "topk_softmax":
            values, idx = topk(logits, k)
            weights = softmax(values)
        else:
            weights, idx = topk(softmax(logits), k)
            if attrs["normalize"]:
                weights = weights / weights.sum(axis=-1, keepdims=True)
        return weights, idx

    return launch
