#!/usr/bin/env python
"""A heavy user's week: what one more message costs after thousands in the last seven days.

The mood counter asks how often this week the user said they feel this way, and the topic counter
how often they spoke of this; both read the user's own recent memories. A fresh store is given
``--messages`` messages of one user in one chat, spread evenly over the last seven days (the
speed benchmark's seeded generator, distinct texts), through ``ingest_many``. Then ``--samples``
single ``ingest`` calls alternate a plain message and one that states a mood ("I'm so tired…",
which the mood counter counts), each timed from call to return. The report gives p50 / p95 of
each kind and how many of the mood messages got a mood count in their notes (the path ran).

Usage:  python bench/heavy_week.py [--messages 5000] [--samples 40] [--out bench/results/heavy-week.json]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _chatgen import ChatGenerator
from _common import latency_summary, machine_info, now_iso, parser_for, publish, render_table

from narrmem import Memory, load_settings

NOW = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
MOODS = (
    "I'm so tired after {thing} today, it drained me.",
    "Feeling really stressed about {thing} again.",
    "I'm exhausted, {thing} took everything out of me.",
)
THINGS = ("the night shift", "the move", "the exam", "the kids' recital", "the deadline", "the trip")


async def run(messages: int, samples: int, seed: int) -> dict[str, Any]:
    gen = ChatGenerator(seed)
    texts = gen.unique_contents(messages + samples)
    start_of_week = NOW - timedelta(days=7)
    step = timedelta(days=7) / max(1, messages)

    def message(text: str, n: int, at: datetime) -> dict[str, Any]:
        return {
            "text": text,
            "user_id": "ann",
            "chat_id": "dm-ann",
            "speaker": "Ann",
            "ts": at,
            "message_id": f"m{n}",
        }

    with tempfile.TemporaryDirectory(prefix="narrmem-heavy-week-") as folder:
        async with Memory.open(folder, settings=load_settings()) as mem:
            start = time.perf_counter()
            week = [message(t, n, start_of_week + n * step) for n, t in enumerate(texts[:messages])]
            await mem.ingest_many(week)
            fill_s = time.perf_counter() - start
            timed: dict[str, list[float]] = {"plain": [], "mood": []}
            counted = 0
            for i in range(samples):
                kind = "mood" if i % 2 else "plain"
                text = (
                    MOODS[i % len(MOODS)].format(thing=THINGS[i % len(THINGS)])
                    if kind == "mood"
                    else texts[messages + i]
                )
                at = NOW + timedelta(minutes=i)
                start = time.perf_counter()
                result = await mem.ingest(message(text, messages + i, at))
                timed[kind].append(time.perf_counter() - start)
                if kind == "mood" and any("this week" in note for note in result.notes):
                    counted += 1
            stats = await mem.stats()
    return {
        "fill_s": fill_s,
        "memories": stats["memories"],
        "plain": latency_summary(timed["plain"]),
        "mood": latency_summary(timed["mood"]),
        "mood_messages": len(timed["mood"]),
        "mood_messages_counted": counted,
    }


def show(report: dict[str, Any]) -> None:
    r = report["result"]
    rows = [[kind, r[kind]["p50_ms"], r[kind]["p95_ms"]] for kind in ("plain", "mood")]
    print(f"{report['params']['messages']:,} messages of one user this week ({r['memories']:,} memories)")
    print(render_table(["one more message", "p50 ms", "p95 ms"], rows, digits=1))
    print(f"mood messages counted by the mood counter: {r['mood_messages_counted']} of {r['mood_messages']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    parser.add_argument("--messages", type=int, default=5000, help="the user's messages this week")
    parser.add_argument("--samples", type=int, default=40, help="timed single ingests (half of them moods)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.samples < 2:
        parser.error("--messages must be at least 1 and --samples at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(run(args.messages, args.samples, args.seed))
    report = {"when": now_iso(), "machine": machine_info(), "params": vars(args), "result": result}
    return publish(report, args.out, show)


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    raise SystemExit(main())
