"""Forgetting as a durable job: written down before anything is deleted, finished (its record
deleted) only when every plugin has scrubbed its copies, resumed on the next open after a crash.

A user's or a chat's forget then leaves no byte of what it deleted in the store's files; a deleted
message (an edit does this too) is gone from every row without that cost on each edit.

A user's or a chat's forget run from hooks or a trigger callback does not wait for the messages
being written meanwhile (:mod:`narrmem.fence`): their hooks, and the hooks scheduled to run after
their answer, may still make facts or counts of the scope, or copy its words into a reply's
keyword context. It deletes what it can at once and keeps its job recorded; once they have ended,
a task that held nothing back until then runs the job again and finishes it.

A forget whose job is recorded and whose finishing fails (the store unreachable halfway, a
plugin's service down) raises to its caller, and is finished again in this process after
:mod:`narrmem.trying_again`'s delays until it is (or another worker's
open finishes it): before, it waited for the next open, weeks later for a bot that runs for weeks,
and what it had not deleted stayed recallable meanwhile. An edit's own forget is left to the next
open, which makes the edit again from its mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence, Set
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from narrmem import logs, owed_forgets, retention
from narrmem.checks import has_surrogate
from narrmem.errors import InputError, PluginError
from narrmem.fence import ScopeKey, inside_own_work, not_own_work, own_work
from narrmem.forget_notices import ForgetNotices
from narrmem.models import MAX_ID_CHARS, ForgetJob, Scope
from narrmem.recent_vectors import ForgetsRecentTexts
from narrmem.store import CountsForgets, PurgesAlongsideWrites, PurgesDeleted, shared_by_processes
from narrmem.to_the_end import Outlasting, to_the_end
from narrmem.trying_again import TryingAgain

if TYPE_CHECKING:
    from narrmem.edit_marks import EditMarks
    from narrmem.fence import Fence
    from narrmem.in_flight import Call, CallsUnderWay
    from narrmem.inbox import Inbox
    from narrmem.lifecycle import MemoryLifecycle
    from narrmem.settling import Settling
    from narrmem.write_turn import WriteTurn

log = logs.logger("narrmem")
R = TypeVar("R")

# What a forget again (Forgetting.again) deletes, by its job: a resumed one deletes the same.
AGAIN_NAMESPACE = "narrmem.forget_again"

# A retention pass's forget, by its job: the time its person had said nothing since. Finished
# later (it failed midway), once they have spoken, it takes only what they said before that time.
SILENT_NAMESPACE = "narrmem.forget_silent"

# How many times a forget run from hooks waits for messages of its scope begun since, before it
# is finished without waiting.
FINISH_ROUNDS = 20


# A purge a forget finished outside its turn owes (on a store shared by processes its VACUUM runs
# once the fence is open again): noted in the store, so a stop before it leaves it to the next open.
PURGE_OWED = ("narrmem.purge_owed", "owed")
# How long a retention pass's purge waits for the forgets still ending (one it began, cancelled):
# a forget whose plugin hangs must not hold a close for ever; its own job owes the purge then.
PURGE_WAIT_S = 10.0
# A failed purge of deleted messages is tried again this long after (at least the configured
# delay), twice as long after each failure in a row, up to the second figure.
PURGE_RETRY_FIRST_S, PURGE_RETRY_MAX_S = 30.0, 3600.0


class Forgetting:
    def __init__(
        self,
        memory: MemoryLifecycle,
        write_lock: WriteTurn,
        settling: Settling,
        inbox: Inbox,
        fence: Fence,
        calls: CallsUnderWay,
        marks: EditMarks,
    ) -> None:
        self.memory = memory
        self.marks = marks
        self.write_lock = write_lock
        self.settling = settling
        self.inbox = inbox
        self.fence = fence
        self.calls = calls
        self.notices = ForgetNotices(memory)  # to the other processes of a shared store
        self._finishing_later: set[asyncio.Task[None]] = set()
        self._again = TryingAgain()  # forgets whose finishing failed
        self._outlasting = Outlasting("a forget")
        # The messages under way each of those tasks waits for; a change of any is signalled.
        self._waiting_for: dict[asyncio.Task[Any], list[asyncio.Future[None]]] = {}
        self._changed = asyncio.Event()
        # The purge owed for messages deleted since the last one (see _purge_later).
        self._purge: asyncio.Task[None] | None = None
        self._purge_owed = False
        self._purge_failures = 0  # purges failed in a row: the next try waits longer each time
        self._purge_now = asyncio.Event()  # set by close: the purge runs without waiting

    async def _quiet(self) -> None:
        # The batches being written have run their hooks (or scheduled them), what was received is
        # written (its entries deleted), and the hooks of what was acknowledged have run, first:
        # none of it writes after the forget. Batches begun meanwhile wait for the forget.
        await self.inbox.drained()
        await self.settling.settle()

    async def scope(self, scope: Scope, asked_at: datetime | None = None) -> dict[str, int]:
        return await self.scopes([scope], asked_at)

    async def scopes(
        self,
        scopes: Sequence[Scope],
        asked_at: datetime | None = None,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> dict[str, int]:
        """Forget each of ``scopes`` (a chat and the chats it was before) as one forget: to its
        end though its caller gives up, every scope though one fails (the first failure raised
        once all were tried), and ``then`` once all were done."""
        return await self._to_the_end(self._scopes(scopes, asked_at, then))

    async def _scopes(
        self, scopes: Sequence[Scope], asked_at: datetime | None, then: Callable[[], Awaitable[None]] | None
    ) -> dict[str, int]:
        counts: dict[str, int] = {}
        failure: Exception | None = None
        for scope in scopes:
            try:
                done = await self._scope(scope, asked_at)
            except Exception as exc:
                failure = failure or exc
                continue
            assert done is not None
            for key, value in done.items():  # in the order the forget gives them (no set's order)
                counts[key] = counts.get(key, 0) + value
        if failure is not None:
            raise failure
        if then is not None:
            await then()
        return counts

    async def scope_unless(
        self, scope: Scope, unless: Callable[[], Awaitable[bool]], *, silent_since: datetime
    ) -> dict[str, int] | None:
        """Forget ``scope`` as :meth:`scope` does, unless ``unless()`` is true, or this process
        holds a message of the scope not yet written (an ingest call under way, a message
        received and being written or waiting for another try), once every write of this
        process has ended and no other worker writes (``None`` then, and nothing is done): a
        person found inactive who has spoken since keeps what they said (``unless`` answers for
        other processes' received messages). It leaves no forget mark (the person did not ask: a
        late write of what they said is theirs, and a retention pass finds it again if it is
        old), deletes no received entry (one received from here on is new), and a user's or
        chat's purge is left owed (:meth:`purge_owed_after_forgets`, run once after many).

        ``silent_since``: the time the person has said nothing since, noted beside the job. A
        forget that fails midway is finished later (:meth:`_finish_silent`): by then the person
        may have spoken, and what they said since is theirs to keep."""
        return await self._to_the_end(
            self._scope(scope, None, unless=unless, purge=False, silent_since=silent_since)
        )

    async def purge_owed_after_forgets(self) -> None:
        """:meth:`purge_owed`, once the forgets whose callers gave up have ended (one cancelled
        midway goes on, and owes a purge when it ends; waited for :data:`PURGE_WAIT_S` at most),
        to its end though the caller is cancelled (a close stops a retention pass): left owed,
        the bytes of what was forgotten stayed in the files until the next open."""

        async def after_forgets() -> None:
            with contextlib.suppress(TimeoutError):
                # ended() only waits (asyncio.wait): its cancel leaves the forgets running.
                await asyncio.wait_for(self._outlasting.ended(), PURGE_WAIT_S)
            await self.purge_owed()

        await to_the_end(after_forgets())

    async def _to_the_end(self, work: Coroutine[Any, Any, R]) -> R:
        """Run a forget to its end though its caller gives up (a timeout around the call, a
        handler cancelled): cancelled between the store's deletion and the plugins' scrubbing, it
        left the person's facts and summaries in the graph until the next open, weeks later for
        a bot that runs for weeks. Closing does not wait for it: a forget held at another
        worker's gate ends with the close, its job recorded for the next open, as before."""
        return await self._outlasting.run(work)

    async def _scope(
        self,
        scope: Scope,
        asked_at: datetime | None,
        *,
        unless: Callable[[], Awaitable[bool]] | None = None,
        purge: bool = True,
        silent_since: datetime | None = None,
    ) -> dict[str, int] | None:
        if asked_at is not None and await self._done_since(scope, asked_at):
            # The same forget sent again (a client's retry after a timeout, a backlog's replay):
            # run again, it deleted what the person said after asking, stored meanwhile.
            return {"memories": 0, "keyword_rows": 0, "vectors": 0}
        from_hooks = inside_own_work()
        # What ingest calls under way hold of the scope and have not written is never written:
        # what they hold as the forget begins (on a shared store, once no other worker's forget
        # can come before its end).
        speaking = False

        def drop() -> None:
            nonlocal speaking
            if unless is None:
                self.calls.drop_scope(scope.tenant, scope.user_id, scope.chat_id)
            else:
                # Held messages of the scope mean the person is speaking: kept, not dropped.
                speaking = self.calls.holds_scope(scope.tenant, scope.user_id, scope.chat_id)

        # On a store shared by processes the purge (PostgreSQL's VACUUM of the tables, minutes
        # for a large HNSW index) runs once the fence is open again: inside it, every worker's
        # writes waited at the gate for it.
        purge_after = not from_hooks and shared_by_processes(self.memory.store)
        defer_purge = purge_after or not purge
        # What the forget covers: what was said up to when it was asked (or began). Messages
        # held while it ran are written after it, not deleted by it.
        begun = self.memory.clock.now()
        covers = begun if asked_at is None else min(asked_at, begun)
        async with self.fence.forgetting(begin=drop):
            await self._quiet()
            async with self.write_lock:
                if unless is not None:
                    if speaking or self.inbox.holds_here(scope) or await unless():
                        return None
                else:
                    await self.memory.forget_marks.leave(scope, None, asked_at)
                job = await self.memory.store.begin_forget(**scope.model_dump())
                if silent_since is not None:
                    await self.memory.store.state_put(
                        SILENT_NAMESPACE, again_key(job), {"before": silent_since.isoformat()}
                    )
                if not from_hooks:
                    # A person found silent: what is received for them from here on (acknowledged
                    # on receipt, which the forget does not hold back) is new, and theirs to keep.
                    counts = await self._finish_or_retry(job, purge=not defer_purge, received=unless is None)
                    if unless is None:
                        await self._note_finished(scope, covers)
                    if silent_since is not None:
                        await self.memory.store.state_delete(SILENT_NAMESPACE, again_key(job))
                else:
                    # What may still write for the scope: the units under way with a message of
                    # it or of a chat it wrote in (a reply's keyword context), this one's
                    # included, and the hooks scheduled to run after their answer. None of it can
                    # be waited for here.
                    units = self.fence.under_way(lambda key: touches(job, key))
                    if not units and self.settling.scheduled() is None:
                        counts = await self.finish(job)
                        if silent_since is not None:
                            await self.memory.store.state_delete(SILENT_NAMESPACE, again_key(job))
                        return counts
                    counts = await self.finish(job, done=False)
                    self._finish_later(job, units, silent=silent_since is not None)
                    return counts
        if purge_after and purge:
            await self.purge_owed()
        return counts

    async def _note_finished(self, scope: Scope, covers: datetime) -> None:
        # Only what lets a retry be skipped: a failure here must not fail the finished forget.
        try:
            await self.memory.forget_marks.finished(scope, covers)
        except Exception:
            log.exception("noting a finished forget failed; a retry of it will run again")

    async def _done_since(self, scope: Scope, asked_at: datetime) -> bool:
        """A forget of ``scope`` asked at ``asked_at`` or later has run to its end (noted once it
        had, :meth:`ForgetMarks.finished`), and no job of the scope is left unfinished (a forget
        under way, or one that failed midway, is run again as always)."""
        finished = await self.memory.forget_marks.finished_at(scope)
        if finished is None or finished < min(asked_at, self.memory.clock.now()):
            return False
        return not any(
            job.messages is None and job.scope.key() == scope.key()
            for job in await self.memory.store.pending_forgets()
        )

    async def _finish_or_retry(
        self, job: ForgetJob, *, purge: bool = True, received: bool = True
    ) -> dict[str, int]:
        """``finish(job)``; failing, raised, and tried again in the background (see the module)."""
        try:
            return await self.finish(job, purge=purge, received=received)
        except Exception:
            self._retry_later(job, received=received)
            raise

    async def purge_owed(self) -> None:
        """The purge a finished forget left owed (see :data:`PURGE_OWED`), if one is: run, then
        its note deleted unless another forget owed one again meanwhile. Failing, it is tried
        again in the background (and by the next open): the rows are gone, the forget is done."""
        store = self.memory.store
        owed = await store.state_get(*PURGE_OWED)
        if owed is None or not isinstance(store, PurgesDeleted):
            return
        try:
            if isinstance(store, PurgesAlongsideWrites):
                # As a deleted message's purge: writes go on while the keyword index is rebuilt.
                await store.purge_alongside_writes()
                async with self.write_lock:
                    await store.purge_in_turn()
            else:
                await store.purge_deleted()
        except Exception:
            log.exception("purging what a forget deleted failed; tried again later")
            self._again.keep_trying(self.purge_owed, "the purge a forget left owed")
            return
        delete_if = getattr(store, "state_delete_if", None)
        if delete_if is not None:
            await delete_if(*PURGE_OWED, owed)
        else:
            await store.state_delete(*PURGE_OWED)

    def _retry_later(self, job: ForgetJob, *, received: bool = True) -> None:
        """Finish ``job`` again until it is; ``received``: a scope job deletes the entries of the
        scope received and not yet written (not those of a forget run from hooks, received after
        it)."""
        self._again.keep_trying(functools.partial(self._finish_pending, job, received), f"forget {job.id}")

    async def _finish_pending(self, job: ForgetJob, received: bool) -> None:
        store = self.memory.store
        async with self.fence.forgetting(), self.write_lock:
            if job.id not in {pending.id for pending in await store.pending_forgets()}:
                return  # finished by another worker's open meanwhile
            silent = await self._silent_note(job)
            if silent is not None:
                await self._finish_silent(job, silent)
            elif job.messages is None:
                # As the next open would: what the scope wrote since is named too.
                await self._finish_again(job, received=received)
            else:
                await self.finish(job, resumed=True)
        if silent is not None:
            await self.purge_owed()
        elif job.messages is not None:
            self._purge_later()

    def _finish_later(
        self, job: ForgetJob, units: list[asyncio.Future[None]], *, silent: bool = False
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._finish_after(job, units, silent=silent))
        self._finishing_later.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._finishing_later.discard(task)
        self._waiting_for.pop(task, None)
        self._changed.set()

    async def _units_ended(self, units: list[asyncio.Future[None]]) -> None:
        """Wait for the units ``units`` (messages under way), saying so to :meth:`finished_later`."""
        task = asyncio.current_task()
        assert task is not None
        self._waiting_for[task] = units
        self._changed.set()
        for unit in units:
            unit.add_done_callback(lambda _: self._changed.set())
        try:
            await asyncio.gather(*(asyncio.shield(unit) for unit in units))
        finally:
            self._waiting_for.pop(task, None)

    async def _finish_after(
        self, job: ForgetJob, units: list[asyncio.Future[None]], *, silent: bool = False
    ) -> None:
        # Waits holding nothing back, and holds new units back only while it deletes, waiting for
        # none there: a unit under way may be waiting for a message an ordinary forget would hold
        # back. The job stays recorded until then, so a crash leaves it to the next open.
        try:
            with not_own_work():
                await self._units_ended(units)
                # Those units have ended: the hooks they left to run after their answer are
                # scheduled now, with the ones scheduled before the forget.
                scheduled = self.settling.scheduled()
                if scheduled is not None:
                    await asyncio.shield(scheduled)
            for _ in range(FINISH_ROUNDS):
                with own_work():
                    async with self.fence.forgetting(), self.write_lock:
                        # A message of the scope begun since and still under way would write
                        # after the deletion: the deletion waits for a moment without one.
                        later = self.fence.under_way(lambda key: touches(job, key))
                        noted = await self._silent_note(job) if silent else None
                        if noted is not None:
                            # A retention pass's, run from hooks: what the person said meanwhile
                            # is theirs (their own messages under way are not waited for).
                            await self._finish_silent(job, noted)
                            return
                        if not later:
                            # Messages received meanwhile are not the forget's: their entries
                            # stay, and they are written after it as after any forget.
                            await self._finish_again(job)
                            return
                with not_own_work():
                    await self._units_ended(later)
            log.warning("messages of a scope kept coming while its forget was to be finished; finishing it")
            with own_work():
                async with self.fence.forgetting(), self.write_lock:
                    await self._finish_again(job)
        except Exception:
            log.exception("finishing a forget run from hooks failed; it is tried again")
            self._retry_later(job, received=False)

    async def _finish_again(
        self, job: ForgetJob, *, received: bool = False, noted: dict[str, Any] | None = None
    ) -> None:
        """Run a recorded scope forget again and finish it, naming what the scope wrote since (the
        plugins scrub copies by it). ``received``: delete the scope's received entries too.
        ``noted``: a retention pass's note (see :meth:`scope_unless`), written beside the new
        job too: left unfinished, it is finished as the pass's."""
        store = self.memory.store
        again = await store.begin_forget(**job.scope.model_dump())
        if noted is not None:
            await store.state_put(SILENT_NAMESPACE, again_key(again), noted)
        try:
            await self.finish(with_sources_of(again, job), received=received)
        except PluginError:
            if all(set(ids) <= set(job.sources.get(chat, ())) for chat, ids in again.sources.items()):
                # The earlier job names all this one does: one record of what is owed, not one
                # more for every open while a plugin's service is down.
                await store.finish_forget(again, purge=False)
                await store.state_delete(SILENT_NAMESPACE, again_key(again))
            raise
        if noted is not None:
            await store.state_delete(SILENT_NAMESPACE, again_key(again))
        await store.finish_forget(job, purge=False)

    async def _silent_note(self, job: ForgetJob) -> dict[str, Any] | None:
        """What a retention pass's forget noted beside its job (see :meth:`scope_unless`):
        ``before``, and once it was finished in part, ``said``; ``None`` for any other forget."""
        if job.messages is not None or job.user_id is None:
            return None
        noted: dict[str, Any] | None = await self.memory.store.state_get(SILENT_NAMESPACE, again_key(job))
        return noted

    async def _finish_silent(self, job: ForgetJob, noted: dict[str, Any]) -> None:
        """Finish a retention pass's forget that failed midway (a plugin's service down, a
        crash). Silent still, the person goes as the pass meant (what was written of them since
        the job was recorded is old too: a late write of what they said long ago). Once they
        have spoken (a memory, a message received, a plugin's write of them, at ``before`` or
        later), only what they said before ``before`` goes, with the copies every plugin made
        of those messages, each plugin told a forget of those messages chat by chat, said by
        them (``said_by``); what they said since, what is received of them, and what plugins
        keep of them by no message (a fact a tool stated) stay: before, the forget took all of
        it, a year of silence ended by a message deleted with it."""
        store = self.memory.store
        assert job.user_id is not None
        before = datetime.fromisoformat(noted["before"])
        key = again_key(job)
        if not await retention.spoke_since(self, job.tenant, job.user_id, before):
            # What a try that failed named (late writes of old messages, their rows gone) too.
            earlier = with_sources_of(job, job.model_copy(update={"sources": noted.get("said", {})}))
            await self._finish_again(earlier, noted=noted)
            await store.state_delete(SILENT_NAMESPACE, key)
            return
        log.info("forget %d: its person has spoken since; what they said before %s goes", job.id, before)
        old = [r for r in await store.recent(job.scope, until=before, limit=2**62) if r.created_at < before]
        said: dict[str, set[str]] = {}
        for chat_id, ids in [*job.sources.items(), *noted.get("said", {}).items()]:
            said.setdefault(chat_id, set()).update(ids)
        for record in old:
            said.setdefault(record.chat_id, set()).update(record.message_ids)
        named = {chat_id: sorted(ids) for chat_id, ids in sorted(said.items())}
        # Before the rows go: stopped or failing after, the next try still names their messages
        # to the plugins, and purges what the first try deleted (it never got to its purge).
        await store.state_put(SILENT_NAMESPACE, key, {"before": noted["before"], "said": named})
        await store.state_put(*PURGE_OWED, {"job": job.id})
        if old:
            await store.delete([r.id for r in old if r.id is not None], job.scope)
        embedder = self.memory.embedder
        if isinstance(embedder, ForgetsRecentTexts):
            embedder.forget_recent_texts()
        await self.notices.send(job.scope)
        for chat_id, ids in named.items():
            of_chat = job.model_copy(
                update={"user_id": None, "chat_id": chat_id, "messages": ids, "sources": {chat_id: ids}}
            )
            told = {
                "memory": self.memory,
                "removed": [r for r in old if r.chat_id == chat_id],
                "resumed": True,
                "said_by": job.user_id,
                **of_chat.model_dump(exclude={"id"}),
            }
            try:
                await self.memory.host.call_every("narrmem_after_forget", **told)
            except PluginError as exc:
                raise PluginError(
                    f"forget {job.id}: {exc}; the forget stays recorded and is finished again later"
                ) from exc.__cause__
            await owed_forgets.owe(self.memory, of_chat, part=chat_id, said_by=job.user_id)
        await store.finish_forget(job, purge=False)
        await store.state_delete(SILENT_NAMESPACE, key)

    async def finished_later(self) -> None:
        """Wait for the forgets run from hooks to be finished, but for those waiting for messages
        under way (whose hooks may be waiting for the caller, as ingest calls not yet answered
        are not waited for either); at once inside hooks, which they may be waiting for."""
        while not inside_own_work():
            self._changed.clear()
            if all(self._waits_for_units(task) for task in self._finishing_later):
                return
            await self._changed.wait()

    async def outlasted(self) -> None:
        """Wait for the forgets whose callers gave up (see :meth:`_to_the_end`); at once inside
        hooks or a unit, which they may be waiting for."""
        await self._outlasting.ended()

    async def outlasted_before_close(self) -> None:
        """:meth:`outlasted`, for :data:`PURGE_WAIT_S` at most: a forget that has not recorded its
        job by then (held at another worker's gate, or behind a plugin that hangs) is named in the
        log, as the close cuts it and it is not done."""
        left = await self._outlasting.ended_within(PURGE_WAIT_S)
        if left:
            log.warning(
                "closing with %d forget(s) whose callers gave up still under way: one whose job "
                "is recorded is finished at the next open; one still waiting to begin is not done "
                "(its error is logged if it fails): ask for it again",
                left,
            )

    async def close(self, closing: asyncio.Task[Any] | None = None) -> None:
        """Stop the forgets from hooks still waiting for messages under way, and the tries again
        of forgets that failed: their jobs stay recorded, and the next open finishes them.
        ``closing``: the task that closes the memory (see :meth:`TryingAgain.close`)."""
        await self._again.close(closing)
        await self.notices.close()
        tasks = list(self._finishing_later)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._purge is not None:
            self._purge_now.set()
            await asyncio.gather(self._purge, return_exceptions=True)

    def _waits_for_units(self, task: asyncio.Task[None]) -> bool:
        return any(not unit.done() for unit in self._waiting_for.get(task, ()))

    async def messages(
        self,
        scope: Scope,
        message_ids: Sequence[str],
        *,
        sparing: Call | None = None,
        carrying: int | None = None,
        edit_mark: str | None = None,
    ) -> dict[str, int]:
        """Forget messages by id; ``sparing``: an edit's call, whose new text this leaves be;
        ``carrying``: that new text's hold of the fence, held from this forget's end;
        ``edit_mark``: that edit's mark (:mod:`narrmem.edit_marks`), which notes this forget."""
        return await self._to_the_end(self._messages(scope, message_ids, sparing, carrying, edit_mark))

    async def _messages(
        self,
        scope: Scope,
        message_ids: Sequence[str],
        sparing: Call | None,
        carrying: int | None,
        edit_mark: str | None,
    ) -> dict[str, int]:
        ids = message_id_list(message_ids)
        chat_id = scope.chat_id
        drop = None
        if chat_id is not None:
            drop = functools.partial(self.calls.drop_messages, scope.tenant, chat_id, ids, sparing=sparing)
        async with self.fence.forgetting(begin=drop, carrying=carrying):
            await self._quiet()
            async with self.write_lock:
                if edit_mark is not None:
                    await self.marks.forgetting(edit_mark, await self._last_job())
                elif sparing is None:  # a forget asked for, not an edit's of its old text
                    await self.memory.forget_marks.leave(scope, ids, None)
                job = await self.memory.store.begin_forget(
                    tenant=scope.tenant, user_id=None, chat_id=scope.chat_id, messages=ids
                )
                if edit_mark is not None:
                    await self.marks.forgetting_job(edit_mark, job.id)
                # An edit's forget of its old text voids no edit's mark: another edit of the same
                # message under way replaces the text too, and stores its own afterwards.
                if edit_mark is None and sparing is None:
                    counts = await self._finish_or_retry(job)
                else:
                    counts = await self.finish(job, edits=sparing is None)
        if counts.get("memories"):
            self._purge_later()
        return {"memories": counts.get("memories", 0)}

    async def memories(self, scope: Scope, memory_ids: Sequence[int]) -> int:
        """Delete these memories of ``scope`` by id (not their messages): out of the store, the
        embedder's recent texts and every plugin's keeping (``narrmem_after_delete``), and out of
        the files at the next purge, as a deleted message's are. How many were deleted."""
        return await self._to_the_end(self._memories(scope, memory_ids))

    async def _memories(self, scope: Scope, memory_ids: Sequence[int]) -> int:
        store = self.memory.store
        # As a message's forget: what is being written and the hooks owed run first, so that no
        # hook writes a copy of a memory after its plugin was told it is gone.
        async with self.fence.forgetting():
            await self._quiet()
            async with self.write_lock:
                removed = list((await store.get(list(memory_ids), scope)).values())
                deleted = await store.delete([r.id for r in removed if r.id is not None], scope)
        embedder = self.memory.embedder
        if isinstance(embedder, ForgetsRecentTexts):
            embedder.forget_recent_texts()
        if deleted:
            self._purge_later()
        if removed:
            # Each plugin told though one fails (reported through narrmem_plugin_error): the
            # memory is gone from the store whatever a plugin does.
            await self.memory.host.call(
                "narrmem_after_delete", memory=self.memory, tenant=scope.tenant, removed=removed
            )
            for chat_id in sorted({r.chat_id for r in removed}):
                await self.notices.send(Scope(tenant=scope.tenant, chat_id=chat_id))
        return deleted

    async def _last_job(self) -> int:
        """The id of the last forget job begun (0 on a store that cannot tell: every job of the
        message recorded then counts)."""
        store = self.memory.store
        return await store.forgets_begun() if isinstance(store, CountsForgets) else 0

    def _purge_later(self) -> None:
        """A deleted message's words stay in the keyword index's segments and in freed pages
        until a purge, which costs time in proportion to the store (a second at 100,000
        memories): too much for every edit. The first delete since the last purge schedules one
        ``purge_deleted_messages_after_s`` later (a delete made while one runs, the next one that
        long after it ends); closing runs it at once."""
        self._purge_owed = True
        if self._purge is None and isinstance(self.memory.store, PurgesDeleted):
            delay = self.memory.settings.storage.purge_deleted_messages_after_s
            self._purge = asyncio.get_running_loop().create_task(self._purge_after(delay))

    async def _purge_after(self, delay: float) -> None:
        while self._purge_owed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._purge_now.wait(), self._purge_wait(delay))
            # Deletes made while it purges are purged by the next, a delay later: with messages
            # deleted every few seconds, purges ran back to back.
            self._purge_owed = False
            await self._run_purge()
        self._purge = None

    def _purge_wait(self, delay: float) -> float:
        """The delay, and after failed purges a longer one (a full disk fails each try: each
        costs a rebuild of the keyword index and a pass over the file), up to an hour."""
        if not self._purge_failures:
            return delay
        return max(delay, min(PURGE_RETRY_FIRST_S * 2.0 ** (self._purge_failures - 1), PURGE_RETRY_MAX_S))

    async def _run_purge(self) -> None:
        store = self.memory.store
        assert isinstance(store, PurgesDeleted)
        if isinstance(store, PurgesAlongsideWrites):
            # The keyword index's rebuild lets writes go on; the file's rewrite takes the turn.
            # Each part is tried whatever the other did, and a failed one the next time.
            parts = [store.purge_alongside_writes, self._in_turn(store.purge_in_turn)]
        else:
            parts = [self._in_turn(store.purge_deleted)]
        failed = False
        for part in parts:
            try:
                await part()
            except Exception:
                log.exception("purging what deleted messages left in the files failed; tried again later")
                failed = True
        self._purge_failures = self._purge_failures + 1 if failed else 0
        # Tried again later; closing tries once (the next purge covers them then).
        if failed and not self._purge_now.is_set():
            self._purge_owed = True

    def _in_turn(self, purge: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def in_turn() -> None:
            async with self.write_lock:
                await purge()

        return in_turn

    def again_later(self, scope: Scope, message_ids: Sequence[str], written: Sequence[int]) -> None:
        """:meth:`again`, tried in the background until it is done (its first try failed)."""
        work = functools.partial(self.again, scope, message_ids, written)
        self._again.keep_trying(work, "forgetting again a message a forget took")

    async def again(self, scope: Scope, message_ids: Sequence[str], written: Sequence[int]) -> None:
        """Forget again what this worker made of messages that a forget took while it wrote them
        (by another worker of a shared store, see :mod:`narrmem.inbox`): their after-store hooks
        run first, then the memories this worker wrote of them (``written``, maybe none) and
        those that cite other messages too (a pattern's scene) are deleted, and every plugin
        scrubs its copies of the messages, without waiting for what was received (the caller is
        the one writing it). A memory of these messages alone that this worker did not write came
        after that forget (an edit's new text, the message sent again) and stays, and so do the
        received entries, edit marks and pending hooks of such messages. Before, all of it was
        deleted by the messages' ids, and an edit's new text stored meanwhile went with it. A
        forget again that stops halfway (a crash, a plugin that fails to scrub) is finished by
        the next open the same way: what it deletes is written down beside its job
        (:data:`AGAIN_NAMESPACE`; a process stopped between the two writes leaves a job that is
        finished by the messages' ids)."""
        await self.settling.settle()
        async with self.write_lock:
            store = self.memory.store
            assert scope.chat_id is not None
            # What the messages' hooks made of them with other messages (a pattern's scene that
            # cites them) goes too, as in any forget of messages; a memory of one of these
            # messages alone that this worker did not write is someone else's, written after.
            named = set(message_ids)
            cited = await store.get(
                await store.from_messages(scope.tenant, scope.chat_id, list(message_ids)), scope
            )
            others = [mid for mid, r in cited.items() if not set(r.message_ids) <= named]
            if not written and len(others) < len(cited):
                # A memory of these messages alone that this worker did not write: they were
                # sent again after that forget, and what is made of them now is theirs.
                return
            only = sorted({*written, *others})
            job = await store.begin_forget(
                tenant=scope.tenant, user_id=None, chat_id=scope.chat_id, messages=list(message_ids)
            )
            # Before anything is deleted: resumed by its messages' ids, it would delete what
            # someone else stored under them since (an edit's new text).
            await store.state_put(AGAIN_NAMESPACE, again_key(job), {"only": only})
            await self.finish(job, received=False, only=only)
            await store.state_delete(AGAIN_NAMESPACE, again_key(job))

    async def finish(
        self,
        job: ForgetJob,
        *,
        done: bool = True,
        received: bool = True,
        edits: bool = True,
        only: Sequence[int] | None = None,
        purge: bool = True,
        resumed: bool = False,
    ) -> dict[str, int]:
        """Delete what ``job`` names and let every plugin scrub its copies; safe to run again.
        ``done``: delete the job's record (and purge the files) too; without ``purge``, the purge
        of a user's or chat's job is noted as owed instead (:meth:`purge_owed` runs it).
        ``received``: delete the entries of the messages received and not yet written that it
        names, and, with ``edits``, the marks of the edits of them under way
        (:mod:`narrmem.edit_marks`). ``only``: of a job of messages, delete these memories of
        them alone (the plugins still scrub by the messages' ids)."""
        store = self.memory.store
        # Received messages go first: a worker that writes one of them afterwards finds its entry
        # gone and forgets it again (narrmem.inbox), while one whose entry it deleted first wrote
        # it before the deletions below.
        if received:
            await self.inbox.drop(job)
            if edits:
                await self.marks.drop(job)
        if job.messages is None:
            removed = await store.recent(job.scope, limit=2**62)
            counts = await store.forget(tenant=job.tenant, user_id=job.user_id, chat_id=job.chat_id)
        else:
            assert job.chat_id is not None
            ids = (
                list(only)
                if only is not None
                else await store.from_messages(job.tenant, job.chat_id, job.messages)
            )
            removed = list((await store.get(ids, job.scope)).values())
            counts = {"memories": await store.delete(ids, job.scope)}
        embedder = self.memory.embedder
        if isinstance(embedder, ForgetsRecentTexts):
            embedder.forget_recent_texts()
        # Told whatever the plugins here do: the store holds none of it now.
        await self.notices.send(job.scope)
        told = {
            "memory": self.memory,
            "removed": removed,
            "resumed": resumed,
            "said_by": None,
            **job.model_dump(exclude={"id"}),
        }
        try:
            # Every plugin scrubs its copies though one fails; the job then stays recorded.
            await self.memory.host.call_every("narrmem_after_forget", **told)
        except PluginError as exc:
            raise PluginError(
                f"forget {job.id}: the store deleted what it holds, but {exc}; the forget stays "
                "recorded and is finished again later (in this process, and at the next open)"
            ) from exc.__cause__
        if only is None:
            # Forgotten again (only), the messages' hooks in this worker have run, and what other
            # workers' hooks have still to run is of what they wrote since.
            await self.settling.drop(job)
        if done:
            # Before the job's record goes: stopped in between, the next open finishes the job
            # again, and leaves it to them again (the same key).
            await owed_forgets.owe(self.memory, job)
            scope_job = job.messages is None
            if scope_job and not purge:
                # Noted before the job's record goes: stopped in between, the next open purges.
                await store.state_put(*PURGE_OWED, {"job": job.id})
            await store.finish_forget(job, purge=scope_job and purge)
        return counts

    async def resume(self) -> None:
        if self.memory.read_only:
            return  # the process that writes the folder finishes them
        store = self.memory.store
        # Read before the jobs: an entry's job was recorded before it, so one whose job is not
        # pending then belongs to a forget again that finished (its process stopped before it
        # deleted the entry).
        agains = [key for key, _ in await store.state_items(AGAIN_NAMESPACE)]
        silents = [key for key, _ in await store.state_items(SILENT_NAMESPACE)]
        pending = await store.pending_forgets()
        for key in set(agains) - {again_key(job) for job in pending}:
            await store.state_delete(AGAIN_NAMESPACE, key)
        for key in set(silents) - {again_key(job) for job in pending}:
            await store.state_delete(SILENT_NAMESPACE, key)
        for job in pending:
            log.warning("finishing a forget that was interrupted (job %d)", job.id)
            silent = await self._silent_note(job)
            if silent is not None:
                try:
                    # Whether the person has spoken, asked with every worker's writes held
                    # back: one written between the question and the deletion would go with it.
                    async with self.fence.forgetting(), self.write_lock:
                        # Another worker's open may have finished it while this one waited.
                        if job.id in {other.id for other in await store.pending_forgets()}:
                            await self._finish_silent(job, silent)
                except PluginError:
                    log.exception("forget %d is not finished: a plugin failed to scrub its copies", job.id)
                continue
            async with self.write_lock:
                try:
                    if job.messages is None:
                        # What the scope wrote after the job was recorded (a forget run from
                        # hooks that was still to be finished) is named too. The received entries
                        # a stopped process left go first, as in any forget: the inbox writes
                        # them next.
                        await self._finish_again(job, received=True)
                        continue
                    again = await store.state_get(AGAIN_NAMESPACE, again_key(job))
                    if again is None:
                        # An edit's own forget leaves its mark, which holds the new text: the
                        # edit is made again from it once the forgets are finished.
                        await self.finish(
                            job, edits=not await self.marks.own_forget(job, pending), resumed=True
                        )
                        continue
                    # A forget again: what it deletes, as it would have, and nothing received.
                    only = [int(mid) for mid in again["only"]]
                    await self.finish(job, received=False, only=only, resumed=True)
                    await store.state_delete(AGAIN_NAMESPACE, again_key(job))
                except PluginError:
                    # A plugin's service may be down: the bot still starts (the store holds
                    # nothing of the scope any more), and the job waits for the next open.
                    log.exception("forget %d is not finished: a plugin failed to scrub its copies", job.id)
        await self.purge_owed()  # one a process that stopped left


def again_key(job: ForgetJob) -> str:
    """The state key of a forget again's job (state is deleted by key prefix: the slash ends it)."""
    return f"job-{job.id}/"


def with_sources_of(job: ForgetJob, earlier: ForgetJob) -> ForgetJob:
    """``job`` naming the messages of ``earlier`` too."""
    chats = {*job.sources, *earlier.sources}
    sources = {chat: sorted({*job.sources.get(chat, ()), *earlier.sources.get(chat, ())}) for chat in chats}
    return job.model_copy(update={"sources": sources})


def touches(job: ForgetJob, key: ScopeKey) -> bool:
    """Whether a message of ``key`` (tenant, user, chat) is in the scope ``job`` forgets, or in a
    chat that the scope wrote in."""
    tenant, user_id, chat_id = key
    if tenant != job.tenant:
        return False
    return (job.user_id in (None, user_id) and job.chat_id in (None, chat_id)) or chat_id in job.sources


def message_id_list(message_ids: Collection[str], field: str = "message_ids") -> list[str]:
    # A set as well as a list: the calls that leave ids out took one before they were checked.
    if isinstance(message_ids, str | bytes) or not isinstance(message_ids, Sequence | Set):
        raise InputError("must be a list of message ids", field=field)
    message_ids = list(message_ids) if isinstance(message_ids, Sequence) else sorted(message_ids, key=str)
    for i, mid in enumerate(message_ids):
        if not isinstance(mid, str) or not 0 < len(mid) <= MAX_ID_CHARS:
            raise InputError(f"must be a string of 1 to {MAX_ID_CHARS} characters", field=f"{field}[{i}]")
        if has_surrogate(mid):
            raise InputError("holds a lone surrogate (not valid Unicode)", field=f"{field}[{i}]")
        if "\x00" in mid:
            # No message is stored under it (ingest refuses one); on PostgreSQL the forget job
            # recorded for it failed every later open.
            raise InputError("must not hold a NUL character", field=f"{field}[{i}]")
    return list(message_ids)
