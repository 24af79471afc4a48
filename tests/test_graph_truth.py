"""The graph keeps one truth and the task chain keeps its place: a confirmed guess retires what it
contradicts, one-value relations (lives_in, works_at, job, partner, age) hold one value with the
old ones as dated history, every task in progress shows in the turn context, one rule for task ids,
a purge never leaves a task without its state, and a recap question gets the recent narrative.

On both stores, real SQLite and a real PostgreSQL (``storage`` from :mod:`test_graph`); the hash
embedder (meaning plays no part in what is checked here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _helpers import msg
from narrmem_plugins.graph import current_value, is_functional, turn_context, value_history
from narrmem_plugins.graph.refer import asks_for_recap
from test_graph import START, U1, rows, storage, tables

from narrmem import InputError, ManualClock, Memory
from narrmem.testing import open_memory

__all__ = ["storage"]  # the fixture test_graph runs every test with on SQLite and on PostgreSQL


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest_asyncio.fixture
async def mem(tmp_path: Path, clock: ManualClock, storage: dict[str, Any]) -> AsyncIterator[Memory]:
    async with open_memory(tmp_path / "m", clock=clock, **storage) as memory:
        yield memory


async def commit(mem: Memory, *triplets: tuple[str, str, str], **extra: Any) -> dict[str, Any]:
    rows = [{"subject": s, "relation": r, "object": o} for s, r, o in triplets]
    return await mem.call_tool("memory_commit", {**U1, "triplets": rows, **extra})


async def active(mem: Memory) -> set[tuple[str, str, str]]:
    found = await rows(
        mem,
        "SELECT s.name, e.relation, o.name FROM graph_edges e JOIN graph_nodes s ON s.id = e.subject_id "
        "JOIN graph_nodes o ON o.id = e.object_id WHERE e.status = 'active'",
    )
    return {(str(a), str(b), str(c)) for a, b, c in found}


def at(hours: float) -> str:
    return (START + timedelta(hours=hours)).isoformat()


# --- 1: a confirmed guess retires what it contradicts -----------------------------------------


async def test_confirming_a_speculation_retires_the_fact_it_contradicts(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"))
    guess = await commit(mem, ("user", "dislikes", "rock"), speculative=True)
    assert guess["superseded"] == []  # a guess alone never overrides what the user said
    confirmed = await commit(mem, ("user", "dislikes", "rock"))
    assert [(e["relation"], e["object"]) for e in confirmed["superseded"]] == [("likes", "rock")]
    assert confirmed["triplets"][0]["speculative"] is False
    assert ("user", "likes", "rock") not in await active(mem)
    found = await mem.call_tool("memory_recall", {**U1, "query_intent": "rock"})
    assert {(e["relation"], e["object"]) for e in found["edges"]} == {("dislikes", "rock")}
    # Kept as history, not deleted: superseded by the confirmed statement, with the time.
    [row] = await rows(
        mem, "SELECT status, valid_to, superseded_by FROM graph_edges WHERE relation = 'likes'"
    )
    assert row[0] == "superseded" and row[1] is not None
    assert row[2] == confirmed["triplets"][0]["id"]


async def test_a_message_confirming_a_guess_retires_the_old_statement(mem: Memory) -> None:
    await mem.ingest(msg("m1", "I like rock", ts=at(0)))
    await commit(mem, ("user", "dislikes", "rock"), speculative=True)
    result = await mem.ingest(msg("m2", "I don't like rock anymore", ts=at(1)))
    assert any(n.startswith("fact superseded: user likes rock") for n in result.notes), result.notes
    assert await active(mem) >= {("user", "dislikes", "rock")}
    assert ("user", "likes", "rock") not in await active(mem)


# --- 2: one-value relations -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "relation", "now"),
    [
        (["I moved to Berlin", "I moved to Lisbon", "I moved to Paris"], "lives_in", "Paris"),
        (["I work at Google", "I started a new job at Stripe", "I work at Spotify"], "works_at", "Spotify"),
        (["I work as a nurse", "My job is teaching"], "job", "teaching"),
        (["My girlfriend is Lena", "I'm dating Alex"], "partner", "Alex"),
        (["I'm 30", "I just turned 31"], "age", "31"),
        (["我在腾讯工作", "我在阿里巴巴上班"], "works_at", "阿里巴巴"),
        (["我今年30岁", "我31岁了"], "age", "31"),
    ],
)
async def test_a_new_value_supersedes_the_old_with_its_time(
    mem: Memory, texts: list[str], relation: str, now: str
) -> None:
    for i, text in enumerate(texts):
        await mem.ingest(msg(f"m{i}", text, ts=at(i)))
    assert is_functional(mem, relation)
    holding = [t for t in await active(mem) if t[1] == relation]
    assert holding == [("user", relation, now)]
    current = await current_value(mem, user_id="u1", relation=relation)
    assert current is not None and current.object == now and current.current
    history = await value_history(mem, user_id="u1", relation=relation)
    assert len(history) == len(texts)
    assert all(v.superseded_at is not None for v in history[1:])
    # Each old value stopped holding when the next was said.
    ended = sorted(v.superseded_at for v in history[1:] if v.superseded_at)
    assert ended == [datetime.fromisoformat(at(i)) for i in range(1, len(texts))]


async def test_recall_of_an_old_value_says_it_is_past(mem: Memory) -> None:
    for i, city in enumerate(["Berlin", "Lisbon", "Paris"]):
        await mem.ingest(msg(f"m{i}", f"I moved to {city}", ts=at(i)))
    found = await mem.call_tool("memory_recall", {**U1, "query_intent": "Berlin"})
    assert found["edges"] == []  # nothing about Berlin holds now
    [past] = found["past"]
    assert (past["object"], past["status"]) == ("Berlin", "superseded")
    assert past["superseded_at"] == "2026-05-04T10:00:00Z"
    assert "user lives_in Berlin (past: until 2026-05-04; now: Paris)" in found["rendered"]
    # Asked about the user, the current city holds and the old ones are listed as past.
    about = await mem.call_tool("memory_recall", {**U1, "query_intent": "user", "depth": 1})
    assert [(e["relation"], e["object"]) for e in about["edges"]] == [("lives_in", "Paris")]
    assert {e["object"] for e in about["past"]} == {"Berlin", "Lisbon"}


async def test_custom_functional_relations_from_the_config(tmp_path: Path, storage: dict[str, Any]) -> None:
    drives = {"graph": {"functional_relations": ["drives"]}}
    async with open_memory(tmp_path / "m", plugin=drives, **storage) as mem:
        assert is_functional(mem, "drives") and is_functional(mem, "lives_in")
        await commit(mem, ("user", "drives", "a Golf"))
        out = await commit(mem, ("user", "drives", "a Tesla"))
        assert [e["object"] for e in out["superseded"]] == ["a Golf"]
    async with open_memory(tmp_path / "n") as plain:
        await commit(plain, ("user", "drives", "a Golf"))
        assert (await commit(plain, ("user", "drives", "a Tesla")))["superseded"] == []
    with pytest.raises(Exception, match="functional_relations"):
        async with open_memory(tmp_path / "o", plugin={"graph": {"functional_relations": ["Not A Name"]}}):
            pass


# --- 3: every task in progress in the turn context --------------------------------------------


async def test_a_resumed_task_stays_in_the_turn_context(mem: Memory, clock: ManualClock) -> None:
    await mem.call_tool("task_create", {**U1, "task_id": "Task_idiom_chain", "description": "idiom chain"})
    clock.advance(minutes=1)
    await mem.call_tool("task_set_state", {**U1, "task_id": "Task_idiom_chain", "state": "paused"})
    await mem.call_tool("task_create", {**U1, "task_id": "Task_nagato_yuki", "description": "Nagato Yuki"})
    clock.advance(minutes=1)
    await mem.call_tool("task_set_state", {**U1, "task_id": "Task_idiom_chain", "state": "in_progress"})
    ctx = await turn_context(mem, "help me with the idiom", **U1)
    assert [t["task_id"] for t in ctx["tasks"]] == ["Task_idiom_chain", "Task_nagato_yuki"]
    assert "Task_idiom_chain [in_progress]" in ctx["rendered"]
    assert ctx["rendered"].index("Task_idiom_chain") < ctx["rendered"].index("Task_nagato_yuki")
    # A paused or finished task is not "in progress".
    await mem.call_tool("task_set_state", {**U1, "task_id": "Task_nagato_yuki", "state": "done"})
    ctx = await turn_context(mem, "help me with the idiom", **U1)
    assert [t["task_id"] for t in ctx["tasks"]] == ["Task_idiom_chain"]


# --- 7: recap questions get the recent narrative ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "recap"),
    [
        ("What did we talk about?", True),
        ("what have we discussed so far", True),
        ("我们聊过什么", True),
        ("我们刚才聊了什么？", True),
        ("remind me what I said", True),
        ("Remind me what I said earlier, please", True),
        ("What did we say about Lisbon?", False),
        ("Let's talk about jazz", False),
        ("我们聊过北京吗", False),
    ],
)
def test_recap_questions(text: str, recap: bool) -> None:
    assert asks_for_recap(text) is recap


@pytest.mark.parametrize("question", ["What did we talk about?", "我们聊过什么", "remind me what I said"])
async def test_a_recap_question_gets_the_recent_narrative(mem: Memory, question: str) -> None:
    said = [
        "My sister Anna is visiting from Madrid next week",
        "I adopted a grey cat called Miso",
        "The team finally shipped the billing migration",
        "I booked a table at the Thai place for Friday",
    ]
    for i, text in enumerate(said):
        await mem.ingest(msg(f"m{i}", text, ts=at(i)))
    ctx = await turn_context(mem, question, **U1)
    assert ctx["refers_back"] is True
    texts = [m["text"] for m in ctx["memories"]]
    assert texts, ctx["rendered"]
    # The newest things said, in the order they happened.
    assert any("Thai place" in t for t in texts) and any("billing" in t for t in texts)
    order = [next(i for i, s in enumerate(said) if s.split()[-1] in t or s[:20] in t) for t in texts]
    assert order == sorted(order)
    assert "[Recent conversation, oldest first]" in ctx["rendered"]


# --- 4: one rule for task ids: case-insensitive, in every script -----------------------------


@pytest.mark.parametrize(
    ("created", "other"), [("Task_A", "task_a"), ("Задача_1", "задача_1"), ("étape", "ÉTAPE")]
)
async def test_task_ids_ignore_case_in_every_script(mem: Memory, created: str, other: str) -> None:
    await mem.call_tool("task_create", {**U1, "task_id": created, "description": "first"})
    with pytest.raises(InputError) as info:
        await mem.call_tool("task_create", {**U1, "task_id": other, "description": "second"})
    assert info.value.field == "task_id" and "already exists" in str(info.value)
    out = await mem.call_tool("task_set_state", {**U1, "task_id": other, "state": "paused"})
    assert (out["task"]["task_id"], out["changed"]) == (created, True)  # the first spelling stays
    tasks = (await mem.call_tool("task_query", U1))["tasks"]
    assert [(t["task_id"], t["state"]) for t in tasks] == [(created, "paused")]


# --- 5: a purge never leaves a task without its state --------------------------------------


async def _chain(mem: Memory) -> None:
    for name in ("Task_a", "Task_b", "Task_c"):
        await mem.call_tool(
            "task_create", {**U1, "task_id": name, "description": name, "info_nodes": ["rock"]}
        )


@pytest.mark.parametrize("mode", ["soft", "hard"])
async def test_a_purge_that_would_orphan_a_task_is_refused(mem: Memory, mode: str) -> None:
    await _chain(mem)
    before = await active(mem)
    purge = {**U1, "filters": {"subject": "Task_b"}, "mode": mode}
    dry = await mem.call_tool("memory_purge", {**purge, "dry_run": True})
    assert dry["tasks"] == ["Task_b"] and dry["refused"] and "Task_b" in dry["refused"]
    with pytest.raises(InputError) as info:
        await mem.call_tool("memory_purge", purge)
    assert info.value.field == "filters" and "Task_b" in str(info.value)
    with pytest.raises(InputError):
        await mem.call_tool("memory_purge", {**U1, "filters": {"object": "state:in_progress"}})
    assert await active(mem) == before
    states = {t["task_id"]: t["state"] for t in (await mem.call_tool("task_query", U1))["tasks"]}
    assert states == {"Task_a": "in_progress", "Task_b": "in_progress", "Task_c": "in_progress"}
    # Purging what does not hold a task together still works.
    out = await mem.call_tool(
        "memory_purge", {**U1, "filters": {"relation": "CONTAINS_INFO", "subject": "Task_b"}}
    )
    assert out["matched"] == 1 and out["tasks"] == []


@pytest.mark.parametrize("mode", ["soft", "hard"])
async def test_whole_tasks_purges_the_task_and_joins_the_chain(mem: Memory, mode: str) -> None:
    await _chain(mem)
    purge = {
        **U1,
        "filters": {"subject": "Task_b", "relation": "HAS_STATE"},
        "mode": mode,
        "whole_tasks": True,
    }
    dry = await mem.call_tool("memory_purge", {**purge, "dry_run": True})
    assert dry["refused"] is None and dry["tasks"] == ["Task_b"]
    shown = {(e["subject"], e["relation"], e["object"]) for e in dry["triplets"]}
    assert shown == {
        ("Task_b", "HAS_STATE", "state:in_progress"),
        ("Task_b", "CONTAINS_INFO", "rock"),
        ("Task_a", "NEXT_TASK", "Task_b"),
        ("Task_b", "NEXT_TASK", "Task_c"),
    }
    out = await mem.call_tool("memory_purge", purge)
    assert out["matched"] == 4 and out["purge_id"] is not None
    tasks = (await mem.call_tool("task_query", U1))["tasks"]
    assert [t["task_id"] for t in tasks] == ["Task_c", "Task_a"]
    assert ("Task_a", "NEXT_TASK", "Task_c") in await active(mem)
    assert not any("Task_b" in (s, o) for s, _, o in await active(mem))


async def test_a_task_purged_whole_frees_its_id(mem: Memory, clock: ManualClock) -> None:
    await _chain(mem)
    await mem.call_tool(
        "memory_purge", {**U1, "filters": {"subject": "Task_a"}, "whole_tasks": True, "mode": "soft"}
    )
    clock.advance(minutes=5)
    again = await mem.call_tool("task_create", {**U1, "task_id": "task_A", "description": "again"})
    assert again["previous_task"] == "Task_c"
    tasks = (await mem.call_tool("task_query", U1))["tasks"]
    assert (tasks[0]["task_id"], tasks[0]["description"]) == ("Task_a", "again")
    assert [t["task_id"] for t in tasks] == ["Task_a", "Task_c", "Task_b"]


async def test_a_task_an_older_purge_left_without_state_still_shows(
    tmp_path: Path, storage: dict[str, Any]
) -> None:
    """A store written before purges kept states: the old memory_purge could delete a task's state edge
    alone. Such a task still shows, in progress, as it did; only a task purged whole is gone."""
    async with open_memory(tmp_path / "m", **storage) as mem:
        await _chain(mem)
        # What the old purge did: {"subject": "Task_b", "relation": "HAS_STATE"}, soft.
        async with tables(mem).sql(write=True) as db:
            await db.execute(
                "UPDATE graph_edges SET status = 'deleted', valid_to = '2026-05-04T10:00:00+00:00', "
                "valid_to_ts = 0 WHERE relation = 'HAS_STATE' "
                "AND subject_id = (SELECT id FROM graph_nodes WHERE name = 'Task_b')"
            )
    async with open_memory(tmp_path / "m", **storage) as mem:
        states = {t["task_id"]: t["state"] for t in (await mem.call_tool("task_query", U1))["tasks"]}
        assert states == {"Task_a": "in_progress", "Task_b": "in_progress", "Task_c": "in_progress"}
        ctx = await turn_context(mem, "hello", **U1)
        assert [t["task_id"] for t in ctx["tasks"]] == ["Task_a", "Task_b", "Task_c"]
        # Purging it whole now takes its remaining triplets and it is gone.
        out = await mem.call_tool("memory_purge", {**U1, "filters": {"subject": "Task_b"}})
        assert out["tasks"] == [] and out["matched"] == 2  # its info and its link to Task_c
        await mem.call_tool("memory_purge", {**U1, "filters": {"object": "Task_b"}})
        names = [t["task_id"] for t in (await mem.call_tool("task_query", U1))["tasks"]]
        assert names == ["Task_c", "Task_a"]
