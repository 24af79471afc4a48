"""The memory graph (the ``graph`` plugin): typed nodes and triplets, facts taken from messages, the
tools (commit, purge, recall, tasks, persona, context rewrite), the per-turn context, auto tasks, and
scope isolation. The seed's idiom-chain example runs end to end through the tools.

Everything runs on the hash embedder, on both stores: real SQLite and a real PostgreSQL (the
``storage`` fixture); one test, marked slow, checks with the real model that memory_recall seeds by
meaning. The tables are read through the store's SQL capability, the same way on both.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from _helpers import msg, on_sqlite, store_fingerprint, store_sql
from narrmem_plugins.graph import GraphPlugin, turn_context
from narrmem_plugins.graph.extract import extract
from narrmem_plugins.graph.rewrite import check_summary, read_turn
from narrmem_plugins.graph.schemas import ChatMessage
from narrmem_plugins.graph.vectors import LabelVectors
from test_plugin_tables import storage_for

from narrmem import ConfigError, InputError, ManualClock, Memory, PluginError, StoreError, hookimpl
from narrmem.store import SQLCapable
from narrmem.table_transfer import table_columns
from narrmem.testing import open_memory

START = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
U1 = {"user_id": "u1", "chat_id": "c1"}


def at(minutes: float) -> str:
    return (START + timedelta(minutes=minutes)).isoformat()


@pytest_asyncio.fixture
async def clock() -> ManualClock:
    return ManualClock(START)


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def storage(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The settings of a store of each backend (a fresh PostgreSQL database for each test)."""
    return await storage_for(request.param)


@pytest_asyncio.fixture
async def mem(tmp_path: Path, clock: ManualClock, storage: dict[str, Any]) -> AsyncIterator[Memory]:
    async with open_memory(tmp_path / "m", clock=clock, **storage) as memory:
        yield memory


def scope_of(extra: dict[str, Any]) -> dict[str, Any]:
    """The scope keys taken out of ``extra``; user u1 in chat c1 when none are given."""
    scope: dict[str, Any] = {k: extra.pop(k) for k in ("user_id", "chat_id", "tenant") if k in extra}
    return scope or dict(U1)


async def commit(mem: Memory, *triplets: tuple[str, str, str], **extra: Any) -> dict[str, Any]:
    scope = scope_of(extra)
    rows = [{"subject": s, "relation": r, "object": o} for s, r, o in triplets]
    return await mem.call_tool("memory_commit", {**scope, "triplets": rows, **extra})


async def recall(mem: Memory, keywords: str, **extra: Any) -> dict[str, Any]:
    scope = scope_of(extra)
    return await mem.call_tool("memory_recall", {**scope, "query_intent": keywords, **extra})


def said(result: dict[str, Any]) -> set[tuple[str, str, str]]:
    """The (subject, relation, object) of every edge in a tool result."""
    return {(e["subject"], e["relation"], e["object"]) for e in result["edges"]}


def tables(mem: Memory) -> SQLCapable:
    assert isinstance(mem.store, SQLCapable)
    return mem.store


