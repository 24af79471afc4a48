"""``narrmem demo``: what narrmem does with a small sample chat (three people, four weeks, English and
Chinese), shown step by step: what it kept and ignored, the scenes it wrote, the facts it put in the
graph, a trigger firing, recall, and a memory fading and being reinforced.

The demo writes a new store (a temporary folder unless ``--data`` names a new one) on a clock of its
own that starts the day after the sample's last message and moves forward for the fading part, so
every run shows the same thing.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from datetime import UTC, datetime
from importlib import resources
from itertools import groupby
from pathlib import Path
from typing import Any, TextIO

from narrmem.clock import ManualClock
from narrmem.config import Settings
from narrmem.doors.transfer import read_messages
from narrmem.errors import InputError
from narrmem.memory import Memory
from narrmem.models import IngestResult, Message

# The questions the demo asks of the sample chat, each in the scope it asks in.
_QUESTIONS = resources.files("narrmem").joinpath("data/sample_questions.jsonl").read_text("utf-8")
QUESTIONS: list[tuple[str, dict[str, str]]] = [
    (row["question"], row["scope"]) for row in map(json.loads, _QUESTIONS.splitlines())
]
DEMO_NOW = datetime(2026, 5, 30, 12, 0, tzinfo=UTC)  # the day after the sample's last message
FADE_DAYS = 90  # how far the clock moves for the fading part
SHOWN = 4  # items shown per list


def sample_path() -> str:
    return str(resources.files("narrmem").joinpath("data/sample_chat.jsonl"))


async def demo(settings: Settings, out: TextIO, *, k: int = 2, folder: str | None = None) -> None:
    """Run the demo in ``folder`` (it must not hold a store yet), or in a temporary folder."""
    if folder is not None:
        if (Path(folder) / settings.storage.database).exists():
            raise InputError(
                f"the demo writes a new store, and {folder} already holds one: name a new folder",
                field="--data",
            )
        await _run(settings, folder, out, k)
        print(
            f"\nThe demo's store is in {folder}: try narrmem recall, history or stats --data {folder}",
            file=out,
        )
        return
    with tempfile.TemporaryDirectory(prefix="narrmem-demo-") as scratch:
        await _run(settings, scratch, out, k)
    print("\nThe demo ran in a temporary folder; narrmem demo --data DIR keeps its store.", file=out)


async def _run(settings: Settings, folder: str, out: TextIO, k: int) -> None:
    clock = ManualClock(DEMO_NOW)
    async with Memory.open(settings=settings.model_copy(update={"data_dir": folder}), clock=clock) as memory:
        await run_demo(memory, out, k=k, clock=clock)


async def run_demo(memory: Memory, out: TextIO, k: int = 2, clock: ManualClock | None = None) -> None:
    """Every part of the demo on ``memory``; the fading part needs the memory's ``clock``."""
    messages = read_messages(sample_path())
    results = await _as_it_happened(memory, messages, clock)
    _kept(messages, results, out)
    _scenes(messages, results, out)
    await _facts(memory, out)
    _triggers(results, out)
    await _recall(memory, out, k)
    if clock is not None:
        await _fading(memory, clock, out)


async def _as_it_happened(
    memory: Memory, messages: list[Message], clock: ManualClock | None
) -> list[IngestResult]:
    """The sample's days one after another, the clock at each day's last message: triggers fire
    only on news (a message of the last day), so four weeks ingested at once would fire none.
    ``after_hooks``, so that the results show what the hooks made."""
    if clock is None:
        return await memory.ingest_many(messages, acknowledge="after_hooks")
    end = clock.now()
    results: list[IngestResult] = []
    for _, day in groupby(messages, key=lambda m: m.ts.astimezone(UTC).date()):
        batch = list(day)
        clock.set(max(m.ts for m in batch))
        results += await memory.ingest_many(batch, acknowledge="after_hooks")
    clock.set(end)
    return results


def _heading(title: str, out: TextIO) -> None:
    print(f"\n== {title}", file=out)


def _kept(messages: list[Message], results: list[IngestResult], out: TextIO) -> None:
    layers = Counter(r.layer for r in results)
    print(
        f"Ingested {len(messages)} sample messages from 3 people over 4 weeks (English and Chinese).",
        file=out,
    )
    _heading("What it kept: three layers", out)
    print(
        f"  {layers['scene']} became scenes, {layers['accumulate']} were kept as they are, "
        f"{layers['ignore']} were ignored before any embedding:",
        file=out,
    )
    for message, result in zip(messages, results, strict=True):
        if result.layer == "ignore":
            print(f"    {message.speaker}: {message.text!r}  ({result.reason})", file=out)


