"""Does rounding each TP rank's partial sum to bf16 before the all-reduce make logits drift further
from the f32 truth? The numpy reference engine in bf16 (every op's output rounded once) against the
same with the o and down projections computed as two K-halves (TP=2's row-parallel partials), each
rounded to bf16, summed, rounded; both against the f32 reference on the same weights. CPU only.

    python bench/tp_rounding.py
"""

import numpy as np

from polymorph.ir import reference
from polymorph.ir.dtypes import DType
from polymorph.models import load_model
from polymorph.serving.session import ReferenceExecutable
from polymorph.verify.tolerance import compare, model_tolerance


def main() -> None:
    m16 = load_model("llama-3.2-1b", dtype="bf16")
    w = m16.weights()
    m32 = load_model("llama-3.2-1b", dtype="f32")
    w32 = {k: np.asarray(v, dtype=np.float32) for k, v in w.items()}
    truth_exe = ReferenceExecutable(m32.graph, w32, wide_budget=0)
    plain = ReferenceExecutable(m16.graph, w)
    split = ReferenceExecutable(m16.graph, w)
    row_ids = {id(a) for n, a in split.wide.items() if n.endswith(("o_proj.weight", "down_proj.weight"))}
    orig = reference.REFERENCE["linear"]

    def linear(ins, attrs):
        if id(ins[1]) in row_ids:
            x, wt = reference.f32(ins[0]), ins[1]
            k = x.shape[-1] // 2
            halves = [
                reference.round_to(
                    x[..., i * k : (i + 1) * k] @ wt[:, i * k : (i + 1) * k].T, DType.BF16
                ).astype(np.float32)
                for i in range(2)
            ]
            return [halves[0] + halves[1]]
        return orig(ins, attrs)

    rng = np.random.default_rng(0)
    vocab = int(m16.graph.params["model.embed_tokens.weight"].shape[0])
    for trial in range(4):
        toks = rng.integers(0, vocab, (1, 9), dtype=np.int32)
        inputs = {
            "tokens": toks,
            "positions": np.arange(9, dtype=np.int32)[None],
            "block_table": np.array([[1]], np.int32),
        }
        outs = {}
        for name, exe in (("truth", truth_exe), ("single", plain), ("split", split)):
            exe.allocate_state(2)
            reference.REFERENCE["linear"] = linear if name == "split" else orig
            outs[name] = exe.run(inputs)["logits"][:, -1:]
        reference.REFERENCE["linear"] = orig
        tol = model_tolerance(DType.BF16)
        a, b = compare(outs["single"], outs["truth"], tol), compare(outs["split"], outs["truth"], tol)
        print(
            f"trial {trial}: single {a.mismatched} out, max {a.max_abs:.3f}; split-rounded {b.mismatched} out, max {b.max_abs:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
