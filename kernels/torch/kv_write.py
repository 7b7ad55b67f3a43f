"""Scatter this step's keys or values into their paged-cache slots, in place."""

IMPLEMENTS = "kv_write"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    cache_i, x_i, table_i, pos_i = spec.args(spec.single)

    def launch(inputs, outputs, scratch):
        cache = outputs[0]  # the state tensor itself: the executable aliases it to input 0
        pos = inputs[pos_i].long()  # [B, S]
        block_size = cache.shape[1]
        blocks = inputs[table_i].long().gather(1, pos // block_size)  # [B, S]
        cache[blocks, pos % block_size] = inputs[x_i].to(cache.dtype)

    return launch
