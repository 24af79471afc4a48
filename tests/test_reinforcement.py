"""Reinforcement with meaning, with the real model: only what is relevant to the query, at most a
few per recall, at most once a day each, never from inspection, and never a query's words kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from _helpers import msg, store_fingerprint, store_sql

from narrmem import ManualClock, Memory, Scope
from narrmem.doors.cli import main as cli_main
from narrmem.testing import open_memory

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
REINFORCE = {"hippocampus": {"reinforce": True, "interval_minutes": 0}}
LIFE = [
    ("m1", "I decided to quit my job at the bank to become a carpenter."),
    ("m2", "My cat Miso knocked over the basil plant again this morning."),
    ("m3", "I finally finished restoring the old oak dining table!"),
    ("m4", "My sister Clara is getting married in Porto next June."),
    ("m5", "I started taking cello lessons on Thursday evenings."),
    ("m6", "So tired after sanding chairs all day in the workshop."),
]
UNRELATED = [
    "What is the boiling point of mercury in kelvin?",
    "How do I configure a BGP route reflector?",
    "Who won the 1954 World Cup final?",
    "How many moons does Neptune have?",
    "What is the derivative of arctan x?",
    "How do I set up a Kubernetes ingress controller with TLS?",
    "What is the melting point of tungsten?",
    "What is the half-life of carbon-14?",
    "How do submarines regulate buoyancy?",
    "What is the population of Reykjavik?",
]


async def _history(mem: Memory) -> list[tuple[int, str, str]]:
    return await store_sql(mem, "SELECT memory_id, who, why FROM memory_history ORDER BY id")


async def _importance(mem: Memory) -> dict[int, float]:
    return dict(await store_sql(mem, "SELECT id, importance FROM memories"))


@pytest_asyncio.fixture
async def life(tmp_path: Path) -> AsyncIterator[tuple[Memory, ManualClock]]:
    clock = ManualClock(T0)
    folder = tmp_path / "store"
    async with open_memory(folder, real_model=True, clock=clock, plugin=REINFORCE) as mem:
        await mem.ingest_many(
            [
                msg(
                    mid,
                    text,
                    user="ann",
                    chat="dm",
                    speaker="Ann",
                    ts=(T0 - timedelta(hours=len(LIFE) - n)).isoformat(),
                )
                for n, (mid, text) in enumerate(LIFE)
            ]
        )
        yield mem, clock


async def test_unrelated_turn_contexts_change_no_importance(life: tuple[Memory, ManualClock]) -> None:
    mem, clock = life
    before = await _importance(mem)
    for n, text in enumerate(UNRELATED):
        clock.set(clock.now() + timedelta(days=1, minutes=n))  # past every spacing window
        await mem.turn_context(text, user_id="ann", chat_id="dm")
        await mem.context(text, user_id="ann")
    assert await _importance(mem) == before
    assert await _history(mem) == []


async def test_a_query_about_something_never_said_returns_nothing(
    life: tuple[Memory, ManualClock],
) -> None:
    mem, _ = life
    for text in UNRELATED:
        assert await mem.recall(text, user_id="ann", k=5, reinforce=False) == [], text
    hits = await mem.recall("what is her cat called?", user_id="ann", k=5, reinforce=False)
    assert hits and hits[0].message_ids == ["m2"]
    assert all(h.why is not None and h.why.relevant for h in hits)
    assert 0.0 <= hits[-1].score <= hits[0].score <= 1.0


async def test_a_relevant_recall_reinforces_a_few_at_most_once_a_day(
    life: tuple[Memory, ManualClock],
) -> None:
    mem, clock = life
    hits = await mem.recall("Ann's furniture restoration and woodworking", user_id="ann", k=6)
    reinforced = await _history(mem)
    assert 1 <= len(reinforced) <= 3
    assert {why for _, _, why in reinforced} == {"relevance"}
    chosen = {memory_id for memory_id, _, _ in reinforced}
    assert chosen <= {h.id for h in hits if h.why is not None and (h.why.dense or 0) >= 0.45}
    clock.set(clock.now() + timedelta(hours=5))
    await mem.recall("Ann's furniture restoration and woodworking", user_id="ann", k=6)
    assert await _history(mem) == reinforced  # the same day: spaced, not counted again
    clock.set(clock.now() + timedelta(days=1))
    await mem.recall("Ann's furniture restoration and woodworking", user_id="ann", k=6)
    assert len(await _history(mem)) > len(reinforced)


async def test_a_used_memory_is_reinforced_once_a_day(life: tuple[Memory, ManualClock]) -> None:
    mem, clock = life
    pack = await mem.context("tell me about the wedding", user_id="ann")
    wedding = next(h for h in pack.hits if h.message_ids == ["m4"])
    clock.set(clock.now() + timedelta(days=2))
    assert await mem.mark_used([wedding.id], user_id="ann") == [wedding.id]
    assert await mem.mark_used([wedding.id], user_id="ann") == []
    clock.set(clock.now() + timedelta(days=1, seconds=1))
    assert await mem.mark_used([wedding.id], user_id="ann") == [wedding.id]
    used = [row for row in await _history(mem) if row[2] == "used"]
    assert [row[0] for row in used] == [wedding.id, wedding.id]
    assert await mem.mark_used([wedding.id], user_id="bob") == []  # out of scope: ignored


async def test_no_history_row_holds_a_querys_words(life: tuple[Memory, ManualClock]) -> None:
    mem, clock = life
    for query in ("zqsecret carpenter career change", "zqpassword cat Miso basil plant"):
        clock.set(clock.now() + timedelta(days=2))
        await mem.recall(query, user_id="ann", k=3)
    rows = await _history(mem)
    assert rows
    assert not any("zq" in why or "carpenter" in why or "Miso" in why for _, _, why in rows)


async def _lisbon_scene(mem: Memory) -> int:
    """A scene of ann's stored at importance 0.4; its id."""
    added = await mem.call_tool(
        "soul_narrative",
        {"action": "add", "user_id": "ann", "event": "I finally moved to Lisbon.", "importance": 0.4},
    )
    return int(added["scenes"][0]["id"])


