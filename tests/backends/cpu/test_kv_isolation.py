"""The paged KV cache keeps sequences apart, on the cpu executable and on the reference engine.

- Sequences decoded together in one ragged batch give the logits each gives decoded alone.
- No step writes outside the slots of its own tokens: the guard block 0, every block no sequence owns,
  and the unwritten tail of each sequence's last block stay exactly zero.
- A sequence that inherits the blocks of a released one (stale keys and values still in them)
  decodes as it does in a fresh cache.

Blocks are 4 tokens, so sequences cross block boundaries every few steps and their blocks interleave
in the pool (PagedKVCache hands them out from the top down).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from polymorph import api
from polymorph.models import Model, load_model
from polymorph.pipeline.backend import Executable
from polymorph.serving.kvcache import GUARD_BLOCK
from polymorph.serving.session import ReferenceExecutable, Session
from polymorph.verify.tolerance import compare, model_tolerance

BLOCK = 4
ENGINES = ["cpu", "reference"]


@pytest.fixture(scope="module", params=["llama-tiny", "qwen3-moe-tiny"])
def model(request: pytest.FixtureRequest) -> Model:
    return load_model(request.param, block_size=BLOCK)


@pytest.fixture(scope="module")
def artifacts(model: Model):
    return api.compile(model, "cpu")


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, model: Model, artifacts) -> Executable:
    if request.param == "reference":
        return ReferenceExecutable(model.graph, model.weights())
    exe = api.load(artifacts, model)
    exe.poison = True  # a kernel that skips a write shows up as NaN, not as stale memory
    return exe


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"token seed {seed}")  # shown when a test fails
    return np.random.default_rng(seed)


def vocab(model: Model) -> int:
    return int(model.graph.params["model.embed_tokens.weight"].shape[0])


def draw(rng: np.random.Generator, model: Model, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab(model), size=n)]


def decode_alone(exe: Executable, model: Model, prompt: list[int], steps: list[int]) -> list[np.ndarray]:
    """Logits [vocab] after the prompt, then after each of `steps` fed one at a time, in a fresh cache."""
    session = Session(exe, model.graph, batch=1, max_ctx=len(prompt) + len(steps))
    out = [session.step([0], np.array([prompt]))[0, -1]]
    for t in steps:
        out.append(session.step([0], np.array([[t]]))[0, -1])
    return out


def assert_close(got: np.ndarray, want: np.ndarray, model: Model, what: str) -> None:
    c = compare(got, want, model_tolerance(model.dtype))
    assert c.ok, f"{what}: {c}"


def written_slots(session: Session, seq: int) -> list[tuple[int, int]]:
    """(block, slot) of every token position `seq` has written."""
    cache = session.cache
    table = cache.block_table([seq])[0]
    return [(int(table[p // BLOCK]), p % BLOCK) for p in range(cache.length(seq))]


def assert_isolated(exe: Executable, session: Session, seqs: list[int]) -> None:
    """Only the slots of written tokens hold data; everything else in the pool is exactly zero."""
    cache = session.cache
    owned = cache.owned_blocks()
    assert GUARD_BLOCK not in owned
    written = np.zeros((cache.cache_blocks, BLOCK), dtype=bool)
    for seq in seqs:
        for block, slot in written_slots(session, seq):
            written[block, slot] = True
    assert {int(b) for b in np.nonzero(written.any(axis=1))[0]} == owned
    for name in exe.graph.state:
        state = exe.read_state(name)  # [cache_blocks, block_size, kv_heads, head_dim]
        assert state.shape[:2] == (cache.cache_blocks, BLOCK), name
        flat = state.reshape(cache.cache_blocks, BLOCK, -1)
        dirty = np.abs(flat).max(axis=-1) != 0  # [cache_blocks, block_size]
        assert not dirty[GUARD_BLOCK].any(), f"{name}: the guard block was written"
        stray = dirty & ~written
        assert not stray.any(), (
            f"{name}: data outside the written slots, at (block, slot) {np.argwhere(stray)[:5].tolist()}"
        )
        # ...and every written slot holds data (keys and values of random tokens are never all zero).
        assert dirty[written].all(), f"{name}: a written token left its slot zero"


def test_batched_decode_matches_each_sequence_alone(
    engine: Executable, model: Model, rng: np.random.Generator
) -> None:
    prompts = {0: draw(rng, model, 9), 1: draw(rng, model, 2), 2: draw(rng, model, 5)}
    steps = 7
    feed = {seq: draw(rng, model, steps) for seq in prompts}
    order = [2, 0, 1]  # block-table rows in another order than the sequences were created

    session = Session(engine, model.graph, batch=3, max_ctx=max(map(len, prompts.values())) + steps)
    together: dict[int, list[np.ndarray]] = {}
    for seq, prompt in prompts.items():
        together[seq] = [session.step([seq], np.array([prompt]))[0, -1]]
    for i in range(steps):
        logits = session.step(order, np.array([[feed[seq][i]] for seq in order]))  # [3, 1, vocab]
        for row, seq in enumerate(order):
            together[seq].append(logits[row, -1])
    assert_isolated(engine, session, order)

    for seq, prompt in prompts.items():
        alone = decode_alone(engine, model, prompt, feed[seq])
        for i, (got, want) in enumerate(zip(together[seq], alone, strict=True)):
            assert_close(got, want, model, f"sequence {seq}, step {i} batched vs alone")


def test_guard_and_unowned_blocks_stay_zero(
    engine: Executable, model: Model, rng: np.random.Generator
) -> None:
    # Room for 4 sequences of 24 tokens; 3 run, to 17, 13 and 22 tokens: many blocks stay unowned.
    session = Session(engine, model.graph, batch=4, max_ctx=24)
    prompts = {0: draw(rng, model, 5), 1: draw(rng, model, 1), 2: draw(rng, model, 10)}
    seqs = list(prompts)
    for seq, prompt in prompts.items():
        session.step([seq], np.array([prompt]))
        assert_isolated(engine, session, seqs)
    for _ in range(12):
        session.step(seqs, np.array([[t] for t in draw(rng, model, len(seqs))]))
        assert_isolated(engine, session, seqs)
    cache = session.cache
    assert [cache.length(s) for s in seqs] == [17, 13, 22]
    unowned = set(range(1, cache.cache_blocks)) - cache.owned_blocks()
    assert len(unowned) >= 6, "the scenario must leave blocks unowned"
    # The pool interleaves: a sequence's blocks are not one contiguous run.
    tables = [cache.block_table([s])[0][: -(-cache.length(s) // BLOCK)] for s in seqs]
    assert any(np.any(np.diff(t) != 1) for t in tables)


def test_a_sequence_on_released_blocks_decodes_right(
    engine: Executable, model: Model, rng: np.random.Generator
) -> None:
    # A tight pool: 2 sequences of up to 16 tokens (8 blocks of 4, plus the guard).
    session = Session(engine, model.graph, batch=2, max_ctx=16)
    cache = session.cache
    old, keep, new = 0, 1, 2
    old_prompt, keep_prompt, new_prompt = draw(rng, model, 11), draw(rng, model, 6), draw(rng, model, 7)
    keep_feed = draw(rng, model, 9)
    session.step([old], np.array([old_prompt]))
    session.step([keep], np.array([keep_prompt]))
    for i in range(4):
        session.step([old, keep], np.array([[t] for t in (*draw(rng, model, 1), keep_feed[i])]))
    old_blocks = {int(b) for b in cache.block_table([old])[0] if b != GUARD_BLOCK}
    assert cache.length(old) == 15 and len(old_blocks) == 4

    cache.release(old)
    assert old_blocks.isdisjoint(cache.owned_blocks())
    stale = engine.read_state(next(iter(engine.graph.state)))
    assert all(np.abs(stale[b]).max() > 0 for b in old_blocks), "released blocks should still hold old keys"

    new_feed = draw(rng, model, 5)
    got = [session.step([new], np.array([new_prompt]))[0, -1]]
    keep_got = []
    for i in range(5):
        logits = session.step([keep, new], np.array([[keep_feed[4 + i]], [new_feed[i]]]))
        keep_got.append(logits[0, -1])
        got.append(logits[1, -1])
    new_blocks = {int(b) for b in cache.block_table([new])[0] if b != GUARD_BLOCK}
    assert cache.length(new) == 12 and len(new_blocks) == 3
    assert new_blocks <= old_blocks, "the new sequence should have inherited the released blocks"

    for i, (g, w) in enumerate(zip(got, decode_alone(engine, model, new_prompt, new_feed), strict=True)):
        assert_close(g, w, model, f"new sequence on re-used blocks, step {i}")
    keep_alone = decode_alone(engine, model, keep_prompt, keep_feed)
    for i, (g, w) in enumerate(zip(keep_got, keep_alone[5:], strict=True)):
        assert_close(g, w, model, f"the sequence running alongside, step {4 + i}")
