"""The hippocampus: memories fade unless used. Decay lowers the chance of being recalled (a
weight in the ranking), it never deletes. A memory is reinforced (+0.05) when it is brought back
and used, as a brain would: a recall reinforces at most ``reinforce_max_hits`` hits whose
similarity to the query clears ``reinforce_min_similarity``; ``Memory.mark_used`` reinforces what
the bot says it used; either at most once per ``reinforce_spacing_days``. Inspection never
reinforces. Each reinforcement is a history row with its reason (relevance, tool, used), never
the query.

The curve is in ``curve.py``. The pass runs on a schedule inside a long-lived ``Memory``
(``[plugin.hippocampus] interval_minutes``) and on demand (``Memory.decay``, ``narrmem decay``).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from narrmem_plugins.hippocampus.curve import FADED, PERMANENT, decay_starts_after, effective, reinforced
from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl, logs
from narrmem.config import share, similarity
from narrmem.configured import Configured
from narrmem.models import Hit, ImportanceChange, MemoryRecord, RecallRequest
from narrmem.scheduled import begin_if_due, stop
from narrmem.store import CachesDecayIfUnchanged, DecayedImportance, Store
from narrmem.view import MemoryView

NAME = "hippocampus"
PAGE = 5_000
# How far a memory's importance after decay moves before a pass writes it again. Decay moves a
# value by at most 0.00022 an hour (0.8 over a 150-day time constant): written every hour, a
# million memories were a million row updates an hour (on PostgreSQL, as many dead row versions)
# for a cache whose readers (the faded count, export) need it to three places.
CACHED_TO = 0.001
LAST_PASS = "last_scheduled_pass"  # plugin state: when a worker last began a scheduled pass
log = logs.logger("narrmem.hippocampus")


class HippocampusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval_minutes: float = Field(default=60.0, ge=0, le=10_080, description="decay pass interval; 0 = off")
    ranking_weight: float = share(0.2, "how much importance after decay moves the ranking")
    reinforce: bool = Field(default=True, description="relevant recalled memories gain importance")
    reinforce_min_similarity: float = similarity(
        0.45,
        "a recalled memory is reinforced only with at least this cosine similarity to the query",
    )
    reinforce_max_hits: int = Field(
        default=3, ge=0, le=200, description="most memories reinforced per recall"
    )
    reinforce_spacing_days: float = Field(
        default=1.0, ge=0, le=3650, description="a memory is reinforced at most once in this many days"
    )


class Hippocampus(Configured[HippocampusOptions], name=NAME, options=HippocampusOptions):
    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None

    # --- schedule ---------------------------------------------------------------------------

    @hookimpl
    def narrmem_startup(self, memory: MemoryView) -> None:
        if self.options.interval_minutes > 0:
            self._task = asyncio.get_running_loop().create_task(self._every_interval(memory))

    async def _every_interval(self, memory: MemoryView) -> None:
        while True:
            await asyncio.sleep(self.options.interval_minutes * 60)
            try:
                if await self._pass_due(memory):
                    counts = await memory.decay()
                    log.info("decay pass: %s", counts)
            except Exception:
                log.exception("decay pass failed; trying again next interval")

    async def _pass_due(self, memory: MemoryView) -> bool:
        """Whether this worker runs the scheduled pass now: none of the store's workers began one
        within the interval (each keeps its own timer, and three workers each read every memory
        every hour), and this one's start won (:mod:`narrmem.scheduled`). A pass asked for
        (``Memory.decay``, ``narrmem decay``) runs whenever asked."""
        interval = timedelta(minutes=self.options.interval_minutes)
        return await begin_if_due(memory.store, NAME, LAST_PASS, memory.clock.now(), interval) is not None

    @hookimpl
    async def narrmem_shutdown(self) -> None:
        # Taken off the plugin before the wait, so a second shutdown finds nothing to cancel.
        task, self._task = self._task, None
        await stop(task)

    # --- the pass ---------------------------------------------------------------------------

    @hookimpl
    async def narrmem_decay(self, memory: MemoryView, now: datetime) -> dict[str, int]:
        exclusive = getattr(memory.store, "exclusive", None)
        if exclusive is None:  # a store older than the protocol's exclusive()
            return await self._decay_pass(memory, now)
        # Workers sharing a store run the pass one at a time; a worker that finds it running skips.
        async with exclusive("decay") as mine:
            if not mine:
                return {"memories": 0, "decaying": 0, "faded": 0, "permanent": 0, "updated": 0, "skipped": 1}
            return await self._decay_pass(memory, now)

    async def _decay_pass(self, memory: MemoryView, now: datetime) -> dict[str, int]:
        store = memory.store
        counts = {"memories": 0, "decaying": 0, "faded": 0, "permanent": 0, "updated": 0}
        after = 0
        while True:
            page = await store.importance_states(after, PAGE)
            if not page:
                break
            decayed: list[DecayedImportance] = []
            for memory_id, importance, since, current in page:
                now_value = round(effective(importance, since, now), 6)
                counts["memories"] += 1
                counts["permanent"] += decay_starts_after(importance) is None
                counts["decaying"] += now_value < importance
                counts["faded"] += now_value < FADED
                if current is None or _moved(current, now_value):
                    faded = now_value < FADED <= (importance if current is None else current)
                    note = (NAME, f"faded below {FADED}") if faded else None
                    decayed.append(DecayedImportance(memory_id, now_value, importance, current, note))
            counts["updated"] += await _cache(store, decayed, now)
            after = page[-1][0]
        return counts

    # --- recall -----------------------------------------------------------------------------

    @hookimpl
    def narrmem_weigh(self, memory: MemoryView, records: dict[int, MemoryRecord]) -> dict[int, float]:
        now = memory.clock.now()
        beta = self.options.ranking_weight
        return {
            memory_id: (1.0 - beta) + beta * effective(r.importance, r.reinforced_at or r.created_at, now)
            for memory_id, r in records.items()
        }

    @hookimpl
    async def narrmem_after_recall(
        self, memory: MemoryView, request: RecallRequest, hits: list[Hit], records: dict[int, MemoryRecord]
    ) -> None:
        """Reinforce what was brought back *and* is about the query: the best few hits whose
        similarity to the query clears ``reinforce_min_similarity`` (a keyword match alone is not
        enough), each at most once per spacing window. A search passing over a memory is not use."""
        if not (self.options.reinforce and request.reinforce and hits):
            return
        chosen = [
            records[hit.id]
            for hit in hits
            if hit.id in records
            and hit.why is not None
            and hit.why.dense is not None
            and hit.why.dense >= self.options.reinforce_min_similarity
        ][: self.options.reinforce_max_hits]
        done = await self._reinforce(memory, chosen, request.reason)
        for hit in hits:
            if hit.id in done:
                # Reinforced now: decay starts again from the new value (``base_importance``).
                hit.importance = hit.base_importance = done[hit.id]

    @hookimpl
    async def narrmem_used(self, memory: MemoryView, records: list[MemoryRecord]) -> list[int]:
        if not self.options.reinforce:
            return []
        return sorted(await self._reinforce(memory, records, "used"))

    async def _reinforce(self, memory: MemoryView, records: list[MemoryRecord], why: str) -> dict[int, float]:
        now = memory.clock.now()
        spacing = timedelta(days=self.options.reinforce_spacing_days)
        changes = []
        for record in records:
            assert record.id is not None
            last = record.reinforced_at
            # Spaced repetition: recalling twice in a day is not learning twice, though the use
            # before was noted by a worker whose clock is a little ahead. One noted further ahead
            # than the spacing was noted by a clock that was wrong: it blocked every use for as long.
            if last is not None and -spacing < now - last < spacing:
                continue
            since = last or record.created_at
            new = round(reinforced(record.importance, since, now), 6)
            if record.importance >= PERMANENT and new <= record.importance:
                # Nothing changes for a permanent memory at its cap (its clock starts no decay):
                # written anyway, it logged "1.0 -> 1.0" every day, and once per worker at a time
                # (the compare-and-set saw the same value before and after).
                continue
            changes.append(
                ImportanceChange(
                    memory_id=record.id,
                    importance=new,
                    reinforced_at=now,
                    old=record.importance,
                    who="recall" if why != "used" else "bot",
                    # The reason, never the query: a copy of what someone asked would outlive them.
                    why=why,
                )
            )
        if not changes:
            return {}
        # Only what was written: a recall or worker that reinforced one of them meanwhile won.
        written = set(await memory.store.set_importance(changes, now))
        return {c.memory_id: c.importance for c in changes if c.memory_id in written}

    @hookimpl
    def narrmem_importance_now(self, records: list[MemoryRecord], now: datetime) -> dict[int, float]:
        return {
            r.id: round(effective(r.importance, r.reinforced_at or r.created_at, now), 6)
            for r in records
            if r.id is not None
        }

    # --- reporting --------------------------------------------------------------------------

    @hookimpl
    async def narrmem_stats(self, memory: MemoryView) -> dict[str, Any]:
        return {"faded": await memory.store.count_below(FADED)}

    @hookimpl
    def narrmem_history(self, record: MemoryRecord, now: datetime) -> dict[str, Any]:
        since = record.reinforced_at or record.created_at
        start = decay_starts_after(record.importance)
        return {
            "importance_now": round(effective(record.importance, since, now), 6),
            "permanent": record.importance >= PERMANENT,
            "decay_clock_started": since.isoformat(),
            "decay_starts": None if start is None else (since + timedelta(days=start)).isoformat(),
            "projection": [
                {
                    "days": days,
                    "importance": round(effective(record.importance, since, now + timedelta(days=days)), 6),
                }
                for days in (0, 7, 30, 90, 180, 365)
            ],
        }


def _moved(cached: float, value: float) -> bool:
    """Whether a cached value is to be written again: moved by more than ``CACHED_TO``, or to the
    other side of the faded line."""
    return abs(cached - value) > CACHED_TO or (cached < FADED) != (value < FADED)


async def _cache(store: Store, decayed: list[DecayedImportance], now: datetime) -> int:
    """Write a page's values; how many were written. A reinforcement that lands while the page is
    computed keeps its value (the store compares what the pass read), on a store that can."""
    if isinstance(store, CachesDecayIfUnchanged):
        return len(await store.set_decayed_importance(decayed, now))
    history = [
        (d.memory_id, d.history[0], d.history[1], d.cached, d.value) for d in decayed if d.history is not None
    ]
    await store.set_current_importance([(d.memory_id, d.value) for d in decayed], history, now)
    return len(decayed)
