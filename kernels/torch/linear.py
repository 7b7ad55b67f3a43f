"""x[*, K] @ w[N, K]^T (+ bias) and batched matmul, through torch's CPU GEMM (oneDNN / MKL)."""

import torch

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = ("linear", "matmul")
# weight_layout "nk" uses the checkpoint layout as is; "kn" stores the transpose once at build time
# so the GEMM streams the weight row-major: a real choice on CPU, where one or the other wins by shape.
# compute "f32" runs a bf16/f16 projection as an f32 GEMM on an f32 copy of the weight made once (the
# output rounded once), for CPUs whose half-precision GEMM is slow; it changes nothing at f32.
# epilogue "copy" makes the product and copies it into the output; "out" has the GEMM write the output
# buffer itself (f32 outputs; one dispatch and one pass over the output less). threads: 0 keeps the
# executable's thread count, n runs the GEMM on n threads (torch's count is per process: restored after).
CONFIGS = [
    {"weight_layout": "nk", "compute": "native", "epilogue": "copy", "threads": 0},
    {"weight_layout": "kn", "compute": "native", "epilogue": "copy", "threads": 0},
    {"weight_layout": "nk", "compute": "f32", "epilogue": "copy", "threads": 0},
    {"weight_layout": "kn", "compute": "f32", "epilogue": "copy", "threads": 0},
    {"weight_layout": "nk", "compute": "native", "epilogue": "out", "threads": 0},
    {"weight_layout": "kn", "compute": "native", "epilogue": "out", "threads": 0},
    {"weight_layout": "kn", "compute": "native", "epilogue": "out", "threads": 2},
]


def supports(spec):
    return len(spec.nodes) == 1 and spec.types[spec.single.outputs[0]].dtype.is_float


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    if node.op == "matmul":

        def launch_matmul(inputs, outputs, scratch):
            torch.matmul(inputs[args[0]], inputs[args[1]], out=outputs[0])

        return launch_matmul

    prepared = {}
    kn = config["weight_layout"] == "kn"

    def weight(w, f32):
        """The weight as the GEMM takes it: transposed for "kn", f32 for "compute: f32"; made once.
        Keyed by storage and version: a weight changed in place (a test, a hot swap) is re-read."""
        if not (kn or f32):
            return w
        key = (w.data_ptr(), w._version, f32)
        if key not in prepared:
            prepared.clear()
            v = w.float() if f32 else w
            prepared[key] = (w, v.t().contiguous() if kn else v.contiguous())
        return prepared[key][1]

    direct = config.get("epilogue") == "out"

    def launch(inputs, outputs, scratch):
        x, w = inputs[args[0]], inputs[args[1]]
        bias = inputs[args[2]] if len(args) == 3 else None
        f32 = config.get("compute") == "f32" and x.dtype != torch.float32
        if f32:
            x = x.float()
            bias = None if bias is None else bias.float()
        wt = weight(w, f32)
        out = outputs[0]
        if direct and out.dtype == x.dtype == wt.dtype and out.is_contiguous():
            rows = x.reshape(-1, x.shape[-1])  # [M, K]
            flat = out.view(-1, out.shape[-1])  # [M, N], the output's own storage
            mat = wt if kn else wt.t()  # [K, N]
            if bias is None:
                torch.mm(rows, mat, out=flat)
            else:
                torch.addmm(bias, rows, mat, out=flat)
            return
        if kn and bias is not None:  # one rounding of x @ w + bias, as the reference's single op has
            y = torch.addmm(bias, x.reshape(-1, x.shape[-1]), wt).reshape(*x.shape[:-1], wt.shape[-1])
        elif kn:
            y = torch.matmul(x, wt)  # [*, K] @ [K, N]
        else:
            y = torch.nn.functional.linear(x, wt, bias)
        out.copy_(y)

    return _threaded(launch, config.get("threads", 0))


# A launch on a chosen number of threads (config key `threads`; 0: the process's count).
_threaded = depend(
    "torch/_threads.py", "cb577c022de0be2c6e1d752dd5ed81cb037174661c4119fd34d8fe4918676329"
).threaded
