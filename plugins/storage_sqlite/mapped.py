"""Read-ahead advice for a file FAISS has memory-mapped.

A graph search visits a few thousand scattered vectors; with the kernel's default read-around each
page fault pulls in its neighbours too, and one search maps in most of a 300 MB graph file. Marking
the mapping random keeps what a process holds to what its searches touch. FAISS does not expose
its mapping, so it is found by path in ``/proc/self/maps``; where that or ``madvise`` is missing
(not Linux), nothing is done: the advice only saves memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

from narrmem import logs

log = logs.logger("narrmem.storage_sqlite")


def advise_random(path: Path) -> int:
    """Mark every mapping of ``path`` in this process as randomly accessed; return how many."""
    advice = getattr(mmap, "MADV_RANDOM", None)
    maps = Path("/proc/self/maps")
    if advice is None or not maps.exists():
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    target = os.path.realpath(path)
    advised = 0
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if madvise(start, end - start, advice) == 0:
                advised += 1
            else:
                log.debug("madvise on %s failed: errno %d", target, ctypes.get_errno())
    return advised
