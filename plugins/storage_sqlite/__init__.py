"""The default store: SQLite (WAL) as the source of truth plus a FAISS index in the data folder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narrmem_plugins.storage_sqlite.store import SQLiteStore

from narrmem import hookimpl

__all__ = ["SQLiteStore"]


@hookimpl
def narrmem_register_stores(register: Callable[[str, Callable[[Any], Any]], None]) -> None:
    def factory(memory: Any) -> SQLiteStore:
        storage = memory.settings.storage
        return SQLiteStore(
            memory.data_dir,
            database=storage.database,
            index=storage.index,
            busy_timeout_ms=storage.busy_timeout_ms,
        )

    register("sqlite", factory)