async def test_importance_shown_is_the_decayed_value(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "s", real_model=True, clock=clock, plugin=REINFORCE) as mem:
        scene_id = await _lisbon_scene(mem)
        clock.set(clock.now() + timedelta(days=7 + 365))
        [hit] = await mem.recall("moving to Lisbon", user_id="ann", k=1, reinforce=False)
        assert hit.id == scene_id and hit.importance <= 0.05 and hit.base_importance == 0.4
        got = await mem.call_tool("soul_narrative", {"action": "get", "user_id": "ann", "id": scene_id})
        assert got["scenes"][0]["importance"] <= 0.05 and got["scenes"][0]["base_importance"] == 0.4
        listed = await mem.call_tool(
            "soul_narrative", {"action": "list", "user_id": "ann", "min_importance": 0.1}
        )
        assert listed["scenes"] == []


async def test_a_reinforced_hit_decays_from_its_new_value(tmp_path: Path) -> None:
    """The hit said its importance decays from the value before this recall reinforced it."""
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "s", real_model=True, clock=clock, plugin=REINFORCE) as mem:
        scene_id = await _lisbon_scene(mem)
        clock.set(clock.now() + timedelta(days=200))
        [hit] = await mem.recall("moving to Lisbon", user_id="ann", k=1)
        [row] = await store_sql(mem, "SELECT importance FROM memories WHERE id = ?", [scene_id])
        assert hit.id == scene_id and hit.base_importance == hit.importance == pytest.approx(row[0])
        assert row[0] != 0.4  # reinforced: the stored value moved


