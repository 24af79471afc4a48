"""Files in the data folder that narrmem cannot prove are its own are refused, never deleted,
rewritten or migrated: a keyword folder, a FAISS file, another program's database, a folder
whose manifest only looks like narrmem's."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from _helpers import msg, run_narrmem

import narrmem
from narrmem.testing import open_memory


def snapshot(folder: Path) -> dict[str, tuple[Any, ...]]:
    """Every file's bytes, modification time and inode under ``folder``."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_ino)
        else:
            out[str(path)] = ("folder",)
    return out


async def refused(folder: Path, named: Path, **overrides: Any) -> None:
    with pytest.raises(narrmem.StoreError) as raised:
        async with open_memory(folder, **overrides) as mem:
            await mem.ingest(msg("1", "I love hiking in the Alps every summer"))
    assert str(named) in str(raised.value)


@pytest.mark.sqlite_only("the tantivy keyword folder is the SQLite store's")
async def test_a_keywords_folder_of_the_users_is_refused_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    (folder / "keywords").mkdir(parents=True)
    (folder / "keywords" / "meta.json").write_text('{"project": "my seo keywords", "version": 3}\n')
    (folder / "keywords" / "list.txt").write_text("running shoes\n")
    (folder / "keywords.retired-2023").mkdir()
    (folder / "keywords.retired-2023" / "old.txt").write_text("old list\n")
    before = snapshot(folder)
    await refused(folder, folder / "keywords")  # keyword_index = "auto", the default
    after = snapshot(folder)
    assert {p: v for p, v in after.items() if p in before} == before


@pytest.mark.sqlite_only("the vector index file is the SQLite store's")
async def test_a_faiss_file_the_database_does_not_record_is_refused_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    theirs = folder / "products.faiss"
    index = faiss.IndexIDMap2(faiss.IndexFlatL2(8))
    index.add_with_ids(np.random.rand(5, 8).astype("float32"), np.arange(5))
    faiss.write_index(index, str(theirs))
    before = snapshot(folder)
    await refused(folder, theirs, storage={"index": "products.faiss"})
    assert snapshot(folder) == before


@pytest.mark.sqlite_only("the database file is the SQLite store's")
async def test_another_programs_database_is_refused_and_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    theirs = folder / "narrmem.sqlite3"
    with closing(sqlite3.connect(theirs)) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
        db.executemany("INSERT INTO invoices (amount) VALUES (?)", [(i * 1.5,) for i in range(100)])
        db.commit()
    before = snapshot(folder)
    await refused(folder, theirs)
    assert snapshot(folder) == before


@pytest.mark.sqlite_only("the database file is the SQLite store's")
def test_the_cli_exits_2_on_another_programs_database(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    with closing(sqlite3.connect(folder / "app.db")) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
        db.commit()
    (tmp_path / "c.toml").write_text('[storage]\ndatabase = "app.db"\n')
    line = {"text": "I love hiking", "user_id": "u1", "chat_id": "c1", "ts": "2026-01-01T10:00:00+00:00"}
    line["message_id"] = "1"
    (tmp_path / "m.jsonl").write_text(json.dumps(line) + "\n")
    before = snapshot(folder)
    ran = run_narrmem(
        "ingest",
        str(tmp_path / "m.jsonl"),
        "--data",
        str(folder),
        "--config",
        str(tmp_path / "c.toml"),
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert ran.returncode == 2, ran.stderr
    assert str(folder / "app.db") in ran.stderr
    assert snapshot(folder) == before
    with closing(sqlite3.connect(folder / "app.db")) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert tables == ["invoices"]


@pytest.mark.sqlite_only("the vector index folder is the SQLite store's")
async def test_an_unmarked_folder_with_a_lookalike_manifest_is_refused_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    theirs = folder / "vectors"
    theirs.mkdir(parents=True)
    (theirs / "manifest.json").write_text(json.dumps({"format": 1, "dataset": "my embeddings"}) + "\n")
    np.save(theirs / "vectors-00.npy", np.random.rand(4, 3).astype("float32"))
    np.save(theirs / "ids-00.npy", np.arange(4))
    before = snapshot(folder)
    await refused(folder, theirs)
    assert snapshot(folder) == before


@pytest.mark.sqlite_only("the vector index folder is the SQLite store's")
async def test_a_refused_index_folder_leaves_no_database_behind(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    (folder / "vectors").mkdir(parents=True)
    (folder / "vectors" / "vectors-00.npy").write_text("mine\n")
    before = snapshot(folder)
    await refused(folder, folder / "vectors")
    assert snapshot(folder) == before


@pytest.mark.sqlite_only("SQLite's side files")
@pytest.mark.parametrize("suffix", ["-wal", "-journal", "-shm"])
async def test_a_users_file_named_as_a_new_databases_side_file_is_kept(tmp_path: Path, suffix: str) -> None:
    """SQLite takes a -wal or -journal beside a database as its own: opening a new store deleted a
    user's files of those names."""
    folder = tmp_path / "store"
    folder.mkdir()
    theirs = folder / f"narrmem.sqlite3{suffix}"
    theirs.write_text("my notes, not a journal\n", encoding="utf-8")
    before = snapshot(folder)
    await refused(folder, theirs)
    assert snapshot(folder) == before
    # A store of its own beside them opens.
    async with open_memory(folder, storage={"database": "memory.sqlite3"}) as mem:
        await mem.ingest(msg("1", "I love hiking in the Alps every summer"))
    assert theirs.read_text(encoding="utf-8") == "my notes, not a journal\n"
