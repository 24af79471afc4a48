"""Leak harness: after ``forget(user_id=...)`` and ``close()``, no byte of the data folder may hold
anything of the forgotten user.

Each user of the ``default`` tenant writes a unique marker through every surface that keeps text:
plain episodes, scenes (decision, "remember this"), facts, a mood said three times (a pattern scene)
and a topic said three times (counters and trigger state), a hand-written scene, a persona, a task
and a committed triplet, an edited message's first text, a deleted message; markers that only ever
travel in questions (their own recall, another user's chat-scope recall quoting them, a turn
context); and an rtm summary is asked for. Recall reinforces what it returns, so the history sees
the questions. The same user ids live in tenant ``t1`` as other people, with markers of their own.

Then half of the default tenant's users are forgotten and the memory closed, and every file under
the folder (SQLite main file, -wal, -shm, the vector index, anything else) is searched for each
marker of a forgotten user: the marker's bytes, and its last seven characters (the keyword index
stores a term as the suffix it does not share with the term before it). The vectors SQLite held
for them (memories and graph nodes) are searched too, by slices of their float32 bytes that no
remaining vector holds. As a control, the markers of the users that stay must still be found.
Markers of messages deleted with ``forget_messages`` that are still on disk are listed too
(``deleted_messages_found``; an edit keeps the earlier text on purpose).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narrmem import ManualClock, Memory, Message
from narrmem.testing import open_memory

from .common import (
    BASE_TS,
    all_vectors,
    figures_dict,
    folder_files,
    marker_needles,
    new_token,
    occurrences,
    tallies,
    to_json,
    user_vectors,
    vector_windows,
)

TENANTS = ("default", "t1")
GROUP = "g0"
# Surfaces whose marker is stored content (so a kept user's marker must be found on disk).
STORED = (
    "episode",
    "scene decision",
    "scene remember",
    "fact lives_in",
    "fact likes",
    "mood",
    "topic",
    "soul_narrative",
    "persona",
    "task",
    "memory_commit",
)
# Surfaces that are gone even for a kept user, or that only travel in questions.
TRANSIENT = ("edited away", "deleted message", "own recall", "chat recall quoting", "turn_context")
SURFACES = STORED + TRANSIENT


@dataclass
class LeakReport:
    counts: Counter[str] = field(
        default_factory=tallies(
            "users forgotten markers_forgotten marker_hits tail_hits leaked_markers kept_markers "
            "kept_markers_found vectors_checked vectors_unverifiable vectors_found "
            "kept_vectors_checked kept_vectors_found answers_with_forgotten"
        )
    )
    by_surface: Counter[str] = field(default_factory=Counter)
    by_file: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    kept_missing: list[str] = field(default_factory=list)
    deleted_messages_found: list[str] = field(default_factory=list)
    vectors_by_file: Counter[str] = field(default_factory=Counter)
    files: dict[str, int] = field(default_factory=dict)
    real_model: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return figures_dict(self, cut={"examples": 12, "kept_missing": 12})


def run_leak(
    users: int, seed: int, workdir: Path, *, real_model: bool = False, acknowledge: str = "after_hooks"
) -> dict[str, Any]:
    """Write ``users`` users' markers through every surface, forget half of them, close, and search
    every byte of the folder. Returns the figures (see :class:`LeakReport`). ``acknowledge``: the
    memory's ``[storage] acknowledge``."""
    return asyncio.run(_run(users, seed, workdir, real_model, acknowledge))


