"""Acknowledged on receipt (``[storage] acknowledge = "on_receipt"``).

A call of up to :data:`~narrmem.model_child.SHORT_TEXTS` messages (a bot's message as it comes) is
validated, triaged and checked against what is stored, and then put in the store as it came, in
one small write (plugin state, namespace :data:`NAMESPACE`): ingest answers then, before the
message's own embedding. A task of this memory takes what was received, oldest first and in
batches, embeds it, writes it with its after-store hooks recorded (:mod:`narrmem.settling`, which
runs them), and deletes the received entries. A process that stops first leaves its entries for
the next process to open the store, once this one is gone (the claim :mod:`narrmem.settling`
holds): that process ingests them. An entry written twice (stored, then its deletion lost to a
stop) is stored once: the store keeps one episode per message. A message whose write fails (a
database locked past its timeout, a connection lost) is tried again alone, after
:data:`RETRY_DELAYS` and then every :data:`RETRY_EVERY` seconds while the process runs; what is
left at close waits in the store for the next open. Forget, settle and close do not wait for a
message waiting for its next try (a forget waits for a try under way: :mod:`narrmem.fence`).

Recall in this process waits for what it received in the asked scope to be written, so a bot
recalls what it was just told; a forget, an edit, :meth:`~narrmem.memory.Memory.settle` and closing
wait for everything received before them. Entries hold the message's words until it is written.
A forget deletes the entries of what it forgets, whichever process received them, before it
deletes any memory. The writer asks whether each entry is still there inside its write's unit of
the fence and leaves out a message whose entry is gone, so no after-store hook runs (and no trigger
fires) for what another worker forgot; a forget that begins after that waits for the write and
the deletion of its entries, which come before its unit ends. An entry that goes during the write
(a forget from hooks waits for no other worker) is found gone when it comes to be deleted, and the
message is forgotten again, so a forget run by another worker of a shared store leaves nothing of
what this one had received. (Deleted after the unit, an entry could also be taken by the forget
of an edit in another worker, which had deleted what was written here and stored the new text:
forgotten again by its id, the new text went with it.)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from narrmem import logs
from narrmem.errors import InputError, StoreUnavailableError
from narrmem.ingest import Pending, stored_result
from narrmem.models import ForgetJob, IngestResult, Message, Scope, TriageDecision
from narrmem.settling import drop_forgotten, entry_message, forgotten_by, stopped_owners

if TYPE_CHECKING:
    from narrmem.fence import Fence
    from narrmem.forgetting import Forgetting
    from narrmem.ingest import IngestPipeline
    from narrmem.lifecycle import MemoryLifecycle
    from narrmem.store import MessageKey

log = logs.logger("narrmem")

NAMESPACE = "narrmem.inbox"
# Messages received and not yet written, past which ingest waits for the oldest: what a stop leaves
# for the next open, and how far recall can lag behind, stay bounded. As many whose write failed
# (waiting to be tried again) make ingest refuse more until some are written.
MAX_UNWRITTEN = 1024
# Keys of messages this process wrote last: a call racing their write finds them stored.
RECENTLY_WRITTEN = 4096
# Seconds before each new try of a message whose write failed, each try alone: a transient failure
# (a lock held past the busy timeout, a connection lost) is written within a minute, not at the
# next open; after them, a try every RETRY_EVERY seconds, so that a long outage ends by itself.
RETRY_DELAYS = (0.5, 2.0, 8.0, 30.0)
RETRY_EVERY = 300.0
# Seconds close gives a try under way before it cancels it.
CLOSE_WAIT = 5.0
# Batches of received messages written at once, at most. One writer takes them in turn while each
# batch is written within SLOW_BATCH_S (one writer makes the biggest batches, and leaves the event
# loop to the calls being answered: four from the start answered a stream of 300 messages in
# 0.55-0.61 s instead of 0.39-0.42 s); past it, another starts. Before, one person's message whose
# before-store hook took its time (a service it calls) held every message received after it, and
# the recall of each of their scopes, which waits for them.
WRITERS = 4
SLOW_BATCH_S = 0.5
# What a message's writes are ordered by: its chat and its person.
LaneKey = tuple[str, str, str]


@dataclass
class Received:
    """A message acknowledged and not yet written: its entry's key, the message triaged, a future
    done once it is written (or its first write failed: it is tried again later), one done once its
    entry is deleted too (or left), how many tries of it failed, and whether a forget took it out
    while it waited for another try."""

    key: str
    item: Pending
    written: asyncio.Future[None]
    finished: asyncio.Future[None]
    failures: int = 0
    forgotten: bool = False


class Inbox:
    def __init__(self, memory: MemoryLifecycle, token: str, owners_gone: set[str], fence: Fence) -> None:
        self.memory = memory
        self.fence = fence
        # Entries' keys start with the token of this process's claim (see narrmem.settling).
        self.token = token
        self.owners_gone = owners_gone
        self._numbers = itertools.count()
        self._unwritten: collections.OrderedDict[MessageKey, Received] = collections.OrderedDict()
        self._unfinished: dict[MessageKey, Received] = {}
        self._written: collections.OrderedDict[MessageKey, None] = collections.OrderedDict()
        # Messages whose write failed, each tried again at its time (the loop's clock); one stays
        # here while it is tried, so that the same message sent again meanwhile is a duplicate.
        self._retrying: dict[MessageKey, tuple[float, Received]] = {}
        self._waiting: collections.deque[Received] = collections.deque()
        self._writers: dict[asyncio.Task[None], float] = {}  # each with the time it began
        self._writing: set[LaneKey] = set()  # chats and people a writer has in hand
        self._retrier: asyncio.Task[None] | None = None
        self._retry_due = asyncio.Event()
        self._closing = False
        self._pipeline: IngestPipeline | None = None
        self._forgetting: Forgetting | None = None
        self._room = asyncio.Condition()
        self._cleanups: set[asyncio.Task[None]] = set()

    def start(self, pipeline: IngestPipeline, forgetting: Forgetting) -> None:
        self._pipeline = pipeline
        self._forgetting = forgetting

    # --- receiving ------------------------------------------------------------------------------

    def _holds(self, key: MessageKey) -> bool:
        """Whether a message with this key was received here and is not yet written (on its way,
        or waiting for another try), or was written here a moment ago."""
        return key in self._unfinished or key in self._written or key in self._retrying

    @property
    def _failed(self) -> int:
        """Messages received here whose write failed and that wait for another try."""
        return len(self._retrying)

    async def receive(self, items: Sequence[Pending]) -> list[IngestResult | None]:
        """Put triaged, new messages in the store as they came and queue them for writing; their
        results say so (``written = False``). ``None`` for a message that another call received
        meanwhile (a duplicate)."""
        async with self._room:
            await self._room.wait_for(
                lambda: self._failed >= MAX_UNWRITTEN or len(self._unwritten) + self._failed < MAX_UNWRITTEN
            )
            if self._failed >= MAX_UNWRITTEN:
                # A state that passes (503 and Retry-After over HTTP; a bot's backlog keeps the
                # message): answered 409, a client took it for a refusal and dropped the message.
                raise StoreUnavailableError(
                    f"{self._failed} received messages could not be written (see the log); they wait in "
                    "the store and are tried again, and no more are taken until some are written"
                )
        loop = asyncio.get_running_loop()
        # Held before the write, so that a call racing this one finds them.
        fresh = [item for item in items if not self._holds(item.key)]
        received = [Received(self._key(), item, loop.create_future(), loop.create_future()) for item in fresh]
        for r in received:
            self._unwritten[r.item.key] = r
            self._unfinished[r.item.key] = r
        # A call cancelled during the write does not cancel the write (it may be committed
        # already): once it ends, its entries are written like any, not left until the next open.
        put = asyncio.ensure_future(self._put(received))
        try:
            await asyncio.shield(put)
        except asyncio.CancelledError:
            if not put.done():
                put.add_done_callback(functools.partial(self._put_ended, received))
                raise
            self._put_ended(received, put)
            raise
        except BaseException:
            await self._not_received(received)
            raise
        self._queue(received)
        results = {id(r.item): received_result(r.item) for r in received}
        return [results.get(id(item)) for item in items]

    def _queue(self, received: Sequence[Received]) -> None:
        self._waiting.extend(received)
        self._dispatch()

    def _put_ended(self, received: Sequence[Received], put: asyncio.Future[None]) -> None:
        """The write of a cancelled call's entries ended: queue them if it went through."""
        error = None if put.cancelled() else put.exception()
        if put.cancelled() or error is not None:
            if error is not None:
                log.error("keeping the messages of a cancelled call failed", exc_info=error)
            self._let_go(received)
            task = asyncio.ensure_future(self._notify())
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)
        else:
            self._queue(received)

    async def _not_received(self, received: Sequence[Received]) -> None:
        self._let_go(received)
        await self._notify()

    def _let_go(self, received: Sequence[Received]) -> None:
        """No one here waits for these any longer: written, or left in the store."""
        self._done(received, written=False)  # a no-op for those written
        self._finish(received)

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def _put(self, received: Sequence[Received]) -> None:
        entries = [(NAMESPACE, r.key, _entry(r.item.message, r.item.decision)) for r in received]
        store = self.memory.store
        if len(entries) == 1:
            await store.state_put(*entries[0])
        elif entries:
            # The messages of one call are kept together or not at all: state written with no records.
            nothing = np.zeros((0, self.memory.embedder.dim), dtype=np.float32)
            await store.add([], nothing, state=entries)

    def _key(self) -> str:
        return f"{self.token}:{next(self._numbers):012d}"

    # --- writing --------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start a writer on what waits: one at a time, as long as each batch is written within
        :data:`SLOW_BATCH_S`; past it, another (up to :data:`WRITERS`) for the chats and people
        the slow one does not hold."""
        loop = asyncio.get_running_loop()
        while len(self._writers) < WRITERS:
            now = loop.time()
            if any(now - began < SLOW_BATCH_S for began in self._writers.values()):
                return
            batch = self._next_batch()
            if not batch:
                return
            writer = asyncio.ensure_future(self._write_batch(batch))
            self._writers[writer] = now
            writer.add_done_callback(functools.partial(self._writer_ended, batch))
            # Still at it then, it lets another writer start on the rest.
            loop.call_later(SLOW_BATCH_S, self._dispatch)

    def _next_batch(self) -> list[Received]:
        """The oldest waiting messages, up to ``batch_size``, of chats and people no writer has in
        hand. A chat's messages, and a person's, are written in the order they came, a batch after
        the one before; a slow before-store hook on one person's message holds up only the
        messages of its batch and those that must follow them."""
        size = self.memory.settings.storage.batch_size
        taken: list[Received] = []
        left: collections.deque[Received] = collections.deque()
        blocked = set(self._writing)
        for r in self._waiting:
            keys = lane_keys(r.item.message)
            if len(taken) < size and blocked.isdisjoint(keys):
                taken.append(r)
            else:
                blocked.update(keys)  # what comes later in its chat, or from its person, waits too
                left.append(r)
        self._waiting = left
        for r in taken:
            self._writing.update(lane_keys(r.item.message))
        return taken

    async def _write_batch(self, batch: list[Received]) -> None:
        try:
            written = await self._write(
                [(r.key, r.item) for r in batch], on_written=functools.partial(self._done, batch)
            )
            if not written:
                self._retry_later(batch)
        finally:
            self._let_go(batch)
            await self._notify()

    def _writer_ended(self, batch: list[Received], writer: asyncio.Task[None]) -> None:
        self._writers.pop(writer, None)
        for r in batch:
            self._writing.difference_update(lane_keys(r.item.message))
        if writer.cancelled():
            # Cancelled with its event loop: what waits stays in the store for the next open, and
            # no one waits for it here any longer.
            left = list(self._waiting)
            self._waiting.clear()
            self._let_go(left)
            return
        if writer.exception() is not None:
            log.error("writing received messages failed", exc_info=writer.exception())
        self._dispatch()

    def _retry_later(self, batch: Sequence[Received]) -> None:
        """Try each message of a failed write again alone, after its next delay. Who waits for them
        is not held up meanwhile: recall goes on without them, as after a failure."""
        loop = asyncio.get_running_loop()
        for r in batch:
            if r.forgotten:
                continue
            delay = RETRY_DELAYS[r.failures] if r.failures < len(RETRY_DELAYS) else RETRY_EVERY
            if r.failures == len(RETRY_DELAYS):
                log.error(
                    "a received message still cannot be written; it is tried again every %.0f s", RETRY_EVERY
                )
            r.failures += 1
            self._retrying[r.item.key] = (loop.time() + delay, r)
        if self._retrying and not self._closing and (self._retrier is None or self._retrier.done()):
            self._retrier = asyncio.ensure_future(self._retry())
            self._retrier.add_done_callback(_log_failure)
        self._retry_due.set()

    async def _retry(self) -> None:
        """Try again, one message at a time, those whose time has come, until none is left."""
        loop = asyncio.get_running_loop()
        while self._retrying and not self._closing:
            self._retry_due.clear()
            now = loop.time()
            due = sorted((r for at, r in self._retrying.values() if at <= now), key=lambda r: r.key)
            if not due:
                wait = min(at for at, _ in self._retrying.values()) - now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._retry_due.wait(), wait)
                continue
            for r in due:
                if self._closing:
                    return
                # A unit of narrmem.fence from the check of its entry to its write: a forget of
                # this process (an edit's) comes wholly before it or after it. Forgets do not
                # wait for messages waiting for their next try otherwise.
                unit = await self.fence.enter(receiving=True)
                try:
                    held = self._retrying.get(r.item.key)
                    if r.forgotten or held is None or held[1] is not r:
                        continue  # a forget took it out meanwhile
                    written = await self.fence.run_inside(unit, functools.partial(self._try_again, r))
                finally:
                    self.fence.leave(unit)
                if written or r.forgotten:
                    held = self._retrying.get(r.item.key)
                    if held is not None and held[1] is r:  # not the same message sent again since
                        del self._retrying[r.item.key]
                else:
                    self._retry_later([r])
                await self._notify()

    async def _try_again(self, r: Received) -> bool:
        """Write a message whose write failed; ``False`` if it failed again."""
        try:
            present = await self.memory.store.state_get(NAMESPACE, r.key) is not None
        except Exception:
            log.exception("reading a received message's entry failed")
            return False
        # Its entry gone: a forget took the message out before it could be written.
        return not present or await self._write(
            [(r.key, r.item)], on_written=functools.partial(self._remember_written, r)
        )

    def _remember_written(self, r: Received) -> None:
        self._written[r.item.key] = None
        while len(self._written) > RECENTLY_WRITTEN:
            self._written.popitem(last=False)

    async def close(self) -> None:
        """Stop trying failed writes again: their messages wait in the store for the next open. A
        try under way is given a few seconds to end, then cancelled (its entry stays)."""
        self._closing = True
        self._retry_due.set()
        retrier = self._retrier
        if retrier is not None and not retrier.done():
            await asyncio.wait([retrier], timeout=CLOSE_WAIT)
            retrier.cancel()
            await asyncio.gather(retrier, return_exceptions=True)

    async def _write(
        self, entries: Sequence[tuple[str, Pending]], on_written: Callable[[], None] | None = None
    ) -> bool:
        """Write received messages and delete their entries; ``False`` if the write failed (the
        entries stay: tried again, or left for the next open). A message whose entry a forget took
        before the write began is not written (asked inside the write's unit of the fence), and is
        forgotten again here all the same: its before-store hooks ran (a chat's cached turns hold
        its words). Entries are deleted inside the write's unit; one that went during the write (a
        forget from hooks waits for no other worker) is forgotten again once written."""
        assert self._pipeline is not None and self._forgetting is not None
        keys = {id(item): key for key, item in entries}
        taken: set[str] = set()

        async def still_received(items: list[Pending]) -> list[Pending]:
            kept = []
            for item in items:
                key = keys[id(item)]
                if await self.memory.store.state_get(NAMESPACE, key) is None:
                    taken.add(key)
                else:
                    kept.append(item)
            return kept

        gone: list[Pending] = []  # written, their entries taken meanwhile

        async def delete_entries() -> None:
            # Inside the write's unit: a forget of another worker that did not take an entry
            # before the write (still_received) waits for the write and this deletion. Deleted
            # after the unit, an entry could be taken by the forget of an edit in another worker,
            # which deleted what this wrote and stored the new text: this then found the entry
            # gone and forgot the message id again, and the new text went with it.
            try:
                for key, item in entries:
                    if key in taken or await self.memory.store.state_delete(NAMESPACE, key):
                        continue
                    # Taken during the write. One found stored already (a duplicate: an edit's
                    # new text written in another worker after the forget that took the entry)
                    # was not written here, and none of its hooks ran: nothing of it to forget.
                    # Forgotten again by its id, the edit's new text went with it.
                    if any(record.id is not None for record in item.records):
                        gone.append(item)
            except Exception:
                # Written already: the next open finds the messages stored and skips them.
                log.exception("deleting %d received entries after their write failed", len(entries))

        try:
            await self._pipeline.store_received(
                [item for _, item in entries], still_received, written=delete_entries
            )
        except Exception:
            log.exception("writing %d received messages failed; their entries are kept", len(entries))
            return False
        if on_written is not None:
            on_written()
        for key, item in entries:
            if key in taken or any(item is other for other in gone):
                # Forgotten: sent again, it is new (the forget that took it may be another
                # worker's, whose drop of what was written a moment ago is not seen here).
                self._written.pop(item.key, None)
        if gone:
            # Only a forget run from hooks (which waits for no other worker) takes an entry
            # during its write: it may have deleted before the write, or before these
            # messages' after-store hooks, which run after it.
            log.warning(
                "%d message(s) received here were forgotten while written; forgetting them again", len(gone)
            )
        try:
            for key, item in entries:
                message = item.message
                if key in taken:
                    # Not written. Stored since by someone else (written after the forget that
                    # took it: an edit's new text, or the message sent again), it is theirs,
                    # and so are the copies the plugins keep of it by its id.
                    if await self.memory.store.from_messages(
                        message.tenant, message.chat_id, [message.message_id]
                    ):
                        continue
                elif not any(item is other for other in gone):
                    continue
                # What this worker wrote of it goes, and what its hooks kept (a chat's cached
                # turns hold its words), but nothing someone else stored under its id after the
                # forget that took it. Before, all was deleted by the id, and an edit's new text
                # stored meanwhile went with it.
                written = [r.id for r in item.records if r.id is not None] if key not in taken else []
                scope = Scope(tenant=message.tenant, chat_id=message.chat_id)
                try:
                    await self._forgetting.again(scope, [message.message_id], written)
                except Exception as exc:
                    # Nothing else would: the forget that took it has ended, and no job of this
                    # one may be recorded yet. Tried again until it is done.
                    log.warning("forgetting again a message a forget took failed (%s)", type(exc).__name__)
                    self._forgetting.again_later(scope, [message.message_id], written)
        except Exception:
            log.exception("forgetting again %d received messages a forget took failed", len(entries))
        return True

    def _done(self, batch: Sequence[Received], *, written: bool = True) -> None:
        for r in batch:
            if self._unwritten.pop(r.item.key, None) is None:
                continue
            if written:
                self._remember_written(r)
            if not r.written.done():
                r.written.set_result(None)

    def _finish(self, batch: Sequence[Received]) -> None:
        for r in batch:
            self._unfinished.pop(r.item.key, None)
            if not r.finished.done():
                r.finished.set_result(None)

    async def written(self, scope: Scope | None = None, excluding: Collection[str] = ()) -> None:
        """Wait until what this process received (in ``scope``, else all of it) is written, but for
        the messages ``excluding`` names (a recall that leaves them out needs none of them)."""
        if not self._unwritten:
            return
        waits = [
            r.written
            for r in self._unwritten.values()
            if (scope is None or _in_scope(r.item.message, scope))
            and r.item.message.message_id not in excluding
        ]
        if waits:
            await asyncio.wait(waits)

    async def drained(self) -> None:
        """Wait until what this process received so far is written and its entries deleted (what
        comes in meanwhile is not waited for)."""
        waits = [r.finished for r in self._unfinished.values()]
        if waits:
            await asyncio.wait(waits)

    # --- opening and forgetting ---------------------------------------------------------------

    async def recover(self) -> int:
        """Ingest what stopped processes received and did not write; return how many messages. A
        batch whose write fails is left for the next open."""
        store = self.memory.store
        batch_size = self.memory.settings.storage.batch_size
        done = 0
        async for entries in stopped_owners(store, NAMESPACE, self.token, self.owners_gone):
            log.warning("writing %d messages a stopped process received", len(entries))
            for start in range(0, len(entries), batch_size):
                part: list[tuple[str, Pending]] = []
                for n, (key, value) in enumerate(entries[start : start + batch_size]):
                    item = _rebuild(value, n)
                    if item is None:
                        log.error("a received entry %r is not a message; deleted", key)
                        await store.state_delete(NAMESPACE, key)
                    else:
                        part.append((key, item))
                if part and await self._write(part):
                    done += len(part)
        return done

    def holds_here(self, scope: Scope) -> bool:
        """Whether this process holds a message of ``scope`` received and not yet written (being
        written, or waiting for another try)."""
        waiting = itertools.chain(self._unfinished.values(), (r for _, r in self._retrying.values()))
        return any(_in_scope(r.item.message, scope) for r in waiting)

    async def holders(self) -> set[tuple[str, str]]:
        """The (tenant, user id) of every message received and not yet written, by any process:
        their entries in the store, read once (a retention pass asks per page, not per person)."""
        found: set[tuple[str, str]] = set()
        for _, value in await self.memory.store.state_items(NAMESPACE):
            named = value.get("message")
            if isinstance(named, dict):
                found.add((str(named.get("tenant")), str(named.get("user_id"))))
        return found

    async def drop(self, job: ForgetJob) -> None:
        """Delete the entries of the messages a forget removes, whichever process received them."""
        self._written.clear()  # what was written a moment ago may be gone now, and come again
        await drop_forgotten(self.memory.store, NAMESPACE, job, lambda value: value.get("message"))
        # A message waiting for another try (or being tried) that the forget takes out is held
        # here no longer: sent again, it is new.
        for key, (_, r) in list(self._retrying.items()):
            if forgotten_by(r.item.message.model_dump(), job):
                r.forgotten = True
                self._retrying.pop(key, None)
        await self._notify()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("trying failed writes again stopped", exc_info=task.exception())


def received_result(item: Pending) -> IngestResult:
    """What ingest answers for a message kept as it came: stored, with no records yet."""
    return stored_result(item, settled=False).model_copy(update={"written": False})


def _entry(message: Message, decision: TriageDecision) -> dict[str, Any]:
    return {"message": message.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}


def check_entry(key: str, value: dict[str, Any]) -> None:
    """Refuse an entry (of an imported file) that this module would not read back."""
    if ":" not in key:
        raise InputError("is not a key of a received message (token:number)", field="key")
    if set(value) != {"message", "decision"}:
        raise InputError("a received message's entry holds 'message' and 'decision'", field="value")
    entry_message(value["message"])
    try:
        TriageDecision.model_validate(value["decision"])
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, prefix="value.decision.") from exc


def _rebuild(value: dict[str, Any], index: int) -> Pending | None:
    try:
        message = Message.model_validate(value.get("message"))
        decision = TriageDecision.model_validate(value.get("decision"))
    except (ValidationError, ValueError):
        return None
    return Pending(index, message, decision)


def _in_scope(message: Message, scope: Scope) -> bool:
    return (
        message.tenant == scope.tenant
        and scope.user_id in (None, message.user_id)
        and scope.chat_id in (None, message.chat_id)
    )


def lane_keys(message: Message) -> tuple[LaneKey, LaneKey]:
    """The chat and the person whose messages are written in the order they came."""
    return ("chat", message.tenant, message.chat_id), ("user", message.tenant, message.user_id)
