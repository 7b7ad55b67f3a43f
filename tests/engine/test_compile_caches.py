"""A candidate that compiles (torch.compile, Triton) writes its compiler caches only into its own
worker's folder: no cache entry it leaves can be read by a later worker, where the stock kernel or the
next candidate would load it as its own compiled code. The candidate below reports, at build, where
Inductor's and Triton's caches and the temporary folder lie for it; two candidates in turn must each
see folders of their own, none of them the machine's shared defaults."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from polymorph.engine.controller import Controller

REPORTS = """
import json, os, tempfile

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    seen = {"inductor": cache_dir(), "tmp": tempfile.gettempdir(), "triton": os.environ.get("TRITON_CACHE_DIR")}
    raise RuntimeError("CACHES " + json.dumps(seen) + " END")
"""


def test_each_worker_compiles_into_caches_of_its_own(tmp_path: Path) -> None:
    candidate = tmp_path / "reports_caches.py"
    candidate.write_text(REPORTS)
    engine = Controller.start("llama-tiny", "cpu", batch=1, ctx=32)
    try:
        seen = []
        for _ in range(2):
            result = engine.swap("layers.0.mlp.down+residual", candidate, {})
            assert not result.ok
            found = re.search(r"CACHES (\{.*?\}) END", str(result.fault))
            assert found, result.fault
            seen.append(json.loads(found.group(1)))
    finally:
        engine.close()
    shared = tempfile.gettempdir()
    for caches in seen:
        root = Path(caches["tmp"])
        assert root != Path(shared), caches  # a folder of the worker's own, not the machine's /tmp
        for kind in ("inductor", "triton"):
            assert Path(caches[kind]).is_relative_to(root), caches
    assert seen[0]["inductor"] != seen[1]["inductor"], seen  # the second candidate's worker is another
