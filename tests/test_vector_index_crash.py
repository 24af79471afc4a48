"""A process killed at any step of a save of the SQLite store's vector index (before each file it
writes, before and after the manifest, in its clean-up) leaves files that open right: the previous
save whole, caught up from SQLite, or the new one. Every stored memory's own vector then finds it
first in its user's search, a deleted memory is found by none, and no file of the unfinished save
stays in the folder.

The save killed is a delete's: it rewrites the bucket of two users (one of them has new rows that
come before the other's in the files, so the other's rows move) and saves a rebuilt graph of a
third user in another bucket."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from narrmem_plugins.storage_sqlite import index_folder, index_manifest
from narrmem_plugins.storage_sqlite.vector_index import Consistency, IndexOptions, Owner, VectorIndex, _bucket

from narrmem import ManualClock, Message, Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only("kills a process in a save of the SQLite store's index files")

NOW = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
SETTINGS: dict[str, Any] = {"storage": {"hnsw_threshold": 40, "hnsw_rebuild_ratio": 0.2}}
OTHER_USERS = 60  # rows enough that the 64 rows an open compares with SQLite are a sample
ROWS_EACH = 25
GRAPH_ROWS = 60  # past the threshold: its user has a graph

# Opens the store, deletes rows of the graph's user (a save of its own, not killed) and waits for
# the graph to be rebuilt without them, writes new rows for the first user of the shared bucket,
# then deletes rows of the second one: that save is killed at the point given, counted over each
# file the save writes (killed before it is written), the first file its clean-up deletes (killed
# before and after). A process that reaches no such point prints "saved".
KILLED_SAVE = """
import asyncio, json, os, signal, sys
from datetime import datetime
from pathlib import Path
from narrmem_plugins.storage_sqlite import vector_index
from narrmem import ManualClock, Message, Scope
from narrmem.testing import open_memory

plan = json.loads(sys.argv[1])
points = iter(range(10_000))

def point():
    if next(points) == plan["kill_at"]:
        os.kill(os.getpid(), signal.SIGKILL)

write = vector_index._atomic
def counted_write(target, how, **options):
    point()
    write(target, how, **options)

unlink = Path.unlink
deleted = []
def counted_unlink(self, *args, **kwargs):
    first = self.parent.name == "vectors" and not deleted
    if first:
        point()
    unlink(self, *args, **kwargs)
    if first:
        deleted.append(self)
        point()

async def main():
    clock = ManualClock(datetime.fromisoformat(plan["now"]))
    memory = await open_memory(plan["folder"], clock=clock, **plan["settings"])
    store = memory.store
    await store.delete(plan["graph_deletes"], Scope(user_id=plan["graph_user"]))
    await store.index.settle()
    await memory.ingest_many([Message.model_validate(m) for m in plan["new_messages"]])
    vector_index._atomic = counted_write
    Path.unlink = counted_unlink
    await store.delete(plan["deletes"], Scope(user_id=plan["moved_user"]))
    await memory.close()
    print("saved")

