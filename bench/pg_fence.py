#!/usr/bin/env python
"""What the fence between workers costs a PostgreSQL worker's ingest.

One ``Memory`` on a private PostgreSQL (``bench/_pgserver.py``) ingests ``--messages`` distinct
stored messages of 50 users one at a time, in blocks of 100 with the fence between workers on and
off alternately (the first two blocks warm up and are not counted), in each ``--modes`` acknowledge
mode. "Off" detaches this worker's side of the fence (``narrmem/fence.py``'s ``workers``), which is
the whole of what the fence adds to ingest; it is not a setting, since a forget must not outlive a
fact another worker is extracting.

Usage:  python bench/pg_fence.py [--messages 1400] [--modes after_hooks on_receipt] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import _pgserver
from _chatgen import ChatGenerator
from _common import machine_info, now_iso, write_json

from narrmem import Memory, load_settings

BLOCK = 100
WARM_BLOCKS = 2
USERS = 50


async def measure(mode: str, messages: int, seed: int) -> dict[str, Any]:
    settings = await _pgserver.fresh_settings(load_settings(storage={"acknowledge": mode}))
    texts = ChatGenerator(seed).unique_contents(messages)
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="narrmem-pg-fence-") as folder:
        async with Memory.open(folder, settings=settings) as memory:
            fence = memory._fence  # the bench switches it: no setting does
            workers = fence.workers
            assert workers is not None, "the PostgreSQL store offers the fence between workers"
            for n, text in enumerate(texts):
                block = n // BLOCK
                arm = "on" if block % 2 == 0 else "off"
                fence.workers = workers if arm == "on" else None
                message = {
                    "message_id": f"m{n}",
                    "text": text,
                    "user_id": f"u{n % USERS}",
                    "chat_id": f"c{n % USERS}",
                    "tenant": "t",
                    "speaker": "Ann",
                    "ts": "2026-12-04T10:00:00+00:00",
                }
                start = time.perf_counter()
                result = await memory.ingest(message)
                elapsed = time.perf_counter() - start
                if block >= WARM_BLOCKS and result.stored:
                    seconds[arm].append(elapsed)
                if n % BLOCK == BLOCK - 1:
                    await memory.settle()  # the next block starts with nothing in flight
            fence.workers = workers
    return {arm: _summary(values) for arm, values in seconds.items()}


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values) * 1e3, 3),
        "p95_ms": round(statistics.quantiles(values, n=20)[18] * 1e3, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=14 * BLOCK)
    parser.add_argument("--modes", nargs="+", default=["after_hooks", "after_write", "on_receipt"])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args()
    results = {mode: asyncio.run(measure(mode, args.messages, args.seed)) for mode in args.modes}
    for mode, arms in results.items():
        on, off = arms["on"], arms["off"]
        print(
            f"{mode:12s} ingest p50 with the fence {on['p50_ms']:.2f} ms, without {off['p50_ms']:.2f} ms "
            f"(p95 {on['p95_ms']:.2f} / {off['p95_ms']:.2f}; {on['n']} / {off['n']} messages)"
        )
    if args.out:
        report = {"benchmark": "pg_fence", "date": now_iso(), "machine": machine_info(), "modes": results}
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    raise SystemExit(main())
