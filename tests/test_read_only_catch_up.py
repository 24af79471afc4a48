"""A store open read-only beside the writer (``narrmem serve --read-only``, ``narrmem mcp
--read-only``) keeps its vector index in step: the rows written since are added before a search,
and after a forget or an edit the index is built again aside and swapped in whole. A row committed
while it is built is held once (it was added a second time by the next catch-up), and a search
meanwhile reads the index it had (it read a half-built one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import msg
from narrmem_plugins.storage_sqlite import store as sqlite_store

from narrmem.models import Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only("the read-only open of a data folder")
SCOPE = Scope(user_id="u")


async def _ids(store: Any, query: np.ndarray) -> list[int]:
    return [memory_id for memory_id, _ in await store.search_vectors(SCOPE, query, 100)]


async def test_rows_written_meanwhile_are_held_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "REBUILD_READ_ONLY_S", 0.0)
    async with open_memory(tmp_path / "m") as writer:
        await writer.ingest_many(
            [msg(f"m{i}", f"note {i} about cats and topic {i % 5}", user="u") for i in range(30)]
        )
        async with open_memory(tmp_path / "m", read_only=True) as reader:
            store = reader.store
            query = np.asarray((await reader.embedder.embed(["cats"]))[0], dtype=np.float32)
            first = await _ids(store, query)
            assert len(first) == 30
            # A forget (the next search builds the index again) and, while it is built, a new row.
            await writer.forget_memories([first[0]], user_id="u")
            build = store._rebuild_index

            async def build_while_the_writer_writes(**options: Any) -> None:
                await writer.ingest(msg("late", "a late note about cats", user="u"))
                await build(**options)

            monkeypatch.setattr(store, "_rebuild_index", build_while_the_writer_writes)
            await _ids(store, query)
            monkeypatch.setattr(store, "_rebuild_index", build)
            again = await _ids(store, query)
            assert len(again) == len(set(again)) == 30  # 29 left and the late one, each once
            assert first[0] not in again


async def test_a_search_during_a_rebuild_reads_the_index_it_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "REBUILD_READ_ONLY_S", 0.0)
    async with open_memory(tmp_path / "m") as writer:
        await writer.ingest_many([msg(f"m{i}", f"note {i} about cats", user="u") for i in range(20)])
        async with open_memory(tmp_path / "m", read_only=True) as reader:
            store = reader.store
            query = np.asarray((await reader.embedder.embed(["cats"]))[0], dtype=np.float32)
            first = await _ids(store, query)
            await writer.forget_memories([first[0]], user_id="u")
            building, go_on = asyncio.Event(), asyncio.Event()
            build = store._rebuild_index

            async def slow_build(**options: Any) -> None:
                building.set()
                await go_on.wait()
                await build(**options)

            monkeypatch.setattr(store, "_rebuild_index", slow_build)
            rebuilding = asyncio.create_task(_ids(store, query))
            await building.wait()
            meanwhile = await store.index.search(query, 100, tenant="default", user_id="u", chat_id=None)
            assert len(meanwhile) == 20  # the index it had, not an empty one being filled
            go_on.set()
            assert len(await rebuilding) == 19
