"""Decay, reinforcement, history, trigger delivery and the soul_narrative tool, with an injected
clock. Reinforcement is on here (the rest of the suite turns it off, see conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from _postgres import fresh_database
from narrmem_plugins.hippocampus.curve import FADED, effective

from narrmem import InputError, ManualClock, Memory, Message, TriageDecision, hookimpl
from narrmem.testing import open_memory

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
REINFORCE = {"hippocampus": {"reinforce": True, "interval_minutes": 0}}


class FixedImportance:
    """Keeps every message with the importance written in its meta."""

    narrmem_name = "fixed_importance"

    @hookimpl(tryfirst=True)
    def narrmem_triage(self, message: Message) -> TriageDecision:
        return TriageDecision(layer="accumulate", importance=float(message.meta["importance"]))


async def _memory(tmp_path: Path, clock: ManualClock) -> Memory:
    return await open_memory(tmp_path / "m", clock=clock, plugins=[FixedImportance()], plugin=REINFORCE)


async def _one(mem: Memory, importance: float, text: str = "the allotment tomatoes ripened early") -> int:
    result = await mem.ingest(msg(f"m{importance}", text, ts=T0.isoformat(), meta={"importance": importance}))
    return result.memory_ids[0]


async def _now_importance(mem: Memory, memory_id: int, day: float) -> float:
    await mem.decay(T0 + timedelta(days=day))
    [(current,)] = await store_sql(mem, "SELECT current_importance FROM memories WHERE id = ?", [memory_id])
    return float(current)


@pytest.mark.parametrize(
    ("importance", "unchanged_day", "lower_day"),
    [(0.4, 6, 8), (0.6, 29, 31), (0.75, 89, 91), (0.9, 1000, None)],
)
async def test_the_decay_curve(
    tmp_path: Path, importance: float, unchanged_day: int, lower_day: int | None
) -> None:
    clock = ManualClock(T0)
    async with await _memory(tmp_path, clock) as mem:
        memory_id = await _one(mem, importance)
        assert await _now_importance(mem, memory_id, unchanged_day) == pytest.approx(importance)
        if lower_day is not None:
            assert await _now_importance(mem, memory_id, lower_day) < importance


async def test_below_half_fades_to_a_twentieth_within_a_year(tmp_path: Path) -> None:
    async with await _memory(tmp_path, ManualClock(T0)) as mem:
        memory_id = await _one(mem, 0.49)
        assert await _now_importance(mem, memory_id, 7 + 365) <= 0.05
        assert (await mem.stats())["faded"] == 1
        # Faded is not deleted: a query that matches it well still finds it.
        hits = await mem.recall("allotment tomatoes ripened", user_id="u1")
        assert [h.id for h in hits] == [memory_id]


def test_the_curve_is_monotone_and_never_negative() -> None:
    for importance in (0.0, 0.1, 0.49, 0.5, 0.69, 0.7, 0.79):
        values = [effective(importance, T0, T0 + timedelta(days=d)) for d in range(0, 2000, 7)]
        assert all(a >= b >= 0 for a, b in itertools.pairwise(values))


async def test_a_decay_pass_twice_at_the_same_time_changes_nothing(tmp_path: Path) -> None:
    async with await _memory(tmp_path, ManualClock(T0)) as mem:
        await _one(mem, 0.3, "first")
        await _one(mem, 0.45, "second one")
        later = T0 + timedelta(days=400)
        first = await mem.decay(later)
        memories = "SELECT id, importance, current_importance FROM memories ORDER BY id"
        history = "SELECT * FROM memory_history ORDER BY id"
        before = [await store_sql(mem, memories), await store_sql(mem, history)]
        second = await mem.decay(later)
        assert first["updated"] == 2 and second["updated"] == 0
        assert [await store_sql(mem, memories), await store_sql(mem, history)] == before


async def test_a_use_during_a_decay_pass_keeps_its_value_and_is_not_logged_as_faded(tmp_path: Path) -> None:
    """A memory used between the pass's read of its page and the page's write: the pass's value,
    computed from the importance before, would overwrite the fresh one and log the memory just
    used as faded (a stale ``current_importance`` and a faded count until the next pass)."""
    day = T0 + timedelta(days=250)  # 0.4 decayed from T0: about 0.079, below 0.1
    clock = ManualClock(day)
    async with await _memory(tmp_path, clock) as mem:
        used = await _one(mem, 0.4)
        untouched = await _one(mem, 0.39, "the shed roof leaks when it rains")
        store = mem.store
        read_page = store.importance_states

        async def use_after_the_read(after_id: int, limit: int) -> list[Any]:
            page = await read_page(after_id, limit)
            if page:
                assert await mem.mark_used([used], user_id="u1") == [used]
            return page

        store.importance_states = use_after_the_read  # type: ignore[method-assign]
        try:
            counts = await mem.decay(day)
        finally:
            del store.importance_states
        values = dict(await store_sql(mem, "SELECT id, current_importance FROM memories"))
        [use] = (await mem.history(used))["events"]
        # Used: what it was worth now, plus the reinforcement, its decay clock restarting.
        assert (use["who"], use["old"]) == ("bot", 0.4)
        assert use["new"] == pytest.approx(effective(0.4, T0, day) + 0.05, abs=1e-6)
        assert values[used] == use["new"] >= 0.1  # the reinforced value, not the pass's
        assert values[untouched] == pytest.approx(effective(0.39, T0, day), abs=1e-6)
        assert values[untouched] < 0.1
        assert counts["updated"] == 1
        assert [e["who"] for e in (await mem.history(untouched))["events"]] == ["hippocampus"]
        assert (await mem.stats())["faded"] == 1
        # The next pass computes the used memory from its new state; nothing left to correct.
        assert (await mem.decay(day))["updated"] == 0


async def test_a_pass_rewrites_a_value_only_once_it_has_moved_or_faded(tmp_path: Path) -> None:
    """The hourly pass left most rows alone: a value is written again once it moved by more than
    ``CACHED_TO``, or crossed the faded line however little it moved."""
    async with await _memory(tmp_path, ManualClock(T0)) as mem:
        memory_id = await _one(mem, 0.4)
        cached = "SELECT current_importance FROM memories"
        day = T0 + timedelta(days=30)
        assert (await mem.decay(day))["updated"] == 1
        assert (await mem.decay(day + timedelta(hours=1)))["updated"] == 0
        assert (await mem.decay(day + timedelta(hours=8)))["updated"] == 0
        assert await store_sql(mem, cached) == [(pytest.approx(effective(0.4, T0, day), abs=1e-6),)]
        assert (await mem.decay(day + timedelta(days=2)))["updated"] == 1
        # 0.4 falls to 0.1 some 208 days after its decay starts (day 7): an hour either side.
        crossing = T0 + timedelta(days=7 + 150 * math.log(4))
        assert (await mem.decay(crossing - timedelta(hours=1)))["updated"] == 1
        counts = await mem.decay(crossing + timedelta(hours=1))
        assert counts["updated"] == 1 and counts["faded"] == 1
        assert (await store_sql(mem, cached))[0][0] < FADED
        assert [e["why"] for e in (await mem.history(memory_id))["events"]] == [f"faded below {FADED}"]
        assert (await mem.stats())["faded"] == 1


async def test_recall_reinforces_and_restarts_the_clock(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with await _memory(tmp_path, clock) as mem:
        memory_id = await _one(mem, 0.40)
        clock.set(T0 + timedelta(days=5))
        [hit] = await mem.recall("allotment tomatoes", user_id="u1")
        assert hit.importance == pytest.approx(0.45)
        # The clock restarted at day 5: still 0.45 six days later, lower after seven.
        assert await _now_importance(mem, memory_id, 5 + 6) == pytest.approx(0.45)
        assert await _now_importance(mem, memory_id, 5 + 8) < 0.45
        events = (await mem.history(memory_id))["events"]
        assert [(e["who"], e["old"], e["new"]) for e in events] == [("recall", 0.4, 0.45)]


async def test_a_use_dated_by_a_clock_that_ran_ahead_does_not_block_the_uses_after_it(tmp_path: Path) -> None:
    """Reinforced while the clock was a year ahead, a memory's clock of use was in the future once
    the clock was put right: every use after it, for a year, was taken for one within the day."""
    clock = ManualClock(T0)
    async with await _memory(tmp_path, clock) as mem:
        memory_id = await _one(mem, 0.40)
        clock.set(T0 + timedelta(days=365))
        assert await mem.mark_used([memory_id], user_id="u1") == [memory_id]
        clock.set(T0 + timedelta(days=2))
        assert await mem.mark_used([memory_id], user_id="u1") == [memory_id]
        assert await mem.mark_used([memory_id], user_id="u1") == []  # the same day: spaced as ever
        query = "SELECT reinforced_at FROM memories WHERE id = ?"
        [(reinforced_at,)] = await store_sql(mem, query, [memory_id])
        assert datetime.fromisoformat(reinforced_at) == T0 + timedelta(days=2)
        # Noted by a worker whose clock is a second ahead: spaced all the same.
        clock.set(T0 + timedelta(days=4))
        assert await mem.mark_used([memory_id], user_id="u1") == [memory_id]
        clock.set(T0 + timedelta(days=4) - timedelta(seconds=1))
        assert await mem.mark_used([memory_id], user_id="u1") == []


async def test_reinforced_to_core_becomes_permanent_and_caps_at_one(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with await _memory(tmp_path, clock) as mem:
        core = await _one(mem, 0.78, "my daughter was born in March")
        capped = await _one(mem, 0.98, "our wedding anniversary is in June")
        await mem.recall("daughter born March", user_id="u1", k=1)
        await mem.recall("wedding anniversary June", user_id="u1", k=1)
        assert await _now_importance(mem, core, 1000) == pytest.approx(0.83)
        assert await _now_importance(mem, capped, 1000) == pytest.approx(1.0)
        history = await mem.history(core)
        assert history["permanent"] is True and history["projection"][-1]["importance"] == pytest.approx(0.83)


async def test_get_and_search_are_reads_not_recalls(tmp_path: Path) -> None:
    async with await _memory(tmp_path, ManualClock(T0)) as mem:
        added = await mem.call_tool(
            "soul_narrative",
            {"action": "add", "user_id": "u1", "event": "Finally moved to Lisbon.", "importance": 0.4},
        )
        scene_id = added["scenes"][0]["id"]
        got = await mem.call_tool("soul_narrative", {"action": "get", "user_id": "u1", "id": scene_id})
        assert got["scenes"][0]["importance"] == 0.4
        assert (await mem.history(scene_id))["events"] == []
        found = await mem.call_tool(
            "soul_narrative", {"action": "search", "user_id": "u1", "query": "Lisbon move"}
        )
        assert found["scenes"][0]["id"] == scene_id
        assert (await mem.history(scene_id))["events"] == []  # looking scenes up is inspection


async def test_soul_narrative_actions(tmp_path: Path) -> None:
    async with await _memory(tmp_path, ManualClock(T0)) as mem:

        async def call(**arguments: Any) -> dict[str, Any]:
            return await mem.call_tool("soul_narrative", {"user_id": "u1", **arguments})

        a = await call(
            action="add",
            event="Decided to leave the bank.",
            category="decision",
            importance=0.8,
            tags=["work"],
        )
        b = await call(action="add", event="First time surfing.", category="milestone", importance=0.5)
        other = await mem.call_tool(
            "soul_narrative", {"action": "add", "user_id": "u2", "event": "Secret of u2."}
        )
        assert a["scenes"][0]["source"] == "tool" and a["scenes"][0]["message_ids"] == []
        listed = await call(action="list", k=10)
        assert {s["id"] for s in listed["scenes"]} == {a["scenes"][0]["id"], b["scenes"][0]["id"]}
        assert [s["text"] for s in (await call(action="list", category="decision"))["scenes"]] == [
            "Decided to leave the bank."
        ]
        assert (await call(action="list", min_importance=0.7))["count"] == 1
        assert (await call(action="list", tag="work"))["count"] == 1
        # Another user's scene is out of reach, by id too.
        with pytest.raises(InputError) as info:
            await call(action="get", id=other["scenes"][0]["id"])
        assert info.value.field == "id"
        forgotten = await call(action="forget", id=b["scenes"][0]["id"])
        assert forgotten["count"] == 1 and (await call(action="list"))["count"] == 1
        # Same table and decay as triage's scenes.
        kinds = await store_sql(mem, "SELECT DISTINCT kind FROM memories")
        assert kinds == [("scene",)]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"action": "fly", "user_id": "u1"}, "action"),
        ({"action": "add", "user_id": "u1", "event": "x", "category": "hobby"}, "category"),
        ({"action": "add", "user_id": "u1", "event": "x", "importance": 1.5}, "importance"),
        ({"action": "add", "user_id": "u1", "event": ""}, "event"),
        ({"action": "add", "user_id": "u1"}, "event"),
        ({"action": "add", "user_id": "u1", "event": "x", "mood": "happy"}, "mood"),
        ({"action": "get", "user_id": "u1"}, "id"),
        ({"action": "get", "user_id": "u1", "id": 1, "event": "x"}, "event"),
        ({"action": "search", "event": "x"}, "user_id"),
    ],
)
async def test_bad_soul_narrative_calls_name_the_field_and_write_nothing(
    tmp_path: Path, arguments: dict[str, Any], field: str
) -> None:
    async with await _memory(tmp_path, ManualClock(T0)) as mem:
        with pytest.raises(InputError) as info:
            await mem.call_tool("soul_narrative", arguments)
        assert info.value.field == field, info.value
        assert (await mem.stats())["memories"] == 0


def _tired(i: int, when: datetime) -> dict[str, Any]:
    texts = ["so tired today", "I'm exhausted after work", "tired again, can't sleep", "still tired honestly"]
    return msg(f"t{i}", texts[i % 4], ts=when.isoformat())


async def test_trigger_fires_once_then_cools_down_and_a_raising_callback_is_harmless(tmp_path: Path) -> None:
    fired: list[Any] = []

    async def record(event: Any) -> None:
        fired.append(event)

    async def broken(event: Any) -> None:
        raise RuntimeError("the bot's handler is broken")

    async with await open_memory(tmp_path / "m", plugin=REINFORCE) as mem:
        mem.on_trigger(broken)
        mem.on_trigger(record)
        days = [0, 2, 4, 5]
        results = [await mem.ingest(_tired(i, T0 + timedelta(days=d))) for i, d in enumerate(days)]
        assert all(r.stored for r in results)
        assert [len([t for t in r.triggers if t.kind == "emotion"]) for r in results] == [0, 0, 1, 0]
        assert [e.count for e in fired if e.kind == "emotion"] == [3]
        # Six in a row doubles the count: the next event, once the cooldown is over.
        later = [await mem.ingest(_tired(i, T0 + timedelta(days=12, hours=i))) for i in range(4, 7)]
        assert sum(len(r.triggers) for r in later) <= 1


async def test_a_topic_back_after_a_long_quiet_is_its_own_event(tmp_path: Path) -> None:
    async with await open_memory(tmp_path / "m", plugin=REINFORCE) as mem:
        first = await mem.ingest(msg("r1", "product roadmap review with the team", ts=T0.isoformat()))
        back = await mem.ingest(
            msg("r2", "product roadmap review with the team again", ts=(T0 + timedelta(days=45)).isoformat())
        )
        assert not first.triggers
        assert [t.kind for t in back.triggers] == ["topic_return"]


def test_decay_and_history_commands(tmp_path: Path) -> None:
    data = tmp_path / "d"
    lines = [json.dumps(msg("h1", "I adopted a greyhound named Pixel", ts=T0.isoformat()))]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "narrmem.doors.cli", *args, "--data", str(data)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    assert run("ingest", str(tmp_path / "in.jsonl")).returncode == 0
    done = run("decay", "--now", "2027-06-01T00:00:00+00:00", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["faded"] == 1
    history = run("history", "1", "--json")
    assert json.loads(history.stdout)["memory"]["text"] == "I adopted a greyhound named Pixel"
    bad = run("decay", "--now", "2027-06-01T00:00:00")
    assert bad.returncode == 2 and "--now" in bad.stderr


async def test_a_start_noted_by_a_clock_a_little_ahead_is_the_intervals_and_one_far_ahead_is_none(
    tmp_path: Path,
) -> None:
    """A worker whose clock ran half an hour ahead noted a start "in the future": the other took
    it for none, and both ran every pass. One noted a year ahead (a wrong clock) must not stop
    the schedule for that year."""
    from narrmem.scheduled import begin_if_due

    hour = timedelta(hours=1)
    async with await _memory(tmp_path, ManualClock(T0)) as mem:
        assert await begin_if_due(mem.store, "test", "pass", T0 + timedelta(minutes=30), hour) is not None
        assert await begin_if_due(mem.store, "test", "pass", T0, hour) is None  # the interval's
        assert await begin_if_due(mem.store, "test", "pass", T0 + timedelta(minutes=85), hour) is not None
        assert await begin_if_due(mem.store, "test", "pass", T0 + timedelta(days=365), hour) is not None
        assert await begin_if_due(mem.store, "test", "pass", T0 + timedelta(hours=2), hour) is not None


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_scheduled_pass_runs_once_an_interval_across_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Each worker keeps its own timer: three workers of one PostgreSQL each read every memory of
    the store every interval. A scheduled pass begun by any worker within the interval is the
    interval's; a pass asked for still runs."""
    storage: dict[str, Any] = {}
    if backend == "postgres":
        storage = {"storage": {"backend": "postgres", "dsn": await fresh_database("decay")}}
    clock = ManualClock(T0)
    every = {"hippocampus": {"interval_minutes": 0.004}}  # a quarter of a second
    passes: list[str] = []
    workers = ["w1", "w2"] if backend == "postgres" else ["w1"]
    async with contextlib.AsyncExitStack() as stack:
        for name in workers:
            memory = await stack.enter_async_context(
                open_memory(tmp_path / name, clock=clock, plugin=every, **storage)
            )
            importance_states = memory.store.importance_states

            async def counted(
                after: int, limit: int, *, states: Any = importance_states, name: str = name
            ) -> Any:
                if after == 0:
                    passes.append(name)
                return await states(after, limit)

            monkeypatch.setattr(memory.store, "importance_states", counted)
        await memory.ingest(msg("1", "the allotment tomatoes ripened early", user="ann", ts=T0.isoformat()))
        await asyncio.sleep(0.8)
        assert len(passes) == 1, passes  # the clock stood still: one interval
        clock.advance(minutes=1)
        await asyncio.sleep(0.8)
        assert len(passes) == 2, passes
        assert (await memory.decay())["memories"] == 1  # asked for: runs
        assert len(passes) == 3
