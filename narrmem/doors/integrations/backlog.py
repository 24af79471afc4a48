"""A bot's writes that the store could not take, made once it answers again.

A message, an edit, the forget of deleted messages or a person's ``forgetme`` that fails with
:class:`~narrmem.errors.StoreUnavailableError` (a PostgreSQL down, restarting, failing over, or
stalled past ``[storage] timeout_s``) is not dropped: it waits here and is tried again after
:data:`RETRY_DELAYS` and then every :data:`RETRY_EVERY` seconds until the store answers. While
some wait, the calls that come go behind them, so the order a chat saw is kept: a message
deleted during the outage is forgotten after it is stored, not before (which would leave it
stored for good), and an edit lands on the message it edits.

At most :data:`MAX_WAITING` calls wait, for one memory; when full, the oldest message or edit
goes to make room (a forget goes only when nothing else is left to drop), logged with a count.
A call that fails in another way once the store answers (a refusal) is logged and dropped, as it
would have been at once.

On disk too (:mod:`narrmem.doors.integrations.spool`): what waits is kept in a file of the data
folder, so a bot stopped or restarted during the outage makes it at its next start, after the
store answers; a message's trigger events are then not said (the chat they were for is the old
process's). A forget made meanwhile in this process by any other way (the HTTP API, a script's
call, another door) takes what waits of the person, chat or messages it forgets, from the file
too: sent after that forget, a waiting message would have been stored again. A forget another
process makes (another worker, or any process while this one was stopped) cannot reach it: it left
a mark (:mod:`narrmem.forget_marks`), and a waiting message or edit of a person, chat or message
forgotten after it was first tried is dropped instead of made, and what an earlier try of it may
have written goes (the message's forget); should such a forget come between that check and the
write, the message is forgotten once written. One that waited longer than marks are kept is
dropped too. A waiting person's forget, made late, is dated when it was asked: what the person
said after asking, waiting behind it, is not taken for what it forgot. A line of a file written
before lines said when they were first tried is checked against every mark kept.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import datetime as dt
import weakref
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import ValidationError

from narrmem import logs
from narrmem.doors.integrations.spool import REWRITE_EVERY, Spool
from narrmem.errors import ClosedError, StoreUnavailableError
from narrmem.forget_marks import aware_time_in, forget_written
from narrmem.host import hookimpl
from narrmem.ingest import platform_dated
from narrmem.models import Message, Scope
from narrmem.store import FindsUserTenants, ReadsStateByPrefix

if TYPE_CHECKING:
    from narrmem.memory import Memory

log = logs.logger("narrmem.doors.integrations")

T = TypeVar("T")
Kind = Literal["message", "edit", "forget of deleted messages", "forget of a person", "forget of a chat"]
# Kept when the backlog is full, as long as anything else can go: what a person took back.
FORGETS: frozenset[str] = frozenset({"forget of deleted messages", "forget of a person", "forget of a chat"})
# What a forget made meanwhile takes from the backlog: what would store the person's words.
WRITES: frozenset[str] = frozenset({"message", "edit"})

MAX_WAITING = 10_000
# Seconds before each try again after a failure; then every RETRY_EVERY while the store is away.
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0)
RETRY_EVERY = 30.0
USERS_READ = 10_000_000
# A Discord thread's message names its channel under this key (see forget_chat); where each thread
# is a chat of its own, the store notes the threads of a channel (ids only) in THREADS_NAMESPACE.
PARENT_KEY = "parent_id"
THREADS_NAMESPACE = "narrmem.discord_threads"

# Who reads the tenants a person is forgotten in when the forget is made: the integration's name,
# and what it calls with the person's id.
TenantFinder = Callable[[str], Awaitable[Collection[str]]]


# When the waiting forget being made was asked (unset: the forget is made as it is asked).
_ASKED_AT: contextvars.ContextVar[dt.datetime | None] = contextvars.ContextVar("asked_at", default=None)
UNKNOWN_SINCE = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def asked_at() -> dt.datetime | None:
    """When the forget a backlog is making now was asked, for the forget's ``asked_at``; ``None``
    outside a waiting forget's making."""
    return _ASKED_AT.get()


