"""DeepSeek-V3.2's sparse attention: the indexer's top-k over the paged indexer cache, and attention
over only the positions it selected, in float32.

indexer_topk: scores[B, S, T] = sum_h weights * relu(scale q_h . k_t) over the keys gathered from the
blocks of the block table up to the last query's position (a host read of the positions, free on cpu),
-inf past each query's own position; signed zeros are made +0 (a sum of w * 0 may be -0, and an exact
ordering would put it below +0). The k best come first, ties to the lower position, -1 past the
visible ones.

index_attention: each query sees the positions of its row of `selected` that lie in [0, its own
position] (-1 and any other position outside: none; a position listed twice counts once). k_cache and
v_cache may be the same tensor (DeepSeek's latent cache), read once then. A slot no query sees may hold
anything (NaN included): its scores are masked to -inf and its value rows zeroed before P·V, since
0 * NaN is NaN.
"""

import torch

IMPLEMENTS = ("indexer_topk", "index_attention")
# select (indexer_topk): "topk" runs torch.topk on exact int64 keys (the score's order-preserving bits,
# then the position reversed, so no two keys tie and the lower position wins a tie of scores; torch.topk
# on floats breaks ties either way); "sort" takes a stable descending sort of the whole row.
# read (index_attention): "slots" gathers each query's selected slots ([B, S, k] rows of the cache;
# cheap for a decode step at a long context); "table" gathers every block of the block table once and
# masks the positions a query did not select (a prefill, where queries share most of their keys).
CONFIGS = [
    {"select": "topk", "read": "slots"},
    {"select": "sort", "read": "table"},
]

# the attrs this file implements (an attr added to an op later is refused until it is)
_ATTRS = {"indexer_topk": {"k", "scale"}, "index_attention": {"scale"}}


def supports(spec):
    return len(spec.nodes) == 1 and set(spec.attrs()) <= _ATTRS.get(spec.single.op, set())


def _order_keys(scores):
    """scores[..., T] f32 (no NaN, no -0) -> int64 keys in the same order, distinct: larger for a larger
    score, and for the lower position of two equal scores."""
    bits = scores.view(torch.int32).long()
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: larger bits are smaller
    t = torch.arange(scores.shape[-1], dtype=torch.int64)
    return ordered * (1 << 32) + (scores.shape[-1] - 1 - t)


def _index_topk(q, kc, w, table, pos, k, scale, select):
    # q: [B, S, H, D], kc: [blocks, bs, 1, D], w: [B, S, H], table: [B, C], pos: [B, S] -> [B, S, k]
    b, s = pos.shape
    bs, d = kc.shape[1], kc.shape[3]
    n = min(table.shape[1], int(pos.max()) // bs + 1)  # blocks up to the last query's position
    keys = kc.index_select(0, table[:, :n].reshape(-1).long()).view(b, n * bs, d).float()  # [B, T, D]
    dots = torch.einsum("bshd,btd->bsht", q.float(), keys) * scale
    scores = torch.einsum("bsh,bsht->bst", w.float(), dots.clamp_min(0.0))  # [B, S, T]
    t = torch.arange(n * bs)
    visible = t[None, None, :] <= pos.long()[:, :, None]
    scores = torch.where(visible, scores, float("-inf"))  # NaN of a slot past p (unwritten) goes too
    scores = torch.where(scores == 0, 0.0, scores)  # -0 -> +0
    m = min(k, n * bs)
    if select == "topk":
        idx = torch.topk(_order_keys(scores), m, dim=-1, sorted=True).indices
    else:
        idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :m]
    idx = torch.where(scores.gather(-1, idx) > float("-inf"), idx, -1)
    if m < k:
        idx = torch.cat([idx, idx.new_full((b, s, k - m), -1)], dim=-1)
    return idx


