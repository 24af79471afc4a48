"""The graph's tables carry a version: a worker of an older narrmem refuses tables a newer one made
(several workers are upgraded one at a time), rather than writing them as it knows them; a store
made before the version was kept is taken for version 1 and noted so."""

from __future__ import annotations

from pathlib import Path

import pytest
from narrmem_plugins.graph.version import GRAPH_SCHEMA, KEY, NAMESPACE

from narrmem.errors import StoreError
from narrmem.testing import open_memory


async def test_a_store_notes_its_graph_version_and_an_older_narrmem_refuses_a_newer_one(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        assert await memory.store.state_get(NAMESPACE, KEY) == {"version": GRAPH_SCHEMA}
        # As a newer narrmem would leave it.
        await memory.store.state_put(NAMESPACE, KEY, {"version": GRAPH_SCHEMA + 1})
    for read_only in (False, True):
        with pytest.raises(StoreError, match="newer than this narrmem"):
            async with open_memory(folder, read_only=read_only):
                pass


async def test_a_store_made_before_the_version_was_kept_is_version_1(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        await memory.store.state_delete(NAMESPACE, KEY)
    async with open_memory(folder, read_only=True) as memory:
        assert await memory.store.state_get(NAMESPACE, KEY) is None  # reading writes nothing
    async with open_memory(folder) as memory:
        assert await memory.store.state_get(NAMESPACE, KEY) == {"version": 1}
        await memory.store.state_put(NAMESPACE, KEY, {"version": "two"})
    with pytest.raises(StoreError, match="not as narrmem writes it"):
        async with open_memory(folder):
            pass


async def test_a_store_made_before_the_version_was_kept_migrates_verified(tmp_path: Path) -> None:
    from narrmem.config import load_settings
    from narrmem.doors.migrate import migrate
    from narrmem.testing import HASH_EMBEDDER, TestingPlugin

    async with open_memory(tmp_path / "src") as memory:
        message = {"text": "I decided to quit my job at the bank", "user_id": "ann", "chat_id": "c1"}
        await memory.ingest({**message, "message_id": "m1", "ts": "2025-01-06T20:00:00+00:00"})
        await memory.store.state_delete(NAMESPACE, KEY)
    report = await migrate(
        str(tmp_path / "src"),
        str(tmp_path / "dst"),
        settings=load_settings(embedder={"backend": HASH_EMBEDDER}),
        plugins=[TestingPlugin()],
        load_entrypoints=False,
        queries=0,
        progress=False,
    )
    assert report["counts_match"] and report["verified"], report["counts"]
