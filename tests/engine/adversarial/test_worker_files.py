"""What a candidate writes does not outlive its worker (DESIGN.md, Engine): a candidate that leaves a
file where a later worker looks must not find it again from that worker (leaves_file_for_later_worker.py).
Each worker is a copy of the zygote with a folder of its own, wiped at retirement, and its compile
caches (Triton's, Inductor's, polymorph's own: the NEFF cache on neuron) are named inside that folder.
The /dev/shm every copy shares (the zygote's sandbox mounts it private to itself, not to each copy) is
emptied by each copy before it serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polymorph.engine.controller import Controller

HERE = Path(__file__).parent


class Negate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.neg(x) * 3.0


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
        for attempt in range(2):
            swap, report = engine.try_candidate(group, kernel, {"folder": folder, "token": str(tmp_path)})
            assert report is not None, f"try {attempt + 1}: {swap.fault}"
            assert report.ok, [(g.name, g.cause) for g in report.failed()]
            # the accepted candidate stays in its worker: back to stock on a fresh worker, so that the
            # second try's build runs in another copy of the zygote
            engine.reset()
            engine.replace_worker(())
