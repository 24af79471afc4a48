"""A store whose schema a newer narrmem wrote (a rollback after an upgrade, a worker not yet
upgraded): this narrmem opens it neither for writing nor for reading, and says to run the newer
one, not to "open it once for writing to migrate it", which fails the same way."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import asyncpg
import pytest
from _helpers import msg
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.schema import SCHEMA_VERSION as POSTGRES_SCHEMA
from narrmem_plugins.storage_sqlite.schema import SCHEMA_VERSION as SQLITE_SCHEMA

from narrmem import StoreError
from narrmem.testing import open_memory


async def _refused(folder: Path, **storage: object) -> list[str]:
    said = []
    for read_only in (False, True):
        with pytest.raises(StoreError) as refused:
            async with open_memory(folder, read_only=read_only, **storage):
                pass
        said.append(str(refused.value))
    return said


async def test_a_sqlite_store_of_a_newer_narrmem_is_refused_naming_the_newer(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    storage = {"storage": {"backend": "sqlite"}}
    async with open_memory(folder, **storage) as memory:
        await memory.ingest(msg("1", "My greyhound Pixel loves the beach", user="bob"))
    with closing(sqlite3.connect(folder / "narrmem.sqlite3")) as db:
        db.execute(f"PRAGMA user_version = {SQLITE_SCHEMA + 1}")
        db.commit()
    writing, reading = await _refused(folder, **storage)
    assert "newer than this narrmem" in writing and "upgrade narrmem" in writing
    assert "written by a newer narrmem" in reading and "migrate" not in reading
    with closing(sqlite3.connect(folder / "narrmem.sqlite3")) as db:
        assert db.execute("SELECT COUNT(*) FROM memories").fetchone() == (1,)


async def test_a_postgres_store_of_a_newer_narrmem_is_refused_naming_the_newer(tmp_path: Path) -> None:
    dsn = await fresh_database("newer_schema")
    storage = {"storage": {"backend": "postgres", "dsn": dsn}}
    async with open_memory(tmp_path / "m", **storage) as memory:
        await memory.ingest(msg("1", "My greyhound Pixel loves the beach", user="bob"))
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO narrmem_schema (version) VALUES ($1)", POSTGRES_SCHEMA + 1)
    finally:
        await conn.close()
    writing, reading = await _refused(tmp_path / "m", **storage)
    assert "newer than this narrmem" in writing and "upgrade narrmem" in writing
    assert "written by a newer narrmem" in reading and "migrate" not in reading
