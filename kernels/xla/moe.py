"""The mixture-of-experts FFN (SwiGLU experts), static-shaped for XLA, in two forms:
"gather": each token's k experts' weights are gathered ([T, k, F, D]) and applied: reads only the
          experts a decode step routes to (the weight traffic the cost model counts);
"dense":  every expert on every token, combined by the routing weights: E/k times the FLOPs, no
          gather; better when most experts are touched anyway (large prefill batches).
"""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = "moe_ffn"
CONFIGS = [{"impl": "gather"}, {"impl": "dense"}]
HIGHEST = lax.Precision.HIGHEST


def supports(spec):
    return len(spec.nodes) == 1


def einsum(spec, a, b):
    if a.dtype != b.dtype:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(spec, a, b, precision=HIGHEST, preferred_element_type=jnp.float32)


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)

    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x, weights, idx, wg, wu, wd = (inputs[i] for i in args)
        d = x.shape[-1]
        xt = x.reshape(-1, d)  # [T, D]
        wt = weights.reshape(-1, weights.shape[-1]).astype(jnp.float32)  # [T, k]
        it = idx.reshape(-1, idx.shape[-1])  # [T, k]
        if config["impl"] == "dense":
            g = einsum("td,efd->tef", xt, wg)  # [T, E, F]
            u = einsum("td,efd->tef", xt, wu)
            act = g / (1.0 + jnp.exp(-g)) * u
            y = jnp.einsum("tef,edf->ted", act, wd.astype(jnp.float32), precision=HIGHEST)  # [T, E, D]
            experts = lax.broadcasted_iota(jnp.int32, (1, 1, wg.shape[0]), 2)
            combine = jnp.sum(jnp.where(it[..., None] == experts, wt[..., None], 0.0), axis=1)  # [T, E]
            o = jnp.einsum("te,ted->td", combine, y, precision=HIGHEST)
        else:
            g = einsum("td,tkfd->tkf", xt, jnp.take(wg, it, axis=0, mode="clip"))  # [T, k, F]
            u = einsum("td,tkfd->tkf", xt, jnp.take(wu, it, axis=0, mode="clip"))
            act = g / (1.0 + jnp.exp(-g)) * u
            wd_k = jnp.take(wd, it, axis=0, mode="clip").astype(jnp.float32)  # [T, k, D, F]
            y = jnp.einsum("tkf,tkdf->tkd", act, wd_k, precision=HIGHEST)  # [T, k, D]
            o = jnp.sum(y * wt[..., None], axis=1)
        return (o.reshape(x.shape).astype(out),)

    return launch
