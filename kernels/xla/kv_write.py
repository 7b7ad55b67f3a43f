"""Scatter this step's keys or values into their paged-cache slots; return the new cache.

Functional, unlike the torch and Triton kernels: the launch returns the whole cache with the new
rows scattered in (an HLO scatter), and the runtime makes that the state of the next step. With the
cache donated to the step, XLA writes the rows in place instead of copying the cache."""

import jax.numpy as jnp

IMPLEMENTS = "kv_write"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    cache_i, x_i, table_i, pos_i = spec.args(spec.single)

    def launch(*inputs):
        cache, pos = inputs[cache_i], inputs[pos_i]  # cache: [N, bs, Hkv, Dh], pos: [B, S]
        block_size = cache.shape[1]
        # Positions outside the table are refused on the host before the step (runtime.py).
        blocks = jnp.take_along_axis(inputs[table_i], pos // block_size, axis=1, mode="clip")  # [B, S]
        new = cache.at[blocks, pos % block_size].set(inputs[x_i].astype(cache.dtype), mode="drop")
        return (new,)

    return launch
