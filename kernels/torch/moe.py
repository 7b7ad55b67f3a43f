"""Mixture of experts: the top-k router and the expert FFN (SwiGLU experts)."""

import torch
import torch.nn.functional as F

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


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()

    if node.op == "topk_router":

        def launch_router(inputs, outputs, scratch):
            logits = inputs[args[0]].float()  # [*, E]
            if attrs["mode"] == "topk_softmax":
                vals, idx = _topk(logits, attrs["k"])
                weights = vals.softmax(-1)
            else:
                weights, idx = _topk(logits.softmax(-1), attrs["k"])
                if attrs["normalize"]:
                    weights = weights / weights.sum(-1, keepdim=True)
            outputs[0].copy_(weights)
            outputs[1].copy_(idx)

        return launch_router

    def launch(inputs, outputs, scratch):
        x, weights, idx, wg, wu, wd = (inputs[i] for i in args)
        d = x.shape[-1]
        xt = x.reshape(-1, d).float()  # [T, D]
        wt = weights.reshape(-1, weights.shape[-1]).float()  # [T, k]
        it = idx.reshape(-1, idx.shape[-1]).long()
        out = torch.zeros_like(xt)
        if config["impl"] == "dense":
            for e in range(wg.shape[0]):
                gate = (wt * (it == e)).sum(-1, keepdim=True)  # [T, 1]
                h = F.silu(xt @ wg[e].float().T) * (xt @ wu[e].float().T)
                out += gate * (h @ wd[e].float().T)
        else:
            for e in torch.unique(it).tolist():
                tok, slot = torch.nonzero(it == e, as_tuple=True)
                h = xt[tok]
                act = F.silu(h @ wg[e].float().T) * (h @ wu[e].float().T)
                out.index_add_(0, tok, wt[tok, slot][:, None] * (act @ wd[e].float().T))
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