asyncio.run(main())
"""


def two_users_of_one_bucket() -> tuple[str, str]:
    seen: dict[int, str] = {}
    for i in range(1000):
        name = f"user{i:03d}"
        bucket = _bucket(("default", name))
        if bucket in seen:
            return seen[bucket], name
        seen[bucket] = name
    raise AssertionError("no two users share a bucket")


def messages(user: str, count: int, start: int = 0) -> list[Message]:
    return [
        Message(
            text=f"{user} wrote note number {j} about the {['garden', 'trip', 'job', 'band'][j % 4]}",
            user_id=user,
            chat_id=f"chat-{user}",
            message_id=f"{user}-{j}",
            speaker=user,
            ts=NOW - timedelta(hours=2) + timedelta(seconds=j),
        )
        for j in range(start, start + count)
    ]


def stored_rows(folder: Path) -> dict[int, tuple[str, np.ndarray]]:
    """Each memory's owner and vector, read from SQLite's file."""
    with sqlite3.connect(f"file:{folder / 'narrmem.sqlite3'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT id, user_id, vector FROM memories WHERE vector IS NOT NULL").fetchall()
    return {int(i): (user, np.frombuffer(blob, dtype=np.float32)) for i, user, blob in rows}


def files_named_by_manifest(index: Path) -> set[str]:
    listed = index_manifest.listing(json.loads((index / "manifest.json").read_text()))
    files = (name for b in listed.buckets for name in (b.ids_file, b.vectors_file, *b.graphs.values()))
    return {"manifest.json", *files}


async def base_store(folder: Path, users: list[str], graph_user: str) -> None:
    async with open_memory(folder, clock=ManualClock(NOW), **SETTINGS) as memory:
        for user in users:
            await memory.ingest_many(messages(user, ROWS_EACH))
        await memory.ingest_many(messages(graph_user, GRAPH_ROWS))
        await memory.store.index.settle()
        assert memory.store.index.describe()["hnsw_shards"] == 1


def kill_save(folder: Path, plan: dict[str, Any], kill_at: int) -> bool:
    """Run the save of ``plan`` in a process killed at point ``kill_at``; whether it was killed."""
    plan = {**plan, "folder": str(folder), "kill_at": kill_at}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, json.dumps(plan)], capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        assert done.stdout.strip() == "saved"
        return False
    assert done.returncode < 0, done.stderr[-2000:]
    return True


async def check_reopened(folder: Path, before: dict[int, tuple[str, np.ndarray]], kill_at: int) -> None:
    rows = stored_rows(folder)
    async with open_memory(folder, clock=ManualClock(NOW), **SETTINGS) as memory:
        store = memory.store
        assert sorted(int(i) for i in store.index.ids()) == sorted(rows), kill_at
        misplaced = []
        for memory_id, (user, vector) in rows.items():
            found = await store.search_vectors(Scope(user_id=user), vector, 3)
            if not found or found[0][0] != memory_id or found[0][1] < 0.999:
                misplaced.append((memory_id, user, found[:2]))
        assert not misplaced, f"killed at point {kill_at}: {misplaced[:5]}"
        for memory_id, (user, vector) in before.items():
            if memory_id not in rows:
                found = await store.search_vectors(Scope(user_id=user), vector, 5)
                assert memory_id not in [i for i, _ in found], kill_at
        index = folder / "vectors"
        named = files_named_by_manifest(index)
        left = [p.name for p in index.iterdir() if index_folder.is_own_file(p.name) and p.name not in named]
        assert not left, f"killed at point {kill_at}: {left}"


async def test_a_save_killed_at_any_point_leaves_an_index_that_opens_right(tmp_path: Path) -> None:
    first, moved = two_users_of_one_bucket()
    graph_user = next(
        f"heavy{i}" for i in range(100) if _bucket(("default", f"heavy{i}")) != _bucket(("default", first))
    )
    others = [f"other{i:02d}" for i in range(OTHER_USERS)]
    base = tmp_path / "base"
    half = OTHER_USERS // 2
    await base_store(base, [*others[:half], first, moved, *others[half:]], graph_user)
    before = stored_rows(base)
    graph_ids = sorted(i for i, (user, _) in before.items() if user == graph_user)
    moved_ids = sorted(i for i, (user, _) in before.items() if user == moved)
    plan = {
        "now": NOW.isoformat(),
        "settings": SETTINGS,
        "graph_user": graph_user,
        "graph_deletes": graph_ids[:20],
        "new_messages": [m.model_dump(mode="json") for m in messages(first, 3, start=100)],
        "moved_user": moved,
        "deletes": moved_ids[3:6],
    }
    killed_at = []
    for kill_at in range(40):
        folder = tmp_path / f"killed-{kill_at}"
        shutil.copytree(base, folder)
        killed = kill_save(folder, plan, kill_at)
        await check_reopened(folder, before, kill_at)
        if not killed:
            break
        killed_at.append(kill_at)
    # Before each of the two buckets' two files, the graph's and the manifest; before and after
    # the clean-up's first deletion.
    assert len(killed_at) >= 7, killed_at


async def test_files_saved_before_generations_open_as_they_are_and_the_next_save_replaces_them(
    tmp_path: Path,
) -> None:
    """A manifest that names no generation (files of plain names) opens without a rebuild; the
    next save writes what changed under generation 1 and deletes the plain files it replaced."""
    dim, options = 8, IndexOptions(hnsw_threshold=30, hnsw_m=8, ef_construction=32, ef_search=32)
    vectors = np.random.default_rng(5).standard_normal((61, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, 61, dtype=np.int64)
    path = tmp_path / "index"
    index = VectorIndex(path, dim, options)
    await index.add(ids[:40], vectors[:40], [Owner("t", "big", "dm")] * 40)
    await index.add(ids[40:], vectors[40:60], [Owner("t", "small", "dm")] * 20)
    await index.settle()
    await index.save()
    await index.close()
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest.pop("generation") == 1
    for bucket in manifest["buckets"]:
        for field, name in [("ids", bucket["ids"]), ("vectors", bucket["vectors"])]:
            bucket[field] = name.replace(".gen1", "")
            (path / name).rename(path / bucket[field])
        for place, name in bucket["graphs"].items():
            bucket["graphs"][place] = name.replace(".gen1", "")
            (path / name).rename(path / bucket["graphs"][place])
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert list(path.glob("graph-*.faiss")) and not list(path.glob("*.gen*"))

    index = VectorIndex(path, dim, options)
    samples = {1: (vectors[0], ("t", "big")), 50: (vectors[49], ("t", "small"))}
    assert await index.load(Consistency.known(ids, samples)), index.rebuilt_reason
    try:
        for memory_id, user in [(1, "big"), (39, "big"), (41, "small"), (60, "small")]:
            found = await index.search(vectors[memory_id - 1], 1, tenant="t", user_id=user, chat_id=None)
            assert found[0][0] == memory_id
        await index.add(np.array([61]), vectors[60:], [Owner("t", "small", "dm")])
        await index.save()
    finally:
        await index.close()
    small = _bucket(("t", "small"))
    assert not (path / f"ids-{small:02d}.npy").exists()
    assert (path / f"ids-{small:02d}.gen1.npy").exists()
    assert json.loads((path / "manifest.json").read_text())["generation"] == 1
    own = {p.name for p in path.iterdir() if index_folder.is_own_file(p.name)}
    assert own == files_named_by_manifest(path)
