#!/usr/bin/env python
"""What a user's forget costs on a large store, with and without the rewrite of the SQLite file;
and what a deletion of ``--deleted`` messages of one chat costs, with and without the marks a
forget leaves (``[storage] forget_marks_kept_s``, :mod:`narrmem.forget_marks`).

A store of ``--size`` memories is filled once with ``bench/ab.py``'s bulk fill (the speed
benchmark's seeded people, texts and vectors); for each setting of ``[storage]
forget_rewrites_file`` a copy of it is opened and ``--users`` typical users are forgotten one after
another, each timed (``Memory.forget`` from call to return: the deletes, every plugin's scrub,
the keyword index's merge, then the file's rewrite or the incremental vacuum).

Usage:  python bench/forget_cost.py [--size 100000] [--users 3] [--deleted 100]
                                   [--out bench/results/forget-cost.json]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import machine_info, now_iso, write_json
from ab import fill_store

from narrmem import Memory, load_settings
from narrmem.clock import ManualClock


async def forget_times(folder: Path, users: list[str], rewrite: bool) -> list[float]:
    settings = load_settings(storage={"forget_rewrites_file": rewrite})
    seconds = []
    async with Memory.open(folder, settings=settings) as mem:
        for user in users:
            start = time.perf_counter()
            await mem.forget(user_id=user)
            seconds.append(round(time.perf_counter() - start, 3))
    return seconds


async def deletion_times(folder: Path, marks: bool, n_messages: int, rounds: int) -> list[float]:
    """Each round: ``forget_messages`` of ``n_messages`` stored messages of the chat with most;
    with marks, last, the deletion of every mark once expired (a week later by the clock)."""
    kept_s = 604_800.0 if marks else 0.0
    settings = load_settings(storage={"forget_marks_kept_s": kept_s})
    clock = ManualClock(datetime.now(UTC))
    seconds = []
    async with Memory.open(folder, settings=settings, clock=clock) as mem:
        async with mem.store.sql() as db:
            [(tenant, chat_id)] = await db.fetchall(
                "SELECT tenant, chat_id FROM memory_sources GROUP BY tenant, chat_id "
                "ORDER BY COUNT(*) DESC, chat_id LIMIT 1"
            )
            rows = await db.fetchall(
                "SELECT message_id FROM memory_sources WHERE tenant = ? AND chat_id = ? ORDER BY message_id",
                (tenant, chat_id),
            )
        ids = [str(message_id) for (message_id,) in rows]
        for n in range(rounds):
            batch = ids[n * n_messages : (n + 1) * n_messages]
            start = time.perf_counter()
            await mem.forget_messages(chat_id=chat_id, message_ids=batch, tenant=tenant)
            seconds.append(round(time.perf_counter() - start, 4))
        if marks:
            clock.advance(seconds=kept_s + 1)
            start = time.perf_counter()
            purged = await mem.forget_marks.purge_expired()
            seconds.append(round(time.perf_counter() - start, 4))
            assert purged == n_messages * rounds, purged
    return seconds


async def run(size: int, n_users: int, seed: int, n_deleted: int = 100) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="narrmem-forget-") as work:
        source = Path(work) / "store"
        filled = await fill_store(source, size, seed)
        store_bytes = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        users = [f"u{n:05d}" for n in range(42, 42 + 31 * n_users, 31)]
        results: dict[str, Any] = {}
        for rewrite in (True, False):
            copy = Path(work) / f"copy-{rewrite}"
            shutil.copytree(source, copy)
            results["rewrite" if rewrite else "no_rewrite"] = await forget_times(copy, users, rewrite)
            shutil.rmtree(copy)
        for marks in (True, False):
            copy = Path(work) / f"copy-marks-{marks}"
            shutil.copytree(source, copy)
            name = f"deleting {n_deleted}, " + ("marks (then purge)" if marks else "no marks")
            results[name] = await deletion_times(copy, marks, n_deleted, rounds=3)
            shutil.rmtree(copy)
    return {"store": {**filled, "bytes": store_bytes}, "users": users, "seconds": results}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=100_000, help="memories in the store")
    parser.add_argument("--users", type=int, default=3, help="typical users forgotten one after another")
    parser.add_argument("--deleted", type=int, default=100, help="messages of one chat deleted at once")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args()
    results = asyncio.run(run(args.size, args.users, args.seed, args.deleted))
    report = {"benchmark": "forget_cost", "date": now_iso(), "machine": machine_info(), **results}
    for name, seconds in results["seconds"].items():
        print(f"{name:24s} forget seconds: {', '.join(f'{s:.3f}' for s in seconds)}")
    print(f"store: {results['store']['records']:,} memories, {results['store']['bytes'] / 1e6:.0f} MB")
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    raise SystemExit(main())
