"""Adversarial candidate for a latent (or any paged) cache write: every entry lands in its slot, and
each sequence's last entry is written once more into the slot after it, a slot the sequence has not
reached (a stray write a later token would overwrite, but a reader of that slot before then, or
another sequence owning it, sees): the guard regions catch it."""

IMPLEMENTS = "kv_write"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    cache_i, x_i, table_i, pos_i = spec.args(spec.single)

    def launch(inputs, outputs, scratch):
        cache = outputs[0]
        x, table = inputs[x_i], inputs[table_i].long()
        pos = inputs[pos_i].long()
        block_size = cache.shape[1]
        blocks = table.gather(1, pos // block_size)
        cache[blocks, pos % block_size] = x.to(cache.dtype)
        nxt = pos[:, -1:] + 1  # [B, 1]: the slot after each sequence's last token
        fits = nxt // block_size < table.shape[1]
        for b in range(pos.shape[0]):
            if fits[b, 0]:
                p = int(nxt[b, 0])
                cache[int(table[b, p // block_size]), p % block_size] = x[b, -1].to(cache.dtype)

    return launch
