"""The passes a PostgreSQL migration leaves (rows written again: keyword lengths, folded accents)
run after its transaction, a batch at a time, recorded in ``meta`` until done: one interrupted
goes on where it stopped at the next open, and one another worker is running is left to it (the
open goes on). Run inside the migration's transaction, a pass over a large store held every
worker's open, and the row locks of everything it wrote, until it ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.schema import (
    PASS_LOCK,
    PASS_PENDING,
    SCHEMA_VERSION,
    fold_keyword_accents,
    migrations,
)
from narrmem_plugins.storage_postgres.store import PostgresStore
from test_store_contract import DIM, MODEL

from narrmem.models import Scope

TEXTS = ["We met at the café near the station", "Jörg moved to Zürich last spring", "a crème brûlée"]


async def _store_of_schema_5(name: str) -> str:
    """A database as the narrmem of schema 5 left it, with accented texts, unfolded."""
    dsn = await fresh_database(name)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for step in migrations(DIM, m=16, ef_construction=64)[:5]:
            for statement in step:
                await conn.execute(statement)
        await conn.execute("CREATE TABLE narrmem_schema (version INTEGER NOT NULL)")
        await conn.execute("INSERT INTO narrmem_schema VALUES (5)")
        await conn.execute(
            "INSERT INTO meta VALUES ('model', $1), ('dim', $2), ('text_config', 'english')", MODEL, str(DIM)
        )
        for n, text in enumerate(TEXTS):
            await conn.execute(
                "INSERT INTO memories (kind, tenant, user_id, chat_id, text, importance, created_at, "
                "created_ts, message_ids, meta, keywords, keyword_tokens) VALUES ('episode', 'default', "
                "'u1', 'c1', $1, 0.5, '2025-01-01T00:00:00+00:00', $2, '[]', '{}', "
                "setweight(to_tsvector('english', $1), 'A'), 6)",
                text,
                float(n),
            )
    finally:
        await conn.close()
    return dsn


async def _found(dsn: str, words: str) -> tuple[list[int], dict[str, str]]:
    store = PostgresStore(dsn)
    await store.open(dim=DIM, model=MODEL)
    try:
        hits = await store.search_keywords(Scope(user_id="u1"), words, 5)
        pending = {
            str(r["key"]): str(r["value"])
            for r in await store.pool.fetch(
                "SELECT key, value FROM meta WHERE key LIKE $1", f"{PASS_PENDING}%"
            )
        }
        assert (await store.stats())["schema_version"] == SCHEMA_VERSION
    finally:
        await store.close()
    return [memory_id for memory_id, _ in hits], pending


async def test_a_pass_interrupted_goes_on_where_it_stopped(tmp_path: Path) -> None:
    dsn = await _store_of_schema_5("passes")
    conn = await asyncpg.connect(dsn)
    try:
        # The migration to 6 committed, and its pass wrote the first row before the process died
        # (the migration to 7 as well, its pass done: it would write the first row again).
        await conn.execute("INSERT INTO narrmem_schema VALUES (6), (7)")
        await conn.execute("INSERT INTO meta VALUES ($1, '1')", f"{PASS_PENDING}6")
    finally:
        await conn.close()
    found, pending = await _found(dsn, "zurich creme")
    assert sorted(found) == [2, 3] and pending == {}
    # The first row is not written again: the pass went on after it (its "café" stays as it was).
    assert (await _found(dsn, "cafe"))[0] == []


async def test_an_open_leaves_a_pass_another_worker_runs_and_a_later_open_finishes_it(tmp_path: Path) -> None:
    dsn = await _store_of_schema_5("passes")
    other = await asyncpg.connect(dsn)
    try:
        for step in (6, 7):
            await other.execute("SELECT pg_advisory_lock($1)", PASS_LOCK + step)
        found, pending = await _found(dsn, "cafe zurich")  # migrated, and open: the pass is not its
        assert found == [] and pending == {f"{PASS_PENDING}6": "", f"{PASS_PENDING}7": ""}
        for step in (6, 7):
            await other.execute("SELECT pg_advisory_unlock($1)", PASS_LOCK + step)
    finally:
        await other.close()
    found, pending = await _found(dsn, "cafe zurich creme")
    assert sorted(found) == [1, 2, 3] and pending == {}


class EditedMeanwhile:
    """A connection on which another worker edits the first row right after the pass reads it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.edited = False

    async def fetch(self, query: str, *args: Any) -> Any:
        rows = await self.conn.fetch(query, *args)
        if not self.edited:
            self.edited = True
            await self.conn.execute(
                "UPDATE memories SET text = 'We met at the bakery', "
                "keywords = setweight(to_tsvector('english', 'We met at the bakery'), 'A') WHERE id = 1"
            )
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


async def test_a_pass_leaves_a_row_another_worker_wrote_since_it_read_it(tmp_path: Path) -> None:
    """Run beside other workers, a pass wrote back a document made of a row's old text over the
    one an edit had just written."""
    dsn = await _store_of_schema_5("passes")
    conn = await asyncpg.connect(dsn)
    try:

        async def progress(last: int) -> None:
            return None

        await fold_keyword_accents(EditedMeanwhile(conn), 0, progress)
        words = await conn.fetchval("SELECT keywords::text FROM memories WHERE id = 1")
        folded = await conn.fetchval("SELECT keywords::text FROM memories WHERE id = 2")
    finally:
        await conn.close()
    assert "bakeri" in words and "cafe" not in words and "café" not in words
    assert "zurich" in folded


async def test_the_keyword_documents_of_other_scripts_are_written_again(tmp_path: Path) -> None:
    """Schema 7: a decomposed name (as macOS clients send it) and a Hindi word, their documents
    made of the words found before (halves, consonants), are found by the name typed composed and
    by the word once the pass has run."""
    dsn = await _store_of_schema_5("passes")
    conn = await asyncpg.connect(dsn)
    try:
        for n, text in enumerate(["Ju\u0308rgen kommt am Freitag", "प्रिया ने कहा", "राम ने मित्र से बात की"]):
            await conn.execute(
                "INSERT INTO memories (kind, tenant, user_id, chat_id, text, importance, created_at, "
                "created_ts, message_ids, meta, keywords, keyword_tokens) VALUES ('episode', 'default', "
                "'u1', 'c1', $1, 0.5, '2025-01-01T00:00:00+00:00', $2, '[]', '{}', "
                "setweight(to_tsvector('english', $3), 'A'), 6)",
                text,
                float(10 + n),
                ["ju rgen kommt am freitag", "प र य न कह", "र म न म त र स ब त क"][n],
            )
    finally:
        await conn.close()
    found, pending = await _found(dsn, "Jürgen")
    assert found == [4] and pending == {}
    assert (await _found(dsn, "प्रिया"))[0] == [5]


async def test_the_keyword_documents_of_words_typed_with_marks_are_written_again(tmp_path: Path) -> None:
    """Schema 8: a store of schema 7 holds "пётр" and "ελένη" as they were said; once the pass has
    run, the words typed without their marks find them (an ASCII row is not read)."""
    dsn = await _store_of_schema_5("passes")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO narrmem_schema VALUES (6), (7)")
        for n, (text, words) in enumerate(
            [("Пётр приедет завтра", "пётр приедет завтра"), ("Η Ελένη έφτασε", "η ελένη έφτασε")]
        ):
            await conn.execute(
                "INSERT INTO memories (kind, tenant, user_id, chat_id, text, importance, created_at, "
                "created_ts, message_ids, meta, keywords, keyword_tokens) VALUES ('episode', 'default', "
                "'u1', 'c1', $1, 0.5, '2025-01-01T00:00:00+00:00', $2, '[]', '{}', "
                "setweight(to_tsvector('simple', $3), 'A'), 3)",
                text,
                float(10 + n),
                words,
            )
    finally:
        await conn.close()
    found, pending = await _found(dsn, "Петр")
    assert found == [4] and pending == {}
    assert (await _found(dsn, "ελενη"))[0] == [5]
