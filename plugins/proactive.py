"""Proactive triggers: decide which of the counted patterns are worth telling the bot about.

Triage counts what comes back (topics, moods, values, habits). This plugin turns counts into
trigger events with a memory of what it already said:

* Topic heat fades: each mention counts ``0.5 ** (age / half_life)`` with a half-life of 14 days,
  so a mention a month ago counts about a fifth of one today. A topic fires when it has reached
  its count threshold *and* its heat is at least three quarters of it: three mentions this week
  fire, three mentions over three months do not.
* The same trigger does not fire again inside the cooldown (7 days) nor before its count has
  doubled since it last fired (3 → 6 → 12 ...).
* A topic that went quiet for ``quiet_days`` (30) and comes back is an event of its own
  (``topic_return``).
* A message dated more than ``fire_within_hours`` (24) before the clock is history (a backfill of
  old chats, a phone that was offline for days): it is counted, and fires nothing. Told to the
  bot, a year of imported chat was a burst of "you keep mentioning..." about last year.

What was fired is kept per user in the store's plugin state, and forgetting a user forgets it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import share
from narrmem.configured import Configured
from narrmem.errors import InputError
from narrmem.models import IngestResult, MemoryRecord, Message, PatternCount, Scope, TriggerEvent
from narrmem.view import MemoryView

NAME = "proactive"


class ProactiveOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic_half_life_days: float = Field(default=14.0, gt=0, le=3650)
    heat_ratio: float = share(0.75, "heat needed, as a share of the threshold")
    cooldown_days: float = Field(default=7.0, ge=0, le=3650)
    quiet_days: float = Field(default=30.0, gt=0, le=3650, description="silence after which a topic returns")
    topic_threshold: int = Field(default=3, ge=2, le=1000)
    emotion_threshold: int = Field(default=3, ge=2, le=1000)
    value_threshold: int = Field(default=2, ge=2, le=1000)
    habit_weeks: int = Field(default=3, ge=2, le=52)
    fire_within_hours: float = Field(
        default=24.0, gt=0, le=87_600, description="older messages are counted and fire nothing"
    )


class Proactive(Configured[ProactiveOptions], name=NAME, options=ProactiveOptions):
    def threshold(self, kind: str) -> int:
        return {
            "topic": self.options.topic_threshold,
            "emotion": self.options.emotion_threshold,
            "value": self.options.value_threshold,
            "habit": self.options.habit_weeks,
        }.get(kind, self.options.topic_threshold)

    def heat(self, times: list[datetime], now: datetime) -> float:
        half_life = self.options.topic_half_life_days
        return float(sum(0.5 ** (max(0.0, (now - t).total_seconds()) / 86_400 / half_life) for t in times))

    @hookimpl(trylast=True)
    async def narrmem_after_store(self, memory: MemoryView, message: Message, result: IngestResult) -> None:
        """Replace the raw threshold crossings with the events this policy lets through."""
        suggested = {(t.kind, t.label): t.suggestion for t in result.triggers}
        counted = {(c.kind, c.label) for c in result.counts}
        # Events that do not come from a count (another plugin's) pass through untouched.
        events: list[TriggerEvent] = [t for t in result.triggers if (t.kind, t.label) not in counted]
        for count in result.counts:
            for kind in await self._fire(memory, message, count):
                suggestion = suggested.get((kind, count.label)) or _suggestion(kind, count)
                events.append(count.event(message, kind=kind, suggestion=suggestion))
        result.triggers = events

    async def _fire(self, memory: MemoryView, message: Message, count: PatternCount) -> list[str]:
        # A message dated a little past the clock (within [storage] max_ts_ahead_s) fires as now:
        # a firing stored ahead would hold the next one back past its cooldown.
        clock_now = memory.clock.now()
        if clock_now - message.ts > timedelta(hours=self.options.fire_within_hours):
            return []  # history: counted (its counts are in the result), not news to tell the bot
        now = min(message.ts, clock_now)
        fired: list[str] = []
        times = sorted(count.times)
        # The silence before this mention, the latest: measured from the mentions around it, a
        # message that arrived late fired a second return, and one dated ahead a return a day.
        returned = (
            count.kind == "topic"
            and count.quiet_days_before is not None
            and count.quiet_days_before >= self.options.quiet_days
        )
        if not returned and count.count < self.threshold(count.kind):
            return []  # nothing can fire whatever the state says: it is not read (a count per message)
        key = state_key(message.tenant, message.user_id, count.kind, count.label)
        stored = state = await memory.store.state_get(NAME, key)
        if state is None:  # written before labels were hashed in keys
            legacy = f"{message.tenant}\0{message.user_id}\0{count.kind}\0{count.label}"
            state = await memory.store.state_get(NAME, legacy) or {}
        last_at, last_count = last_firing(state)
        cooling = last_at is not None and now - last_at < timedelta(days=self.options.cooldown_days)
        due = count.count >= self.threshold(count.kind) and count.count >= 2 * last_count
        hot = count.kind != "topic" or self.heat(times, now) >= self.options.heat_ratio * self.threshold(
            "topic"
        )
        if returned and not cooling:  # cooling: its hooks run again (after a crash) fire nothing
            fired.append("topic_return")
        if due and hot and not cooling:
            fired.append(count.kind)
        # Compare-and-set: workers sharing a store may count the same topic at once; only the one
        # whose write finds the state it read fires.
        if fired and not await memory.store.state_put_if(
            NAME, key, {"fired_at": now.isoformat(), "count": count.count}, stored
        ):
            return []
        return fired

    @hookimpl
    async def narrmem_pattern_firings(
        self, memory: MemoryView, user: Scope, patterns: list[PatternCount]
    ) -> list[dict[str, Any]]:
        """Read the firing state of each pattern; the label is known from ``patterns`` only (keys
        hold digests)."""
        fired: list[dict[str, Any]] = []
        for pattern in patterns:
            key = state_key(user.tenant, user.user_id or "", pattern.kind, pattern.label)
            state = await memory.store.state_get(NAME, key)
            if state is not None and "fired_at" in state:
                fired.append({"kind": pattern.kind, "label": pattern.label, **state})
        return fired

    @hookimpl
    def narrmem_check_state(self, namespace: str, key: str, value: dict[str, Any]) -> bool | None:
        """A pattern's last firing, as :meth:`_fire` writes it."""
        if namespace != NAME:
            return None
        check_entry(key, value)
        return True

    @hookimpl
    async def narrmem_after_forget(
        self, memory: MemoryView, tenant: str, user_id: str | None, removed: list[MemoryRecord]
    ) -> None:
        """Forgetting a user forgets what was said to them; deleting one message does not."""
        if user_id is not None:
            await memory.store.state_delete(NAME, f"{tenant}\0{user_id}\0")


