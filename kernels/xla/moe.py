"""The mixture-of-experts FFN (ops._EXPERTS: SwiGLU or gpt-oss's clamped SwiGLU experts, optional
biases, the routing weight on the output or on the input), static-shaped for XLA, in two forms:
"gather": each token's k experts' weights are gathered ([T, k, F, D]) and applied: reads only the
          experts a decode step routes to (the weight traffic the cost model counts);
"dense":  every expert on every token, combined by the routing weights: E/k times the FLOPs, no
          gather; better when most experts are touched anyway (large prefill batches). With
          weight_input each slot's input differs, so it is k times that again.
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


def sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def activation(g, u, attrs):
    """The gated activation of ops._EXPERTS, in f32."""
    if attrs["activation"] == "swiglu_clamp":
        limit = jnp.float32(attrs["limit"])
        g = jnp.minimum(g, limit)
        u = jnp.clip(u, -limit, limit)
        return (u + 1.0) * g * sigmoid(jnp.float32(attrs["alpha"]) * g)
    return g * sigmoid(g) * u


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    weight_input = attrs["weight_input"]

    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x, weights, idx, wg, wu, wd = (inputs[i] for i in args[:6])
        biases = [inputs[i].astype(jnp.float32) for i in args[6:]]  # b_gate[E, F], b_up[E, F], b_down[E, D]
        d = x.shape[-1]
        xt = x.reshape(-1, d)  # [T, D]
        wt = weights.reshape(-1, weights.shape[-1]).astype(jnp.float32)  # [T, k]
        it = idx.reshape(-1, idx.shape[-1])  # [T, k]
        wd32 = wd.astype(jnp.float32)
        if config["impl"] == "dense":
            experts = lax.broadcasted_iota(jnp.int32, (1, 1, wg.shape[0]), 2)
            hit = it[..., None] == experts  # [T, k, E]
            if weight_input:
                h = xt.astype(jnp.float32)[:, None, :] * wt[..., None]  # [T, k, D]
                g = einsum("tkd,efd->tkef", h, wg)  # [T, k, E, F]
                u = einsum("tkd,efd->tkef", h, wu)
                if biases:
                    g, u = g + biases[0], u + biases[1]
                y = jnp.einsum("tkef,edf->tked", activation(g, u, attrs), wd32, precision=HIGHEST)
                if biases:
                    y = y + biases[2]  # [T, k, E, D]
                o = jnp.sum(jnp.where(hit[..., None], y, 0.0), axis=(1, 2))
            else:
                g = einsum("td,efd->tef", xt, wg)  # [T, E, F]
                u = einsum("td,efd->tef", xt, wu)
                if biases:
                    g, u = g + biases[0], u + biases[1]
                y = jnp.einsum("tef,edf->ted", activation(g, u, attrs), wd32, precision=HIGHEST)  # [T, E, D]
                if biases:
                    y = y + biases[2]
                combine = jnp.sum(jnp.where(hit, wt[..., None], 0.0), axis=1)  # [T, E]
                routed = jnp.any(hit, axis=1)  # an unrouted expert's inf or nan must not leak in
                o = jnp.einsum("te,ted->td", combine, jnp.where(routed[..., None], y, 0.0), precision=HIGHEST)
        else:
            if weight_input:
                h = xt.astype(jnp.float32)[:, None, :] * wt[..., None]  # [T, k, D]
                spec_in = "tkd,tkfd->tkf"
            else:
                h, spec_in = xt, "td,tkfd->tkf"
            g = einsum(spec_in, h, jnp.take(wg, it, axis=0, mode="clip"))  # [T, k, F]
            u = einsum(spec_in, h, jnp.take(wu, it, axis=0, mode="clip"))
            if biases:
                g = g + jnp.take(biases[0], it, axis=0, mode="clip")
                u = u + jnp.take(biases[1], it, axis=0, mode="clip")
            wd_k = jnp.take(wd32, it, axis=0, mode="clip")  # [T, k, D, F]
            y = jnp.einsum("tkf,tkdf->tkd", activation(g, u, attrs), wd_k, precision=HIGHEST)  # [T, k, D]
            if biases:
                y = y + jnp.take(biases[2], it, axis=0, mode="clip")
            o = jnp.sum(y if weight_input else y * wt[..., None], axis=1)
        return (o.reshape(x.shape).astype(out),)

    return launch
