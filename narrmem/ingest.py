"""The ingest pipeline: validate → triage → dedupe → records → embed → write → after-store →
triggers, for a batch of messages at a time.

Every message is validated before anything is written. Ignored messages stop after triage (no
embedding, no I/O). The kept ones are embedded in one call (started before the before-store hooks
run, which it overlaps) and written in one transaction. Batches overlap like a pipeline: while one
batch's before-store hooks and write run, the next batch is triaged and its texts go to the model,
so in bulk the model embeds without waiting for writes; the before-store hooks of a batch still
run once the batch before it is written. The after-store hooks (counters, facts, triggers) run in
a task that overlaps the next batch's embedding, and finish before the next write; the last
and the first batches of a call are short (:func:`batch_bounds`): the model waits for the first
triage, and the hooks of the very last batch have no embedding beside them. With
``[storage] acknowledge = "after_write"`` ingest returns once the batch is written, and
:mod:`narrmem.settling` runs the hooks afterwards; with ``"on_receipt"`` a call of a few messages
returns once they are triaged and kept as they came, and :mod:`narrmem.inbox` has them written
(:meth:`IngestPipeline.store_received`) a moment later.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pydantic import ValidationError

from narrmem import logs
from narrmem.errors import ClockBehindError, InputError
from narrmem.fence import ScopeKey, own_work
from narrmem.hookspecs import UNWRITTEN_KEPT
from narrmem.in_flight import Call, CallsUnderWay
from narrmem.model_child import SHORT_TEXTS
from narrmem.models import (
    MAX_ID_CHARS,
    ContextLine,
    IngestResult,
    MemoryRecord,
    Message,
    TriageDecision,
    TriggerEvent,
    edit_time,
    edit_time_or_none,
)
from narrmem.store import FindsStoredMessages, MessageKey, WritesContext, WritesWhileEmbedding
from narrmem.text import cjk_count

if TYPE_CHECKING:
    from narrmem.config import Acknowledge
    from narrmem.embed import Embedder
    from narrmem.fence import Fence
    from narrmem.inbox import Inbox
    from narrmem.lifecycle import MemoryLifecycle
    from narrmem.settling import Settling
    from narrmem.write_turn import WriteTurn

log = logs.logger("narrmem")

TriggerCallback = Callable[[TriggerEvent], Awaitable[None]]
FALLBACK_DECISION = TriageDecision(layer="accumulate", reason="no triage plugin answered")
# A message said longer ago than this is asked whether a forget took it since (an import, a
# backfill): a live one is seconds old.
LATE_AFTER_S = 600.0
SAID_BEFORE_A_FORGET = "said before a forget of its person, chat or itself: not stored again"
# Where bot libraries and chat exports put a person's display name in ``meta``.
DISPLAY_NAME_KEYS = ("display_name", "name", "username", "first_name")


@dataclass
class Pending:
    """One message on its way through a batch: its place in the batch, what triage decided, the
    records it will leave, their vectors, and what went wrong in plugins along the way."""

    index: int
    message: Message
    decision: TriageDecision
    errors: list[str] = field(default_factory=list)
    records: list[MemoryRecord] = field(default_factory=list)
    vectors: np.ndarray | None = None
    # Words of the message for earlier episodes' keyword context, written with its records.
    context_lines: list[ContextLine] = field(default_factory=list)
    # The episode's embed_text as ingest wrote it, and what its vector is made of instead (the
    # decision's gist, attributed): a hook that rewrites the embed_text gets its own text embedded.
    written_embed_text: str | None = None
    gist_text: str | None = None
    # The key of its entry of after-store hooks to run (narrmem.settling), once written.
    settling_key: str | None = None

    def vector_text(self, record: MemoryRecord) -> str:
        """The text ``record``'s vector is made of."""
        if self.gist_text is not None and record is self.records[0]:
            if record.embed_text == self.written_embed_text:
                return self.gist_text
        return record.index_text

    @property
    def key(self) -> MessageKey:
        return (self.message.tenant, self.message.chat_id, self.message.message_id)

    def hook_arguments(self, memory: MemoryLifecycle) -> dict[str, Any]:
        """What the before- and after-store hooks are told of this message (``errors`` collects
        the names of plugins that failed on it)."""
        return {
            "memory": memory,
            "message": self.message,
            "decision": self.decision,
            "records": self.records,
            "errors": self.errors,
        }


@dataclass
class Prepared:
    """A batch triaged and deduplicated, its episodes' texts with the model: its results so far,
    the messages that will leave memories, and the embedding of their episodes' texts."""

    results: list[IngestResult]
    kept: list[Pending]
    texts: list[str]
    early: asyncio.Future[np.ndarray] | None
    # The batch's hold of the fence between processes (narrmem.fence), until its unit takes it.
    held: int | None = None
    let_go: Callable[[int | None], None] | None = None

    def cancel(self) -> None:
        """Drop the embedding if it is no longer wanted (slices not started are skipped), and the
        hold no unit took over."""
        if self.early is not None and not self.early.done():
            self.early.cancel()
        if self.let_go is not None:
            self.let_go(self.held)


