"""The patterns a user shows now, read back from what is stored: the topics that keep coming back
and the moods said again and again, counted the way ingest counts them (same windows, same
similarity and shared-word rules), so an inspector sees them after a restart and in any worker.

Reading only: nothing is written, and a forgotten message or user is simply no longer counted.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import numpy as np
from narrmem_plugins.triage.counters import CJK_TOPIC_SIMILARITY, Counters, topic_label
from narrmem_plugins.triage.emotions import moods_of
from narrmem_plugins.triage.language import has_cjk

from narrmem.models import MemoryRecord, PatternCount, Scope
from narrmem.view import MemoryView

# The newest in the window: an inspector's answer, not an archive scan (past it, counts are
# marked as lower bounds).
MAX_EPISODES = 2000


async def patterns(memory: MemoryView, counters: Counters, user: Scope, now: datetime) -> list[PatternCount]:
    options = counters.options
    since = now - timedelta(days=max(options.topic_window_days, options.emotion_window_days))
    found = await memory.store.recent(user, since=since, kinds=["episode"], limit=MAX_EPISODES)
    episodes = sorted((r for r in found if r.created_at <= now), key=lambda r: (r.created_at, r.id or 0))
    moods = _moods(episodes, now - timedelta(days=options.emotion_window_days))
    topical = [r for r in episodes if r.created_at >= now - timedelta(days=options.topic_window_days)]
    topics = await _topics(memory, counters, user, topical)
    found_all = len(found) < MAX_EPISODES
    # Older mentions in the window were not read: each count is a lower bound.
    counts = [p if found_all else p.model_copy(update={"at_least": True}) for p in [*moods, *topics]]
    return sorted(counts, key=lambda p: (-p.count, p.kind, p.label))


def _moods(episodes: list[MemoryRecord], since: datetime) -> list[PatternCount]:
    said: dict[str, list[MemoryRecord]] = {}
    for record in episodes:
        if record.created_at >= since:
            for mood in moods_of(record.meta):
                said.setdefault(str(mood), []).append(record)
    return [_pattern("emotion", mood, members) for mood, members in said.items() if len(members) >= 2]


async def _topics(
    memory: MemoryView, counters: Counters, user: Scope, episodes: list[MemoryRecord]
) -> list[PatternCount]:
    ids = [r.id for r in episodes if r.id is not None]
    stored = await memory.store.vectors(ids, user)
    kept = [r for r in episodes if r.id in stored]
    if len(kept) < 2:
        return []
    matrix = np.stack([stored[r.id] for r in kept if r.id is not None])
    # Thousands of episodes compared pairwise, with their words: off the event loop, which serves
    # every other request meanwhile.
    return await asyncio.to_thread(_topic_counts, counters, kept, matrix)


def _topic_counts(counters: Counters, kept: list[MemoryRecord], matrix: np.ndarray) -> list[PatternCount]:
    similarity = matrix @ matrix.T
    # As at ingest: each message counts the earlier ones on its topic; a topic's figure is the
    # count at its latest mention. Newest first, so a label's first appearance is its latest.
    best: dict[str, PatternCount] = {}
    for i in range(len(kept) - 1, 0, -1):
        episode = kept[i]
        threshold = CJK_TOPIC_SIMILARITY if has_cjk(episode.text) else counters.options.topic_similarity
        close = np.flatnonzero(similarity[i, : i + 1] >= threshold)
        members = [kept[j] for j in close.tolist() if counters.same_topic(episode, kept[j])]
        shared = set.intersection(*(set(moods_of(r.meta)) for r in members))
        if len(members) < 2 or shared:
            continue  # messages alike because they state one mood are the mood counter's
        label = topic_label([r.text for r in members], counters.options.names)
        best.setdefault(label, _pattern("topic", label, members))
    return list(best.values())


def _pattern(kind: str, label: str, members: list[MemoryRecord]) -> PatternCount:
    return PatternCount(
        kind=kind,
        label=label,
        count=len(members),
        message_ids=[mid for r in members for mid in r.message_ids],
        times=[r.created_at for r in members],
        memory_ids=[r.id for r in members if r.id is not None],
    )
