#!/usr/bin/env python
"""Moving a memory to another model: ``narrmem migrate --reembed`` of a SQLite store of
``--messages`` chat messages (the speed benchmark's seeded traffic, ``--people`` people) written
with float32 all-MiniLM-L6-v2, into a new store of the default model (int7), with the real model
both sides; then the same move run again, which embeds nothing. The end check's agreement (the
sampled memories' vectors made again) and the report's counts are printed with the times.

Usage:  python bench/reembed.py [--messages 10000] [--people 200] [--seed 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _chatgen import ChatGenerator
from _common import machine_info, now_iso, write_json

from narrmem import Memory, Message, load_settings
from narrmem.doors.migrate import migrate

FLOAT32 = {"quantize": "none"}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    chat = ChatGenerator(args.seed)
    people = chat.people(args.people)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    messages = [
        Message(
            text=chat.message(ack_share=0.0),
            user_id=people[i % len(people)].user_id,
            chat_id=f"c{i % 50}",
            message_id=f"m{i}",
            ts=t0 + timedelta(minutes=i),
            speaker=people[i % len(people)].name,
        )
        for i in range(args.messages)
    ]
    with tempfile.TemporaryDirectory(prefix="narrmem-reembed-") as tmp:
        source, target = Path(tmp) / "float32", Path(tmp) / "int7"
        async with Memory.open(source, settings=load_settings(embedder=FLOAT32)) as memory:
            start = time.perf_counter()
            await memory.ingest_many(messages)
            written = time.perf_counter() - start
        old, new = load_settings(embedder=FLOAT32), load_settings()
        start = time.perf_counter()
        report = await migrate(
            str(source), str(target), settings=old, target_settings=new, reembed=True, progress=False
        )
        moved = time.perf_counter() - start
        start = time.perf_counter()
        again = await migrate(
            str(source),
            str(target),
            settings=old,
            target_settings=new,
            reembed=True,
            progress=False,
            queries=0,
        )
        moved_again = time.perf_counter() - start
    return {
        "when": now_iso(),
        "machine": machine_info(),
        "messages": args.messages,
        "memories": report["counts"]["memories"]["target"],
        "models": report["models"],
        "ingest_s": round(written, 1),
        "reembed_s": round(moved, 1),
        "ms_per_memory": round(1000 * moved / max(1, report["counts"]["memories"]["target"]), 2),
        "agreement": report["recall"]["agreement"],
        "verified": report["verified"],
        "again_s": round(moved_again, 1),
        "again_memories": again["memories"],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--people", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    result = asyncio.run(main(arguments))
    print(
        f"{result['messages']:,} messages, {result['memories']:,} memories, "
        f"{result['models']['source']} -> {result['models']['target']}: re-embedded in "
        f"{result['reembed_s']} s ({result['ms_per_memory']} ms a memory), agreement "
        f"{result['agreement']}, verified {result['verified']}; run again {result['again_s']} s "
        f"({result['again_memories']}); ingest of the source {result['ingest_s']} s"
    )
    if arguments.out:
        write_json(arguments.out, result)
