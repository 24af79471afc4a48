"""The shared store: PostgreSQL with pgvector, for several bot workers on one memory.

Everything lives in the database (rows, vectors, keyword documents, history, plugin state, forget
jobs), so no process keeps an index of its own: a write or a forget in one worker is what every
other worker reads next. Scope is part of every statement's WHERE clause.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import numpy as np
from narrmem_plugins.storage_postgres.advisory import AdvisoryLock, lock_key
from narrmem_plugins.storage_postgres.dsn import mask_dsn, scrub
from narrmem_plugins.storage_postgres.escape import esc, unesc
from narrmem_plugins.storage_postgres.keywords import (
    bm25_sql,
    folded,
    keyword_document,
    keyword_tokens,
    keywords_sql,
)
from narrmem_plugins.storage_postgres.listening import NOTIFY_LIMIT, Listener
from narrmem_plugins.storage_postgres.pooler import check_one_session_per_connection
from narrmem_plugins.storage_postgres.reach import KEEPALIVE_SQL, GuardedPool, unavailable, unreachable
from narrmem_plugins.storage_postgres.schema import (
    SCHEMA_VERSION,
    made_here,
    migrate,
    role_and_search_path,
    schema_to_make_in,
)
from narrmem_plugins.storage_postgres.sql import PostgresSQL
from narrmem_plugins.storage_postgres.workers_fence import PostgresWorkersFence
from pgvector import Vector
from pgvector.asyncpg import register_vector

from narrmem import jsonio, logs
from narrmem.clock import Clock, SystemClock
from narrmem.errors import ConfigError, InputError, StoreError
from narrmem.models import ContextLine, ForgetJob, ImportanceChange, MemoryRecord, Scope
from narrmem.store import (
    FORGET_JOB_COLUMNS,
    SOURCES_IN_SCOPE,
    ContextWrite,
    DecayedImportance,
    EpisodeContext,
    ForgetJournal,
    HistoryRow,
    InactivePerson,
    MessageKey,
    StateEntry,
    context_writes,
    forget_job_row,
    meta_filter,
    plain_value,
    schema_mismatch,
    with_context_writes,
)
from narrmem.text import content_terms

log = logs.logger("narrmem.storage_postgres")

# The limit of the statements whose length is the data's, not a stall's: an import's index builds
# and statistics, VACUUM, waiting for another importer. [storage] timeout_s limits the others.
MAINTENANCE_S = 86_400.0

COLUMNS = (
    "id, kind, tenant, user_id, chat_id, speaker, text, embed_text, importance, created_at, "
    "stored_at, message_ids, meta, context_text, reinforced_at"
)
# The keyword documents are narrmem's own tokens (lower-cased words, CJK bigrams) joined by spaces;
# the text-search configuration only splits them again and, for ``english``, stems the words and
# drops English stopwords (CJK bigrams pass through unchanged). english over simple: LoCoMo dev
# R@10 0.733 against 0.704 (R@5 0.636 against 0.615), as SQLite's porter stemming finds too.
DEFAULT_TEXT_CONFIG = "english"
TEXT_CONFIGS = ("simple", "english")
TERMS_CACHED = 50_000  # query terms whose tsquery is kept (cleared when full)
# pgvector's bound on hnsw.ef_search.
MAX_EF_SEARCH = 1000
TABLES = (
    "memories",
    "memory_words",
    "memory_sources",
    "memory_history",
    "plugin_state",
    "forget_jobs",
    "meta",
)
# A history row, written only while its memory is stored (another worker may have forgotten it:
# its foreign key is gone).
_IMPORTANCE_IF_UNCHANGED = """
WITH change AS (
    SELECT * FROM unnest($1::bigint[], $2::double precision[], $3::text[], $4::double precision[],
                         $5::text[], $6::text[]) AS c(id, new, reinforced_at, old, who, why)
), written AS (
    UPDATE memories m SET importance = change.new, reinforced_at = change.reinforced_at,
                          current_importance = change.new
    FROM change
    WHERE m.id = change.id AND (change.old IS NULL OR m.importance = change.old)
    RETURNING m.id, change.new, change.old, change.who, change.why
)
INSERT INTO memory_history (memory_id, at, who, why, old, new)
SELECT id, $7, who, why, old, new FROM written
RETURNING memory_id
"""
# A decay pass's value, cached only while the memory is as the pass read it; its history row only
# with it (data-modifying CTEs run to completion whether or not the query reads them).
_DECAYED_IF_UNCHANGED = """
WITH read AS (
    SELECT * FROM unnest($1::bigint[], $2::double precision[], $3::double precision[],
                         $4::double precision[], $5::text[], $6::text[])
        AS r(id, value, importance, cached, who, why)
), written AS (
    UPDATE memories m SET current_importance = read.value
    FROM read
    WHERE m.id = read.id AND m.importance = read.importance
      AND m.current_importance IS NOT DISTINCT FROM read.cached
    RETURNING m.id, read.value, read.cached, read.who, read.why
), noted AS (
    INSERT INTO memory_history (memory_id, at, who, why, old, new)
    SELECT id, $7, who, why, cached, value FROM written WHERE who IS NOT NULL
)
SELECT id FROM written
"""
_HISTORY_IF_STORED = (
    "INSERT INTO memory_history (memory_id, at, who, why, old, new) "
    "SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM memories WHERE id = $1)"
)
# NUL in a meta string as json.dumps writes it, and what a meta filter reads in its place.
JSON_NUL, JSON_REPLACEMENT = "\\u0000", "\\ufffd"
WRITE_CHUNK = 2_000  # rows per INSERT of a batch write
ADD_ATTEMPTS = 5  # tries of one add() racing other workers for the same messages
# An import of at least this many records into an empty store builds the indexes of the memories
# after loading them: an HNSW graph built at once goes several times faster than row by row.
BULK_BUILD_MIN = 1_000
BUILD_MEMORY_MAX = 8 * 2**30  # maintenance_work_mem such a build may take (bytes)

# One statement writes a chunk of rows: each column comes as one array ($1 ... $20, see
# ``PostgresStore._row``), $21 is the text-search configuration of the keyword documents.
_ROW_TYPES = (
    ("id", "bigint"),
    ("kind", "text"),
    ("tenant", "text"),
    ("user_id", "text"),
    ("chat_id", "text"),
    ("speaker", "text"),
    ("text", "text"),
    ("embed_text", "text"),
    ("importance", "float8"),
    ("created_at", "text"),
    ("created_ts", "float8"),
    ("stored_at", "text"),
    ("message_ids", "text"),
    ("meta", "text"),
    ("vector", "vector"),
    ("context_text", "text"),
    ("reinforced_at", "text"),
    ("keyword_tokens", "int4"),
    ("body", "text"),
    ("context", "text"),
)
_STORED = [name for name, _ in _ROW_TYPES[:18]]
INSERT_ROWS = (
    f"INSERT INTO memories ({', '.join(_STORED)}, keywords) "
    f"SELECT {', '.join('u.' + name for name in _STORED)}, "
    f"{keywords_sql('$21', 'u.body', 'u.context')} "
    f"FROM unnest({', '.join(f'${i + 1}::{kind}[]' for i, (_, kind) in enumerate(_ROW_TYPES))}) "
    f"AS u({', '.join(name for name, _ in _ROW_TYPES)})"
)
# Provenance of a chunk; an episode's claim on a message that has an episode is dropped (the
# unique index), and the claims made come back, so the caller sees which episodes lost one.
INSERT_SOURCES = (
    "INSERT INTO memory_sources (memory_id, tenant, chat_id, message_id, is_episode) "
    "SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bool[]) "
    "ON CONFLICT DO NOTHING RETURNING memory_id, is_episode"
)


class PostgresStore(ForgetJournal):
    """Implements :class:`narrmem.store.Store` on one PostgreSQL database (a pool of connections)."""

    shared = True  # several processes may use the same database at once

    def __init__(
        self,
        dsn: str,
        *,
        hnsw_m: int = 32,
        hnsw_ef_construction: int = 200,
        hnsw_ef_search: int = 256,
        pool_size: int = 4,
        read_only: bool = False,
        text_config: str | None = None,
        clock: Clock | None = None,
        timeout_s: float = 30.0,
        history_kept: int = 0,
    ) -> None:
        self.clock: Clock = clock or SystemClock()  # the memory's: when a forget was recorded
        self.history_kept = history_kept  # importance history rows kept per memory (0: all)
        text_config = text_config or DEFAULT_TEXT_CONFIG
        if text_config not in TEXT_CONFIGS:
            raise StoreError(f"text search configuration must be one of {TEXT_CONFIGS}, not {text_config!r}")
        self._dsn = dsn
        self.where = mask_dsn(dsn)
        self.hnsw_m = hnsw_m
        self.hnsw_ef_construction = hnsw_ef_construction
        self.hnsw_ef_search = min(hnsw_ef_search, MAX_EF_SEARCH)
        self.pool_size = pool_size
        self.read_only = read_only
        self.text_config = text_config
        self.timeout_s = timeout_s
        self._pool: GuardedPool | None = None
        self._term_cache: dict[str, str] = {}  # query term -> its tsquery in text_config
        self._workers_fence: PostgresWorkersFence | None = None
        self.dim = 0

    def __repr__(self) -> str:
        return f"PostgresStore({self.where})"

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self, *, dim: int, model: str) -> None:
        self.dim = dim
        self._term_cache.clear()
        # Before anything else: a pooler that moves sessions would break the migration's lock too.
        settings_sql = self._settings_sql()
        try:
            await check_one_session_per_connection(
                self._dsn, where=self.where, settings_sql=settings_sql, timeout_s=self.timeout_s
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
            raise self._not_connected(exc) from exc
        try:
            conn = await asyncpg.connect(self._dsn, timeout=self.timeout_s)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
            raise self._not_connected(exc) from exc
        try:
            if not self.read_only:
                await schema_to_make_in(conn, self.where)
                await self._create_extension(conn)
                vector_schema = await self._vector_schema(conn)
                await migrate(
                    conn, dim, m=self.hnsw_m, ef_construction=self.hnsw_ef_construction, where=self.where
                )
            else:
                await self._check_version(conn)
                vector_schema = await self._vector_schema(conn)
            await self._check_model(conn, dim, model)
        finally:
            await conn.close()

        async def init(conn: Any) -> None:
            await register_vector(conn, schema=vector_schema)
            await conn.execute(settings_sql)

        async def reset(conn: Any) -> None:
            # The default reset ends with RESET ALL, which would drop what init set: the same
            # trip to the server sets it again.
            await conn.execute(conn.get_reset_query() + settings_sql)

        try:
            pool = await asyncpg.create_pool(
                self._dsn,
                min_size=1,
                max_size=self.pool_size,
                init=init,
                reset=reset,
                timeout=self.timeout_s,
                command_timeout=self.timeout_s,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._not_connected(exc) from exc
        self._pool = GuardedPool(pool, where=self.where, scrub=self._scrub_text, limit_s=self.timeout_s)

    def _settings_sql(self) -> str:
        """What each pooled session is set to, as statements. Set with SET, not as startup
        parameters: a connection pooler (PgBouncer, Supavisor) refuses a startup parameter it does
        not know, and one told to ignore it leaves the session without it (a scoped search then
        returns fewer than k, unnoticed)."""
        settings = {
            "hnsw.ef_search": str(self.hnsw_ef_search),
            # A scope filter on an HNSW scan would otherwise drop the candidates of other users
            # and return fewer than k: iterative scans keep walking the graph until k are found.
            "hnsw.iterative_scan": "strict_order",
            # Every statement is planned with its own values: a plan cached for any user is made
            # for the average one, and for a user holding a fifth of the store it read every
            # row of that user (the user's btree and a sort, not the HNSW index; 35 ms at 100k).
            "plan_cache_mode": "force_custom_plan",
        }
        if self.read_only:
            settings["default_transaction_read_only"] = "on"
        return "".join(f"SET {name} = '{value}';" for name, value in settings.items()) + KEEPALIVE_SQL

    async def recorded_model(self) -> str | None:
        try:
            conn = await asyncpg.connect(self._dsn, timeout=self.timeout_s)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError):
            return None  # the open that follows reports it
        try:
            if not await made_here(conn, "narrmem_schema"):
                return None  # no store yet (a ``meta`` further along the search path is not ours)
            value = await conn.fetchval("SELECT value FROM meta WHERE key = 'model'")
        except (asyncpg.PostgresError, asyncpg.InterfaceError):
            return None
        finally:
            await conn.close()
        return None if value is None else str(value)

    async def _create_extension(self, conn: Any) -> None:
        if await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'vector'"):
            return
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except asyncpg.UniqueViolationError:
            return  # another worker created it at the same moment
        except asyncpg.PostgresError as exc:
            raise StoreError(
                f"PostgreSQL at {self.where} has no pgvector: run CREATE EXTENSION vector in that database "
                f"as a user allowed to ({self._scrub(exc)})"
            ) from exc

    async def _vector_schema(self, conn: Any) -> str:
        """The schema pgvector's types are in (``public`` unless it was created elsewhere, as some
        hosted databases do, in ``extensions``), which the search path must name: the tables'
        column types and the queries' operators are written without it."""
        found = await conn.fetchrow(
            "SELECT n.nspname, n.nspname = ANY (current_schemas(false)) AS on_path, e.extversion "
            "FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
        )
        if found is None:
            raise StoreError(
                f"PostgreSQL at {self.where} has no pgvector: run CREATE EXTENSION vector in that database"
            )
        if pgvector_too_old(str(found["extversion"])):
            raise ConfigError(
                f"storage.dsn: {self.where} has pgvector {found['extversion']}; narrmem needs "
                f"{'.'.join(map(str, PGVECTOR_LEAST))} or later (its iterative index scans keep a search "
                "within one user's memories whole): install a later pgvector on the server, then run "
                "ALTER EXTENSION vector UPDATE in that database"
            )
        if not found["on_path"]:
            role, path = await role_and_search_path(conn)
            raise ConfigError(
                f"storage.dsn: pgvector is in schema {found['nspname']!r} of {self.where}, which the "
                f"session's search_path ({path}) does not name: ALTER ROLE {role} SET search_path = "
                f"{path}, {found['nspname']} (taken by sessions opened after it)"
            )
        return str(found["nspname"])

    async def _check_version(self, conn: Any) -> None:
        exists = await made_here(conn, "narrmem_schema")
        version = await conn.fetchval("SELECT max(version) FROM narrmem_schema") if exists else None
        if version is None:
            raise StoreError(f"no narrmem store at {self.where} (open it once for writing to create it)")
        if int(version) != SCHEMA_VERSION:
            raise StoreError(schema_mismatch(self.where, int(version), SCHEMA_VERSION))

    async def _check_model(self, conn: Any, dim: int, model: str) -> None:
        stored = {r["key"]: r["value"] for r in await conn.fetch("SELECT key, value FROM meta")}
        if not stored and self.read_only:
            raise StoreError(f"no narrmem store at {self.where} (its database is empty)")
        if not stored or "model" not in stored:
            await conn.execute(
                "INSERT INTO meta (key, value) VALUES ('model', $1), ('dim', $2), ('text_config', $3) "
                "ON CONFLICT (key) DO NOTHING",
                model,
                str(dim),
                self.text_config,
            )
            stored = {r["key"]: r["value"] for r in await conn.fetch("SELECT key, value FROM meta")}
        if stored.get("model") != model or stored.get("dim") != str(dim):
            raise StoreError(
                f"{self.where} holds vectors of model {stored.get('model')} ({stored.get('dim')} dims), "
                f"not {model} ({dim} dims): open it with the model it was written with "
                "([embedder] settings as they were); to move it to another model, copy it into a "
                "new database with narrmem migrate --reembed (an export's vectors are of this model, "
                "and an import into a store of another refuses them)"
            )
        # The stored documents were made with this configuration: queries must use the same.
        self.text_config = stored.get("text_config", self.text_config)

    async def close(self) -> None:
        fence, self._workers_fence = self._workers_fence, None
        if fence is not None:
            await fence.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await pool.close()  # each session's goodbye waits timeout_s at most
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # A server that stalls or went away: the sessions end with their sockets. A close
                # that raised would end a worker's clean stop with an internal error.
                log.warning(
                    "PostgreSQL did not see the store's sessions close (%s); ended", type(exc).__name__
                )
                pool.terminate()

    def workers_fence(self) -> PostgresWorkersFence:
        """This worker's side of the fence between a forget and the other workers' writes in
        flight (:mod:`.workers_fence`), on a connection of its own opened at its first use."""
        if self._workers_fence is None:
            self._workers_fence = PostgresWorkersFence(self._dsn, timeout_s=self.timeout_s)
        return self._workers_fence

    @property
    def pool(self) -> GuardedPool:
        if self._pool is None:
            raise StoreError("the store is not open")
        return self._pool

    def _scrub(self, exc: BaseException) -> str:
        return scrub(str(exc) or type(exc).__name__, self._dsn)

    def _scrub_text(self, text: str) -> str:
        return scrub(text, self._dsn)

    def _not_connected(self, exc: BaseException) -> StoreError:
        """A failed connect: unavailable when the server could not be reached (it may be back in a
        moment), a plain refusal otherwise (a wrong password, no such database)."""
        if unreachable(exc):
            return unavailable(exc, self.where, self._scrub_text, self.timeout_s)
        return StoreError(f"cannot connect to PostgreSQL at {self.where}: {self._scrub(exc)}")

    # --- transactions ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A connection inside one transaction (asyncpg's, ``$1`` placeholders), committed when the
        block ends and rolled back when it raises. Transactions of several workers run at once;
        PostgreSQL's locks and the unique constraints keep them apart."""
        async with self.pool.acquire() as conn, conn.transaction():
            try:
                yield conn
            except asyncpg.ReadOnlySQLTransactionError as exc:
                raise StoreError(f"{self.where} is open read-only: nothing can be written") from exc

    @contextlib.asynccontextmanager
    async def sql(self, *, write: bool = False) -> AsyncIterator[PostgresSQL]:
        """A connection for a plugin's own tables (:class:`narrmem.store.SQLCapable`): pooled for
        reading, inside one transaction for writing."""
        if write:
            async with self.transaction() as conn:
                yield PostgresSQL(conn, read_only=self.read_only)
        else:
            async with self.pool.acquire() as conn:
                yield PostgresSQL(conn, read_only=self.read_only)

    @contextlib.asynccontextmanager
    async def snapshot(self) -> AsyncIterator[PostgresSQL]:
        """A pooled connection in one read-only REPEATABLE READ transaction
        (:class:`narrmem.store.ReadsSnapshots`): every statement sees the state of its first."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            # Its reader may be a slow client (an export over HTTP): a snapshot left idle holds
            # back every table's vacuum, and a migration's lock, for as long as it is kept.
            idle_ms = int(SNAPSHOT_IDLE_S * 1000)
            await conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = {idle_ms}")
            yield PostgresSQL(conn, read_only=True)

    # --- between workers -------------------------------------------------------------------

    broadcast_limit = NOTIFY_LIMIT

    async def broadcast(self, channel: str, payload: str) -> None:
        """``NOTIFY`` (:mod:`.listening`): delivered to every session listening, at commit."""
        if len(payload.encode()) > NOTIFY_LIMIT:
            raise StoreError(f"a broadcast of {len(payload.encode())} bytes: at most {NOTIFY_LIMIT}")
        await self.pool.execute("SELECT pg_notify($1, $2)", channel, payload)

    async def listen(self, channel: str, heard: Callable[[str], None], lost: Callable[[], None]) -> Listener:
        """``LISTEN`` on a session of its own, replaced when it ends (:mod:`.listening`)."""
        listener = Listener(self._dsn, channel, heard, lost, timeout_s=self.timeout_s)
        async with self.pool.reaching():
            await listener.start()
        return listener

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[bool]:
        """Whether this worker holds the named job (a session advisory lock) for the block: one
        worker at a time runs it, the others get ``False`` at once and skip it. A lost connection
        does not lose the lock for long: it is taken again (:mod:`.advisory`)."""
        pool = self.pool
        lock = AdvisoryLock(pool.raw, lock_key(name), name, timeout_s=self.timeout_s)
        async with pool.reaching():
            held = await lock.take()
        try:
            yield held
        finally:
            if held:
                await lock.release()

    # --- writing --------------------------------------------------------------------------

    async def add(
        self, records: Sequence[MemoryRecord], vectors: np.ndarray, *, state: Sequence[StateEntry] = ()
    ) -> list[int]:
        return await self.add_with_context(records, vectors, {}, state=state)

    async def add_with_context(
        self,
        records: Sequence[MemoryRecord],
        vectors: np.ndarray | Awaitable[np.ndarray],
        context: Mapping[int, Sequence[ContextLine]],
        *,
        state: Sequence[StateEntry] = (),
    ) -> list[int]:
        if not isinstance(vectors, np.ndarray):
            vectors = np.asarray(await vectors, dtype=np.float32)
        if len(records) != len(vectors):
            raise StoreError(f"{len(records)} records but {len(vectors)} vectors")
        for record in records:
            _check_ids(record)
        async with self.transaction() as conn:
            written = await self._add_rows(conn, records, vectors)
            if context and written:
                await self._write_context(conn, context_writes(records, context, [n for n, _ in written]))
            if state:
                await conn.executemany(
                    STATE_PUT, [(esc(ns), esc(key), _state_json(value)) for ns, key, value in state]
                )
        for index, new_id in written:
            records[index].id = new_id
        return [new_id for _, new_id in written]

    async def _add_rows(
        self, conn: Any, records: Sequence[MemoryRecord], vectors: np.ndarray
    ) -> list[tuple[int, int]]:
        """``(position in records, id)`` of the rows written, set-wise: which episodes go is read
        first (their messages' episodes already stored, and earlier episodes of the call), and the
        unique constraint on claimed messages decides. An episode another worker claimed between the
        read and the write rolls this attempt back (a savepoint) and the next one reads it."""
        for _ in range(ADD_ATTEMPTS):
            try:
                async with conn.transaction():
                    keep = _kept(records, await _episode_sources(conn, records))
                    ids = await _new_ids(conn, len(keep))
                    lost = await self._write_rows(
                        conn, [records[i] for i in keep], [vectors[i] for i in keep], ids
                    )
                    if lost:
                        raise _Raced
                    return list(zip(keep, ids, strict=True))
            except _Raced:
                continue
        raise StoreError(f"other workers kept storing the same messages: gave up after {ADD_ATTEMPTS} tries")

    async def _write_rows(
        self,
        conn: Any,
        records: Sequence[MemoryRecord],
        vectors: Sequence[np.ndarray | None],
        ids: Sequence[int],
    ) -> set[int]:
        """Write rows with these ids and their provenance, a few statements per
        :data:`WRITE_CHUNK` rows; the ids of episodes that could not claim all their messages (the
        caller holds the transaction and undoes it)."""
        for first in range(0, len(records), WRITE_CHUNK):
            part = range(first, min(first + WRITE_CHUNK, len(records)))
            columns = zip(*(self._row(records[i], vectors[i], ids[i]) for i in part), strict=True)
            await conn.execute(INSERT_ROWS, *map(list, columns), self.text_config)
        sources = [
            (new_id, r.tenant, r.chat_id, mid, r.kind == "episode")
            for r, new_id in zip(records, ids, strict=True)
            for mid in dict.fromkeys(r.message_ids)
        ]
        wanted = Counter(s[0] for s in sources if s[4])
        for first in range(0, len(sources), WRITE_CHUNK):
            columns = zip(*sources[first : first + WRITE_CHUNK], strict=True)
            for row in await conn.fetch(INSERT_SOURCES, *map(list, columns)):
                wanted[row[0]] -= 1
        return {memory_id for memory_id, missing in wanted.items() if missing > 0}

    def _row(self, record: MemoryRecord, vector: np.ndarray | None, new_id: int) -> tuple[Any, ...]:
        """The values :data:`INSERT_ROWS` takes for one record, in its order."""
        return (
            new_id,
            record.kind,
            record.tenant,
            record.user_id,
            record.chat_id,
            esc(record.speaker),
            esc(record.text),
            esc(record.embed_text),
            record.importance,
            record.created_at.isoformat(),
            record.created_at.timestamp(),
            record.stored_at.isoformat() if record.stored_at else None,
            json.dumps(record.message_ids, ensure_ascii=False),
            json.dumps(record.meta, ensure_ascii=False, sort_keys=True),
            None if vector is None else Vector(np.asarray(vector, dtype=np.float32).reshape(-1)),
            esc(record.context_text),
            record.reinforced_at.isoformat() if record.reinforced_at else None,
            keyword_tokens(record.index_text, record.context_text),
            keyword_document(record.index_text),
            keyword_document(record.context_text or ""),
        )

    async def stored_message_ids(self, tenant: str, chat_id: str, message_ids: Sequence[str]) -> set[str]:
        rows = await self._sources("message_id", "is_episode AND", tenant, chat_id, message_ids)
        return {r[0] for r in rows}

    async def stored_messages(self, keys: Sequence[MessageKey]) -> set[MessageKey]:
        return await _stored_messages(self.pool, keys)

    async def _sources(
        self, column: str, condition: str, tenant: str, chat_id: str, message_ids: Sequence[str]
    ) -> list[Any]:
        """``column`` of the provenance rows of these messages of a chat that meet ``condition``."""
        return list(
            await self.pool.fetch(
                f"SELECT DISTINCT {column} FROM memory_sources "
                f"WHERE {condition} tenant = $1 AND chat_id = $2 AND message_id = ANY($3::text[])",
                tenant,
                chat_id,
                list(message_ids),
            )
        )

    async def update(self, record: MemoryRecord) -> None:
        if record.id is None:
            raise StoreError("update needs a stored record (it has no id)")
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE memories SET text = $1, embed_text = $2, context_text = $3, importance = $4, "
                "meta = $5, keyword_tokens = $10, "
                f"keywords = {keywords_sql('$8', '$6', '$7')} WHERE id = $9",
                esc(record.text),
                esc(record.embed_text),
                esc(record.context_text),
                record.importance,
                json.dumps(record.meta, ensure_ascii=False, sort_keys=True),
                keyword_document(record.index_text),
                keyword_document(record.context_text or ""),
                self.text_config,
                record.id,
                keyword_tokens(record.index_text, record.context_text),
            )

    async def add_context(
        self, tenant: str, chat_id: str, message_ids: Sequence[str], text: str, *, source: tuple[str, str]
    ) -> list[int]:
        async with self.transaction() as conn:
            return await self._write_context(
                conn, [ContextWrite(tenant, chat_id, tuple(message_ids), text, source)]
            )

    async def _write_context(self, conn: Any, writes: Sequence[ContextWrite]) -> list[int]:
        """Context lines into the episodes they name, inside the caller's transaction; the ids of
        the episodes changed. One statement reads and locks every row the lines name, in id order
        (FOR UPDATE): two workers adding lines to one row take turns and neither line is lost, and
        two batches that share rows lock them in the same order, so neither waits on the other."""
        targets = sorted({(w.tenant, w.chat_id, message_id) for w in writes for message_id in w.message_ids})
        if not targets:
            return []
        tenants, chats, message_ids = (list(column) for column in zip(*targets, strict=True))
        rows = await conn.fetch(
            "SELECT m.id, m.embed_text, m.text, m.context_text, m.meta, s.tenant, s.chat_id, s.message_id "
            "FROM memories m JOIN memory_sources s ON s.memory_id = m.id WHERE s.is_episode AND "
            "(s.tenant, s.chat_id, s.message_id) IN "
            "(SELECT * FROM unnest($1::text[], $2::text[], $3::text[])) ORDER BY m.id FOR UPDATE OF m",
            tenants,
            chats,
            message_ids,
        )
        bodies = {int(r[0]): unesc(r[1]) or unesc(r[2]) or "" for r in rows}  # MemoryRecord.index_text
        changed = with_context_writes(
            [EpisodeContext(int(r[0]), r[5], r[6], r[7], unesc(r[3]), json.loads(r[4])) for r in rows], writes
        )
        for row in changed:
            context = row.context or ""
            await conn.execute(
                "UPDATE memories SET context_text = $1, meta = $2, keyword_tokens = $3, "
                f"keywords = {keywords_sql('$4', '$5', '$6')} WHERE id = $7",
                esc(context),
                json.dumps(row.meta, ensure_ascii=False, sort_keys=True),
                keyword_tokens(bodies[row.memory_id], context),
                self.text_config,
                keyword_document(bodies[row.memory_id]),
                keyword_document(context),
                row.memory_id,
            )
        return [row.memory_id for row in changed]

    async def from_messages(self, tenant: str, chat_id: str, message_ids: Sequence[str]) -> list[int]:
        return sorted(int(r[0]) for r in await self._sources("memory_id", "", tenant, chat_id, message_ids))

    async def delete(self, ids: Sequence[int], scope: Scope) -> int:
        self.forget_cached_terms()
        where, params = _scope_clause(scope, start=2)
        async with self.transaction() as conn:
            rows = await conn.fetch(
                f"DELETE FROM memories WHERE id = ANY($1::bigint[]) AND {where} RETURNING id",
                [int(i) for i in ids],
                *params,
            )
        return len(rows)

    async def set_importance(self, changes: Sequence[ImportanceChange], at: datetime) -> list[int]:
        written: list[int] = []

        async def write(conn: Any, ids: set[int]) -> None:
            mine = [c for c in changes if c.memory_id in ids]
            # Compare and set on the importance read: another worker's reinforcement made
            # meanwhile wins (its row lock makes this one wait, then see the new value).
            rows = await conn.fetch(
                _IMPORTANCE_IF_UNCHANGED,
                [c.memory_id for c in mine],
                [c.importance for c in mine],
                [c.reinforced_at.isoformat() for c in mine],
                [c.old for c in mine],
                [c.who for c in mine],
                [c.why for c in mine],
                at.isoformat(),
            )
            written.extend(int(r[0]) for r in rows)
            await self._trim_history(conn, [int(r[0]) for r in rows])

        await self._write_by_page([c.memory_id for c in changes], write)
        return written

    async def _trim_history(self, conn: Any, memory_ids: Sequence[int]) -> None:
        """Keep the newest ``history_kept`` history rows of each of ``memory_ids``, in the caller's
        transaction."""
        if not self.history_kept or not memory_ids:
            return
        await conn.execute(
            "DELETE FROM memory_history WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER "
            "(PARTITION BY memory_id ORDER BY id DESC) AS newer FROM memory_history "
            "WHERE memory_id = ANY($1::bigint[])) ranked WHERE newer > $2)",
            sorted(set(memory_ids)),
            self.history_kept,
        )

    async def _write_by_page(
        self, ids: Sequence[int], write: Callable[[Any, set[int]], Awaitable[None]]
    ) -> None:
        """``write(conn, round)`` in a transaction of its own for each round of the stored ``ids``
        (each once), a round holding at most one memory of a heap page: every row's new version then
        finds the room its page keeps for one (schema step 5), which a transaction's own earlier
        version on that page would still hold. Ids no longer stored are left out (there is nothing
        to write to them); a row that moves meanwhile only costs that row its HOT update."""
        distinct = list(dict.fromkeys(ids))
        if len(distinct) < 2:  # one row needs no rounds (and a gone one is written to as nothing)
            if distinct:
                async with self.transaction() as conn:
                    await write(conn, set(distinct))
            return
        rows = await self.pool.fetch(
            "SELECT id, (ctid::text::point)[0]::bigint FROM memories WHERE id = ANY($1::bigint[])",
            distinct,
        )
        page = {int(r[0]): int(r[1]) for r in rows}
        rounds: list[set[int]] = []
        on_page: Counter[int] = Counter()
        for memory_id in (i for i in distinct if i in page):
            number = on_page[page[memory_id]]
            on_page[page[memory_id]] += 1
            if number == len(rounds):
                rounds.append(set())
            rounds[number].add(memory_id)
        for round_ids in rounds:
            async with self.transaction() as conn:
                await write(conn, round_ids)

    async def importance_states(
        self, after_id: int, limit: int, *, tenant: str | None = None
    ) -> list[tuple[int, float, datetime, float | None]]:
        only = "AND tenant = $3 " if tenant is not None else ""
        rows = await self.pool.fetch(
            "SELECT id, importance, COALESCE(reinforced_at, created_at), current_importance FROM memories "
            f"WHERE id > $1 {only}ORDER BY id LIMIT $2",
            after_id,
            limit,
            *((tenant,) if tenant is not None else ()),
        )
        return [(int(r[0]), float(r[1]), datetime.fromisoformat(r[2]), r[3]) for r in rows]

    async def set_current_importance(
        self,
        values: Sequence[tuple[int, float]],
        history: Sequence[HistoryRow],
        at: datetime,
    ) -> None:
        async def write(conn: Any, ids: set[int]) -> None:
            await conn.executemany(
                "UPDATE memories SET current_importance = $1 WHERE id = $2",
                [(value, memory_id) for memory_id, value in values if memory_id in ids],
            )
            await conn.executemany(
                _HISTORY_IF_STORED,
                [
                    (memory_id, at.isoformat(), who, why, old, new)
                    for memory_id, who, why, old, new in history
                    if memory_id in ids
                ],
            )
            await self._trim_history(conn, [row[0] for row in history if row[0] in ids])

        # A memory's value and its history row go in one transaction.
        await self._write_by_page(
            [*(memory_id for memory_id, _ in values), *(row[0] for row in history)], write
        )

    async def set_decayed_importance(self, values: Sequence[DecayedImportance], at: datetime) -> list[int]:
        by_id = {d.memory_id: d for d in values}
        written: list[int] = []

        async def write(conn: Any, ids: set[int]) -> None:
            mine = [by_id[i] for i in ids]
            rows = await conn.fetch(
                _DECAYED_IF_UNCHANGED,
                [d.memory_id for d in mine],
                [d.value for d in mine],
                [d.importance for d in mine],
                [d.cached for d in mine],
                [d.history[0] if d.history else None for d in mine],
                [d.history[1] if d.history else None for d in mine],
                at.isoformat(),
            )
            written.extend(int(r[0]) for r in rows)
            await self._trim_history(conn, [int(r[0]) for r in rows if by_id[int(r[0])].history])

        await self._write_by_page(list(by_id), write)
        return written

    async def history(self, memory_id: int) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            "SELECT at, who, why, old, new FROM memory_history WHERE memory_id = $1 ORDER BY id", memory_id
        )
        return [{"at": r[0], "who": r[1], "why": r[2], "old": r[3], "new": r[4]} for r in rows]

    async def histories(
        self, first_id: int, last_id: int, *, tenant: str | None = None, user_id: str | None = None
    ) -> dict[int, list[dict[str, Any]]]:
        if tenant is None:
            if user_id is not None:
                raise StoreError("a user's histories need their tenant")
            rows = await self.pool.fetch(
                "SELECT memory_id, at, who, why, old, new FROM memory_history "
                "WHERE memory_id BETWEEN $1 AND $2 ORDER BY memory_id, id",
                first_id,
                last_id,
            )
        else:
            rows = await self.pool.fetch(
                "SELECT h.memory_id, h.at, h.who, h.why, h.old, h.new FROM memory_history h "
                "JOIN memories m ON m.id = h.memory_id WHERE h.memory_id BETWEEN $1 AND $2 "
                "AND m.tenant = $3 AND ($4::text IS NULL OR m.user_id = $4) ORDER BY h.memory_id, h.id",
                first_id,
                last_id,
                tenant,
                user_id,
            )
        found: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            found.setdefault(int(r[0]), []).append(
                {"at": r[1], "who": r[2], "why": r[3], "old": r[4], "new": r[5]}
            )
        return found

    async def count_below(self, threshold: float) -> int:
        return int(
            await self.pool.fetchval(
                "SELECT COUNT(*) FROM memories "
                "WHERE current_importance IS NOT NULL AND current_importance < $1",
                threshold,
            )
        )

    # --- plugin state ---------------------------------------------------------------------

    async def state_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        value = await self.pool.fetchval(
            "SELECT value FROM plugin_state WHERE namespace = $1 AND key = $2", esc(namespace), esc(key)
        )
        return None if value is None else dict(json.loads(value))

    async def state_put(self, namespace: str, key: str, value: dict[str, Any]) -> None:
        async with self.transaction() as conn:
            await conn.execute(STATE_PUT, esc(namespace), esc(key), _state_json(value))

    async def state_by_prefix(self, key_prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
        # Keys are kept escaped, a character at a time: the escaped prefix starts every escaped key
        # it starts. A namespace at a time, each read by the primary key's order.
        prefix = esc(key_prefix) or ""
        found: list[tuple[str, str, dict[str, Any]]] = []
        for (namespace,) in await self.pool.fetch("SELECT DISTINCT namespace FROM plugin_state"):
            rows = await self.pool.fetch(
                'SELECT key, value FROM plugin_state WHERE namespace = $1 AND key COLLATE "C" >= $2 '
                'AND left(key, $3) = $2 ORDER BY key COLLATE "C"',
                namespace,
                prefix,
                len(prefix),
            )
            found += [(str(unesc(namespace)), str(unesc(r[0])), dict(json.loads(r[1]))) for r in rows]
        return found

    async def state_items(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        rows = await self.pool.fetch(
            'SELECT key, value FROM plugin_state WHERE namespace = $1 ORDER BY key COLLATE "C"',
            esc(namespace),
        )
        return [(str(unesc(row[0])), dict(json.loads(row[1]))) for row in rows]

    async def state_put_if(
        self, namespace: str, key: str, value: dict[str, Any], expected: dict[str, Any] | None
    ) -> bool:
        async with self.transaction() as conn:
            if expected is None:
                # A concurrent insert of the same key waits on the primary key and then does nothing.
                done = await conn.fetchval(
                    "INSERT INTO plugin_state (namespace, key, value) VALUES ($1, $2, $3) "
                    "ON CONFLICT (namespace, key) DO NOTHING RETURNING TRUE",
                    esc(namespace),
                    esc(key),
                    _state_json(value),
                )
            else:
                # Under READ COMMITTED a concurrent UPDATE of the row makes this one re-check its
                # WHERE against the committed value: only one of two workers wins.
                done = await conn.fetchval(
                    "UPDATE plugin_state SET value = $3 WHERE namespace = $1 AND key = $2 AND value = $4 "
                    "RETURNING TRUE",
                    esc(namespace),
                    esc(key),
                    _state_json(value),
                    _state_json(expected),
                )
        return bool(done)

    async def state_delete_if(self, namespace: str, key: str, expected: dict[str, Any]) -> bool:
        async with self.transaction() as conn:
            # As state_put_if: a concurrent UPDATE makes this DELETE re-check its WHERE.
            done = await conn.fetchval(
                "DELETE FROM plugin_state WHERE namespace = $1 AND key = $2 AND value = $3 RETURNING TRUE",
                esc(namespace),
                esc(key),
                _state_json(expected),
            )
        return bool(done)

    async def state_delete(self, namespace: str, key_prefix: str) -> int:
        async with self.transaction() as conn:
            rows = await conn.fetch(
                "DELETE FROM plugin_state WHERE namespace = $1 AND left(key, $2) = $3 RETURNING key",
                esc(namespace),
                len(esc(key_prefix) or ""),
                esc(key_prefix),
            )
        return len(rows)

    # --- forgetting -----------------------------------------------------------------------

    async def forget(self, *, tenant: str, user_id: str | None, chat_id: str | None) -> dict[str, int]:
        self.forget_cached_terms()
        where, params = _scope_clause(Scope(tenant=tenant, user_id=user_id, chat_id=chat_id))
        async with self.transaction() as conn:
            rows = await conn.fetch(
                f"DELETE FROM memories WHERE {where} RETURNING kind, vector IS NOT NULL", *params
            )
        by_kind: dict[str, int] = {}
        for kind, _ in rows:
            by_kind[kind] = by_kind.get(kind, 0) + 1
        vectors = sum(1 for _, has_vector in rows if has_vector)
        # The keyword document is a column of the row: it went with it.
        return {"memories": len(rows), "keyword_rows": len(rows), "vectors": vectors, **by_kind}

    async def scope_sources(self, scope: Scope) -> list[tuple[str, str]]:
        where, params = _scope_clause(scope, alias="m")
        return [(r[0], r[1]) for r in await self.pool.fetch(SOURCES_IN_SCOPE.format(where=where), *params)]

    async def write_forget(self, job: ForgetJob) -> int:
        async with self.transaction() as conn:
            job_id = await conn.fetchval(
                f"INSERT INTO forget_jobs ({FORGET_JOB_COLUMNS}) "
                "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                *forget_job_row(job, self.clock),
            )
        return int(job_id)

    async def pending_forgets(self) -> list[ForgetJob]:
        rows = await self.pool.fetch(
            "SELECT id, tenant, user_id, chat_id, messages, sources FROM forget_jobs ORDER BY id"
        )
        return [ForgetJob.from_row(r) for r in rows]

    async def forgets_begun(self) -> int:
        """The last forget job id the identity's sequence gave out (a sequence never gives one
        twice, and is read outside any transaction's snapshot)."""
        value = await self.pool.fetchval(
            "SELECT pg_sequence_last_value(pg_get_serial_sequence('forget_jobs', 'id')::regclass)"
        )
        return int(value or 0)

    async def finish_forget(self, job: ForgetJob, *, purge: bool = True) -> None:
        """Delete the job's row; ``purge`` also vacuums the tables, so the deleted rows' space is
        marked free (and their index entries removed) at once rather than at autovacuum's leisure.
        PostgreSQL does not zero freed space: see the README for what that leaves on disk."""
        # Purge first: a crash between the two then repeats the (idempotent) purge on reopen.
        if purge:
            await self.purge_deleted()
        async with self.transaction() as conn:
            await conn.execute("DELETE FROM forget_jobs WHERE id = $1", job.id)

    async def purge_deleted(self) -> None:
        async with self.pool.acquire() as conn:
            for table in ("memories", "memory_words", "memory_sources", "memory_history", "plugin_state"):
                await conn.execute(f"VACUUM {table}", timeout=MAINTENANCE_S)

    # --- import and export ----------------------------------------------------------------

    async def import_records(self, items: Sequence[tuple[MemoryRecord, np.ndarray]]) -> dict[str, int]:
        for record, _ in items:
            _check_ids(record)
        async with self.transaction() as conn:
            # One importer at a time: two importing the same ids would otherwise both pass the check.
            deferred = await _lock_for_import(conn, len(items))
            fresh = await _unstored(conn, items)
            if fresh:
                await _catch_up_sequence(conn, "memories", max((r.id or 0 for r, _ in fresh), default=0))
                unnumbered = iter(await _new_ids(conn, sum(r.id is None for r, _ in fresh)))
                ids = [r.id if r.id is not None else next(unnumbered) for r, _ in fresh]
                lost = await self._write_rows(conn, [r for r, _ in fresh], [v for _, v in fresh], ids)
                if lost:
                    record = next(r for (r, _), i in zip(fresh, ids, strict=True) if i in lost)
                    raise StoreError(f"an episode of message(s) {record.message_ids} is already stored")
                # Rows written with their own ids leave the identity behind: new rows must not collide.
                await _catch_up_sequence(conn, "memories")
            await self._build_indexes(conn, deferred, len(fresh))
            if len(fresh) >= BULK_BUILD_MIN:
                # The planner's row counts per user come from these statistics: left to autovacuum,
                # a store filled by an import is planned as empty until it runs (a large user's
                # recall then reads every row of that user for each lookup by id).
                await conn.execute("ANALYZE memories", timeout=MAINTENANCE_S)
                await conn.execute("ANALYZE memory_words", timeout=MAINTENANCE_S)
        return {"imported": len(fresh), "skipped": len(items) - len(fresh)}

    async def _build_indexes(self, conn: Any, definitions: Sequence[str], rows: int) -> None:
        """Create the indexes :func:`_lock_for_import` dropped, with enough memory for the HNSW
        graph of ``rows`` vectors (within :data:`BUILD_MEMORY_MAX`; never less than configured)."""
        if not definitions:
            return
        need = rows * (self.dim * 4 + self.hnsw_m * 40 + 200)
        configured = int(await conn.fetchval("SELECT pg_size_bytes(current_setting('maintenance_work_mem'))"))
        memory = max(configured, min(need, BUILD_MEMORY_MAX))
        await conn.execute(f"SET LOCAL maintenance_work_mem = '{memory // 1024}kB'")
        for definition in definitions:
            await conn.execute(definition, timeout=MAINTENANCE_S)

    async def export(self, tenant: str | None = None) -> AsyncIterator[tuple[MemoryRecord, np.ndarray]]:
        last = 0
        while True:
            if tenant is None:
                rows = await self.pool.fetch(
                    f"SELECT {COLUMNS}, vector FROM memories WHERE id > $1 ORDER BY id LIMIT 1000", last
                )
            else:
                rows = await self.pool.fetch(
                    f"SELECT {COLUMNS}, vector FROM memories WHERE tenant = $2 AND id > $1 ORDER BY id "
                    "LIMIT 1000",
                    last,
                    tenant,
                )
            if not rows:
                return
            for row in rows:
                yield _record(row), self._vector(row[15])
            last = rows[-1][0]

    async def dump_rows(
        self, table: str, after: int = 0, limit: int = 1000, *, after_key: tuple[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Rows of a side table (``memory_history``, ``plugin_state``, ``forget_jobs``) for migration,
        in key order; ``after`` pages by id where the table has one (an offset for
        ``plugin_state``, where ``after_key``, the last (namespace, key) seen, pages without
        missing a row when rows before it come and go meanwhile)."""
        if table == "plugin_state" and after_key is not None:
            rows = await self.pool.fetch(
                "SELECT namespace, key, value FROM plugin_state WHERE (namespace, key) > ($1, $2) "
                "ORDER BY namespace, key LIMIT $3",
                esc(after_key[0]),
                esc(after_key[1]),
                limit,
            )
        elif table == "plugin_state":
            rows = await self.pool.fetch(
                "SELECT namespace, key, value FROM plugin_state ORDER BY namespace, key OFFSET $1 LIMIT $2",
                after,
                limit,
            )
        elif table in ("memory_history", "forget_jobs"):
            rows = await self.pool.fetch(
                f"SELECT * FROM {table} WHERE id > $1 ORDER BY id LIMIT $2", after, limit
            )
        else:
            raise StoreError(f"no side table named {table!r}")
        out = [dict(r) for r in rows]
        if table == "plugin_state":
            for row in out:
                row["namespace"], row["key"] = unesc(row["namespace"]), unesc(row["key"])
        return out

    async def load_rows(self, table: str, rows: Sequence[dict[str, Any]]) -> int:
        """Write migrated side-table rows keeping their keys; rows already there are skipped. The
        rows go in by ``COPY`` to a temporary table and one ``INSERT ... ON CONFLICT DO NOTHING``."""
        if not rows:
            return 0
        columns = list(rows[0])
        if table not in ("memory_history", "plugin_state", "forget_jobs"):
            raise StoreError(f"no side table named {table!r}")
        if table == "plugin_state":
            rows = [{**row, "namespace": esc(row["namespace"]), "key": esc(row["key"])} for row in rows]
        names = ", ".join(columns)
        async with self.transaction() as conn:
            await conn.execute(f"CREATE TEMPORARY TABLE narrmem_load (LIKE {table}) ON COMMIT DROP")
            await conn.copy_records_to_table(
                "narrmem_load", records=[tuple(row[c] for c in columns) for row in rows], columns=columns
            )
            status = await conn.execute(
                f"INSERT INTO {table} ({names}) SELECT {names} FROM narrmem_load ON CONFLICT DO NOTHING"
            )
            if table != "plugin_state":
                await _catch_up_sequence(conn, table)
        return int(status.rsplit(" ", 1)[-1])

    async def table_counts(self) -> dict[str, int]:
        """Rows per table, for checking a migration."""
        counts: dict[str, int] = {}
        for table in ("memories", "memory_sources", "memory_history", "plugin_state", "forget_jobs"):
            counts[table] = int(await self.pool.fetchval(f"SELECT COUNT(*) FROM {table}"))
        counts["vectors"] = int(
            await self.pool.fetchval("SELECT COUNT(*) FROM memories WHERE vector IS NOT NULL")
        )
        return counts

    # --- reading --------------------------------------------------------------------------

    async def search_vectors(
        self, scope: Scope, vector: np.ndarray, k: int, *, kinds: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        where, scoped = _scope_clause(scope, start=3)
        params: tuple[Any, ...] = scoped
        if kinds:
            where += f" AND kind = ANY(${len(params) + 3}::text[])"
            params = (*params, list(kinds))
        rows = await self.pool.fetch(
            f"SELECT id, -(vector <#> $1) FROM memories WHERE {where} AND vector IS NOT NULL "
            "ORDER BY vector <#> $1 LIMIT $2",
            np.asarray(vector, dtype=np.float32).reshape(-1),
            int(k),
            *params,
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    async def search_keywords(
        self,
        scope: Scope,
        query: str,
        k: int,
        *,
        context_weight: float = 2 / 3,
        kinds: Sequence[str] | None = None,
    ) -> list[tuple[int, float]]:
        queries = await self._term_queries(list(dict.fromkeys(folded(t) for t in content_terms(query))))
        if not queries:
            return []
        where, scoped = _scope_clause(scope, start=4 + len(queries))
        params: list[Any] = list(scoped)
        kinds_clause = "TRUE"
        if kinds:
            kinds_clause = f"h.kind = ANY(${len(params) + 4 + len(queries)}::text[])"
            params.append(list(kinds))
        first = len(params) + 4 + len(queries)
        scope_words = f"memory_scope_query(${first}::text, ${first + 1}::text)"
        params += [scope.user_id, scope.chat_id]
        rows = await self.pool.fetch(
            bm25_sql(len(queries), where, kinds_clause, scope_words),
            float(context_weight),
            int(k),
            " | ".join(f"({q})" for q in queries),
            *queries,
            *params,
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    def forget_cached_terms(self) -> None:
        """Drop the query terms kept (what people asked, in their words): at every deletion here,
        and at another worker's (``narrmem_forgotten_elsewhere``)."""
        self._term_cache.clear()

    async def _term_queries(self, terms: Sequence[str]) -> list[str]:
        """Each term as the configuration reads it (a ``tsquery``), in order; terms it drops (its
        stopwords) are left out. Never parsed as query syntax: a term is only ever plain text."""
        known = {t: self._term_cache[t] for t in terms if t in self._term_cache}
        missing = [t for t in dict.fromkeys(terms) if t not in known]
        if missing:
            rows = await self.pool.fetch(
                "SELECT t, plainto_tsquery($1::regconfig, t)::text FROM unnest($2::text[]) AS t",
                self.text_config,
                missing,
            )
            fetched = {str(r[0]): str(r[1]) for r in rows}
            known.update(fetched)
            if len(self._term_cache) + len(fetched) > TERMS_CACHED:
                self._term_cache.clear()
            self._term_cache.update(fetched)
        return [known[t] for t in terms if known.get(t)]

    async def get(self, ids: Sequence[int], scope: Scope | None) -> dict[int, MemoryRecord]:
        params: tuple[str, ...] = ()
        if scope is None:
            where = "TRUE"
        else:
            where, params = _scope_clause(scope, start=2)
        rows = await self.pool.fetch(by_id(COLUMNS, where), [int(i) for i in ids], *params)
        return {int(r[0]): _record(r) for r in rows}

    async def get_with_vectors(
        self, ids: Sequence[int], scope: Scope
    ) -> tuple[dict[int, MemoryRecord], dict[int, np.ndarray]]:
        where, params = _scope_clause(scope, start=2)
        rows = await self.pool.fetch(by_id(f"{COLUMNS}, vector", where), [int(i) for i in ids], *params)
        records = {int(r[0]): _record(r) for r in rows}
        vectors = {int(r[0]): self._vector(r[-1]) for r in rows if r[-1] is not None}
        return records, vectors

    async def vectors(self, ids: Sequence[int], scope: Scope) -> dict[int, np.ndarray]:
        where, params = _scope_clause(scope, start=2)
        rows = await self.pool.fetch(
            by_id("id, vector", f"{where} AND vector IS NOT NULL"), [int(i) for i in ids], *params
        )
        return {int(r[0]): self._vector(r[1]) for r in rows}

    async def recent(
        self,
        scope: Scope,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        kinds: Sequence[str] | None = None,
        limit: int = 100,
        meta_has: tuple[str, str] | None = None,
    ) -> list[MemoryRecord]:
        where, params = _scope_clause(scope, start=2)
        values: list[Any] = list(params)
        if since is not None:
            values.append(since.timestamp())
            where += f" AND created_ts >= ${len(values) + 1}"
        if until is not None:
            values.append(until.timestamp())
            where += f" AND created_ts <= ${len(values) + 1}"
        if kinds:
            values.append(list(kinds))
            where += f" AND kind = ANY(${len(values) + 1}::text[])"
        checked = meta_filter(meta_has)
        if checked is not None:
            key, value = checked
            if plain_value(value):
                # A substring test rules most rows out before their JSON is parsed.
                values.append(value)
                where += f" AND strpos(meta, ${len(values) + 1}::text) > 0"
            # A JSON list contains a string it holds, and a string contains itself. jsonb refuses
            # the escape of NUL (\u0000), which a meta string may hold (written as json.dumps
            # writes it): one such row failed every such read of its user (counts, triggers), so
            # it is read with U+FFFD in its place.
            values.extend((JSON_NUL, JSON_REPLACEMENT, key, value))
            n = len(values)  # $1 is the limit: values[i] is ${i + 2}
            meta = f"replace(meta, ${n - 2}, ${n - 1})::jsonb"
            where += f" AND ({meta} -> ${n}::text) @> to_jsonb(${n + 1}::text)"
        rows = await self.pool.fetch(
            f"SELECT {COLUMNS} FROM memories WHERE {where} ORDER BY created_ts DESC, id DESC LIMIT $1",
            min(int(limit), 2**62),
            *values,
        )
        return [_record(r) for r in rows]

    async def users(
        self, tenant: str | None, *, limit: int = 1000, after: str | None = None
    ) -> list[dict[str, Any]]:
        where, params = ("WHERE tenant = $2", [tenant]) if tenant is not None else ("", [])
        if after is not None:
            if tenant is None:
                raise InputError("pages through one tenant's users: give a tenant", field="after")
            where, params = "WHERE tenant = $2 AND user_id > $3", [tenant, after]
        rows = await self.pool.fetch(
            "SELECT tenant, user_id, COUNT(*), COUNT(*) FILTER (WHERE kind = 'scene'), "
            f"COUNT(DISTINCT chat_id), MIN(created_ts), MAX(created_ts) FROM memories {where} "
            "GROUP BY tenant, user_id ORDER BY tenant, user_id LIMIT $1",
            limit,
            *params,
        )
        return [
            {
                "tenant": r[0],
                "user_id": r[1],
                "memories": int(r[2]),
                "scenes": int(r[3]),
                "chats": int(r[4]),
                "first_at": datetime.fromtimestamp(float(r[5]), UTC).isoformat(),
                "last_at": datetime.fromtimestamp(float(r[6]), UTC).isoformat(),
            }
            for r in rows
        ]

    async def tenants(self) -> list[str]:
        rows = await self.pool.fetch("SELECT DISTINCT tenant FROM memories ORDER BY tenant")
        return [str(r[0]) for r in rows]

    async def inactive_people(
        self,
        before: datetime,
        *,
        tenant: str | None = None,
        limit: int = 1000,
        after: tuple[str, str] | None = None,
    ) -> list[InactivePerson]:
        where: list[str] = []
        params: list[Any] = [before.timestamp(), limit]
        if tenant is not None:
            params.append(tenant)
            where.append(f"tenant = ${len(params)}")
        if after is not None:
            params.extend(after)
            where.append(f"(tenant, user_id) > (${len(params) - 1}, ${len(params)})")
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = await self.pool.fetch(
            f"SELECT tenant, user_id, COUNT(*), MAX(created_ts) FROM memories {clause}"
            "GROUP BY tenant, user_id HAVING MAX(created_ts) < $1 ORDER BY tenant, user_id LIMIT $2",
            *params,
        )
        return [InactivePerson(r[0], r[1], int(r[2]), datetime.fromtimestamp(float(r[3]), UTC)) for r in rows]

    async def last_said(
        self, tenant: str | None = None, user_id: str | None = None, *, until: datetime | None = None
    ) -> datetime | None:
        if user_id is not None and tenant is None:
            raise InputError("a person is found within a tenant: give a tenant", field="tenant")
        where, params = "", list[str | None]()
        if tenant is not None:
            where, params = "WHERE tenant = $1", [tenant]
        if user_id is not None:
            where, params = "WHERE tenant = $1 AND user_id = $2", [tenant, user_id]
        bound: list[float] = []
        if until is not None:
            mark = f"${len(params) + 1}"
            where = f"{where} AND created_ts < {mark}" if where else f"WHERE created_ts < {mark}"
            bound = [until.timestamp()]
        last = await self.pool.fetchval(f"SELECT MAX(created_ts) FROM memories {where}", *params, *bound)
        return None if last is None else datetime.fromtimestamp(float(last), UTC)

    async def user_tenants(self, user_ids: Sequence[str]) -> list[str]:
        ids = list(dict.fromkeys(user_ids))
        if not ids:
            return []
        # Each tenant the least one past the last (one seek of the scope index), each asked for a
        # row of the person (a seek too): not every row of the store read.
        rows = await self.pool.fetch(
            "WITH RECURSIVE t(tenant) AS (SELECT MIN(tenant) FROM memories UNION ALL "
            "SELECT (SELECT MIN(tenant) FROM memories WHERE tenant > t.tenant) FROM t "
            "WHERE t.tenant IS NOT NULL) "
            "SELECT tenant FROM t WHERE tenant IS NOT NULL AND EXISTS (SELECT 1 FROM memories m "
            "WHERE m.tenant = t.tenant AND m.user_id = ANY($1::text[])) ORDER BY tenant",
            ids,
        )
        return [str(r[0]) for r in rows]

    async def stats(self) -> dict[str, Any]:
        kinds = {
            r[0]: int(r[1])
            for r in await self.pool.fetch("SELECT kind, COUNT(*) FROM memories GROUP BY kind ORDER BY kind")
        }
        row = await self.pool.fetchrow(
            "SELECT COUNT(DISTINCT (tenant, user_id)), COUNT(DISTINCT (tenant, chat_id)), "
            "COUNT(DISTINCT tenant), COUNT(vector) FROM memories"
        )
        size = await self.pool.fetchval(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relname = ANY($1::text[]) AND c.relkind = 'r' AND pg_table_is_visible(c.oid)",
            list(TABLES),
        )
        return {
            "memories": sum(kinds.values()),
            "by_kind": kinds,
            "users": int(row[0]),
            "chats": int(row[1]),
            "tenants": int(row[2]),
            "vectors_indexed": int(row[3]),
            "index": "pgvector hnsw",
            "hnsw_m": self.hnsw_m,
            "hnsw_ef_construction": self.hnsw_ef_construction,
            "hnsw_ef_search": self.hnsw_ef_search,
            "text_config": self.text_config,
            "schema_version": SCHEMA_VERSION,
            "database": self.where,
            "database_bytes": int(size or 0),
        }

    def _vector(self, value: Any) -> np.ndarray:
        vector = np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)
        if vector.shape != (self.dim,):
            raise StoreError(f"a stored vector has {vector.size} dimensions, expected {self.dim}")
        return vector


def by_id(columns: str, where: str) -> str:
    """A read of the rows ``$1`` names (a ``bigint[]``) that ``where`` keeps. The ids are looked up
    by the primary key first, whatever the planner believes of the scope: with a user's row count
    underestimated (statistics lag behind a user who grows fast) it would walk the user's index
    instead, every row of a large user for a few dozen ids. ``where`` still decides, in the query."""
    named = {name.strip() for name in columns.split(",")}
    inner = ", ".join([columns, *(c for c in ("tenant", "user_id", "chat_id") if c not in named)])
    # OFFSET 0 keeps the subquery whole: the scope's conditions are not pushed into it.
    return (
        f"SELECT {columns} FROM (SELECT {inner} FROM memories "
        f"WHERE id = ANY($1::bigint[]) OFFSET 0) AS picked WHERE {where}"
    )


def _scope_clause(scope: Scope, alias: str = "", *, start: int = 1) -> tuple[str, tuple[str, ...]]:
    """The SQL that keeps a statement inside ``scope``, numbered from placeholder ``$start``."""
    prefix = f"{alias}." if alias else ""
    clauses, params = [f"{prefix}tenant = ${start}"], [scope.tenant]
    if scope.user_id is not None:
        params.append(scope.user_id)
        clauses.append(f"{prefix}user_id = ${start + len(params) - 1}")
    if scope.chat_id is not None:
        params.append(scope.chat_id)
        clauses.append(f"{prefix}chat_id = ${start + len(params) - 1}")
    return " AND ".join(clauses), tuple(params)


def _record(row: Sequence[Any]) -> MemoryRecord:
    return MemoryRecord.trusted(
        id=int(row[0]),
        kind=row[1],
        tenant=row[2],
        user_id=row[3],
        chat_id=row[4],
        speaker=unesc(row[5]),
        text=unesc(row[6]) or "",
        embed_text=unesc(row[7]),
        importance=float(row[8]),
        created_at=datetime.fromisoformat(row[9]),
        stored_at=datetime.fromisoformat(row[10]) if row[10] else None,
        message_ids=jsonio.loads(row[11]),
        meta=jsonio.loads(row[12]),
        context_text=unesc(row[13]),
        reinforced_at=datetime.fromisoformat(row[14]) if row[14] else None,
    )


class _Raced(Exception):
    """Another worker stored an episode of one of the messages between the read and the write."""


async def _episode_sources(conn: Any, records: Sequence[MemoryRecord]) -> set[MessageKey]:
    """Which of the episodes' (tenant, chat, message) sources already have an episode."""
    return await _stored_messages(
        conn, [(r.tenant, r.chat_id, mid) for r in records if r.kind == "episode" for mid in r.message_ids]
    )


async def _stored_messages(conn: Any, keys: Sequence[MessageKey]) -> set[MessageKey]:
    """The keys among ``keys`` whose message has an episode, in one query."""
    wanted = set(keys)
    if not wanted:
        return set()
    tenants, chats, mids = (list(column) for column in zip(*wanted, strict=True))
    rows = await conn.fetch(
        "SELECT s.tenant, s.chat_id, s.message_id FROM memory_sources AS s "
        "JOIN unnest($1::text[], $2::text[], $3::text[]) AS w (tenant, chat_id, message_id) "
        "USING (tenant, chat_id, message_id) WHERE s.is_episode",
        tenants,
        chats,
        mids,
    )
    return {(r[0], r[1], r[2]) for r in rows}


def _kept(records: Sequence[MemoryRecord], taken: set[tuple[str, str, str]]) -> list[int]:
    """Positions of the records to write: episodes in order, each unless one of its messages has an
    episode (stored, or kept earlier in the call); then every other record not made from a
    message whose episode was dropped."""
    taken = set(taken)
    dropped: set[tuple[str, str, str]] = set()
    keep: set[int] = set()
    for i, record in enumerate(records):
        if record.kind == "episode":
            sources = {(record.tenant, record.chat_id, mid) for mid in record.message_ids}
            if sources & taken:
                dropped |= sources
            else:
                taken |= sources
                keep.add(i)
    for i, record in enumerate(records):
        if record.kind != "episode" and not any(
            (record.tenant, record.chat_id, mid) in dropped for mid in record.message_ids
        ):
            keep.add(i)
    return sorted(keep)


async def _lock_for_import(conn: Any, n: int) -> list[str]:
    """Lock the memories against other writers for an import of ``n`` records. Into an empty store
    and from :data:`BULK_BUILD_MIN` records, the lock is exclusive (readers wait too, for an empty
    store) and the memories' indexes but the keys (and their keyword copies' index) are dropped, to
    be built after loading: their definitions are returned. A failed import rolls the drop back
    with the rest."""
    empty = "SELECT NOT EXISTS (SELECT 1 FROM memories)"
    if n < BULK_BUILD_MIN or not await conn.fetchval(empty):
        # Waits for another importer (one at a time), as long as it takes.
        await conn.execute("LOCK TABLE memories IN SHARE ROW EXCLUSIVE MODE", timeout=MAINTENANCE_S)
        return []
    await conn.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE", timeout=MAINTENANCE_S)
    if not await conn.fetchval(empty):
        return []  # another worker wrote first
    # The keyword copies (memory_words) are written with the memories, by trigger: their index too.
    rows = await conn.fetch(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
        "WHERE indrelid IN ('memories'::regclass, 'memory_words'::regclass) AND NOT indisprimary "
        "ORDER BY indexrelid"
    )
    for row in rows:
        await conn.execute(f"DROP INDEX {row[0]}")
    return [str(row[1]) for row in rows]


async def _unstored(
    conn: Any, items: Sequence[tuple[MemoryRecord, np.ndarray]]
) -> list[tuple[MemoryRecord, np.ndarray]]:
    """The items an import writes: those whose id is not stored. One stored with other content is a
    conflict (:class:`StoreError`, nothing written)."""
    ids = [int(r.id) for r, _ in items if r.id is not None]
    existing = {
        row[0]: _record(row)
        for row in await conn.fetch(f"SELECT {COLUMNS} FROM memories WHERE id = ANY($1::bigint[])", ids)
    }
    fresh = []
    for record, vector in items:
        if record.id is not None and record.id in existing:
            if existing[record.id].model_dump() != record.model_dump():
                raise StoreError(f"record {record.id} is already stored with other content")
            continue
        fresh.append((record, vector))
    return fresh


async def _catch_up_sequence(conn: Any, table: str, at_least: int = 0) -> None:
    """Move ``table``'s id identity past its largest id (and ``at_least``), never back: ids it
    already handed out stay taken."""
    await conn.execute(
        f"SELECT setval(s, GREATEST((SELECT max(id) FROM {table}), pg_sequence_last_value(s), $1, 1)) "
        f"FROM (SELECT pg_get_serial_sequence('{table}', 'id')::regclass AS s) AS q",
        at_least,
    )


async def _new_ids(conn: Any, n: int) -> list[int]:
    """``n`` ids from the memories' identity, in order."""
    if not n:
        return []
    rows = await conn.fetch(
        "SELECT nextval(pg_get_serial_sequence('memories', 'id')) FROM generate_series(1, $1)", n
    )
    return [int(r[0]) for r in rows]


def _check_ids(record: MemoryRecord) -> None:
    """Scope and message ids are matched as stored, so they are not escaped: one holding NUL
    cannot be stored here."""
    for field in ("tenant", "user_id", "chat_id"):
        if "\x00" in getattr(record, field):
            raise StoreError(f"{field} holds a NUL character, which PostgreSQL text cannot store")
    if any("\x00" in mid for mid in record.message_ids):
        raise StoreError("a message id holds a NUL character, which PostgreSQL text cannot store")


STATE_PUT = (
    "INSERT INTO plugin_state (namespace, key, value) VALUES ($1, $2, $3) "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value"
)


# How long a snapshot (ReadsSnapshots) may wait for its reader between two reads before the server
# ends it: an export whose client stops reading fails then, rather than pinning the tables.
SNAPSHOT_IDLE_S = 300.0


def _state_json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# The pgvector that first has iterative index scans (hnsw.iterative_scan, which the pool sets).
PGVECTOR_LEAST = (0, 8, 0)


def pgvector_too_old(version: str) -> bool:
    """Whether pgvector ``version`` (``extversion``: "0.7.4", "0.8.0") is older than narrmem needs;
    a version not of numbers is taken as new enough (a build of its own)."""
    try:
        numbers = [int(part) for part in version.split(".")]
    except ValueError:
        return False
    return tuple(numbers + [0] * (len(PGVECTOR_LEAST) - len(numbers))) < PGVECTOR_LEAST  # "0.8" is 0.8.0
