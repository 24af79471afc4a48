"""A new PostgreSQL store is made in a schema of its own. narrmem's tables have plain names
(``meta``, ``memories``, ``plugin_state``, the graph's ``graph_nodes``) and a forget deletes from
them by name, so a schema that already holds another program's tables is refused, naming
``storage.dsn``, the tables, and the two statements that give narrmem a schema of its own.
Before, a database holding a table of one of those names failed the open with asyncpg's own
``DuplicateTableError`` (exit 1, "internal error"), and one with other tables took narrmem's
beside them, where a plugin's ``CREATE TABLE IF NOT EXISTS`` takes a table of its name that it
finds for its own."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from _helpers import msg
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.store import PostgresStore

from narrmem import ConfigError
from narrmem.testing import open_memory


async def _run(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _fetch(dsn: str, query: str) -> list[tuple[object, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(row) for row in await conn.fetch(query)]
    finally:
        await conn.close()


def _as_role(dsn: str, role: str) -> str:
    scheme, rest = dsn.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


def _storage(dsn: str) -> dict[str, object]:
    return {"backend": "postgres", "dsn": dsn}


@pytest.mark.parametrize("table", ["meta", "memories", "orders"])
async def test_a_schema_holding_another_programs_tables_is_refused(tmp_path: Path, table: str) -> None:
    dsn = await fresh_database("own_schema")
    await _run(
        dsn, f"CREATE TABLE {table} (id int, note text)", f"INSERT INTO {table} VALUES (1, 'the app''s own')"
    )
    with pytest.raises(ConfigError) as refused:
        async with open_memory(tmp_path / "m", storage=_storage(dsn)):
            pass
    said = str(refused.value)
    assert said.startswith("storage.dsn: schema 'public' of postgresql://")
    assert f"({table})" in said and "CREATE SCHEMA narrmem AUTHORIZATION postgres" in said
    # Nothing made, nothing touched.
    assert await _fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == [(table,)]
    assert await _fetch(dsn, f"SELECT id, note FROM {table}") == [(1, "the app's own")]


async def test_the_schema_of_its_own_that_the_error_names_works(tmp_path: Path) -> None:
    dsn = await fresh_database("own_schema")
    await _run(
        dsn,
        "CREATE TABLE meta (key text, value text)",
        "INSERT INTO meta VALUES ('model', 'the app''s own')",
        "CREATE EXTENSION IF NOT EXISTS vector",
        "DO $$ BEGIN CREATE ROLE narrmem_bot LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        "CREATE SCHEMA narrmem AUTHORIZATION narrmem_bot",
        "ALTER ROLE narrmem_bot SET search_path = narrmem, public",
    )
    bot = _as_role(dsn, "narrmem_bot")
    async with open_memory(tmp_path / "m", storage=_storage(bot)) as memory:
        await memory.ingest(msg("1", "I work as a nurse at the city hospital", user="ann"))
        await memory.ingest(msg("2", "My greyhound Pixel loves the beach", user="bob"))
        await memory.settle()
        assert [hit.text for hit in await memory.recall("greyhound", user_id="bob")]
        await memory.forget(user_id="ann")
        assert await memory.recall("nurse hospital", user_id="ann") == []
    tables = {
        str(name)
        for (name,) in await _fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'narrmem'")
    }
    assert {"meta", "memories", "plugin_state", "forget_jobs", "narrmem_schema", "graph_nodes"} <= tables
    assert await _fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == [("meta",)]
    assert await _fetch(dsn, "SELECT key, value FROM public.meta") == [("model", "the app's own")]


async def test_an_existing_store_opens_when_other_tables_come_beside_it(tmp_path: Path) -> None:
    dsn = await fresh_database("own_schema")
    async with open_memory(tmp_path / "m", storage=_storage(dsn)) as memory:
        await memory.ingest(msg("1", "My greyhound Pixel loves the beach", user="bob"))
    await _run(dsn, "CREATE TABLE orders (id int)")
    async with open_memory(tmp_path / "m", storage=_storage(dsn)) as memory:
        assert [hit.text for hit in await memory.recall("greyhound", user_id="bob")]


async def test_an_extensions_own_tables_do_not_count(tmp_path: Path) -> None:
    # As PostGIS keeps spatial_ref_sys in the schema it is created in.
    dsn = await fresh_database("own_schema")
    await _run(dsn, "CREATE EXTENSION IF NOT EXISTS vector", "CREATE TABLE reference_systems (id int)")
    await _run(dsn, "ALTER EXTENSION vector ADD TABLE reference_systems")
    async with open_memory(tmp_path / "m", storage=_storage(dsn)) as memory:
        await memory.ingest(msg("1", "My greyhound Pixel loves the beach", user="bob"))
        assert [hit.text for hit in await memory.recall("greyhound", user_id="bob")]


@pytest.mark.parametrize("schema", ['"MyApp"', '"my app"', "myapp"])
async def test_a_schema_of_any_name_is_checked(tmp_path: Path, schema: str) -> None:
    dsn = await fresh_database("own_schema")
    await _run(dsn, f"CREATE SCHEMA {schema}", f"CREATE TABLE {schema}.orders (id int)")
    await _run(dsn, f"ALTER DATABASE {_name(dsn)} SET search_path = {schema}, public")
    with pytest.raises(ConfigError, match=r"already holds tables narrmem did not make \(orders\)"):
        async with open_memory(tmp_path / "m", storage=_storage(dsn)):
            pass


async def test_a_search_path_naming_no_schema_that_exists_is_refused(tmp_path: Path) -> None:
    dsn = await fresh_database("own_schema")
    await _run(dsn, f"ALTER DATABASE {_name(dsn)} SET search_path = nowhere")
    with pytest.raises(ConfigError, match="has no schema to make the store in"):
        async with open_memory(tmp_path / "m", storage=_storage(dsn)):
            pass


async def test_the_model_recorded_is_read_from_narrmems_schema_alone(tmp_path: Path) -> None:
    # An application's public.meta, further along the search path, is not the store's record.
    dsn = await fresh_database("own_schema")
    await _run(
        dsn,
        "CREATE TABLE meta (key text, value text)",
        "INSERT INTO meta VALUES ('model', 'the app''s own'), ('dim', '3')",
        "CREATE SCHEMA narrmem",
        f"ALTER DATABASE {_name(dsn)} SET search_path = narrmem, public",
    )
    store = PostgresStore(dsn)
    assert await store.recorded_model() is None
    async with open_memory(tmp_path / "m", storage=_storage(dsn)) as memory:
        model = memory.embedder.name
    assert await store.recorded_model() == model


def _name(dsn: str) -> str:
    return dsn.partition("?")[0].rsplit("/", 1)[1]


async def test_pgvector_in_a_schema_of_its_own_on_the_search_path(tmp_path: Path) -> None:
    # As hosted databases often keep extensions: before, the pool's sessions failed to set up
    # (pgvector's codec looked in public: "unknown type: public.vector", a ValueError).
    dsn = await fresh_database("own_schema")
    await _run(
        dsn,
        "CREATE SCHEMA extensions",
        "CREATE EXTENSION vector WITH SCHEMA extensions",
        f"ALTER DATABASE {_name(dsn)} SET search_path = public, extensions",
    )
    async with open_memory(tmp_path / "m", storage=_storage(dsn)) as memory:
        await memory.ingest(msg("1", "My greyhound Pixel loves the beach", user="bob"))
        assert [hit.text for hit in await memory.recall("greyhound", user_id="bob")]
    async with open_memory(tmp_path / "r", storage=_storage(dsn), read_only=True) as reader:
        assert [hit.text for hit in await reader.recall("greyhound", user_id="bob")]


async def test_pgvector_off_the_search_path_is_refused_naming_its_schema(tmp_path: Path) -> None:
    dsn = await fresh_database("own_schema")
    await _run(dsn, "CREATE SCHEMA extensions", "CREATE EXTENSION vector WITH SCHEMA extensions")
    with pytest.raises(
        ConfigError, match=r"storage.dsn: pgvector is in schema 'extensions' of .*search_path"
    ):
        async with open_memory(tmp_path / "m", storage=_storage(dsn)):
            pass
    assert await _fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == []


async def test_a_pgvector_older_than_iterative_scans_is_named_with_what_to_do(tmp_path: Path) -> None:
    """pgvector before 0.8 has no iterative index scans, which the pool's sessions set: it is
    refused at open with a ConfigError naming ``storage.dsn``, the version and what to run. (The
    catalog says 0.7.4 here while the server's library is 0.8.5, which has the setting: the open
    before this check went on, where a real 0.7 fails every session's settings.)"""
    dsn = await fresh_database("old-pgvector")
    await _run(
        dsn,
        "CREATE EXTENSION vector",
        "UPDATE pg_extension SET extversion = '0.7.4' WHERE extname = 'vector'",
    )
    with pytest.raises(ConfigError) as refused:
        async with open_memory(tmp_path / "m", storage=_storage(dsn)):
            pass
    assert str(refused.value).startswith("storage.dsn: ")
    assert "pgvector 0.7.4" in str(refused.value) and "ALTER EXTENSION vector UPDATE" in str(refused.value)
    await _run(dsn, "UPDATE pg_extension SET extversion = '0.8.0' WHERE extname = 'vector'")
    async with open_memory(tmp_path / "m", storage=_storage(dsn)) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel"))


def test_pgvector_versions_read_as_numbers() -> None:
    from narrmem_plugins.storage_postgres.store import pgvector_too_old

    assert pgvector_too_old("0.7.4") and pgvector_too_old("0.5.1") and pgvector_too_old("0.7.99")
    assert not pgvector_too_old("0.8.0") and not pgvector_too_old("0.8.5") and not pgvector_too_old("0.10.0")
    assert not pgvector_too_old("0.8") and pgvector_too_old("0.7")
    assert not pgvector_too_old("1.0.0") and not pgvector_too_old("0.9.0-dev")
