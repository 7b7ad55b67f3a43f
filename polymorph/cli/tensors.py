"""`polymorph run FILE.pt2 --inputs IN.npz --outputs OUT.npz` and `polymorph verify FILE.pt2`: the
CLI side of polymorph/frontend/tensors.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from polymorph.cli import console
from polymorph.errors import CheckFailed, UserError


def is_program(model: str) -> bool:
    return str(model).endswith(".pt2")


def _load(args: argparse.Namespace):  # -> ExportedModel
    from polymorph.frontend import load_pt2

    return load_pt2(args.model, dtype=args.dtype)


def _read_inputs(path: str) -> dict[str, np.ndarray]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"no such file: {path}; --inputs takes an .npz file (numpy.savez)")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as e:
        raise UserError(f"{path}: not an .npz file ({type(e).__name__}: {e})") from None


def cmd_run_program(args: argparse.Namespace) -> int:
    from polymorph.frontend.tensors import bind_program, run_on

    if not is_program(args.model):
        raise UserError(f"--inputs/--outputs run a torch.export .pt2 file; {args.model} is not one")
    if args.inputs is None or args.outputs is None:
        raise UserError("running a .pt2 file takes --inputs IN.npz and --outputs OUT.npz")
    out = Path(args.outputs)
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; give another --outputs or --force to overwrite it")
    model, inputs = bind_program(_load(args), _read_inputs(args.inputs))  # a dynamic program at their shapes
    results = run_on(model, inputs, args.backend)
    names = list(model.graph.outputs)
    with open(out, "wb") as f:  # np.savez would add .npz to a name without it
        np.savez(f, **{name: results[name] for name in names})
    shapes = ", ".join(f"{n} {list(results[n].shape)} {results[n].dtype}" for n in names)
    console.line(f"wrote {out}: {shapes}")
    return 0


def cmd_verify_program(args: argparse.Namespace) -> int:
    from polymorph.frontend.tensors import verify_program
    from polymorph.knobs import knobs

    backend = args.backend or knobs.backend
    model = _load(args)
    given = _read_inputs(args.inputs) if getattr(args, "inputs", None) else None
    checks = verify_program(model, backend, inputs=given, seed=args.seed)
    rows = [
        (c.name, "ok" if c.comparison.ok else "MISMATCH", f"{c.comparison.max_abs:.3g}",
         f"{c.comparison.mismatched}/{c.comparison.total}")
        for c in checks
    ]  # fmt: skip
    tol = checks[0].tolerance
    console.table(
        f"verify {model.name} on {backend} against the program run by PyTorch (rtol {tol.rtol}, atol {tol.atol})",
        ["output", "result", "max abs err", "out of tolerance"],
        rows,
    )
    bad = next((c for c in checks if not c.comparison.ok), None)
    if bad is not None:
        raise CheckFailed(f"{model.name} on {backend}: {bad.name}: {bad.comparison}")
    console.line(f"{model.name} on {backend}: every output matches PyTorch")
    return 0


def buckets_note(model: str, dtype: str | None = None) -> str | None:
    """For a program with dynamic dims, one line naming its buckets (an engine holds one of them; `tune`
    gates at each); None for anything else."""
    from polymorph.frontend import load_pt2
    from polymorph.search.registry import program_bucket

    file = str(model).rsplit("@", 1)[0] if ".pt2@" in str(model) else str(model)  # FILE.pt2[@bucket]
    if not is_program(file):
        return None
    program = load_pt2(file, dtype=dtype)
    if not program.dims:
        return None
    ids = [program_bucket(tuple(program.at_sizes(s).input_shapes().values())) for s in program.bucket_sizes()]
    ranges = ", ".join(d.describe() for d in program.dims)
    return (
        f"{file} has dynamic dims ({ranges}): its buckets are {', '.join(ids)}; an engine holds one "
        f"(`polymorph engine start {file}@{ids[-1]}`), `polymorph tune {file}` gates at each"
    )
