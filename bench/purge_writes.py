#!/usr/bin/env python
"""What a purge of deleted messages costs the messages that arrive while it runs, on a store whose
keyword search is on tantivy (a heavy user's store, ``storage.keyword_index = "tantivy"``).

A store of ``--size`` memories is filled once with ``bench/ab.py``'s bulk fill (the speed
benchmark's seeded people, texts and vectors) and opened with the tantivy index (built on that
first open). Then one stored message is deleted with ``purge_deleted_messages_after_s = 0``, so the
purge starts at once, and messages are ingested one after another, as a bot's traffic, until it
ends: each ingest is timed from call to return. The purge's parts are timed too (the tantivy
rebuild, the rest in the write turn). Reported: how long the purge ran, how many messages were
stored meanwhile, and their latency (p50, p95, max), beside the same ingests with no purge.

Usage:  python bench/purge_writes.py [--size 100000] [--samples 30]
                                    [--out bench/results/purge-writes.json]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _chatgen import ChatGenerator
from _common import latency_summary, machine_info, now_iso, write_json
from ab import fill_store

from narrmem import Memory, load_settings

SETTINGS = {"storage": {"keyword_index": "tantivy", "purge_deleted_messages_after_s": 0}}


def timed_parts(store: Any, parts: dict[str, list[float]]) -> None:
    """Time each purge method the store has (wrapped on the instance)."""
    for name in ("purge_deleted", "purge_alongside_writes", "purge_in_turn"):
        method = getattr(store, name, None)
        if method is None:
            continue

        async def timed(method: Any = method, name: str = name) -> None:
            start = time.perf_counter()
            try:
                await method()
            finally:
                parts.setdefault(name, []).append(time.perf_counter() - start)

        setattr(store, name, timed)


async def run(folder: Path, samples: int, seed: int) -> dict[str, Any]:
    from speed import Population

    pop = Population(gen=ChatGenerator(seed + 1), people=ChatGenerator(seed).people(500), heavy_share=0.2)
    pop._next = 10_000_000  # message ids the fill never gave
    pop._clock = 1e7  # after the fill's messages

    def message() -> Any:
        return pop.message(pop.gen.content(), person=pop.heavy, prefix="purge-bench")

    async with Memory.open(folder, settings=load_settings(**SETTINGS)) as mem:
        await mem.embedder.embed(["warm up the model"])
        quiet = []
        for _ in range(samples):
            start = time.perf_counter()
            await mem.ingest(message())
            quiet.append(time.perf_counter() - start)
        victim = message()
        assert (await mem.ingest(victim)).stored
        parts: dict[str, list[float]] = {}
        timed_parts(mem.store, parts)
        began = time.perf_counter()
        await mem.forget_messages(chat_id=victim.chat_id, message_ids=[victim.message_id])
        during: list[float] = []
        # Until the purge's last part has run (the in-turn part, or the whole purge before it
        # was split), messages keep coming.
        last = "purge_in_turn" if hasattr(mem.store, "purge_in_turn") else "purge_deleted"
        while last not in parts and time.perf_counter() - began < 600:
            start = time.perf_counter()
            await mem.ingest(message())
            during.append(time.perf_counter() - start)
        purge_s = time.perf_counter() - began
    return {
        "purge_s": round(purge_s, 2),
        "purge_parts_s": {name: [round(x, 2) for x in values] for name, values in parts.items()},
        "stored_during_purge": len(during),
        "ingest_during_purge": latency_summary(during),
        "ingest_without_purge": latency_summary(quiet),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="narrmem-purge-") as tmp:
        base = Path(tmp) / "filled"
        print(f"filling {args.size:,} memories ...", file=sys.stderr)
        filled = await fill_store(base, args.size, args.seed)
        runs = []
        for n in range(args.repeat):
            folder = Path(tmp) / f"run{n}"
            shutil.copytree(base, folder)
            runs.append(await run(folder, args.samples, args.seed))
            shutil.rmtree(folder)
    return {
        "when": now_iso(),
        "machine": machine_info(),
        "size": args.size,
        "filled": filled,
        "runs": runs,
        "median_purge_s": float(np.median([r["purge_s"] for r in runs])),
        "median_max_ingest_during_purge_ms": float(
            np.median([r["ingest_during_purge"]["max_ms"] for r in runs])
        ),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    report = asyncio.run(main(arguments))
    for n, r in enumerate(report["runs"]):
        d, q = r["ingest_during_purge"], r["ingest_without_purge"]
        print(
            f"run {n}: purge {r['purge_s']} s {r['purge_parts_s']}; {r['stored_during_purge']} messages "
            f"meanwhile, p50 / p95 / max {d['p50_ms']:.1f} / {d['p95_ms']:.1f} / {d['max_ms']:.1f} ms "
            f"(without a purge {q['p50_ms']:.1f} / {q['p95_ms']:.1f} / {q['max_ms']:.1f})"
        )
    if arguments.out:
        write_json(arguments.out, report)
