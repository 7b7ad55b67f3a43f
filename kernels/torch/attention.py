"""Attention through torch's scaled_dot_product_attention: causal, and over the paged KV cache, with a
sliding window (`window`), chunked attention (`chunk`), logit soft-capping (`softcap`) and attention
sinks (the optional `sinks[H]` input: one more logit per query head in each row's softmax, with no
value) where the op asks for them. Sinks take the "math" form (SDPA has no sink)."""

import torch
import torch.nn.functional as F

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = ("attention", "cache_attention")
# impl "sdpa": torch's fused kernel with a boolean mask; "math": explicit softmax(q k^T) v in float32
# (soft-capping and sinks always take this form: SDPA has neither).
# read (cache_attention only): "live" (the default) reads the positions first (a host read, free on
# cpu) and gathers only the blocks between the window's first key and the last query: blocks wholly
# outside the window or past every sequence's end are never read, a decode step at a short context
# reads a short cache, and one sequence's keys are sliced exactly (no mask at all); "per_seq" does that
# per sequence, in a loop (ragged batches: each one reads its own length); "table" gathers every block
# of the block table and masks (and zeroes) what a query does not see; "decode" is for one query per
# sequence: each sequence's visible keys gathered and sliced exactly, then two batched GEMMs per
# sequence over its kv heads (the query heads of a kv head as the rows of one GEMM) and a softmax, the
# second GEMM written into the output (about 12 torch ops against SDPA's path's 21); a call with more
# than one query, or with soft-capping or sinks, takes the "live" path.
# gqa "native": SDPA reads each kv head in place for its query heads; "fold": the query heads that
# share a kv head become rows of one query block of that head (one longer matrix per kv head); with
# impl "math" that is two strided batched GEMMs over the gathered cache, no copy of K or V (measured on
# 2 pinned cores at llama-tiny's decode, batch 1, ctx 1024: 56 us against SDPA's 74 us).
# threads: 0 keeps the executable's thread count; n runs this kernel on n threads (restored after):
# for long contexts at large batches; at llama-tiny's decode on a loaded 2-core machine 2 threads
# cost 100x (OpenMP workers woken per call), so it is the last config, not a default.
CONFIGS = [
    {"impl": "sdpa", "read": "live", "gqa": "native", "threads": 0},
    {"impl": "sdpa", "read": "live", "gqa": "fold", "threads": 0},
    {"impl": "math", "read": "live", "gqa": "fold", "threads": 0},
    {"impl": "sdpa", "read": "per_seq", "gqa": "native", "threads": 0},
    {"impl": "sdpa", "read": "per_seq", "gqa": "fold", "threads": 0},
    {"impl": "math", "read": "live", "gqa": "native", "threads": 0},
    {"impl": "sdpa", "read": "table", "gqa": "native", "threads": 0},
    {"impl": "math", "read": "table", "gqa": "native", "threads": 0},
    {"impl": "sdpa", "read": "live", "gqa": "native", "threads": 2},
    {"impl": "math", "read": "decode", "gqa": "fold", "threads": 0},
]


# the attrs this file implements (an attr added to the op later is refused until it is)
_ATTRS = {"scale", "causal", "window", "softcap", "chunk"}


def supports(spec):
    return len(spec.nodes) == 1 and set(spec.attrs()) <= _ATTRS


def _scores_math(q, k, v, visible, scale, softcap, sinks=None):
    # q: [B, H, S, Dh], k/v: [B, H, T, Dh], visible: [B, 1, S, T] or None, sinks: [H or 1, S or 1] f32
    # (the sink logit of each query row) or None
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
        # A key no query sees may hold anything (unwritten cache memory, NaN included): p is 0 there,
        # and 0 * NaN is NaN, so its value row is zeroed too.
        v = v.masked_fill(~visible.any(-2)[..., None], 0.0)
    if sinks is None:
        return scores.softmax(-1) @ v
    # the sink joins the row's max and its denominator; it carries no value
    sink = sinks[None, :, :, None].expand(*scores.shape[:-1], 1)  # [B, H, S, 1]
    top = torch.maximum(scores.amax(-1, keepdim=True), sink)
    p = torch.exp(scores - top)
    return (p / (p.sum(-1, keepdim=True) + torch.exp(sink - top))) @ v


