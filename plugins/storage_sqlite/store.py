"""The embedded store: aiosqlite (WAL) is the source of truth; the FAISS index derives from it."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite
import numpy as np
from narrmem_plugins.storage_sqlite import index_folder, index_manifest, keyword_index
from narrmem_plugins.storage_sqlite.folder_lock import FolderLock
from narrmem_plugins.storage_sqlite.keyword_index import (
    CONTEXT_WEIGHT,
    CONTEXT_WEIGHT_TOLERANCE,
    KeywordDoc,
    TantivyKeywords,
)
from narrmem_plugins.storage_sqlite.schema import SCHEMA_VERSION, migrate
from narrmem_plugins.storage_sqlite.sql import SQLiteSQL
from narrmem_plugins.storage_sqlite.vector_index import (
    Consistency,
    IndexOptions,
    Owner,
    ShardKey,
    VectorIndex,
)

from narrmem import jsonio, logs
from narrmem.checks import SQLITE_MAX_INT
from narrmem.clock import Clock, SystemClock
from narrmem.errors import ClosedError, InputError, StoreError
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
from narrmem.text import STOPWORDS, fts_document, keyword_terms
from narrmem.to_the_end import to_the_end

log = logs.logger("narrmem.storage_sqlite")

COLUMNS = (
    "id, kind, tenant, user_id, chat_id, speaker, text, embed_text, importance, created_at, "
    "stored_at, message_ids, meta, context_text, reinforced_at"
)
CHUNK = 500  # stays under SQLite's bound-parameter limit
# A lookup of at most this many rows by an indexed key (about half a millisecond for 50 memories at
# 100k) is read on the caller's thread: the trip to a connection's thread and back cost as much again.
INLINE_IDS = 64
KEYWORDS_FOLDER = "keywords"  # the tantivy keyword index, when storage.keyword_index = "tantivy"
KEYWORD_BATCH = 5000  # rows read per step of a keyword index rebuild
# PRAGMA application_id of a database narrmem creates ("nmem"): a file that carries another id is
# another program's. Stores made before it carry 0 and are known by their meta and memories tables.
APPLICATION_ID = 0x6E6D656D
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")  # files SQLite keeps beside a database
DEFAULT_DATABASE, DEFAULT_INDEX = "narrmem.sqlite3", "vectors"  # [storage] database and index
# What the write-ahead log keeps of its size once a checkpoint has emptied it.
WAL_KEPT_BYTES = 64 * 1024 * 1024
# A meta row saying an older narrmem's single index file may still lie beside the database: set
# by the open that migrates such a store, cleared once the file is claimed or removed.
OLDER_INDEX_FILE = "older_index_file"
# meta: the [storage] index this database's vectors were last kept under, by the database's own
# name (a copy of the file opened under another name has none of its own yet)
INDEX_NAME = "index_of:"
REBUILD_READ_ONLY_S = 30.0  # a read-only open builds its index again at most this often
KEYWORDS_AGAIN = "keywords_again"  # meta: how far schema 8's pass has come (see _write_keywords_again)
KEYWORDS_OF = "keywords_of:"  # meta, by the database's name: it kept a tantivy index
# The log's truncation after a purge waits so long for readers (an export's snapshot holds the
# log back for as long as its client reads), then is tried again every LOG_RETRY_S until it is
# done: the log still holds what the forget deleted until then.
LOG_WAIT_MS = 200
LOG_RETRY_S = 5.0

T = TypeVar("T")


def reading_uri(path: Path) -> str:
    """How a process that only reads opens the database. Read-only (``mode=ro``), SQLite made the
    -wal and -shm files a WAL database's readers need and, being read-only, could not remove them
    at its close: ``narrmem stats`` left two files behind in a folder no process was using. Read-
    write, the connection that closes last removes them (the reader sets ``query_only``, so it
    writes nothing), and SQLite's own locks keep it in step with a writer that starts meanwhile.
    So where the folder can be written and none of those files is there (no writer is open, none
    stopped with a write in its log), read-write; otherwise read-only, leaving what is there."""
    beside = [path.with_name(path.name + suffix) for suffix in SQLITE_COMPANIONS]
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    uri = path.resolve().as_uri()
    return uri if writable and not any(p.exists() for p in beside) else f"{uri}?mode=ro"


class SQLiteStore(ForgetJournal):
    def __init__(
        self,
        folder: Path,
        *,
        database: str,
        index: str,
        busy_timeout_ms: int,
        index_options: IndexOptions | None = None,
        read_only: bool = False,
        keyword_index: str = "auto",
        keyword_threshold: int = 10_000,
        rewrite_on_forget: bool = True,
        clock: Clock | None = None,
        history_kept: int = 0,
        deleted_vectors_kept_s: float = 300.0,
    ) -> None:
        self.read_only = read_only
        # How long a deleted row's vector may stay in the index files (it is out of the index in
        # memory at once): the save that takes it out runs this long after the first delete since
        # the last save, however the delete came (a forget, a plugin's own delete).
        self.deleted_vectors_kept_s = deleted_vectors_kept_s
        self._index_saving: asyncio.Task[None] | None = None
        self.history_kept = history_kept  # importance history rows kept per memory (0: all)
        self.clock: Clock = clock or SystemClock()  # the memory's: when a forget was recorded
        self.rewrite_on_forget = rewrite_on_forget
        self.keyword_engine = keyword_index
        self.keyword_threshold = keyword_threshold
        self._keywords: TantivyKeywords | None = None
        self._keywords_starting: asyncio.Task[None] | None = None  # "auto": the index being built
        self.folder = folder
        self.db_path = folder / database
        self.index_path = folder / index
        self.busy_timeout_ms = busy_timeout_ms
        self.index_options = index_options or IndexOptions()
        self._db: aiosqlite.Connection | None = None
        # Reads go to a second connection, which sees only what is committed: a recall running
        # while a batch is written neither sees rows that may still roll back nor waits behind
        # the write's statements. The task holding the writer reads on it (its own writes).
        self._reader: aiosqlite.Connection | None = None
        self._lookups: sqlite3.Connection | None = None  # small reads by a key, on the event loop's thread
        self._writer_holder: asyncio.Task[Any] | None = None
        self._index: VectorIndex | None = None
        self._lock = asyncio.Lock()
        # Held from a vector write's SQLite transaction until the index has it, and while the index
        # is saved with SQLite's watermark: a saved watermark never counts a row the files lack.
        # The tantivy keyword index, when there is one, records its change count under it too.
        self._vectors_lock = asyncio.Lock()
        self._keywords_rebuilding = asyncio.Lock()  # one rebuild of the tantivy index at a time
        # Read-only beside the writer: the vector changes this reader's index holds (see
        # _catch_up), and when it was last built whole.
        self._seen: dict[str, int] | None = None
        self._catching_up = asyncio.Lock()
        self._built_at = 0.0
        # Each forget job begun here: the write connection's total changes just after its record.
        self._changes_at_forget: dict[int, int] = {}
        self._index_save_owed = False  # deleted rows' vectors still in the index files
        self._log_owed: asyncio.Task[None] | None = (
            None  # a purge's truncation of the log, waiting for a reader
        )
        self._jobs: dict[str, asyncio.Lock] = {}
        self._folder_lock = FolderLock(folder / f"{database}.lock")
        self.dim = 0

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self, *, dim: int, model: str) -> None:
        self.dim = dim
        if self.read_only:
            await self._open_read_only(dim, model)
            return
        # Files narrmem cannot prove are its own are refused before the first file is written.
        written_version, older_index_file = await asyncio.to_thread(self._check_files)
        # One writer per folder: a second process would see neither the other's vectors nor its
        # forgets, so it is refused here, before anything is read or written.
        self._folder_lock.acquire(self.folder)
        db = await self._connect(self.db_path)
        self._db = db
        # secure_delete: what a forget deletes is overwritten, not left in freed pages.
        # auto_vacuum must be chosen before the first table exists (see _vacuum_mode for old files).
        for pragma in (
            "auto_vacuum=INCREMENTAL",
            "journal_mode=WAL",
            "synchronous=NORMAL",
            "foreign_keys=ON",
        ):
            await db.execute(f"PRAGMA {pragma}")
        await db.execute("PRAGMA secure_delete=ON")
        # The write-ahead log is cut back to this size when a checkpoint empties it: it kept the
        # size of its largest burst (an import, a rewrite after a forget) for as long as the
        # process ran.
        await db.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")
        await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        if written_version == 0:
            await db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        if index_folder.wrote_index_file(written_version):
            # Recorded before the migration makes the version say otherwise: an open that fails
            # after it (a model refused, a crash in the vacuum) left the file, holding the vectors
            # of people forgotten since, to every later open, which took it for a stranger's.
            await db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (OLDER_INDEX_FILE, "1")
            )
        await migrate(db)
        await self._vacuum_mode()
        # A log a purge could not truncate (a reader held it until the process stopped) may still
        # hold what a forget deleted.
        async with self._holding_writer():
            await self._truncate_log()
        await self._check_model(dim, model)
        self._reader = await self._open_reader()
        await self._write_keywords_again()
        self._lookups = await asyncio.to_thread(self._open_lookups)
        self._index = VectorIndex(self.index_path, dim, self.index_options)
        self._index.claim(older_index_file=older_index_file)
        if older_index_file:
            if (self.db_path.name, self.index_path.name) == (DEFAULT_DATABASE, DEFAULT_INDEX):
                # Another store's database beside this one (a name of its own) may own the file.
                await asyncio.to_thread(index_folder.remove_older_default_file, self.folder, dim)
            await self._write("DELETE FROM meta WHERE key = ?", (OLDER_INDEX_FILE,))
        await self._retire_renamed_index()
        if not await self._index.load(await self._consistency()):
            await self._rebuild_index()
        else:
            # Files of a save killed before its manifest was written (or before its clean-up).
            await self._index.drop_leftovers()
            if self._index.caught_up and self._index.caught_up["removed"]:
                # Rows SQLite lost since the files were saved (a forget the process did not see
                # through): their vectors must not stay in the files either.
                async with self._vectors_lock:
                    await self._save_index()
        # A reader beside the writer keeps to FTS5, which SQLite's snapshot keeps current.
        if self.keyword_engine == "fts5" and not self.read_only:
            await self._remove_kept_keywords()
        elif self.keyword_engine == "tantivy":
            await self._open_keywords()
        elif self.keyword_engine == "auto" and (
            (self.folder / KEYWORDS_FOLDER).exists() or self.index.largest_scope() >= self.keyword_threshold
        ):
            await self._start_keywords()

    async def _remove_kept_keywords(self) -> None:
        """Not kept with FTS5 alone, a tantivy index this database kept in a run with it held the
        words of everyone forgotten since, in no file a forget purged: deleted (built again from
        SQLite should the setting come back). Only when this database noted it as its own: a
        store beside this one in the folder, or the one this file was copied from, keeps its."""
        key = KEYWORDS_OF + self.db_path.name
        if not await self._fetchall("SELECT 1 FROM meta WHERE key = ?", (key,)):
            return
        if await asyncio.to_thread(keyword_index.remove_own, self.folder / KEYWORDS_FOLDER):
            log.info("the keyword index is not kept with storage.keyword_index = 'fts5': removed")
        await self._write("DELETE FROM meta WHERE key = ?", (key,))

    async def _retire_renamed_index(self) -> None:
        """Delete the index folder this database last kept its vectors in, if ``[storage] index``
        names another now and narrmem marked that one as this database's: left aside, it kept
        every vector and chat id of the store, those of the people forgotten since too."""
        key = INDEX_NAME + self.db_path.name
        await asyncio.to_thread(index_folder.stamp, self.index_path, self.db_path.name)
        rows = await self._fetchall("SELECT value FROM meta WHERE key = ?", (key,))
        named = (
            self.index_path.relative_to(self.folder).as_posix()
            if self.index_path.is_relative_to(self.folder)
            else str(self.index_path)
        )
        before = str(rows[0][0]) if rows else None
        if before is not None and before != named:
            old = (self.folder / before).resolve()
            # Only a folder inside the data folder, and not another's index named now.
            if old.is_relative_to(self.folder.resolve()) and old != self.index_path.resolve():
                if await asyncio.to_thread(index_folder.remove_own, old, self.db_path.name):
                    log.warning("the vector index was %s, %s now: the old folder is deleted", before, named)
        if before != named:
            await self._write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, named))

    def _check_files(self) -> tuple[int, bool]:
        """Refuse a database, vector index or keyword index at this store's paths that narrmem
        cannot prove it wrote; the database's schema version as found (0: none yet), and whether
        an older narrmem's single index file may still be beside it (:data:`OLDER_INDEX_FILE`)."""
        version, pending = self._database_version()
        older_file = index_folder.wrote_index_file(version) or pending
        index_folder.check(self.index_path, index_manifest.FORMAT, older_index_file=older_file)
        if self.keyword_engine in ("tantivy", "auto"):
            keyword_index.check_folder(self.folder / KEYWORDS_FOLDER)
        return version, older_file

    def _database_version(self) -> tuple[int, bool]:
        """The schema version of the database file, read without writing, and whether it records
        an older narrmem's index file still to be cleared (:data:`OLDER_INDEX_FILE`); a StoreError
        for a file that is neither empty nor a narrmem database (no narrmem table is ever added to
        it)."""
        path = self.db_path
        if not path.exists():
            # SQLite takes a -wal or -journal beside a database as its own: opening a new one
            # deleted a user's files of those names (a rollback journal was even played back).
            beside = [path.with_name(path.name + suffix) for suffix in SQLITE_COMPANIONS]
            found = [p for p in beside if os.path.lexists(p)]
            if found:
                raise StoreError(
                    f"{found[0]} exists but the database it would belong to ({path.name}) does not: "
                    "narrmem does not delete a file it did not create; move it away or set "
                    "[storage] database to a name of its own"
                )
            return 0, False
        if not path.is_file():
            raise StoreError(f"{path} is not a file: set [storage] database to a name of its own")
        try:
            with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
                [(version,)] = db.execute("PRAGMA user_version").fetchall()
                [(application,)] = db.execute("PRAGMA application_id").fetchall()
                tables = {
                    str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                }
                pending = "meta" in tables and bool(
                    db.execute("SELECT 1 FROM meta WHERE key = ?", (OLDER_INDEX_FILE,)).fetchall()
                )
        except sqlite3.Error as exc:
            raise StoreError(
                f"{path} cannot be opened as a narrmem store ({exc}): narrmem does not "
                "overwrite a file it did not create; move it away or set [storage] database"
            ) from None
        empty = not tables and int(version) == 0
        older_store = int(application) == 0 and {"meta", "memories"} <= tables and int(version) >= 1
        if int(application) == APPLICATION_ID or (int(application) == 0 and empty) or older_store:
            return int(version), pending
        named = ", ".join(sorted(tables)[:3]) or "none"
        raise StoreError(
            f"{path} is a database narrmem did not write (tables: {named}): "
            "narrmem adds nothing to it; move it away or set [storage] database to a name of its own"
        )

    async def recorded_model(self) -> str | None:
        if not self.db_path.is_file():
            return None

        def read() -> str | None:
            try:
                with closing(sqlite3.connect(reading_uri(self.db_path), uri=True)) as db:
                    db.execute("PRAGMA query_only=ON")
                    row = db.execute("SELECT value FROM meta WHERE key = 'model'").fetchone()
            except sqlite3.Error:
                return None
            return None if row is None else str(row[0])

        return await asyncio.to_thread(read)

    async def _open_read_only(self, dim: int, model: str) -> None:
        """Beside the writing process: no lock, no migration, no file written. The index is read
        from its files, or rebuilt in memory when the writer has not saved its latest rows yet."""
        if not self.db_path.is_file():
            raise StoreError(f"no narrmem store at {self.folder} (no {self.db_path.name} to open read-only)")
        db = await self._connect(reading_uri(self.db_path), uri=True)
        self._db = db
        await db.execute("PRAGMA query_only=ON")  # reading never writes, whatever it is asked
        await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        [(version,)] = await self._fetchall("PRAGMA user_version")
        if int(version) != SCHEMA_VERSION:
            raise StoreError(schema_mismatch(str(self.db_path), int(version), SCHEMA_VERSION))
        await self._check_model(dim, model)
        consistency = await self._consistency()
        # What the index holds from here on: the files loaded are checked against this mark, and
        # a rebuild reads no row past it (a row committed meanwhile is the first catch-up's).
        self._seen = consistency.watermark
        self._index = VectorIndex(self.index_path, dim, self.index_options)
        if not await self._index.load(consistency):
            last_id = None if self._seen is None else self._seen["last_id"]
            await self._rebuild_index(save=False, up_to=last_id)
        self._built_at = time.monotonic()

    async def _catch_up(self) -> None:
        """Read-only, before a vector search: the rows the writer added since this reader looked
        are added to its index (the vector changes the triggers count tell); other changes (a
        forget, an edit's new vector) have the index built again, at most every
        :data:`REBUILD_READ_ONLY_S` (a forgotten row is not found meanwhile: its row is gone).
        Before, a reader's index was the one it opened with: what the bot stored since was found
        by its words alone."""
        async with self._catching_up:
            now, seen = await self._watermark(), self._seen
            if now is None or seen is None or now == seen:
                return
            added = 0
            if now["last_id"] > seen["last_id"]:
                rows = await self._fetchall(
                    "SELECT id, vector, tenant, user_id, chat_id FROM memories "
                    "WHERE vector IS NOT NULL AND id > ? AND id <= ? ORDER BY id",
                    (seen["last_id"], now["last_id"]),
                )
                if rows:
                    ids = np.array([r[0] for r in rows], dtype=np.int64)
                    owners = [Owner(r[2], r[3], r[4]) for r in rows]
                    await self.index.add(ids, np.vstack([_vector(r[1], self.dim) for r in rows]), owners)
                added = len(rows)
            others = now["changes"] - seen["changes"] - added
            self._seen = {"changes": seen["changes"] + added, "last_id": now["last_id"]}
            if others and time.monotonic() - self._built_at >= REBUILD_READ_ONLY_S:
                # Built aside and swapped in whole: a search meanwhile uses the index it had.
                fresh = VectorIndex(self.index_path, self.dim, self.index_options)
                mark = await self._watermark()
                if mark is None:
                    return
                await self._rebuild_index(save=False, into=fresh, up_to=mark["last_id"])
                # The old one is dropped, not closed: a search under way may still be reading it
                # (its threads end once it is collected).
                self._index, self._seen, self._built_at = fresh, mark, time.monotonic()

    async def _connect(self, target: str | Path, *, uri: bool = False) -> aiosqlite.Connection:
        try:
            # A failed aiosqlite connect is reported by its worker thread after the call has
            # returned, into an event loop that may be closed by then (a traceback at exit): a
            # plain connection in a thread that is awaited meets the failure first.
            await asyncio.to_thread(lambda: sqlite3.connect(target, uri=uri).close())
            db = await aiosqlite.connect(target, isolation_level=None, uri=uri)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.db_path} cannot be opened as a narrmem store: {exc}") from exc
        try:
            await db.execute("SELECT COUNT(*) FROM sqlite_master")
        except sqlite3.Error as exc:
            await db.close()
            raise StoreError(f"{self.db_path} cannot be opened as a narrmem store: {exc}") from exc
        return db

    async def _open_reader(self) -> aiosqlite.Connection:
        reader = await self._connect(self.db_path)
        await reader.execute("PRAGMA query_only=ON")  # reading never writes, whatever it is asked
        await reader.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        return reader

    def _open_lookups(self) -> sqlite3.Connection:
        """A second reader, for small lookups by a key where they are asked (see ``_lookup``). It
        never waits for a lock: one that would is read by the reader's thread instead."""
        lookups = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        lookups.execute("PRAGMA query_only=ON")
        lookups.execute("PRAGMA busy_timeout=0")
        return lookups

    async def _consistency(self) -> Consistency:
        """What the index files are checked against on open (see ``VectorIndex.load``)."""
        return Consistency(
            ids=self._vector_ids,
            samples=self._sample_vectors,
            watermark=await self._watermark(),
            rows=self._vector_rows,
        )

    async def _vector_rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Owner]]:
        """The rows of ``ids`` that have a vector: ids, vectors and owners, in id order."""
        found: list[int] = []
        vectors: list[np.ndarray] = []
        owners: list[Owner] = []
        for part in _chunks([int(i) for i in ids]):
            rows = await self._fetchall(
                "SELECT id, vector, tenant, user_id, chat_id FROM memories "
                f"WHERE vector IS NOT NULL AND id IN ({_marks(part)}) ORDER BY id",
                part,
            )
            for r in rows:
                found.append(int(r[0]))
                vectors.append(_vector(r[1], self.dim))
                owners.append(Owner(r[2], r[3], r[4]))
        matrix = np.vstack(vectors) if vectors else np.zeros((0, self.dim), dtype=np.float32)
        return np.array(found, dtype=np.int64), matrix, owners

    async def _watermark(self) -> dict[str, int] | None:
        """The count of vector changes the triggers keep, and the highest id ever given."""
        rows = await self._fetchall(
            "SELECT (SELECT count FROM vector_changes), "
            "(SELECT seq FROM sqlite_sequence WHERE name = 'memories')"
        )
        changes, last_id = rows[0]
        return None if changes is None else {"changes": int(changes), "last_id": int(last_id or 0)}

    async def _sample_vectors(self, picks: np.ndarray) -> dict[int, tuple[np.ndarray, ShardKey]]:
        """The stored vectors and owners of ``picks``, to check an index file holds the same data
        filed under the same users."""
        ids = [int(i) for i in picks]
        if not ids:
            return {}
        rows = await self._fetchall(
            "SELECT id, vector, tenant, user_id FROM memories "
            f"WHERE vector IS NOT NULL AND id IN ({_marks(ids)})",
            ids,
        )
        return {int(r[0]): (_vector(r[1], self.dim), (r[2], r[3])) for r in rows}

    async def _save_index(self) -> None:
        """Save the index with SQLite's watermark; the caller holds ``_vectors_lock``, so no vector
        write sits between its SQLite commit and the index."""
        await self.index.save(await self._watermark())

    async def _check_model(self, dim: int, model: str) -> None:
        rows = await self._fetchall("SELECT key, value FROM meta")
        # Notes of work an open has to do are not the model's record.
        stored = {k: v for k, v in rows if k not in (OLDER_INDEX_FILE, KEYWORDS_AGAIN)}
        if not stored and self.read_only:
            raise StoreError(f"no narrmem store at {self.folder} (its database is empty)")
        if not stored:
            await self._write(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("model", model), ("dim", str(dim))],
                many=True,
            )
        elif stored.get("model") != model or stored.get("dim") != str(dim):
            raise StoreError(
                f"{self.db_path} holds vectors of model {stored.get('model')} ({stored.get('dim')} dims), "
                f"not {model} ({dim} dims): open it with the model it was written with "
                "([embedder] settings as they were); to move it to another model, copy it into a "
                "new folder with narrmem migrate --reembed (an export's vectors are of this model, "
                "and an import into a store of another refuses them)"
            )

    async def _rebuild_index(
        self, *, save: bool = True, into: VectorIndex | None = None, up_to: int | None = None
    ) -> None:
        """Every row's vector into the index (``into``, else the store's), those of ids up to
        ``up_to`` if given (what a watermark read before counts: later rows are added after it)."""
        index = self.index if into is None else into
        last = 0
        bound = SQLITE_MAX_INT if up_to is None else up_to
        while True:
            rows = await self._fetchall(
                "SELECT id, vector, tenant, user_id, chat_id FROM memories "
                "WHERE vector IS NOT NULL AND id > ? AND id <= ? ORDER BY id LIMIT 10000",
                (last, bound),
            )
            if not rows:
                break
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            owners = [Owner(r[2], r[3], r[4]) for r in rows]
            await index.add(ids, np.vstack([_vector(r[1], self.dim) for r in rows]), owners)
            last = int(ids[-1])
        if save:
            async with self._vectors_lock:
                await self._save_index()

    # --- the tantivy keyword index ------------------------------------------------------------

    def _keywords_when_large(self, owners: Sequence[Owner]) -> None:
        """With ``keyword_index = "auto"``: once a user's memories reach the threshold, the tantivy
        index is built (in the background, writes going on), kept, and searched from
        then on. Until then FTS5 alone: a small store's searches are short, and FTS5 scores a
        write exactly at once (tantivy scores one it has not committed yet by estimate)."""
        if self.keyword_engine != "auto" or self._keywords is not None or self._keywords_starting:
            return
        largest = max((self.index.user_size(o.tenant, o.user_id) for o in set(owners)), default=0)
        if largest >= self.keyword_threshold:
            log.info("a user has %d memories: building the keyword index beside FTS5", largest)
            self._keywords_starting = asyncio.ensure_future(self._start_keywords())

    async def _start_keywords(self) -> None:
        """Open (or build) the tantivy index for "auto"; if it cannot, FTS5 serves every search."""
        try:
            await self._open_keywords()
        except Exception:
            log.exception("the keyword index could not be opened: FTS5 serves every search")

    async def _open_keywords(self) -> None:
        keywords = TantivyKeywords(self.folder / KEYWORDS_FOLDER)
        self._keywords = keywords
        if not self.read_only:
            # Noted, so that a later open with FTS5 alone knows the folder for this database's.
            noted = (KEYWORDS_OF + self.db_path.name, "1")
            await self._write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", noted)
        if not await keywords.open(await self._keyword_changes()):
            log.info("building the keyword index %s from SQLite", keywords.folder)
            await self._rebuild_keywords(current=False)

    async def _rebuild_keywords(self, *, current: bool = True) -> None:
        """Rebuild the tantivy index from SQLite with writes going on: they wait only while it
        starts and while the new index takes the old one's place (see ``keyword_index``).
        ``current=False``: the index in use is behind SQLite (FTS5 answers meanwhile)."""
        keywords = _while_open(self._keywords)
        async with self._keywords_rebuilding:
            current = current and keywords.changes is not None
            async with self._vectors_lock:
                if self._keywords is not keywords:
                    raise StoreError(f"the store {self.folder} was closed")
                await keywords.begin_rebuild(await self._keyword_changes(), current=current)
            try:
                await keywords.fill_rebuild(self._keyword_batches())
                async with self._vectors_lock:
                    await keywords.finish_rebuild(await self._keyword_changes())
            except BaseException:
                await keywords.abandon_rebuild()
                raise

    async def _write_keywords_again(self) -> None:
        """Write again the keyword documents of the rows whose texts are not all ASCII, as
        :func:`narrmem.text.keyword_terms` finds their words now (schema 8): a batch a
        transaction, each noting how far it came, so an open killed midway goes on from there.
        A tantivy index is then built again (its documents are the old words)."""
        found = await self._fetchall("SELECT value FROM meta WHERE key = ?", (KEYWORDS_AGAIN,))
        if not found:
            return
        last, written = int(found[0][0]), 0
        while batch := await self._fetchall(
            "SELECT m.id, COALESCE(m.embed_text, m.text), m.context_text, f.body, f.context "
            "FROM memories m JOIN memories_fts f ON f.rowid = m.id WHERE m.id > ? ORDER BY m.id LIMIT ?",
            (last, KEYWORD_BATCH),
        ):
            # On a thread: 5,000 rows' words are 0.2 s of work the event loop would wait for.
            statements = await asyncio.to_thread(_documents_again, batch)
            last = int(batch[-1][0])
            if statements:
                statements.append(("UPDATE keyword_changes SET count = count + 1", ()))
                written += len(statements) - 1
            statements.append(("UPDATE meta SET value = ? WHERE key = ?", (str(last), KEYWORDS_AGAIN)))
            await self._write_many(statements)
        await self._write("DELETE FROM meta WHERE key = ?", (KEYWORDS_AGAIN,))
        if written:
            log.info("keyword documents of %d memories written again (words of other scripts)", written)

    async def _keyword_changes(self) -> int:
        [(count,)] = await self._fetchall("SELECT count FROM keyword_changes")
        return int(count)

    async def _keyword_batches(self) -> AsyncIterator[list[KeywordDoc]]:
        """Every keyword row, as FTS5 holds it, in id order."""
        last = 0
        while docs := await self._keyword_docs(f"f.rowid > ? ORDER BY f.rowid LIMIT {KEYWORD_BATCH}", [last]):
            yield docs
            last = docs[-1].id

    async def _keyword_docs(self, condition: str, params: Sequence[Any]) -> list[KeywordDoc]:
        rows = await self._fetchall(
            "SELECT f.rowid, m.kind, f.owner, f.body, f.context FROM memories_fts f "
            f"JOIN memories m ON m.id = f.rowid WHERE {condition}",
            params,
        )
        return [KeywordDoc(int(r[0]), r[1], tuple(r[2].split()), r[3], r[4] or "") for r in rows]

    def _mirrored(self) -> bool:
        """Whether writes go to a tantivy keyword index too (one that has not missed a write)."""
        return self._keywords is not None and self._keywords.takes_writes

    async def _mirror_keywords(self, *, added: Sequence[int] = (), removed: Sequence[int] = ()) -> None:
        """Give the tantivy index what SQLite just committed, read back from FTS5; the caller
        holds ``_vectors_lock``. If it fails, searches go back to FTS5 and the next open rebuilds it."""
        if not self._mirrored():
            return
        try:
            docs = [
                doc
                for part in _chunks(list(added))
                for doc in await self._keyword_docs(f"f.rowid IN ({_marks(part)})", part)
            ]
            changes = await self._keyword_changes()
        except Exception:
            self._keywords_missed()
            return
        self._mirror_written(docs, changes, removed)

    def _mirror_written(self, docs: Sequence[KeywordDoc], changes: int, removed: Sequence[int] = ()) -> None:
        """Give the tantivy index rows just committed (a new message's, as :meth:`_insert` wrote
        them to FTS5: nothing read back) and the ids removed; ``changes``: SQLite's count with them."""
        if not self._mirrored():
            return
        try:
            _while_open(self._keywords).apply(docs, removed, changes)
        except Exception:
            self._keywords_missed()

    def _keywords_missed(self) -> None:
        keywords = _while_open(self._keywords)
        log.exception("the keyword index %s missed a write: FTS5 serves until it is rebuilt", keywords.folder)
        keywords.missed()

    async def _vacuum_mode(self) -> None:
        """A database made before incremental vacuum was on is rewritten once to turn it on, so
        that a forget can hand its freed pages back instead of leaving them in the file."""
        [(mode,)] = await self._fetchall("PRAGMA auto_vacuum")
        if int(mode) != 2:
            log.info("turning on incremental vacuum for %s (a one-time rewrite)", self.db_path)
            await self.db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            await self.db.execute("VACUUM")

    async def close(self) -> None:
        try:
            if self._log_owed is not None:
                self._log_owed.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._log_owed
                self._log_owed = None
                # Once more: a reader still there (another process's) leaves it to the next open.
                with contextlib.suppress(Exception):
                    async with self._holding_writer():
                        await self._log_truncated()
            if self._index_saving is not None:
                # The save below (the index is dirty) takes the deleted vectors out of the files.
                self._index_saving.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._index_saving
                self._index_saving = None
            if self._keywords_starting is not None:
                self._keywords_starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._keywords_starting
                self._keywords_starting = None
            if self._keywords is not None:
                # Not in the middle of a rebuild's last step (which holds the lock): a purge the
                # close did not wait for (a forget whose caller gave up) may be in one.
                async with self._vectors_lock:
                    await self._keywords.close()
                self._keywords = None
            if self._index is not None:
                await self._index.stop_builds()
                if self._index.dirty and not self.read_only:
                    async with self._vectors_lock:
                        await self._save_index()
                await self._index.close()
                self._index = None
            if self._lookups is not None:
                self._lookups.close()
                self._lookups = None
            if self._reader is not None:
                await self._reader.close()
                self._reader = None
            if self._db is not None:
                await self._db.close()
                self._db = None
        finally:
            self._folder_lock.release()

    @property
    def db(self) -> aiosqlite.Connection:
        return _while_open(self._db)

    @property
    def reading(self) -> aiosqlite.Connection:
        """The connection a read goes to: the writer for the task that holds it (it reads what it
        is writing), the reader for every other (only what is committed)."""
        if self._reader is None or self._writer_holder is asyncio.current_task():
            return self.db
        return self._reader

    @contextlib.asynccontextmanager
    async def _holding_writer(self) -> AsyncIterator[aiosqlite.Connection]:
        """The write connection, for one task at a time."""
        async with self._lock:
            self._writer_holder = asyncio.current_task()
            try:
                yield self.db
            finally:
                self._writer_holder = None

    @property
    def index(self) -> VectorIndex:
        return _while_open(self._index)

    # --- writing --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction at a time on this connection, whoever asks (ingest, a plugin with
        tables of its own, a decay pass): SQLite cannot nest them."""
        async with self._holding_writer() as db:
            try:
                # Read-only, a plain BEGIN still lets a plugin check its tables (CREATE TABLE IF NOT
                # EXISTS of a table that exists writes nothing); any real write fails and says why.
                await db.execute("BEGIN" if self.read_only else "BEGIN IMMEDIATE")
            except BaseException:
                await _roll_back(db)
                raise
            try:
                yield db
                await db.execute("COMMIT")
            except (sqlite3.OperationalError, StoreError) as exc:
                await _roll_back(db)
                # A plugin's own statement fails as a StoreError quoting it (see sql.py): the
                # reason a reader can act on is the same.
                cause = exc.__cause__ if isinstance(exc, StoreError) else exc
                refused = isinstance(cause, sqlite3.OperationalError) and "readonly" in str(cause)
                if self.read_only and refused:
                    raise StoreError(f"{self.folder} is open read-only: nothing can be written") from exc
                raise
            except BaseException:
                await _roll_back(db)
                raise

    @contextlib.asynccontextmanager
    async def sql(self, *, write: bool = False) -> AsyncIterator[SQLiteSQL]:
        """The store's connection for a plugin's own tables (:class:`narrmem.store.SQLCapable`):
        as it is for reading, inside :meth:`transaction` for writing."""
        if write:
            async with self.transaction() as db:
                yield SQLiteSQL(db)
        else:
            yield SQLiteSQL(self.reading)

    @contextlib.asynccontextmanager
    async def snapshot(self) -> AsyncIterator[SQLiteSQL]:
        """A connection of its own, in one read transaction (:class:`narrmem.store.ReadsSnapshots`):
        the shared reader's statements each see the latest commit, so a read of many pages on it
        met the writes made between them. Held, it keeps the writer from checkpointing the log
        back into the database past its state (the log grows meanwhile)."""
        uri = f"{self.db_path.resolve().as_uri()}?mode=ro"
        db = await aiosqlite.connect(uri, uri=True, isolation_level=None)
        try:
            await db.execute("PRAGMA query_only=ON")
            await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            await db.execute("BEGIN")
            await db.execute("SELECT COUNT(*) FROM sqlite_master")  # the state is taken here
            yield SQLiteSQL(db)
        finally:
            with contextlib.suppress(sqlite3.Error):
                await db.execute("ROLLBACK")
            await db.close()

    async def add(
        self, records: Sequence[MemoryRecord], vectors: np.ndarray, *, state: Sequence[StateEntry] = ()
    ) -> list[int]:
        return await self.add_with_context(records, vectors, {}, state=state)

    async def add_while_embedding(
        self,
        records: Sequence[MemoryRecord],
        vectors: Awaitable[np.ndarray],
        *,
        state: Sequence[StateEntry] = (),
    ) -> list[int]:
        return await self._add_while_embedding(records, vectors, state, None)

    async def add_with_context(
        self,
        records: Sequence[MemoryRecord],
        vectors: np.ndarray | Awaitable[np.ndarray],
        context: Mapping[int, Sequence[ContextLine]],
        *,
        state: Sequence[StateEntry] = (),
    ) -> list[int]:
        if isinstance(vectors, np.ndarray):
            if len(records) != len(vectors):
                raise StoreError(f"{len(records)} records but {len(vectors)} vectors")
            async with self._vectors_lock:
                return await self._add(records, vectors, state, context)
        return await self._add_while_embedding(records, vectors, state, context)

    async def _add_while_embedding(
        self,
        records: Sequence[MemoryRecord],
        vectors: Awaitable[np.ndarray],
        state: Sequence[StateEntry],
        context: Mapping[int, Sequence[ContextLine]] | None,
    ) -> list[int]:
        try:
            async with self._vectors_lock:
                return await self._add(records, vectors, state, context)
        except BaseException:
            if inspect.iscoroutine(vectors):
                vectors.close()  # a write that failed before it awaited them: nothing waits now
            raise

    async def _add(
        self,
        records: Sequence[MemoryRecord],
        vectors: np.ndarray | Awaitable[np.ndarray],
        state: Sequence[StateEntry] = (),
        context: Mapping[int, Sequence[ContextLine]] | None = None,
    ) -> list[int]:
        # Once begun, to its end: a caller cancelled after the commit (a bot's timeout) left the
        # rows without their vectors in the index, a memory no vector search found, for good (the
        # index's change count matched at the next open).
        return await to_the_end(self._add_now(records, vectors, state, context))

    async def _add_now(
        self,
        records: Sequence[MemoryRecord],
        vectors: np.ndarray | Awaitable[np.ndarray],
        state: Sequence[StateEntry] = (),
        context: Mapping[int, Sequence[ContextLine]] | None = None,
    ) -> list[int]:
        """Insert the rows; vectors still being computed are awaited once the rows are in, and
        set before the commit."""
        ready = vectors if isinstance(vectors, np.ndarray) else None
        written: list[tuple[int, MemoryRecord, int]] = []  # (place in records, record, new id)
        docs: list[KeywordDoc] = []  # their keyword rows, for the tantivy index
        async with self.transaction() as db:
            if state:
                await db.executemany(STATE_PUT, [_state_row(entry) for entry in state])
            # Checked inside the write transaction (BEGIN IMMEDIATE), so no other writer slips in
            # between: an episode of a message that has one, and what was made from it, are skipped.
            taken = await self._episode_sources(records)
            skipped: set[tuple[str, str, str]] = set()
            kept: list[int] = []
            for n, record in enumerate(records):
                sources = {(record.tenant, record.chat_id, mid) for mid in record.message_ids}
                if record.kind == "episode" and sources & taken:
                    skipped |= sources
                    continue
                if record.kind != "episode" and sources & skipped:
                    continue
                kept.append(n)
                if record.kind == "episode":
                    taken |= sources
            if kept:
                rows = [(records[n], None if ready is None else ready[n], None) for n in kept]
                docs = await self._insert_many(db, rows)
                written = [(n, records[n], doc.id) for n, doc in zip(kept, docs, strict=True)]
            if context and written:
                # The lines go in while the model may still run: they cost the message no wait.
                writes = context_writes(records, context, [n for n, _, _ in written])
                docs += await self._write_context(db, writes)
            # The tantivy index gets the rows as written, with the change count this transaction
            # reaches: read now (while the model may still run), not after the commit.
            changes = await self._keyword_changes() if written and self._mirrored() else None
            if ready is None:
                ready = np.asarray(await cast("Awaitable[np.ndarray]", vectors), dtype=np.float32)
                if len(ready) != len(records):
                    raise StoreError(f"{len(records)} records but {len(ready)} vectors")
                await db.executemany(
                    "UPDATE memories SET vector = ? WHERE id = ?",
                    [(_blob(ready[n]), new_id) for n, _, new_id in written],
                )
        for _, record, new_id in written:
            record.id = new_id
        if written:
            await self.index.add(
                np.array([new_id for _, _, new_id in written], dtype=np.int64),
                np.vstack([ready[n] for n, _, _ in written]),
                [_owner(record) for _, record, _ in written],
            )
            if changes is not None:
                self._mirror_written(list({doc.id: doc for doc in docs}.values()), changes)
            else:
                await self._mirror_keywords(added=list(dict.fromkeys(doc.id for doc in docs)))
            self._keywords_when_large([_owner(record) for _, record, _ in written])
        return [new_id for _, _, new_id in written]

    async def _episode_sources(self, records: Sequence[MemoryRecord]) -> set[MessageKey]:
        """Which of the episodes' (tenant, chat, message) sources already have an episode."""
        return await self.stored_messages(
            [(r.tenant, r.chat_id, mid) for r in records if r.kind == "episode" for mid in r.message_ids]
        )

    async def stored_messages(self, keys: Sequence[MessageKey]) -> set[MessageKey]:
        wanted = sorted(set(keys))
        found: set[MessageKey] = set()
        for begin in range(0, len(wanted), CHUNK // 3):
            part = wanted[begin : begin + CHUNK // 3]
            rows = await self._lookup(
                f"SELECT s.tenant, s.chat_id, s.message_id FROM (VALUES {_row_marks(len(part))}) AS wanted "
                "JOIN memory_sources s ON s.is_episode = 1 AND s.tenant = wanted.column1 "
                "AND s.chat_id = wanted.column2 AND s.message_id = wanted.column3",
                [value for key in part for value in key],
                len(part),
            )
            found.update((r[0], r[1], r[2]) for r in rows)
        return found

    async def _insert_many(
        self, db: aiosqlite.Connection, rows: Sequence[tuple[MemoryRecord, np.ndarray | None, int | None]]
    ) -> list[KeywordDoc]:
        """Rows with their provenance and keyword entries, one statement per table (each statement
        is a trip to the database's thread, a batch's rows are one); returned: their keyword
        entries, which carry the ids. A row keeps its id (``int``) or gets the next free one
        (``None``), in order, after every id the table ever gave (its AUTOINCREMENT counter) and
        every id in the batch: an id is never reused. The caller holds the write transaction."""
        insert = (
            "INSERT INTO memories (kind, tenant, user_id, chat_id, speaker, text, embed_text, importance, "
            "created_at, created_ts, stored_at, message_ids, meta, vector, context_text, reinforced_at, id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        if len(rows) == 1:  # a bot's message: SQLite gives the id (a NULL id is the next one)
            [(record, vector, memory_id)] = rows
            cursor = await db.execute(insert, (*_row_values(record, vector), memory_id))
            ids = [int(cursor.lastrowid or 0)]
        else:
            given = [memory_id for _, _, memory_id in rows if memory_id is not None]
            fresh = 0
            if len(given) < len(rows):
                fresh = max([await self._next_id(db), *(memory_id + 1 for memory_id in given)])
            ids = []
            for _, _, memory_id in rows:
                if memory_id is None:
                    memory_id, fresh = fresh, fresh + 1
                ids.append(memory_id)
            await db.executemany(
                insert,
                [
                    (*_row_values(record, vector), memory_id)
                    for (record, vector, _), memory_id in zip(rows, ids, strict=True)
                ],
            )
        placed = list(zip((record for record, _, _ in rows), ids, strict=True))
        # An episode's source row is unique per chat, so a second copy of a message fails loudly.
        for episodes, verb in ((True, "INSERT"), (False, "INSERT OR IGNORE")):
            sources = [
                (memory_id, record.tenant, record.chat_id, mid, 1 if episodes else 0)
                for record, memory_id in placed
                if (record.kind == "episode") == episodes
                for mid in record.message_ids
            ]
            if sources:
                await db.executemany(
                    f"{verb} INTO memory_sources (memory_id, tenant, chat_id, message_id, is_episode) "
                    "VALUES (?, ?, ?, ?, ?)",
                    sources,
                )
        docs = [_keyword_doc(record, memory_id) for record, memory_id in placed]
        await db.executemany(
            "INSERT INTO memories_fts (rowid, body, context, owner) VALUES (?, ?, ?, ?)",
            [(doc.id, doc.body, doc.context, " ".join(doc.owner)) for doc in docs],
        )
        return docs

    async def _next_id(self, db: aiosqlite.Connection) -> int:
        """The id AUTOINCREMENT would give next: after every id the table ever gave (its counter,
        which an explicit id above it moves on too) and every id in it."""
        rows = await db.execute_fetchall(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'memories'), 0), "
            "coalesce((SELECT max(id) FROM memories), 0)) + 1"
        )
        return int(next(iter(rows))[0])

    async def stored_message_ids(self, tenant: str, chat_id: str, message_ids: Sequence[str]) -> set[str]:
        rows = await self._sources("message_id", "is_episode = 1 AND", tenant, chat_id, message_ids)
        return {r[0] for r in rows}

    async def _sources(
        self, column: str, condition: str, tenant: str, chat_id: str, message_ids: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """``column`` of the provenance rows of these messages of a chat that meet ``condition``."""
        rows: list[tuple[Any, ...]] = []
        for part in _chunks(list(message_ids)):
            rows += await self._lookup(
                f"SELECT {column} FROM memory_sources WHERE {condition} tenant = ? AND chat_id = ? "
                f"AND message_id IN ({_marks(part)})",
                (tenant, chat_id, *part),
                len(part),
            )
        return rows

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
        where, params = _scope_clause(scope)
        clauses, values = [where], list[str | float | int](params)
        if since is not None:
            clauses.append("created_ts >= ?")
            values.append(since.timestamp())
        if until is not None:
            clauses.append("created_ts <= ?")
            values.append(until.timestamp())
        if kinds:
            clauses.append(f"kind IN ({_marks(kinds)})")
            values.extend(kinds)
        checked = meta_filter(meta_has)
        if checked is not None:
            key, value = checked
            if plain_value(value):
                # A substring test rules most rows out before their JSON is parsed.
                clauses.append("instr(meta, ?) > 0")
                values.append(value)
            # json_each of a string is that string; of a list, its items; of nothing, no row. Of
            # an object, its values: not a match, as in PostgreSQL's containment (a bot's
            # {"emotions": {"detected": "tired"}} counted as a mood here only).
            clauses.append(
                "json_type(meta, ?) IN ('text', 'array') "
                "AND EXISTS (SELECT 1 FROM json_each(meta, ?) WHERE value = ?)"
            )
            values.extend((f"$.{key}", f"$.{key}", value))
        sql = (
            f"SELECT {COLUMNS} FROM memories WHERE {' AND '.join(clauses)} ORDER BY created_ts DESC, id DESC "
            "LIMIT ?"
        )
        if checked is None:
            # The scope's index read newest first, stopping at ``limit`` rows: a few turns of a chat
            # (a scene's window, the turns a reply follows) are a small lookup.
            rows = await self._lookup(sql, (*values, limit), limit)
        else:  # a filter on the rows' JSON may read a week of a heavy user's messages
            rows = await self._fetchall(sql, (*values, limit))
        return [_record(row) for row in rows]

    async def update(self, record: MemoryRecord) -> None:
        if record.id is None:
            raise StoreError("update needs a stored record (it has no id)")
        if self._keywords is None and self.keyword_engine == "fts5":
            await self._update(record, record.id)
            return
        async with self._vectors_lock:
            await to_the_end(self._update_mirrored(record, record.id))

    async def _update_mirrored(self, record: MemoryRecord, memory_id: int) -> None:
        await self._update(record, memory_id)
        await self._mirror_keywords(added=[memory_id])

    async def _update(self, record: MemoryRecord, memory_id: int) -> None:
        await self._write_many(
            [
                (
                    "UPDATE memories SET text = ?, embed_text = ?, context_text = ?, importance = ?, "
                    "meta = ? WHERE id = ?",
                    (
                        record.text,
                        record.embed_text,
                        record.context_text,
                        record.importance,
                        json.dumps(record.meta, ensure_ascii=False, sort_keys=True),
                        memory_id,
                    ),
                ),
                (
                    "UPDATE memories_fts SET body = ?, context = ? WHERE rowid = ?",
                    (fts_document(record.index_text), fts_document(record.context_text or ""), memory_id),
                ),
            ]
        )

    async def add_context(
        self, tenant: str, chat_id: str, message_ids: Sequence[str], text: str, *, source: tuple[str, str]
    ) -> list[int]:
        if self._keywords is None and self.keyword_engine == "fts5":
            return await self._add_context(tenant, chat_id, message_ids, text, source)
        # With an index (or one that may begin: "auto"), no write goes between its count and rows.
        async with self._vectors_lock:
            return await self._add_context(tenant, chat_id, message_ids, text, source)

    async def _add_context(
        self, tenant: str, chat_id: str, message_ids: Sequence[str], text: str, source: tuple[str, str]
    ) -> list[int]:
        changes: int | None = None
        async with self.transaction() as db:
            docs = await self._write_context(
                db, [ContextWrite(tenant, chat_id, tuple(message_ids), text, source)]
            )
            # The tantivy index gets the rows as written, with the count this transaction reaches.
            changes = await self._keyword_changes() if docs and self._mirrored() else None
        if changes is not None:
            self._mirror_written(docs, changes)
        return [doc.id for doc in docs]

    async def _write_context(
        self, db: aiosqlite.Connection, writes: Sequence[ContextWrite]
    ) -> list[KeywordDoc]:
        """Context lines into the episodes they name, inside the caller's write transaction (read
        there too: no other write comes between the read and the rewrite of a row's context and
        meta); the keyword rows of the episodes changed."""
        targets = sorted({(w.tenant, w.chat_id, mid) for w in writes for mid in w.message_ids})
        rows: list[EpisodeContext] = []
        about: dict[int, tuple[str, str, str]] = {}  # kind, user, what the body's words are made of
        for begin in range(0, len(targets), CHUNK // 3):
            part = targets[begin : begin + CHUNK // 3]
            for found in await db.execute_fetchall(
                "SELECT m.id, m.kind, m.user_id, m.embed_text, m.text, m.context_text, m.meta, "
                f"s.tenant, s.chat_id, s.message_id FROM (VALUES {_row_marks(len(part))}) AS wanted "
                "JOIN memory_sources s ON s.is_episode = 1 AND s.tenant = wanted.column1 "
                "AND s.chat_id = wanted.column2 AND s.message_id = wanted.column3 "
                "JOIN memories m ON m.id = s.memory_id",
                [value for key in part for value in key],
            ):
                memory_id = int(found[0])
                meta = json.loads(found[6])
                rows.append(EpisodeContext(memory_id, found[7], found[8], found[9], found[5], meta))
                about[memory_id] = (found[1], found[2], found[3] or found[4])
        changed = with_context_writes(rows, writes)
        if not changed:
            return []
        mirrored = self._mirrored()
        docs = []
        for row in changed:
            kind, user_id, body = about[row.memory_id]
            owner = (user_token(row.tenant, user_id), chat_token(row.tenant, row.chat_id))
            # The body is what tantivy needs besides the context (MemoryRecord.index_text's words).
            words = fts_document(body) if mirrored else ""
            docs.append(KeywordDoc(row.memory_id, kind, owner, words, fts_document(row.context or "")))
        await db.executemany(
            "UPDATE memories SET context_text = ?, meta = ? WHERE id = ?",
            [
                (row.context, json.dumps(row.meta, ensure_ascii=False, sort_keys=True), row.memory_id)
                for row in changed
            ],
        )
        await db.executemany(
            "UPDATE memories_fts SET context = ? WHERE rowid = ?", [(d.context, d.id) for d in docs]
        )
        return docs

    async def from_messages(self, tenant: str, chat_id: str, message_ids: Sequence[str]) -> list[int]:
        rows = await self._sources("memory_id", "", tenant, chat_id, message_ids)
        return sorted({int(r[0]) for r in rows})

    async def delete(self, ids: Sequence[int], scope: Scope) -> int:
        async with self._vectors_lock:
            # Once begun, to its end: a caller cancelled after the commit (an MCP client's cancel
            # of a scene's forget) left the deleted rows' vectors in the index, and in its file.
            return await to_the_end(self._delete(ids, scope))

    async def _delete(self, ids: Sequence[int], scope: Scope) -> int:
        where, params = _scope_clause(scope, by_id=True)
        rows = [
            r
            for part in _chunks(list(ids))
            for r in await self._fetchall(
                f"SELECT id, tenant, user_id FROM memories WHERE id IN ({_marks(part)}) AND {where}",
                (*part, *params),
            )
        ]
        found = [r[0] for r in rows]
        if not found:
            return 0
        await self._write_many(
            [
                (f"DELETE FROM memories_fts WHERE rowid IN ({_marks(found)})", found),
                (f"DELETE FROM memories WHERE id IN ({_marks(found)})", found),
            ]
        )
        await self.index.remove(np.array(found, dtype=np.int64), {(r[1], r[2]) for r in rows})
        # The files lose the vectors with the next purge (purge_deleted: at most
        # purge_deleted_messages_after_s later, at a forget of a user or chat, at close; an open
        # after a crash drops them itself): a save rewrites every bucket written since the last,
        # which each deleted Discord message made a rewrite of nearly the whole index.
        self._index_save_owed = True
        if self._index_saving is None or self._index_saving.done():
            self._index_saving = asyncio.get_running_loop().create_task(self._save_deleted_later())
        await self._mirror_keywords(removed=found)
        return len(found)

    async def _save_deleted_later(self) -> None:
        await asyncio.sleep(self.deleted_vectors_kept_s)
        try:
            # To its end: a close that cancels this mid-save waits for the save, rather than
            # closing the database under it.
            await to_the_end(self._save_owed_index())
        except Exception:
            log.exception(
                "saving the vector index after deletes failed; tried again at the next purge or close"
            )

    async def set_importance(self, changes: Sequence[ImportanceChange], at: datetime) -> list[int]:
        written: list[int] = []
        if not changes:
            return written
        async with self.transaction() as db:
            for change in changes:
                # Compare and set on the importance read: a change made meanwhile wins.
                cursor = await db.execute(
                    "UPDATE memories SET importance = ?, reinforced_at = ?, current_importance = ? "
                    "WHERE id = ? AND (? IS NULL OR importance = ?)",
                    (
                        change.importance,
                        change.reinforced_at.isoformat(),
                        change.importance,
                        change.memory_id,
                        change.old,
                        change.old,
                    ),
                )
                if cursor.rowcount:
                    await db.execute(
                        HISTORY_INSERT,
                        (
                            change.memory_id,
                            at.isoformat(),
                            change.who,
                            change.why,
                            change.old,
                            change.importance,
                        ),
                    )
                    written.append(change.memory_id)
            await self._trim_history(db, written)
        return written

    async def _trim_history(self, db: Any, memory_ids: Sequence[int]) -> None:
        """Keep the newest ``history_kept`` history rows of each of ``memory_ids``, in the caller's
        transaction."""
        ids = sorted(set(memory_ids))
        if not self.history_kept or not ids:
            return
        for part in _chunks(ids):
            await db.execute(
                "DELETE FROM memory_history WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                "(PARTITION BY memory_id ORDER BY id DESC) AS newer FROM memory_history "
                f"WHERE memory_id IN ({_marks(part)})) WHERE newer > ?)",
                (*part, self.history_kept),
            )

    async def importance_states(
        self, after_id: int, limit: int, *, tenant: str | None = None
    ) -> list[tuple[int, float, datetime, float | None]]:
        only, values = ("AND tenant = ? ", (tenant,)) if tenant is not None else ("", ())
        rows = await self._fetchall(
            "SELECT id, importance, COALESCE(reinforced_at, created_at), current_importance FROM memories "
            f"WHERE id > ? {only}ORDER BY id LIMIT ?",
            (after_id, *values, limit),
        )
        return [(int(r[0]), float(r[1]), datetime.fromisoformat(r[2]), r[3]) for r in rows]

    async def set_current_importance(
        self,
        values: Sequence[tuple[int, float]],
        history: Sequence[HistoryRow],
        at: datetime,
    ) -> None:
        statements: list[tuple[str, Sequence[Any]]] = [
            ("UPDATE memories SET current_importance = ? WHERE id = ?", (value, memory_id))
            for memory_id, value in values
        ]
        statements.extend(
            (
                HISTORY_INSERT,
                (memory_id, at.isoformat(), who, why, old, new),
            )
            for memory_id, who, why, old, new in history
        )
        if not statements:
            return
        async with self.transaction() as db:
            for sql, group in itertools.groupby(statements, key=lambda statement: statement[0]):
                await db.executemany(sql, [params for _, params in group])
            await self._trim_history(db, [row[0] for row in history])

    async def set_decayed_importance(self, values: Sequence[DecayedImportance], at: datetime) -> list[int]:
        written: list[int] = []
        if not values:
            return written
        async with self.transaction() as db:
            for part in _chunks(list(values)):
                async with db.execute(
                    f"WITH read (id, value, importance, cached) AS (VALUES {_value_marks(len(part), 4)}) "
                    "UPDATE memories SET current_importance = read.value FROM read "
                    "WHERE memories.id = read.id AND memories.importance = read.importance "
                    "AND memories.current_importance IS read.cached RETURNING memories.id",
                    [x for d in part for x in (d.memory_id, d.value, d.importance, d.cached)],
                ) as cursor:
                    ids = {int(row[0]) for row in await cursor.fetchall()}
                history = [
                    (d.memory_id, at.isoformat(), *d.history, d.cached, d.value)
                    for d in part
                    if d.history is not None and d.memory_id in ids
                ]
                if history:
                    await db.executemany(HISTORY_INSERT, history)
                    await self._trim_history(db, [row[0] for row in history])
                written.extend(d.memory_id for d in part if d.memory_id in ids)
        return written

    async def history(self, memory_id: int) -> list[dict[str, Any]]:
        rows = await self._fetchall(
            "SELECT at, who, why, old, new FROM memory_history WHERE memory_id = ? ORDER BY id", (memory_id,)
        )
        return [{"at": r[0], "who": r[1], "why": r[2], "old": r[3], "new": r[4]} for r in rows]

    async def histories(
        self, first_id: int, last_id: int, *, tenant: str | None = None, user_id: str | None = None
    ) -> dict[int, list[dict[str, Any]]]:
        if tenant is None:
            if user_id is not None:
                raise StoreError("a user's histories need their tenant")
            rows = await self._fetchall(
                "SELECT memory_id, at, who, why, old, new FROM memory_history "
                "WHERE memory_id BETWEEN ? AND ? ORDER BY memory_id, id",
                (first_id, last_id),
            )
        else:
            person = "" if user_id is None else " AND m.user_id = ?"
            rows = await self._fetchall(
                "SELECT h.memory_id, h.at, h.who, h.why, h.old, h.new FROM memory_history h "
                "JOIN memories m ON m.id = h.memory_id WHERE h.memory_id BETWEEN ? AND ? AND m.tenant = ?"
                f"{person} ORDER BY h.memory_id, h.id",
                (first_id, last_id, tenant, *([] if user_id is None else [user_id])),
            )
        found: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            found.setdefault(int(r[0]), []).append(
                {"at": r[1], "who": r[2], "why": r[3], "old": r[4], "new": r[5]}
            )
        return found

    async def count_below(self, threshold: float) -> int:
        [(count,)] = await self._fetchall(
            "SELECT COUNT(*) FROM memories WHERE current_importance IS NOT NULL AND current_importance < ?",
            (threshold,),
        )
        return int(count)

    async def state_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        rows = await self._lookup(
            "SELECT value FROM plugin_state WHERE namespace = ? AND key = ?", (namespace, key), 1
        )
        return dict(json.loads(rows[0][0])) if rows else None

    async def state_put(self, namespace: str, key: str, value: dict[str, Any]) -> None:
        await self._write(STATE_PUT, _state_row((namespace, key, value)))

    async def state_by_prefix(self, key_prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
        # By the primary key, a namespace at a time: a range read each, not the whole table.
        # Compared in Python too, as state_delete does (SQLite's string functions stop at a NUL).
        end = prefix_end(key_prefix)
        bounded = "" if end is None else " AND key < ?"
        found: list[tuple[str, str, dict[str, Any]]] = []
        for (namespace,) in await self._fetchall("SELECT DISTINCT namespace FROM plugin_state"):
            params = (namespace, key_prefix) if end is None else (namespace, key_prefix, end)
            rows = await self._fetchall(
                f"SELECT key, value FROM plugin_state WHERE namespace = ? AND key >= ?{bounded} ORDER BY key",
                params,
            )
            found += [
                (str(namespace), str(key), dict(json.loads(value)))
                for key, value in rows
                if str(key).startswith(key_prefix)
            ]
        return found

    async def state_items(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        rows = await self._fetchall(
            "SELECT key, value FROM plugin_state WHERE namespace = ? ORDER BY key", (namespace,)
        )
        return [(str(key), dict(json.loads(value))) for key, value in rows]

    async def state_put_if(
        self, namespace: str, key: str, value: dict[str, Any], expected: dict[str, Any] | None
    ) -> bool:
        async with self.transaction() as db:
            async with db.execute(
                "SELECT value FROM plugin_state WHERE namespace = ? AND key = ?", (namespace, key)
            ) as cur:
                row = await cur.fetchone()
            if (None if row is None else json.loads(row[0])) != expected:
                return False
            await db.execute(
                "INSERT INTO plugin_state (namespace, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value",
                (namespace, key, json.dumps(value, ensure_ascii=False, sort_keys=True)),
            )
        return True

    async def state_delete_if(self, namespace: str, key: str, expected: dict[str, Any]) -> bool:
        async with self.transaction() as db:
            async with db.execute(
                "SELECT value FROM plugin_state WHERE namespace = ? AND key = ?", (namespace, key)
            ) as cur:
                row = await cur.fetchone()
            if row is None or json.loads(row[0]) != expected:
                return False
            await db.execute("DELETE FROM plugin_state WHERE namespace = ? AND key = ?", (namespace, key))
        return True

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[bool]:
        """The folder lock already keeps other processes out; inside this one, a job runs once at
        a time."""
        lock = self._jobs.setdefault(name, asyncio.Lock())
        if lock.locked():
            yield False
            return
        async with lock:
            yield True

    async def dump_rows(
        self, table: str, after: int = 0, limit: int = 1000, *, after_key: tuple[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Rows of a side table (``memory_history``, ``plugin_state``, ``forget_jobs``) for migration,
        in key order; ``after`` is the last id seen (an offset for ``plugin_state``, where
        ``after_key``, the last (namespace, key) seen, pages without missing a row when rows
        before it come and go meanwhile, as a working memory's inbox rows do)."""
        if table == "plugin_state" and after_key is not None:
            sql = (
                "SELECT namespace, key, value FROM plugin_state WHERE (namespace, key) > (?, ?) "
                "ORDER BY namespace, key LIMIT ?"
            )
            params: tuple[Any, ...] = (*after_key, limit)
        elif table == "plugin_state":
            sql = "SELECT namespace, key, value FROM plugin_state ORDER BY namespace, key LIMIT ? OFFSET ?"
            params = (limit, after)
        elif table in ("memory_history", "forget_jobs"):
            sql, params = f"SELECT * FROM {table} WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
        else:
            raise StoreError(f"no side table named {table!r}")
        async with self.reading.execute(sql, params) as cur:
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]

    async def load_rows(self, table: str, rows: Sequence[dict[str, Any]]) -> int:
        """Write migrated side-table rows keeping their keys; rows already there are skipped."""
        if table not in ("memory_history", "plugin_state", "forget_jobs"):
            raise StoreError(f"no side table named {table!r}")
        if not rows:
            return 0
        columns = list(rows[0])
        async with self.transaction() as db:
            before = db.total_changes
            await db.executemany(
                f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)})",
                [tuple(row[c] for c in columns) for row in rows],
            )
            return int(db.total_changes - before)

    async def table_counts(self) -> dict[str, int]:
        """Rows per table, for checking a migration."""
        counts: dict[str, int] = {}
        for table in ("memories", "memory_sources", "memory_history", "plugin_state", "forget_jobs"):
            [(counts[table],)] = await self._fetchall(f"SELECT COUNT(*) FROM {table}")
        [(counts["vectors"],)] = await self._fetchall(
            "SELECT COUNT(*) FROM memories WHERE vector IS NOT NULL"
        )
        return counts

    async def state_delete(self, namespace: str, key_prefix: str) -> int:
        # Compared in Python: SQLite's substr() and length() stop at a NUL character, and keys join
        # their parts with it (proactive's do), so a prefix match in SQL deleted nothing. Read
        # between bounds: unbounded above, deleting N keys one by one read N²/2 rows.
        end = prefix_end(key_prefix)
        bounded = "" if end is None else " AND key < ?"
        params = (namespace, key_prefix) if end is None else (namespace, key_prefix, end)
        rows = [
            r
            for r in await self._fetchall(
                f"SELECT key FROM plugin_state WHERE namespace = ? AND key >= ?{bounded}", params
            )
            if r[0].startswith(key_prefix)
        ]
        if rows:
            await self._write_many(
                [
                    ("DELETE FROM plugin_state WHERE namespace = ? AND key = ?", (namespace, r[0]))
                    for r in rows
                ]
            )
        return len(rows)

    async def forget(self, *, tenant: str, user_id: str | None, chat_id: str | None) -> dict[str, int]:
        async with self._vectors_lock:
            return await to_the_end(self._forget(tenant, user_id, chat_id))

    async def _forget(self, tenant: str, user_id: str | None, chat_id: str | None) -> dict[str, int]:
        where, params = _scope_clause(Scope(tenant=tenant, user_id=user_id, chat_id=chat_id))
        db = self.db
        async with self.transaction():
            rows = await self._fetchall(
                f"SELECT id, kind, tenant, user_id FROM memories WHERE {where}", params
            )
            ids = [r[0] for r in rows]
            fts_rows = 0
            for part in _chunks(ids):
                cur = await db.execute(f"DELETE FROM memories_fts WHERE rowid IN ({_marks(part)})", part)
                fts_rows += cur.rowcount
                await db.execute(f"DELETE FROM memories WHERE id IN ({_marks(part)})", part)
        vectors = await self.index.remove(np.array(ids, dtype=np.int64), {(r[2], r[3]) for r in rows})
        if ids:
            await self._save_index()  # a forgotten vector must not survive in the file either
            await self._mirror_keywords(removed=ids)
        by_kind: dict[str, int] = {}
        for _, kind, _, _ in rows:
            by_kind[kind] = by_kind.get(kind, 0) + 1
        return {"memories": len(ids), "keyword_rows": fts_rows, "vectors": vectors, **by_kind}

    # --- forgetting as a durable job ---------------------------------------------------------

    async def scope_sources(self, scope: Scope) -> list[tuple[str, str]]:
        where, params = _scope_clause(scope, alias="m")
        rows: list[tuple[str, str]] = await self._fetchall(SOURCES_IN_SCOPE.format(where=where), params)
        return rows

    async def write_forget(self, job: ForgetJob) -> int:
        async with self.transaction() as db:
            cur = await db.execute(
                f"INSERT INTO forget_jobs ({FORGET_JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                forget_job_row(job, self.clock),
            )
            job_id = int(cur.lastrowid or 0)
            self._changes_at_forget[job_id] = await self._total_changes(db)
            return job_id

    async def _total_changes(self, db: aiosqlite.Connection) -> int:
        """Rows the write connection has inserted, changed or deleted since it opened."""
        [(count,)] = await db.execute_fetchall("SELECT total_changes()")
        return int(count)

    async def pending_forgets(self) -> list[ForgetJob]:
        """Forgets that a crash interrupted, oldest first."""
        rows = await self._fetchall(
            "SELECT id, tenant, user_id, chat_id, messages, sources FROM forget_jobs ORDER BY id"
        )
        return [ForgetJob.from_row(r) for r in rows]

    async def forgets_begun(self) -> int:
        """The last forget job id given out (``AUTOINCREMENT`` never gives one twice, even after
        the job's row is deleted)."""
        rows = await self._fetchall("SELECT seq FROM sqlite_sequence WHERE name = 'forget_jobs'")
        return int(rows[0][0]) if rows else 0

    async def finish_forget(self, job: ForgetJob, *, purge: bool = True) -> None:
        """Leave no byte of what the job deleted in the files: the keyword index merged into fresh
        segments (an FTS5 delete only adds a tombstone beside the old terms), the database file
        rewritten, the write-ahead log emptied into it; then mark the job done. In that order: a
        crash between the two repeats the purge on the next open (it is idempotent), while the
        other order would leave the terms behind with no job to finish."""
        begun = self._changes_at_forget.pop(job.id, None)
        if purge and begun is not None and await self._total_changes(self.db) == begun:
            # Nothing was written since the job was (not a row deleted, nor scrubbed, by the store
            # or a plugin): nothing of it to overwrite. A second forgetme, or a person forgotten
            # in each of a bot's 300 servers, rebuilt the keyword index and rewrote the whole file
            # each time (40 s a forget at a million memories). Unless another job is pending: an
            # interrupted one is finished by a job of its own, which finds its rows gone already
            # but not their bytes.
            others = await self._fetchall("SELECT 1 FROM forget_jobs WHERE id != ? LIMIT 1", (job.id,))
            purge = bool(others)
        if purge:
            await self.purge_deleted()
        await self._write("DELETE FROM forget_jobs WHERE id = ?", (job.id,))
        if purge:
            async with self._holding_writer():
                await self._truncate_log()

    async def _truncate_log(self) -> None:
        """Empty the write-ahead log into the database file and truncate it (what a forget deleted
        is in the log's earlier frames), the writer held. A reader in a transaction (an export's
        snapshot, a read-only process) keeps the frames after its state: the truncation then
        waits :data:`LOG_WAIT_MS`, not the writers' whole busy timeout (twice, in the write
        turn, every worker's writes held), and is tried again in the background until it is
        done, at the close, and at the next writable open. Before, it gave up silently after the
        wait, and the forgotten words stayed in the log until a close found no reader."""
        if self._log_owed is not None:
            return  # tried again already: its truncation empties all of the log
        if not await self._log_truncated():
            log.info("a reader holds the log back: its truncation is tried again every %s s", LOG_RETRY_S)
            self._log_owed = asyncio.get_running_loop().create_task(self._truncate_log_later())

    async def _log_truncated(self) -> bool:
        """One try, on the write connection (the caller holds it)."""
        db = self.db
        await db.execute(f"PRAGMA busy_timeout={LOG_WAIT_MS}")
        try:
            rows = list(await db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)"))
        finally:
            await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        return not rows or int(rows[0][0]) == 0  # its first column: 1 when a reader blocked it

    async def _truncate_log_later(self) -> None:
        try:
            while True:
                await asyncio.sleep(LOG_RETRY_S)
                try:
                    async with self._holding_writer():
                        if await self._log_truncated():
                            return
                except (ClosedError, StoreError):
                    return  # closed: the next open truncates it
                except Exception:
                    log.exception("truncating the log failed; tried again")
        finally:
            self._log_owed = None

    async def _save_owed_index(self) -> None:
        """Save the index if deleted rows' vectors are still in its files."""
        if self._index_save_owed and self._index is not None:
            async with self._vectors_lock:
                if not self._index_save_owed:  # saved by another call meanwhile
                    return
                self._index_save_owed = False
                try:
                    await self._save_index()
                except BaseException:
                    self._index_save_owed = True
                    raise

    async def purge_deleted(self) -> None:
        """Overwrite what deletions left in the files (see :meth:`finish_forget`)."""
        await self.purge_alongside_writes()
        await self.purge_in_turn()

    async def purge_alongside_writes(self) -> None:
        """The tantivy index rebuilt without the rows deleted so far, with writes going on."""
        if self._keywords is not None:
            await self._rebuild_keywords()

    async def purge_in_turn(self) -> None:
        """The vector index's files, FTS5 and the database file, purged of deleted rows."""
        await self._save_owed_index()
        async with self._holding_writer():
            # Rebuilt from its own content, not merged ('optimize'): each optimize put the merged
            # segment one level higher, and past 2,000 levels (after about as many forgets) FTS5
            # took its own structure for corrupt: "database disk image is malformed" on every
            # write, and the table could no longer be opened. A rebuild starts from one level.
            await self.db.execute("INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')")
            # secure_delete zeroes the cells a delete frees, but when a b-tree page is rebuilt
            # (rebalancing, or the merge above) the unused gap between its cell pointers and its
            # cells keeps stale bytes of cells moved to other pages, which a later delete does not
            # reach: a forgotten user's words were found there after a forget. Only rewriting the
            # file leaves no such copy; it costs time in proportion to the store (see the README).
            if self.rewrite_on_forget:
                await self.db.execute("VACUUM")
            else:
                # Both pragmas work one row (one page) per step: read them to the end.
                await self._fetchall("PRAGMA incremental_vacuum")
            await self._truncate_log()

    async def import_records(self, items: Sequence[tuple[MemoryRecord, np.ndarray]]) -> dict[str, int]:
        async with self._vectors_lock:
            # Rows committed without their vectors were memories no vector search found.
            return await to_the_end(self._import(items))

    async def _import(self, items: Sequence[tuple[MemoryRecord, np.ndarray]]) -> dict[str, int]:
        added: list[tuple[int, np.ndarray, Owner]] = []
        skipped = 0
        async with self.transaction() as db:
            # A record that keeps its id may be stored already (an import run twice): the same
            # record is skipped, another under its id is an error.
            known = await self.get([r.id for r, _ in items if r.id is not None], None)
            taken: list[tuple[MemoryRecord, np.ndarray]] = []
            for record, vector in items:
                if record.id is not None:
                    stored = known.get(record.id)
                    if stored is not None:
                        if stored.model_dump() != record.model_dump():
                            raise StoreError(f"record {record.id} is already stored with other content")
                        skipped += 1
                        continue
                    known[record.id] = record  # the same id later in the call is this record
                taken.append((record, vector))
            docs = await self._insert_many(db, [(r, v, r.id) for r, v in taken]) if taken else []
            for (record, vector), doc in zip(taken, docs, strict=True):
                added.append((doc.id, vector, _owner(record)))
        if added:
            await self.index.add(
                np.array([a[0] for a in added]), np.vstack([a[1] for a in added]), [a[2] for a in added]
            )
            await self._mirror_keywords(added=[a[0] for a in added])
            self._keywords_when_large([a[2] for a in added])
        return {"imported": len(added), "skipped": skipped}

    # --- reading --------------------------------------------------------------------------

    async def search_vectors(
        self, scope: Scope, vector: np.ndarray, k: int, *, kinds: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        if self.read_only:
            await self._catch_up()
        allowed = None
        if kinds:
            where, params = _scope_clause(scope)
            rows = await self._fetchall(
                f"SELECT id FROM memories WHERE {where} AND kind IN ({_marks(kinds)})", (*params, *kinds)
            )
            allowed = np.array([r[0] for r in rows], dtype=np.int64)
            if not len(allowed):
                return []
        found: list[tuple[int, float]] = await self.index.search(
            vector, k, tenant=scope.tenant, user_id=scope.user_id, chat_id=scope.chat_id, allowed=allowed
        )
        if self.read_only:
            # A row the writer committed while this reader's open caught its index files up can
            # be added again by the first catch-up: each memory once, at its best.
            once: dict[int, float] = {}
            for memory_id, score in found:  # best first
                once.setdefault(memory_id, score)
            found = list(once.items())
        return found

    async def search_keywords(
        self,
        scope: Scope,
        query: str,
        k: int,
        *,
        context_weight: float = CONTEXT_WEIGHT,
        kinds: Sequence[str] | None = None,
    ) -> list[tuple[int, float]]:
        keywords = self._keywords
        if (
            keywords is not None
            and keywords.changes is not None
            and abs(context_weight - CONTEXT_WEIGHT) <= CONTEXT_WEIGHT_TOLERANCE
            and _scope_tokens(scope)
        ):
            found = await self._search_tantivy(keywords, scope, query, k, kinds)
            if found is not None:
                return found
        match = fts_query(query)
        if not match:
            return []
        where, params = _scope_clause(scope, alias="m")
        if kinds:
            where += f" AND m.kind IN ({_marks(kinds)})"
            params = (*params, *kinds)
        tokens = [f'owner:"{token}"' for token in _scope_tokens(scope)]
        weight, full_match = float(context_weight), f"{' AND '.join(tokens)} AND ({match})"
        if kinds:
            # The kind is not in the keyword index: each match is checked against its row.
            rows = await self._fetchall(
                "SELECT m.id, bm25(memories_fts, 1.0, ?, 0.0) AS rank FROM memories_fts "
                "JOIN memories m ON m.id = memories_fts.rowid "
                f"WHERE memories_fts MATCH ? AND {where} ORDER BY rank LIMIT ?",
                (weight, full_match, *params, k),
            )
        else:
            # The scope tokens already keep the matches inside the scope, so the ranking runs in
            # FTS5 alone and only the top k rows are read (a heavy user's broad query matches tens
            # of thousands); the scope columns are still checked on them, the hard guarantee.
            rows = await self._fetchall(
                "SELECT m.id, f.rank FROM (SELECT rowid, bm25(memories_fts, 1.0, ?, 0.0) AS rank "
                "FROM memories_fts WHERE memories_fts MATCH ? ORDER BY rank LIMIT ?) f "
                f"JOIN memories m ON m.id = f.rowid WHERE {where} ORDER BY f.rank",
                (weight, full_match, k, *params),
            )
        return [(int(r[0]), -float(r[1])) for r in rows]

    async def _search_tantivy(
        self,
        keywords: TantivyKeywords,
        scope: Scope,
        query: str,
        k: int,
        kinds: Sequence[str] | None,
    ) -> list[tuple[int, float]] | None:
        hits = await keywords.search(_scope_tokens(scope), query_terms(query), k, kinds=kinds)
        if not hits:
            return hits
        # The index's scope tokens only speed up; the rows' own scope columns decide.
        where, params = _scope_clause(scope, by_id=True)
        if kinds:
            where += f" AND kind IN ({_marks(kinds)})"
            params = (*params, *kinds)
        ids = [memory_id for memory_id, _ in hits]
        rows = await self._lookup(
            f"SELECT id FROM memories WHERE id IN ({_marks(ids)}) AND {where}", (*ids, *params), len(ids)
        )
        kept = {int(r[0]) for r in rows}
        return [(memory_id, score) for memory_id, score in hits if memory_id in kept]

    async def get(self, ids: Sequence[int], scope: Scope | None) -> dict[int, MemoryRecord]:
        out: dict[int, MemoryRecord] = {}
        where, params = _scope_clause(scope, by_id=True) if scope is not None else ("1", ())
        for part in _chunks(list(ids)):
            rows = await self._lookup(
                f"SELECT {COLUMNS} FROM memories WHERE id IN ({_marks(part)}) AND {where}",
                (*part, *params),
                len(part),
            )
            for row in rows:
                out[row[0]] = _record(row)
        return out

    async def get_with_vectors(
        self, ids: Sequence[int], scope: Scope
    ) -> tuple[dict[int, MemoryRecord], dict[int, np.ndarray]]:
        where, params = _scope_clause(scope, by_id=True)
        records: dict[int, MemoryRecord] = {}
        vectors: dict[int, np.ndarray] = {}
        for part in _chunks(list(ids)):
            rows = await self._lookup(
                f"SELECT {COLUMNS}, vector FROM memories WHERE id IN ({_marks(part)}) AND {where}",
                (*part, *params),
                len(part),
            )
            for row in rows:
                records[row[0]] = _record(row)
                if row[-1] is not None:
                    vectors[row[0]] = _vector(row[-1], self.dim)
        return records, vectors

    async def vectors(self, ids: Sequence[int], scope: Scope) -> dict[int, np.ndarray]:
        where, params = _scope_clause(scope, by_id=True)
        out: dict[int, np.ndarray] = {}
        for part in _chunks(list(ids)):
            rows = await self._lookup(
                f"SELECT id, vector FROM memories WHERE id IN ({_marks(part)}) AND {where} "
                "AND vector IS NOT NULL",
                (*part, *params),
                len(part),
            )
            out.update((int(r[0]), _vector(r[1], self.dim)) for r in rows)
        return out

    async def export(self, tenant: str | None = None) -> AsyncIterator[tuple[MemoryRecord, np.ndarray]]:
        last = 0
        where, values = ("tenant = ? AND ", (tenant,)) if tenant is not None else ("", ())
        while True:
            rows = await self._fetchall(
                f"SELECT {COLUMNS}, vector FROM memories WHERE {where}id > ? ORDER BY id LIMIT 1000",
                (*values, last),
            )
            if not rows:
                return
            for row in rows:
                yield _record(row[:-1]), _vector(row[-1], self.dim)
            last = rows[-1][0]

    async def stats(self) -> dict[str, Any]:
        kinds = dict(await self._fetchall("SELECT kind, COUNT(*) FROM memories GROUP BY kind ORDER BY kind"))
        # Each count reads an index, not the rows (vector and text: the whole database): the
        # users' and the chats' scope indexes, the decay pass's for the kinds above.
        [(users, chats, tenants)] = await self._fetchall(
            "SELECT (SELECT COUNT(*) FROM (SELECT DISTINCT tenant, user_id FROM memories)), "
            "(SELECT COUNT(*) FROM (SELECT DISTINCT tenant, chat_id FROM memories)), "
            "(SELECT COUNT(*) FROM (SELECT DISTINCT tenant FROM memories))"
        )
        return {
            "memories": sum(kinds.values()),
            "by_kind": kinds,
            "users": users,
            "chats": chats,
            "tenants": tenants,
            "vectors_indexed": self.index.size,
            **self.index.describe(),
            "schema_version": SCHEMA_VERSION,
            "database": str(self.db_path),
            "database_bytes": _size(self.db_path) + _size(Path(str(self.db_path) + "-wal")),
            "index_bytes": _folder_size(self.index_path),
            "keyword_search": self._keyword_search(),
        }

    def _keyword_search(self) -> str:
        """What keyword searches run on now: "tantivy", "fts5", or "fts5 (tantivy building)"; a
        reader beside the writer says what the writer keeps too."""
        if self.read_only and (self.folder / KEYWORDS_FOLDER).is_dir():
            return "fts5 (read-only; the writer keeps tantivy)"
        if self._keywords is not None and self._keywords.changes is not None:
            return "tantivy"
        if (self._keywords_starting is not None and not self._keywords_starting.done()) or (
            self._keywords is not None and self._keywords.rebuilding
        ):
            return "fts5 (tantivy building)"
        return "fts5"

    async def users(
        self, tenant: str | None, *, limit: int = 1000, after: str | None = None
    ) -> list[dict[str, Any]]:
        where, params = ("WHERE tenant = ?", [tenant]) if tenant is not None else ("", [])
        if after is not None:
            if tenant is None:
                raise InputError("pages through one tenant's users: give a tenant", field="after")
            where, params = "WHERE tenant = ? AND user_id > ?", [tenant, after]
        rows = await self._fetchall(
            "SELECT tenant, user_id, COUNT(*), SUM(kind = 'scene'), COUNT(DISTINCT chat_id), "
            f"MIN(created_ts), MAX(created_ts) FROM memories {where} "
            "GROUP BY tenant, user_id ORDER BY tenant, user_id LIMIT ?",
            [*params, limit],
        )
        return [
            {
                "tenant": t,
                "user_id": u,
                "memories": n,
                "scenes": scenes,
                "chats": chats,
                "first_at": datetime.fromtimestamp(first, UTC).isoformat(),
                "last_at": datetime.fromtimestamp(last, UTC).isoformat(),
            }
            for t, u, n, scenes, chats, first, last in rows
        ]

    async def tenants(self) -> list[str]:
        rows = await self._fetchall("SELECT DISTINCT tenant FROM memories ORDER BY tenant")
        return [str(r[0]) for r in rows]

    async def inactive_people(
        self,
        before: datetime,
        *,
        tenant: str | None = None,
        limit: int = 1000,
        after: tuple[str, str] | None = None,
    ) -> list[InactivePerson]:
        where, params = [], []
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        if after is not None:
            where.append("(tenant, user_id) > (?, ?)")
            params.extend(after)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        # The scope index holds every column read: a pass over it, never over the rows' text.
        rows = await self._fetchall(
            f"SELECT tenant, user_id, COUNT(*), MAX(created_ts) FROM memories {clause}"
            "GROUP BY tenant, user_id HAVING MAX(created_ts) < ? ORDER BY tenant, user_id LIMIT ?",
            [*params, before.timestamp(), limit],
        )
        return [InactivePerson(t, u, n, datetime.fromtimestamp(last, UTC)) for t, u, n, last in rows]

    async def last_said(
        self, tenant: str | None = None, user_id: str | None = None, *, until: datetime | None = None
    ) -> datetime | None:
        if user_id is not None and tenant is None:
            raise InputError("a person is found within a tenant: give a tenant", field="tenant")
        where, params = "", list[str | float | None]()
        if tenant is not None:
            where, params = "WHERE tenant = ?", [tenant]
        if user_id is not None:
            where, params = "WHERE tenant = ? AND user_id = ?", [tenant, user_id]
        if until is not None:
            where = f"{where} AND created_ts < ?" if where else "WHERE created_ts < ?"
            params.append(until.timestamp())
        rows = await self._fetchall(f"SELECT MAX(created_ts) FROM memories {where}", params)
        last = rows[0][0] if rows else None
        return None if last is None else datetime.fromtimestamp(last, UTC)

    async def user_tenants(self, user_ids: Sequence[str]) -> list[str]:
        ids = list(dict.fromkeys(user_ids))
        if not ids:
            return []
        rows = await self._fetchall(
            "WITH RECURSIVE t(tenant) AS (SELECT MIN(tenant) FROM memories UNION ALL "
            "SELECT (SELECT MIN(tenant) FROM memories WHERE tenant > t.tenant) FROM t "
            "WHERE t.tenant IS NOT NULL) "
            "SELECT tenant FROM t WHERE tenant IS NOT NULL AND EXISTS (SELECT 1 FROM memories m "
            f"WHERE m.tenant = t.tenant AND m.user_id IN ({_marks(ids)})) ORDER BY tenant",
            ids,
        )
        return [str(r[0]) for r in rows]

    async def _vector_ids(self) -> np.ndarray:
        rows = await self._fetchall("SELECT id FROM memories WHERE vector IS NOT NULL ORDER BY id")
        return np.array([r[0] for r in rows], dtype=np.int64)

    async def _lookup(self, sql: str, params: Sequence[Any], ids: int) -> list[Any]:
        """A read of at most ``ids`` rows by an indexed key (memories' ids, messages' provenance, a
        plugin's state key, a scope's newest rows): on this thread when it is small and the task
        does not hold the writer (whose reads must see what it is writing), else as any read.
        Either connection sees exactly what is committed."""
        lookups = self._lookups
        if lookups is not None and ids <= INLINE_IDS and self._writer_holder is not asyncio.current_task():
            try:
                return lookups.execute(sql, params).fetchall()
            except sqlite3.OperationalError:
                pass  # the database is locked for a moment (a checkpoint): the reader's thread waits
        return await self._fetchall(sql, params)

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        # One trip to the connection's thread (execute, fetch and close there), not three.
        return list(await self.reading.execute_fetchall(sql, params))

    async def _write_many(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """One transaction; runs of the same statement go as one ``executemany`` (one hop to the
        database thread instead of one per row)."""
        db = self.db
        async with self.transaction():
            for sql, group in itertools.groupby(statements, key=lambda statement: statement[0]):
                await db.executemany(sql, [params for _, params in group])

    async def _write(self, sql: str, params: Any, *, many: bool = False) -> None:
        db = self.db
        async with self.transaction():
            if many:
                await db.executemany(sql, params)
            else:
                await db.execute(sql, params)


HISTORY_INSERT = "INSERT INTO memory_history (memory_id, at, who, why, old, new) VALUES (?, ?, ?, ?, ?, ?)"
STATE_PUT = (
    "INSERT INTO plugin_state (namespace, key, value) VALUES (?, ?, ?) "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value"
)


def _state_row(entry: StateEntry) -> tuple[str, str, str]:
    namespace, key, value = entry
    return namespace, key, json.dumps(value, ensure_ascii=False, sort_keys=True)


def user_token(tenant: str, user_id: str) -> str:
    """The keyword index's token for a user (hex keeps any id one token; ``x`` separates)."""
    return f"u{tenant.encode().hex()}x{user_id.encode().hex()}"


def chat_token(tenant: str, chat_id: str) -> str:
    return f"c{tenant.encode().hex()}x{chat_id.encode().hex()}"


def query_terms(query: str) -> list[str]:
    """The query's distinct content words, in order."""
    terms: list[str] = []
    for term in keyword_terms(query):
        if term in STOPWORDS or term in terms:
            continue
        terms.append(term)
    return terms


def fts_query(query: str) -> str:
    """An FTS5 OR-query of the query's distinct content words (each quoted, so no syntax leaks in)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in query_terms(query))


def _row_values(record: MemoryRecord, vector: np.ndarray | None) -> tuple[Any, ...]:
    """A record's ``memories`` columns, in the order the inserts name them (the id last, apart)."""
    blob = None if vector is None else _blob(vector)
    return (
        record.kind,
        record.tenant,
        record.user_id,
        record.chat_id,
        record.speaker,
        record.text,
        record.embed_text,
        record.importance,
        record.created_at.isoformat(),
        record.created_at.timestamp(),
        record.stored_at.isoformat() if record.stored_at else None,
        json.dumps(record.message_ids, ensure_ascii=False),
        json.dumps(record.meta, ensure_ascii=False, sort_keys=True),
        blob,
        record.context_text,
        record.reinforced_at.isoformat() if record.reinforced_at else None,
    )


def _documents_again(batch: Sequence[Sequence[Any]]) -> list[tuple[str, Sequence[Any]]]:
    """The updates of ``memories_fts`` for rows (id, index text, context, its body and context
    now) whose documents the words found now change."""
    statements: list[tuple[str, Sequence[Any]]] = []
    for memory_id, body, context, old_body, old_context in batch:
        if str(body).isascii() and str(context or "").isascii():
            continue  # an ASCII text's words are what they were
        words = (fts_document(str(body)), fts_document(str(context or "")))
        if words != (old_body, old_context):
            statements.append(
                ("UPDATE memories_fts SET body = ?, context = ? WHERE rowid = ?", (*words, memory_id))
            )
    return statements


def _keyword_doc(record: MemoryRecord, memory_id: int) -> KeywordDoc:
    """A record's row in the keyword indexes (FTS5's ``memories_fts`` and tantivy's)."""
    return KeywordDoc(
        memory_id,
        record.kind,
        (user_token(record.tenant, record.user_id), chat_token(record.tenant, record.chat_id)),
        fts_document(record.index_text),
        fts_document(record.context_text or ""),
    )


def _scope_tokens(scope: Scope) -> list[str]:
    """The keyword index's tokens a row in ``scope`` carries (none for a whole tenant)."""
    tokens = []
    if scope.user_id is not None:
        tokens.append(user_token(scope.tenant, scope.user_id))
    if scope.chat_id is not None:
        tokens.append(chat_token(scope.tenant, scope.chat_id))
    return tokens


def _scope_clause(scope: Scope, alias: str = "", *, by_id: bool = False) -> tuple[str, tuple[str, ...]]:
    """The SQL that keeps a query inside ``scope``. ``by_id``: the query names its rows by id, so
    the scope columns must not drive the plan (a unary ``+`` keeps SQLite on the primary key
    instead of walking every row of a large user)."""
    prefix = ("+" if by_id else "") + (f"{alias}." if alias else "")
    clauses, params = [f"{prefix}tenant = ?"], [scope.tenant]
    if scope.user_id is not None:
        clauses.append(f"{prefix}user_id = ?")
        params.append(scope.user_id)
    if scope.chat_id is not None:
        clauses.append(f"{prefix}chat_id = ?")
        params.append(scope.chat_id)
    return " AND ".join(clauses), tuple(params)


def _record(row: Sequence[Any]) -> MemoryRecord:
    # Every row was validated as a MemoryRecord on its way in; validating it again on each read
    # was most of the cost of a recall, and model_construct's defaulting most of what was left.
    return MemoryRecord.trusted(
        id=row[0],
        kind=row[1],
        tenant=row[2],
        user_id=row[3],
        chat_id=row[4],
        speaker=row[5],
        text=row[6],
        embed_text=row[7],
        importance=row[8],
        created_at=datetime.fromisoformat(row[9]),
        stored_at=datetime.fromisoformat(row[10]) if row[10] else None,
        message_ids=jsonio.loads(row[11]),
        meta=jsonio.loads(row[12]),
        context_text=row[13],
        reinforced_at=datetime.fromisoformat(row[14]) if row[14] else None,
    )


def _vector(blob: bytes, dim: int) -> np.ndarray:
    vector = np.frombuffer(blob, dtype=np.float32)
    if vector.shape != (dim,):
        raise StoreError(f"a stored vector has {vector.size} dimensions, expected {dim}")
    return vector


def _while_open(part: T | None) -> T:
    """A part of the store that exists only between ``open`` and ``close``."""
    if part is None:
        raise StoreError("the store is not open")
    return part


async def _roll_back(db: aiosqlite.Connection) -> None:
    """End whatever transaction the connection has open. A statement whose caller was cancelled
    still runs on the connection's thread: a BEGIN may have begun (and would leave every later
    write "within a transaction"), a COMMIT may have committed; the ROLLBACK queued behind it finds
    which."""
    try:
        await db.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        if "no transaction is active" not in str(exc):
            raise


def _chunks(items: list[Any]) -> list[list[Any]]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]


def _marks(items: Sequence[Any]) -> str:
    return ", ".join("?" * len(items))


def _value_marks(rows: int, columns: int) -> str:
    """Placeholders of a ``VALUES`` list of ``rows`` rows of ``columns`` values."""
    row = "(" + ", ".join("?" * columns) + ")"
    return ", ".join([row] * rows)


def _row_marks(rows: int) -> str:
    """Placeholders of ``rows`` (tenant, chat, message) rows of a ``VALUES`` list: joined to
    ``memory_sources`` on its unique episode index, many chats' messages are one query."""
    return _value_marks(rows, 3)


def _blob(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def _owner(record: MemoryRecord) -> Owner:
    return Owner(record.tenant, record.user_id, record.chat_id)


def _folder_size(path: Path) -> int:
    return sum(_size(p) for p in path.iterdir()) if path.is_dir() else _size(path)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def prefix_end(prefix: str) -> str | None:
    """The least text above every text that starts with ``prefix`` in SQLite's BINARY order (UTF-8
    bytes compared, which is code point order, and no character's bytes begin another's); ``None``
    when nothing bounds it (an empty prefix, or one of U+10FFFF alone)."""
    while prefix:
        after = ord(prefix[-1]) + 1
        if 0xD800 <= after <= 0xDFFF:
            after = 0xE000  # no text holds a surrogate
        if after <= 0x10FFFF:
            return prefix[:-1] + chr(after)
        prefix = prefix[:-1]  # a looser bound; the caller's own prefix test stays exact
    return None
