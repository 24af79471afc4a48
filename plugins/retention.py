"""Retention on a schedule: the people who have said nothing for ``inactive_days`` are forgotten,
every ``interval_hours``, inside a long-lived ``Memory``. Off by default (``inactive_days = 0``):
forgetting is the bot's author's promise to make, not narrmem's. The pass is
:meth:`narrmem.memory.Memory.forget_inactive` (what it counts as inactive, and why it refuses a
pass that would forget everyone, are in :mod:`narrmem.retention`); ``narrmem retention`` runs it
by hand and lists who would go.

Of the workers sharing a store, one runs each pass: each keeps its own timer, and the start of a
pass is a compare-and-set of the store's note of the last one. A worker that starts after a pass
was due (a bot restarted every night, whose timer never reached a day) runs one a minute after it
opens."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, field_validator

from narrmem import hookimpl, logs
from narrmem.configured import Configured
from narrmem.scheduled import begin_if_due, give_back, stop, time_of
from narrmem.to_the_end import to_the_end
from narrmem.view import MemoryView

NAME = "retention"
LAST_PASS = "last_pass"  # plugin state: when a worker last began a pass
FIRST_DELAY_S = 60.0  # a pass due at open waits this long: opening has work of its own
BUSY_RETRY_S = 600  # a pass that found another under way is tried again this much later
log = logs.logger("narrmem.retention")


class RetentionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inactive_days: float = Field(
        default=0.0,
        ge=0,
        le=36_500,
        description="people with nothing said for this many days are forgotten; 0 = off",
    )
    interval_hours: float = Field(default=24.0, ge=0.1, le=8_760, description="hours between passes")
    tenants: list[str] = Field(
        default_factory=list, description="the tenants the policy applies to; empty: every tenant"
    )

    @field_validator("inactive_days")
    @classmethod
    def _at_least_a_day(cls, value: float) -> float:
        # A fraction typed for a number of days (0.3) would forget whoever was quiet since morning.
        if 0 < value < 1:
            raise ValueError("must be 0 (off) or at least 1 day")
        return value


class Retention(Configured[RetentionOptions], name=NAME, options=RetentionOptions):
    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None

    @hookimpl
    async def narrmem_startup(self, memory: MemoryView) -> None:
        if self.options.inactive_days > 0 and not memory.read_only:
            first = await self._wait_before_first(memory)
            self._task = asyncio.get_running_loop().create_task(self._every_interval(memory, first))

    @hookimpl
    async def narrmem_shutdown(self) -> None:
        task, self._task = self._task, None
        await stop(task)

    async def _wait_before_first(self, memory: MemoryView) -> float:
        last = time_of(await memory.store.state_get(NAME, LAST_PASS))
        interval = self.options.interval_hours * 3600
        if last is None:
            return FIRST_DELAY_S
        since = (memory.clock.now() - last).total_seconds()
        return min(max(interval - since, FIRST_DELAY_S), interval)

    async def _every_interval(self, memory: MemoryView, first: float) -> None:
        await asyncio.sleep(first)
        while True:
            wait = self.options.interval_hours * 3600
            try:
                counts = await self.pass_if_due(memory)
                if counts is not None and counts.get("busy"):
                    wait = min(wait, BUSY_RETRY_S)
            except Exception:
                log.exception("retention pass failed; trying again next interval")
            await asyncio.sleep(wait)

    async def pass_if_due(self, memory: MemoryView) -> dict[str, int] | None:
        """Run a pass unless one of the store's workers began one within the interval (``None``
        then): forgets the people of each tenant of ``tenants`` (of every tenant when empty)
        who have said nothing for ``inactive_days``."""
        if self.options.inactive_days <= 0:
            return None
        now = memory.clock.now()
        interval = timedelta(hours=self.options.interval_hours)
        began = await begin_if_due(memory.store, NAME, LAST_PASS, now, interval)
        if began is None:
            return None
        try:
            counts = await self._pass(memory, now - timedelta(days=self.options.inactive_days))
        except asyncio.CancelledError:
            # Cut short (a close, a restart while it ran): the people it had not reached were left
            # a whole interval (a day) before the next pass looked at them again.
            await to_the_end(give_back(memory.store, NAME, LAST_PASS, began))
            raise
        if counts.get("busy"):
            # Another pass held the store (a command's, a call's): this one is still due.
            await give_back(memory.store, NAME, LAST_PASS, began)
            log.info("another retention pass is under way; trying again in %d minutes", BUSY_RETRY_S // 60)
        return counts

    async def _pass(self, memory: MemoryView, before: datetime) -> dict[str, int]:
        totals: dict[str, int] = {}
        tenants: list[str | None] = list(self.options.tenants) or [None]
        for tenant in tenants:
            counts = await memory.forget_inactive(before=before, tenant=tenant)
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
            if counts.get("busy") or counts.get("refused"):
                break  # the other tenants would find the same
        if not totals.get("busy"):
            log.info("retention pass (nothing said since %s): %s", before.isoformat(), totals)
        return totals
