"""The shared store: PostgreSQL + pgvector, for several bot workers on one memory
(``[storage] backend = "postgres"`` and ``[storage] dsn``; install ``narrmem[postgres]``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narrmem import hookimpl
from narrmem.errors import ConfigError
from narrmem.store import Store
from narrmem.view import MemoryView


@hookimpl
def narrmem_register_stores(register: Callable[[str, Callable[[Any], Any]], None]) -> None:
    def factory(memory: MemoryView) -> Store:
        storage = memory.settings.storage
        if storage.dsn is None:
            raise ConfigError(
                "storage.dsn: the postgres backend needs the server to use "
                "(postgresql://user:password@host/database, or NARRMEM_STORAGE__DSN)"
            )
        try:
            # Imported only when chosen: asyncpg and pgvector are the optional narrmem[postgres] extra.
            from narrmem_plugins.storage_postgres.store import PostgresStore
        except ImportError as exc:
            raise ConfigError(
                "storage.backend: 'postgres' needs asyncpg and pgvector "
                f"(pip install 'narrmem[postgres]'): {exc}"
            ) from exc
        return PostgresStore(
            storage.dsn.get_secret_value(),
            hnsw_m=storage.hnsw_m,
            hnsw_ef_construction=storage.hnsw_ef_construction,
            hnsw_ef_search=storage.hnsw_ef_search,
            read_only=memory.read_only,
            clock=memory.clock,
            timeout_s=storage.timeout_s,
            history_kept=storage.history_kept_per_memory,
        )

    register("postgres", factory)


@hookimpl
def narrmem_forgotten_elsewhere(memory: MemoryView) -> None:
    """Another worker forgot: the query terms cached here are what people asked, in their words."""
    forget_terms = getattr(memory.store, "forget_cached_terms", None)
    if forget_terms is not None:
        forget_terms()
