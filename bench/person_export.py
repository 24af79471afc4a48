"""A person's own export (``narrmem export --user``) of a heavy user: how long it takes and how
much memory the process takes while it runs, against the whole store's export of the same store.

    python bench/person_export.py --size 100000

The store is filled directly (``Store.add``, random vectors, a keyword context of others' words on
each memory, as a group's turns carry): the export reads memories, it does not embed them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from narrmem.doors.person_export import export_person
from narrmem.doors.transfer import export_store
from narrmem.models import MemoryRecord
from narrmem.testing import open_memory

BATCH = 5000


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def fill(folder: Path, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    context = "Monday 2 March 2026\n" + ('bob said, "' + "and then we went to the market " * 8 + '"\n') * 3
    async with open_memory(folder) as memory:
        for first in range(0, size, BATCH):
            records = [
                MemoryRecord(
                    user_id="ann",
                    chat_id="dm-ann",
                    text=f"memory number {i}: " + "I told you about the garden and the bees " * 4,
                    context_text=context,
                    created_at=start + timedelta(minutes=i),
                    message_ids=[f"m{i}"],
                    meta={"layer": "accumulate"},
                )
                for i in range(first, min(size, first + BATCH))
            ]
            vectors = rng.random((len(records), memory.embedder.dim), dtype=np.float32)
            await memory.store.add(records, vectors)


async def export(folder: Path, which: str, out: Path) -> dict[str, float]:
    """The export timed, then run again under tracemalloc for the most the export's own Python
    objects took at once (the process's resident peak is the open's: the vector index)."""
    async with open_memory(folder, read_only=True) as memory:

        async def run() -> None:
            if which == "person":
                await export_person(memory, out, tenant="default", user_id="ann")
            else:
                await export_store(memory, out)

        began = time.perf_counter()
        await run()
        took = round(time.perf_counter() - began, 2)
        tracemalloc.start()
        try:
            await run()
            peak = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        return {"seconds": took, "held_peak_mib": round(peak, 1), "rss_peak_mib": round(_peak_mib())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--export", choices=["person", "store"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:  # one export, in a process of its own (its peak memory is its own)
        print(json.dumps(asyncio.run(export(args.folder, args.export, args.folder / f"{args.export}.jsonl"))))
        return
    import subprocess

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "store"
        asyncio.run(fill(folder, args.size, args.seed))
        figures = {}
        for which in ("person", "store"):
            done = subprocess.run(
                [sys.executable, __file__, "--export", which, "--folder", str(folder)],
                capture_output=True,
                text=True,
                check=True,
            )
            figures[which] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"one person's {args.size:,} memories:")
    for which, got in figures.items():
        print(
            f"  {which:6}  {got['seconds']:6.1f} s   held at most {got['held_peak_mib']:7.1f} MiB of Python "
            f"objects (the process's peak, the open's included: {got['rss_peak_mib']} MiB)"
        )


if __name__ == "__main__":
    main()
