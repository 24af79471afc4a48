#!/usr/bin/env python
"""What ``auto_tasks`` costs a stored message as a chat's task chain grows over months.

Two cases, each timed against the same chat with none of it: a task that has already followed
``--followed`` messages (rows of ``graph_task_messages``) and goes on following; a chain of
``--tasks`` paused tasks (written straight into the graph's tables, each with a topic of its own)
beside the one in progress, with messages that stay on its topic, then messages that change topic
back and forth. The hash embedder of ``narrmem.testing`` stands in for the model, so what is timed
is the graph's own work (SQLite).

Usage:  python bench/auto_tasks.py [--followed 20000] [--tasks 2000] [--messages 40]
                                   [--out bench/results/auto-tasks.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import machine_info, now_iso, write_json

from narrmem import Message
from narrmem.testing import open_memory

CONFIG = {"graph": {"auto_tasks": True, "extract_facts": False}}
GARDEN = "my garden tomatoes need water again, the garden beds are dry"
PYTHON = "the new python release has faster startup"
AT = "2026-05-04T09:00:00+00:00"


def _message(mid: str, text: str, second: int) -> Message:
    return Message(
        text=text,
        user_id="ann",
        chat_id="c",
        message_id=mid,
        ts=f"2026-05-04T10:{second // 60:02d}:{second % 60:02d}+00:00",
    )


async def _timed(mem: Any, texts: list[str], start: int) -> list[float]:
    seconds = []
    for n, text in enumerate(texts):
        began = time.perf_counter()
        await mem.ingest(_message(f"t{start + n}", text, start + n))
        seconds.append(time.perf_counter() - began)
    return seconds


async def followed(folder: Path, count: int, messages: int) -> float:
    """Median seconds a message costs on a task that already followed ``count`` messages."""
    async with open_memory(folder, plugin=CONFIG) as mem:
        await _timed(mem, [f"{GARDEN} ({n})" for n in range(2)], 0)
        async with mem.store.sql(write=True) as db:
            [(task,)] = await db.fetchall("SELECT id FROM graph_nodes WHERE type = 'TaskNode'")
            await db.executemany(
                "INSERT INTO graph_task_messages (tenant, user_id, chat_id, task_id, message_id) "
                "VALUES ('default', 'ann', 'c', ?, ?)",
                [(task, f"old-{n}") for n in range(count)],
            )
        seconds = await _timed(mem, [f"{GARDEN} ({n})" for n in range(2, 2 + messages)], 2)
    return statistics.median(seconds[1:])


async def chain(folder: Path, count: int, messages: int) -> tuple[float, float]:
    """Median seconds a message costs beside ``count`` paused tasks: on the current topic, and
    changing topic."""
    rng = np.random.default_rng(7)
    async with open_memory(folder, plugin=CONFIG) as mem:
        await _timed(mem, [PYTHON, GARDEN], 0)
        async with mem.store.sql(write=True) as db:
            [(paused,)] = await db.fetchall("SELECT id FROM graph_nodes WHERE name = 'state:paused'")
            for n in range(count):
                topic = rng.standard_normal(384).astype(np.float32)
                topic /= np.linalg.norm(topic)
                props = json.dumps(
                    {"described_by": f"s{n}", "description": f"an old topic {n}", "messages": 3}
                )
                [(node,)] = await db.fetchall(
                    "INSERT INTO graph_nodes (tenant, user_id, chat_id, name, type, props, created_at, "
                    "created_ts, topic_vector) VALUES ('default', 'ann', 'c', ?, 'TaskNode', ?, ?, ?, ?) "
                    "RETURNING id",
                    (f"Task_old_{n}", props, AT, 1.0e9 + n, topic.tobytes()),
                )
                await db.execute(
                    "INSERT INTO graph_edges (tenant, user_id, chat_id, subject_id, relation, object_id, "
                    "confidence, speculative, status, source, provenance, valid_from, valid_from_ts, "
                    "last_seen, last_seen_ts) VALUES ('default', 'ann', 'c', ?, 'HAS_STATE', ?, 1.0, 0, "
                    "'active', 'auto', ?, ?, 0, ?, 0)",
                    (node, paused, json.dumps([f"s{n}"]), AT, AT),
                )
        same = await _timed(mem, [f"{GARDEN} {n}" for n in range(messages)], 10)
        switching = await _timed(
            mem, [f"{[PYTHON, GARDEN][n % 2]} again {n}" for n in range(messages // 2)], 10 + messages
        )
    return statistics.median(same[1:]), statistics.median(switching)


async def run(followed_count: int, tasks: int, messages: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="narrmem-auto-tasks-") as work:
        base = Path(work)
        return {
            "followed": {
                "none_ms": 1000 * await followed(base / "f0", 0, messages),
                f"{followed_count}_ms": 1000 * await followed(base / "f1", followed_count, messages),
            },
            "chain": {
                "none_ms": [1000 * s for s in await chain(base / "c0", 0, messages)],
                f"{tasks}_ms": [1000 * s for s in await chain(base / "c1", tasks, messages)],
            },
        }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--followed", type=int, default=20_000, help="messages the task followed already")
    parser.add_argument("--tasks", type=int, default=2_000, help="paused tasks in the chain")
    parser.add_argument("--messages", type=int, default=40, help="messages timed in each case")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args()
    results = asyncio.run(run(args.followed, args.tasks, args.messages))
    f, c = results["followed"], results["chain"]
    print(
        f"a task that followed 0 / {args.followed:,} messages: {f['none_ms']:.2f} / "
        f"{f[f'{args.followed}_ms']:.2f} ms a message (median)"
    )
    (same0, switch0), (same1, switch1) = c["none_ms"], c[f"{args.tasks}_ms"]
    print(
        f"a chain of 0 / {args.tasks:,} paused tasks: {same0:.2f} / {same1:.2f} ms on the topic, "
        f"{switch0:.2f} / {switch1:.2f} ms changing topic (medians)"
    )
    if args.out:
        report = {
            "benchmark": "auto_tasks",
            "date": now_iso(),
            "machine": machine_info(),
            **vars(args),
            **results,
        }
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
