"""A deleted or edited message takes out of the graph everything it said: the triplets it stated,
what the purge history records of them (a supersession names the old triplet's words), and the
automatic tasks it started or followed (a task's description is a message's opening, its topic the
mean of its messages' vectors). Runs on either store (``TESTS_STORE``); the bytes of the data folder
are checked once the memory is closed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from _helpers import msg, on_sqlite, store_sql

from narrmem import Scope
from narrmem.doors.transfer import export_store
from narrmem.testing import open_memory

PURGES = "SELECT mode, actor, filters, edges FROM graph_purges"
GRAPH_TEXT = (
    "SELECT name || ' ' || props || ' ' || COALESCE(vector_text, '') FROM graph_nodes",
    "SELECT message_id FROM graph_task_messages",
    "SELECT actor || ' ' || filters || ' ' || edges FROM graph_purges",
    "SELECT provenance FROM graph_edges",
)
AUTO_TASKS = {"graph": {"auto_tasks": True, "extract_facts": False}}
TASKS = "SELECT name, props, topic_vector FROM graph_nodes WHERE type = 'TaskNode' ORDER BY id"
FOLLOWED = "SELECT message_id FROM graph_task_messages ORDER BY id"


def _files_with(folder: Path, markers: tuple[bytes, ...]) -> dict[str, int]:
    found: dict[str, int] = {}
    for path in folder.rglob("*"):
        if path.is_file():
            hits = sum(path.read_bytes().count(m) for m in markers)
            if hits:
                found[str(path.relative_to(folder))] = hits
    return found


def at(hour: int) -> str:
    return f"2026-05-04T{hour:02d}:00:00+00:00"


async def _graph_text(mem: Any) -> str:
    rows = [row for query in GRAPH_TEXT for row in await store_sql(mem, query)]
    return " ".join(str(row) for row in rows)


async def _moved_house(mem: Any) -> None:
    await mem.ingest(msg("m1", "I live in Zqparisville", user="ann", chat="c", ts=at(9)))
    await mem.ingest(msg("m2", "I live in Zqberlinton", user="ann", chat="c", ts=at(10)))
    [(mode, actor, _, edges)] = await store_sql(mem, PURGES)
    assert (mode, actor) == ("supersede", "message:m2") and "Zqparisville" in edges


async def test_a_deleted_messages_superseded_fact_leaves_the_purge_history(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await _moved_house(mem)
        assert await mem.forget_messages(chat_id="c", message_ids=["m1"]) == {"memories": 1}
        assert await store_sql(mem, PURGES) == []  # it named nothing else
        assert "Zqparisville" not in await _graph_text(mem)
        await export_store(mem, tmp_path / "export.jsonl")
        hits = await mem.recall("where do I live", user_id="ann")
        assert all("Zqparisville" not in h.text for h in hits)
    assert "Zqparisville" not in (tmp_path / "export.jsonl").read_text(encoding="utf-8")
    assert "Zqberlinton" in (tmp_path / "export.jsonl").read_text(encoding="utf-8")
    assert _files_with(folder, (b"Zqparisville",)) == {}


async def test_a_deleted_message_takes_the_supersession_it_made(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await _moved_house(mem)
        assert await mem.forget_messages(chat_id="c", message_ids=["m2"]) == {"memories": 1}
        # The record of the move named the new place as what contradicted the old one.
        assert await store_sql(mem, PURGES) == []
        assert "Zqberlinton" not in await _graph_text(mem)
        if on_sqlite(mem):
            assert _files_with(folder, (b"Zqparisville",))
    assert _files_with(folder, (b"Zqberlinton",)) == {}


async def test_an_edited_messages_old_fact_leaves_the_graph_and_its_history(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store") as mem:
        await _moved_house(mem)
        await mem.edit(msg("m1", "I had a nice day", user="ann", chat="c", ts=at(9)))
        assert "Zqparisville" not in await _graph_text(mem)
        assert await store_sql(mem, PURGES) == []
        await export_store(mem, tmp_path / "export.jsonl")
    # The episode keeps its earlier texts on purpose (narrmem.editing); the graph keeps none.
    graph_lines = [
        line
        for line in (tmp_path / "export.jsonl").read_text(encoding="utf-8").splitlines()
        if '"graph.' in line
    ]
    assert graph_lines and not any("Zqparisville" in line for line in graph_lines)


async def test_a_purge_record_keeps_only_the_triplets_still_said(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store") as mem:
        await mem.ingest(msg("m1", "I like zqkale", user="ann", chat="c", ts=at(9)))
        await mem.ingest(msg("m2", "I like zqokra", user="ann", chat="c", ts=at(10)))
        await mem.call_tool(
            "memory_purge",
            {"user_id": "ann", "chat_id": "c", "filters": {"relation": "likes"}, "mode": "soft"},
        )
        await mem.forget_messages(chat_id="c", message_ids=["m1"])
        [(mode, actor, _, edges)] = await store_sql(mem, PURGES)
    assert (mode, actor) == ("soft", "memory_purge")
    assert [e["object"].lower() for e in json.loads(edges)] == ["zqokra"]


async def test_a_task_a_deleted_message_started_goes_with_it(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder, plugin={"graph": {"auto_tasks": True}}) as mem:
        said = msg("m1", "help me plan the zqsecretproject launch party", user="ann", chat="c")
        assert "task started: Task_auto_1" in (await mem.ingest(said)).notes
        await mem.forget_messages(chat_id="c", message_ids=["m1"])
        assert await store_sql(mem, TASKS) == []
        assert await store_sql(mem, "SELECT source, provenance FROM graph_edges") == []
        context = await mem.turn_context("what was I doing?", user_id="ann", chat_id="c")
        assert "zqsecretproject" not in json.dumps(context) and "Task_auto_1" not in json.dumps(context)
    assert _files_with(folder, (b"zqsecretproject",)) == {}


async def test_a_task_keeps_what_its_other_messages_say_when_its_first_is_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder, plugin=AUTO_TASKS) as mem:
        talk = [
            ("a1", "my zqsecret garden tomatoes are growing fast this summer"),
            ("a2", "the garden tomatoes need more water this summer"),
        ]
        for hour, (mid, text) in enumerate(talk, start=9):
            await mem.ingest(msg(mid, text, user="ann", chat="c", ts=at(hour)))
        assert await store_sql(mem, FOLLOWED) == [("a1",), ("a2",)]
        await mem.forget_messages(chat_id="c", message_ids=["a1"])
        [(name, props, topic)] = await store_sql(mem, TASKS)
        kept = json.loads(props)
        assert (name, kept["described_by"]) == ("Task_auto_1", "a2")
        assert await store_sql(mem, FOLLOWED) == [("a2",)]
        assert kept["description"] == "the garden tomatoes need more water this summer"
        # The topic is a2's vector alone again: nothing of a1's is mixed into it.
        [episode] = await mem.store.from_messages("default", "c", ["a2"])
        [vector] = (await mem.store.vectors([episode], Scope(chat_id="c"))).values()
        assert np.allclose(np.frombuffer(topic, dtype=np.float32), vector / np.linalg.norm(vector))
        edges = await store_sql(mem, "SELECT relation, provenance, status FROM graph_edges")
        assert edges == [("HAS_STATE", '["a2"]', "active")]
        chain = (await mem.call_tool("task_query", {"user_id": "ann", "chat_id": "c"}))["tasks"]
        assert [(t["task_id"], t["state"]) for t in chain] == [("Task_auto_1", "in_progress")]
    assert _files_with(folder, (b"zqsecret",)) == {}


async def test_a_task_a_deleted_message_paused_is_back_in_progress(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        talk = [
            ("a1", "my garden tomatoes are growing fast this summer"),
            ("b1", "the new python release has faster startup"),
            ("c1", "zqfjord kayak booking: june, two paddlers"),
        ]
        for hour, (mid, text) in enumerate(talk, start=9):
            await mem.ingest(msg(mid, text, user="ann", chat="c", ts=at(hour)))
        await mem.forget_messages(chat_id="c", message_ids=["b1"])
        chain = (await mem.call_tool("task_query", {"user_id": "ann", "chat_id": "c"}))["tasks"]
        links = await store_sql(
            mem,
            "SELECT s.name, o.name FROM graph_edges e JOIN graph_nodes s ON s.id = e.subject_id "
            "JOIN graph_nodes o ON o.id = e.object_id WHERE e.relation = 'NEXT_TASK'",
        )
        # Without b1, c1 started the second task and paused the first one.
        assert [(t["task_id"], t["state"]) for t in chain] == [
            ("Task_auto_3", "in_progress"),
            ("Task_auto_1", "paused"),
        ]
        assert links == [("Task_auto_1", "Task_auto_3")]
        assert "python" not in await _graph_text(mem)
        await mem.forget_messages(chat_id="c", message_ids=["c1"])
        chain = (await mem.call_tool("task_query", {"user_id": "ann", "chat_id": "c"}))["tasks"]
        assert [(t["task_id"], t["state"]) for t in chain] == [("Task_auto_1", "in_progress")]
