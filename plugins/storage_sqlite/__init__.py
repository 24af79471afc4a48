"""The default store: SQLite (WAL) as the source of truth plus a vector index sharded by user
(exact search for small users, HNSW for large ones) in the data folder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narrmem_plugins.storage_sqlite.store import SQLiteStore
from narrmem_plugins.storage_sqlite.vector_index import IndexOptions

from narrmem import hookimpl
from narrmem.view import MemoryView

__all__ = ["SQLiteStore"]


@hookimpl
def narrmem_register_stores(register: Callable[[str, Callable[[Any], Any]], None]) -> None:
    def factory(memory: MemoryView) -> SQLiteStore:
        storage = memory.settings.storage
        return SQLiteStore(
            memory.data_dir,
            database=storage.database,
            index=storage.index,
            busy_timeout_ms=storage.busy_timeout_ms,
            index_options=IndexOptions.from_settings(storage),
            read_only=memory.read_only,
            clock=memory.clock,
            keyword_index=storage.keyword_index,
            keyword_threshold=storage.keyword_threshold,
            rewrite_on_forget=storage.forget_rewrites_file,
            history_kept=storage.history_kept_per_memory,
            deleted_vectors_kept_s=storage.purge_deleted_messages_after_s,
        )

    register("sqlite", factory)
