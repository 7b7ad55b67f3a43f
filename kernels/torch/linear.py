"""x[*, K] @ w[N, K]^T (+ bias) and batched matmul, through torch's CPU GEMM (oneDNN / MKL)."""

import torch

IMPLEMENTS = ("linear", "matmul")
# weight_layout "nk" uses the checkpoint layout as is; "kn" stores the transpose once at build time
# so the GEMM streams the weight row-major: a real choice on CPU, where one or the other wins by shape.
CONFIGS = [{"weight_layout": "nk"}, {"weight_layout": "kn"}]


def supports(spec):
    return len(spec.nodes) == 1 and spec.types[spec.single.outputs[0]].dtype.is_float


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    if node.op == "matmul":

        def launch_matmul(inputs, outputs, scratch):
            torch.matmul(inputs[args[0]], inputs[args[1]], out=outputs[0])

        return launch_matmul

    transposed = {}

    def launch(inputs, outputs, scratch):
        x, w = inputs[args[0]], inputs[args[1]]
        bias = inputs[args[2]] if len(args) == 3 else None
        if config["weight_layout"] == "kn":
            # Keyed by storage and version: a weight changed in place (a test, a hot swap) is re-read.
            key = (w.data_ptr(), w._version)
            wt = transposed.get(key)
            if wt is None:
                transposed.clear()
                wt = transposed[key] = (w, w.t().contiguous())
            y = torch.matmul(x, wt[1])  # [*, K] @ [K, N]
            if bias is not None:
                y = y + bias
        else:
            y = torch.nn.functional.linear(x, w, bias)
        outputs[0].copy_(y)

    return launch
