"""Kernel files for the neuron backend (AWS Trainium2 through XLA): pure JAX functions.

The same kernel-file contract as every kernel language (IMPLEMENTS, CONFIGS, supports(spec), build(spec,
config, target)), with one difference in what `build` returns, because JAX is functional:

    launch(*inputs) -> tuple(outputs)

`inputs` are jax arrays in `spec.inputs` order; the launch returns new arrays for `spec.outputs`, in
order, with exactly the dtypes and (concrete) shapes of their types. Nothing is written in place:
where a torch or Triton launch writes into preallocated `outputs` (and `kv_write` into the cache
itself), an XLA launch returns values, and `kv_write` returns the whole new cache, which the runtime
threads on as the next step's state (the step function returns it; buffer donation lets XLA update
it in place). A launch is traced by `jax.jit`, never run eagerly, so it may use only jax.numpy /
lax on its inputs: no host callbacks, no custom calls, no large constants (the compile checker
rejects all three in the HLO), and weights always arrive as inputs, so they stay HLO parameters.

The spec a launch is built for is concrete: the runtime specializes the graph to each step's
shapes first (XLA needs static shapes; each shape is its own compiled module, as each Neuron bucket
is its own NEFF). Numerics follow polymorph.ir.reference: compute in float32, round once to the
output dtype; matmuls keep their stored operand dtype and accumulate in float32.
"""
