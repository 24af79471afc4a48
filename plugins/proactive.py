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
* An edit's new text fires nothing: the same mention, whose first text's firings were said.
* A message dated more than ``fire_within_hours`` (24) before the clock is history (a backfill of
  old chats, a phone that was offline for days): it is counted, and fires nothing. Told to the
  bot, a year of imported chat was a burst of "you keep mentioning..." about last year.

"The same trigger" is the same pattern: a firing keeps the ids of the memories it counted, and a
later count that counts one of them is that pattern again, whatever its label says (a topic is
named by its latest mentions' words, "basil garden" one day and "garden tomatoes" three days on).
What was fired is kept per person and kind in the store's plugin state (no words: memory ids),
and forgetting a person forgets it. A firing names no deleted memory: a chat's forget, a forget of
messages and a deletion of memories by id take the memories they delete out of the firings that
counted them, and a firing left with none goes (with a chat's forget, the firings of that chat).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import share
from narrmem.configured import Configured
from narrmem.errors import InputError, StoreError
from narrmem.models import IngestResult, MemoryRecord, Message, PatternCount, Scope, TriggerEvent
from narrmem.view import MemoryView

NAME = "proactive"
# A person's firings kept per kind (the newest), and the memories each keeps to be told apart by.
MAX_FIRINGS = 64
MAX_MEMORIES = 32
CAS_TRIES = 5
# The kinds of pattern the triage plugin counts: a person's firings are kept under these.
KINDS = ("topic", "emotion", "value", "habit")


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
    # Its hook decides on the triage plugin's counts and replaces its raw crossings: run again
    # for a message, each needs the other.
    narrmem_after_store_with = ("triage",)

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
        try:
            for count in result.counts:
                for kind in await self._fire(memory, message, count):
                    suggestion = suggested.get((kind, count.label)) or _suggestion(kind, count)
                    events.append(count.event(message, kind=kind, suggestion=suggestion))
        finally:
            # Also when the store goes away halfway: the raw crossings never reach the bot, only
            # what this policy let through (its hook, owed, decides the rest again later).
            result.triggers = events

    async def _fire(self, memory: MemoryView, message: Message, count: PatternCount) -> list[str]:
        # A message dated a little past the clock (within [storage] max_ts_ahead_s) fires as now:
        # a firing stored ahead would hold the next one back past its cooldown.
        clock_now = memory.clock.now()
        if clock_now - message.ts > timedelta(hours=self.options.fire_within_hours):
            return []  # history: counted (its counts are in the result), not news to tell the bot
        if _edited(message):
            # The same mention in new words: what its first text fired was said. Its episode has a
            # new id, so a return (whose firing keeps that one id) was told a second time.
            return []
        now = min(message.ts, clock_now)
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
        hot = count.kind != "topic" or self.heat(times, now) >= self.options.heat_ratio * self.threshold(
            "topic"
        )
        key = firings_key(message.tenant, message.user_id, count.kind)
        for _ in range(CAS_TRIES):
            stored = await memory.store.state_get(NAME, key)
            firings = read_firings(stored)
            last_at, last_count = last_firing(firings, count.memory_ids)
            cooling = last_at is not None and now - last_at < timedelta(days=self.options.cooldown_days)
            due = count.count >= self.threshold(count.kind) and count.count >= 2 * last_count
            fired: list[str] = []
            if returned and not cooling:  # cooling: its hooks run again (after a crash) fire nothing
                fired.append("topic_return")
            if due and hot and not cooling:
                fired.append(count.kind)
            if not fired:
                return []
            firing = {"fired_at": now.isoformat(), "count": count.count, "memories": newest(count.memory_ids)}
            # Compare-and-set: workers sharing a store may count the same pattern at once; only the
            # one whose write finds the state it read fires, and the other decides again on what
            # the winner wrote (its pattern may be another of this person's).
            if await memory.store.state_put_if(
                NAME, key, {"firings": [*firings, firing][-MAX_FIRINGS:]}, stored
            ):
                return fired
        return []

    @hookimpl
    async def narrmem_pattern_firings(
        self, memory: MemoryView, user: Scope, patterns: list[PatternCount]
    ) -> list[dict[str, Any]]:
        """The last firing of each pattern that has fired: the latest firing that counted one of
        the memories the pattern counts now."""
        fired: list[dict[str, Any]] = []
        firings_of: dict[str, list[dict[str, Any]]] = {}
        for pattern in patterns:
            if pattern.kind not in firings_of:
                key = firings_key(user.tenant, user.user_id or "", pattern.kind)
                firings_of[pattern.kind] = read_firings(await memory.store.state_get(NAME, key))
            when, count = last_firing(firings_of[pattern.kind], pattern.memory_ids)
            if when is not None:
                fired.append(
                    {
                        "kind": pattern.kind,
                        "label": pattern.label,
                        "fired_at": when.isoformat(),
                        "count": count,
                    }
                )
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
        """Forgetting a user forgets what was said to them; a chat's forget or a message's takes
        the memories it deleted out of the firings of the people who said them."""
        store = memory.store
        if user_id is not None:
            await store.state_delete(NAME, f"{tenant}\0{user_id}\0")
            return
        # Nothing removed: nothing to take out (an edit of a message that made no memory, an
        # empty chat). A forget finished after a crash has no records either: its firings keep
        # the ids of the memories it deleted (ids, no words) until the person's own forget.
        for person in sorted({r.user_id for r in removed}):
            await drop_deleted_memories(memory, tenant, person, {r.id for r in removed if r.id is not None})

    @hookimpl
    async def narrmem_after_delete(
        self, memory: MemoryView, tenant: str, removed: list[MemoryRecord]
    ) -> None:
        """Memories deleted by id: out of the firings that counted them."""
        for person in sorted({r.user_id for r in removed}):
            await drop_deleted_memories(memory, tenant, person, {r.id for r in removed if r.id is not None})


async def drop_deleted_memories(memory: MemoryView, tenant: str, user_id: str, deleted: set[int]) -> None:
    """Take the memories ``deleted`` out of ``user_id``'s firings; a firing left with none goes,
    and the person's entry of a kind left with no firing. Compare-and-set, as a firing is
    written: a worker firing meanwhile is not undone."""
    store = memory.store
    for kind in KINDS:
        key = firings_key(tenant, user_id, kind)
        for _ in range(CAS_TRIES):
            stored = await store.state_get(NAME, key)
            if stored is None:
                break
            firings = read_firings(stored)
            kept = []
            for firing in firings:
                left = [m for m in _memory_ids(firing) if m not in deleted]
                if left:
                    kept.append({**firing, "memories": left})
            if kept == stored.get("firings"):
                break
            if kept:
                done = await store.state_put_if(NAME, key, {"firings": kept}, stored)
            else:
                done = await store.state_delete_if(NAME, key, stored)
            if done:
                break
        else:
            raise StoreError(f"the {kind} firings of a person changed {CAS_TRIES} times while being read")


def _memory_ids(firing: dict[str, Any]) -> list[int]:
    memories = firing.get("memories")
    if not isinstance(memories, list):
        return []
    return [m for m in memories if isinstance(m, int) and not isinstance(m, bool)]


def check_entry(key: str, value: dict[str, Any]) -> None:
    """Refuse a person's firings (of an imported file) that :func:`read_firings` would not read
    back whole. A key of four parts is a firing as it was kept before firings were told apart by
    their memories (by a digest of the label): imported as it is, and read by nothing."""
    parts = key.split("\0")
    if len(parts) == 4 and all(parts):
        check_firing(value, "value")
        return
    if len(parts) != 3 or not all(parts):
        raise InputError("is not a key of a person's firings (tenant, user, kind)", field="key")
    firings = value.get("firings")
    if set(value) != {"firings"} or not isinstance(firings, list) or len(firings) > MAX_FIRINGS:
        raise InputError(
            f"a person's firings are a list of at most {MAX_FIRINGS} under 'firings'", field="value"
        )
    for n, firing in enumerate(firings):
        if not isinstance(firing, dict) or set(firing) != {"fired_at", "count", "memories"}:
            raise InputError("a firing holds 'fired_at', 'count' and 'memories'", field=f"value.firings.{n}")
        check_firing(firing, f"value.firings.{n}")
        memories = firing["memories"]
        if (
            not isinstance(memories, list)
            or len(memories) > MAX_MEMORIES
            or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in memories)
        ):
            raise InputError(
                f"must be a list of at most {MAX_MEMORIES} memory ids", field=f"value.firings.{n}.memories"
            )


def check_firing(firing: dict[str, Any], field: str) -> None:
    if not {"fired_at", "count"} <= set(firing):
        raise InputError("a pattern's firing holds 'fired_at' and 'count'", field=field)
    when, count = firing_time_and_count(firing)
    if when is None:
        raise InputError("must be an ISO-8601 time with its offset", field=f"{field}.fired_at")
    if count != firing["count"] or count < 1:
        raise InputError("must be a whole number of mentions, 1 or more", field=f"{field}.count")


def read_firings(state: object) -> list[dict[str, Any]]:
    """A person's firings of one kind, oldest first, from their stored state. The state may come
    from an imported file: what is not as this plugin writes it counts as no firing."""
    firings = state.get("firings") if isinstance(state, dict) else None
    return [f for f in firings if isinstance(f, dict)] if isinstance(firings, list) else []


def last_firing(firings: list[dict[str, Any]], memory_ids: list[int]) -> tuple[datetime | None, int]:
    """When the pattern that counts ``memory_ids`` last fired, and at what count: the latest
    firing that counted one of them. A topic's label is made from the words of its latest
    mentions, so it changes ("basil garden", "garden tomatoes") while the pattern is the same;
    what the firings counted does not."""
    counted = set(memory_ids)
    latest: tuple[datetime | None, int] = (None, 0)
    for firing in firings:
        memories = firing.get("memories")
        if not isinstance(memories, list) or counted.isdisjoint(m for m in memories if isinstance(m, int)):
            continue
        when, count = firing_time_and_count(firing)
        if when is not None and (latest[0] is None or when >= latest[0]):
            latest = (when, count)
    return latest


def firing_time_and_count(firing: dict[str, Any]) -> tuple[datetime | None, int]:
    """A firing's time and count; a time that is not one with its offset reads as no firing."""
    fired_at, count = firing.get("fired_at"), firing.get("count", 0)
    try:
        when = datetime.fromisoformat(fired_at) if isinstance(fired_at, str) else None
    except ValueError:
        when = None
    if when is not None and when.utcoffset() is None:
        when = None  # compared with a message's aware time
    valid_count = isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 2**62
    return when, count if valid_count else 0


def newest(memory_ids: list[int]) -> list[int]:
    """The memories a firing keeps to be told apart by: the newest, which stay counted longest."""
    return sorted(set(memory_ids))[-MAX_MEMORIES:]


def firings_key(tenant: str, user_id: str, kind: str) -> str:
    """Where a person's firings of one kind are kept. No key or value holds what they said: a
    firing keeps the ids of the memories it counted, not its label."""
    return f"{tenant}\0{user_id}\0{kind}"


def _suggestion(kind: str, count: PatternCount) -> str:
    if kind == "topic_return":
        return f"'{count.label}' is back after a long quiet. Ask what changed?"
    return f"'{count.label}' has come up {count.count} times. Worth asking about?"


def _edited(message: Message) -> bool:
    """Whether ``message`` is an edit's new text: narrmem's edit keeps the texts it replaced in
    ``meta["edits"]``, each with when it was replaced."""
    edits = message.meta.get("edits")
    return (
        bool(edits)
        and isinstance(edits, list)
        and all(isinstance(e, dict) and "replaced_at" in e for e in edits)
    )
