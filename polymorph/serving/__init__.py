"""The host side of serving a model: traffic shapes, the paged KV cache's bookkeeping, generation
steps, and tensor-parallel execution."""