def _attend(q, k, v, visible, scale, impl, softcap=0.0, gqa="native", sinks=None):
    # q: [B, S, H, Dh], k/v: [B, T, Hkv, Dh], visible: [B, S, T] or None (every key seen), sinks: [H]
    b, s, h, d = q.shape
    if sinks is not None:  # SDPA has no sink
        impl = "math"
        sinks = sinks.float()
    if visible is not None and impl == "sdpa" and not softcap:
        # SDPA adds its mask to the scores (NaN + -inf is NaN) and weighs V by 0 (0 * NaN is NaN): a key
        # no query of its sequence sees may be unwritten memory, so it is zeroed in K and V first.
        unseen = ~visible.any(1)[:, :, None, None]  # [B, T, 1, 1]
        k, v = k.float().masked_fill(unseen, 0.0), v.float().masked_fill(unseen, 0.0)
    hkv = k.shape[2]
    rep = h // hkv
    if gqa == "fold" and rep > 1:
        # [B, S, Hkv, rep, Dh] -> [B, Hkv, rep * S, Dh]: one query block per kv head
        qf = q.float().view(b, s, hkv, rep, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, rep * s, d)
        kf, vf = (t.transpose(1, 2).float() for t in (k, v))  # [B, Hkv, T, Dh]
        mask = None
        if visible is not None:  # the same keys for every query head of a position
            mask = visible[:, None].expand(b, rep, s, visible.shape[-1]).reshape(b, 1, rep * s, -1)
        if impl == "sdpa" and not softcap:
            out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
        else:
            # rows of kv head g are (r, s): query head g * rep + r at token s
            sink = (
                None if sinks is None else sinks.view(hkv, rep, 1).expand(hkv, rep, s).reshape(hkv, rep * s)
            )
            out = _scores_math(qf, kf, vf, mask, scale, softcap, sink)
        return out.view(b, hkv, rep, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, h, d)
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))  # [B, H, S, Dh]
    mask = None if visible is None else visible[:, None]  # [B, 1, S, T]
    if impl == "sdpa" and not softcap:  # grouped query heads read their kv head in place (no copy)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=rep > 1)
    else:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = _scores_math(q, k, v, mask, scale, softcap, None if sinks is None else sinks[:, None])
    return out.transpose(1, 2)  # [B, S, H, Dh]