@dataclass
class _Waiting:
    kind: Kind
    call: Callable[[], Awaitable[Any]]
    record: dict[str, Any] | None = None  # what the file keeps of it (None: not kept on disk)
    since: dt.datetime | None = None  # when it was first tried (None: not known)

    def message(self) -> Message | None:
        """The message a waiting write stores (``None`` for a forget, or a call kept without a record)."""
        data = None if self.record is None else self.record.get("data")
        if self.kind not in WRITES or not isinstance(data, dict):
            return None
        try:
            return Message.model_validate(data.get("message"))
        except ValidationError:
            return None


class Backlog:
    """The writes of one memory's bot integrations that wait for the store (see the module)."""

    def __init__(self, memory: Memory | None = None) -> None:
        # Weak: the memory keys the table of backlogs, which would keep it for ever.
        self._memory = None if memory is None else weakref.ref(memory)
        self.spool = None if memory is None else Spool(memory.data_dir)
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._drainer: asyncio.Task[None] | None = None
        self._empty = asyncio.Event()
        self._empty.set()
        self._taking_over: asyncio.Future[None] | None = None
        self._finders: dict[str, TenantFinder] = {}
        self._remakers: dict[str, Callable[[Message], Awaitable[Any]]] = {}
        # The calls being made: the forgets they make are theirs, in order, and take nothing of
        # what waits behind them.
        self._making: list[dict[str, Any]] = []
        self._changes = 0  # calls made or dropped since the file was last written whole
        self._unwritten = False  # the file misses calls (it could not be written): said once
        self._stale = False  # the file holds calls it should not (a rewrite failed)
        self._holds_forgotten = False  # ... among them what a forget took
        self.dropped = 0  # calls dropped to make room, since the start

    def __len__(self) -> int:
        return len(self._waiting)

    def remakes_messages(self, by: str, ingest: Callable[[Message], Awaitable[Any]]) -> None:
        """``ingest(message)`` makes the waiting messages of integration ``by`` that a stopped
        process left, so that their trigger suggestions are said in their chats (made by a plain
        ingest, they were said nowhere)."""
        self._remakers[by] = ingest

    def finds_tenants(self, by: str, finder: TenantFinder) -> None:
        """``finder(user_id)`` reads the tenants a person's forget covers, for the forgets of
        integration ``by`` that wait (on disk too: the next start's integration reads them)."""
        self._finders[by] = finder

    async def run(
        self, kind: Kind, call: Callable[[], Awaitable[T]], record: dict[str, Any] | None = None
    ) -> T | None:
        """``call()``'s answer; ``None`` when it waits here (the store cannot be reached, or
        earlier calls wait). Any other error of the call is raised. ``record``: what the file
        keeps to make the call at a later start (:func:`message_record` and the others)."""
        await self.taken_over()
        since = self._now()
        if self._waiting:
            await self._keep(kind, call, record, since)
            return None
        try:
            return await self._make(call, record)
        except StoreUnavailableError as exc:
            log.warning("the store cannot be reached; the %s waits (%s)", kind, type(exc).__name__)
            await self._keep(kind, call, record, since)
            return None

    def _now(self) -> dt.datetime | None:
        memory = None if self._memory is None else self._memory()
        return None if memory is None else memory.clock.now()

    async def _make(self, call: Callable[[], Awaitable[T]], record: dict[str, Any] | None) -> T:
        if record is None:
            return await call()
        self._making.append(record)
        try:
            return await call()
        finally:
            self._making.remove(record)

    async def drained(self) -> None:
        """Wait until nothing waits (made, dropped, or given up at close), what stopped
        processes left included."""
        await self.taken_over()
        await self._empty.wait()

    async def forgotten(
        self, tenant: str, user_id: str | None, chat_id: str | None, messages: Sequence[str] | None
    ) -> None:
        """A forget was made: unless one of this backlog's own calls made it, what waits to store
        the words it forgets goes, from the file too (which is written again, with the calls
        made since its last writing gone from it as well)."""
        await self.taken_over()
        if any(_makes(record, tenant, user_id, chat_id, messages) for record in self._making):
            return

        def taken(waiting: _Waiting) -> bool:
            found = None if waiting.record is None else waiting.record.get("data", {}).get("message")
            if waiting.kind not in WRITES or not isinstance(found, dict):
                return False
            return (
                found.get("tenant", "default") == tenant
                and (user_id is None or found.get("user_id") == user_id)
                and (chat_id is None or found.get("chat_id") == chat_id)
                and (messages is None or found.get("message_id") in messages)
            )

        kept = [w for w in self._waiting if not taken(w)]
        if len(kept) < len(self._waiting):
            log.warning("a forget took %d waiting writes of the backlog", len(self._waiting) - len(kept))
            self._waiting = collections.deque(kept)
            self._changes += 1
        if self.spool is not None and (self._changes or self._stale):
            try:
                await self._rewrite(raise_errors=True)
            except OSError:
                self._holds_forgotten = True  # raised: the forget is tried again
                raise
            self._holds_forgotten = False
        if not self._waiting:
            self._empty.set()

    def _records(self) -> list[dict[str, Any]]:
        return [w.record for w in self._waiting if w.record is not None]

    async def _rewrite(self, *, raise_errors: bool = False) -> None:
        """Write the file whole again from what waits (none: it goes)."""
        assert self.spool is not None
        try:
            await self.spool.rewrite(self._records())
        except OSError as exc:
            self._stale = True
            self._changes = 0  # tried again after as many more changes, or by a forget at once
            if raise_errors:
                raise
            log.error("the bot backlog's file cannot be written again (%s)", exc)
            return
        self._changes = 0
        self._stale = False
        self._unwritten = False

    async def _keep(
        self,
        kind: Kind,
        call: Callable[[], Awaitable[Any]],
        record: dict[str, Any] | None,
        since: dt.datetime | None,
    ) -> None:
        if len(self._waiting) >= MAX_WAITING:
            self._make_room()
        if record is not None and since is not None:
            record = {**record, "since": since.isoformat()}
        self._waiting.append(_Waiting(kind, call, record, since))
        self._empty.clear()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        if self.spool is not None and self._changes >= REWRITE_EVERY:
            await self._rewrite()  # what went to make room goes from the file too
        elif self.spool is not None and record is not None:
            try:
                await self.spool.append([record])
            except OSError as exc:
                # Kept in this process: made once the store answers, unless the process stops first.
                if not self._unwritten:
                    log.error(
                        "the bot backlog's file cannot be written (%s): what waits is kept in memory", exc
                    )
                self._unwritten = True

    def _make_room(self) -> None:
        # The first is the one being tried: it stays. A message or an edit goes before a forget.
        victims = [n for n, w in enumerate(self._waiting) if n > 0 and w.kind not in FORGETS]
        index = victims[0] if victims else 1
        dropped = self._waiting[index]
        del self._waiting[index]
        self.dropped += 1
        self._changes += 1  # gone from the file at its next writing
        log.error(
            "%d writes wait for the store, the most kept: the oldest waiting %s is dropped (%d so far)",
            MAX_WAITING,
            dropped.kind,
            self.dropped,
        )

    async def _drain(self) -> None:
        failures = 0
        try:
            while self._waiting:
                await asyncio.sleep(RETRY_DELAYS[failures] if failures < len(RETRY_DELAYS) else RETRY_EVERY)
                while self._waiting:
                    first = self._waiting[0]
                    try:
                        await self._make_waiting(first)
                    except StoreUnavailableError:
                        failures += 1
                        break
                    except ClosedError:
                        await self._closed()
                        return
                    except Exception:
                        log.exception("a waiting %s was refused once the store answered; dropped", first.kind)
                    failures = 0
                    if self._waiting and self._waiting[0] is first:  # a forget may have taken it
                        self._waiting.popleft()
                    self._changes += 1
                    if self.spool is not None and (not self._waiting or self._changes >= REWRITE_EVERY):
                        await self._rewrite()
                if not self._waiting:
                    log.warning("the store answers again: every waiting write is made")
        finally:
            if not self._waiting:
                self._empty.set()

    async def _make_waiting(self, waiting: _Waiting) -> None:
        """Make a call that waited, unless a forget made since then, in any process, forgot what
        it would write (see the module)."""
        memory = None if self._memory is None else self._memory()
        message = waiting.message()
        if memory is None or message is None:
            # A person's forget is dated when asked; a deleted message's when made (no later
            # write of a deleted message is the chat's).
            asked = waiting.since if waiting.kind == "forget of a person" else None
            token = _ASKED_AT.set(asked)
            try:
                await self._make(waiting.call, waiting.record)
            finally:
                _ASKED_AT.reset(token)
            return
        # A file written before writes said when they were first tried: any mark kept counts.
        since = waiting.since or UNKNOWN_SINCE
        if waiting.since is not None and memory.forget_marks.outlived(since):
            log.warning(
                "a waiting %s waited longer than forgets are remembered ([storage] "
                "forget_marks_kept_s): dropped, since it may be of someone forgotten meanwhile",
                waiting.kind,
            )
            return
        if await memory.forgotten_after(message, since):
            log.warning("a waiting %s was forgotten since it was first tried: dropped", waiting.kind)
            # An earlier try of it (whose check after the write then failed, or whose process
            # stopped) may have written it after the forget: what it left goes.
            await forget_written(memory, message)
            return
        if not self._waiting or self._waiting[0] is not waiting:
            return  # a forget of this process took it meanwhile
        await self._make(waiting.call, waiting.record)
        if self._waiting and self._waiting[0] is waiting and await memory.forgotten_after(message, since):
            # A forget that came between the check and the write missed it. (Failing here, the
            # write is tried again, and its check before finds that forget.)
            log.warning("a waiting %s was forgotten while it was made: forgotten again", waiting.kind)
            await forget_written(memory, message)

    async def _closed(self) -> None:
        kept = ""
        if self.spool is not None:
            await self._rewrite()  # what was made since its last writing is not made again
            if self._stale and self._holds_forgotten:
                # It holds what a forget took: deleted (which needs no room on the disk) rather
                # than left for the next start to store again. (Calls made already, it may hold:
                # made again, they change nothing.)
                log.error("the bot backlog's file cannot be written: %d waiting writes are lost", len(self))
                with contextlib.suppress(OSError):
                    await self.spool.discard()
                self._waiting.clear()
            elif not self._unwritten:
                kept = f": kept in {self.spool.path} for the next start"
            await self.spool.release()
        if self._waiting:
            log.error("the memory closed with %d writes not made (the store was away)%s", len(self), kept)
        self._waiting.clear()

    def take_over_soon(self) -> None:
        """Begin :meth:`taken_over` now when an event loop runs (an integration attached in it),
        so what stopped processes left is made without waiting for the next message."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # the first call takes over
        self._start_taking_over()

    async def taken_over(self) -> None:
        """Wait until the calls that stopped processes' backlogs left on disk are queued, before
        any other."""
        await asyncio.shield(self._start_taking_over())

    def _start_taking_over(self) -> asyncio.Future[None]:
        if self._taking_over is None:
            self._taking_over = asyncio.ensure_future(self._take_over())
        return self._taking_over

    async def close(self) -> None:
        """The memory closes: stop trying, and leave what waits in the file for the next start."""
        drainer = self._drainer
        if drainer is not None and not drainer.done():
            drainer.cancel()
            await asyncio.gather(drainer, return_exceptions=True)
        if self._waiting or self._changes or self._stale:
            await self._closed()
        self._empty.set()

    async def _take_over(self) -> None:
        if self.spool is None:
            return
        try:
            records = await self.spool.take_over()
        except Exception as exc:  # an unreadable file must not stop the bot's every write
            log.error(
                "the bot backlog files of stopped processes cannot be taken over (%s)", type(exc).__name__
            )
            return
        for record in records:
            made = self._call_of(record)
            if made is not None:
                kind, call = made
                if len(self._waiting) >= MAX_WAITING:
                    self._make_room()
                self._waiting.append(_Waiting(kind, call, record, _since_of(record)))
        if self._waiting:
            log.warning("%d writes a stopped process left waiting for the store are made first", len(self))
            self._empty.clear()
            self._drainer = asyncio.ensure_future(self._drain())

    def _call_of(self, record: dict[str, Any]) -> tuple[Kind, Callable[[], Awaitable[Any]]] | None:
        """The call a record of the file stands for (``None``: not one this module writes)."""
        memory = None if self._memory is None else self._memory()
        if memory is None:
            return None
        kind, data = record.get("kind"), record.get("data")
        try:
            if not isinstance(data, dict):
                raise TypeError("no data")
            if kind in ("message", "edit"):
                message = Message.model_validate(data["message"])
                if kind == "message":
                    remake = self._remakers.get(str(data.get("by")))
                    if remake is not None:
                        return "message", lambda: remake(message)
                    return "message", lambda: platform_dated(memory.ingest(message))
                return "edit", lambda: platform_dated(memory.edit(message))
            if kind == "forget of deleted messages":
                tenant, chat_id = str(data["tenant"]), str(data["chat_id"])
                ids = [str(i) for i in data["message_ids"]]
                return kind, lambda: memory.forget_messages(chat_id=chat_id, message_ids=ids, tenant=tenant)
            if kind == "forget of a person":
                user_id, aliases = str(data["user_id"]), [str(a) for a in data.get("aliases", [])]
                listed, by = data.get("tenants"), data.get("by")

                async def tenants() -> Collection[str]:
                    if isinstance(listed, list):
                        return [str(t) for t in listed]
                    finder = self._finders.get(str(by))
                    if finder is not None:
                        return await finder(user_id)
                    # The integration that queued it is not attached here: every tenant that
                    # holds the person's ids.
                    return await tenants_holding(memory, [user_id, *aliases])

                return kind, lambda: forget_person(memory, tenants, user_id, aliases)
            if kind == "forget of a chat":
                tenant, chat_id, channel = str(data["tenant"]), str(data["chat_id"]), data.get("channel_id")
                if channel is not None and not isinstance(channel, str):
                    raise TypeError("channel_id is not a string")
                return kind, lambda: forget_chat(memory, tenant, chat_id, channel)
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            log.error("a waiting call in a bot backlog file is not as narrmem writes it (%s): left out", exc)
            return None
        log.error("a waiting call in a bot backlog file is of no kind narrmem writes: left out")
        return None


def _since_of(record: dict[str, Any]) -> dt.datetime | None:
    """When a call of a file was first tried (``None``: the file does not say, or not readably)."""
    return aware_time_in(record, "since")


def _makes(
    record: dict[str, Any],
    tenant: str,
    user_id: str | None,
    chat_id: str | None,
    messages: Sequence[str] | None,
) -> bool:
    """Whether the call ``record`` stands for makes the forget described (its own, in order)."""
    kind, data = record.get("kind"), record.get("data")
    if not isinstance(data, dict):
        return False
    if kind == "forget of a person":
        ids = {data.get("user_id"), *data.get("aliases", [])}
        listed = data.get("tenants")
        return (
            user_id in ids
            and chat_id is None
            and messages is None
            and (not isinstance(listed, list) or tenant in listed)
        )
    if kind == "forget of a chat":
        if data.get("tenant") != tenant or data.get("chat_id") != chat_id or user_id is not None:
            return False
        # The whole chat, or the messages of one channel of it (a server kept as one chat).
        return (messages is None) == (data.get("channel_id") is None)
    if kind == "forget of deleted messages":
        return (
            data.get("tenant") == tenant
            and data.get("chat_id") == chat_id
            and messages is not None
            and set(messages) <= set(data.get("message_ids", []))
        )
    if kind == "edit":
        message = data.get("message")
        return (
            isinstance(message, dict)
            and message.get("tenant") == tenant
            and message.get("chat_id") == chat_id
            and messages is not None
            and list(messages) == [message.get("message_id")]
        )
    return False


async def tenants_holding(memory: Memory, user_ids: Sequence[str]) -> set[str]:
    """The tenants where the store holds a memory of any of ``user_ids``: one seek per tenant on
    a store that can (:class:`~narrmem.store.FindsUserTenants`), else every user's counts read."""
    store = memory.store
    if isinstance(store, FindsUserTenants):
        return set(await store.user_tenants(user_ids))
    held = await store.users(None, limit=USERS_READ)
    return {u["tenant"] for u in held if u["user_id"] in set(user_ids)}