class IngestPipeline:
    def __init__(
        self,
        memory: MemoryLifecycle,
        write_lock: WriteTurn,
        callbacks: list[TriggerCallback],
        settling: Settling,
        inbox: Inbox,
        fence: Fence,
        calls: CallsUnderWay,
    ) -> None:
        self.memory = memory
        self.write_lock = write_lock
        self.callbacks = callbacks
        self.settling = settling
        self.inbox = inbox
        self.fence = fence
        self.calls = calls

    async def run(
        self,
        messages: Sequence[Message | dict[str, Any]],
        progress: Callable[[int], None] | None,
        acknowledge: Acknowledge | None = None,
        *,
        call: Call | None = None,
        held: int | None = None,
        history: bool = False,
    ) -> list[IngestResult]:
        """Ingest ``messages`` a batch at a time, as a pipeline: while one batch's before-store hooks
        and write run, the next batch is triaged and handed to the model, so the model embeds
        without a pause between batches; a batch's after-store hooks run (or are scheduled, with
        ``acknowledge = "after_write"``) once it is written. ``call``: the messages' registration
        with the calls under way, made earlier (an edit's, from its start); ``held``: a hold of
        the fence between processes taken earlier for them (:meth:`Fence.reserve`), which their
        first batch takes over."""
        validated = [as_message(m, index=i if len(messages) > 1 else None) for i, m in enumerate(messages)]
        check_not_ahead(validated, self.memory.clock.now(), self.memory.settings.storage.max_ts_ahead_s)
        if call is not None:
            results = await self._run(validated, progress, acknowledge, call, held)
        else:
            # Registered before the marks are read: a forget that begins meanwhile drops what it
            # takes of these messages (its mark may come after the read).
            with self.calls.under_way(validated) as registered:
                gone = set()
                if held is None and (history or len(validated) > SHORT_TEXTS):
                    gone = await self._said_before_a_forget(validated)
                if gone:
                    results = await self._without(validated, gone, progress, acknowledge, registered)
                else:
                    results = await self._run(validated, progress, acknowledge, registered, held)
        if len(validated) <= SHORT_TEXTS:
            await self._name_duplicates_memories(validated, results)
        return results

    async def _said_before_a_forget(self, messages: list[Message]) -> set[int]:
        """The places of messages said before a forget of their person, chat, person in the chat
        or themselves (as far as forget marks are kept), in a call of more than
        :data:`SHORT_TEXTS` messages (an import, a backfill): an export imported again after a
        ``forgetme`` stored the person's words again. Only messages older than
        :data:`LATE_AFTER_S` are asked about, every mark read once for them all. A bot's own
        messages come a few at a time: what waited of them is checked where it waited (the
        backlog, the messages received), and one sent again after a forget is new."""
        late = self.memory.clock.now() - timedelta(seconds=LATE_AFTER_S)
        old = [n for n, message in enumerate(messages) if message.ts < late]
        if not old:
            return set()
        said_before = await self.memory.forget_marks.all_read()
        if said_before is None:
            return set()
        return {n for n in old if said_before(messages[n])}

    async def _without(
        self,
        messages: list[Message],
        gone: set[int],
        progress: Callable[[int], None] | None,
        acknowledge: Acknowledge | None,
        call: Call,
    ) -> list[IngestResult]:
        """:meth:`run` of ``messages`` but those at ``gone``, which are answered as not stored."""
        rest = [message for n, message in enumerate(messages) if n not in gone]
        if progress is not None:
            progress(len(gone))
        done: Iterator[IngestResult] = iter([])
        if rest:
            # As a call of the whole (not of the few left: that would take the short lane).
            done = iter(await self._run(rest, progress, acknowledge, call, None, whole=len(messages)))
        return [
            IngestResult(
                message_id=message.message_id,
                layer="ignore",
                stored=False,
                reason=SAID_BEFORE_A_FORGET,
            )
            if n in gone
            else next(done)
            for n, message in enumerate(messages)
        ]

    async def _name_duplicates_memories(self, messages: list[Message], results: list[IngestResult]) -> None:
        """A duplicate's answer names the memories its message is in: a client whose first call
        timed out after the write, and sends it again, gets the ids the first answer held (an
        import sent again is not looked up: it needs no ids)."""
        wanted: dict[tuple[str, str], list[int]] = {}
        for n, result in enumerate(results):
            if result.duplicate and not result.memory_ids:
                wanted.setdefault((messages[n].tenant, messages[n].chat_id), []).append(n)
        store = self.memory.store
        for (tenant, chat_id), indexes in wanted.items():
            ids = await store.from_messages(tenant, chat_id, [messages[n].message_id for n in indexes])
            records = await store.get(ids, None) if ids else {}
            for n in indexes:
                found = sorted(i for i, r in records.items() if messages[n].message_id in r.message_ids)
                results[n] = results[n].model_copy(update={"memory_ids": found})

    async def _run(
        self,
        validated: list[Message],
        progress: Callable[[int], None] | None,
        acknowledge: Acknowledge | None,
        call: Call,
        held: int | None = None,
        *,
        whole: int | None = None,
    ) -> list[IngestResult]:
        """``whole``: the size of the call these messages are part of (the short lane is for
        short calls, not for what is left of a long one)."""
        mode = acknowledge or self.memory.settings.storage.acknowledge
        deferred = mode != "after_hooks"
        await self.settling.claim()
        if mode == "on_receipt" and (whole or len(validated)) <= SHORT_TEXTS:
            results = await self._receive(validated, call, held)
            if progress is not None:
                progress(len(validated))
            return results
        # Written after what was received before it (a message on its way is then found stored).
        await self.inbox.written()
        batch_size = self.memory.settings.storage.batch_size
        chunks = [validated[start:end] for start, end in batch_bounds(len(validated), batch_size)]
        # A batch's results are filled in by its after-store task, which may still run while the
        # next batch embeds: the lists are read only once every task is done.
        batches: list[list[IngestResult]] = []
        finishing: asyncio.Future[None] | None = None
        upcoming: asyncio.Future[Prepared] | None = None
        try:
            for n, chunk in enumerate(chunks):
                first = held if n == 0 else None
                prepared = await upcoming if upcoming is not None else await self._prepare(chunk, first)
                if n + 1 < len(chunks):
                    upcoming = asyncio.ensure_future(self._prepare(chunks[n + 1]))
                else:
                    upcoming = None
                if deferred:
                    prefix = self.settling.batch_prefix()
                    written, unit = await self._finish(prepared, None, prefix, call=call)
                    self._schedule_hooks(written, prefix, unit)
                else:
                    # The hooks' work is recorded with the write, as when they run after the
                    # answer: a process stopped before they ran has them run at the next open
                    # (they were lost: a retry found the message stored and ran none).
                    prefix = self.settling.batch_prefix()
                    written, unit = await self._finish(prepared, finishing, prefix, call=call, hooks_now=True)
                    finishing = None
                    if unit is not None:
                        hooks = functools.partial(self._hooks_then_settled, written, prepared.results, prefix)
                        finishing = asyncio.ensure_future(self._hooks_of(unit, hooks))
                        # Cancelled before it starts (the caller gave up as the write ended), the
                        # task never runs its own ending: the unit ends all the same.
                        finishing.add_done_callback(functools.partial(self._leave_unit, unit))
                batches.append(prepared.results)
                if progress is not None:
                    progress(len(chunk))
                if deferred:
                    # An import runs ahead of its hooks by a bounded number of messages, not all.
                    await self.settling.hold_back()
        finally:
            await _abandon(upcoming)
            if finishing is not None:
                # Shielded: a caller that gives up (a timeout around ingest) leaves the written
                # batch's hooks running. Cancelled with it, they never ran: the message was stored
                # without its counts and facts, and sent again it was a duplicate.
                await asyncio.shield(finishing)
        return [result for batch in batches for result in batch]

    async def _hooks_then_settled(
        self, written: list[Pending], results: list[IngestResult], prefix: str
    ) -> None:
        """Run a written batch's after-store hooks for the caller's results, then delete the record
        of their work (left for the next open if they raise)."""
        owed = await self.after_store(written, results)
        await self.settling.settled(prefix, list(zip(written, owed, strict=True)))

    def _schedule_hooks(self, written: list[Pending], prefix: str, unit: int | None) -> None:
        """Have :mod:`narrmem.settling` run a written batch's after-store hooks, and end its unit."""
        try:
            if written:
                # Another worker's forget waits for these hooks as for the unit (narrmem.fence).
                self.settling.schedule(
                    functools.partial(self.hooks_owing, written),
                    prefix,
                    len(written),
                    self.fence.hooks_later(),
                )
        finally:
            if unit is not None:
                self.fence.leave(unit)

    def _hooks_of_cancelled(self, items: list[Pending], prefix: str) -> None:
        """Schedule the after-store hooks of a batch whose caller was cancelled as it was written
        (a store's write runs to its end): those of its messages the write committed. Left to the
        next open, a bot that runs for months lost their counts, facts and triggers for months."""
        keys = {
            key
            for item, (_, key, _) in zip(items, self.settling.entries(prefix, items), strict=True)
            if item.records[0].id is not None
        }
        self.settling.schedule_left(self, prefix, keys, self.fence.hooks_later())

    def _leave_unit(self, unit: int, _task: object) -> None:
        self.fence.leave(unit)

    async def _hooks_of(self, unit: int, hooks: Callable[[], Awaitable[None]]) -> None:
        """Run a written batch's after-store hooks as part of its unit, which ends with them."""
        try:
            await self.fence.run_inside(unit, hooks)
        finally:
            self.fence.leave(unit)

    async def _triaged(self, messages: list[Message], held: int | None) -> list[Pending]:
        items = []
        with self.fence.covering(held):
            for i, message in enumerate(messages):
                errors: list[str] = []
                items.append(Pending(i, message, await self.triage(message, errors), errors))
                await yield_every(i)
        return items

    async def _receive(self, messages: list[Message], call: Call, held: int | None) -> list[IngestResult]:
        """``acknowledge = "on_receipt"``: triage and dedupe a bot's few messages, and hand the new
        ones to the inbox, which answers once they are put in the store as they came."""
        if held is None:
            held = await self.fence.hold()
        try:
            items = await self._triaged(messages, held)
            results = [
                IngestResult(message_id=m.message_id, layer="accumulate", stored=False) for m in messages
            ]
            new = await self._new_messages(items, results)
            # The model is not started on them before the answer: started beside the entries'
            # write, it slowed that write from 0.26 to 1.9 ms (p50, bench/speed.py at 10k on two
            # cores). A unit of narrmem.fence: a forget waits for the entries being put in the
            # store, and entries put while a forget runs wait for it (so it does not take them).
            unit = await self.fence.enter(scopes=message_scopes(new), held=held)
        finally:
            self.fence.let_go(held)  # taken over by the unit, unless something failed first
        try:
            # Asked inside the unit: a forget that began before dropped these (narrmem.in_flight).
            for item in new:
                if call.was_dropped(item.message):
                    results[item.index] = forgotten(item)
            new = call.kept(new)
            received = await self.inbox.receive(new)
        finally:
            self.fence.leave(unit)
        for item, result in zip(new, received, strict=True):
            # None: held by the inbox already (on its way, or written a moment ago).
            results[item.index] = duplicate(item.message, item.decision) if result is None else result
        await self.settling.hold_back()
        return results

    async def store_received(
        self,
        items: list[Pending],
        still_received: Callable[[list[Pending]], Awaitable[list[Pending]]] | None = None,
        written: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Write messages received earlier (already triaged), in order, and schedule their
        after-store hooks; a message stored meanwhile (by another process) is skipped, and so is
        one that ``still_received`` (asked inside the write's unit of :mod:`narrmem.fence`) leaves
        out: a forget took it before its write. ``written`` runs once the write is done, still
        inside its unit, before the hooks are scheduled (it must not raise)."""
        await self.settling.claim()  # the hooks' entries are this process's
        for n, item in enumerate(items):
            item.index = n
        results = [
            IngestResult(message_id=i.message.message_id, layer="accumulate", stored=False) for i in items
        ]
        prepared = await self._prepare_triaged(items, results)
        prefix = self.settling.batch_prefix()
        # Written once the vectors are there, in a short transaction: a message that arrives
        # meanwhile is put in the store without waiting for this batch's embedding.
        # A forget waits for this writer (the inbox drained) instead: it passes the fence.
        with own_work():
            stored, unit = await self._finish(
                prepared, None, prefix, while_embedding=False, receiving=True, still_received=still_received
            )
            if written is not None:
                try:
                    await written()
                except BaseException:
                    self._schedule_hooks(stored, prefix, unit)
                    raise
        self._schedule_hooks(stored, prefix, unit)
        # No holding back here: a trigger callback of an earlier batch may be waiting for these
        # messages (a recall in their chat), and that batch for the callback. Ingest holds back.

    async def _prepare(self, messages: list[Message], held: int | None = None) -> Prepared:
        """Triage and dedupe a batch, make its episodes, and hand their texts to the model; the
        batch holds the fence between processes from the start (narrmem.fence), or from before:
        ``held``, taken for it earlier."""
        results = [IngestResult(message_id=m.message_id, layer="accumulate", stored=False) for m in messages]
        if held is None:
            held = await self.fence.hold()
        try:
            prepared = await self._prepare_triaged(await self._triaged(messages, held), results)
        except BaseException:
            self.fence.let_go(held)
            raise
        prepared.held, prepared.let_go = held, self.fence.let_go
        return prepared

    async def _prepare_triaged(self, items: list[Pending], results: list[IngestResult]) -> Prepared:
        early: asyncio.Future[np.ndarray] | None = None
        texts: list[str] = []
        if len(items) <= SHORT_TEXTS:
            # A few messages (a bot's message as it comes): the model starts on them once triage
            # has spoken, while the duplicate check reads the store and the episodes are made. A
            # message found stored already was embedded for nothing: rare, as it comes.
            texts = list(
                dict.fromkeys(
                    vector_text(i.message, i.decision) for i in items if i.decision.layer != "ignore"
                )
            )
            early = await self._embed_early(texts)
        try:
            kept = await self._new_messages(items, results)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        for item in kept:
            episode = self.episode(item.message, item.decision)
            item.records = [episode]
            item.written_embed_text = episode.embed_text
            if item.decision.gist is not None:
                item.gist_text = attributed(item.message, item.decision.gist)
        if early is None:
            # The episodes' texts are known now: the model embeds them while the before-store
            # hooks run (and while the batch before this one is written). A hook may add records
            # (a scene) or change what an episode embeds; those texts are embedded afterwards, so
            # every record gets the vector of its own text.
            texts = list(dict.fromkeys(item.vector_text(item.records[0]) for item in kept))
            early = await self._embed_early(texts)
        return Prepared(results, kept, texts, early)

    async def _embed_early(self, texts: list[str]) -> asyncio.Future[np.ndarray] | None:
        """Hand ``texts`` to the model before the next synchronous work holds the loop."""
        if not texts:
            return None
        early = asyncio.ensure_future(self.memory.embedder.embed(texts))
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            early.cancel()  # the call was cancelled: its texts are not embedded for nothing
            raise
        return early

    async def _finish(
        self,
        prepared: Prepared,
        previous: asyncio.Future[None] | None,
        prefix: str | None,
        *,
        while_embedding: bool = True,
        receiving: bool = False,
        still_received: Callable[[list[Pending]], Awaitable[list[Pending]]] | None = None,
        call: Call | None = None,
        hooks_now: bool = False,
    ) -> tuple[list[Pending], int | None]:
        """Run a prepared batch's before-store hooks, wait for its vectors and write it; return the
        messages written (whose after-store hooks the caller runs) and the batch's unit of
        :mod:`narrmem.fence`, begun before the write (``None`` when nothing was to be written),
        which the caller ends once the hooks have run or been scheduled. ``previous`` is the last
        batch's after-store task, awaited before this batch is written. ``prefix``: record the
        pending after-store work of the batch with its write, under keys that start with it;
        ``hooks_now``: the caller runs them before it answers (its results are filled in then)."""
        kept, results = prepared.kept, prepared.results
        if not kept:
            prepared.cancel()  # what was embedded early was already stored
            if previous is not None:
                await previous
            return [], None
        later: asyncio.Future[np.ndarray] | None = None
        unit: int | None = None
        writing: list[Pending] = []
        try:
            with self.fence.covering(prepared.held):
                # The speaker's earlier episodes of the call by chat: a scene's window of the chat's
                # recent messages read the store alone, and an import's scenes were each made as if
                # the speaker had said nothing before them.
                earlier: dict[tuple[str, str, str], collections.deque[MemoryRecord]] = {}
                for n, item in enumerate(kept):
                    await yield_every(n)
                    message = item.message
                    speaker = (message.tenant, message.user_id, message.chat_id)
                    said = earlier.setdefault(speaker, collections.deque(maxlen=UNWRITTEN_KEPT))
                    await self.memory.host.call(
                        "narrmem_before_store", **item.hook_arguments(self.memory), unwritten=list(said)
                    )
                    said.append(item.records[0])
                    item.context_lines = await self.context_lines(item)
            texts = [item.vector_text(r) for item in kept for r in item.records]
            embedded = set(prepared.texts)
            rest = sorted({text for text in texts if text not in embedded})
            if rest:
                later = asyncio.ensure_future(embed_ahead(self.memory.embedder, rest))
            if previous is not None:
                await previous
            # Begun once the batch before has run its hooks: one of them may forget, and that
            # forget waits for the units begun before it.
            unit = await self.fence.enter(
                receiving=receiving, scopes=message_scopes(kept), held=prepared.held
            )
            if still_received is not None:
                # Asked inside the unit: a forget (of any worker) that took a message's entry came
                # wholly before this write, and one that begins now waits for it and its hooks.
                # Written anyway, a forgotten message's hooks would count and fire for its user
                # after the forget had returned, and leave what they wrote of the user behind.
                prepared.kept = kept = await still_received(kept)
            if call is not None:
                # The same for a forget in this process that began while the call was under way
                # (narrmem.in_flight): it found nothing of these messages to delete.
                for item in kept:
                    if call.was_dropped(item.message):
                        results[item.index] = forgotten(item)
                prepared.kept = kept = call.kept(kept)
            written = []
            if kept:
                vectors = functools.partial(_vectors, prepared, rest, later)
                writing = kept
                written = await self._write(kept, results, prefix, vectors, while_embedding)
        except BaseException as exc:
            if writing and prefix is not None and isinstance(exc, asyncio.CancelledError):
                self._hooks_of_cancelled(writing, prefix)
            if unit is not None:
                self.fence.leave(unit)
            raise
        finally:
            prepared.cancel()
            if later is not None and not later.done():
                later.cancel()
        for item in written:
            results[item.index] = stored_result(item, settled=prefix is None or hooks_now)
        return written, unit

    async def _new_messages(self, items: list[Pending], results: list[IngestResult]) -> list[Pending]:
        """The messages that will leave memories; the others get their result: ignored, or
        already stored."""
        kept: list[Pending] = []
        seen: set[MessageKey] = set()
        stored = await self._already_stored(items)
        for item in items:
            if item.decision.layer == "ignore":
                results[item.index] = IngestResult(
                    message_id=item.message.message_id,
                    layer="ignore",
                    stored=False,
                    reason=item.decision.reason,
                    notes=item.errors,
                )
            elif item.key in seen or item.key in stored:
                results[item.index] = duplicate(item.message, item.decision)
            else:
                seen.add(item.key)
                kept.append(item)
        return kept

    async def _write(
        self,
        items: list[Pending],
        results: list[IngestResult],
        prefix: str | None,
        vectors: Callable[[], Awaitable[np.ndarray]],
        while_embedding: bool = True,
    ) -> list[Pending]:
        """Write a batch once ``vectors()`` has its records' vectors. A few messages (a bot's
        message as it comes) go in while their embedding runs, on a store that can
        (:class:`~narrmem.store.WritesWhileEmbedding`): only the commit waits for it."""
        pending = [] if prefix is None else self.settling.entries(prefix, items)
        for item, (_, key, _) in zip(items, pending, strict=False):
            item.settling_key = key
        records: list[MemoryRecord] = []
        context: dict[int, list[ContextLine]] = {}  # by the place of the message's episode
        for item in items:
            if item.context_lines:
                context[len(records)] = item.context_lines
            records.extend(item.records)
        store = self.memory.store
        while_embedding = (
            while_embedding and len(items) <= SHORT_TEXTS and isinstance(store, WritesWhileEmbedding)
        )
        if context and isinstance(store, WritesContext):
            # The lines go in with the records: the few messages of a bot's turn while their
            # embedding runs (on a store that can), a batch once its vectors are there.
            if while_embedding:
                async with self.write_lock:
                    await store.add_with_context(records, vectors(), context, state=pending)
            else:
                ready = await vectors()
                async with self.write_lock:
                    await store.add_with_context(records, ready, context, state=pending)
        elif while_embedding:
            assert isinstance(store, WritesWhileEmbedding)
            async with self.write_lock:
                await store.add_while_embedding(records, vectors(), state=pending)
        else:
            ready = await vectors()
            async with self.write_lock:
                if pending:
                    await store.add(records, ready, state=pending)
                else:  # a store written before ``state`` existed keeps working with the default
                    await store.add(records, ready)
        # Another ingest (of this process or another sharing the store) may have stored a message
        # since the check before embedding: the store skipped its episode and what came with it
        # (the episode's id stays None; its own unique check decides), so it is a duplicate here.
        skipped = [n for n, item in enumerate(items) if item.records[0].id is None]
        for n in skipped:
            results[items[n].index] = duplicate(items[n].message, items[n].decision)
        if skipped and pending:
            await self.settling.discard([pending[n][1] for n in skipped])
        return [item for item in items if item.records[0].id is not None]

    async def hooks_owing(
        self, items: list[Pending], among: Sequence[Collection[str] | None] | None = None
    ) -> list[tuple[Pending, list[str]]]:
        """:meth:`after_store` for messages whose caller was answered; each message with the
        plugins whose hook found the store unreachable."""
        return list(zip(items, await self.after_store(items, None, among), strict=True))

    async def after_store(
        self,
        items: list[Pending],
        results: list[IngestResult] | None,
        among: Sequence[Collection[str] | None] | None = None,
    ) -> list[list[str]]:
        """Run the after-store hooks of written messages and deliver their triggers. With
        ``results``, the hooks fill in the caller's results; without, results of their own (the
        caller was answered already). ``among``: for each message, the plugins whose hooks run
        (``None``: every plugin's). Returns, for each message, the plugins whose hook found the
        store unreachable: their work for it is owed (:mod:`narrmem.settling` tries it again)."""
        owed: list[list[str]] = []
        host = self.memory.host
        for n, item in enumerate(items):
            await yield_every(n)
            result = results[item.index] if results is not None else stored_result(item, settled=True)
            away: list[str] = []
            named = None if among is None else among[n]
            await host.call(
                "narrmem_after_store",
                **item.hook_arguments(self.memory),
                vectors=item.vectors,
                result=result,
                among=None if named is None else host.after_store_partners(named),
                away=away,
            )
            owed.append(away)
            result.notes.extend(
                f"plugin '{name}' found the store unreachable after the write: its after-store hook "
                "runs again for this message once the store answers"
                for name in away
            )
            result.notes.extend(item.errors)
            result.triggers = [caused_by(item.message, event) for event in result.triggers]
            await self.deliver(result.triggers)
        return owed

    async def context_lines(self, item: Pending) -> list[ContextLine]:
        """What the plugins give of the message for earlier episodes' keyword context; an answer
        that is not a list of :class:`ContextLine` is the plugin's failure, noted on the message."""
        lines: list[ContextLine] = []
        for plugin_lines in await self.memory.host.call(
            "narrmem_context_lines", **item.hook_arguments(self.memory)
        ):
            lines.extend(plugin_lines)  # of the declared type: the host checked it (narrmem.hook_returns)
        return lines

    async def triage(self, message: Message, errors: list[str]) -> TriageDecision:
        host = self.memory.host
        decision = await host.call_first("narrmem_triage", memory=self.memory, message=message, errors=errors)
        # A decision of another type is a plugin's failure, reported and skipped by the host.
        return FALLBACK_DECISION if decision is None else decision

    async def _already_stored(self, items: list[Pending]) -> set[MessageKey]:
        keys = [i.key for i in items if i.decision.layer != "ignore"]
        if not keys:
            return set()
        store = self.memory.store
        if isinstance(store, FindsStoredMessages):
            return await store.stored_messages(keys)
        by_chat: dict[tuple[str, str], list[str]] = {}
        for item in items:
            if item.decision.layer != "ignore":
                by_chat.setdefault((item.message.tenant, item.message.chat_id), []).append(
                    item.message.message_id
                )
        found: set[MessageKey] = set()
        for (tenant, chat_id), ids in by_chat.items():
            for mid in await self.memory.store.stored_message_ids(tenant, chat_id, ids):
                found.add((tenant, chat_id, mid))
        return found

    def episode(self, message: Message, decision: TriageDecision) -> MemoryRecord:
        return MemoryRecord.from_message(
            message,
            kind="episode",
            text=message.text,
            embed_text=attributed(message),
            importance=decision.importance,
            stored_at=self.memory.clock.now(),
            message_ids=[message.message_id],
            meta={**message.meta, "layer": decision.layer},
        )

    async def deliver(self, events: list[TriggerEvent]) -> None:
        # What a trigger's hook or callback ingests is not the platform's message: whoever dated
        # it, it is checked as any caller's (the platform's context does not pass on to them).
        token = _PLATFORM_DATED.set(False)
        try:
            for event in events:
                await self.memory.host.call("narrmem_on_trigger", memory=self.memory, event=event)
                for callback in self.callbacks:
                    try:
                        await callback(event)
                    except Exception:
                        log.exception("trigger callback %r failed", callback)
        finally:
            _PLATFORM_DATED.reset(token)


def caused_by(message: Message, event: TriggerEvent) -> TriggerEvent:
    """``event``, made by the hooks of ``message``, naming it as its cause when it is in the
    message's chat and names no cause of its own (a plugin that built the event by hand)."""
    if event.cause_message_id is not None or (event.tenant, event.chat_id) != (
        message.tenant,
        message.chat_id,
    ):
        return event
    return event.model_copy(update={"cause_message_id": message.message_id})


def message_scopes(items: Sequence[Pending]) -> set[ScopeKey]:
    """Where the messages of a unit of :mod:`narrmem.fence` belong."""
    return {(i.message.tenant, i.message.user_id, i.message.chat_id) for i in items}


def stored_result(item: Pending, *, settled: bool) -> IngestResult:
    """What ingest answers for a written message. Unsettled, its hooks run later: the notes are the
    plugin errors so far, and no counts or triggers are in it."""
    return IngestResult(
        message_id=item.message.message_id,
        layer=item.decision.layer,
        stored=True,
        reason=item.decision.reason,
        type=item.decision.type,
        memory_ids=[r.id for r in item.records if r.id is not None],
        records=item.records,
        scene=next((r for r in item.records if r.kind == "scene"), None),
        notes=[] if settled else list(item.errors),
        settled=settled,
    )


def forgotten(item: Pending) -> IngestResult:
    """What ingest answers for a message a forget dropped before its write."""
    return IngestResult(
        message_id=item.message.message_id,
        layer=item.decision.layer,
        stored=False,
        reason="forgotten before it was written: a forget of it, its chat or its user began meanwhile",
        notes=item.errors,
    )


def duplicate(message: Message, decision: TriageDecision) -> IngestResult:
    return IngestResult(
        message_id=message.message_id,
        layer=decision.layer,
        stored=False,
        duplicate=True,
        reason="this message id is already stored in this chat",
    )


def speaker_of(message: Message | MemoryRecord) -> str:
    """Who said it: ``speaker``, else a display name from ``meta``, else the user id. Recall needs
    the attribution (questions name people), so a message never goes without one."""
    if message.speaker:
        return message.speaker
    for key in DISPLAY_NAME_KEYS:
        value = message.meta.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_ID_CHARS]
    return message.user_id