async def test_a_memory_used_by_two_calls_at_once_is_reinforced_once(
    life: tuple[Memory, ManualClock], tmp_path: Path
) -> None:
    """Two calls (or, on PostgreSQL, two workers) that mark the same memories used at once both
    read them before either writes: the store writes a change only while the importance is still
    the one it was computed from, so each memory gets one reinforcement and one history row, and
    only one call reports it (before, each wrote its own history row)."""
    mem, clock = life
    ids = [r.id for r in await mem.store.recent(Scope(user_id="ann"), limit=100) if r.id is not None]
    clock.set(clock.now() + timedelta(days=2))
    before = await _importance(mem)
    calls = [mem.mark_used(ids, user_id="ann") for _ in range(3)]
    if mem.store.__class__.__name__ == "PostgresStore":
        # Another worker on the same database, as well as this one.
        async with open_memory(
            tmp_path / "other", real_model=True, clock=clock, plugin=REINFORCE, storage=mem.settings.storage
        ) as other:
            reported = await asyncio.gather(*calls, other.mark_used(ids, user_id="ann"))
    else:
        reported = await asyncio.gather(*calls)
    used = [row[0] for row in await _history(mem) if row[2] == "used"]
    assert sorted(used) == sorted(ids)  # once each
    assert sorted(i for r in reported for i in r) == sorted(ids)
    after = await _importance(mem)
    assert all(after[i] > before[i] or before[i] >= 1.0 for i in ids)


READS = [
    ("soul_narrative", {"action": "list", "user_id": "ann"}),
    ("soul_narrative", {"action": "search", "user_id": "ann", "query": "carpenter job"}),
    ("memory_recall", {"user_id": "ann", "chat_id": "dm", "query_intent": "job,cat,cello"}),
    ("task_query", {"user_id": "ann", "chat_id": "dm"}),
    ("task_chains", {"user_id": "ann"}),
    ("persona_get", {"user_id": "ann"}),
    ("narrmem_recall", {"user_id": "ann", "query": "carpenter job", "reinforce": False}),
]


async def test_read_tools_and_inspection_leave_history_unchanged(
    life: tuple[Memory, ManualClock], tmp_path: Path
) -> None:
    mem, clock = life
    clock.set(clock.now() + timedelta(days=3))
    scene = (await mem.store.recent(Scope(user_id="ann"), kinds=["scene"]))[0]
    reads = [*READS, ("soul_narrative", {"action": "get", "user_id": "ann", "id": scene.id})]
    before = await store_fingerprint(mem)
    for name, arguments in reads:
        await mem.call_tool(name, arguments)
    await mem.history(scene.id)
    await mem.stats()
    await mem.summary(user_id="ann")
    assert await _history(mem) == []
    assert (await _importance(mem))[scene.id] == scene.importance
    # Not a byte of any table either: memory_recall used to cache its nodes' label vectors in
    # graph_nodes (and failed on a memory open read-only, as the inspection commands open it).
    assert await store_fingerprint(mem) == before


def test_cli_recall_reads_without_reinforcing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    folder = tmp_path / "store"

    async def fill() -> None:
        async with open_memory(folder, real_model=True) as mem:
            await mem.ingest_many(
                [msg(mid, text, user="ann", chat="dm", speaker="Ann") for mid, text in LIFE]
            )

    asyncio.run(fill())
    env_args = ["--data", str(folder)]
    assert cli_main(["recall", "what is her cat called?", "--user", "ann", "--explain", *env_args]) == 0
    out = capsys.readouterr().out
    assert "Miso" in out and "dense" in out and "imp. now" in out
    assert cli_main(["recall", "what is her cat called?", "--user", "ann", "--json", *env_args]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["why"]["relevant"] is True and hits[0]["message_ids"] == ["m2"]

    async def history() -> list[tuple[int, str, str]]:
        async with open_memory(folder, real_model=True) as mem:
            return await _history(mem)

    assert asyncio.run(history()) == []


async def test_the_recall_tool_reinforces_unless_asked_only_to_look(life: tuple[Memory, ManualClock]) -> None:
    """A bot's agent recalls to answer (its hits strengthen); an inspector over MCP or HTTP asks
    ``reinforce: false`` and changes nothing."""
    mem, clock = life
    clock.set(clock.now() + timedelta(days=3))
    ask = {"user_id": "ann", "query": "what does Ann do for a living, her carpenter job"}
    await mem.call_tool("narrmem_recall", {**ask, "reinforce": False})
    assert await _history(mem) == []
    await mem.call_tool("narrmem_recall", ask)
    assert [row[2] for row in await _history(mem)] and {row[2] for row in await _history(mem)} == {"tool"}
