"""What a MODEL argument names: a zoo entry, a Hugging Face model directory, or an IR JSON file.

A `Model` knows its graph and where its weights come from; weights are materialized only when a
step needs them (compiling needs the graph alone), after checking that they fit in memory.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from polymorph.errors import UserError
from polymorph.ir import serialize
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.ir.shapes import numel
from polymorph.ir.spec import verify
from polymorph.models.checkpoint import list_checkpoint, load_checkpoint
from polymorph.models.config import ModelConfig, load_config
from polymorph.models.decoder import DEFAULT_BLOCK_SIZE, build_decoder
from polymorph.models.weights import EMBED, HEAD, checkpoint_weights, random_weights, stored_head_differs


def zoo_names() -> list[str]:
    folder = resources.files("polymorph.models") / "configs"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def zoo_config(name: str) -> ModelConfig:
    path = resources.files("polymorph.models") / "configs" / f"{name}.json"
    with resources.as_file(path) as p:
        return load_config(p)


@dataclass
class Model:
    """A model polymorph can compile and run: its graph, and how to get weights for it."""

    name: str
    graph: Graph
    source: str  # what load_model takes to build this model again (zoo name, or absolute path)
    config: ModelConfig | None = None
    checkpoint: Path | None = None
    seed: int = 0
    _weights: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def dtype(self) -> DType:
        return DType.parse(self.graph.meta.get("dtype", "f32"))

    def weight_bytes(self) -> int:
        return sum(numel(t.shape) * t.dtype.itemsize for t in self.graph.params.values())

    def weights(self) -> dict[str, np.ndarray]:
        """The weights by param name, loaded once; UserError if they do not fit in memory."""
        if self._weights is None:
            check_fits(self.name, self.weight_bytes(), self.dtype)
            if self.checkpoint is not None:
                tensors = load_checkpoint(self.checkpoint)
                declared = self.config.dtype if self.config is not None else None
                self._weights = checkpoint_weights(self.graph, tensors, str(self.checkpoint), declared)
            else:
                self._weights = random_weights(self.graph, self.seed)
        return self._weights

    def rebuild(self, *, all_logits: bool = False, num_layers: int | None = None) -> Graph:
        """The same model's graph with other build options (all logits, fewer layers)."""
        if self.config is None:
            raise UserError(f"model `{self.name}` is an IR file; it has no builder to rebuild from")
        return build_decoder(
            self.config,
            name=self.graph.name,
            dtype=self.dtype,
            block_size=int(self.graph.meta.get("block_size", DEFAULT_BLOCK_SIZE)),
            all_logits=all_logits,
            num_layers=num_layers,
        )


def available_memory_bytes() -> int:
    from polymorph.knobs import knobs

    limit = knobs.memory_limit_gb
    if limit is not None:
        return int(limit * 1e9)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(name: str, weight_bytes: int, dtype: DType) -> None:
    have = available_memory_bytes()
    # Weights plus headroom for the reference's float32 activations and a second (backend) copy.
    need = int(weight_bytes * 2.2)
    if need > have:
        raise UserError(
            f"model `{name}` needs about {need / 1e9:.1f} GB here ({weight_bytes / 1e9:.1f} GB of {dtype} "
            f"weights, a backend copy and activations) but this machine has {have / 1e9:.1f} GB available; "
            f"use a smaller model{' or `--dtype bf16`' if dtype.itemsize > 2 else ''}, compile without "
            f"running (`polymorph compile`), or see how it splits over devices (`polymorph plan {name} "
            "--devices 8`)"
        )


def load_model(
    spec: str | Path,
    *,
    dtype: str | DType | None = None,
    all_logits: bool = False,
    block_size: int | None = None,
    seed: int | None = None,
) -> Model:
    """Resolve MODEL: a zoo name, a Hugging Face model directory, or an IR JSON file.

    `dtype` defaults to f32 for zoo and checkpoint models (the checkpoint's own dtype is a choice,
    not a default: numerics checks run at f32 unless asked). A tied config whose checkpoint stores an
    `lm_head.weight` other than its embedding gets its own head, as transformers loads it (the config
    becomes untied). UserError when nothing matches.
    """
    from polymorph.knobs import knobs

    seed = knobs.seed if seed is None else seed
    block_size = knobs.kv_block_size if block_size is None else block_size
    try:
        dt = DType.F32 if dtype is None else (dtype if isinstance(dtype, DType) else DType.parse(str(dtype)))
    except ValueError as e:
        raise UserError(f"--dtype: {e}") from None
    text = str(spec)
    path = Path(text)
    if text in zoo_names():
        cfg, checkpoint, name, source = zoo_config(text), None, text, text
    elif path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"{path}: a model directory needs a config.json (Hugging Face layout)")
        cfg, name, source = load_config(path), path.name, str(path.resolve())
        has_weights = (path / "model.safetensors").exists() or (
            path / "model.safetensors.index.json"
        ).exists()
        checkpoint = path if has_weights else None
        if checkpoint is not None and cfg.tie_word_embeddings and _stores_own_head(checkpoint):
            cfg = dataclasses.replace(cfg, tie_word_embeddings=False)  # as transformers 5 loads it
    elif path.suffix == ".json" and path.is_file():
        graph = serialize.load(path)
        verify(graph)
        return Model(name=graph.name, graph=graph, source=str(path.resolve()), seed=seed)
    elif path.suffix == ".pt2" or ".pt2@" in text:  # a torch.export program (polymorph/frontend/), @ a bucket
        from polymorph.frontend import load_pt2

        return load_pt2(text, dtype=dtype)  # its own dtypes unless asked
    elif _names_a_path(text) and not path.exists():
        raise UserError(
            f"no such file or directory: {text}; MODEL is a zoo name, a Hugging Face model directory, "
            "an IR .json file (`polymorph graph MODEL --json` writes one) or a torch.export .pt2 file"
        )
    elif path.is_file():
        raise UserError(
            f"{text}: MODEL is a file but not an IR .json graph; give a Hugging Face model directory (the "
            "folder holding config.json), an IR .json file or a zoo name"
        )
    else:
        raise UserError(
            f"unknown model `{text}`: not a zoo name, a model directory or an IR .json file; "
            f"zoo models: {', '.join(zoo_names())}"
        )
    graph = build_decoder(cfg, name=name, dtype=dt, block_size=block_size, all_logits=all_logits)
    graph.meta["seed"] = seed
    return Model(name=name, graph=graph, source=source, config=cfg, checkpoint=checkpoint, seed=seed)


def _names_a_path(text: str) -> bool:
    """Whether MODEL text is meant as a path, not a zoo name (none holds a slash or a dot first): it
    holds a slash, ends in .json, or starts with `~` or `.`."""
    return "/" in text or os.sep in text or text.endswith(".json") or text.startswith(("~", "."))


def _stores_own_head(checkpoint: Path) -> bool:
    """Whether a checkpoint of a tied config stores an `lm_head.weight` other than its embedding (read
    only when it stores both: the headers say, then the two tensors are compared)."""
    names = list_checkpoint(checkpoint)
    if HEAD not in names or EMBED not in names:
        return False
    return stored_head_differs(load_checkpoint(checkpoint))
