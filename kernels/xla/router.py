"""The top-k router: logits[*, E] (, bias[E]) -> routing weights[*, k] f32, expert indices[*, k] i32,
in every mode of ops._ROUTER (grouped selection, normalization and scaling included).

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


def sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))  # as the reference writes it: exp(-x) = inf gives 0


def gather_last(x, idx):
    """x[*, E], idx[*, k] -> x[..., idx] [*, k], as k one-hot sums (no gather in the HLO)."""
    iota = lax.broadcasted_iota(jnp.int32, (*idx.shape, x.shape[-1]), idx.ndim)
    return jnp.sum(jnp.where(iota == idx[..., None], x[..., None, :], 0.0), axis=-1)


def group_mask(choice, groups, chosen):
    """choice[*, E] -> bool[*, E]: the experts of the `chosen` groups whose two best scores sum highest."""
    e = choice.shape[-1]
    grouped = choice.reshape(*choice.shape[:-1], groups, e // groups)  # [*, G, E/G]
    best2, _ = topk(grouped, 2)
    _, keep = topk(best2.sum(axis=-1), chosen)  # [*, chosen]
    g = lax.broadcasted_iota(jnp.int32, (*keep.shape, groups), keep.ndim)
    allowed = jnp.any(keep[..., None] == g, axis=-2)  # [*, G]
    return jnp.repeat(allowed, e // groups, axis=-1)


def route(logits, bias, attrs):
    """logits[*, E] f32 (, bias[E] f32) -> weights[*, k] f32, indices[*, k] i32 (ops._ROUTER)."""
    mode, k = attrs["mode"], attrs["k"]
    if mode == "topk_softmax":
        values, idx = topk(logits, k)
        weights = softmax(values)
    elif mode == "topk_sigmoid":
        values, idx = topk(logits, k)
        weights = sigmoid(values)
    elif mode == "softmax_topk":
        weights, idx = topk(softmax(logits), k)
    else:  # sigmoid_topk: chosen by scores + bias, weighted by the scores
        scores = sigmoid(logits)
        choice = scores if bias is None else scores + bias
        groups = attrs["groups"]
        if groups > 1:
            allowed = group_mask(choice, groups, attrs["topk_groups"] or groups)
            choice = jnp.where(allowed, choice, -jnp.inf)
        _, idx = topk(choice, k)
        weights = gather_last(scores, idx)
    if attrs["normalize"] and mode in ("softmax_topk", "sigmoid_topk"):
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights * jnp.float32(attrs["scaling"]), idx


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()

    def launch(*inputs):
        logits = inputs[args[0]].astype(jnp.float32)  # [*, E]
        bias = inputs[args[1]].astype(jnp.float32) if len(args) > 1 else None  # [E]
        return route(logits, bias, attrs)

    return launch