async def forget_person(
    memory: Memory,
    tenants: Callable[[], Awaitable[Collection[str]]],
    user_id: str,
    aliases: Collection[str],
) -> dict[str, int]:
    """Forget ``user_id`` and its ``aliases`` in each tenant ``tenants()`` reads; the counts summed."""
    total: dict[str, int] = {}
    for tenant in sorted(set(await tenants())):
        for who in [user_id, *sorted(set(aliases) - {user_id})]:
            forgot = await memory.forget(user_id=who, tenant=tenant, asked_at=asked_at())
            for key, value in forgot.items():
                total[key] = total.get(key, 0) + value
    return total


async def forget_chat(memory: Memory, tenant: str, chat_id: str, channel_id: str | None) -> dict[str, int]:
    """Forget a chat deleted on its platform (a Discord channel, thread or forum post), and the
    threads of a channel (a forum's posts): Discord deletes them with it and tells nothing of
    those its cache lacks (the archived ones, most of a forum's). Each thread a chat of its own,
    they are the ones noted under the channel (:func:`note_thread`); with ``channel_id``, only the
    messages of that channel and of its threads (:data:`PARENT_KEY`) in ``chat_id`` (a Discord
    server kept as one chat: they are read as the forget is made, so those stored after it was
    asked are taken too)."""
    if channel_id is None:
        counts = await memory.forget(chat_id=chat_id, tenant=tenant, asked_at=asked_at())
        failure: Exception | None = None
        for thread in await threads_of(memory, tenant, chat_id):
            # A thread the bot had in its cache was told deleted too, and may be forgotten by now.
            if await memory.store.recent(Scope(tenant=tenant, chat_id=thread), limit=1):
                try:
                    await memory.forget(chat_id=thread, tenant=tenant, asked_at=asked_at())
                except Exception as exc:
                    # The others still go (a failed forget is finished later, its job recorded).
                    failure = failure or exc
                    continue
            await forget_thread_note(memory, tenant, chat_id, thread)
        if failure is not None:
            raise failure
        return counts
    scope = Scope(tenant=tenant, chat_id=chat_id)
    said = await memory.store.recent(
        scope, kinds=["episode"], limit=2**62, meta_has=("channel_id", channel_id)
    )
    said += await memory.store.recent(
        scope, kinds=["episode"], limit=2**62, meta_has=(PARENT_KEY, channel_id)
    )
    ids = sorted({message_id for record in said for message_id in record.message_ids})
    if not ids:
        return {"memories": 0}
    return await memory.forget_messages(chat_id=chat_id, message_ids=ids, tenant=tenant)


