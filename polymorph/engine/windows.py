"""Sliding-window KV caches in the engine's checks: the blocks a sequence's window has left.

Under a window of W tokens (the op table's `window` of `cache_attention`) the next query of a sequence
at position p sees keys p - W < k <= p, and every later query sees no earlier key: a block whose
positions all lie at or before p - W is no longer owned by its sequence in that layer's cache. A
serving system may hand it to another sequence; a kernel must neither read it (it never loads a block
wholly outside the window) nor write it. The checks treat such a block as released: they fill it with
NaN before the step (a kernel that reads it, or masks it arithmetically, 0 * NaN, shows NaN in its
output) and count any element of it that is not NaN afterwards as a write into a released block (a
guard region). Where one cache is read by a layer without a window, no block is ever released.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def cache_windows(graph: Any) -> dict[str, int]:
    """The graph's KV-cache states that only windowed attention reads, with the widest window that
    reads each (the blocks outside it are released for all of them)."""
    producer = {v: n for n in graph.nodes for v in n.outputs}
    widths: dict[str, list[int]] = {}
    for node in graph.nodes:
        if node.op != "cache_attention":
            continue
        for v in node.inputs[1:3]:  # k_cache, v_cache: a state, or a kv_write of one
            while v not in graph.state and v in producer and producer[v].op == "kv_write":
                v = producer[v].inputs[0]
            if v in graph.state:
                widths.setdefault(v, []).append(int(node.attrs.get("window", 0) or 0))
    return {state: max(w) for state, w in widths.items() if min(w) > 0}


def slid_out(next_position: int, window: int, block_size: int) -> int:
    """How many of a sequence's first blocks hold only positions that no query from `next_position`
    on sees under `window`."""
    return max(0, (next_position - window + 1) // block_size)


def released_blocks(
    tables: np.ndarray,
    next_positions: Iterable[int],
    window: int,
    block_size: int,
    named: np.ndarray | None = None,
) -> set[int]:
    """The physical blocks of the rows of `tables` ([B, ctx_blocks]) that slid out of `window` before
    each row's next query, and that no row still needs (a block named twice, say the guard block
    padding two tables, stays). `named`: how many blocks each row owns (default: every entry)."""
    released: set[int] = set()
    kept: set[int] = set()
    for row, (table, pos) in enumerate(zip(tables, next_positions, strict=True)):
        owned = len(table) if named is None else int(named[row])
        gone = min(slid_out(int(pos), window, block_size), owned)
        released.update(int(b) for b in table[:gone])
        kept.update(int(b) for b in table[gone:owned])
    return released - kept


class ReleasedBlocks:
    """The blocks released in each windowed cache tensor during one verify's steps."""

    def __init__(self, windows: Mapping[str, int], block_size: int) -> None:
        self.windows, self.block_size = dict(windows), block_size
        self.blocks: dict[str, set[int]] = {state: set() for state in windows}

    def before_step(self, cache: Any, seqs: list[int], state: Mapping[str, Any]) -> None:
        """Release, in each windowed cache of `state` (torch tensors by name), the blocks of `seqs`
        that the step's first queries (at each sequence's current length) no longer see: fill them
        with NaN. `cache`: the PagedKVCache of the sequences, before the step reserves its tokens."""
        if not self.windows or not seqs:
            return
        import torch

        tables = cache.block_table(seqs)
        lengths = [cache.length(s) for s in seqs]
        owned = np.array([-(-n // self.block_size) for n in lengths])
        for name, window in self.windows.items():
            new = released_blocks(tables, lengths, window, self.block_size, owned) - self.blocks[name]
            if new:
                t = state[name]
                t[torch.tensor(sorted(new), dtype=torch.long, device=t.device)] = float("nan")
                self.blocks[name] |= new

    def written(self, state: Mapping[str, Any]) -> int:
        """Elements of the released blocks that are not NaN: a kernel wrote into a released block."""
        import torch

        count = 0
        for name, blocks in self.blocks.items():
            if blocks:
                t = state[name]
                held = t[torch.tensor(sorted(blocks), dtype=torch.long, device=t.device)]
                count += int((~torch.isnan(held.float())).sum())
        return count
