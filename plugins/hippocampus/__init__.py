"""The hippocampus: memories fade unless recalled. Decay lowers the chance of being recalled (a
weight in the ranking), it never deletes; every recall reinforces what it returned.

The curve is in ``curve.py``. The pass runs on a schedule inside a long-lived ``Memory``
(``[plugin.hippocampus] interval_minutes``) and on demand (``Memory.decay``, ``narrmem decay``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from narrmem_plugins.hippocampus.curve import FADED, PERMANENT, decay_starts_after, effective, reinforced
from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import Settings, plugin_options
from narrmem.models import Hit, ImportanceChange, MemoryRecord, RecallRequest

NAME = "hippocampus"
PAGE = 5_000
log = logging.getLogger("narrmem.hippocampus")


class HippocampusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval_minutes: float = Field(default=60.0, ge=0, le=10_080, description="decay pass interval; 0 = off")
    ranking_weight: float = Field(
        default=0.2, ge=0, le=1, description="how much importance after decay moves the ranking"
    )
    reinforce: bool = Field(default=True, description="recalled memories gain importance")


class Hippocampus:
    def __init__(self) -> None:
        self.options = HippocampusOptions()
        self._task: asyncio.Task[None] | None = None

    @hookimpl
    def narrmem_configure(self, settings: Settings) -> None:
        self.options = plugin_options(settings, NAME, HippocampusOptions)

    # --- schedule ---------------------------------------------------------------------------

    @hookimpl
    def narrmem_startup(self, memory: Any) -> None:
        if self.options.interval_minutes > 0:
            self._task = asyncio.get_running_loop().create_task(self._every_interval(memory))

    async def _every_interval(self, memory: Any) -> None:
        while True:
            await asyncio.sleep(self.options.interval_minutes * 60)
            try:
                counts = await memory.decay()
                log.info("decay pass: %s", counts)
            except Exception:
                log.exception("decay pass failed; trying again next interval")

    @hookimpl
    async def narrmem_shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --- the pass ---------------------------------------------------------------------------

    @hookimpl
    async def narrmem_decay(self, memory: Any, now: datetime) -> dict[str, int]:
        store = memory.store
        counts = {"memories": 0, "decaying": 0, "faded": 0, "permanent": 0, "updated": 0}
        after = 0
        while True:
            page = await store.importance_states(after, PAGE)
            if not page:
                break
            values, history = [], []
            for memory_id, importance, since, current in page:
                now_value = round(effective(importance, since, now), 6)
                counts["memories"] += 1
                counts["permanent"] += decay_starts_after(importance) is None
                counts["decaying"] += now_value < importance
                counts["faded"] += now_value < FADED
                if current is None or abs(current - now_value) > 1e-6:
                    values.append((memory_id, now_value))
                    if now_value < FADED <= (importance if current is None else current):
                        history.append((memory_id, NAME, f"faded below {FADED}", current, now_value))
            counts["updated"] += len(values)
            await store.set_current_importance(values, history, now)
            after = page[-1][0]
        return counts

    # --- recall -----------------------------------------------------------------------------

    @hookimpl
    def narrmem_weigh(self, memory: Any, records: dict[int, MemoryRecord]) -> dict[int, float]:
        now = memory.clock.now()
        beta = self.options.ranking_weight
        return {
            memory_id: (1.0 - beta) + beta * effective(r.importance, r.reinforced_at or r.created_at, now)
            for memory_id, r in records.items()
        }

    @hookimpl
    async def narrmem_after_recall(
        self, memory: Any, request: RecallRequest, hits: list[Hit], records: dict[int, MemoryRecord]
    ) -> None:
        if not (self.options.reinforce and request.reinforce and hits):
            return
        now = memory.clock.now()
        changes = []
        for hit in hits:
            record = records.get(hit.id)
            if record is None:
                continue
            new = round(reinforced(record.importance, record.reinforced_at or record.created_at, now), 6)
            changes.append(
                ImportanceChange(
                    memory_id=hit.id,
                    importance=new,
                    reinforced_at=now,
                    old=record.importance,
                    who="recall",
                    # The reason, never the query: a copy of what someone asked would outlive them.
                    why="recalled",
                )
            )
            hit.importance = new
        await memory.store.set_importance(changes, now)

    # --- reporting --------------------------------------------------------------------------

    @hookimpl
    async def narrmem_stats(self, memory: Any) -> dict[str, Any]:
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
