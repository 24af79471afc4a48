#!/usr/bin/env python
"""A bot's months in one run: does anything narrmem keeps grow with the users it has met?

What runs
    One fresh store (default settings, the real model, SQLite unless ``--backend postgres``) lives
    the traffic of a bot with many users: ``--messages`` messages from ``--users`` people (one in
    five from a heavy user, the rest spread over all the others, so most people are met a few
    times), in their private chats and in group chats, a ``ManualClock`` moving 1 to 600 seconds a
    message (30,000 messages are about 100 days). For each message, as a bot does:

    * ``ingest`` it (the default acknowledgement);
    * with ``--turn-share`` (0.5), the context for an answer (``context(text, user_id, chat_id,
      exclude_message_ids=[it])``);
    * every ``--summary-every`` messages (25), the speaker's summary (a ``/memory`` command);
    * every ``--forget-every`` messages (500), a forget of a person met before (a ``/forgetme``);
    * once a simulated day, the decay pass.

Reported at every ``--checkpoint`` (2,000 messages)
    The process's RSS and its Python objects (after a full collection), the model process's RSS,
    the store's rows (memories, plugin state, history) and the data folder's bytes, and the
    latencies of the last stretch (ingest, context p50).

    The figure that matters is the growth over the second half of the run, per 10,000 messages:
    the store grows with what is kept, and nothing held in the process should grow with the number
    of people met once its caches are full, but the vector index's own rows (a user's shard, and
    the vectors written since the last save). Every error narrmem logged is counted by message:
    there should be none.

Usage:  python bench/soak.py --messages 30000 --users 20000 --out bench/results/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _chatgen import ChatGenerator, Person
from _common import machine_info, model_process_status

from narrmem import ManualClock, Memory, Message, load_settings

EPOCH = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
GROUP_CHATS = 40


class Failures(logging.Handler):
    """Errors narrmem logged during the run (a plugin that failed on a message, a write that
    failed): a bot's months should have none."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages[record.getMessage()[:200]] += 1