async def note_thread(memory: Memory, tenant: str, channel_id: str, thread_id: str) -> None:
    """Note that the chat ``thread_id`` is a thread of the channel ``channel_id`` (ids only)."""
    await memory.store.state_put(THREADS_NAMESPACE, f"{_threads_key(tenant, channel_id)}{thread_id}\0", {})


async def forget_thread_note(memory: Memory, tenant: str, channel_id: str, thread_id: str) -> None:
    await memory.store.state_delete(THREADS_NAMESPACE, f"{_threads_key(tenant, channel_id)}{thread_id}\0")


async def threads_of(memory: Memory, tenant: str, channel_id: str) -> list[str]:
    """The threads noted under the channel ``channel_id`` of ``tenant``, read by their key where
    the store can."""
    prefix = _threads_key(tenant, channel_id)
    store = memory.store
    if isinstance(store, ReadsStateByPrefix):
        keys = [
            key for namespace, key, _ in await store.state_by_prefix(prefix) if namespace == THREADS_NAMESPACE
        ]
    else:
        keys = [key for key, _ in await store.state_items(THREADS_NAMESPACE) if key.startswith(prefix)]
    return sorted(key[len(prefix) :].rstrip("\0") for key in keys)


def _threads_key(tenant: str, channel_id: str) -> str:
    # Each id ended by a NUL, which no id holds: one channel's threads are never another's.
    return f"{tenant}\0{channel_id}\0"


