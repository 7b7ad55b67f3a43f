"""The paged KV cache's host-side bookkeeping: block allocation, block tables, positions.

The cache itself is state inside an executable ([cache_blocks, block_size, kv_heads, head_dim] per
layer and per k/v). Block 0 is never allocated: it is the guard block that padded block-table entries
point at, and that no kernel may write. Every other block belongs to at most one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from polymorph.errors import UserError

GUARD_BLOCK = 0


@dataclass
class PagedKVCache:
    block_size: int
    cache_blocks: int
    ctx_blocks: int  # block-table width: the most blocks one sequence may hold
    _free: list[int] = field(default_factory=list)
    _blocks: dict[int, list[int]] = field(default_factory=dict)
    _lengths: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Hand out blocks from the top down, so a sequence's blocks are not simply 1, 2, 3...:
        # kernels that assume contiguous blocks fail the tests instead of passing by luck.
        self._free = list(range(1, self.cache_blocks))

    @classmethod
    def for_batch(cls, batch: int, max_ctx: int, block_size: int) -> PagedKVCache:
        ctx_blocks = -(-max_ctx // block_size)
        return cls(block_size=block_size, cache_blocks=batch * ctx_blocks + 1, ctx_blocks=ctx_blocks)

    def decode_step(self, batch: int, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions [batch, 1], block table) of a decode step at context `ctx` for sequences 0..batch-1,
        each grown to `ctx - 1` tokens first: the shape a measured decode step has."""
        seqs = list(range(batch))
        for seq in seqs:
            if self.length(seq) > ctx - 1:
                raise UserError(
                    f"sequence {seq} already holds {self.length(seq)} tokens, past a {ctx}-token step"
                )
            self.reserve(seq, ctx - 1 - self.length(seq))
        return np.stack([self.reserve(seq, 1) for seq in seqs]), self.block_table(seqs)

    def length(self, seq: int) -> int:
        return self._lengths.get(seq, 0)

    def reserve(self, seq: int, new_tokens: int) -> np.ndarray:
        """Grow `seq` by `new_tokens`; return their absolute positions (int32)."""
        start = self.length(seq)
        end = start + new_tokens
        need = -(-end // self.block_size)
        if need > self.ctx_blocks:
            raise UserError(
                f"sequence {seq} would reach {end} tokens, past the cache's {self.ctx_blocks * self.block_size}; "
                "raise --ctx"
            )
        blocks = self._blocks.setdefault(seq, [])
        while len(blocks) < need:
            if not self._free:
                raise UserError("the KV cache has no free block left; raise --ctx or lower the batch")
            blocks.append(self._free.pop())
        self._lengths[seq] = end
        return np.arange(start, end, dtype=np.int32)

    def release(self, seq: int) -> None:
        self._free.extend(self._blocks.pop(seq, []))
        self._lengths.pop(seq, None)

    def block_table(self, seqs: list[int]) -> np.ndarray:
        """[len(seqs), ctx_blocks] int32; entries past a sequence's blocks point at the guard block."""
        table = np.full((len(seqs), self.ctx_blocks), GUARD_BLOCK, dtype=np.int32)
        for row, seq in enumerate(seqs):
            blocks = self._blocks.get(seq, [])
            table[row, : len(blocks)] = blocks
        return table

    def owned_blocks(self) -> set[int]:
        return {b for blocks in self._blocks.values() for b in blocks}

    def written_slots(self) -> np.ndarray:
        """[cache_blocks, block_size] bool: the slots that hold a token of some sequence. Everything
        else (the guard block, blocks no sequence owns, slots past a sequence's last token) is guard
        region: no kernel may write there."""
        mask = np.zeros((self.cache_blocks, self.block_size), dtype=bool)
        for seq, blocks in self._blocks.items():
            tokens = np.arange(self.length(seq))
            mask[np.asarray(blocks, dtype=np.int64)[tokens // self.block_size], tokens % self.block_size] = (
                True
            )
        return mask
