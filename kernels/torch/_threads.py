"""Shared by the torch kernel files (through `depend`): a launch run on a chosen number of threads."""

import torch


def threaded(launch, threads):
    """`launch` run on `threads` threads, the process's count restored after (torch's is global)."""
    if not threads:
        return launch

    def run(inputs, outputs, scratch):
        before = torch.get_num_threads()
        if before == threads:
            return launch(inputs, outputs, scratch)
        torch.set_num_threads(threads)
        try:
            launch(inputs, outputs, scratch)
        finally:
            torch.set_num_threads(before)

    return run