def vector_text(message: Message, decision: TriageDecision) -> str:
    """What a message's episode is embedded as: its gist, or the whole message, attributed."""
    return attributed(message, decision.gist)


def attributed(message: Message | MemoryRecord, text: str | None = None) -> str:
    """The message (or ``text``, a part of it) as reported speech ("Ann said, "…""): who said it
    is part of what it means, and questions name people ("what did Ann decide?"). An episode
    (a :class:`MemoryRecord` of the message) gives what its message gave."""
    speaker = speaker_of(message)
    said = message.text if text is None else text
    if cjk_count(said) * 2 > len(said):
        return f"{speaker}说：“{said}”"
    return f'{speaker} said, "{said}"'


def batch_bounds(n: int, size: int, smallest: int = 8) -> list[tuple[int, int]]:
    """Where the batches of ``n`` messages start and end: ``size`` each in the middle, but short at
    both ends. The model waits while the first batch is triaged, and the after-store hooks of the
    last batch run with nothing left to embed beside them: so the first batches double from
    ``smallest`` up to ``size``, and the last ones halve the messages left down to ``smallest``."""
    smallest = min(size, smallest)
    bounds: list[tuple[int, int]] = []
    start = 0
    while start < n:
        left = n - start
        ramp = smallest << min(len(bounds), 30)
        step = min(size, left) if left < 2 * smallest else min(size, ramp, max(smallest, -(-left // 2)))
        bounds.append((start, start + step))
        start += step
    return bounds


async def embed_ahead(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Embed texts a write waits for in requests small enough for the model's short lane
    (:mod:`narrmem.model_thread`): the next batch's texts, queued already, do not hold them back."""
    parts = [texts[i : i + SHORT_TEXTS] for i in range(0, len(texts), SHORT_TEXTS)]
    return np.vstack(await asyncio.gather(*(embedder.embed(part) for part in parts)))


async def _vectors(
    prepared: Prepared, rest: list[str], later: asyncio.Future[np.ndarray] | None
) -> np.ndarray:
    """The vectors of a prepared batch's records, in order, once the model has them (each
    message's own are set on it too): its episodes' texts, then ``rest``, embedded ``later``."""
    assert prepared.early is not None  # a batch that keeps messages has texts to embed
    by_text = dict(zip(prepared.texts, await prepared.early, strict=True))
    if later is not None:
        by_text.update(zip(rest, await later, strict=True))
    rows = []
    for item in prepared.kept:
        item.vectors = np.vstack([by_text[item.vector_text(r)] for r in item.records])
        rows.append(item.vectors)
    return np.vstack(rows)


async def _abandon(upcoming: asyncio.Future[Prepared] | None) -> None:
    """A call stopped by an error: the next batch's preparation and its embedding are dropped (the
    batch being finished drops its own in :meth:`IngestPipeline._finish`)."""
    if upcoming is None:
        return
    if not upcoming.done():
        upcoming.cancel()
    try:
        (await upcoming).cancel()
    except (asyncio.CancelledError, Exception):  # cancelled or failed: nothing of it is kept
        pass


async def yield_every(n: int, every: int = 8) -> None:
    """Let the event loop run between messages of a batch: a hook whose awaits complete at once
    never suspends, and a batch of them would otherwise hold the loop for tens of milliseconds."""
    if n % every == every - 1:
        await asyncio.sleep(0)


@contextlib.contextmanager
def dated_by_platform() -> Iterator[None]:
    """Within it, the messages' times are a platform's (Telegram's, Discord's: the bot
    integrations), right whatever this machine's clock says: one dated past the clock by more
    than it takes is stored as dated, with a warning that the clock is behind (a VM resumed
    before its clock was set), not refused. Refused, each was logged and lost for good."""
    token = _PLATFORM_DATED.set(True)
    try:
        yield
    finally:
        _PLATFORM_DATED.reset(token)


async def platform_dated(call: Awaitable[R]) -> R:
    """``call`` (a call's coroutine) awaited within :func:`dated_by_platform`."""
    with dated_by_platform():
        return await call


R = TypeVar("R")
_PLATFORM_DATED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "narrmem_platform_dated", default=False
)
CLOCK_WARNED_EVERY_S = 600.0  # the clock behind a platform's dates is said at most this often
_clock_warned_at: list[float] = []


def _clock_behind(ahead_s: float, now: datetime) -> None:
    last = _clock_warned_at[-1] if _clock_warned_at else None
    if last is not None and time.monotonic() - last < CLOCK_WARNED_EVERY_S:
        return
    _clock_warned_at[:] = [time.monotonic()]
    log.warning(
        "a message the platform dated %.1f hours past this machine's clock (%s) was stored as dated: "
        "is the clock right (NTP)?",
        ahead_s / 3600,
        now.isoformat(),
    )


def check_not_ahead(messages: Sequence[Message], now: datetime, limit_s: float) -> None:
    """Refuse a message dated further past the clock's now than ``limit_s``: a device whose clock
    ran a year ahead stored a mood a year ahead, which every later week then counted, and a
    trigger that fired on it held the real one back until that date. Within
    :func:`dated_by_platform`, the clock is the one that is wrong: warned of, not refused."""
    for index, message in enumerate(messages):
        # An edit dated far ahead was the newest for ever: every later edit was refused as older.
        edited = edit_time_or_none(message.meta)
        for name, at in (("ts", message.ts), ("meta.edited_at", edited)):
            ahead = 0.0 if at is None else (at - now).total_seconds()
            if ahead > limit_s and _PLATFORM_DATED.get():
                _clock_behind(ahead, now)
            elif ahead > limit_s:
                field = name if len(messages) == 1 else f"messages[{index}].{name}"
                raise ClockBehindError(
                    f"is {ahead / 3600:.1f} hours past the memory's clock ({now.isoformat()}); at most "
                    f"{limit_s / 3600:g} hours ahead is taken ([storage] max_ts_ahead_s)",
                    field=field,
                )


def as_message(message: Message | dict[str, Any], index: int | None) -> Message:
    prefix = f"messages[{index}]." if index is not None else ""
    try:
        validated = Message.model_validate(message)
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, prefix=prefix) from exc
    try:
        edit_time(validated.meta)
    except ValueError as exc:
        raise InputError(str(exc), field=f"{prefix}meta.edited_at") from None
    return validated
