"""Time as a bot's months bring it: a message that arrives late, a device clock running ahead, a
topic back after a long silence, a core memory used every day, a clock that gives naive times.
Counts and triggers stay true, a return fires once, and nothing logs changes that change nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem import InputError, Message, Scope, TriageDecision, hookimpl
from narrmem.clock import ManualClock
from narrmem.memory import Memory
from narrmem.testing import open_memory

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
ROADMAP = "product roadmap review with the team"


def at(days: float) -> str:
    return (T0 + timedelta(days=days)).isoformat()


async def kinds(memory: Memory, clock: ManualClock, message_id: str, day: float, text: str) -> list[str]:
    """The triggers a message of ``day`` fires, the clock moved on to it (or past it, for one that
    arrives late)."""
    clock.set(max(clock.now(), T0 + timedelta(days=day)))
    result = await memory.ingest(msg(message_id, text, ts=at(day)))
    return [t.kind for t in result.triggers]


async def test_a_topic_returns_once_though_a_message_about_it_arrives_late(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        assert await kinds(memory, clock, "1", 0, ROADMAP) == []
        assert await kinds(memory, clock, "2", 45, f"{ROADMAP} again") == ["topic_return"]
        # Sent on day 1, it reaches the bot after day 45 (an offline phone): not a return.
        assert await kinds(memory, clock, "3", 1, f"{ROADMAP} once more") == []
        assert await kinds(memory, clock, "4", 46, f"{ROADMAP} today") == []


@pytest.mark.parametrize("quiet", [45, 91, 300])
async def test_a_topic_back_after_any_long_silence_returns(tmp_path: Path, quiet: int) -> None:
    """The counting window is 90 days: a topic back after 91 had no earlier mention in it, and
    its return never fired."""
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        assert await kinds(memory, clock, "1", 0, ROADMAP) == []
        assert await kinds(memory, clock, "2", 1, f"{ROADMAP} again") == []
        assert "topic_return" in await kinds(memory, clock, "3", 1 + quiet, f"{ROADMAP} back")


async def test_a_message_dated_far_past_the_clock_is_refused_and_counts_nothing(tmp_path: Path) -> None:
    """A phone a year ahead: its 'tired' was stored a year ahead, every later week counted it, and
    the trigger it fired held the real one back until that date."""
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        with pytest.raises(InputError) as refused:
            await memory.ingest(msg("x", "so tired today", ts=at(365)))
        assert refused.value.field == "ts" and "max_ts_ahead_s" in str(refused.value)
        with pytest.raises(InputError) as in_batch:
            await memory.ingest_many([msg("a", "hello", ts=at(0)), msg("b", "so tired", ts=at(400))])
        assert in_batch.value.field == "messages[1].ts"
        assert (await memory.stats())["memories"] == 0
        # Within the allowance (a device a few hours ahead) it is taken.
        assert (await memory.ingest(msg("y", "so tired today", ts=at(0.2)))).stored
        fired: list[str] = []
        for day in (1, 2, 3):
            fired += await kinds(memory, clock, f"t{day}", day, "so tired again today")
        assert fired == ["emotion"]


async def test_an_edit_dated_far_past_the_clock_is_refused_and_keeps_the_old_text(tmp_path: Path) -> None:
    """The edit forgot the old text, then its ingest refused the new one: neither was left."""
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest(msg("1", "I moved to Lisbon last spring", ts=at(0)))
        with pytest.raises(InputError) as refused:
            await memory.edit(msg("1", "I moved to Porto last spring", ts=at(2)))
        assert refused.value.field == "ts"
        kept = [record.text async for record, _ in memory.store.export()]
        assert kept == ["I moved to Lisbon last spring"]
        edited = await memory.edit(msg("1", "I moved to Porto last spring", ts=at(0)))
        assert edited.stored


async def test_a_trigger_dated_a_little_ahead_is_stored_at_the_clocks_now(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        fired = []
        for n in range(3):
            result = await memory.ingest(msg(f"t{n}", "so tired today", ts=at(0.5)))  # 12 hours ahead
            fired += [t.kind for t in result.triggers]
        assert fired == ["emotion"]
        clock.set(T0 + timedelta(days=1))
        [firing] = (await memory.patterns(user_id="u1"))["triggers"]
        assert datetime.fromisoformat(firing["fired_at"]) == T0  # the clock's now when it fired


class FixedImportance:
    narrmem_name = "fixed_importance"

    @hookimpl(tryfirst=True)
    def narrmem_triage(self, message: Message) -> TriageDecision:
        return TriageDecision(layer="accumulate", importance=float(message.meta["importance"]))


async def test_a_core_memory_at_its_cap_logs_no_change_however_often_it_is_used(tmp_path: Path) -> None:
    """Three handlers used it at once: three rows of "1.0 -> 1.0" at one instant; used daily, one
    such row a day for ever."""
    clock = ManualClock(T0)
    plugin: Any = {"hippocampus": {"reinforce": True}}
    async with open_memory(tmp_path / "m", clock=clock, plugins=[FixedImportance()], plugin=plugin) as memory:
        core = await memory.ingest(msg("a", "saffron glacier piano", ts=at(0), meta={"importance": 1.0}))
        other = await memory.ingest(msg("b", "maple violin harbour", ts=at(0), meta={"importance": 0.6}))
        [a], [b] = core.memory_ids, other.memory_ids
        for day in range(1, 20):
            clock.set(T0 + timedelta(days=day, hours=1))
            await asyncio.gather(*(memory.mark_used([a, b], user_id="u1") for _ in range(3)))
        assert (await memory.history(a))["events"] == []
        events = (await memory.history(b))["events"]
        assert len({e["at"] for e in events}) == len(events)  # once a day at most, though three asked
        assert events and events[-1]["new"] >= events[0]["old"]


class NaiveClock:
    def now(self) -> datetime:
        return datetime(2026, 5, 1, 12)


async def test_a_clock_that_gives_naive_times_is_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(InputError) as refused:
        async with open_memory(tmp_path / "m", clock=NaiveClock()):
            pass
    assert refused.value.field == "clock" and "timezone-aware" in str(refused.value)


async def test_a_backfill_of_old_chat_is_counted_and_fires_nothing(tmp_path: Path) -> None:
    """A bot that loads a year of history with ``ingest_many``: each week of it that crossed a
    threshold was told to the bot as news."""
    delivered: list[str] = []
    clock = ManualClock(T0 + timedelta(days=400))
    default: Any = {"proactive": {"fire_within_hours": 24}}  # the tests' own default is ten years
    async with open_memory(tmp_path / "m", clock=clock, plugin=default) as memory:

        async def callback(event: Any) -> None:
            delivered.append(event.kind)

        memory.on_trigger(callback)
        old = [msg(f"h{n}", f"{ROADMAP} {n}", ts=at(n / 10)) for n in range(6)]
        old += [msg(f"t{n}", "so tired today", ts=at(397 + n)) for n in range(2)]  # two and three days ago
        results = await memory.ingest_many(old, acknowledge="after_hooks")
        assert [t for r in results for t in r.triggers] == [] and delivered == []
        counted = {c.kind: c.count for r in results for c in r.counts}
        assert counted == {"topic": 6, "emotion": 2}  # history is counted as ever
        # A live message counts the history before it, and is news.
        live = await memory.ingest(
            msg("now1", "so tired again today", ts=at(399.9)), acknowledge="after_hooks"
        )
        assert [t.kind for t in live.triggers] == ["emotion"] and delivered == ["emotion"]
    # The same six mentions met as they happened fire as before.
    fresh = ManualClock(T0)
    async with open_memory(tmp_path / "live", clock=fresh, plugin=default) as memory:
        fired = []
        for n in range(6):
            fresh.set(T0 + timedelta(days=n / 10))
            result = await memory.ingest(msg(f"h{n}", f"{ROADMAP} {n}", ts=at(n / 10)))
            fired += [t.kind for t in result.triggers]
        assert fired == ["topic"]


async def test_a_history_imported_after_this_weeks_messages_is_counted_as_of_its_own_time(
    tmp_path: Path,
) -> None:
    """Counted as of the clock's now, a 'tired' of last year imported after this week's two
    counted them: a "said 'tired' 3 times this week" scene dated a year ago, quoting messages a
    year apart, and a topic mention 'back' after minus 298 quiet days."""
    clock = ManualClock(T0 + timedelta(days=400))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        for n in (1, 2):
            await memory.ingest(msg(f"live{n}", "so tired after work today, exhausted", ts=at(400 - n)))
        for n in (3, 2):
            await memory.ingest(msg(f"g{n}", "my vegetable garden tomatoes are growing", ts=at(400 - n)))
        old = [
            msg("o1", "we went hiking in the mountains with the kids", ts=at(10)),
            msg("o2", "so tired after the hike, exhausted", ts=at(11)),
            msg("o3", "my vegetable garden tomatoes are growing", ts=at(100)),
        ]
        results = await memory.ingest_many(old, history=True)
        counts = {(c.kind, c.label): c for r in results for c in r.counts}
        tired = [c for (kind, _), c in counts.items() if kind == "emotion"]
        assert [c.count for c in tired] == [1]
        assert all(t <= T0 + timedelta(days=11) for t in tired[0].times)
        garden = [c for (kind, _), c in counts.items() if kind == "topic"]
        assert all(c.count == 1 and (c.quiet_days_before or 0) >= 0 for c in garden)
        patterns = await memory.store.recent(
            Scope(tenant="default", user_id="u1"), kinds=["scene"], limit=100, meta_has=("type", "pattern")
        )
        assert patterns == []


@pytest.mark.parametrize("how", ["one by one", "in one call", "after today's"])
async def test_a_scene_of_an_imported_history_is_told_with_what_was_said_just_before_it(
    tmp_path: Path, how: str
) -> None:
    """A scene's vibe comes from the speaker's messages of the two hours before it. Imported in
    one call, the messages before it were not written yet; imported after today's messages, the
    window read today's twelve newest and dropped them as later: either way the scene was told
    as if nothing had been said before it."""
    clock = ManualClock(T0 + timedelta(days=400))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        if how == "after today's":
            today = [
                msg(
                    f"t{n}",
                    f"went climbing with Tom at the gym, route {n} was hard",
                    ts=at(400 - (60 - n) / 1440),
                )
                for n in range(15)
            ]
            await memory.ingest_many(today)
        history = [
            msg("h1", "I'm so stressed and anxious about work, I can't sleep", ts=at(35)),
            msg("h2", "I decided to quit my job at the bank and start a bakery", ts=at(35 + 5 / 1440)),
        ]
        if how == "in one call":
            await memory.ingest_many(history, history=True)
        else:
            for message in history:
                await memory.ingest(message)
        [scene] = [
            r
            for r in await memory.store.recent(
                Scope(tenant="default", user_id="u1"), kinds=["scene"], limit=100
            )
            if "bakery" in r.text
        ]
        assert "stressed" in scene.text.split("Vibe:")[1].split("\n")[0], scene.text


async def test_what_a_trigger_callback_ingests_is_checked_as_any_callers(tmp_path: Path) -> None:
    """Within the integrations' platform dating, a callback of a trigger that ingested a message
    of its own dated days ahead had it stored: the context passed on to it."""
    from narrmem import ClockBehindError
    from narrmem.ingest import dated_by_platform

    clock = ManualClock(T0 + timedelta(days=10))
    refused: list[str] = []
    default: Any = {"proactive": {"fire_within_hours": 24}}
    async with open_memory(tmp_path / "m", clock=clock, plugin=default) as memory:

        async def callback(event: Any) -> None:
            try:
                await memory.ingest(msg("cb1", "a note dated ahead", user="bot", ts=at(15)))
            except ClockBehindError as exc:
                refused.append(exc.field or "")

        memory.on_trigger(callback)
        with dated_by_platform():
            for n in range(3):
                await memory.ingest(
                    msg(f"t{n}", "so tired today", ts=at(10 - (2 - n) / 24)), acknowledge="after_hooks"
                )
        assert refused == ["ts"]
        assert not await memory.store.recent(Scope(tenant="default", user_id="bot"), limit=5)
