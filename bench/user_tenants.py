#!/usr/bin/env python
"""Which tenants hold a person: ``Store.user_tenants`` (one seek of the scope index per tenant)
against what a Discord ``forgetme`` did before, every (tenant, user)'s counts read with
``Store.users(None)`` and filtered. A SQLite store of ``--size`` memories spread over ``--users``
people in ``--tenants`` tenants (servers), random vectors; each read timed ``--repeat`` times.

Usage:  python bench/user_tenants.py [--size 200000] [--users 50000] [--tenants 300] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from _common import machine_info, now_iso, write_json

from narrmem import Memory, load_settings
from narrmem.models import MemoryRecord

CHUNK = 5000


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with tempfile.TemporaryDirectory(prefix="narrmem-tenants-") as tmp:
        async with Memory.open(Path(tmp) / "m", settings=load_settings()) as mem:
            store = mem.store
            dim = store.dim
            for start in range(0, args.size, CHUNK):
                n = min(CHUNK, args.size - start)
                users = rng.integers(0, args.users, n)
                records = [
                    MemoryRecord(
                        tenant=str(10**17 + int(u) % args.tenants),
                        user_id=str(10**17 + int(u)),
                        chat_id="c",
                        text=f"message {start + i}",
                        created_at=t0 + timedelta(seconds=start + i),
                        stored_at=t0 + timedelta(seconds=start + i),
                        message_ids=[f"m{start + i}"],
                    )
                    for i, u in enumerate(users)
                ]
                vectors = rng.standard_normal((n, dim)).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                await store.add(records, vectors)
            person = str(10**17 + 42)
            before, after = [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                held = await store.users(None, limit=10_000_000)
                old = {u["tenant"] for u in held if u["user_id"] == person}
                before.append(time.perf_counter() - start)
                start = time.perf_counter()
                new = set(await store.user_tenants([person]))
                after.append(time.perf_counter() - start)
            assert old == new, (old, new)
    return {
        "when": now_iso(),
        "machine": machine_info(),
        "size": args.size,
        "users": args.users,
        "tenants": args.tenants,
        "users_read_then_filtered_s": round(statistics.median(before), 4),
        "user_tenants_s": round(statistics.median(after), 5),
        "tenants_found": len(new),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--tenants", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    report = asyncio.run(main(arguments))
    print(
        f"{report['size']:,} memories, {report['users']:,} people in {report['tenants']} tenants: "
        f"users() read and filtered {report['users_read_then_filtered_s']} s, "
        f"user_tenants {report['user_tenants_s']} s ({report['tenants_found']} tenants)"
    )
    if arguments.out:
        write_json(arguments.out, report)
