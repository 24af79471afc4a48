"""A deleted message in a group chat, where the graph holds the facts of everyone in it: the forget
reads the triplets, tasks and purge records that name the message, not the whole chat's, and still
takes everything the message said (an id the text search could miss reads the chat whole). Runs on
either store (``TESTS_STORE``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from narrmem_plugins.graph.backend import GraphSQL

from narrmem.testing import open_memory

MEMBERS = 40
AUTO_TASKS = {"graph": {"auto_tasks": True}}


def at(minute: int) -> str:
    return f"2026-05-04T{9 + minute // 60:02d}:{minute % 60:02d}:00+00:00"


@pytest.fixture
def graph_rows_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Rows each graph table gave the graph's reads, from when the test sets ``counting``."""
    read: dict[str, int] = {"counting": 0}
    fetchall = GraphSQL.fetchall

    async def counted(self: GraphSQL, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows = await fetchall(self, sql, params)
        if read["counting"]:
            for table in ("graph_edges", "graph_nodes", "graph_purges"):
                if f"FROM {table}" in sql:
                    read[table] = read.get(table, 0) + len(rows)
        return rows

    monkeypatch.setattr(GraphSQL, "fetchall", counted)
    yield read


async def _group(mem: Any, ann_said: str) -> None:
    """A group where each member moved house once (a fact, and the supersession of the one before),
    then Ann says one thing."""
    for n in range(MEMBERS):
        user = f"member{n}"
        await mem.ingest(msg(f"{user}-a", f"I live in Zqold{n}ville", user=user, chat="g", ts=at(n)))
        await mem.ingest(msg(f"{user}-b", f"I live in Zqnew{n}ville", user=user, chat="g", ts=at(n)))
    await mem.ingest(msg(ann_said, "I live in Zqannton", user="ann", chat="g", ts=at(MEMBERS + 1)))
    await mem.settle()


async def _facts(mem: Any) -> str:
    rows = await store_sql(mem, "SELECT name FROM graph_nodes")
    rows += await store_sql(mem, "SELECT edges FROM graph_purges")
    return " ".join(str(r[0]) for r in rows).lower()


async def test_a_deletion_reads_what_the_message_said_not_the_groups_graph(
    tmp_path: Path, graph_rows_read: dict[str, int]
) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _group(mem, "ann-1")
        [(edges,)] = await store_sql(mem, "SELECT COUNT(*) FROM graph_edges WHERE chat_id = 'g'")
        [(records,)] = await store_sql(mem, "SELECT COUNT(*) FROM graph_purges WHERE user_id LIKE 'member%'")
        assert edges >= 2 * MEMBERS and records >= MEMBERS  # the group's graph the forget must not read
        graph_rows_read["counting"] = 1
        await mem.forget_messages(chat_id="g", message_ids=["ann-1"])
        graph_rows_read["counting"] = 0
        facts = await _facts(mem)
    assert "zqannton" not in facts
    assert all(f"zqnew{n}ville" in facts and f"zqold{n}ville" in facts for n in range(MEMBERS))
    # Ann's fact and her task's triplets, not the group's; no record of anyone else's move.
    assert graph_rows_read.get("graph_edges", 0) <= 10, graph_rows_read
    assert graph_rows_read.get("graph_purges", 0) == 0, graph_rows_read
    assert graph_rows_read.get("graph_nodes", 0) <= 5, graph_rows_read


async def test_a_members_move_forgotten_in_a_group_leaves_every_other_move(
    tmp_path: Path, graph_rows_read: dict[str, int]
) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _group(mem, "ann-1")
        graph_rows_read["counting"] = 1
        await mem.forget_messages(chat_id="g", message_ids=["member7-b"])
        graph_rows_read["counting"] = 0
        facts = await _facts(mem)
        [(records,)] = await store_sql(mem, "SELECT COUNT(*) FROM graph_purges WHERE user_id LIKE 'member%'")
    assert "zqnew7ville" not in facts and "zqold7ville" in facts
    assert all(f"zqnew{n}ville" in facts for n in range(MEMBERS) if n != 7)
    assert records == MEMBERS - 1  # the move's record went with the message that made it
    assert graph_rows_read.get("graph_purges", 0) <= 2, graph_rows_read


async def test_an_id_the_search_could_miss_reads_the_group_and_forgets_all_the_same(
    tmp_path: Path, graph_rows_read: dict[str, int]
) -> None:
    said = "сообщение/1"  # letters JSON may write as \u escapes, and a slash it may write as \/
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _group(mem, said)
        # Written as another JSON writer may have written it (an imported file): escaped.
        escaped = '"\\u0441\\u043e\\u043e\\u0431\\u0449\\u0435\\u043d\\u0438\\u0435\\/1"'
        async with mem.store.sql(write=True) as db:
            changed = await db.execute(
                "UPDATE graph_edges SET provenance = ? WHERE user_id = 'ann'", (f"[{escaped}]",)
            )
        assert changed
        graph_rows_read["counting"] = 1
        await mem.forget_messages(chat_id="g", message_ids=[said])
        graph_rows_read["counting"] = 0
        facts = await _facts(mem)
    assert "zqannton" not in facts
    assert graph_rows_read["graph_edges"] >= 2 * MEMBERS  # the whole chat, to miss nothing


async def test_a_tool_made_task_auto_tasks_followed_survives_the_forget_of_what_paused_it(
    tmp_path: Path,
) -> None:
    """A task the tools made, followed by a message and paused by another, both deleted: with no
    message left it was taken for a task from before tasks recorded their messages, described by
    the message that paused it, and deleted whole with it."""
    from narrmem_plugins.graph.vocabulary import label

    ask = {"user_id": "ann", "chat_id": "g"}
    description = "plan the fjord kayak trip"
    config = {"graph": {"auto_tasks": True, "extract_facts": False, "topic_similarity": 0.9}}
    async with open_memory(tmp_path / "store", plugin=config) as mem:
        await mem.call_tool("task_create", {**ask, "task_id": "Plan_trip", "description": description})
        said = label("Plan_trip", {"description": description})
        await mem.ingest(msg("m1", said, user="ann", chat="g", ts=at(1)))
        assert await store_sql(mem, "SELECT message_id FROM graph_task_messages") == [("m1",)]
        notes = (
            await mem.ingest(msg("m2", "zqother zqwords entirely", user="ann", chat="g", ts=at(2)))
        ).notes
        assert "task paused: Plan_trip" in notes
        await mem.forget_messages(chat_id="g", message_ids=["m1"])
        await mem.forget_messages(chat_id="g", message_ids=["m2"])
        tasks = (await mem.call_tool("task_query", ask))["tasks"]
    assert [(t["task_id"], t["state"]) for t in tasks] == [("Plan_trip", "in_progress")]


async def test_a_supersessions_record_goes_when_its_fact_is_purged_hard(tmp_path: Path) -> None:
    """A hard purge erases: the record of the supersession that made the purged fact held its
    words, and the id of the message that said it, after the message too was deleted."""
    async with open_memory(tmp_path / "store") as mem:
        await mem.ingest(msg("m1", "I live in Zqparisville", user="ann", chat="g", ts=at(1)))
        await mem.ingest(msg("m2", "I live in Zqberlinton", user="ann", chat="g", ts=at(2)))
        purge = {"user_id": "ann", "chat_id": "g", "filters": {"object": "Zqberlinton"}, "mode": "hard"}
        assert (await mem.call_tool("memory_purge", purge))["matched"] == 1
        await mem.forget_messages(chat_id="g", message_ids=["m2"])
        actors = [actor for (actor,) in await store_sql(mem, "SELECT actor FROM graph_purges")]
        text = str(await store_sql(mem, "SELECT filters, edges FROM graph_purges"))
    assert actors == ["memory_purge"] and "zqberlinton" not in text.lower()
