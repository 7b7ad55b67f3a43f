"""Scatter this step's keys or values into their paged-cache slots, in place."""

IMPLEMENTS = "kv_write"
# index "tensor": block and slot indices computed as tensors, one advanced-index write (any batch);
# "host": the positions and the block table read on the host and each token's row copied into its
# slot (a decode step writes one token per sequence: a few tiny copies beat the index arithmetic);
# "flat": the cache viewed as rows of slots, one write at the 1-d slot index block * block_size + offset.
CONFIGS = [{"index": "tensor"}, {"index": "host"}, {"index": "flat"}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    cache_i, x_i, table_i, pos_i = spec.args(spec.single)
    index = config.get("index", "tensor")

    def launch(inputs, outputs, scratch):
        cache = outputs[0]  # the state tensor itself: the executable aliases it to input 0
        x = inputs[x_i]  # [B, S, Hkv, Dh]
        block_size = cache.shape[1]
        if index == "host":
            table = inputs[table_i]
            for b, row in enumerate(inputs[pos_i].tolist()):
                for s, p in enumerate(row):
                    cache[int(table[b, p // block_size]), p % block_size].copy_(x[b, s])
            return
        pos = inputs[pos_i].long()  # [B, S]
        blocks = inputs[table_i].long().gather(1, pos // block_size)  # [B, S]
        if index == "flat":
            slots = (blocks * block_size + pos % block_size).reshape(-1)
            rows = cache.view(-1, *cache.shape[2:])  # [blocks * block_size, Hkv, Dh], the same storage
            rows[slots] = x.reshape(-1, *cache.shape[2:]).to(cache.dtype)  # (index_copy_ has no fp8)
            return
        cache[blocks, pos % block_size] = x.to(cache.dtype)

    return launch