async def _run(users: int, seed: int, workdir: Path, real_model: bool, acknowledge: str) -> dict[str, Any]:
    started = time.perf_counter()
    rng = random.Random(seed)
    report = LeakReport(real_model=real_model)
    report.counts["users"] = users
    folder = workdir / "leak"
    ids = [f"u{i:03d}" for i in range(max(2, users))]
    forgotten = sorted(rng.sample(ids, max(1, len(ids) // 2)))
    used: set[str] = set()
    markers: dict[tuple[str, str, str], str] = {}  # (tenant, user, surface) -> marker
    for tenant in TENANTS:
        for user in ids:
            for surface in SURFACES:
                markers[(tenant, user, surface)] = new_token(rng, used, length=10)
    clock = ManualClock(BASE_TS)
    settings: dict[str, Any] = {
        "plugin": {"hippocampus": {"reinforce": True}},
        "storage": {"acknowledge": acknowledge},
    }
    async with open_memory(folder, real_model=real_model, clock=clock, **settings) as mem:
        for day in range(3):
            for tenant in TENANTS:
                for user in ids:
                    await _write(mem, tenant, user, ids, markers, day, clock)
                    clock.advance(minutes=7)
            clock.advance(days=1)
        for tenant in TENANTS:
            for user in ids:
                await _ask(mem, tenant, user, ids, markers, rng)
        vectors = {user: user_vectors(folder, "default", user) for user in forgotten}
        for user in forgotten:
            await mem.forget(user_id=user, tenant="default")
        report.counts["forgotten"] = len(forgotten)
        for user in forgotten:
            report.counts["answers_with_forgotten"] += await _answers_hold(mem, user, ids, markers)
    _scan(folder, forgotten, ids, markers, vectors, report)
    report.seconds = time.perf_counter() - started
    return report.as_dict()


def _message(tenant: str, user: str, chat: str, number: str, text: str, clock: ManualClock) -> Message:
    clock.advance(seconds=20)
    return Message(
        text=text,
        tenant=tenant,
        user_id=user,
        chat_id=chat,
        ts=clock.now(),
        message_id=f"{user}-{number}",
        speaker=f"Speaker{user[1:]}",
    )


async def _write(
    mem: Memory,
    tenant: str,
    user: str,
    ids: list[str],
    markers: dict[tuple[str, str, str], str],
    day: int,
    clock: ManualClock,
) -> None:
    """One day of a user's messages (a mood and a topic every day; the rest on the first day)."""
    m = {surface: markers[(tenant, user, surface)] for surface in SURFACES}
    dm = f"dm-{user}"
    lines = [
        (GROUP, f"mood-{day}", f"so tired today after the {m['mood']} meeting"),
        (dm, f"topic-{day}", f"the {m['topic']} roadmap review came up again"),
    ]
    if day == 0:
        lines += [
            (GROUP, "episode", f"the {m['episode']} project is taking all my evenings"),
            (GROUP, "decision", f"I decided to quit {m['scene decision']} and move on"),
            (dm, "remember", f"remember this: my locker code is {m['scene remember']}"),
            (GROUP, "lives", f"I live in {m['fact lives_in']}"),
            (dm, "likes", f"I like {m['fact likes']}"),
            (GROUP, "edited", f"we had dinner near {m['edited away']} last night"),
            (GROUP, "deleted", f"my sister moved to {m['deleted message']} in spring"),
        ]
    for chat, number, text in lines:
        await mem.ingest(_message(tenant, user, chat, number, text, clock))
    if day != 0:
        return
    await mem.edit(
        _message(tenant, user, GROUP, "edited", "we had dinner near the station last night", clock)
    )
    await mem.forget_messages(chat_id=GROUP, message_ids=[f"{user}-deleted"], tenant=tenant)
    scope = {"user_id": user, "tenant": tenant}
    await mem.call_tool(
        "soul_narrative", {**scope, "action": "add", "event": f"I kept {m['soul_narrative']}"}
    )
    await mem.call_tool(
        "persona_set", {**scope, "chat_id": GROUP, "description": f"a coach for {m['persona']}"}
    )
    await mem.call_tool(
        "task_create",
        {
            **scope,
            "chat_id": GROUP,
            "task_id": f"task-{m['task']}",
            "description": f"book the {m['task']} trip",
            "info_nodes": [m["task"]],
        },
    )
    triplet = {"subject": "user", "relation": "likes", "object": m["memory_commit"]}
    await mem.call_tool("memory_commit", {**scope, "chat_id": GROUP, "triplets": [triplet]})


async def _ask(
    mem: Memory,
    tenant: str,
    user: str,
    ids: list[str],
    markers: dict[tuple[str, str, str], str],
    rng: random.Random,
) -> None:
    """Questions that carry markers: the user's own, another user's in the group quoting this one's,
    a turn context; and a summary."""
    m = {surface: markers[(tenant, user, surface)] for surface in SURFACES}
    await mem.recall(f"what about {m['own recall']} and {m['episode']}?", user_id=user, tenant=tenant)
    other = rng.choice([u for u in ids if u != user])
    await mem.recall(
        f"what did Speaker{user[1:]} say about {m['chat recall quoting']} and {m['mood']}?",
        user_id=other,
        chat_id=GROUP,
        tenant=tenant,
    )
    await mem.recall(f"{m['chat recall quoting']} {m['fact lives_in']}", chat_id=GROUP, tenant=tenant)
    await mem.turn_context(f"remember {m['turn_context']}?", user_id=user, chat_id=GROUP, tenant=tenant)
    await mem.summary(user_id=user, tenant=tenant)


async def _answers_hold(
    mem: Memory, user: str, ids: list[str], markers: dict[tuple[str, str, str], str]
) -> int:
    """How many answers still hold a forgotten user's markers (group, user and summary views)."""
    own = [markers[("default", user, s)] for s in SURFACES]
    query = " ".join(own)
    answers = [
        await mem.recall(query, chat_id=GROUP, tenant="default", k=50),
        await mem.recall(query, user_id=user, tenant="default", k=50),
        await mem.summary(user_id=user, tenant="default"),
    ]
    for other in ids:
        if other != user:
            answers.append(await mem.summary(user_id=other, tenant="default"))
    return sum(any(marker in to_json(a) for marker in own) for a in answers)


def _scan(
    folder: Path,
    forgotten: list[str],
    ids: list[str],
    markers: dict[tuple[str, str, str], str],
    vectors: dict[str, list[bytes]],
    report: LeakReport,
) -> None:
    files = folder_files(folder)
    report.files = {name: len(data) for name, data in files.items()}
    for user in forgotten:
        for surface in SURFACES:
            marker = markers[("default", user, surface)]
            report.counts["markers_forgotten"] += 1
            full, tail = marker_needles(marker, tail=7)
            where_full = occurrences(files, full)
            where_tail = occurrences(files, tail)
            report.counts["marker_hits"] += sum(where_full.values())
            report.counts["tail_hits"] += sum(where_tail.values())
            if where_full or where_tail:
                report.counts["leaked_markers"] += 1
                report.by_surface[surface] += 1
                for name in {**where_tail, **where_full}:
                    report.by_file[name] += 1
                report.examples.append(
                    f"{user} {surface} {marker}: whole in {sorted(where_full)}, tail in {sorted(where_tail)}"
                )
    for tenant in TENANTS:
        for user in ids:
            if tenant == "default" and user in forgotten:
                continue
            for surface in STORED:
                marker = markers[(tenant, user, surface)]
                report.counts["kept_markers"] += 1
                if any(occurrences(files, needle) for needle in marker_needles(marker, tail=7)):
                    report.counts["kept_markers_found"] += 1
                else:
                    report.kept_missing.append(f"{tenant}/{user} {surface} {marker}")
    for tenant in TENANTS:
        for user in ids:
            if tenant == "default" and user in forgotten:
                continue
            # An edit keeps the earlier text on purpose (meta "edits"); a deleted message is gone.
            for surface in ("deleted message",):
                marker = markers[(tenant, user, surface)]
                if any(occurrences(files, needle) for needle in marker_needles(marker, tail=7)):
                    report.deleted_messages_found.append(f"{tenant}/{user} {surface} {marker}")
    remaining = all_vectors(folder)
    for user in forgotten:
        for vector in vectors[user]:
            windows = vector_windows(vector, remaining)
            if not windows:
                report.counts["vectors_unverifiable"] += 1
                continue
            report.counts["vectors_checked"] += 1
            where: set[str] = set()
            for window in windows:
                where.update(occurrences(files, window))
            if where:
                report.counts["vectors_found"] += 1
                for name in where:
                    report.vectors_by_file[name] += 1
    # The control: vectors that stay are found by the same search.
    for vector in remaining[:: max(1, len(remaining) // 20)]:
        others = [v for v in remaining if v != vector]
        windows = vector_windows(vector, others)
        if windows:
            report.counts["kept_vectors_checked"] += 1
            report.counts["kept_vectors_found"] += any(occurrences(files, w) for w in windows)