def _seen(sel, pos, n_pos):
    """sel[B, S, k] sorted ascending -> bool [B, S, k]: the entries a query sees (in [0, its position],
    inside the table, and not a repeat of the entry before)."""
    seen = (sel >= 0) & (sel <= pos[:, :, None]) & (sel < n_pos)
    seen[..., 1:] &= sel[..., 1:] != sel[..., :-1]
    return seen


def _index_attention_slots(q, kc, vc, table, pos, sel, scale, shared):
    # q: [B, S, H, Dk], kc: [blocks, bs, Hkv, Dk], vc: [blocks, bs, Hkv, Dv], sel: [B, S, K]
    b, s, h, dk = q.shape
    _, bs, hkv, dv = vc.shape
    n_pos = table.shape[1] * bs
    sel = sel.long().sort(-1).values
    seen = _seen(sel, pos.long(), n_pos)  # [B, S, K]
    t = sel.clamp(0, n_pos - 1)
    blocks = table.long().gather(1, (t // bs).view(b, -1)).view(t.shape)
    slots = blocks * bs + t % bs  # [B, S, K]
    krows = kc.reshape(-1, hkv, dk)[slots].float()  # [B, S, K, Hkv, Dk]
    vrows = krows if shared else vc.reshape(-1, hkv, dv)[slots].float()
    vrows = vrows.masked_fill(~seen[..., None, None], 0.0)
    qg = q.float().view(b, s, hkv, h // hkv, dk)
    scores = torch.einsum("bsgrd,bskgd->bsgrk", qg, krows) * scale  # [B, S, Hkv, rep, K]
    p = scores.masked_fill(~seen[:, :, None, None, :], float("-inf")).softmax(-1)
    out = torch.einsum("bsgrk,bskgd->bsgrd", p, vrows)
    return out.reshape(b, s, h, dv)


def _index_attention_table(q, kc, vc, table, pos, sel, scale, shared):
    b, s, h, dk = q.shape
    _, bs, hkv, dv = vc.shape
    rows = table.reshape(-1).long()
    n_pos = table.shape[1] * bs
    k = kc.index_select(0, rows).view(b, n_pos, hkv, dk).float()  # [B, T, Hkv, Dk] in position order
    v = k if shared else vc.index_select(0, rows).view(b, n_pos, hkv, dv).float()
    sel = sel.long()
    inside = (sel >= 0) & (sel < n_pos)
    chosen = torch.zeros(b, s, n_pos + 1, dtype=torch.bool)  # column n_pos takes what is outside
    chosen.scatter_(2, torch.where(inside, sel, n_pos), True)
    t = torch.arange(n_pos)
    visible = chosen[..., :n_pos] & (t[None, None, :] <= pos.long()[:, :, None])  # [B, S, T]
    v = v.masked_fill(~visible.any(1)[:, :, None, None], 0.0)
    qg = q.float().view(b, s, hkv, h // hkv, dk)
    scores = torch.einsum("bsgrd,btgd->bgrst", qg, k) * scale  # [B, Hkv, rep, S, T]
    p = scores.masked_fill(~visible[:, None, None], float("-inf")).softmax(-1)
    out = torch.einsum("bgrst,btgd->bsgrd", p, v)
    return out.reshape(b, s, h, dv)


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale = attrs["scale"]

    if node.op == "indexer_topk":
        k, select = attrs["k"], config.get("select", "topk")

        def launch_topk(inputs, outputs, scratch):
            q, kc, w, table, pos = (inputs[i] for i in args)
            outputs[0].copy_(_index_topk(q, kc, w, table, pos, k, scale, select))

        return launch_topk

    shared = args[1] == args[2]  # one latent cache for keys and values
    attend = {"slots": _index_attention_slots, "table": _index_attention_table}[config.get("read", "slots")]

    def launch(inputs, outputs, scratch):
        q, kc, vc, table, pos, sel = (inputs[i] for i in args)
        outputs[0].copy_(attend(q, kc, vc, table, pos, sel, scale, shared or kc is vc))

    return launch
