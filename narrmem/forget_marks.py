"""What a forget leaves so that a write of what it forgot, made before it and arriving late, is
not stored: the mark of each scope it forgot, and when.

A bot's backlog (:mod:`narrmem.doors.integrations.backlog`) keeps the writes the store could not
take and makes them once it answers, possibly in a process other than the one a forget ran in
(another worker, or the next start of a bot stopped during an outage). This process's forgets take
what waits from it directly; another process's cannot reach it. So each explicit forget
(:meth:`~narrmem.memory.Memory.forget`, :meth:`~narrmem.memory.Memory.forget_messages`; an edit's
forget of its old text is not one) leaves in the store, before it deletes anything, one mark per
scope: the person, the chat, the person in the chat, or each deleted message. A write that waited
since ``since`` asks :meth:`ForgetMarks.forgotten_by` whether any of its message's scopes was
forgotten after then, and is dropped if so.

A mark is an HMAC-SHA256 of the scope's ids under a random key of the store (namespace
:data:`NAMESPACE`), and the time of the forget: not the ids themselves, yet, with the key, a test of
whether a given id was forgotten, as a suppression list is. Marks are kept ``[storage]
forget_marks_kept_s`` (7 days by default; 0 leaves none) and then deleted, after a forget (at most
an hour late) or at an open, once two purges a day apart have found them expired (a clock a year
ahead once took them all); a backlog's write that waited longer than that is dropped rather than
made unchecked. Exports leave the namespace out. A mark's time is the clock of the process that
made the forget, a write's the clock of the one that held it: workers' clocks should agree
(NTP), as for every other time narrmem keeps.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from narrmem import logs
from narrmem.errors import StoreError, StoreUnavailableError
from narrmem.models import IngestResult, MemoryRecord, Message, Scope

if TYPE_CHECKING:
    from narrmem.lifecycle import MemoryLifecycle
    from narrmem.memory import Memory

log = logs.logger("narrmem")

NAMESPACE = "narrmem.forget_marks"
KEY_ENTRY = "key"  # the HMAC key; marks' entries start with MARK (no mark's key is its prefix)
MARK = "m:"
# Expired marks are looked for at most this often by a process's forgets (and at each open).
PURGE_EVERY_S = 3600.0
# Tries of a compare-and-set against other workers marking the same scope at once.
CAS_TRIES = 20
# A mark found expired goes at a purge at least this long after the first that found it so.
EXPIRY_CONFIRMED_AFTER_S = 86_400.0
SEEN_EXPIRED = "expired_seen"  # the key of a mark's value noting when a purge first found it expired
# The time an unreadable mark is taken for: later than any write (it cannot be told apart from one).
UNREADABLE = dt.datetime.max.replace(tzinfo=dt.UTC)


class ForgetMarks:
    def __init__(self, memory: MemoryLifecycle) -> None:
        self.memory = memory
        self._key: bytes | None = None
        self._purged_at: dt.datetime | None = None

    @property
    def kept_s(self) -> float:
        return self.memory.settings.storage.forget_marks_kept_s

    async def leave(
        self, scope: Scope, message_ids: Sequence[str] | None, asked_at: dt.datetime | None
    ) -> None:
        """Mark ``scope`` (or its ``message_ids``) forgotten at ``asked_at`` (default: now). A mark
        already later is kept: the latest forget is what a late write is measured against."""
        if self.kept_s <= 0:
            return
        now = self.memory.clock.now()
        at = now if asked_at is None else min(asked_at, now)
        if message_ids is None:
            names = [_scope_name(scope)]
        else:
            names = [("message", scope.tenant, scope.chat_id or "", mid) for mid in message_ids]
        key = await self._hmac_key()
        for name in dict.fromkeys(names):
            await self._mark(_mark_key(key, name), at)

    async def forgotten_by(
        self, message: Message, since: dt.datetime, *, itself: bool = True
    ) -> dt.datetime | None:
        """When a forget of ``message``'s person, chat, person in the chat, or (``itself``) the
        message itself was made after ``since`` (``None``: none was). Reads only."""
        if self.kept_s <= 0:
            return None
        stored = await self.memory.store.state_get(NAMESPACE, KEY_ENTRY)
        if stored is None:
            return None  # no forget was ever marked here
        key = _key_of(stored)
        for name in _names_of(message, itself=itself):
            value = await self.memory.store.state_get(NAMESPACE, _mark_key(key, name))
            at = None if value is None else _time_or_none(value)
            if value is not None and at is None:
                log.error("a forget mark is not as narrmem writes it: taken as a forget made now")
                at = UNREADABLE
            if at is not None and at > since:
                return at
        return None

    async def all_read(self) -> Callable[[Message], bool] | None:
        """Whether a message was said before a forget of its person, chat, person in the chat or
        itself, answered from every mark read once (an import of thousands of messages asks for
        each); ``None`` when no forget was ever marked. Reads only."""
        read = await self._read_all()
        if read is None:
            return None
        key, marks = read

        def said_before_a_forget(message: Message) -> bool:
            return _forgotten_after(key, marks, _names_of(message, itself=True), message.ts)

        return said_before_a_forget

    async def records_read(self) -> Callable[[MemoryRecord], bool] | None:
        """:meth:`all_read` for memories (an export file's, imported again): whether a memory
        was said (``created_at``) and stored (``stored_at``, when known) before a forget of its
        person, chat, person in the chat or one of its messages, the forget of which deleted it
        (one stored after, a message sent again or said a moment before the forget and written
        after it, is not one). ``None`` when no mark is kept. Reads only."""
        read = await self._read_all()
        if read is None:
            return None
        key, marks = read
        scopes: dict[tuple[str, ...], dt.datetime | None] = {}  # a person's, a chat's: asked often

        def mark_of(name: tuple[str, ...]) -> dt.datetime | None:
            if name[0] == "message":
                return marks.get(_mark_key(key, name))
            if name not in scopes:
                scopes[name] = marks.get(_mark_key(key, name))
            return scopes[name]

        def said_before_a_forget(record: MemoryRecord) -> bool:
            names = [
                ("user", record.tenant, record.user_id),
                ("chat", record.tenant, record.chat_id),
                ("user_in_chat", record.tenant, record.chat_id, record.user_id),
                *(("message", record.tenant, record.chat_id, mid) for mid in record.message_ids),
            ]
            stored = record.stored_at
            for name in names:
                at = mark_of(name)
                if at is not None and at > record.created_at and (stored is None or stored < at):
                    return True
            return False

        return said_before_a_forget

    async def _read_all(self) -> tuple[bytes, dict[str, dt.datetime]] | None:
        if self.kept_s <= 0:
            return None
        store = self.memory.store
        stored = await store.state_get(NAMESPACE, KEY_ENTRY)
        if stored is None:
            return None
        marks: dict[str, dt.datetime] = {}
        for name, value in await store.state_items(NAMESPACE):
            if name.startswith(MARK):
                marks[name] = _time_or_none(value) or UNREADABLE
        if not marks:
            return None  # every mark expired: nothing to ask
        return _key_of(stored), marks

    async def finished(self, scope: Scope, asked_at: dt.datetime) -> None:
        """Note that a forget of ``scope`` asked at ``asked_at`` ran to its end (see
        :meth:`finished_at`); kept as the marks are."""
        if self.kept_s <= 0:
            return
        key = await self._hmac_key()
        await self._mark(_mark_key(key, ("finished", *_scope_name(scope))), asked_at)

    async def finished_at(self, scope: Scope) -> dt.datetime | None:
        """When the latest forget of ``scope`` itself (the person, the chat, or the person in the
        chat) that ran to its end was asked, if that is still kept. A forget's mark is written
        before anything is deleted, so it cannot say this: a forget that failed right after it
        left one. Reads only."""
        if self.kept_s <= 0:
            return None
        stored = await self.memory.store.state_get(NAMESPACE, KEY_ENTRY)
        if stored is None:
            return None
        name = ("finished", *_scope_name(scope))
        value = await self.memory.store.state_get(NAMESPACE, _mark_key(_key_of(stored), name))
        return None if value is None else _time_or_none(value)

    def outlived(self, since: dt.datetime) -> bool:
        """Whether a write waiting since ``since`` waited longer than marks are kept (a forget made
        after it may have left its mark and seen it deleted)."""
        if self.kept_s <= 0:
            return False
        return (self.memory.clock.now() - since).total_seconds() > self.kept_s

    async def purge_expired(self) -> int:
        """Delete the marks older than they are kept, once a purge at least
        :data:`EXPIRY_CONFIRMED_AFTER_S` before found them so too (and any not as narrmem writes
        them, at once); how many. A process opened once with its clock a year ahead took every
        mark: an old export imported after the clock was put right brought the forgotten back.
        The first purge that finds a mark expired notes when (``expired_seen``); a clock put back
        before that time, or before the mark's expiry, takes the note away."""
        now = self.memory.clock.now()
        self._purged_at = now
        store = self.memory.store
        cutoff = now - dt.timedelta(seconds=self.kept_s)
        gone = 0
        # A store of a version before compare-and-delete: read again just before the delete.
        delete_if = getattr(store, "state_delete_if", None)
        for entry, value in await store.state_items(NAMESPACE):
            if not entry.startswith(MARK):
                continue
            seen = aware_time_in(value, SEEN_EXPIRED)
            if _time_or_none(value) is not None:
                if not _expired(value, cutoff) or seen is None or seen > now:
                    await self._note_expiry(entry, value, seen, now if _expired(value, cutoff) else None)
                    continue
                if (now - seen).total_seconds() < EXPIRY_CONFIRMED_AFTER_S:
                    continue
            # Deleted only as read: a mark another worker renewed since the list was read stays.
            if delete_if is not None:
                gone += await delete_if(NAMESPACE, entry, value)
            elif (again := await store.state_get(NAMESPACE, entry)) is not None and again == value:
                gone += await store.state_delete(NAMESPACE, entry)
        return gone

    async def _note_expiry(
        self, entry: str, value: dict[str, Any], seen: dt.datetime | None, now: dt.datetime | None
    ) -> None:
        """Note (``now``) or take away (``None``) when a purge first found ``entry`` expired, as
        read: a mark renewed meanwhile is left as it is."""
        if seen is None and now is None:
            return
        noted = {key: v for key, v in value.items() if key != SEEN_EXPIRED}
        if now is not None:
            noted[SEEN_EXPIRED] = now.isoformat()
        await self.memory.store.state_put_if(NAMESPACE, entry, noted, value)

    async def purge_if_due(self) -> None:
        """:meth:`purge_expired` if this process has not looked for expired marks in an hour."""
        now = self.memory.clock.now()
        if self._purged_at is None or (now - self._purged_at).total_seconds() >= PURGE_EVERY_S:
            await self.purge_expired()

    async def _mark(self, entry: str, at: dt.datetime) -> None:
        store = self.memory.store
        value = {"at": at.isoformat()}
        for _ in range(CAS_TRIES):
            stored = await store.state_get(NAMESPACE, entry)
            earlier = None if stored is None else _time_or_none(stored)
            if earlier is not None and earlier >= at:
                return
            if await store.state_put_if(NAMESPACE, entry, value, stored):
                return
        # Other workers kept changing it: worth trying again (503), not a refusal (409).
        raise StoreUnavailableError(f"the forget's mark could not be written in {CAS_TRIES} tries")

    async def _hmac_key(self) -> bytes:
        if self._key is None:
            store = self.memory.store
            fresh = {"hex": secrets.token_hex(32)}
            # Of workers making the first mark at once, one key wins and all use it.
            await store.state_put_if(NAMESPACE, KEY_ENTRY, fresh, None)
            stored = await store.state_get(NAMESPACE, KEY_ENTRY)
            if stored is None:
                raise StoreError("the forget marks' key was written and is not there")
            self._key = _key_of(stored)
        return self._key


FORGOTTEN_SINCE = (
    "forgotten since it was first sent: a forget of it, its chat or its user came after held_since"
)


HELD_TOO_LONG = (
    "held longer than forgets are remembered ([storage] forget_marks_kept_s): not stored, as a forget "
    "made since may have left no mark"
)


async def write_held(
    memory: Memory,
    sent: Sequence[tuple[Message, dt.datetime | None]],
    write: Callable[[list[Message]], Awaitable[list[IngestResult]]],
) -> list[IngestResult]:
    """``write(messages)`` of the messages a client sends, each with since when it held it
    (``None``: not held), in one call for all that are written (a batch validated whole). A held
    message forgotten since then, or held longer than marks are kept, is not written; one found
    forgotten just after the write is forgotten again. Either way its result says it is not
    stored, and why."""
    refused: dict[int, str] = {}
    for index, (message, since) in enumerate(sent):
        if since is None:
            continue
        if memory.forget_marks.outlived(since):
            refused[index] = HELD_TOO_LONG
        elif await memory.forgotten_after(message, since):
            # An earlier send of it may have been written after the forget (its check after the
            # write then failing): what that left goes.
            await forget_written(memory, message)
            refused[index] = FORGOTTEN_SINCE
    kept = [index for index in range(len(sent)) if index not in refused]
    written = await write([sent[index][0] for index in kept]) if kept else []
    results = dict(zip(kept, written, strict=True))
    for index in kept:
        message, since = sent[index]
        if since is not None and await memory.forgotten_after(message, since):
            await forget_written(memory, message)
            results[index] = _not_stored(results[index], FORGOTTEN_SINCE)
    for index, reason in refused.items():
        message = sent[index][0]
        # One of someone forgotten since is not triaged: its text would be embedded (and kept in
        # the embedder's recent texts) and every plugin's triage run for it (a plugin counting
        # what it refused wrote state about them that no forget would take away).
        layer = "ignore" if reason == FORGOTTEN_SINCE else (await memory.triage(message)).layer
        results[index] = IngestResult(message_id=message.message_id, layer=layer, stored=False, reason=reason)
    return [results[index] for index in range(len(sent))]


def _not_stored(result: IngestResult, reason: str) -> IngestResult:
    """``result`` of a write whose message was forgotten again: nothing of it is said as made."""
    gone: dict[str, Any] = {
        "stored": False,
        "duplicate": False,
        "memory_ids": [],
        "records": [],
        "scene": None,
        "counts": [],
        "triggers": [],
        "notes": [],
        "reason": reason,
    }
    return result.model_copy(update=gone)


async def forget_written(memory: Memory, message: Message) -> None:
    """Forget what a held write of ``message`` stored after a forget that missed it: the message's
    own forget (a forget of its person or chat again would take what they said since, too)."""
    await memory.forget_messages(
        chat_id=message.chat_id, message_ids=[message.message_id], tenant=message.tenant
    )


def _names_of(message: Message, *, itself: bool) -> list[tuple[str, ...]]:
    """The scopes a forget of which took ``message``."""
    names = [
        ("user", message.tenant, message.user_id),
        ("chat", message.tenant, message.chat_id),
        ("user_in_chat", message.tenant, message.chat_id, message.user_id),
    ]
    if itself:
        names.append(("message", message.tenant, message.chat_id, message.message_id))
    return names


def _forgotten_after(
    key: bytes, marks: dict[str, dt.datetime], names: Sequence[tuple[str, ...]], said: dt.datetime
) -> bool:
    for name in names:
        at = marks.get(_mark_key(key, name))
        if at is not None and at > said:
            return True
    return False


def _scope_name(scope: Scope) -> tuple[str, ...]:
    if scope.user_id is not None and scope.chat_id is not None:
        return ("user_in_chat", scope.tenant, scope.chat_id, scope.user_id)
    if scope.user_id is not None:
        return ("user", scope.tenant, scope.user_id)
    return ("chat", scope.tenant, scope.chat_id or "")


def _mark_key(key: bytes, name: tuple[str, ...]) -> str:
    # Ids hold no NUL (checked at every door), so the joined name is one scope's alone.
    return MARK + hmac.new(key, "\0".join(name).encode(), hashlib.sha256).hexdigest()


def _key_of(value: dict[str, Any]) -> bytes:
    try:
        return bytes.fromhex(str(value["hex"]))
    except (KeyError, ValueError) as exc:
        raise StoreError(f"the forget marks' key in {NAMESPACE!r} is not as narrmem writes it") from exc


def _time_or_none(value: dict[str, Any]) -> dt.datetime | None:
    """A mark's time; ``None`` for one not as narrmem writes it (edited by hand)."""
    return aware_time_in(value, "at")


def aware_time_in(value: dict[str, Any], key: str) -> dt.datetime | None:
    """``value[key]`` read as an ISO 8601 time with a timezone; ``None`` if absent or not one."""
    try:
        at = dt.datetime.fromisoformat(str(value[key]))
    except (KeyError, ValueError):
        return None
    return at if at.tzinfo is not None else None


def _expired(value: dict[str, Any], cutoff: dt.datetime) -> bool:
    at = _time_or_none(value)
    return at is None or at < cutoff
