"""A deleted message and the vector index's files: the deletion no longer rewrites the index (a
save rewrites every bucket written since the last, so each deleted Discord message rewrote
nearly the whole index while holding every vector write back); the files lose the vector at the
purge that deleted messages' words wait for, at close, or at the next open after a crash."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, sql
from reliability.common import all_vectors, folder_files, occurrences, vector_windows

from narrmem.models import Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only("the SQLite store's vector index files")

LATER = {"storage": {"purge_deleted_messages_after_s": 3600}}


def said(n: int) -> dict[str, Any]:
    return msg(f"m{n}", f"I adopted greyhound number {n} named Pixel{n}", user=f"u{n}", chat=f"c{n}")


def stored_vectors(folder: Path, ids: list[int]) -> dict[int, bytes]:
    marks = ",".join("?" * len(ids))
    return {
        int(i): bytes(v)
        for i, v in sql(folder, f"SELECT id, vector FROM memories WHERE id IN ({marks})", ids)
    }


def found_in_files(folder: Path, vector: bytes) -> set[str]:
    windows = vector_windows(vector, [v for v in all_vectors(folder) if v != vector])
    assert windows, "the deleted vector is not distinctive"
    files = {name: data for name, data in folder_files(folder).items() if name.startswith("vectors")}
    return {name for window in windows for name in occurrences(files, window)}


async def test_deleted_messages_leave_the_index_files_at_the_purge_not_one_save_each(tmp_path: Path) -> None:
    async with open_memory(tmp_path, **LATER) as memory:
        written = await memory.ingest_many([said(n) for n in range(30)])
    async with open_memory(tmp_path, **LATER) as memory:  # the files hold the first thirty
        more = await memory.ingest_many([said(n) for n in range(30, 60)])
        gone = [r.memory_ids[0] for r in [*written[:3], *more[:3]]]
        vectors = stored_vectors(tmp_path, gone)
        saves: list[int] = []
        save = memory.store.index.save

        async def counted(*args: Any, **kwargs: Any) -> None:
            saves.append(1)
            await save(*args, **kwargs)

        memory.store.index.save = counted  # type: ignore[method-assign]
        for n in [0, 1, 2, 30, 31, 32]:
            await memory.forget_messages(chat_id=f"c{n}", message_ids=[f"m{n}"])
        assert saves == []  # six deletions, no rewrite of the index
        assert all(found_in_files(tmp_path, vectors[i]) for i in gone[:3])  # saved before
        await memory.store.purge_deleted()
        assert saves == [1]
        for i in gone:
            assert found_in_files(tmp_path, vectors[i]) == set(), i
        # The index answers as SQLite does: the deleted are not found, the rest are.
        assert await memory.recall("greyhound Pixel0", user_id="u0") == []
        assert [h.text for h in await memory.recall("greyhound Pixel5", user_id="u5")][:1] == [
            said(5)["text"]
        ]


async def test_a_close_takes_the_deleted_vectors_out_of_the_files(tmp_path: Path) -> None:
    async with open_memory(tmp_path, **LATER) as memory:
        [first] = await memory.ingest_many([said(0)])
        await memory.ingest_many([said(1)])
    [vector] = stored_vectors(tmp_path, first.memory_ids[:1]).values()
    assert found_in_files(tmp_path, vector)
    async with open_memory(tmp_path, **LATER) as memory:
        await memory.forget_messages(chat_id="c0", message_ids=["m0"])
    assert found_in_files(tmp_path, vector) == set()


async def test_a_delete_made_outside_a_forget_leaves_the_files_within_the_purge_delay(tmp_path: Path) -> None:
    """A plugin's own delete (a tool that forgets one memory) schedules no purge of the memory:
    the store's own save still takes the vector out of the files, that long after the delete."""
    soon = {"storage": {"purge_deleted_messages_after_s": 0.2}}
    async with open_memory(tmp_path, **soon) as memory:
        [first] = await memory.ingest_many([said(0)])
        await memory.ingest_many([said(1)])
    [vector] = stored_vectors(tmp_path, first.memory_ids[:1]).values()
    async with open_memory(tmp_path, **soon) as memory:
        assert found_in_files(tmp_path, vector)
        await memory.store.delete(first.memory_ids[:1], Scope(user_id="u0"))
        for _ in range(50):
            await asyncio.sleep(0.1)
            if not found_in_files(tmp_path, vector):
                break
        assert found_in_files(tmp_path, vector) == set()
