"""What a candidate writes does not outlive its worker (DESIGN.md, Engine): a candidate that leaves a
file in the folder its environment names as polymorph's compile cache must not find it again from a
later worker (leaves_file_for_later_worker.py). Each worker is a copy of the zygote with a folder of
its own, wiped at retirement; the compile cache a copy inherits from the zygote's environment
(POLYMORPH_CACHE_DIR) is the zygote's, which is neither re-pointed at the copy's folder nor wiped, so
the file is there for the next worker: on neuron, where that folder holds the NEFF cache, a place to
plant a compiled artifact for a later worker's stock kernel. So is the /dev/shm every copy shares (the
zygote's sandbox mounts it private to itself, not to each copy), unwiped too. The fix is the engine's (worker.py's
fork and pool.py's wipe, outside these tests' remit): until it lands, this test is an expected
failure, strict, so that it says when it is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polymorph.engine.controller import Controller
from polymorph.engine.wire import EngineError

HERE = Path(__file__).parent


class Negate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.neg(x) * 3.0


@pytest.mark.xfail(
    strict=True,
    raises=EngineError,  # the next worker's build of the accepted candidate finds the file and raises
    reason="workers forked from the zygote share its POLYMORPH_CACHE_DIR (zygote/cache) and its private "
    "/dev/shm, and neither is wiped between workers",
)
@pytest.mark.parametrize("folder", ["cache", "shm"])
def test_a_file_left_by_one_worker_is_gone_for_the_next(tmp_path: Path, folder: str) -> None:
    from polymorph.knobs import knobs

    if folder == "shm" and not knobs.sandbox:
        pytest.skip("without the sandbox /dev/shm is the host's: no worker has one of its own")
    path = tmp_path / "negate.pt2"
    torch.export.save(torch.export.export(Negate(), (torch.randn(4, 16),), strict=False), str(path))
    kernel = str(HERE / "leaves_file_for_later_worker.py")
    with Controller.start(str(path), "cpu") as engine:
        (group,) = engine.groups()
        for attempt in range(2):  # each try retires its worker; the second runs in a fresh one
            swap, report = engine.try_candidate(group, kernel, {"folder": folder})
            assert report is not None, f"try {attempt + 1}: {swap.fault}"
            assert report.ok, [(g.name, g.cause) for g in report.failed()]