async def rows(mem: Memory, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """``query`` on the store's database (SQLite or PostgreSQL), through its SQL capability."""
    async with tables(mem).sql() as db:
        return await db.fetchall(query, params)


async def edges(mem: Memory, where: str = "TRUE", params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Every column of the graph_edges rows ``where`` selects, with ``subject`` and ``object`` named."""
    async with tables(mem).sql() as db:
        names = [c.name for c in await table_columns(db, "graph_edges")]
        found = await db.fetchall(
            f"SELECT {', '.join(f'e.{n}' for n in names)}, s.name, o.name FROM graph_edges e "
            "JOIN graph_nodes s ON s.id = e.subject_id JOIN graph_nodes o ON o.id = e.object_id "
            f"WHERE {where} ORDER BY e.id",
            params,
        )
    return [dict(zip([*names, "subject", "object"], row, strict=True)) for row in found]


@contextlib.contextmanager
def raises_on(field: str) -> Iterator[pytest.ExceptionInfo[InputError]]:
    """``pytest.raises(InputError)`` that also checks the error names ``field``."""
    with pytest.raises(InputError) as info:
        yield info
    assert info.value.field == field, (info.value.field, str(info.value))


# --- the graph: types, relation names, one row per triplet -----------------------------------


async def test_node_types_are_stored_and_checked(mem: Memory) -> None:
    out = await mem.call_tool(
        "memory_commit",
        {
            **U1,
            "triplets": [
                {
                    "subject": "Task_x",
                    "relation": "RELATES_TO",
                    "object": "notes",
                    "subject_type": "TaskNode",
                },
                {"subject": "user", "relation": "likes", "object": "rock", "object_type": "InfoNode"},
            ],
        },
    )
    assert [(t["subject_type"], t["object_type"]) for t in out["triplets"]] == [
        ("TaskNode", "EntityNode"),
        ("EntityNode", "InfoNode"),
    ]
    stored = dict(await rows(mem, "SELECT name, type FROM graph_nodes"))
    assert stored == {"Task_x": "TaskNode", "notes": "EntityNode", "user": "EntityNode", "rock": "InfoNode"}
    with raises_on("triplets.0.subject_type"):
        await mem.call_tool(
            "memory_commit",
            {
                **U1,
                "triplets": [{"subject": "a", "relation": "likes", "object": "b", "subject_type": "FooNode"}],
            },
        )
    # A node has one type: an explicit type may refine an EntityNode, never contradict a typed node.
    with raises_on("triplets.0.object_type"):
        await mem.call_tool(
            "memory_commit",
            {
                **U1,
                "triplets": [
                    {"subject": "a", "relation": "likes", "object": "Task_x", "object_type": "InfoNode"}
                ],
            },
        )
    # The database itself refuses a type outside the five.
    with pytest.raises(StoreError, match=r"(?i)check"):
        async with tables(mem).sql(write=True) as db:
            await db.execute(
                "INSERT INTO graph_nodes (tenant, user_id, chat_id, name, type, created_at, created_ts) "
                "VALUES ('default', 'u1', 'c1', 'z', 'FooNode', '', 0)"
            )


@pytest.mark.parametrize(
    ("relation", "ok"),
    [
        ("likes", True),
        ("works_on", True),
        ("RELATES_TO", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("Likes", False),
        ("likes it", False),
        ("likes__it", False),
        ("_likes", False),
        ("", False),
    ],
)
async def test_relation_names(mem: Memory, relation: str, ok: bool) -> None:
    call = commit(mem, ("user", relation, "rock"))
    if ok:
        assert (await call)["created"] == 1
    else:
        with raises_on("triplets.0.relation"):
            await call


async def test_structural_edges_belong_to_the_task_and_persona_tools(mem: Memory) -> None:
    for relation in ("NEXT_TASK", "HAS_STATE", "CONTAINS_INFO", "HAS_PERSONA"):
        with raises_on("triplets.0.relation"):
            await commit(mem, ("Task_a", relation, "Task_b"))


async def test_committing_twice_confirms_instead_of_duplicating(mem: Memory, clock: ManualClock) -> None:
    first = await commit(mem, ("user", "likes", "rock"))
    clock.advance(hours=1)
    second = await commit(mem, ("user", "likes", "Rock"))  # names compare case-insensitively
    assert (first["created"], second["created"], second["confirmed"]) == (1, 0, 1)
    [row] = second["triplets"]
    assert row["count"] == 2 and row["id"] == first["triplets"][0]["id"]
    assert datetime.fromisoformat(row["last_seen"]) == START + timedelta(hours=1)
    assert datetime.fromisoformat(row["valid_from"]) == START
    assert len(await edges(mem)) == 1
    assert said(await recall(mem, "rock")) == {("user", "likes", "rock")}


async def test_a_message_whose_hooks_run_again_does_not_confirm_its_own_facts(
    mem: Memory, clock: ManualClock
) -> None:
    """A message's after-store hooks run a second time after a crash (or a retried write): its
    facts are not counted again. Another message stating the same fact is."""
    from narrmem_plugins.graph.facts import drafts_for, store_facts

    from narrmem import Message, TriageDecision

    graph = mem.host.plugin(GraphPlugin)._graph
    assert graph is not None
    first = Message.model_validate(msg("m1", "I live in Lisbon. I like rock music.", ts=at(0)))
    await mem.ingest(first)
    decision = TriageDecision(layer="accumulate")
    await store_facts(mem, graph.transaction, first, await drafts_for(mem, first, decision, []))
    counts = {(e["relation"], e["object"]): e["count"] for e in await edges(mem)}
    assert counts == {("lives_in", "Lisbon"): 1, ("likes", "rock music"): 1}
    clock.advance(hours=1)
    await mem.ingest(msg("m2", "I like rock music", ts=at(60)))
    counts = {(e["relation"], e["object"]): e["count"] for e in await edges(mem)}
    assert counts == {("lives_in", "Lisbon"): 1, ("likes", "rock music"): 2}


async def test_speculation_is_marked_filterable_and_overridden_by_a_statement(mem: Memory) -> None:
    out = await commit(mem, ("user", "likes", "music"), speculative=True)
    assert out["triplets"][0]["speculative"] and out["triplets"][0]["confidence"] == 0.5
    found = await recall(mem, "music")
    assert "user[speculation] likes music" in found["rendered"]
    assert said(await recall(mem, "music", include_speculative=False)) == set()
    # Said plainly later, it is no longer speculation.
    confirmed = await commit(mem, ("user", "likes", "music"))
    assert confirmed["triplets"][0]["speculative"] is False and confirmed["triplets"][0]["count"] == 2
    # A guess never supersedes what the user said.
    guess = await commit(mem, ("user", "dislikes", "music"), speculative=True)
    assert guess["superseded"] == []
    assert said(await recall(mem, "music")) == {("user", "likes", "music"), ("user", "dislikes", "music")}


# --- memory_purge -----------------------------------------------------------------------------


async def test_a_filter_that_matches_nothing_deletes_nothing(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"), ("user", "likes", "jazz"), ("user", "works_on", "narrmem"))
    for filters in (
        {"subject": "user", "object": "no such thing"},
        {"subject": "nobody"},
        {"relation": "hates"},
        {"subject_contains": "zzz"},
        {"object": "rock", "relation": "works_on"},
    ):
        for mode in ("soft", "hard"):
            out = await mem.call_tool("memory_purge", {**U1, "filters": filters, "mode": mode})
            assert (out["matched"], out["triplets"], out["purge_id"]) == (0, [], None)
        out = await mem.call_tool(
            "memory_purge",
            {
                **U1,
                "filters": filters,
                "mode": "supersede",
                "new_triplet": {"subject": "user", "relation": "likes", "object": "pop"},
            },
        )
        assert out["matched"] == 0 and out["new_triplet"] is None  # nothing matched: nothing written
    assert [e["status"] for e in await edges(mem)] == ["active"] * 3
    assert await rows(mem, "SELECT COUNT(*) FROM graph_purges") == [(0,)]


async def test_purge_without_filters_is_refused(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"))
    for filters in ({}, {"subject": None}):
        with raises_on("filters"):
            await mem.call_tool("memory_purge", {**U1, "filters": filters, "mode": "hard"})
    with raises_on("filters.subject_like"):
        await mem.call_tool("memory_purge", {**U1, "filters": {"subject_like": "u"}})


async def test_filters_are_exact_unless_asked_for_a_substring(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"), ("user", "likes", "punk rock"), ("user", "likes", "Rockets"))
    exact = await mem.call_tool("memory_purge", {**U1, "filters": {"object": "rock"}, "dry_run": True})
    assert [t["object"] for t in exact["triplets"]] == ["rock"]
    loose = await mem.call_tool(
        "memory_purge", {**U1, "filters": {"object_contains": "rock"}, "dry_run": True}
    )
    assert sorted(t["object"] for t in loose["triplets"]) == ["Rockets", "punk rock", "rock"]
    assert len(said(await recall(mem, "user", depth=1))) == 3  # dry runs changed nothing
    out = await mem.call_tool("memory_purge", {**U1, "filters": {"object": "rock"}})
    assert out["matched"] == 1 and out["purge_id"] is not None
    assert said(await recall(mem, "user", depth=1)) == {
        ("user", "likes", "punk rock"),
        ("user", "likes", "Rockets"),
    }


async def test_purge_refuses_more_than_max_affected(mem: Memory) -> None:
    await commit(mem, *[("user", "likes", f"band {i}") for i in range(5)])
    with raises_on("max_affected"):
        await mem.call_tool("memory_purge", {**U1, "filters": {"subject": "user"}, "max_affected": 4})
    out = await mem.call_tool("memory_purge", {**U1, "filters": {"subject": "user"}, "max_affected": 5})
    assert out["matched"] == 5


async def test_supersede_keeps_history(mem: Memory, clock: ManualClock) -> None:
    old = (await commit(mem, ("user", "located_at", "Paris")))["triplets"][0]
    clock.advance(days=1)
    out = await mem.call_tool(
        "memory_purge",
        {
            **U1,
            "filters": {"subject": "user", "relation": "located_at"},
            "mode": "supersede",
            "new_triplet": {"subject": "user", "relation": "located_at", "object": "Berlin"},
        },
    )
    new = out["new_triplet"]
    assert out["matched"] == 1 and new["object"] == "Berlin" and new["status"] == "active"
    [row] = await edges(mem, "e.id = ?", (old["id"],))
    assert row["status"] == "superseded" and row["superseded_by"] == new["id"]
    assert datetime.fromisoformat(row["valid_to"]) == START + timedelta(days=1)
    assert said(await recall(mem, "user")) == {("user", "located_at", "Berlin")}
    [(mode, actor, filters, touched, new_id)] = await rows(
        mem, "SELECT mode, actor, filters, edges, new_edge_id FROM graph_purges"
    )
    assert (mode, actor, new_id) == ("supersede", "memory_purge", new["id"])
    assert '"relation": "located_at"' in filters and "Paris" in touched
    with raises_on("new_triplet"):
        await mem.call_tool("memory_purge", {**U1, "filters": {"object": "Berlin"}, "mode": "supersede"})
    with raises_on("new_triplet"):
        await mem.call_tool(
            "memory_purge",
            {
                **U1,
                "filters": {"object": "Berlin"},
                "new_triplet": {"subject": "a", "relation": "b", "object": "c"},
            },
        )


async def test_soft_and_hard_purge(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"), ("user", "likes", "jazz"))
    soft = await mem.call_tool("memory_purge", {**U1, "filters": {"object": "rock"}, "mode": "soft"})
    [row] = await edges(mem, "o.name = 'rock'")
    assert soft["matched"] == 1 and row["status"] == "deleted" and row["valid_to"] is not None
    assert said(await recall(mem, "rock")) == set()  # soft-deleted triplets are not recalled
    # Hard erases in any status, with the nodes nothing points to any more; history keeps ids only.
    hard = await mem.call_tool("memory_purge", {**U1, "filters": {"object": "rock"}, "mode": "hard"})
    assert hard["matched"] == 1 and await edges(mem, "o.name = 'rock'") == []
    assert await rows(mem, "SELECT COUNT(*) FROM graph_nodes WHERE name = 'rock'") == [(0,)]
    [(touched,)] = await rows(mem, "SELECT edges FROM graph_purges WHERE mode = 'hard'")
    assert "rock" not in touched
    # Nor does any other record keep the erased triplet's words: not the soft purge's before it,
    # not the hard purge's own filters (before 2026-12-07 both did).
    records = await rows(mem, "SELECT mode, filters, edges FROM graph_purges")
    assert "rock" not in str(records) and [mode for mode, _, _ in records] == ["hard"]


# --- memory_recall ------------------------------------------------------------------------------


async def test_recall_writes_nothing_and_works_on_a_memory_open_read_only(
    tmp_path: Path, clock: ManualClock, storage: dict[str, Any]
) -> None:
    """A recall reads: the label vectors it seeds with stay in the process (before, it cached
    them in graph_nodes, so opening the inspector changed the database and later exports, and a
    memory open read-only, as inspection opens it, failed with a write refused). A forget drops
    the ones it kept."""
    async with open_memory(tmp_path / "m", clock=clock, **storage) as writer:
        await commit(writer, ("user", "works_on", "narrmem"), ("narrmem", "RELATES_TO", "sqlite"))
        before = await store_fingerprint(writer)
        first = await recall(writer, "database engine")
        assert await store_fingerprint(writer) == before
        assert said(await recall(writer, "database engine")) == said(first)
        graph = writer.host.plugin(GraphPlugin)._graph
        assert graph is not None and len(graph.label_vectors) > 0
        # Beside the writer: SQLite's folder read-only, or the same PostgreSQL database.
        shared = "dsn" in str(storage)
        reading = tmp_path / ("r" if shared else "m")
        async with open_memory(reading, clock=clock, read_only=True, **storage) as reader:
            assert said(await recall(reader, "database engine")) == said(first)
        assert await store_fingerprint(writer) == before
        await writer.forget(user_id="u1")
        assert len(graph.label_vectors) == 0


CHAT_INDEXES = {
    "graph_edges_by_chat",
    "graph_edges_by_successor",
    "graph_nodes_by_chat",
    "graph_purges_by_chat",
}


async def _graph_indexes(mem: Memory) -> set[str]:
    listing = (
        "SELECT name FROM sqlite_master WHERE type = 'index'"
        if on_sqlite(mem)
        else "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    )
    return {str(name) for (name,) in await store_sql(mem, listing)}


async def test_a_graph_from_before_its_chat_indexes_is_read_as_it_is_and_indexed_at_a_writable_open(
    tmp_path: Path, clock: ManualClock, storage: dict[str, Any]
) -> None:
    """A deleted message's forget finds its chat's facts by index (it read every user's graph of
    the tenant, and each deleted triplet read every edge for those it superseded). A store made
    before those indexes is read without them, writing nothing, and gains them when opened to write."""
    async with open_memory(tmp_path / "m", clock=clock, **storage) as writer:
        await commit(writer, ("user", "works_on", "narrmem"), ("narrmem", "RELATES_TO", "sqlite"))
        assert CHAT_INDEXES <= await _graph_indexes(writer)
        first = said(await recall(writer, "database engine"))
        async with tables(writer).sql(write=True) as db:
            for name in sorted(CHAT_INDEXES):
                await db.execute(f"DROP INDEX {name}")
    async with open_memory(tmp_path / "m", clock=clock, read_only=True, **storage) as reader:
        assert said(await recall(reader, "database engine")) == first
        assert not CHAT_INDEXES & await _graph_indexes(reader)
    async with open_memory(tmp_path / "m", clock=clock, **storage) as writer:
        assert CHAT_INDEXES <= await _graph_indexes(writer)
        assert said(await recall(writer, "database engine")) == first


def test_label_vectors_are_bounded_copies_and_a_forget_during_an_embedding_keeps_none() -> None:
    kept = LabelVectors(capacity=2)
    matrix = np.ones((100, 4), dtype=np.float32)
    before = kept.generation
    kept.put("ann's clinic", matrix[0], before)
    stored = kept.get("ann's clinic")
    assert stored is not None and stored.base is None  # a copy: not the whole matrix kept alive
    kept.clear()  # a forget while another recall embedded
    kept.put("ann's secret", matrix[1], before)
    assert len(kept) == 0
    for n, text in enumerate(["a", "b", "c"]):
        kept.put(text, matrix[n], kept.generation)
    assert len(kept) == 2 and kept.get("a") is None


async def test_recall_walks_both_directions_to_depth(mem: Memory) -> None:
    await commit(
        mem,
        ("user", "works_on", "narrmem"),
        ("narrmem", "RELATES_TO", "sqlite"),
        ("sqlite", "RELATES_TO", "wal"),
    )
    assert said(await recall(mem, "sqlite", depth=1)) == {
        ("narrmem", "RELATES_TO", "sqlite"),
        ("sqlite", "RELATES_TO", "wal"),
    }
    deeper = await recall(mem, "sqlite", depth=2)
    assert ("user", "works_on", "narrmem") in said(deeper)
    assert {n["name"]: n["distance"] for n in deeper["nodes"]} == {
        "sqlite": 0,
        "narrmem": 1,
        "wal": 1,
        "user": 2,
    }
    assert deeper["seeds"] == ["sqlite"] and not deeper["truncated"]
    assert said(await recall(mem, "nothing like it")) == set()
    cut = await recall(mem, "sqlite", depth=2, limit=1)
    assert len(cut["edges"]) == 1 and cut["truncated"]
    for bad, field in (
        ({"depth": 0}, "depth"),
        ({"depth": 6}, "depth"),
        ({"query_intent": " , "}, "query_intent"),
    ):
        with raises_on(field):
            await mem.call_tool("memory_recall", {**U1, "query_intent": "x", **bad})


async def test_recall_seeds_by_type_and_chinese_names(mem: Memory) -> None:
    await commit(mem, ("成语接龙", "RELATES_TO", "游戏"))
    await mem.call_tool("task_create", {**U1, "task_id": "Task_one", "description": "first task"})
    assert ("成语接龙", "RELATES_TO", "游戏") in said(await recall(mem, "接龙"))
    chain = await recall(mem, "TaskNode,working_memory,task_chain", depth=1)
    assert ("Task_one", "HAS_STATE", "state:in_progress") in said(chain)


async def test_time_range_is_honoured(mem: Memory, clock: ManualClock) -> None:
    await commit(mem, ("user", "likes", "rock"))
    clock.advance(days=2)
    await commit(mem, ("user", "likes", "jazz"))
    day = timedelta(days=1)
    early = {"from": (START - day).isoformat(), "to": (START + day).isoformat()}
    late = {"from": (START + day).isoformat()}
    assert said(await recall(mem, "user", time_range=early)) == {("user", "likes", "rock")}
    assert said(await recall(mem, "user", time_range=late)) == {("user", "likes", "jazz")}
    assert said(await recall(mem, "user", time_range={"to": (START - day).isoformat()})) == set()
    # Confirmed later, an early triplet was also stated in the later range.
    clock.advance(days=1)
    await commit(mem, ("user", "likes", "rock"))
    assert ("user", "likes", "rock") in said(await recall(mem, "user", time_range=late))
    with raises_on("time_range"):
        await recall(mem, "user", time_range={"from": late["from"], "to": early["from"]})
    with raises_on("time_range.from"):
        await recall(mem, "user", time_range={"from": "2026-05-04T09:00:00"})  # no timezone


# --- scope -----------------------------------------------------------------------------------------


async def test_graphs_never_mix_scopes(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"))
    await commit(mem, ("user", "likes", "opera"), user_id="u2", chat_id="c1")
    await commit(mem, ("user", "likes", "folk"), user_id="u1", chat_id="c1", tenant="other")
    await mem.call_tool("task_create", {**U1, "task_id": "Task_mine", "description": "mine"})
    await mem.call_tool(
        "task_create", {"user_id": "u2", "chat_id": "c1", "task_id": "Task_theirs", "description": "x"}
    )
    assert said(await recall(mem, "user,opera,folk")) == {("user", "likes", "rock")}
    assert said(await recall(mem, "user,rock", user_id="u2", chat_id="c1")) == {("user", "likes", "opera")}
    mine = await mem.call_tool("task_query", U1)
    assert [t["task_id"] for t in mine["tasks"]] == ["Task_mine"]
    theirs = await mem.call_tool("task_query", {"user_id": "u2", "chat_id": "c1"})
    assert [t["task_id"] for t in theirs["tasks"]] == ["Task_theirs"]
    with raises_on("task_id"):
        await mem.call_tool("task_set_state", {**U1, "task_id": "Task_theirs", "state": "done"})
    # A purge matching the other user's triplets by name touches none of them.
    out = await mem.call_tool("memory_purge", {**U1, "filters": {"subject": "user"}, "mode": "hard"})
    assert [t["object"] for t in out["triplets"]] == ["rock"]
    assert {e["object"] for e in await edges(mem, "e.relation = 'likes'")} == {"opera", "folk"}


async def test_reads_without_chat_see_all_of_the_users_chats(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "rock"), user_id="u1", chat_id="c1")
    await commit(mem, ("user", "likes", "jazz"), user_id="u1", chat_id="c2")
    await commit(mem, ("user", "likes", "rock"), user_id="u1", chat_id="c2")
    assert said(await recall(mem, "user", user_id="u1", chat_id="c1")) == {("user", "likes", "rock")}
    everywhere = await recall(mem, "user", user_id="u1")
    assert said(everywhere) == {("user", "likes", "rock"), ("user", "likes", "jazz")}
    assert everywhere["rendered"].count("user likes rock") == 1  # one line per triplet, whatever the chat


# --- tasks ---------------------------------------------------------------------------------------


async def test_task_ids_are_exact(mem: Memory) -> None:
    await mem.call_tool("task_create", {**U1, "task_id": "Task_a", "description": "a"})
    await mem.call_tool("task_create", {**U1, "task_id": "Task_ab", "description": "ab"})
    out = await mem.call_tool("task_set_state", {**U1, "task_id": "Task_a", "state": "paused"})
    assert (out["task"]["task_id"], out["previous_state"], out["changed"]) == ("Task_a", "in_progress", True)
    states = {t["task_id"]: t["state"] for t in (await mem.call_tool("task_query", U1))["tasks"]}
    assert states == {"Task_a": "paused", "Task_ab": "in_progress"}
    for missing in ("Task", "Task_", "ask_a", "Task_abc"):
        with raises_on("task_id"):
            await mem.call_tool("task_set_state", {**U1, "task_id": missing, "state": "done"})
    with raises_on("task_id"):
        await mem.call_tool("task_create", {**U1, "task_id": "Task_a", "description": "again"})
    with raises_on("task_id"):
        await mem.call_tool("task_create", {**U1, "task_id": "Task a", "description": "spaces"})
    same = await mem.call_tool("task_set_state", {**U1, "task_id": "Task_a", "state": "paused"})
    assert same["changed"] is False


async def test_task_chain_order_states_and_history(mem: Memory, clock: ManualClock) -> None:
    await commit(mem, ("user", "likes", "rock"))
    first = await mem.call_tool(
        "task_create", {**U1, "task_id": "T1", "description": "one", "info_nodes": ["n1", "user:u1"]}
    )
    assert first["previous_task"] is None and first["task"]["info_nodes"] == ["n1", "user"]
    types = dict(await rows(mem, "SELECT name, type FROM graph_nodes WHERE name IN ('n1', 'user')"))
    # A name nobody wrote yet becomes an InfoNode; a known node keeps its type.
    assert types == {"n1": "InfoNode", "user": "EntityNode"}
    clock.advance(minutes=1)
    second = await mem.call_tool("task_create", {**U1, "task_id": "T2", "description": "two"})
    clock.advance(minutes=1)
    await mem.call_tool("task_create", {**U1, "task_id": "T3", "description": "three"})
    assert second["previous_task"] == "T1"
    await mem.call_tool("task_set_state", {**U1, "task_id": "T1", "state": "done"})
    await mem.call_tool("task_set_state", {**U1, "task_id": "T2", "state": "paused"})
    await mem.call_tool("task_set_state", {**U1, "task_id": "T2", "state": "in_progress"})
    chain = (await mem.call_tool("task_query", U1))["tasks"]
    assert [(t["task_id"], t["state"]) for t in chain] == [
        ("T3", "in_progress"),
        ("T2", "in_progress"),
        ("T1", "done"),
    ]
    assert set(chain[0]) == {"task_id", "description", "state", "created_at", "info_nodes"}
    done = await mem.call_tool("task_query", {**U1, "state": "done"})
    assert [t["task_id"] for t in done["tasks"]] == ["T1"]
    assert len((await mem.call_tool("task_query", {**U1, "limit": 2}))["tasks"]) == 2
    links = {(e["subject"], e["object"]) for e in await edges(mem, "e.relation = 'NEXT_TASK'")}
    assert links == {("T1", "T2"), ("T2", "T3")}
    t2_states = [
        (e["object"], e["status"]) for e in await edges(mem, "s.name = 'T2' AND e.relation = 'HAS_STATE'")
    ]
    assert t2_states == [
        ("state:in_progress", "superseded"),
        ("state:paused", "superseded"),
        ("state:in_progress", "active"),
    ]
    with raises_on("chat_id"):
        await mem.call_tool("task_query", {"user_id": "u1"})


# --- persona ---------------------------------------------------------------------------------------


async def test_replacing_the_persona_touches_only_its_own_edges(mem: Memory) -> None:
    await commit(
        mem, ("AI assistant fan", "likes", "robots"), ("AI", "likes", "cats"), ("user", "likes", "AI")
    )
    first = await mem.call_tool(
        "persona_set",
        {**U1, "description": "a cheerful catgirl", "traits": ["cheerful", "curious"], "tone": "playful ~"},
    )
    assert first["replaced"] is None and first["persona"]["version"] == 1
    second = await mem.call_tool("persona_set", {**U1, "description": "a calm butler", "traits": ["polite"]})
    assert second["replaced"]["description"] == "a cheerful catgirl"
    assert second["superseded_edges"] == 4  # HAS_PERSONA and the old persona's two traits and tone
    untouched = {(e["subject"], e["object"]) for e in await edges(mem, "e.relation = 'likes'")}
    assert untouched == {("AI assistant fan", "robots"), ("AI", "cats"), ("user", "AI")}
    assert {e["status"] for e in await edges(mem, "e.relation = 'likes'")} == {"active"}
    old = await edges(mem, "s.name = 'persona:v1' OR (e.relation = 'HAS_PERSONA' AND o.name = 'persona:v1')")
    assert {e["status"] for e in old} == {"superseded"} and len(old) == 4
    got = await mem.call_tool("persona_get", U1)
    assert got["persona"]["description"] == "a calm butler"
    assert got["rendered"].startswith("Persona: a calm butler")
    found = await recall(mem, "AI,persona,role,character,tone,speaking_style", depth=2)
    assert ("AI", "HAS_PERSONA", "persona:v2") in said(found)
    assert ("AI", "HAS_PERSONA", "persona:v1") not in said(found)


async def test_every_fact_is_listed_newest_first_page_by_page(mem: Memory) -> None:
    """A walk from "user" reaches what is linked to it within its hops: the facts of the user's
    graph linked to nothing of theirs were in no list an inspector could show."""
    await commit(
        mem,
        ("user", "likes", "jazz"),
        ("sister", "lives_in", "Paris"),
        ("bob", "owes_money_to", "mallory"),
        ("user", "has_trait", "patient"),
    )
    await mem.call_tool(
        "memory_commit",
        {
            **U1,
            "triplets": [{"subject": "user", "relation": "plans", "object": "a trip"}],
            "speculative": True,
        },
    )
    await mem.call_tool("persona_set", {**U1, "description": "a calm butler", "traits": ["polite"]})
    seen: list[str] = []
    before: int | None = None
    while True:
        page = await mem.call_tool(
            "memory_facts", {**U1, "limit": 2, **({"before_id": before} if before else {})}
        )
        seen += [f"{f['subject']} {f['relation']} {f['object']}" for f in page["facts"]]
        if not page["more"]:
            break
        before = page["facts"][-1]["id"]
    assert seen == [
        "user plans a trip",
        "user has_trait patient",  # the user's, not the persona's
        "bob owes_money_to mallory",
        "sister lives_in Paris",
        "user likes jazz",
    ]
    said = await mem.call_tool("memory_facts", {**U1, "include_speculative": False})
    assert [f["object"] for f in said["facts"]] == ["patient", "mallory", "Paris", "jazz"]
    assert said["more"] is False
    assert (await mem.call_tool("memory_facts", {"user_id": "u2"}))["facts"] == []


async def test_persona_falls_back_to_the_users_default(mem: Memory) -> None:
    async def described(**scope: str) -> str | None:
        persona = (await mem.call_tool("persona_get", scope))["persona"]
        return None if persona is None else str(persona["description"])

    await mem.call_tool("persona_set", {"user_id": "u1", "description": "default self"})
    assert await described(user_id="u1", chat_id="c9") == "default self"
    await mem.call_tool("persona_set", {"user_id": "u1", "chat_id": "c9", "description": "chat self"})
    assert await described(user_id="u1", chat_id="c9") == "chat self"
    assert await described(user_id="u1", chat_id="c1") == "default self"
    assert await described(user_id="u2") is None
    # Asked without a chat: the default, and each chat's own (an inspector showed "none set" for
    # a user whose persona was set for one chat, which the bot was given there).
    await mem.call_tool("persona_set", {"user_id": "u2", "chat_id": "c2", "description": "only here"})
    await mem.call_tool("persona_set", {"user_id": "u2", "chat_id": "c2", "description": "only here, v2"})
    everywhere = await mem.call_tool("persona_get", {"user_id": "u2"})
    assert everywhere["persona"] is None
    assert [(p["chat_id"], p["description"]) for p in everywhere["chats"]] == [("c2", "only here, v2")]
    both = await mem.call_tool("persona_get", {"user_id": "u1"})
    assert [(p["chat_id"], p["description"]) for p in both["chats"]] == [("c9", "chat self")]
    assert (await mem.call_tool("persona_get", {"user_id": "u1", "chat_id": "c9"}))["chats"] == []


# --- context_rewrite ----------------------------------------------------------------------------


def _turn(*names: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "what do you remember?"}]
    for i, name in enumerate(names):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": '{"edges": []}'})
    return messages


async def test_context_rewrite(mem: Memory) -> None:
    messages = _turn("memory_recall", "task_query", "memory_recall")
    good = "I made 3 tool calls: memory_recall (2 calls) and task_query; nothing relevant was found."
    out = await mem.call_tool("context_rewrite", {"messages": messages, "summary": good})
    assert out["messages"] == [
        {
            "role": "user",
            "content": "what do you remember?",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
        {"role": "assistant", "content": good, "tool_calls": None, "tool_call_id": None, "name": None},
    ]
    assert (out["tool_calls"], out["tools"], out["replaced"]) == (3, ["memory_recall", "task_query"], 6)
    for summary, reason in (
        ("Called memory_recall 3 times, nothing found.", "task_query"),
        ("3 calls to memory_recall and task_query.", None),
        ("Called memory_recall and task_query, found nothing.", "how many"),
        ("memory_recall and task_query: three calls.", "how many"),
        ("3 results: 4 calls to memory_recall and task_query.", "claims 4"),
    ):
        arguments = {"messages": messages, "summary": summary}
        if reason is None:
            assert (await mem.call_tool("context_rewrite", arguments))["tool_calls"] == 3
            continue
        with raises_on("summary") as info:
            await mem.call_tool("context_rewrite", arguments)
        assert reason in str(info.value)


def test_context_rewrite_checks_the_messages() -> None:
    def turn(raw: list[dict[str, Any]]) -> Any:
        return read_turn([ChatMessage.model_validate(m) for m in raw])

    with raises_on("messages"):
        turn([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    with raises_on("messages"):
        turn(_turn("memory_recall")[:2])  # a call without its answer
    with raises_on("messages"):
        turn([*_turn("memory_recall"), {"role": "user", "content": "second turn"}])
    with raises_on("messages.1.tool_call_id"):
        turn([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "{}"}])
    with raises_on("messages.3.tool_call_id"):
        turn([*_turn("memory_recall"), {"role": "tool", "tool_call_id": "c0", "content": "{}"}])
    with raises_on("messages.0.tool_calls"):
        turn([{"role": "user", "content": "x", "tool_calls": [{"id": "a", "function": {"name": "f"}}]}])
    assert check_summary("1 call: memory_recall", turn(_turn("memory_recall"))) is None


async def test_context_rewrite_is_strict_about_fields(mem: Memory) -> None:
    messages = _turn("memory_recall")
    messages[0]["audio"] = None
    with raises_on("messages.0.audio"):
        await mem.call_tool("context_rewrite", {"messages": messages, "summary": "1 call: memory_recall"})


# --- facts from messages -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        ("I like rock", [("likes", "rock", False)]),
        ("Honestly, I really love jazz music!", [("likes", "jazz music", False)]),
        ("I'm working on the narrmem project", [("works_on", "narrmem project", False)]),
        ("I plan to learn guitar next year.", [("plans", "learn guitar", False)]),
        ("I'm currently at the airport", [("located_at", "airport", False)]),
        ("I'm at home right now", [("located_at", "home", False)]),
        ("I live in Berlin", [("lives_in", "Berlin", False)]),
        ("I don't like rock anymore", [("dislikes", "rock", False)]),
        ("I think I like jazz", [("likes", "jazz", True)]),
        ("I might enjoy opera", [("likes", "opera", True)]),
        ("I went to a Coldplay concert last night", [("likes", "Coldplay", True)]),
        ("I like rock, but I hate country.", [("likes", "rock", False), ("dislikes", "country", False)]),
        ("我喜欢摇滚", [("likes", "摇滚", False)]),
        ("我在做X项目", [("works_on", "X项目", False)]),
        ("我打算学吉他", [("plans", "学吉他", False)]),
        ("我现在在北京出差", [("located_at", "北京", False)]),
        ("我不再喜欢摇滚了", [("dislikes", "摇滚", False)]),
        ("我可能喜欢爵士", [("likes", "爵士", True)]),
        ("我觉得我喜欢爵士", [("likes", "爵士", True)]),
        ("我去了周杰伦的演唱会", [("likes", "周杰伦", True)]),
        ("I like rock, do you?", [("likes", "rock", False)]),
        ("我喜欢摇滚，你呢？", [("likes", "摇滚", False)]),
        ("我现在在家呢", [("located_at", "家", False)]),
    ],
)
def test_fact_rules(text: str, facts: list[tuple[str, str, bool]]) -> None:
    assert [(f.relation, f.object, f.speculative) for f in extract(text)] == facts
    assert all(f.subject == "user" for f in extract(text))


@pytest.mark.parametrize(
    "text",
    [
        "Do you like rock?",
        "I like rock?",
        "Do you think I like rock, or not?",
        "我是不是喜欢摇滚",
        "what do I like",
        "My brother likes rock",
        "He said I like rock",
        "If I like it, I'll buy it",
        "I would like a coffee",
        "I love you",
        "I like it when it rains",
        "I'm in love",
        "You're working on narrmem",
        "你喜欢摇滚吗？",
        "他喜欢摇滚",
        "我朋友喜欢摇滚",
        "我喜欢什么",
        "我现在在上班",
        "我爱你",
    ],
)
def test_questions_third_person_and_empty_objects_state_no_fact(text: str) -> None:
    assert extract(text) == []


async def test_ingest_writes_facts_and_notes(mem: Memory) -> None:
    result = await mem.ingest(msg("m1", "I'm working on the narrmem project. I like rock", ts=at(0)))
    assert "fact: user works_on narrmem project" in result.notes
    assert "fact: user likes rock" in result.notes
    again = await mem.ingest(msg("m2", "I really like rock", ts=at(1)))
    assert "fact confirmed (2x): user likes rock" in again.notes
    [row] = await edges(mem, "o.name = 'rock'")
    assert (row["source"], row["provenance"], row["count"], row["chat_id"]) == (
        "message",
        '["m1", "m2"]',
        2,
        "c1",
    )
    question = await mem.ingest(msg("m3", "Do you like jazz?", ts=at(2)))
    assert not any(n.startswith("fact") for n in question.notes)
    spec = await mem.ingest(msg("m4", "I went to a Coldplay concert yesterday", ts=at(3)))
    assert "fact: user[speculation] likes Coldplay" in spec.notes


async def test_a_contradicting_fact_supersedes_the_earlier_one(mem: Memory) -> None:
    await mem.ingest(msg("m1", "I like rock", ts=at(0)))
    later = await mem.ingest(msg("m2", "I don't like rock anymore", ts=at(5)))
    assert "fact superseded: user likes rock -> user dislikes rock" in later.notes
    assert said(await recall(mem, "rock")) == {("user", "dislikes", "rock")}
    old, new = await edges(mem, "o.name = 'rock'")
    assert (old["relation"], old["status"], old["superseded_by"]) == ("likes", "superseded", new["id"])
    assert await rows(mem, "SELECT mode, actor FROM graph_purges") == [("supersede", "message:m2")]
    # Chinese, and across chats: what the user says about themselves holds everywhere.
    await mem.ingest(msg("z1", "我喜欢摇滚", ts=at(10), chat="c2"))
    await mem.ingest(msg("z2", "我不再喜欢摇滚了", ts=at(11), chat="c3"))
    assert said(await recall(mem, "摇滚", user_id="u1", depth=1)) == {("user", "dislikes", "摇滚")}
    # Where the user is holds one place at a time.
    await mem.ingest(msg("p1", "I'm currently at the airport", ts=at(20)))
    await mem.ingest(msg("p2", "I'm at the hotel right now", ts=at(30)))
    await mem.ingest(msg("h1", "I live in Berlin", ts=at(40)))
    await mem.ingest(msg("h2", "I moved to Lisbon", ts=at(50)))
    where = {
        (e["relation"], e["object"])
        for e in (await recall(mem, "user", user_id="u1"))["edges"]
        if e["relation"] in ("located_at", "lives_in")
    }
    assert where == {("located_at", "hotel"), ("lives_in", "Lisbon")}


async def test_an_old_message_ingested_late_is_history(mem: Memory) -> None:
    await mem.ingest(msg("m2", "I don't like rock anymore", ts=at(60)))
    late = await mem.ingest(msg("m1", "I like rock", ts=at(0)))
    assert "fact (already outdated, kept as history): user likes rock (past: until 2026-05-04)" in late.notes
    assert said(await recall(mem, "rock")) == {("user", "dislikes", "rock")}
    rows = {e["relation"]: e for e in await edges(mem, "o.name = 'rock'")}
    likes, dislikes = rows["likes"], rows["dislikes"]
    assert (likes["status"], likes["superseded_by"], dislikes["status"]) == (
        "superseded",
        dislikes["id"],
        "active",
    )
    assert datetime.fromisoformat(likes["valid_to"]) == START + timedelta(minutes=60)


class RichFacts:
    """An LLM-style extractor answering the (optional until declared) ``narrmem_extract_facts`` hook."""

    narrmem_name = "rich_facts"

    @hookimpl(optionalhook=True)
    def narrmem_extract_facts(self, message: Any) -> list[dict[str, Any]] | None:
        if "robot" not in message.text:
            return None
        return [
            {"relation": "owns", "object": "a robot"},
            {"relation": "likes", "object": "robots", "speculative": True},
            {"relation": "NEXT_TASK", "object": "x"},
        ]


async def test_an_extractor_plugin_replaces_the_rules(tmp_path: Path, storage: dict[str, Any]) -> None:
    async with open_memory(tmp_path / "m", plugins=[RichFacts()], **storage) as mem:
        result = await mem.ingest(msg("m1", "I built a robot and I like rock", ts=at(0)))
        assert "fact: user owns a robot" in result.notes
        assert "fact: user[speculation] likes robots" in result.notes
        assert not any("rock" in n for n in result.notes)  # the extractor answered, so no rules ran
        assert any("fact 2 from narrmem_extract_facts is invalid" in n for n in result.notes)
        plain = await mem.ingest(msg("m2", "I like jazz", ts=at(1)))
        assert "fact: user likes jazz" in plain.notes  # None leaves the message to the rules


async def test_fact_extraction_can_be_turned_off(tmp_path: Path, storage: dict[str, Any]) -> None:
    plugin = {"graph": {"extract_facts": False}}
    async with open_memory(tmp_path / "m", plugin=plugin, **storage) as mem:
        result = await mem.ingest(msg("m1", "I like rock", ts=at(0)))
        assert not any(n.startswith("fact") for n in result.notes)


# --- the per-turn context ------------------------------------------------------------------------


async def test_turn_context(mem: Memory) -> None:
    await mem.call_tool("persona_set", {**U1, "description": "a cheerful catgirl", "tone": "ends with ~"})
    await mem.ingest(msg("m1", "I like rock", ts=at(0)))
    await mem.ingest(msg("m2", "I'm working on a robot", ts=at(1)))
    await commit(mem, ("user", "likes", "cats"), speculative=True)
    await mem.call_tool("task_create", {**U1, "task_id": "Task_old", "description": "talk about rock"})
    await mem.call_tool("task_set_state", {**U1, "task_id": "Task_old", "state": "done"})
    await commit(mem, ("game_state", "score", "3"))
    await mem.call_tool(
        "task_create", {**U1, "task_id": "Task_now", "description": "a game", "info_nodes": ["game_state"]}
    )

    now = await turn_context(mem, "let's keep playing", user_id="u1", chat_id="c1")
    assert now["persona"]["description"] == "a cheerful catgirl"
    assert now["refers_back"] is False and [t["task_id"] for t in now["tasks"]] == ["Task_now"]
    assert [(f["subject"], f["relation"], f["object"]) for f in now["task_facts"]] == [
        ("game_state", "score", "3")
    ]
    assert {(f["relation"], f["object"]) for f in now["facts"]} == {
        ("likes", "rock"),
        ("works_on", "robot"),
        ("likes", "cats"),
    }
    rendered = now["rendered"]
    assert "Persona: a cheerful catgirl" in rendered and "Tone: ends with ~" in rendered
    assert "- Task_now [in_progress] a game (info: game_state)" in rendered and "Task_old" not in rendered
    assert "  - game_state score 3" in rendered and "user[speculation] likes cats" in rendered

    back = await turn_context(mem, "What did we talk about last time?", user_id="u1", chat_id="c1")
    assert back["refers_back"] is True
    assert [t["task_id"] for t in back["tasks"]] == ["Task_now", "Task_old"]
    assert "- Task_old [done] talk about rock" in back["rendered"]
    # Facts that share words with the message come first; recall hits come along.
    rock = await turn_context(mem, "any rock news?", user_id="u1", chat_id="c1")
    assert rock["facts"][0]["object"] == "rock" and rock["memories"]
    assert "[Memories]" in rock["rendered"]
    zh = await turn_context(mem, "我们刚才聊到哪了", user_id="u1", chat_id="c1")
    assert zh["refers_back"] is True

    empty = await turn_context(mem, "hello", user_id="u9", chat_id="c9")
    assert empty["persona"] is None and empty["tasks"] == [] and empty["facts"] == []
    assert "No persona is set" in empty["rendered"] and "No task in progress." in empty["rendered"]


async def test_turn_context_through_the_hook(mem: Memory) -> None:
    await mem.call_tool("task_create", {**U1, "task_id": "Task_x", "description": "x"})
    answer = await mem.host.call_first(
        "narrmem_turn_context",
        memory=mem,
        tenant="default",
        user_id="u1",
        chat_id="c1",
        text="hi",
        private=False,
    )
    assert [t["task_id"] for t in answer["tasks"]] == ["Task_x"] and isinstance(answer["rendered"], str)


@pytest.mark.skipif(not hasattr(Memory, "turn_context"), reason="Memory.turn_context is not in narrmem yet")
async def test_memory_turn_context(mem: Memory) -> None:
    await mem.call_tool("task_create", {**U1, "task_id": "Task_x", "description": "x"})
    answer = await mem.turn_context("hi", user_id="u1", chat_id="c1")  # type: ignore[attr-defined]
    assert [t["task_id"] for t in answer["tasks"]] == ["Task_x"]


# --- the seed's example: the idiom chain game ---------------------------------------------------


async def test_idiom_chain_game(mem: Memory, clock: ManualClock) -> None:
    """Three turns as the seed plays them, every memory operation through the tools."""
    await mem.call_tool("persona_set", {**U1, "description": "catgirl", "traits": ["playful"], "tone": "~"})

    # Turn 1: the user starts the game.
    text = "Let's play idiom chain! I'll start: 为所欲为"
    await mem.ingest(msg("t1", text, ts=clock.now().isoformat()))
    context = await turn_context(mem, text, user_id="u1", chat_id="c1")
    assert context["persona"]["description"] == "catgirl" and context["tasks"] == []
    persona = await recall(mem, "AI,persona,role,character,tone,speaking_style", depth=2)
    assert ("persona:v1", "has_tone", "~") in said(persona)
    chain = await recall(mem, "TaskNode,working_memory,task_chain", depth=2)
    assert chain["edges"] == []  # no active task yet
    await commit(
        mem, ("idiom_chain_current", "content", "为所欲为"), ("idiom_chain_current", "game", "idiom_chain")
    )
    created = await mem.call_tool(
        "task_create",
        {
            **U1,
            "task_id": "Task_idiom_chain",
            "description": "Idiom chain game, current: 为所欲为",
            "info_nodes": ["idiom_chain_current"],
        },
    )
    assert created["task"]["state"] == "in_progress"
    # The bot answers 为虎作伥 and records its move: the current idiom is corrected, not duplicated.
    moved = await mem.call_tool(
        "memory_purge",
        {
            **U1,
            "filters": {"subject": "idiom_chain_current", "relation": "content"},
            "mode": "supersede",
            "new_triplet": {"subject": "idiom_chain_current", "relation": "content", "object": "为虎作伥"},
        },
    )
    assert [t["object"] for t in moved["triplets"]] == ["为所欲为"]

    # Turn 2: another topic interrupts.
    clock.advance(minutes=2)
    text = "Nagato Yuki"
    await mem.ingest(msg("t2", text, ts=clock.now().isoformat()))
    context = await turn_context(mem, text, user_id="u1", chat_id="c1")
    assert [(t["task_id"], t["state"]) for t in context["tasks"]] == [("Task_idiom_chain", "in_progress")]
    await mem.call_tool("task_set_state", {**U1, "task_id": "Task_idiom_chain", "state": "paused"})
    await mem.call_tool(
        "task_create", {**U1, "task_id": "Task_nagato_yuki", "description": "Discuss Nagato Yuki"}
    )

    # Turn 3: back to the game, "just now" pulls the chain in.
    clock.advance(minutes=2)
    text = "About the idiom chain just now, I don't know how to connect to your idiom, please help me"
    await mem.ingest(msg("t3", text, ts=clock.now().isoformat()))
    context = await turn_context(mem, text, user_id="u1", chat_id="c1")
    assert context["refers_back"] is True
    assert [(t["task_id"], t["state"]) for t in context["tasks"]] == [
        ("Task_nagato_yuki", "in_progress"),
        ("Task_idiom_chain", "paused"),
    ]
    assert "  - idiom_chain_current content 为虎作伥" in context["rendered"]
    paused = await mem.call_tool("task_query", {**U1, "state": "paused"})
    assert [t["task_id"] for t in paused["tasks"]] == ["Task_idiom_chain"]
    await mem.call_tool("task_set_state", {**U1, "task_id": "Task_idiom_chain", "state": "in_progress"})
    info = await recall(mem, "idiom_chain_current", depth=1)
    contents = [e["object"] for e in info["edges"] if e["relation"] == "content"]
    assert contents == ["为虎作伥"]  # the last idiom; 为所欲为 is history, not a second answer
    game = await recall(mem, "idiom_chain", depth=2)
    assert {
        ("Task_idiom_chain", "CONTAINS_INFO", "idiom_chain_current"),
        ("idiom_chain_current", "content", "为虎作伥"),
        ("Task_idiom_chain", "HAS_STATE", "state:in_progress"),
    } <= said(game)
    assert ("idiom_chain_current", "content", "为所欲为") not in said(game)
    final = await mem.call_tool("task_query", U1)
    assert [(t["task_id"], t["state"]) for t in final["tasks"]] == [
        ("Task_nagato_yuki", "in_progress"),
        ("Task_idiom_chain", "in_progress"),
    ]
    assert final["tasks"][1]["info_nodes"] == ["idiom_chain_current"]


# --- auto tasks, forgetting, options ----------------------------------------------------------------


@pytest.mark.parametrize("tasks_a_query", [None, 1])
async def test_auto_tasks_follow_the_topic(
    tmp_path: Path, storage: dict[str, Any], tasks_a_query: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with the chain read a task a query: a chain of thousands went past SQLite's
    limit of bound values in one, and every message of the chat failed the graph's hook."""
    if tasks_a_query is not None:
        from narrmem_plugins.graph import tasks

        monkeypatch.setattr(tasks, "TASKS_A_QUERY", tasks_a_query)
    options = {"graph": {"auto_tasks": True, "extract_facts": False}}
    async with open_memory(tmp_path / "m", plugin=options, **storage) as mem:
        talk = [
            ("a1", "my garden tomatoes are growing fast this summer"),
            ("a2", "the garden tomatoes need more water this summer"),
            ("b1", "the new python release has faster startup"),
            ("a3", "back to my garden tomatoes, they need water"),
        ]
        notes = {}
        for i, (mid, text) in enumerate(talk):
            result = await mem.ingest(msg(mid, text, ts=at(i)))
            notes[mid] = [n for n in result.notes if n.startswith("task ")]
        assert notes["a1"] == ["task started: Task_auto_1"]
        assert notes["a2"] == []
        assert notes["b1"] == ["task paused: Task_auto_1", "task started: Task_auto_2"]
        assert notes["a3"] == ["task paused: Task_auto_2", "task resumed: Task_auto_1"]
        chain = (await mem.call_tool("task_query", U1))["tasks"]
        assert [(t["task_id"], t["state"]) for t in chain] == [
            ("Task_auto_2", "paused"),
            ("Task_auto_1", "in_progress"),
        ]
        assert chain[1]["description"].startswith("my garden tomatoes")


async def test_forget_erases_the_graph(mem: Memory) -> None:
    await mem.ingest(msg("m1", "I like rock", ts=at(0)))
    await mem.ingest(msg("m2", "I like jazz", ts=at(0), user="u2"))
    await mem.call_tool("task_create", {**U1, "task_id": "T", "description": "d"})
    await mem.call_tool("memory_purge", {**U1, "filters": {"object": "rock"}})
    await mem.forget(user_id="u1")
    for table in ("graph_nodes", "graph_edges", "graph_purges"):
        assert await rows(mem, f"SELECT COUNT(*) FROM {table} WHERE user_id = 'u1'") == [(0,)]
    assert said(await recall(mem, "jazz", user_id="u2", chat_id="c1")) == {("user", "likes", "jazz")}
    stats = (await mem.stats())["graph"]
    assert stats["edges"] == {"active": 1} and stats["purges"] == 0
    # Forgetting a chat takes the record of a supersession that crossed chats with it.
    await mem.ingest(msg("x1", "I like tea", ts=at(1), user="u3", chat="tea-chat"))
    await mem.ingest(msg("x2", "I don't like tea anymore", ts=at(2), user="u3", chat="other-chat"))
    assert await rows(mem, "SELECT COUNT(*) FROM graph_purges WHERE user_id = 'u3'") == [(1,)]
    await mem.forget(chat_id="tea-chat")
    assert await rows(mem, "SELECT COUNT(*) FROM graph_purges WHERE user_id = 'u3'") == [(0,)]
    assert said(await recall(mem, "tea", user_id="u3", depth=1)) == {("user", "dislikes", "tea")}


async def test_tools_are_strict(mem: Memory) -> None:
    assert {"memory_commit", "memory_purge", "memory_recall", "task_create", "task_set_state", "task_query",
            "persona_set", "persona_get", "context_rewrite"} <= set(mem.tools.names())  # fmt: skip
    with raises_on("triplets.0.weight"):
        await mem.call_tool(
            "memory_commit",
            {**U1, "triplets": [{"subject": "a", "relation": "b", "object": "c", "weight": 1}]},
        )
    with raises_on("triplets"):
        await mem.call_tool("memory_commit", {**U1, "triplets": []})
    with raises_on("user_id"):
        await mem.call_tool("memory_recall", {"query_intent": "x"})
    with raises_on("state"):
        await mem.call_tool("task_set_state", {**U1, "task_id": "T", "state": "finished"})
    with raises_on("triplets.0.subject"):
        await mem.call_tool(
            "memory_commit", {**U1, "triplets": [{"subject": "a\nb", "relation": "b", "object": "c"}]}
        )


async def test_unknown_option_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"plugin\.graph\.auto_task"):
        await open_memory(tmp_path / "m", plugin={"graph": {"auto_task": True}})


async def test_the_graph_survives_reopening(tmp_path: Path, storage: dict[str, Any]) -> None:
    async with open_memory(tmp_path / "m", **storage) as mem:
        await commit(mem, ("user", "likes", "rock"))
    # On PostgreSQL the graph lives in the database: another folder (another worker) sees it too.
    folder = tmp_path / ("m" if not storage else "n")
    async with open_memory(folder, **storage) as mem:
        assert said(await recall(mem, "rock")) == {("user", "likes", "rock")}
        # New rows continue after the ones there.
        out = await commit(mem, ("user", "likes", "jazz"))
        assert out["created"] == 1


def test_tools_need_an_open_graph() -> None:
    with pytest.raises(PluginError, match="not started"):
        GraphPlugin().backend()


@pytest.mark.slow
async def test_recall_seeds_by_meaning_with_the_real_model(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", real_model=True) as mem:
        await commit(mem, ("user", "plays", "guitar"), ("user", "owns", "a cat"), ("user", "eats", "sushi"))
        instrument = await recall(mem, "musical instrument", depth=1)
        assert instrument["seeds"] == ["guitar"] and said(instrument) == {("user", "plays", "guitar")}
        pets = await recall(mem, "pets", depth=1)
        assert said(pets) == {("user", "owns", "a cat")}
