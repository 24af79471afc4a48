"""The SQLite schema and its migrations, versioned with ``PRAGMA user_version``."""

from __future__ import annotations

import sqlite3

import aiosqlite

MIGRATIONS: list[str] = [
    # 1: memories with scope, provenance and vectors; keyword index; provenance lookup.
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE memories (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so stale vectors cannot alias
        kind        TEXT NOT NULL,
        tenant      TEXT NOT NULL,
        user_id     TEXT NOT NULL,
        chat_id     TEXT NOT NULL,
        speaker     TEXT,
        text        TEXT NOT NULL,
        embed_text  TEXT,
        importance  REAL NOT NULL CHECK (importance BETWEEN 0 AND 1),
        created_at  TEXT NOT NULL,       -- ISO 8601 with the original offset (lossless)
        created_ts  REAL NOT NULL,       -- the same instant as epoch seconds, for ordering
        stored_at   TEXT,
        message_ids TEXT NOT NULL,       -- JSON array: provenance
        meta        TEXT NOT NULL,       -- JSON object
        vector      BLOB,                -- float32; the source of truth the FAISS index derives from
        context_text TEXT                -- indexed for keywords beside the text, with less weight
    );
    CREATE INDEX memories_user ON memories (tenant, user_id, created_ts);
    CREATE INDEX memories_chat ON memories (tenant, chat_id, created_ts);
    CREATE TABLE memory_sources (
        memory_id  INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        tenant     TEXT NOT NULL,
        chat_id    TEXT NOT NULL,
        message_id TEXT NOT NULL,
        is_episode INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (memory_id, message_id)
    );
    CREATE INDEX memory_sources_message ON memory_sources (tenant, chat_id, message_id);
    CREATE UNIQUE INDEX memory_sources_one_episode
        ON memory_sources (tenant, chat_id, message_id) WHERE is_episode = 1;
    CREATE VIRTUAL TABLE memories_fts USING fts5 (
        body, context, tokenize = 'porter unicode61 remove_diacritics 2'
    );
    """,
    # 2: decay and reinforcement state, the importance history, and small per-plugin state.
    """
    ALTER TABLE memories ADD COLUMN reinforced_at TEXT;   -- decay clock start; NULL = created_at
    ALTER TABLE memories ADD COLUMN current_importance REAL;  -- importance after decay at the last pass
    CREATE TABLE memory_history (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        memory_id  INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        at         TEXT NOT NULL,
        who        TEXT NOT NULL,
        why        TEXT NOT NULL,
        old        REAL,
        new        REAL
    );
    CREATE INDEX memory_history_memory ON memory_history (memory_id, id);
    CREATE TABLE plugin_state (
        namespace  TEXT NOT NULL,
        key        TEXT NOT NULL,
        value      TEXT NOT NULL,            -- JSON
        PRIMARY KEY (namespace, key)
    );
    """,
    # 3: the keyword index knows whose each row is (an ``owner`` column of scope tokens, weight 0 in
    # ranking), so a search intersects the user's or chat's rows inside FTS5 instead of ranking every
    # user's matches and filtering afterwards. The scope filter in SQL stays: the tokens only speed up.
    """
    CREATE VIRTUAL TABLE memories_fts_scoped USING fts5 (
        body, context, owner, tokenize = 'porter unicode61 remove_diacritics 2'
    );
    INSERT INTO memories_fts_scoped (rowid, body, context, owner)
        SELECT f.rowid, f.body, f.context,
               'u' || lower(hex(m.tenant)) || 'x' || lower(hex(m.user_id)) || ' '
               || 'c' || lower(hex(m.tenant)) || 'x' || lower(hex(m.chat_id))
        FROM memories_fts f JOIN memories m ON m.id = f.rowid;
    DROP TABLE memories_fts;
    ALTER TABLE memories_fts_scoped RENAME TO memories_fts;
    """,
    # 4: forgetting is a durable job: written down before anything is deleted, finished (and its row
    # deleted) only when every plugin has scrubbed its copies, resumed on the next open after a crash.
    # ``sources`` holds the message ids the forgotten memories came from, by chat, so that plugins
    # can still find their copies when the memories themselves are already gone. History rows no
    # longer quote what was asked: a reason, never a query.
    """
    CREATE TABLE forget_jobs (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant     TEXT NOT NULL,
        user_id    TEXT,
        chat_id    TEXT,
        messages   TEXT,                 -- JSON array: forget only what these messages left (or NULL)
        sources    TEXT NOT NULL,        -- JSON object: chat id -> message ids of what is forgotten
        created_at TEXT NOT NULL
    );
    UPDATE memory_history SET why = 'recalled' WHERE why LIKE 'recalled for:%';
    """,
    # 5: a counter of every change to the stored vectors, kept by triggers in the transaction of the
    # change. The vector index files record the count they were saved at: on open, an equal count
    # (and the highest id ever given) proves the files hold SQLite's vectors without reading every id.
    """
    CREATE TABLE vector_changes (count INTEGER NOT NULL);
    INSERT INTO vector_changes (count) VALUES (0);
    CREATE TRIGGER vector_added AFTER INSERT ON memories WHEN NEW.vector IS NOT NULL
    BEGIN
        UPDATE vector_changes SET count = count + 1;
    END;
    CREATE TRIGGER vector_removed AFTER DELETE ON memories WHEN OLD.vector IS NOT NULL
    BEGIN
        UPDATE vector_changes SET count = count + 1;
    END;
    CREATE TRIGGER vector_replaced AFTER UPDATE OF vector ON memories
    BEGIN
        UPDATE vector_changes SET count = count + 1;
    END;
    """,
    # 6: the same for what the keyword index holds of a row (its text, context, kind and scope), so
    # a tantivy keyword index (``storage.keyword_index``) can prove on open that it is current.
    """
    CREATE TABLE keyword_changes (count INTEGER NOT NULL);
    INSERT INTO keyword_changes (count) VALUES (0);
    CREATE TRIGGER keywords_added AFTER INSERT ON memories
    BEGIN
        UPDATE keyword_changes SET count = count + 1;
    END;
    CREATE TRIGGER keywords_removed AFTER DELETE ON memories
    BEGIN
        UPDATE keyword_changes SET count = count + 1;
    END;
    CREATE TRIGGER keywords_replaced
    AFTER UPDATE OF text, embed_text, context_text, kind, tenant, user_id, chat_id ON memories
    BEGIN
        UPDATE keyword_changes SET count = count + 1;
    END;
    """,
    # 7: what the decay pass reads of every memory, in an index of its own: without it, the hourly
    # pass read every row whole, vector and text (the whole database, 420 MB at 200,000 memories,
    # 1.0 s warm); through the index it reads about 50 bytes a memory (10 MB, 0.3 s). The kind is
    # in it for the counts of stats (a count by kind read every row whole too).
    """
    CREATE INDEX memories_decay
        ON memories (id, importance, created_at, reinforced_at, current_importance, kind);
    """,
    # 8: keyword documents of the words narrmem.text.keyword_terms finds since 2026-12-07
    # (composed, case-folded, marks kept inside words, Thai and its neighbours as bigrams), and an
    # FTS5 tokenizer that keeps a word's marks in it (categories M*: it cut a Hindi word into its
    # consonants, and ranked "प्यार" above the row that said "राम" for राम). The rows whose texts are
    # not all ASCII are written again by the open that migrates, from the id this note holds
    # (store.KEYWORDS_AGAIN), a batch at a time. A store of no memories (a new one) has nothing to
    # write again, and its meta stays empty until its model is recorded.
    """
    CREATE VIRTUAL TABLE memories_fts_marks USING fts5 (
        body, context, owner, tokenize = "porter unicode61 remove_diacritics 2 categories 'L* N* Co M*'"
    );
    INSERT INTO memories_fts_marks (rowid, body, context, owner)
        SELECT rowid, body, context, owner FROM memories_fts;
    DROP TABLE memories_fts;
    ALTER TABLE memories_fts_marks RENAME TO memories_fts;
    INSERT OR REPLACE INTO meta (key, value)
        SELECT 'keywords_again', '0' WHERE EXISTS (SELECT 1 FROM memories);
    """,
    # 9: keyword words without the marks people leave out in other scripts since 2026-12-08 (ё as
    # е, Greek accents, Arabic vowel marks, Hebrew points: narrmem.text.folded); the same pass as
    # schema 8's writes the rows that are not all ASCII again.
    """
    INSERT OR REPLACE INTO meta (key, value)
        SELECT 'keywords_again', '0' WHERE EXISTS (SELECT 1 FROM memories);
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


def split_statements(script: str) -> list[str]:
    """The script's statements, split where SQLite itself says a statement is complete."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


async def migrate(db: aiosqlite.Connection) -> int:
    """Bring the database to ``SCHEMA_VERSION``; each step runs in its own transaction."""
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        from narrmem.errors import StoreError

        raise StoreError(
            f"database schema version {version} is newer than this narrmem ({SCHEMA_VERSION}): "
            "upgrade narrmem"
        )
    for number in range(version, SCHEMA_VERSION):
        script = MIGRATIONS[number]
        statements = split_statements(script)
        await db.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {number + 1}")
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION
