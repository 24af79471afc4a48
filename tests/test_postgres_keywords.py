"""Keyword ranking on PostgreSQL is SQLite's: the same BM25 over the same tokens, so both stores
hand recall the same keyword candidates in the same order with the same scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.keywords import bm25_sql
from narrmem_plugins.storage_postgres.schema import SCHEMA_VERSION, migrations
from narrmem_plugins.storage_postgres.store import PostgresStore, _scope_clause
from test_store_contract import DIM, MODEL, make_store, record, unit

from narrmem.models import Scope

# One chat of varied lengths: a word in every row (common), words in a few (rare), context-only
# matches, a long row that repeats a word, and CJK bigrams.
ROWS: list[dict[str, Any]] = [
    {"text": "Jon lost his job as a banker yesterday"},
    {"text": "Gina lost her job at Door Dash this month", "context_text": "Jon lost his job as a banker"},
    {"text": "Jon is opening a dance studio downtown"},
    {"text": "Gina sells clothes online and the store is busy"},
    {"text": "The studio floor is finally finished, Jon said, after weeks of work on the studio"},
    {"text": "Gina went to Paris with her friends", "context_text": "Friday 20 January 2023"},
    {"text": "Jon and Gina talked about the banker job and the dance studio and the clothes store " * 3},
    {"text": "I think the studio will open in spring", "context_text": "Jon is opening a dance studio"},
    {"text": "我最近迷上了摇滚乐，每天都听"},
    {"text": "摇滚乐队下周来演出"},
    {"text": "job job job", "kind": "scene"},
    {"text": "A photo of the banker's old office", "embed_text": "Jon said, a photo of the old office"},
]
QUERIES = [
    "When did Jon lose his job as a banker?",
    "What does Gina sell online?",
    "Where is the dance studio?",
    "摇滚乐",
    "Paris friends Friday",
    "job",
    "studio studio opening",
]


async def filled(backend: str, tmp_path: Path) -> Any:
    store = await make_store(backend, tmp_path)
    await store.open(dim=DIM, model=MODEL)
    records = [record(user="u1" if i % 2 else "u2", minutes=i, **row) for i, row in enumerate(ROWS)]
    await store.add(records, np.vstack([unit(i) for i in range(len(records))]))
    return store


async def test_keyword_candidates_and_scores_are_sqlites(tmp_path: Path) -> None:
    sqlite = await filled("sqlite", tmp_path)
    postgres = await filled("postgres", tmp_path)
    try:
        scope = Scope(chat_id="c1")
        for query in QUERIES:
            for weight in (0.5, 0.0, 1.0):
                want = await sqlite.search_keywords(scope, query, 20, context_weight=weight)
                got = await postgres.search_keywords(scope, query, 20, context_weight=weight)
                assert want, query
                assert [i for i, _ in got] == [i for i, _ in want], (query, weight)
                assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-6), query
        # Kinds filter the hits, not the counts the scores come from.
        scenes = await postgres.search_keywords(scope, "job", 20, kinds=["scene"])
        every = dict(await postgres.search_keywords(scope, "job", 20))
        assert [(i, s) for i, s in scenes] == [(i, every[i]) for i, _ in scenes] and len(scenes) == 1
    finally:
        await sqlite.close()
        await postgres.close()


async def test_a_rare_word_outranks_a_common_one(tmp_path: Path) -> None:
    store = await filled("postgres", tmp_path)
    try:
        # "jon" is in most rows, "paris" in one: a row with the rare word comes first, although
        # another row has "jon" twice.
        hits = await store.search_keywords(Scope(chat_id="c1"), "jon paris", 20)
        [paris] = (await store.get([hits[0][0]], None)).values()
        assert "Paris" in paris.text
        # A long row repeating a word ranks below a short row holding it once (length matters).
        hits = await store.search_keywords(Scope(chat_id="c1"), "clothes", 20)
        first = (await store.get([hits[0][0]], None))[hits[0][0]]
        assert first.text.startswith("Gina sells clothes")
    finally:
        await store.close()


async def test_a_database_of_schema_1_gets_keyword_lengths_when_opened(tmp_path: Path) -> None:
    dsn = await fresh_database("keywords")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for statement in migrations(DIM, m=16, ef_construction=64)[0]:
            await conn.execute(statement)
        await conn.execute("CREATE TABLE narrmem_schema (version INTEGER NOT NULL)")
        await conn.execute("INSERT INTO narrmem_schema VALUES (1)")
        await conn.execute(
            "INSERT INTO meta VALUES ('model', $1), ('dim', $2), ('text_config', 'english')", MODEL, str(DIM)
        )
        old_rows = ["the banker lost his job", "a job a job a job at the bank\\0 today", "a café in Zürich"]
        for i, text in enumerate(old_rows):
            await conn.execute(
                "INSERT INTO memories (kind, tenant, user_id, chat_id, text, importance, created_at, "
                "created_ts, message_ids, meta, keywords) VALUES ('episode', 'default', 'u1', 'c1', $1, 0.5, "
                "'2025-01-01T00:00:00+00:00', $2, '[]', '{}', setweight(to_tsvector('english', $1), 'A'))",
                text,
                float(i),
            )
    finally:
        await conn.close()
    store = PostgresStore(dsn)
    await store.open(dim=DIM, model=MODEL)
    try:
        lengths = await store.pool.fetch("SELECT keyword_tokens FROM memories ORDER BY id")
        # Counted from the texts as stored: the escaped NUL is one separator, not a token "0".
        assert [r[0] for r in lengths] == [5, 10, 4]
        assert (await store.stats())["schema_version"] == SCHEMA_VERSION == 8
        # Step 5: pages keep room for a row's next version (importance is written in place).
        options = await store.pool.fetchval("SELECT reloptions FROM pg_class WHERE relname = 'memories'")
        assert options == ["fillfactor=75"]
        # Step 4 copied both rows into the table keyword searches read, with their scope's words.
        copies = await store.pool.fetch(
            "SELECT tokens, words @@ memory_scope_query('u1', NULL) FROM memory_words ORDER BY id"
        )
        assert [tuple(r) for r in copies] == [(5, True), (10, True), (4, True)]
        # Keyword documents live in the row, not in the TOAST table (a search reads them often).
        storage = await store.pool.fetchval(
            "SELECT attstorage FROM pg_attribute "
            "WHERE attrelid = 'memories'::regclass AND attname = 'keywords'"
        )
        assert storage == b"m"
        hits = await store.search_keywords(Scope(user_id="u1"), "banker", 5)
        assert len(hits) == 1 and hits[0][1] > 0
        # Step 6 folded the accents of the row written with them.
        ids = [r[0] for r in await store.pool.fetch("SELECT id FROM memories ORDER BY id")]
        for query in ("cafe zurich", "Café", "ZÜRICH"):
            [(found, _)] = await store.search_keywords(Scope(user_id="u1"), query, 5)
            assert found == ids[2], query
    finally:
        await store.close()


ACCENTED = [
    {"text": "We met at the café near the station"},
    {"text": "Jörg moved to Zürich last spring"},
    {"text": "Ana said the crème brûlée was naïve cooking"},
    {"text": "São Paulo is where Zoë grew up"},
    {"text": "नमस्ते दुनिया"},  # Devanagari's vowel signs are part of its words
    {"text": "the cafe downstairs sells zurich chocolate"},
]


async def test_accents_are_folded_as_sqlite_folds_them(tmp_path: Path) -> None:
    """PostgreSQL's english configuration keeps accents: "cafe" found nothing of a "café" there,
    while SQLite's index folds them."""
    stores = []
    for backend in ("sqlite", "postgres"):
        store = await make_store(backend, tmp_path)
        await store.open(dim=DIM, model=MODEL)
        records = [record(user="u1", minutes=i, **row) for i, row in enumerate(ACCENTED)]
        await store.add(records, np.vstack([unit(i) for i in range(len(records))]))
        stores.append(store)
    sqlite, postgres = stores
    try:
        for query in ("cafe", "café", "Zurich Jorg", "creme brulee naive", "Sao Paulo Zoe", "नमस्ते", "CAFÉ"):
            want = await sqlite.search_keywords(Scope(user_id="u1"), query, 10)
            got = await postgres.search_keywords(Scope(user_id="u1"), query, 10)
            assert want, query
            assert [i for i, _ in got] == [i for i, _ in want], query
            assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-6), query
    finally:
        await sqlite.close()
        await postgres.close()


async def copies_are_true(store: PostgresStore) -> int:
    """Every memory has one keyword copy in ``memory_words``, equal to its row; returns how many."""
    [row] = await store.pool.fetch(
        "SELECT (SELECT COUNT(*) FROM memories), (SELECT COUNT(*) FROM memory_words), "
        "(SELECT COUNT(*) FROM memories m JOIN memory_words w USING (id) WHERE "
        "(w.tenant, w.user_id, w.chat_id, w.kind, w.tokens) = (m.tenant, m.user_id, m.chat_id, m.kind, "
        "m.keyword_tokens) AND w.words = m.keywords || memory_scope_words(m.user_id, m.chat_id))"
    )
    assert row[0] == row[1] == row[2], tuple(row)
    return int(row[0])


async def test_the_keyword_copies_follow_every_write_and_go_with_a_forget(tmp_path: Path) -> None:
    store = await filled("postgres", tmp_path)
    try:
        assert await copies_are_true(store) == len(ROWS)
        # An edit of the text, a reply's line in the context of the turns before it.
        [hit] = await store.search_keywords(Scope(chat_id="c1"), "Paris", 5)
        paris = (await store.get([hit[0]], None))[hit[0]]
        await store.update(paris.model_copy(update={"text": "Gina went to Lisbon with her friends"}))
        assert await store.search_keywords(Scope(chat_id="c1"), "Paris", 5) == []
        assert [i for i, _ in await store.search_keywords(Scope(chat_id="c1"), "Lisbon", 5)] == [hit[0]]
        changed = await store.add_context(
            "default", "c1", paris.message_ids, "Bob said, the tram up to the castle", source=("c1", "r1")
        )
        assert changed == [hit[0]]
        assert [i for i, _ in await store.search_keywords(Scope(chat_id="c1"), "castle", 5)] == [hit[0]]
        await copies_are_true(store)
        # A forget deletes the copies with the rows; what is left is still true.
        await store.forget(tenant="default", user_id="u1", chat_id=None)
        assert await store.pool.fetchval("SELECT COUNT(*) FROM memory_words WHERE user_id = 'u1'") == 0
        assert await copies_are_true(store) == len(ROWS) // 2
        assert await store.search_keywords(Scope(user_id="u1"), "job studio Gina Jon", 20) == []
    finally:
        await store.close()


