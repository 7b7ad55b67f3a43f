"""The first test a new backend passes: compile llama-tiny, run a few greedy tokens, match the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polymorph import api
from polymorph.models import load_model
from polymorph.pipeline.backend import registry
from polymorph.serving.session import ReferenceExecutable, Sampler, generate


@pytest.mark.parametrize("backend", registry.names())
def test_tiny_llama_runs_like_the_reference(backend: str) -> None:
    b = registry.get(backend)
    probe = b.probe()
    if not probe.run.ok:
        pytest.skip(f"{backend} cannot run here: {probe.run.reason}")
    model = load_model("llama-tiny")
    exe = api.load(api.compile(model, backend), model)
    prompt = [int(t) for t in np.random.default_rng().integers(0, 256, size=5)]
    got = generate(exe, model.graph, prompt, 4, Sampler())
    want = generate(ReferenceExecutable(model.graph, model.weights()), model.graph, prompt, 4, Sampler())
    assert got.tokens == want.tokens
