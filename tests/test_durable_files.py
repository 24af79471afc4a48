"""A power loss, unlike a killed process, can leave a renamed file without its data. The vector
index's files are on disk before the manifest that makes them live, the manifest before the
files it replaces are deleted, and the keyword index's state after its data."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from _helpers import msg
from narrmem_plugins.storage_sqlite import durable
from narrmem_plugins.storage_sqlite.vector_index import VectorIndex
from test_vector_index import DIM, SMALL, clustered, owners

from narrmem.testing import open_memory


class DiskLog:
    """Records, in order, every file and folder flushed to disk and every rename, by path."""

    def __init__(self, monkeypatch: Any) -> None:
        self.events: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}
        real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

        def opened(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            fd = real_open(path, flags, *args, **kwargs)
            self._paths[fd] = os.path.realpath(path)
            return fd

        def fsync(fd: int) -> None:
            real_fsync(fd)
            self.events.append(("sync", self._paths.get(fd, "?")))

        def replace(src: Any, dst: Any) -> None:
            real_replace(src, dst)
            self.events.append(("rename", os.path.realpath(dst)))

        monkeypatch.setattr(durable.os, "open", opened)
        monkeypatch.setattr(durable.os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def first(self, event: tuple[str, str]) -> int:
        return self.events.index(event)

    def last(self, event: tuple[str, str]) -> int:
        return len(self.events) - 1 - self.events[::-1].index(event)


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _json(path: str) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


async def test_index_files_are_on_disk_before_the_manifest_names_them(
    tmp_path: Path, monkeypatch: Any
) -> None:
    folder = tmp_path / "vectors"
    index = VectorIndex(folder, DIM, SMALL)
    try:
        n = 600  # past the graph threshold: a graph file too
        await index.add(np.arange(1, n + 1, dtype=np.int64), clustered(n, seed=1), owners("big", n))
        await index.settle()
        disk = DiskLog(monkeypatch)
        await index.save({"changes": n, "last_id": n})
        manifest_path = _real(folder / "manifest.json")
        manifest = _json(manifest_path)
        named = {
            name
            for bucket in manifest["buckets"]
            for name in (bucket["ids"], bucket["vectors"], *bucket["graphs"].values())
        }
        assert any(name.endswith(".faiss") or "graph" in name for name in named), named
        made_live = disk.first(("rename", manifest_path))
        for name in named:
            path = _real(folder / name)
            assert disk.first(("sync", path)) < made_live, name
        # The manifest's own data, then its name, on disk.
        partial = [p for kind, p in disk.events[:made_live] if kind == "sync" and "manifest" in p]
        assert partial, disk.events
        assert disk.last(("sync", _real(folder))) > made_live
    finally:
        await index.close()


async def test_the_keyword_state_is_on_disk_before_its_rename(tmp_path: Path, monkeypatch: Any) -> None:
    disk = DiskLog(monkeypatch)
    async with open_memory(tmp_path / "m", storage={"keyword_index": "tantivy"}) as memory:
        await memory.ingest(msg("m1", "I keep bees on the roof of my flat in Leeds, since the spring"))
    states = [p for kind, p in disk.events if kind == "rename" and p.endswith("narrmem-keywords.json")]
    assert states, disk.events
    for state in states:
        renamed = disk.first(("rename", state))
        before = [p for kind, p in disk.events[:renamed] if kind == "sync" and "narrmem-keywords.json" in p]
        assert before, disk.events