async def test_a_scope_word_shared_across_tenants_never_lets_another_tenants_rows_in(tmp_path: Path) -> None:
    store = await make_store("postgres", tmp_path)
    await store.open(dim=DIM, model=MODEL)
    try:
        # The user's scope word is of the user id alone: the same id in two tenants shares it,
        # and the tenant column keeps each search to its own.
        records = [record("the lighthouse keeper", tenant=t, minutes=i) for i, t in enumerate("ab")]
        ids = await store.add(records, np.vstack([unit(1), unit(2)]))
        for tenant, own in zip("ab", ids, strict=True):
            for scope in (Scope(tenant=tenant, user_id="u1"), Scope(tenant=tenant, chat_id="c1")):
                assert [i for i, _ in await store.search_keywords(scope, "lighthouse", 5)] == [own], scope
    finally:
        await store.close()


async def test_a_search_finds_its_rows_through_the_scope_words_in_the_keyword_index(tmp_path: Path) -> None:
    store = await filled("postgres", tmp_path)
    try:
        terms = await store._term_queries(["studio", "jon"])
        where, scoped = _scope_clause(Scope(user_id="u1"), start=4 + len(terms))
        scope_words = f"memory_scope_query(${6 + len(terms)}::text, ${7 + len(terms)}::text)"
        statement = "EXPLAIN " + bm25_sql(len(terms), where, "TRUE", scope_words)
        async with store.pool.acquire() as conn:
            await conn.execute("SET enable_seqscan = off")  # a table this small is read whole otherwise
            any_term = " | ".join(f"({t})" for t in terms)
            rows = await conn.fetch(statement, 0.5, 5, any_term, *terms, *scoped, "u1", None)
            await conn.execute("RESET enable_seqscan")
        plan = "\n".join(r[0] for r in rows)
        hits = plan[plan.index("CTE hits") : plan.index("CTE idf")]
        # The rows of a term in the scope come from the keyword copies' GIN index, with the user's
        # scope word in the index condition; the wide memory rows and their indexes are not read.
        assert "memory_words_words" in hits and "~u" in hits, plan
        assert "memories" not in hits.replace("memory_words", ""), plan
    finally:
        await store.close()
