"""Concurrent chats through single ``ingest`` calls, with and without group commit.

A bot handles its chats concurrently: each chat's handler awaits ``mem.ingest(message)`` for one
message after another, while the other chats do the same. ``--chats`` such handlers run at once,
``--messages`` each (generated chat traffic, a fifth of it acknowledgements that triage ignores),
into a fresh store with the default plugins; ``[storage] group_commit`` on and off alternate over
``--rounds`` rounds in fresh stores, with one loaded model shared by all. Reported per mode:
messages per second over the whole run, and the latency of each ``ingest`` call for messages
stored and for messages ignored (p50 / p95).

    python bench/concurrent_chats.py [--chats 16] [--messages 40] [--rounds 2] [--out bench/results/concurrent-chats.json]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _chatgen import ChatGenerator
from _common import (
    latency_summary,
    machine_info,
    now_iso,
    params_of,
    parser_for,
    publish,
    render_table,
    start_shared_embedder,
)

from narrmem import Memory, Message
from narrmem.config import Settings, load_settings

MODES = {"group commit": True, "one by one": False}
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def traffic(seed: int, chats: int, messages: int) -> list[list[Message]]:
    gen = ChatGenerator(seed)
    people = gen.people(chats)
    return [
        [
            Message(
                text=gen.message(ack_share=0.2),
                user_id=person.user_id,
                chat_id=f"chat-{n}",
                message_id=f"{n}-{i}",
                speaker=person.name,
                ts=START + timedelta(minutes=i, seconds=n),
            )
            for i in range(messages)
        ]
        for n, person in enumerate(people)
    ]


async def one_run(
    settings: Settings, plugin: Any, chats: list[list[Message]], group_commit: bool
) -> dict[str, Any]:
    storage = settings.storage.model_copy(update={"group_commit": group_commit})
    stored: list[float] = []
    ignored: list[float] = []
    with tempfile.TemporaryDirectory(prefix="narrmem-concurrent-") as folder:
        opened = settings.model_copy(update={"data_dir": folder, "storage": storage})
        async with Memory.open(settings=opened, plugins=[plugin], load_entrypoints=False) as mem:

            async def handler(messages: list[Message]) -> None:
                for message in messages:
                    start = time.perf_counter()
                    result = await mem.ingest(message)
                    (stored if result.stored else ignored).append(time.perf_counter() - start)

            begun = time.perf_counter()
            await asyncio.gather(*(handler(messages) for messages in chats))
            elapsed = time.perf_counter() - begun
    total = sum(len(messages) for messages in chats)
    return {
        "elapsed_s": elapsed,
        "messages": total,
        "stored": len(stored),
        "stored_s": stored,
        "ignored_s": ignored,
    }


async def run(args: Any) -> dict[str, Any]:
    base = load_settings(args.config)
    inner, plugin, settings = await start_shared_embedder(base)
    chats = traffic(args.seed, args.chats, args.messages)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    try:
        # A warm-up run in each mode first (model buffers, imports), not counted.
        for flag in MODES.values():
            await one_run(settings, plugin, traffic(args.seed + 1, 4, 5), flag)
        for round_ in range(args.rounds):
            order = list(MODES.items()) if round_ % 2 == 0 else list(MODES.items())[::-1]
            for mode, flag in order:
                runs[mode].append(await one_run(settings, plugin, chats, flag))
    finally:
        await inner.close()
    results: dict[str, Any] = {}
    for mode, done in runs.items():
        elapsed = sum(r["elapsed_s"] for r in done)
        results[mode] = {
            "messages_per_s": sum(r["messages"] for r in done) / elapsed,
            "stored_per_run": [r["stored"] for r in done],
            "ingest_stored": latency_summary([s for r in done for s in r["stored_s"]]),
            "ingest_ignored": latency_summary([s for r in done for s in r["ignored_s"]]),
        }
    one, group = results["one by one"], results["group commit"]
    results["throughput_ratio"] = group["messages_per_s"] / one["messages_per_s"]
    return results


def show(report: dict[str, Any]) -> None:
    results = report["results"]
    rows = [
        [
            mode,
            results[mode]["messages_per_s"],
            results[mode]["ingest_stored"]["p50_ms"],
            results[mode]["ingest_stored"]["p95_ms"],
            results[mode]["ingest_ignored"]["p50_ms"],
            results[mode]["ingest_ignored"]["p95_ms"],
        ]
        for mode in MODES
    ]
    params = report["params"]
    print(
        f"{params['chats']} chats at once, {params['messages']} messages each, "
        f"{params['rounds']} rounds per mode"
    )
    headers = ["mode", "msg/s", "stored p50 ms", "stored p95 ms", "ignored p50 ms", "ignored p95 ms"]
    print(render_table(headers, rows, digits=2))
    print(f"group commit / one by one, messages per second: {results['throughput_ratio']:.2f}")


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--chats", type=int, default=16, help="chats handled at once")
    parser.add_argument("--messages", type=int, default=40, help="messages per chat")
    parser.add_argument("--rounds", type=int, default=2, help="runs per mode, alternating")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--config", default=None, help="a narrmem TOML config")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    report = {"when": now_iso(), "machine": machine_info(), "params": params_of(args), "results": results}
    return publish(report, args.out, show)


if __name__ == "__main__":
    sys.exit(main())