def rss_mib(pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:")), 0.0)
    except OSError:
        return 0.0


def object_types() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


async def store_rows(mem: Memory) -> dict[str, int]:
    stats = await mem.store.stats()
    rows = {"memories": int(stats["memories"])}
    async with mem.store.sql() as db:
        for table in ("plugin_state", "memory_history", "memory_sources", "graph_nodes", "graph_edges"):
            try:
                row = await db.fetchone(f"SELECT count(*) FROM {table}")
            except Exception:  # a store without that table: the figure is left out
                continue
            rows[table] = int(row[0]) if row else 0
    return rows


class Traffic:
    def __init__(self, seed: int, users: int, heavy_share: float) -> None:
        self.gen = ChatGenerator(seed)
        self.rng = random.Random(seed)
        self.people = self.gen.people(users)
        self.heavy_share = heavy_share
        self.met: list[Person] = []
        self.forgotten: set[str] = set()
        self.next_id = 0

    def person(self) -> Person:
        if self.rng.random() < self.heavy_share:
            return self.people[0]
        person = self.people[self.rng.randrange(1, len(self.people))]
        if person.user_id in self.forgotten:
            return self.people[0]
        return person

    def message(self, person: Person, ts: datetime) -> Message:
        self.next_id += 1
        if self.rng.random() < 0.5:
            chat = f"dm-{person.user_id}"
        else:
            chat = f"group-{self.rng.randrange(GROUP_CHATS):02d}"
        return Message(
            text=self.gen.message(),
            user_id=person.user_id,
            chat_id=chat,
            ts=ts,
            message_id=f"s-{self.next_id}",
            speaker=person.name,
        )


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    clock = ManualClock(EPOCH)
    settings = load_settings(args.config, data_dir=str(folder))
    if args.backend == "postgres":
        import _pgserver

        settings = await _pgserver.fresh_settings(settings)
    traffic = Traffic(args.seed, args.users, args.heavy_share)
    failures = Failures()
    logging.getLogger("narrmem").addHandler(failures)
    mem = await Memory.open(folder, settings=settings, clock=clock)
    checkpoints: list[dict[str, Any]] = []
    ingest_s: list[float] = []
    context_s: list[float] = []
    counts = {"stored": 0, "ignored": 0, "contexts": 0, "summaries": 0, "forgets": 0, "decays": 0}
    next_decay = EPOCH + timedelta(days=1)
    started = time.perf_counter()
    model: dict[str, float] = {}
    try:
        await mem.embedder.embed(["warm up the model"])
        for n in range(1, args.messages + 1):
            clock.advance(seconds=traffic.rng.uniform(1, 600))
            person = traffic.person()
            message = traffic.message(person, clock.now())
            start = time.perf_counter()
            result = await mem.ingest(message)
            ingest_s.append(time.perf_counter() - start)
            counts["stored" if result.stored else "ignored"] += 1
            if person not in traffic.met and person is not traffic.people[0]:
                traffic.met.append(person)
            if traffic.rng.random() < args.turn_share:
                start = time.perf_counter()
                await mem.context(
                    message.text,
                    user_id=person.user_id,
                    chat_id=message.chat_id,
                    exclude_message_ids=[message.message_id],
                )
                context_s.append(time.perf_counter() - start)
                counts["contexts"] += 1
            if args.summary_every and n % args.summary_every == 0:
                await mem.summary(user_id=person.user_id)
                counts["summaries"] += 1
            if args.forget_every and n % args.forget_every == 0 and traffic.met:
                gone = traffic.met.pop(traffic.rng.randrange(len(traffic.met)))
                await mem.forget(user_id=gone.user_id)
                traffic.forgotten.add(gone.user_id)
                counts["forgets"] += 1
            if clock.now() >= next_decay:
                await mem.decay()
                next_decay += timedelta(days=1)
                counts["decays"] += 1
            if n % args.checkpoint == 0:
                await mem.settle()
                gc.collect()
                types = object_types()
                point = {
                    "messages": n,
                    "people_met": len(traffic.met) + len(traffic.forgotten),
                    "days": (clock.now() - EPOCH).total_seconds() / 86_400,
                    "rss_mib": rss_mib(),
                    "python_objects": sum(types.values()),
                    "object_types": dict(types.most_common(40)),
                    "model_rss_mib": rss_mib(getattr(mem.embedder, "model_pid", None) or "self")
                    if getattr(mem.embedder, "model_pid", None)
                    else 0.0,
                    "store": await store_rows(mem),
                    "folder_bytes": folder_bytes(folder),
                    "ingest_p50_ms": statistics.median(ingest_s) * 1000,
                    "context_p50_ms": statistics.median(context_s) * 1000 if context_s else None,
                    "elapsed_s": time.perf_counter() - started,
                    "errors_logged": sum(failures.messages.values()),
                    **counts,
                }
                ingest_s.clear()
                context_s.clear()
                checkpoints.append(point)
                print(
                    f"{n:>7,} messages, {point['people_met']:>6,} people: RSS {point['rss_mib']:.0f} MiB, "
                    f"{point['python_objects']:,} objects, model {point['model_rss_mib']:.0f} MiB, "
                    f"{point['store']['memories']:,} memories, ingest {point['ingest_p50_ms']:.1f} ms, "
                    f"context {point['context_p50_ms'] or 0:.1f} ms",
                    file=sys.stderr,
                )
        model = model_process_status(mem)
    finally:
        await mem.close()
        logging.getLogger("narrmem").removeHandler(failures)
    return {
        "checkpoints": checkpoints,
        "growth": growth(checkpoints),
        "errors_logged": dict(failures.messages),
        "model": model,
    }


def growth(points: list[dict[str, Any]]) -> dict[str, float]:
    """Per 10,000 messages, from the checkpoint at half the run to the last."""
    if len(points) < 2:
        return {}
    first, last = points[(len(points) - 1) // 2], points[-1]
    per = 10_000 / max(1, last["messages"] - first["messages"])
    types = Counter(last["object_types"])
    types.subtract(first["object_types"])
    return {
        "object_types_per_10k": {name: n * per for name, n in types.most_common(8)},
        "from_messages": first["messages"],
        "to_messages": last["messages"],
        "rss_mib_per_10k": (last["rss_mib"] - first["rss_mib"]) * per,
        "python_objects_per_10k": (last["python_objects"] - first["python_objects"]) * per,
        "people_met_per_10k": (last["people_met"] - first["people_met"]) * per,
        "memories_per_10k": (last["store"]["memories"] - first["store"]["memories"]) * per,
        "folder_mib_per_10k": (last["folder_bytes"] - first["folder_bytes"]) * per / 2**20,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--heavy-share", type=float, default=0.2)
    parser.add_argument("--turn-share", type=float, default=0.5, help="messages the bot answers")
    parser.add_argument("--summary-every", type=int, default=25)
    parser.add_argument("--forget-every", type=int, default=500)
    parser.add_argument("--checkpoint", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--config", default=None, help="a narrmem TOML config file")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="narrmem-soak-") as tmp:
        report = asyncio.run(run(args, Path(tmp)))
    report["args"] = vars(args)
    report["machine"] = machine_info()
    print(json.dumps({"growth": report["growth"], "errors_logged": report["errors_logged"]}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
