"""Mixture of experts: the top-k router (every mode of ops._ROUTER) and the expert FFN (ops._EXPERTS:
SwiGLU or gpt-oss's clamped SwiGLU experts, optional biases, the routing weight on the output or the
input)."""

import torch

IMPLEMENTS = ("topk_router", "moe_ffn")
# "grouped": sort tokens by expert and run one GEMM pair per expert that has tokens;
# "dense": every expert on every token, masked by the routing weights (better at tiny sizes).
CONFIGS = [{"impl": "grouped"}, {"impl": "dense"}]


def supports(spec):
    return len(spec.nodes) == 1


def _topk(x, k):
    # A stable descending sort: ties go to the lower expert index, as the reference defines.
    # (torch.topk on CPU breaks ties toward higher indices.)
    idx = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    return x.gather(-1, idx), idx


def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))  # as the reference writes it: exp(-x) = inf gives 0


def route(logits, bias, attrs):
    """logits[*, E] f32 (, bias[E] f32) -> weights[*, k] f32, indices[*, k] int64 (ops._ROUTER)."""
    mode, k = attrs["mode"], attrs["k"]
    if mode == "topk_softmax":
        vals, idx = _topk(logits, k)
        weights = vals.softmax(-1)
    elif mode == "topk_sigmoid":
        vals, idx = _topk(logits, k)
        weights = _sigmoid(vals)
    elif mode == "softmax_topk":
        weights, idx = _topk(logits.softmax(-1), k)
    else:  # sigmoid_topk
        scores = _sigmoid(logits)
        choice = scores if bias is None else scores + bias
        groups = attrs["groups"]
        if groups > 1:
            e = choice.shape[-1]
            grouped = choice.reshape(*choice.shape[:-1], groups, e // groups)  # [*, G, E/G]
            best2 = _topk(grouped, 2)[0].sum(-1)  # [*, G]
            _, keep = _topk(best2, attrs["topk_groups"] or groups)
            allowed = torch.zeros_like(best2, dtype=torch.bool).scatter_(-1, keep, True)
            choice = choice.masked_fill(~allowed.repeat_interleave(e // groups, dim=-1), float("-inf"))
        _, idx = _topk(choice, k)
        weights = scores.gather(-1, idx)
    if attrs["normalize"] and mode in ("softmax_topk", "sigmoid_topk"):
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * attrs["scaling"], idx


def _act(g, u, attrs):
    """The gated activation of ops._EXPERTS, in f32."""
    if attrs["activation"] == "swiglu_clamp":
        limit = attrs["limit"]
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
        return (u + 1.0) * g * _sigmoid(attrs["alpha"] * g)
    return g * _sigmoid(g) * u


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()

    if node.op == "topk_router":

        def launch_router(inputs, outputs, scratch):
            logits = inputs[args[0]].float()  # [*, E]
            bias = inputs[args[1]].float() if len(args) > 1 else None  # [E]
            weights, idx = route(logits, bias, attrs)
            outputs[0].copy_(weights)
            outputs[1].copy_(idx)

        return launch_router

    weight_input = attrs["weight_input"]

    def expert(h, e, wg, wu, wd, biases):
        """h[N, D] f32 through expert e: [N, D] f32."""
        g, u = h @ wg[e].float().T, h @ wu[e].float().T  # [N, F]
        if biases:
            g, u = g + biases[0][e], u + biases[1][e]
        y = _act(g, u, attrs) @ wd[e].float().T
        return y + biases[2][e] if biases else y

    def launch(inputs, outputs, scratch):
        x, weights, idx, wg, wu, wd = (inputs[i] for i in args[:6])
        biases = [inputs[i].float() for i in args[6:]]  # b_gate[E, F], b_up[E, F], b_down[E, D]
        d = x.shape[-1]
        xt = x.reshape(-1, d).float()  # [T, D]
        wt = weights.reshape(-1, weights.shape[-1]).float()  # [T, k]
        it = idx.reshape(-1, idx.shape[-1]).long()
        out = torch.zeros_like(xt)
        if config["impl"] == "dense":
            for e in range(wg.shape[0]):
                hit = it == e  # [T, k]
                if weight_input:  # the expert is nonlinear in its input: one pass per slot
                    for j in range(it.shape[1]):
                        y = expert(xt * (wt[:, j : j + 1] * hit[:, j : j + 1]), e, wg, wu, wd, biases)
                        out += torch.where(hit[:, j : j + 1], y, 0.0)
                else:
                    gate = (wt * hit).sum(-1, keepdim=True)  # [T, 1]
                    out += torch.where(
                        hit.any(-1, keepdim=True), gate * expert(xt, e, wg, wu, wd, biases), 0.0
                    )
        else:
            for e in torch.unique(it).tolist():
                tok, slot = torch.nonzero(it == e, as_tuple=True)
                w = wt[tok, slot][:, None]  # [N, 1]
                if weight_input:
                    y = expert(xt[tok] * w, e, wg, wu, wd, biases)
                else:
                    y = w * expert(xt[tok], e, wg, wu, wd, biases)
                out.index_add_(0, tok, y)
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
