#!/usr/bin/env python
"""A retention pass: the people silent for a year, listed (``Memory.inactive_people``, what
``narrmem retention --dry-run`` prints) and forgotten (``Memory.forget_inactive``: each person as a
forget forgets, the files purged once), against what an author would otherwise write, a
``Memory.forget`` per person (each rewriting the whole file), timed on ``--sample`` of them.

A SQLite store of ``--size`` memories of ``--users`` people over two years (each person talks for
two months from a random day), random vectors; the clock at the end of the two years.

Usage:  python bench/retention.py [--size 50000] [--users 10000] [--sample 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from _common import machine_info, now_iso, write_json

from narrmem import ManualClock, Memory, load_settings
from narrmem.models import MemoryRecord

CHUNK = 5000
DAYS = 730
TALKS_FOR_DAYS = 60


async def fill(folder: Path, args: argparse.Namespace, clock: ManualClock) -> None:
    rng = np.random.default_rng(args.seed)
    t0 = clock.now() - timedelta(days=DAYS)
    starts = rng.uniform(0, DAYS - TALKS_FOR_DAYS, args.users)
    async with Memory.open(folder, settings=load_settings(), clock=clock) as mem:
        store = mem.store
        for first in range(0, args.size, CHUNK):
            n = min(CHUNK, args.size - first)
            users = rng.integers(0, args.users, n)
            days = starts[users] + rng.uniform(0, TALKS_FOR_DAYS, n)
            records = [
                MemoryRecord(
                    user_id=f"u{int(u)}",
                    chat_id=f"c{int(u) % 50}",
                    text=f"message {first + i} of person {int(u)} about a thing or two",
                    created_at=t0 + timedelta(days=float(d)),
                    stored_at=t0 + timedelta(days=float(d)),
                    message_ids=[f"m{first + i}"],
                )
                for i, (u, d) in enumerate(zip(users, days, strict=True))
            ]
            vectors = rng.standard_normal((n, store.dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            await store.add(records, vectors)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    clock = ManualClock(datetime(2026, 6, 1, tzinfo=UTC))
    before = clock.now() - timedelta(days=365)
    with tempfile.TemporaryDirectory(prefix="narrmem-retention-") as tmp:
        folder, copy = Path(tmp) / "m", Path(tmp) / "copy"
        await fill(folder, args, clock)
        shutil.copytree(folder, copy)
        async with Memory.open(folder, settings=load_settings(), clock=clock) as mem:
            start = time.perf_counter()
            people: list[dict[str, Any]] = []
            while page := await mem.inactive_people(
                before=before,
                limit=1000,
                after=(people[-1]["tenant"], people[-1]["user_id"]) if people else None,
            ):
                people.extend(page)
            listed_s = time.perf_counter() - start
            start = time.perf_counter()
            counts = await mem.forget_inactive(before=before)
            pass_s = time.perf_counter() - start
            assert counts["people"] == len(people), (counts, len(people))
            assert await mem.inactive_people(before=before) == []
        sample = people[: args.sample]
        async with Memory.open(copy, settings=load_settings(), clock=clock) as mem:
            start = time.perf_counter()
            for person in sample:
                await mem.forget(user_id=person["user_id"], tenant=person["tenant"])
            each_s = (time.perf_counter() - start) / max(len(sample), 1)
    return {
        "when": now_iso(),
        "machine": machine_info(),
        "size": args.size,
        "users": args.users,
        "inactive_people": len(people),
        "inactive_memories": counts["memories"],
        "listed_s": round(listed_s, 3),
        "forget_inactive_s": round(pass_s, 2),
        "forget_inactive_per_person_ms": round(1000 * pass_s / max(len(people), 1), 2),
        "forget_one_by_one_per_person_s": round(each_s, 3),
        "forget_one_by_one_sampled": len(sample),
        "forget_one_by_one_all_estimated_s": round(each_s * len(people), 1),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=20, help="people forgotten one by one, timed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    report = asyncio.run(main(arguments))
    print(
        f"{report['size']:,} memories of {report['users']:,} people: "
        f"{report['inactive_people']:,} silent a year "
        f"({report['inactive_memories']:,} memories) listed in {report['listed_s']} s, forgotten in "
        f"{report['forget_inactive_s']} s ({report['forget_inactive_per_person_ms']} ms a person); "
        f"one Memory.forget each: {report['forget_one_by_one_per_person_s']} s a person "
        f"({report['forget_one_by_one_sampled']} timed; "
        f"{report['forget_one_by_one_all_estimated_s']} s for all, estimated)"
    )
    if arguments.out:
        write_json(arguments.out, report)