# A launch on a chosen number of threads (config key `threads`; 0: the process's count).
_threaded = depend(
    "torch/_threads.py", "cb577c022de0be2c6e1d752dd5ed81cb037174661c4119fd34d8fe4918676329"
).threaded


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale, impl = attrs["scale"], config["impl"]
    window, softcap, chunk = attrs.get("window", 0), attrs.get("softcap", 0.0), attrs.get("chunk", 0)
    n_in = 5 if node.op == "cache_attention" else 3  # then the optional sinks[H]
    sink_arg = args[n_in] if len(args) > n_in else None
    read, gqa = config.get("read", "live"), config.get("gqa", "native")

    def sinks_of(inputs):
        return None if sink_arg is None else inputs[sink_arg]

    if node.op == "attention":

        def launch(inputs, outputs, scratch):
            q, k, v = (inputs[i] for i in args[:3])
            s, t = q.shape[1], k.shape[1]
            visible = torch.ones(q.shape[0], s, t, dtype=torch.bool)
            if attrs["causal"]:
                visible = visible.tril()
            if window:  # query i sees keys i - window < j <= i
                visible &= ~torch.ones(s, t, dtype=torch.bool).tril(-window)
            if chunk:  # query i sees keys j <= i of its own chunk
                visible &= (torch.arange(s)[:, None] // chunk) == (torch.arange(t)[None, :] // chunk)
            outputs[0].copy_(_attend(q, k, v, visible, scale, impl, softcap, gqa, sinks_of(inputs)))

        return _threaded(launch, config.get("threads", 0))

    def gather(cache, rows, b, n):
        # rows: block ids in logical order -> [B, n * block, Hkv, Dh]
        _, block_size, hkv, d = cache.shape
        return cache.index_select(0, rows).view(b, n * block_size, hkv, d)

    def visible_of(pos, first_key, n_keys):
        t = torch.arange(first_key, first_key + n_keys)  # the keys' absolute positions
        visible = t[None, None, :] <= pos[:, :, None]  # [B, S, T]
        if window:
            visible &= t[None, None, :] > pos[:, :, None] - window
        if chunk:
            visible &= t[None, None, :] // chunk == pos[:, :, None] // chunk
        return visible

    def launch_table(inputs, outputs, scratch):
        if window or chunk:  # blocks wholly outside a window or chunk are never loaded: read "live"
            return launch_live(inputs, outputs, scratch)
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        b, blocks = table.shape
        rows = table.reshape(-1).long()  # index_select: one gather kernel, half the cost of kc[table]
        k, v = gather(kc, rows, b, blocks), gather(vc, rows, b, blocks)  # [B, T, Hkv, Dh] logical order
        visible = visible_of(pos.long(), 0, k.shape[1])
        outputs[0].copy_(_attend(q, k, v, visible, scale, impl, softcap, gqa, sinks_of(inputs)))

    def attend_live(q, kc, vc, table, pos, sinks):
        """One batch over the blocks from the window's (or chunk's) first key to the last query's
        position: blocks wholly outside are never read. A single query (or one per sequence at one
        position) slices its keys exactly (no mask)."""
        b, blocks = table.shape
        block_size = kc.shape[1]
        p_min, p_max = int(pos.min()), int(pos.max())
        hi = p_max + 1  # no query sees a key at or past hi
        lo = max(0, p_min - window + 1) if window else 0  # nor one before lo
        if chunk:
            lo = p_min // chunk * chunk
        first, last = lo // block_size, min(blocks, -(-hi // block_size))
        n = last - first
        rows = table[:, first:last].reshape(-1)
        k, v = gather(kc, rows, b, n), gather(vc, rows, b, n)
        base = first * block_size
        if b == 1 or (q.shape[1] == 1 and p_min == p_max):
            # One sequence, or one query per sequence all at one position: exactly the keys [lo, hi)
            # every sequence's queries see, all of them written.
            k, v = k[:, lo - base : hi - base], v[:, lo - base : hi - base]
            if q.shape[1] == 1:  # one query sees them all: no mask
                return _attend(q, k, v, None, scale, impl, softcap, gqa, sinks)
            return _attend(q, k, v, visible_of(pos.long(), lo, hi - lo), scale, impl, softcap, gqa, sinks)
        return _attend(q, k, v, visible_of(pos.long(), first * block_size, n * block_size), scale, impl,
                       softcap, gqa, sinks)  # fmt: skip

    def launch_live(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        outputs[0].copy_(attend_live(q, kc, vc, table, pos, sinks_of(inputs)))

    def launch_per_seq(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        sinks = sinks_of(inputs)
        for i in range(table.shape[0]):  # each sequence at its own length
            outputs[0][i : i + 1].copy_(
                attend_live(q[i : i + 1], kc, vc, table[i : i + 1], pos[i : i + 1], sinks)
            )

    def launch_decode(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        b, s, h, d = q.shape
        if s != 1 or softcap or sink_arg is not None:
            return launch_live(inputs, outputs, scratch)
        block_size, hkv = kc.shape[1], kc.shape[2]
        rep = h // hkv
        out = outputs[0]
        for i, (p,) in enumerate(pos.tolist()):  # each sequence at its own length
            hi = p + 1  # keys [lo, hi) are visible to the query at p
            lo = max(0, p - window + 1) if window else 0
            if chunk:
                lo = p // chunk * chunk
            first, last = lo // block_size, -(-hi // block_size)
            rows = table[i, first:last]
            base = first * block_size
            k = kc.index_select(0, rows).view(-1, hkv, d)[lo - base : hi - base]  # [T, Hkv, Dh]
            v = vc.index_select(0, rows).view(-1, hkv, d)[lo - base : hi - base]
            qi = q[i].view(hkv, rep, d)  # the query heads of kv head g are rows g * rep ..
            if k.dtype != torch.float32:
                qi, k, v = qi.float(), k.float(), v.float()
            p_ = (torch.bmm(qi, k.permute(1, 2, 0)) * scale).softmax(-1)  # [Hkv, rep, T]
            o = out[i].view(hkv, rep, d)
            if o.dtype == torch.float32:
                torch.bmm(p_, v.transpose(0, 1), out=o)
            else:
                o.copy_(torch.bmm(p_, v.transpose(0, 1)))

    launch = {"table": launch_table, "live": launch_live, "per_seq": launch_per_seq, "decode": launch_decode}[
        read
    ]
    return _threaded(launch, config.get("threads", 0))