def _scenes(messages: list[Message], results: list[IngestResult], out: TextIO) -> None:
    _heading("Scenes it wrote: a short narrative beside the raw message, for what matters", out)
    written = [(m, r) for m, r in zip(messages, results, strict=True) if r.scene is not None]
    for message, result in written[:SHOWN]:
        assert result.scene is not None
        print(f"  [{result.type or 'scene'}] {message.speaker}, from {message.message_id}:", file=out)
        for line in result.scene.text.splitlines()[1:4]:
            print(f"      {line}", file=out)
    if len(written) > SHOWN:
        print(f"  ... and {len(written) - SHOWN} more", file=out)


async def _facts(memory: Memory, out: TextIO) -> None:
    _heading("Facts in the graph: what people state about themselves, as triplets", out)
    if "memory_recall" not in memory.tools.names():
        print("  (the graph plugin is not loaded)", file=out)
        return
    for user in ("alice", "bob", "wei"):
        graph = await memory.call_tool("memory_recall", {"query_intent": "user", "user_id": user})
        edges: list[dict[str, Any]] = [e for e in graph["edges"] if e["status"] == "active"]
        for edge in edges[:2]:
            print(
                f"  {user}: {edge['subject']} -{edge['relation']}-> {edge['object']}  "
                f"(from {', '.join(edge['provenance'])})",
                file=out,
            )


def _triggers(results: list[IngestResult], out: TextIO) -> None:
    _heading("Triggers: something keeps coming back, and the bot is told", out)
    fired = [t for r in results for t in r.triggers]
    if not fired:
        print("  (none fired on this sample)", file=out)
    for trigger in fired[:SHOWN]:
        print(f"  {trigger.kind} '{trigger.label}' for {trigger.user_id}: {trigger.suggestion}", file=out)


async def _recall(memory: Memory, out: TextIO, k: int) -> None:
    _heading("Recall: the right memory for a question, and why it ranked", out)
    for question, scope in QUESTIONS:
        hits = await memory.recall(
            question, k=k, reinforce=False, user_id=scope.get("user_id"), chat_id=scope.get("chat_id")
        )
        where = ", ".join(f"{key}={value}" for key, value in scope.items())
        print(f"\n? {question}  [{where}]", file=out)
        for n, hit in enumerate(hits, 1):
            text = " | ".join(line for line in hit.text.splitlines() if line.strip())
            why = ""
            if hit.why is not None:
                matched = f", words {', '.join(hit.why.matched)}" if hit.why.matched else ""
                dense = "-" if hit.why.dense is None else f"{hit.why.dense:.2f}"
                why = f"  (similarity {dense}{matched})"
            print(f"  {n}. [{hit.kind}] {text}  <- {', '.join(hit.message_ids)}{why}", file=out)
        if not hits:
            print("  nothing relevant remembered", file=out)


async def _fading(memory: Memory, clock: ManualClock, out: TextIO) -> None:
    """The first question's best memory: its importance now, after months unused, and after the
    bot uses it again (reinforcement), with the history that records it."""
    _heading("Fading and reinforcement: the hippocampus", out)
    question, scope = QUESTIONS[0]
    hits = await memory.recall(question, k=1, reinforce=False, user_id=scope["user_id"])
    if not hits:
        return
    hit = hits[0]
    [record] = (await memory.store.get([hit.id], None)).values()
    now = (await memory.importance_now([record]))[hit.id]
    print(f"  {hit.text!r} ({hit.kind} {hit.id}, {hit.user_id})", file=out)
    print(f"  importance today:                       {now:.3f}", file=out)
    clock.advance(days=FADE_DAYS)
    faded = (await memory.importance_now([record]))[hit.id]
    print(f"  {FADE_DAYS} days later, never recalled:          {faded:.3f}  (fading)", file=out)
    used = await memory.mark_used([hit.id], user_id=scope["user_id"])
    [record] = (await memory.store.get([hit.id], None)).values()
    again = (await memory.importance_now([record]))[hit.id]
    if not used:
        print("  not reinforced: reinforcement is off ([plugin.hippocampus] reinforce)", file=out)
        return
    print(f"  the bot uses it in an answer that day:  {again:.3f}  (reinforced)", file=out)
    for event in (await memory.history(hit.id))["events"]:
        change = f"{event['old']} -> {event['new']}"
        print(f"    history: {event['at'][:10]} {event['who']}: {change} ({event['why']})", file=out)