def forget_chat_record(tenant: str, chat_id: str, channel_id: str | None) -> dict[str, Any]:
    return {
        "kind": "forget of a chat",
        "data": {"tenant": tenant, "chat_id": chat_id, "channel_id": channel_id},
    }


def message_record(
    kind: Literal["message", "edit"], message: Message, by: str | None = None
) -> dict[str, Any]:
    """What the file keeps of a waiting message or edit; ``by``: the integration whose chats its
    trigger suggestions go to (see :meth:`Backlog.remakes_messages`)."""
    data: dict[str, Any] = {"message": message.model_dump(mode="json")}
    if by is not None:
        data["by"] = by
    return {"kind": kind, "data": data}


def forget_messages_record(tenant: str, chat_id: str, message_ids: Sequence[str]) -> dict[str, Any]:
    return {
        "kind": "forget of deleted messages",
        "data": {"tenant": tenant, "chat_id": chat_id, "message_ids": list(message_ids)},
    }


def forget_person_record(
    user_id: str, aliases: Collection[str], tenants: Collection[str] | None, by: str | None
) -> dict[str, Any]:
    """What the file keeps of a person's forget: the tenants, or who reads them (``by``)."""
    listed = None if tenants is None else sorted(tenants)
    return {
        "kind": "forget of a person",
        "data": {"user_id": user_id, "aliases": sorted(aliases), "tenants": listed, "by": by},
    }


class _HearsForgets:
    """Tells a backlog of the forgets made other than by it (see the module)."""

    def __init__(self, backlog: Backlog) -> None:
        self._backlog = weakref.ref(backlog)

    @hookimpl
    async def narrmem_after_forget(
        self, tenant: str, user_id: str | None, chat_id: str | None, messages: list[str] | None
    ) -> None:
        backlog = self._backlog()
        if backlog is not None:
            await backlog.forgotten(tenant, user_id, chat_id, messages)

    @hookimpl
    async def narrmem_shutdown(self) -> None:
        backlog = self._backlog()
        if backlog is not None:
            await backlog.close()


_BACKLOGS: weakref.WeakKeyDictionary[Memory, Backlog] = weakref.WeakKeyDictionary()
HEARS_FORGETS = "narrmem_bot_backlog"


def backlog_of(memory: Memory) -> Backlog:
    """The backlog every integration on ``memory`` shares (so their writes keep one order)."""
    backlog = _BACKLOGS.get(memory)
    if backlog is None:
        backlog = _BACKLOGS[memory] = Backlog(memory)
        memory.host.register(_HearsForgets(backlog), name=HEARS_FORGETS)
        backlog.take_over_soon()
    return backlog
