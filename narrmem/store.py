"""The storage interface plugins write against. A backend (SQLite + FAISS, PostgreSQL + pgvector,
...) implements this protocol and registers a factory through ``narrmem_register_stores``.

Contract shared by every method: scope is enforced *inside* the query. A method that takes a
``Scope`` must never return a row outside it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, NotRequired, Protocol, TypedDict, Unpack, runtime_checkable

import numpy as np

from narrmem.clock import Clock
from narrmem.errors import InputError, StoreError
from narrmem.models import MAX_CONTEXT_CHARS, ContextLine, ForgetJob, ImportanceChange, MemoryRecord, Scope

StateEntry = tuple[str, str, dict[str, Any]]
"""A piece of plugin state: ``(namespace, key, value)``, as :meth:`Store.state_put` takes it."""

HistoryRow = tuple[int, str, str, float | None, float]
"""An importance change for the history: ``(memory id, who, why, old value, new value)``; the
old value is ``None`` for the first."""


class KeywordOptions(TypedDict, total=False):
    """The keyword-only arguments of :meth:`Store.search_keywords`."""

    context_weight: float
    kinds: Sequence[str] | None


class RecentOptions(TypedDict, total=False):
    """The keyword-only arguments of :meth:`Store.recent`."""

    since: datetime | None
    until: datetime | None
    kinds: Sequence[str] | None
    limit: int
    meta_has: tuple[str, str] | None


class ForgetWhat(TypedDict):
    """The keyword-only arguments of :meth:`Store.begin_forget` (``messages`` is optional)."""

    tenant: str
    user_id: str | None
    chat_id: str | None
    messages: NotRequired[Sequence[str] | None]


@runtime_checkable
class RecordsModel(Protocol):
    """A store that can say which model's vectors it holds before it is opened, so an embedder
    that offers several (:class:`~narrmem.embed.ModelChooser`) loads the right one."""

    async def recorded_model(self) -> str | None:
        """The model recorded with the stored vectors, read without locking, creating or writing
        anything; ``None`` for a store that does not exist yet or cannot be read (its open then
        reports why)."""
        ...


@runtime_checkable
class Store(Protocol):
    async def open(self, *, dim: int, model: str) -> None:
        """Open or create the store for vectors of ``dim`` from ``model``.

        Raises :class:`~narrmem.errors.StoreError` if the store holds vectors from another model.
        """
        ...

    async def close(self) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """One write transaction, serialised with every other writer of this process (ingest, a
        decay pass, a plugin with tables of its own): ``async with store.transaction() as conn:``.
        It commits when the block ends and rolls back if it raises. ``conn`` is the backend's
        connection, speaking its SQL; a plugin with tables of its own uses :class:`SQLCapable`
        instead (one SQL on every backend). A plugin never takes a lock of its own around the store."""
        ...

    async def add(
        self, records: Sequence[MemoryRecord], vectors: np.ndarray, *, state: Sequence[StateEntry] = ()
    ) -> list[int]:
        """Write records with their vectors in one transaction; set and return the ids written.

        An episode whose source message (tenant, chat, message id) already has an episode is not
        written, nor is any other record of the call made from that message: their ``id`` stays
        ``None``. The check is the store's own unique constraint, not a read before the write, so
        two processes storing the same message store it once. A record counts as stored only once
        this returns. ``state`` entries are put (as :meth:`state_put` does) in the same
        transaction: they are stored exactly when the records are.
        """
        ...

    async def stored_message_ids(self, tenant: str, chat_id: str, message_ids: Sequence[str]) -> set[str]:
        """Which of these message ids already have an episode in this chat (for idempotent ingest)."""
        ...

    async def search_vectors(
        self, scope: Scope, vector: np.ndarray, k: int, *, kinds: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        """Nearest in-scope memories (of these kinds) by inner product, best first."""
        ...

    async def search_keywords(
        self, scope: Scope, query: str, k: int, **options: Unpack[KeywordOptions]
    ) -> list[tuple[int, float]]:
        """In-scope memories matching the query's words (BM25; higher is better), best first.
        Words found only in a memory's ``context_text`` count ``context_weight`` (two thirds unless
        given) as much; ``kinds`` keeps only memories of these kinds."""
        ...

    async def get(self, ids: Sequence[int], scope: Scope | None) -> dict[int, MemoryRecord]:
        """Records by id; with a scope, ids outside it are silently absent."""
        ...

    async def vectors(self, ids: Sequence[int], scope: Scope) -> dict[int, np.ndarray]:
        """The stored vectors of these in-scope memories (ids outside it are absent)."""
        ...

    async def recent(self, scope: Scope, **options: Unpack[RecentOptions]) -> list[MemoryRecord]:
        """In-scope records (of ``kinds``) created at or after ``since`` and at or before ``until``
        (each ``None``: unbounded), newest first, at most
        ``limit`` (100 unless given). ``meta_has=(key, value)`` keeps the records whose
        ``meta[key]`` is the string ``value`` or a list holding it, filtered in the query (a counter
        of one mood reads the few records that state it, not a heavy user's whole week); ``key``
        is a name of letters, digits and underscores (:class:`~narrmem.errors.InputError`
        otherwise)."""
        ...

    async def update(self, record: MemoryRecord) -> None:
        """Rewrite a stored record's text, importance and meta (scope, kind, provenance and vector
        stay as they are); the keyword index follows."""
        ...

    async def from_messages(self, tenant: str, chat_id: str, message_ids: Sequence[str]) -> list[int]:
        """Ids of the memories whose provenance includes any of these messages of this chat."""
        ...

    async def delete(self, ids: Sequence[int], scope: Scope) -> int:
        """Delete these in-scope memories (rows, keyword index, vectors); return how many."""
        ...

    async def set_importance(self, changes: Sequence[ImportanceChange], at: datetime) -> list[int]:
        """Write new stored importance and decay-clock starts, with a history row each: a memory's
        value and its history row in one transaction (a store may write several memories' changes in
        transactions of their own, as PostgreSQL's does to keep each update on its page). A change
        with ``old`` set is written only while the stored importance is still ``old``: two workers
        (or two recalls) that reinforce a memory at once write it, and its history, once. Returns
        the ids whose change was written."""
        ...

    async def importance_states(
        self, after_id: int, limit: int, *, tenant: str | None = None
    ) -> list[tuple[int, float, datetime, float | None]]:
        """``(id, importance, decay clock start, importance after decay at the last pass)`` in id
        order; of ``tenant``'s memories only, chosen by the query, when given."""
        ...

    async def set_current_importance(
        self, values: Sequence[tuple[int, float]], history: Sequence[HistoryRow], at: datetime
    ) -> None:
        """Cache importance after decay; ``history`` rows are ``(id, who, why, old, new)``, each in the
        transaction that writes its memory's value."""
        ...

    async def history(self, memory_id: int) -> list[dict[str, Any]]:
        """A memory's importance history, oldest first."""
        ...

    async def count_below(self, threshold: float) -> int:
        """How many memories had importance after decay below ``threshold`` at the last pass."""
        ...

    async def state_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        """A plugin's small piece of persistent state."""
        ...

    async def state_put(self, namespace: str, key: str, value: dict[str, Any]) -> None: ...

    async def state_items(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """Every piece of state in a namespace, ``(key, value)`` in key order."""
        ...

    async def state_put_if(
        self, namespace: str, key: str, value: dict[str, Any], expected: dict[str, Any] | None
    ) -> bool:
        """Compare-and-set: write ``value`` only if the stored value is ``expected`` (``None``: no
        value stored), atomically; ``True`` if written. Of several processes putting from the same
        ``expected``, exactly one wins."""
        ...

    async def state_delete_if(self, namespace: str, key: str, expected: dict[str, Any]) -> bool:
        """Compare-and-delete: delete the one entry ``key`` only if its stored value is
        ``expected``, atomically; ``True`` if deleted. A value another process wrote since it was
        read is kept (a read, then :meth:`state_delete`, deleted it)."""
        ...

    def exclusive(self, name: str) -> AbstractAsyncContextManager[bool]:
        """``async with store.exclusive("decay") as mine:`` -- ``mine`` is ``True`` in the one
        process (of all using the store) that holds the named job for the block, ``False`` at once
        elsewhere, so a periodic job runs in one worker at a time."""
        ...

    async def state_delete(self, namespace: str, key_prefix: str) -> int:
        """Delete a plugin's state whose key starts with ``key_prefix``; return how many.

        A prefix, not a key: deleting ``"ann"`` deletes ``"anna"`` too. Key per-user state so that
        no key is the start of another: end each id with ``"\\0"``, which no id holds
        (``f"{tenant}\\0{user_id}\\0"``); the same prefix then deletes exactly that user's entries."""
        ...

    async def forget(self, *, tenant: str, user_id: str | None, chat_id: str | None) -> dict[str, int]:
        """Delete every trace of a user and/or chat (rows, keyword index, vectors); return counts."""
        ...

    async def begin_forget(self, **what: Unpack[ForgetWhat]) -> ForgetJob:
        """Durably record a forget (of a scope, or of what ``messages`` of ``chat_id`` left) with
        the message ids its memories came from, before anything is deleted."""
        ...

    async def pending_forgets(self) -> list[ForgetJob]:
        """Recorded forgets not yet finished (a crash interrupted them), oldest first."""
        ...

    async def finish_forget(self, job: ForgetJob, *, purge: bool = True) -> None:
        """Delete the job's record. ``purge``: also overwrite what the deletions left in the
        backend's files (freed pages, index segments, logs), so no byte of it stays."""
        ...

    def export(self, tenant: str | None = None) -> AsyncIterator[tuple[MemoryRecord, np.ndarray]]:
        """Every record with its vector (of ``tenant`` only, chosen by the query, when given), in
        id order."""
        ...

    async def import_records(self, items: Sequence[tuple[MemoryRecord, np.ndarray]]) -> dict[str, int]:
        """Write exported records keeping their ids, in one transaction.

        An id already stored with identical content is skipped; one stored with different
        content is a conflict and nothing is written.
        """
        ...

    async def users(
        self, tenant: str | None, *, limit: int = 1000, after: str | None = None
    ) -> list[dict[str, Any]]:
        """The users with memories (of ``tenant``, or of every tenant when ``None``), ordered by
        tenant and user id, at most ``limit``: ``tenant``, ``user_id``, ``memories``, ``scenes``,
        ``chats``, ``first_at`` and ``last_at`` (creation times of their oldest and newest memory,
        ISO 8601 UTC). Counts only: no text of any memory.

        ``after``: the next page, the users whose id sorts after this one (the last ``user_id``
        of the previous page); it needs a ``tenant`` (:class:`~narrmem.errors.InputError` naming
        ``after`` otherwise), since ids are ordered within a tenant."""
        ...

    async def tenants(self) -> list[str]:
        """Every tenant with at least one memory, in order (``SELECT DISTINCT``: no user is
        read, so no tenant is missed however many users the others have)."""
        ...

    async def stats(self) -> dict[str, Any]:
        """Store-wide figures: at least ``memories``, ``users``, ``chats``, ``tenants`` (counts),
        ``by_kind`` (memories of each kind) and ``schema_version``, as the HTTP document declares
        them (``GET /v1/stats``); a store adds its own."""
        ...


def schema_mismatch(where: str, found: int, known: int) -> str:
    """What a store opened read-only says of a schema version other than the one it reads: an
    older one is migrated by a writable open; a newer one was written by a newer narrmem (a
    rollback, or a process not yet upgraded), which only that version opens."""
    if found > known:
        return (
            f"{where} has schema version {found}, written by a newer narrmem (this one reads "
            f"{known}): run the newer narrmem; an older one cannot read it (a rollback needs the "
            "backup taken before the upgrade)"
        )
    return (
        f"{where} has schema version {found}, this narrmem reads {known}: open it once for writing "
        "to migrate it"
    )


def shared_by_processes(store: object) -> bool:
    """Whether other processes may use ``store`` at the same time: a store says so with a class
    attribute ``shared = True`` (the PostgreSQL store does). Then what this process keeps of the
    store (recent turns, a claim found free) may be another's too, or stale."""
    return bool(getattr(store, "shared", False))


class WorkersFence(Protocol):
    """This process's side of a fence across the processes that share a store
    (:class:`FencesWorkers`): what :mod:`narrmem.fence` does within a process, between processes.
    A unit is an ingest batch from just before its write until its after-store hooks have run;
    a batch holds the fence as a unit from its first step (triage, the embedding) too."""

    async def begin(self) -> None:
        """A unit of this process begins: at once, or once the forget of another process that
        runs has ended."""
        ...

    async def join(self) -> bool:
        """The write of messages this process received earlier begins, as a unit: at once while
        another unit is under way here (hooks run after the answer may be waiting for this write,
        and another process's forget for those hooks), else once no forget of another process
        runs. ``False`` (it does not count) while a forget of this process runs or waits to: that
        forget waits for this write, and this write must not wait for it."""
        ...

    def extend(self) -> bool:
        """Work that continues a unit under way (its after-store hooks, run after the answer)
        counts as one more unit, without waiting; ``False`` when no unit is under way here."""
        ...

    def end(self) -> None:
        """A unit begun or extended here ended."""
        ...

    def forgetting(
        self,
        at_gate: Callable[[], Awaitable[None]] | None = None,
        to_carry: Callable[[], int] | None = None,
    ) -> AbstractAsyncContextManager[None]:
        """Wait until no other process has a unit under way, and hold their new units back until
        the block ends. ``at_gate`` is awaited once no other process's forget can begin before this
        one ends, before it waits for the units: the forget begins there (this process's batches
        on their way let go, and its own units begun before are waited for).
        ``to_carry``, called as the block ends with no wait before other processes' forgets may
        begin: how many of this process's batches on their way to go on holding the fence for, as
        units (each ended by an :meth:`end`), so that the next forget of another process waits
        for them."""
        ...


@runtime_checkable
class FencesWorkers(Protocol):
    """A store shared by processes whose forget waits for the writes of every process (the
    PostgreSQL store): without it, another worker's after-store hooks (a fact, a count) could
    write after the forget had deleted what they came from."""

    def workers_fence(self) -> WorkersFence: ...


@runtime_checkable
class SQLConnection(Protocol):
    """A connection a store lends a plugin for tables of its own, speaking one SQL on every
    backend (see :class:`SQLCapable`). Rows come back as tuples; a database error as
    :class:`~narrmem.errors.StoreError`."""

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgres"``: for the rare statement that cannot be written once."""
        ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; how many rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...


@runtime_checkable
class WritesWhileEmbedding(Protocol):
    """A store that can write records before their vectors are computed (the SQLite store):
    what :meth:`Store.add` does, with ``vectors`` still on their way. The rows go in while the
    model runs and the transaction commits once the vectors are there, so a message's write costs
    little more than its commit after its embedding. The transaction stays open while it waits:
    ingest uses it for a few texts only, whose embedding is short. If awaiting ``vectors`` fails,
    nothing is written."""

    async def add_while_embedding(
        self,
        records: Sequence[MemoryRecord],
        vectors: Awaitable[np.ndarray],
        *,
        state: Sequence[StateEntry] = (),
    ) -> list[int]: ...


MessageKey = tuple[str, str, str]  # (tenant, chat_id, message_id): a message's identity


@runtime_checkable
class FindsStoredMessages(Protocol):
    """A store that finds which of many chats' messages have an episode in one query (both built-in
    stores): what :meth:`Store.stored_message_ids` answers for one chat at a time, for a batch of
    an import whose messages come from hundreds of chats."""

    async def stored_messages(self, keys: Sequence[MessageKey]) -> set[MessageKey]:
        """The ``(tenant, chat_id, message_id)`` keys among ``keys`` whose message has an episode."""
        ...


@runtime_checkable
class PurgesDeleted(Protocol):
    """A store whose deleted rows leave bytes in its files until a purge (both built-in stores:
    an FTS5 or tantivy index keeps a deleted row's terms until its segments are merged, a
    database file keeps freed pages' bytes until rewritten)."""

    async def purge_deleted(self) -> None:
        """Leave no byte of the rows deleted so far in the files (as a user's forget ends)."""
        ...


@runtime_checkable
class PurgesAlongsideWrites(Protocol):
    """A store part of whose purge can run while writes go on: SQLite's tantivy keyword index is
    rebuilt from the rows in a folder of its own (18 s at a million memories), writes made
    meanwhile kept for it. The purge of deleted messages runs that part before it takes the
    write turn, and the rest (:meth:`purge_in_turn`) in it; a user's forget still runs
    :meth:`PurgesDeleted.purge_deleted` whole, in its turn."""

    async def purge_alongside_writes(self) -> None:
        """What of the purge can run with writes going on, for the rows deleted before it began
        (a row deleted meanwhile keeps bytes in it until the next purge)."""
        ...

    async def purge_in_turn(self) -> None:
        """The rest of :meth:`PurgesDeleted.purge_deleted`, after :meth:`purge_alongside_writes`."""
        ...


@runtime_checkable
class CountsForgets(Protocol):
    """A store that tells whether a forget began since a given moment (both built-in stores): a
    finished forget leaves no job behind, so :meth:`Store.pending_forgets` cannot tell. An export
    compares this before and after it reads, and fails when it changed (the file may hold what the
    forget deleted)."""

    async def forgets_begun(self) -> int:
        """The id of the last forget job ever begun (0 before the first): job ids are never given
        out twice, so it changes with every forget that begins, whether finished since or not."""
        ...


# Plugin state of notes about this store's own tables (a plugin's schema version, say), keyed by
# the plugin's name: never exported nor imported, since another store's tables are another's.
STORE_NOTES = "narrmem.store_notes"
IMPORT_UNDER_WAY = "import.under_way"  # a STORE_NOTES key: an import begun and not ended


@runtime_checkable
class FindsUserTenants(Protocol):
    """A store that tells which tenants hold a person (both built-in stores), by one seek of its
    scope index per tenant: a Discord ``forgetme`` read every (tenant, user)'s counts of the whole
    store for it (0.79 s against 5 ms at 200,000 memories of 50,000 people, ``bench/user_tenants.py``)."""

    async def user_tenants(self, user_ids: Sequence[str]) -> list[str]:
        """The tenants holding a memory of any of ``user_ids``, in order."""
        ...


class InactivePerson(NamedTuple):
    """A person (``tenant``, ``user_id``) whose newest memory was said at ``last_said``."""

    tenant: str
    user_id: str
    memories: int
    last_said: datetime


@runtime_checkable
class FindsInactivePeople(Protocol):
    """A store that finds the people with nothing said since a time, and when one last said
    something, in its queries (both built-in stores): what a retention policy forgets
    (:mod:`narrmem.retention`)."""

    async def inactive_people(
        self,
        before: datetime,
        *,
        tenant: str | None = None,
        limit: int = 1000,
        after: tuple[str, str] | None = None,
    ) -> list[InactivePerson]:
        """The people (of ``tenant``, or of every tenant when ``None``) whose every memory was
        said before ``before``, ordered by tenant and user id, at most ``limit``; ``after``: the
        next page, the people after this (tenant, user id), the last of the previous page.
        Counts and times only: no text of any memory."""
        ...

    async def last_said(
        self, tenant: str | None = None, user_id: str | None = None, *, until: datetime | None = None
    ) -> datetime | None:
        """When the newest memory of ``user_id`` in ``tenant`` was said, by one seek of the scope
        index; of the whole tenant, or of the whole store, when they are ``None`` (a pass over
        the index). ``until``: of the memories said before that time only. ``None``: no such
        memory."""
        ...


@runtime_checkable
class ReadsStateByPrefix(Protocol):
    """A store that reads plugin state by the start of its key in every namespace, by index (a
    person's own export reads what is kept under their key, not the whole table)."""

    async def state_by_prefix(self, key_prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
        """Every ``(namespace, key, value)`` whose key starts with ``key_prefix``."""
        ...


async def scope_pages(
    store: Store, scope: Scope, *, kinds: Sequence[str] | None = None, page: int = 1000
) -> AsyncIterator[list[MemoryRecord]]:
    """The scope's memories (of ``kinds``), newest first, about ``page`` at a time: never all of a
    heavy user's or a busy chat's at once. A page ends with every memory stored at its oldest
    instant (as the store compares times); the next is read up to that instant and leaves out the
    memories given, by id (not a microsecond before it: past the 23rd century a float's
    microsecond is lost, and the same page came back for ever). A store written before ``until``
    was part of the protocol is read at once."""
    until: datetime | None = None
    given: set[int | None] = set()
    seen: set[int | None] = set()  # every memory given: none is given twice, and the pages end
    while True:
        try:
            raw = await store.recent(scope, until=until, kinds=kinds, limit=page + len(given))
        except TypeError:
            if until is None:
                yield await store.recent(scope, kinds=kinds, limit=2**62)
            return
        found = [r for r in raw if r.id not in seen]
        if not found:
            if len(raw) >= page + len(given):
                # A page of memories given already: times the store orders otherwise than their
                # records say (a page came back for ever). The rest, read at once.
                rest = await store.recent(scope, until=until, kinds=kinds, limit=2**62)
                if rest := [r for r in rest if r.id not in seen]:
                    yield rest
            return
        oldest = found[-1].created_at
        held = {r.id for r in found}
        found += [
            r
            for r in await store.recent(scope, since=oldest, until=oldest, kinds=kinds, limit=2**62)
            if r.id not in held and r.id not in seen
        ]
        yield found
        seen.update(r.id for r in found)
        until = oldest
        given = {r.id for r in found if r.created_at.timestamp() == oldest.timestamp()}


@runtime_checkable
class ReadsHistories(Protocol):
    """A store that reads the importance history of a run of memories in one query (both
    built-in stores): an export read it memory by memory, a round trip each (hours a night for a
    store of tens of millions)."""

    async def histories(
        self, first_id: int, last_id: int, *, tenant: str | None = None, user_id: str | None = None
    ) -> dict[int, list[dict[str, Any]]]:
        """The history rows of the memories whose id lies from ``first_id`` to ``last_id`` (of
        ``tenant``'s memories only, of ``user_id``'s there when given too, chosen by the query),
        each memory's as :meth:`Store.history` gives them (oldest first); a memory without any
        is absent."""
        ...


class DecayedImportance(NamedTuple):
    """A memory's importance after decay at a pass, with what it was computed from: the stored
    ``importance`` and the ``cached`` value after decay (``None`` before the first pass) that the
    pass read. ``history`` is the ``(who, why)`` of a history row (``old`` = ``cached``, ``new`` =
    ``value``) that goes with the value, or ``None``."""

    memory_id: int
    value: float
    importance: float
    cached: float | None
    history: tuple[str, str] | None = None


@runtime_checkable
class CachesDecayIfUnchanged(Protocol):
    """A store that caches a decay pass's values only where nothing changed the memory since the
    pass read it (both built-in stores). A reinforcement or an edit that lands between a page's
    read and its write changes the stored importance or its cached value: the pass's value,
    computed from the state before, would overwrite the fresh one (and could log a memory just
    used as faded). Stores without it are written by :meth:`Store.set_current_importance`."""

    async def set_decayed_importance(self, values: Sequence[DecayedImportance], at: datetime) -> list[int]:
        """Cache each ``value`` only while its memory's stored importance is still ``importance``
        and its cached value still ``cached``; a value's history row in the same transaction,
        and only if the value is written. Returns the ids written."""
        ...


@runtime_checkable
class ReadsWithVectors(Protocol):
    """A store that reads memories and their stored vectors in one query (both built-in stores):
    what :meth:`Store.get` and :meth:`Store.vectors` answer together. Recall reads the memories
    the keyword source found this way while the query is embedded: one trip to the database
    instead of two on a path that can be the longer of the two."""

    async def get_with_vectors(
        self, ids: Sequence[int], scope: Scope
    ) -> tuple[dict[int, MemoryRecord], dict[int, np.ndarray]]:
        """The memories among ``ids`` inside ``scope``, and the stored vectors of those that have
        one (scope enforced in the query, as by ``get``)."""
        ...


@runtime_checkable
class AddsContext(Protocol):
    """A store that can add a later turn's words to the keyword context of stored episodes (both
    built-in stores): a reply often names what the message before it was about ("congrats on the
    new job!" after "I got it!!"), so the earlier message can be found by those words too."""

    async def add_context(
        self,
        tenant: str,
        chat_id: str,
        message_ids: Sequence[str],
        text: str,
        *,
        source: tuple[str, str],
    ) -> list[int]:
        """Append ``text`` as a line of the keyword context (``context_text``) of the episodes of
        ``message_ids`` in this chat, and ``source``'s value to the list in ``meta[key]``
        (``source = (key, message id)``: what the caller scrubs the line by if that message is
        forgotten), in one write that changes nothing else of the rows. An episode whose context
        would pass its length limit is left as it is. Returns the ids of the episodes changed.
        Scope is the chat: no row of another chat or tenant is touched."""
        ...


@runtime_checkable
class WritesContext(Protocol):
    """A store that writes a message's context lines (``narrmem_context_lines``) in the transaction
    that writes its records (both built-in stores): the line is there exactly when the message
    is, and costs no write of its own."""

    async def add_with_context(
        self,
        records: Sequence[MemoryRecord],
        vectors: np.ndarray | Awaitable[np.ndarray],
        context: Mapping[int, Sequence[ContextLine]],
        *,
        state: Sequence[StateEntry] = (),
    ) -> list[int]:
        """What :meth:`Store.add` does (and :meth:`WritesWhileEmbedding.add_while_embedding`, if the
        store is one and ``vectors`` are still on their way), and in the same transaction, once
        the records are in: the lines of ``context`` (keyed by the place in ``records`` of the
        episode whose message they come from) as :meth:`AddsContext.add_context` adds them, in
        order, with ``source = (line.key, the episode's message id)``, in the episode's tenant and
        chat. The lines of an episode not written (a duplicate) are not added."""
        ...


@dataclass(frozen=True)
class ContextWrite:
    """One context line as a store writes it: ``text`` into the episodes of ``message_ids`` of this
    tenant's chat, ``source`` = (meta key, the id of the message the line comes from)."""

    tenant: str
    chat_id: str
    message_ids: tuple[str, ...]
    text: str
    source: tuple[str, str]


def context_writes(
    records: Sequence[MemoryRecord], context: Mapping[int, Sequence[ContextLine]], written: Iterable[int]
) -> list[ContextWrite]:
    """The lines of the episodes written (``written``: their places in ``records``), in order, each
    in its episode's own tenant and chat."""
    writes = []
    for n in written:
        record = records[n]
        if record.kind != "episode" or not record.message_ids:
            continue
        for line in context.get(n, ()):
            writes.append(
                ContextWrite(
                    record.tenant,
                    record.chat_id,
                    tuple(line.message_ids),
                    line.text,
                    (line.key, record.message_ids[0]),
                )
            )
    return writes


@dataclass
class EpisodeContext:
    """An episode's keyword context as a store read it for :func:`with_context_writes`."""

    memory_id: int
    tenant: str
    chat_id: str
    message_id: str
    context: str | None
    meta: dict[str, Any]


def with_context_writes(
    rows: Iterable[EpisodeContext], writes: Sequence[ContextWrite]
) -> list[EpisodeContext]:
    """``writes`` applied in order to the episodes they name among ``rows`` (each row's message is
    its episode's); returns the rows changed, with their new context and meta. A row that holds
    a write's message already, or whose context would pass its limit, keeps its own."""
    by_message: dict[tuple[str, str, str], list[EpisodeContext]] = {}
    for row in rows:
        by_message.setdefault((row.tenant, row.chat_id, row.message_id), []).append(row)
    changed: dict[int, EpisodeContext] = {}
    for write in writes:
        for message_id in dict.fromkeys(write.message_ids):
            for row in by_message.get((write.tenant, write.chat_id, message_id), []):
                change = _with_line(row.context, row.meta, write.text, write.source)
                if change is not None:
                    row.context, row.meta = change
                    changed[row.memory_id] = row
    return list(changed.values())


@runtime_checkable
class SQLCapable(Protocol):
    """A store that gives plugins tables of their own in its database, on every backend that
    implements it (both built-in stores do): ``async with store.sql() as db`` to read,
    ``async with store.sql(write=True) as db`` for one write transaction (committed when the block
    ends, rolled back if it raises, serialised with the store's own writers as
    :meth:`Store.transaction` is).

    The SQL is SQLite's, with what PostgreSQL reads the same way:

    * ``?`` placeholders, in order (PostgreSQL's ``$n`` are made from them outside quotes);
    * in ``CREATE TABLE`` and ``ALTER TABLE``, SQLite's types: ``INTEGER`` (64 bits), ``REAL``,
      ``TEXT``, ``BLOB``, and ``INTEGER PRIMARY KEY [AUTOINCREMENT]`` for an id the database assigns;
    * ``INSERT ... ON CONFLICT (...) DO NOTHING | DO UPDATE SET x = excluded.x`` and
      ``RETURNING`` instead of ``INSERT OR ...``, ``lastrowid`` and ``rowid``;
    * ``CREATE TABLE | INDEX IF NOT EXISTS`` to set tables up when the plugin starts: several
      workers doing it at once on PostgreSQL take turns, and on a store open read-only it passes
      when the table or index is already there (and fails with a ``StoreError`` otherwise);
    * text parameters without NUL characters (PostgreSQL cannot store them: a ``StoreError``).

    A plugin names its tables after itself, never touches the store's own, and deletes its rows
    of a forgotten user or chat itself (the ``narrmem_after_forget`` hook).
    """

    def sql(self, *, write: bool = False) -> AbstractAsyncContextManager[SQLConnection]: ...


@runtime_checkable
class ReadsSnapshots(Protocol):
    """A store that lends a connection of its own on one state of its database, for reads that
    span many statements while the memory goes on writing (an export reading a plugin's table a
    page at a time: read on the shared connection, a fact purged and stated again between two
    pages was in the file twice, and the import refused it). The state is the one of the first
    read of the block, and is held while the block runs; nothing can be written through it."""

    def snapshot(self) -> AbstractAsyncContextManager[SQLConnection]: ...


class Listening(Protocol):
    """A subscription to a :class:`Broadcasts` channel; ``close`` ends it."""

    async def close(self) -> None: ...


@runtime_checkable
class Broadcasts(Protocol):
    """A store shared by several processes that carries short messages between them as they happen
    (what one worker's trigger fired, for the event streams of the others). Nothing is kept: a
    message sent while a process does not listen is not seen by it, and a listener told
    ``lost`` knows some may have gone by."""

    # The longest payload ``broadcast`` takes, in UTF-8 bytes.
    broadcast_limit: int

    async def broadcast(self, channel: str, payload: str) -> None:
        """Send ``payload`` to every process listening on ``channel`` (this one included), once
        the call returns; in the order sent."""
        ...

    async def listen(self, channel: str, heard: Callable[[str], None], lost: Callable[[], None]) -> Listening:
        """Call ``heard(payload)`` for each message on ``channel`` from now on, in order; call
        ``lost()`` when messages may have been missed (the connection that listens ended, and
        listens again)."""
        ...


def check_sql_params(params: Sequence[Any]) -> None:
    """Refuse a text parameter holding NUL (see :class:`SQLCapable`), on every backend alike, so
    that a plugin that runs on one runs on the other."""
    for i, value in enumerate(params):
        if isinstance(value, str) and "\x00" in value:
            raise StoreError(
                f"SQL parameter {i + 1} holds a NUL character, which PostgreSQL text cannot store"
            )


FORGET_JOB_COLUMNS = "tenant, user_id, chat_id, messages, sources, created_at"


def forget_job_row(job: ForgetJob, clock: Clock) -> tuple[Any, ...]:
    """``job`` as the ``forget_jobs`` tables keep it (:data:`FORGET_JOB_COLUMNS`), recorded at
    ``clock``'s now (UTC, to the second)."""
    listed = None if job.messages is None else json.dumps(job.messages, ensure_ascii=False)
    recorded = clock.now().astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return (
        job.tenant,
        job.user_id,
        job.chat_id,
        listed,
        json.dumps(job.sources, ensure_ascii=False),
        recorded,
    )


class ForgetJournal:
    """:meth:`Store.begin_forget` for a store that says how to read a scope's provenance
    (:meth:`scope_sources`) and how to write a job down (:meth:`write_forget`)."""

    async def begin_forget(
        self, *, tenant: str, user_id: str | None, chat_id: str | None, messages: Sequence[str] | None = None
    ) -> ForgetJob:
        """Write the job down (with the provenance of what it will delete) before deleting anything."""
        if messages is not None:
            if chat_id is None:
                raise StoreError("forgetting messages needs their chat")
            sources = {chat_id: sorted(set(messages))}
        else:
            found: dict[str, set[str]] = {}
            scope = Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
            for chat, message_id in await self.scope_sources(scope):
                found.setdefault(chat, set()).add(message_id)
            sources = {chat: sorted(ids) for chat, ids in sorted(found.items())}
        listed = None if messages is None else sorted(set(messages))
        job = ForgetJob(
            id=0, tenant=tenant, user_id=user_id, chat_id=chat_id, messages=listed, sources=sources
        )
        return job.model_copy(update={"id": await self.write_forget(job)})

    async def scope_sources(self, scope: Scope) -> Iterable[tuple[str, str]]:
        """``(chat id, message id)`` of the provenance of the scope's memories."""
        raise NotImplementedError

    async def write_forget(self, job: ForgetJob) -> int:
        """Store ``job`` (its ``id`` is not set yet) in one transaction; the id it was given."""
        raise NotImplementedError


SOURCES_IN_SCOPE = (
    "SELECT DISTINCT s.chat_id, s.message_id FROM memory_sources s JOIN memories m ON m.id = s.memory_id "
    "WHERE {where}"
)
"""Both built-in stores' query of the provenance of a scope's memories (``{where}`` on ``m``)."""


META_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# A value whose JSON text is itself (no escapes, whatever the encoder's settings): a plain
# substring of the stored text can rule rows out before their JSON is parsed.
PLAIN_VALUE = re.compile(r"[A-Za-z0-9 _.-]+")


def meta_filter(meta_has: tuple[str, str] | None) -> tuple[str, str] | None:
    """``recent``'s ``meta_has`` checked: a key that can go into a JSON path as it is, a string
    value. A store may first rule out the rows whose meta text does not hold the value when
    :func:`plain_value` says it can."""
    if meta_has is None:
        return None
    key, value = meta_has
    if not isinstance(key, str) or not META_KEY.fullmatch(key):
        raise InputError(f"meta_has: the key must be letters, digits and underscores, not {key!r}")
    if not isinstance(value, str):
        raise InputError(f"meta_has: the value must be a string, not {type(value).__name__}")
    return key, value


def plain_value(value: str) -> bool:
    """Whether ``value`` is written in JSON as it is (see ``PLAIN_VALUE``)."""
    return PLAIN_VALUE.fullmatch(value) is not None


def _with_line(
    context: str | None, meta: dict[str, Any], line: str, source: tuple[str, str]
) -> tuple[str, dict[str, Any]] | None:
    """One row's new ``context_text`` and meta with ``line`` added, or None if the row keeps its own:
    it holds ``source``'s message already (a line is added once) or the line would take the context
    past its limit."""
    key, message_id = source
    listed = meta.get(key)
    listed = list(listed) if isinstance(listed, list) else []
    if message_id in listed:
        return None
    joined = f"{context}\n{line}" if context else line
    if len(joined) > MAX_CONTEXT_CHARS:
        return None
    return joined, {**meta, key: [*listed, message_id]}
