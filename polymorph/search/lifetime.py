"""A tune's processes do not outlive it, and a rerun takes back what a killed run held.

`die_with_parent` is the first thing a tune worker does: PR_SET_PDEATHSIG(SIGKILL), so `kill -9` of the
tune kills its workers too (and with them the resource tracker, which exits when the last process
holding its pipe is gone). A worker's name carries the tune's pid (`worker_name`), so a rerun on the same
board can hand back at once the claims of workers whose tune is dead (`dead_run_worker`) instead of
waiting for their leases to run out.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_NAME = re.compile(r"worker-(?P<bucket>.+)-(?P<tune>[0-9]+)-(?P<n>[0-9]+)")


def die_with_parent(parent: int) -> None:
    """Be killed (SIGKILL) when the thread that started this process exits; exit now if `parent`
    is gone already (it died between starting this process and this call). Linux only; elsewhere
    nothing. The signal follows the starting *thread*: a tune starts its workers from the thread that
    also joins them, so they never outlive it by design."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # reparented already: the death signal will never come
        os._exit(1)


def worker_name(bucket: str, n: int) -> str:
    """The board's name for this tune's `n`th worker of `bucket`: it carries this process's pid."""
    return f"worker-{bucket}-{os.getpid()}-{n}"


def dead_run_worker(worker: str) -> bool:
    """Whether `worker` is a tune worker whose tune process is gone (its claims can go back at once:
    the worker died with it). A reused pid only makes this False: the lease then runs out as usual."""
    m = _NAME.fullmatch(worker or "")
    if m is None:
        return False
    pid = int(m["tune"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
