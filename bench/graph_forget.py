#!/usr/bin/env python
"""What a deleted message's forget costs when the graph holds many other people's facts.

A bot's deleted or edited message is forgotten in its chat: the graph plugin takes out what the
message stated. That forget knows the chat, not the author, so it must find the chat's facts
without reading everyone else's. Here one person states facts in a small chat (the real ingest
path: triage, the graph's extraction); the graph of ``--others`` other people (four facts each,
three superseded, as a long-running bot keeps them) is written straight into its tables; then the
person's messages are deleted one by one, each timed, on the store without and with the others.
The ratio of the two medians says whether a deletion reads only its chat. The hash embedder of
``narrmem.testing`` stands in for the model, which no step timed here runs.

Usage:  python bench/graph_forget.py [--others 400000] [--deletions 5] [--same-chat]
                                     [--out bench/results/graph-forget.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import machine_info, now_iso, write_json

from narrmem import Message
from narrmem.testing import open_memory

SAID_AT = datetime(2026, 8, 1, 20, tzinfo=UTC)
FACTS_EACH = 4
FIRST_ID = 10_000_000  # above any id the real ingest writes here


async def deletion_seconds(folder: Path, others: int, deletions: int, same_chat: bool) -> list[float]:
    async with open_memory(folder) as memory:
        for n in range(deletions):
            await memory.ingest(
                Message(
                    text=f"I live in Zqcity{n}",  # each a fact superseding the one before
                    user_id="ann",
                    chat_id="small",
                    message_id=f"a{n}",
                    ts=SAID_AT + timedelta(hours=n),
                )
            )
        await memory.settle()
    with sqlite3.connect(folder / "narrmem.sqlite3") as db:
        [(stated,)] = db.execute("SELECT COUNT(*) FROM graph_edges WHERE user_id = 'ann'").fetchall()
    if not stated:
        raise SystemExit("the person's messages stated no fact in the graph: nothing to measure")
    if others:
        _write_others(folder / "narrmem.sqlite3", others, same_chat)
    seconds = []
    async with open_memory(folder) as memory:
        for n in range(deletions):
            start = time.perf_counter()
            await memory.forget_messages(chat_id="small", message_ids=[f"a{n}"])
            seconds.append(time.perf_counter() - start)
    return seconds


def _write_others(database: Path, others: int, same_chat: bool) -> None:
    """``others`` people's graphs in the default tenant, each in a chat of their own, or with
    ``same_chat`` all in the person's chat (a big group)."""
    at = SAID_AT.isoformat()
    nodes, edges = [], []
    for person in range(others):
        first = FIRST_ID + person * FACTS_EACH
        for n in range(FACTS_EACH):
            scope = ("default", f"u{person}", "small" if same_chat else f"c{person}")
            nodes.append((first + n, *scope, f"thing {n}", "EntityNode", "{}", at, 0.0))
            status = "active" if n == 0 else "superseded"
            provenance = json.dumps([f"m{person}-{n}"])
            target = first + (n + 1) % FACTS_EACH
            edges.append(
                (
                    first + n,
                    *scope,
                    first + n,
                    "likes",
                    target,
                    0.9,
                    0,
                    status,
                    "message",
                    provenance,
                    at,
                    0.0,
                    at,
                    0.0,
                )
            )
    with sqlite3.connect(database) as db:
        db.executemany(
            "INSERT INTO graph_nodes (id, tenant, user_id, chat_id, name, type, props, created_at, "
            "created_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            nodes,
        )
        db.executemany(
            "INSERT INTO graph_edges (id, tenant, user_id, chat_id, subject_id, relation, object_id, "
            "confidence, speculative, status, source, provenance, valid_from, valid_from_ts, last_seen, "
            "last_seen_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            edges,
        )


async def run(others: int, deletions: int, same_chat: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="narrmem-graph-forget-") as work:
        for label, count in (("alone", 0), ("beside others", others)):
            seconds = await deletion_seconds(Path(work) / label, count, deletions, same_chat)
            results[label] = {
                "seconds": [round(s, 4) for s in seconds],
                "median_s": statistics.median(seconds),
            }
    results["ratio"] = results["beside others"]["median_s"] / results["alone"]["median_s"]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--others", type=int, default=400_000, help="other people's graphs beside the chat")
    parser.add_argument("--deletions", type=int, default=5, help="messages deleted one by one, each timed")
    parser.add_argument(
        "--same-chat",
        action="store_true",
        help="the others speak in the person's chat (a big group), not each in a chat of their own",
    )
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args()
    results = asyncio.run(run(args.others, args.deletions, args.same_chat))
    for label in ("alone", "beside others"):
        timed = ", ".join(f"{s:.3f}" for s in results[label]["seconds"])
        print(f"{label:14s} deletion seconds: {timed} (median {results[label]['median_s']:.3f})")
    where = "in the same chat" if args.same_chat else "in chats of their own"
    print(f"ratio beside {args.others:,} others' graphs ({where}) / alone: {results['ratio']:.2f}")
    if args.out:
        report = {
            "benchmark": "graph_forget",
            "date": now_iso(),
            "machine": machine_info(),
            "others": args.others,
            "same_chat": args.same_chat,
            **results,
        }
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