def check_entry(key: str, value: dict[str, Any]) -> None:
    """Refuse a firing (of an imported file) that :func:`last_firing` would not read back."""
    parts = key.split("\0")
    if len(parts) != 4 or not all(parts):
        raise InputError("is not a key of a pattern's firing (tenant, user, kind, label digest)", field="key")
    if set(value) != {"fired_at", "count"}:
        raise InputError("a pattern's firing holds 'fired_at' and 'count'", field="value")
    when, count = last_firing(value)
    if when is None:
        raise InputError("must be an ISO-8601 time with its offset", field="value.fired_at")
    if count != value["count"] or count < 1:
        raise InputError("must be a whole number of mentions, 1 or more", field="value.count")


def last_firing(state: object) -> tuple[datetime | None, int]:
    """When a pattern last fired and at what count, from its stored state. The state may come from
    an imported file: what is not as this plugin writes it (a time with its offset, a count) counts
    as never fired, and the next firing writes it anew."""
    if not isinstance(state, dict):
        return None, 0
    fired_at, count = state.get("fired_at"), state.get("count", 0)
    try:
        when = datetime.fromisoformat(fired_at) if isinstance(fired_at, str) else None
    except ValueError:
        when = None
    if when is not None and when.utcoffset() is None:
        when = None  # compared with a message's aware time
    valid_count = isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 2**62
    return when, count if valid_count else 0


def state_key(tenant: str, user_id: str, kind: str, label: str) -> str:
    """Where a pattern's firing is kept. The label (the user's own words) goes in as a digest, so
    no key holds what the user said: a state row that outlives a forget (as rows did while prefix
    deletes stopped at the NUL in keys) gives nothing away."""
    digest = hashlib.sha256(label.encode("utf-8")).hexdigest()[:32]
    return f"{tenant}\0{user_id}\0{kind}\0{digest}"


def _suggestion(kind: str, count: PatternCount) -> str:
    if kind == "topic_return":
        return f"'{count.label}' is back after a long quiet. Ask what changed?"
    return f"'{count.label}' has come up {count.count} times. Worth asking about?"
