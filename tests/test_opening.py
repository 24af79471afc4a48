"""``Memory.open`` loads the model while the store opens, and a failed open still waits for the
model before closing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from narrmem import StoreError, hookimpl
from narrmem.config import Settings
from narrmem.testing import HashEmbedder, open_memory

pytestmark = pytest.mark.sqlite_only


class LoadWatcher(HashEmbedder):
    """An embedder whose load lasts until the store's database file exists (or 5 s pass), so it
    can tell whether the store opened while the model was loading."""

    def __init__(self, folder: Path, polls: int = 500) -> None:
        self.folder = folder
        self.polls = polls
        self.saw_the_store_open = False
        self.loaded = False
        self.closed = False

    async def start(self) -> None:
        for _ in range(self.polls):
            if (self.folder / "narrmem.sqlite3").exists():
                self.saw_the_store_open = True
                break
            await asyncio.sleep(0.01)
        self.loaded = True

    async def close(self) -> None:
        self.closed = True


class WatcherPlugin:
    narrmem_name = "load_watcher"

    def __init__(self, embedder: LoadWatcher) -> None:
        self.embedder = embedder

    @hookimpl
    def narrmem_register_embedders(self, register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
        register("watched", lambda settings: self.embedder)


async def test_the_model_loads_while_the_store_opens(tmp_path: Path) -> None:
    watcher = LoadWatcher(tmp_path / "m")
    plugin = WatcherPlugin(watcher)
    async with open_memory(tmp_path / "m", plugins=[plugin], embedder={"backend": "watched"}) as memory:
        assert watcher.loaded and watcher.saw_the_store_open
        assert (await memory.stats())["memories"] == 0
    assert watcher.closed


async def test_a_store_that_fails_to_open_waits_for_the_model_then_closes(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "narrmem.sqlite3").write_bytes(b"not a database, " * 512)
    watcher = LoadWatcher(folder, polls=20)
    plugin = WatcherPlugin(watcher)
    with pytest.raises(StoreError, match="cannot be opened as a narrmem store"):
        await open_memory(folder, plugins=[plugin], embedder={"backend": "watched"})
    assert watcher.loaded and watcher.closed


async def test_a_data_folder_that_cannot_be_made_fails_before_the_model_loads(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    watcher = LoadWatcher(blocked, polls=20)
    plugin = WatcherPlugin(watcher)
    with pytest.raises(StoreError, match="cannot create it"):
        await open_memory(blocked, plugins=[plugin], embedder={"backend": "watched"})
    assert not watcher.loaded and watcher.closed
