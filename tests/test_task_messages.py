"""The messages an automatic task followed are rows of ``graph_task_messages``, one a message, not
a list in the task's props written whole again at each message (half a megabyte a message once a
task had followed 20,000). A task of an older store whose props still name its messages moves
them into rows the next time it follows one; a deleted message leaves either; the rows travel in
an export and are checked at an import; a store opened read-only before the table existed still
exports. Runs on either store (``TESTS_STORE``) where it can."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, on_sqlite, store_sql

from narrmem import InputError
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_store
from narrmem.testing import open_memory

AUTO_TASKS = {"graph": {"auto_tasks": True, "extract_facts": False}}
TASK_PROPS = "SELECT id, props FROM graph_nodes WHERE type = 'TaskNode' ORDER BY id"
FOLLOWED = "SELECT task_id, message_id FROM graph_task_messages ORDER BY id"
GARDEN = "my garden tomatoes need water again, the garden beds are dry"


def at(minute: int) -> str:
    return f"2026-05-04T09:{minute:02d}:00+00:00"


async def _garden_talk(mem: Any, count: int, *, first: int = 0) -> None:
    for n in range(first, first + count):
        await mem.ingest(msg(f"g{n}", f"{GARDEN} ({n})", user="ann", chat="c", ts=at(n)))


async def test_a_task_follows_each_message_with_a_row_and_its_props_stay_small(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _garden_talk(mem, 3)
        [(task, props_then)] = await store_sql(mem, TASK_PROPS)
        await _garden_talk(mem, 30, first=3)
        [(_, props_now)] = await store_sql(mem, TASK_PROPS)
        followed = await store_sql(mem, FOLLOWED)
    assert followed == [(task, f"g{n}") for n in range(33)]
    assert "message_ids" not in json.loads(props_now)
    assert len(props_now) <= len(props_then) + 2  # the count moved (a digit more), nothing grew


async def test_an_older_tasks_list_moves_into_rows_and_a_deletion_leaves_it(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _garden_talk(mem, 2)
        [(task, props)] = await store_sql(mem, TASK_PROPS)
        # As a store from before the rows held it: the list in the props, no rows.
        older = {**json.loads(props), "message_ids": ["g0", "g1"]}
        async with mem.store.sql(write=True) as db:
            await db.execute("DELETE FROM graph_task_messages")
            await db.execute("UPDATE graph_nodes SET props = ? WHERE id = ?", (json.dumps(older), task))
        await mem.forget_messages(chat_id="c", message_ids=["g1"])  # found by the props' list
        [(_, props)] = await store_sql(mem, TASK_PROPS)
        assert "message_ids" not in json.loads(props)
        assert await store_sql(mem, FOLLOWED) == [(task, "g0")]
        await _garden_talk(mem, 1, first=2)
        assert await store_sql(mem, FOLLOWED) == [(task, "g0"), (task, "g2")]


async def test_a_task_purged_whole_and_made_again_follows_none_of_the_old_ones(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _garden_talk(mem, 2)
        ask = {"user_id": "ann", "chat_id": "c"}
        await mem.call_tool(
            "memory_purge",
            {**ask, "filters": {"subject": "Task_auto_1"}, "whole_tasks": True, "mode": "soft"},
        )
        await mem.call_tool("task_create", {**ask, "task_id": "Task_auto_1", "description": "again"})
        assert await store_sql(mem, FOLLOWED) == []


async def test_the_rows_travel_in_an_export_and_an_import_checks_their_scope(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=AUTO_TASKS) as mem:
        await _garden_talk(mem, 3)
        followed = await store_sql(mem, FOLLOWED)
        await export_store(mem, tmp_path / "all.jsonl")
    lines = (tmp_path / "all.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if '"section": "graph.task_messages"' in line]
    assert [(r["task_id"], r["message_id"]) for r in rows] == followed
    async with open_memory(tmp_path / "copy", plugin=AUTO_TASKS) as copy:
        await import_jsonl(copy, tmp_path / "all.jsonl")
        assert await store_sql(copy, FOLLOWED) == followed
    moved = [
        line.replace('"user_id": "ann"', '"user_id": "bob"')
        if '"section": "graph.task_messages"' in line
        else line
        for line in lines
    ]
    assert moved != lines
    (tmp_path / "moved.jsonl").write_text("\n".join(moved) + "\n", encoding="utf-8")
    async with open_memory(tmp_path / "other", plugin=AUTO_TASKS) as other:
        with pytest.raises(InputError) as refused:
            await import_jsonl(other, tmp_path / "moved.jsonl")
        assert await store_sql(other, "SELECT COUNT(*) FROM graph_nodes") == [(0,)]
    assert refused.value.field is not None and refused.value.field.startswith("graph.task_messages[0]")


async def test_a_store_from_before_the_table_opens_read_only_and_exports(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder, plugin=AUTO_TASKS) as mem:
        await _garden_talk(mem, 2)
        if not on_sqlite(mem):
            pytest.skip("a SQLite file stands for a store from before the table")
    with closing(sqlite3.connect(folder / "narrmem.sqlite3")) as db:
        db.execute("DROP TABLE graph_task_messages")
        db.commit()
    async with open_memory(folder, plugin=AUTO_TASKS, read_only=True) as reader:
        counts = await export_store(reader, tmp_path / "read.jsonl")
    assert counts["graph.nodes"] and "graph.task_messages" not in counts
    async with open_memory(folder, plugin=AUTO_TASKS) as writer:  # the next writable open makes it
        await _garden_talk(writer, 1, first=2)
        assert [mid for _, mid in await store_sql(writer, FOLLOWED)] == ["g2"]
