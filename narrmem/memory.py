"""``Memory``: the public async API, a thin façade over the engine's parts: the ingest and recall
pipelines (:mod:`narrmem.ingest`, :mod:`narrmem.recall`), editing, importance
(:mod:`narrmem.importance`), plugin-answered calls (:mod:`narrmem.answers`) and durable forgetting
(:mod:`narrmem.forgetting`). What it owns and how it opens and closes (one host, one store, one
embedder) is :mod:`narrmem.lifecycle`; plugins see it as a :class:`~narrmem.view.MemoryView`."""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal

from narrmem import answers, chat_moves, editing, importance, logs, opening, retention
from narrmem import recall as recall_pipeline
from narrmem.checks import aware_time_argument, sequence_argument
from narrmem.config import Acknowledge
from narrmem.errors import InputError
from narrmem.forgetting import message_id_list
from narrmem.importance import memory_id_list
from narrmem.ingest import TriggerCallback, as_message, attributed, speaker_of
from narrmem.lifecycle import MemoryLifecycle, while_open
from narrmem.models import (
    ContextPack,
    Hit,
    IngestResult,
    MemoryRecord,
    Message,
    RecallRequest,
    Scope,
    TriageDecision,
)

__all__ = ["Memory", "attributed", "speaker_of"]

log = logs.logger("narrmem")

scope_of = opening.scope_argument
ACKNOWLEDGE_MODES: tuple[Acknowledge, ...] = typing.get_args(Acknowledge)


def acknowledge_argument(value: object) -> Acknowledge:
    for mode in ACKNOWLEDGE_MODES:
        if value == mode and isinstance(value, str):
            return mode
    raise InputError(f"must be one of {', '.join(ACKNOWLEDGE_MODES)}, not {value!r}", field="acknowledge")


class Memory(MemoryLifecycle):
    """Open with ``async with Memory.open("folder") as mem:`` (or ``mem = await Memory.open(...)``
    and ``await mem.close()``); what it owns and how it opens and closes is
    :class:`~narrmem.lifecycle.MemoryLifecycle`, what a bot calls is here."""

    @while_open
    async def ingest(
        self, message: Message | dict[str, Any], *, acknowledge: Acknowledge | None = None
    ) -> IngestResult:
        """Triage one message and store what it deserves. Ignored messages return at once. The
        result comes once the after-store hooks ran (its counts, notes and triggers); with
        ``acknowledge="after_write"``, once the message is written (``settled`` is ``False``; the
        hooks run after it, see :meth:`settle`); with ``"on_receipt"``, once it is triaged and
        kept in the store as it came (``written`` is ``False``: it is embedded and written a
        moment later; recall waits for it). ``acknowledge`` defaults to ``[storage] acknowledge``."""
        [result] = await self.ingest_many([message], acknowledge=acknowledge)
        return result

    @while_open
    async def ingest_many(
        self,
        messages: Sequence[Message | dict[str, Any]],
        *,
        progress: Callable[[int], None] | None = None,
        acknowledge: Acknowledge | None = None,
        history: bool = False,
    ) -> list[IngestResult]:
        """Ingest in order with batched embeddings and one transaction per batch. Every message is
        validated before anything is written: one bad message is an :class:`InputError` naming
        its index and field, and nothing from the call is stored. ``acknowledge`` as for
        :meth:`ingest`; ``"on_receipt"`` applies to calls of up to 8 messages, a larger one is
        answered once written. A message said before a forget of its person, chat, person in the
        chat or itself is left out (answered as not stored, as far as forget marks are kept) in a
        call of more than 8 messages, or in any with ``history=True`` (a chat's past brought in:
        an export imported again after a ``forgetme`` stored the person's words again)."""
        mode = None if acknowledge is None else acknowledge_argument(acknowledge)
        if not isinstance(history, bool):
            raise InputError("must be true or false", field="history")
        return await self._ingest.run(
            sequence_argument(messages, "messages"), progress, mode, history=history
        )

    async def settle(self) -> None:
        """Wait until the after-store hooks (counts, facts, triggers) of every message acknowledged
        so far have run. Needed only with ``[storage] acknowledge = "after_write"``, where ingest
        returns before they run, or ``"on_receipt"``, where it returns before the message is
        written (this waits for the writes too, but not for a message whose write failed and
        waits for another try); closing the memory and a forget wait for them too. Outside hooks,
        it also waits for forgets run from hooks to be finished (see :meth:`forget`), but for
        those waiting for messages still under way (calls not yet answered, whose hooks may be
        waiting for the caller), and for the ingests, edits and forgets whose callers gave up
        (a timeout around the call): they run on to their end. A plugin's hook that found the
        store unreachable is not waited for either: it is run again once the store answers
        (``IngestResult.notes`` names it; see ``narrmem_after_store``)."""
        # An edit whose caller gave up runs on (see edit): its new text and its hooks first.
        await self._edits_outlasting.ended()
        await self._inbox.drained()
        await self._settling.settle()
        await self._forgetting.finished_later()
        # A forget whose caller gave up (a handler's timeout) runs on to its end: settled, the
        # person is gone (it was still recalled right after).
        await self._forgetting.outlasted()

    @property
    def hooks_owed(self) -> int:
        """Stored messages whose after-store hooks of some plugin found the store unreachable in
        this process and wait for it to answer (see ``narrmem_after_store``). Reads nothing."""
        return self._settling.owed

    async def written(
        self,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str | None = None,
        exclude_message_ids: Sequence[str] = (),
    ) -> None:
        """Wait until the messages this process acknowledged on receipt (``[storage] acknowledge =
        "on_receipt"``) are written: those of the scope, or every one when no ``tenant`` is given,
        but for ``exclude_message_ids``. Recall waits for its scope's by itself, but for the
        messages it leaves out (the one being answered)."""
        scope = None if tenant is None else scope_of(tenant, user_id, chat_id)
        left_out = message_id_list(exclude_message_ids, "exclude_message_ids")
        await self._inbox.written(scope, frozenset(left_out))

    @while_open
    async def triage(self, message: Message | dict[str, Any]) -> TriageDecision:
        """What triage decides for a message, without storing anything (a dry run)."""
        return await self._ingest.triage(as_message(message, None), [])

    @while_open
    async def edit(self, message: Message | dict[str, Any]) -> IngestResult:
        """A message was edited: what it left is replaced by what the new text deserves, and the
        earlier texts are kept in the new episode's ``meta["edits"]``."""
        steps = editing.EditSteps(
            self._calls,
            self._fence,
            self._edit_marks,
            self._forgetting.messages,
            self._ingest.run,
            self._one_edit_at_a_time,
            self._edits_outlasting,
        )
        return await editing.edit(self, message, steps)

    async def _edit_again(self, message: Message) -> None:
        result = await self.edit(message)
        # No id of the message or its chat: a log outlives a forget of them.
        log.warning(
            "made again an edit that a stopped process left: %s",
            "stored" if result.stored else result.reason or "nothing stored",
        )

    def on_trigger(self, callback: TriggerCallback) -> None:
        """Call ``await callback(event)`` for every trigger event; a raising callback is logged. It
        is awaited inside the hooks of the message that made the event, which the memory's writes
        wait for: a callback that may wait (a rate-limited send) should send from a task of its own."""
        self._trigger_callbacks.append(callback)

    @while_open
    async def recall(
        self,
        query: str,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
        k: int = 5,
        kinds: list[str] | None = None,
        snippet_tokens: int | None = 48,
        reinforce: bool = True,
        reinforce_reason: Literal["relevance", "tool"] = "relevance",
        exclude_message_ids: Sequence[str] = (),
        asked_at: datetime | None = None,
    ) -> list[Hit]:
        """At most ``k`` memories that answer ``query`` inside the scope, best first, each saying why
        it ranked (``Hit.why``); only those over the relevance floor, so fewer is normal. A few of
        the most relevant are reinforced (``reinforce=False``: a read-only probe). Memories only
        from ``exclude_message_ids`` (the message being answered) are left out. ``asked_at``, the
        question's time with the asker's UTC offset (the message's ``ts``), makes "yesterday" and
        "last Monday" days of the asker's calendar; without it they are the memory's clock's. See
        the README's Recall section for snippets and the floor."""
        request = opening.model_argument(
            RecallRequest,
            query=query,
            scope=scope_of(tenant, user_id, chat_id),
            k=k,
            kinds=kinds,
            snippet_tokens=snippet_tokens,
            reinforce=reinforce and not self.read_only,
            reason=reinforce_reason,
            # Checked as a forget's are: an id no message can have (NUL, a lone surrogate) is a
            # client's bug to tell, not a filter that never matches.
            exclude_message_ids=message_id_list(exclude_message_ids, "exclude_message_ids"),
            asked_at=asked_at,
        )
        return await recall_pipeline.run(self, request)

    @while_open
    async def context(
        self,
        text: str,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
        k: int = 8,
        exclude_message_ids: Sequence[str] = (),
        reinforce: bool = True,
        asked_at: datetime | None = None,
    ) -> ContextPack:
        """What to put in front of the bot's next answer to ``text``: ``pack.render(token_budget)``.
        Pass the id of the message being answered in ``exclude_message_ids`` once it is stored.
        Its hits are reinforced as a recall's are (they go into the answer); ``reinforce=False``
        takes a look that changes nothing. ``asked_at``: as :meth:`recall`'s."""
        scope = scope_of(tenant, user_id, chat_id)
        hits = await self.recall(
            text,
            **scope.model_dump(),
            k=k,
            exclude_message_ids=exclude_message_ids,
            reinforce=reinforce,
            asked_at=asked_at,
        )
        return ContextPack(query=text, scope=scope, hits=hits)

    @while_open
    async def turn_context(
        self, text: str, *, user_id: str, chat_id: str, tenant: str = "default", private: bool = False
    ) -> dict[str, Any]:
        """What to know before answering ``text``: the persona, the working memory chain and the
        relevant facts and memories (the per-turn flow), from the graph plugin or whichever answers
        ``narrmem_turn_context``. ``result["rendered"]`` is the prompt block. The memories it
        recalls are reinforced as a recall's are: it is the bot's own turn, not an inspection.

        The person's facts and memories are those said in ``chat_id``: the answer may be read by
        everyone in it. ``private=True`` says ``chat_id`` is a direct chat with the bot, read by the
        person alone: then they come from every chat of the person's (as the integrations'
        ``context_scope="auto"`` does)."""
        return await answers.turn_context(self, scope_of(tenant, user_id, chat_id), text, private=private)

    @while_open
    async def summary(
        self,
        *,
        user_id: str,
        depth: int | None = None,
        token_budget: int | None = None,
        tenant: str = "default",
    ) -> dict[str, Any]:
        """ "Who is this person" at an abstraction level (``depth``, 1 = most abstract) or the most
        detailed telling that fits ``token_budget``; from the rtm plugin or whichever answers."""
        return await answers.summary(self, scope_of(tenant, user_id), depth, token_budget)

    @while_open
    async def patterns(self, *, user_id: str, tenant: str = "default") -> dict[str, Any]:
        """What keeps coming back for a user as of the clock's now: ``counts`` (topics, moods, each
        with its count and message ids) and the ``triggers`` that fired for them. Read from what is
        stored, so it survives restarts and is the same in every worker; it changes nothing."""
        return await answers.patterns(self, scope_of(tenant, user_id))

    @while_open
    async def importance_now(self, records: Sequence[MemoryRecord]) -> dict[int, float]:
        """Each record's importance after decay as of the clock's now (the stored value when no
        plugin models decay)."""
        return await importance.importance_now(self, records)

    @while_open
    async def mark_used(
        self,
        memory_ids: Sequence[int],
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
    ) -> list[int]:
        """The bot used these memories in its answer: they are reinforced (at most once per spacing
        window, see the hippocampus). Ids outside the scope are ignored. Returns the ids reinforced."""
        return await importance.mark_used(self, memory_ids, scope_of(tenant, user_id, chat_id))

    @while_open
    async def decay(self, now: datetime | None = None) -> dict[str, int]:
        """Run the decay pass as of ``now`` (default: the clock); returns counts."""
        return await importance.decay(self, now)

    @while_open
    async def history(self, memory_id: int) -> dict[str, Any]:
        """A memory's importance over time: its stored state, the recorded changes, and what the
        decay plugin projects."""
        return await importance.history(self, memory_id)

    @while_open
    async def call_tool(
        self, name: str, arguments: dict[str, Any] | str | None = None, *, scope: Scope | None = None
    ) -> dict[str, Any]:
        """Run a registered tool with JSON arguments; returns its typed result as a JSON-ready dict.

        ``scope``: whom the call acts for, when a model wrote the arguments (the person whose turn
        it is, and the chat): the tool's ``tenant``, ``user_id`` and ``chat_id`` are set to the
        scope's (those it gives), and a call that names another is refused with an
        :class:`InputError` naming the field, so words in the conversation cannot turn the model
        to another person's memory."""
        return await answers.call_tool(self, self.tools, name, arguments, scope)

    @while_open
    async def forget(
        self,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
        asked_at: datetime | None = None,
    ) -> dict[str, int]:
        """Delete every trace of a user (and/or a chat): rows, keyword index, vectors, history, and
        every plugin's copies (graph, summaries, counters, other memories' keyword context). The
        forget is written down before anything is deleted and reported done only when every
        plugin has finished; one interrupted by a crash is finished on the next open. A message
        of the scope that an ingest call of this process holds and has not written yet when the
        forget begins is not written (its result says ``stored=False``, "forgotten before it was
        written"). If a plugin fails to scrub its copies, every other plugin still scrubs, the
        call raises :class:`PluginError` naming it, and the forget stays recorded for the next open.

        Run from hooks or a trigger callback, it does not wait for the messages being written
        meanwhile (they may be waiting for the code that forgets). If some are of the scope or of
        a chat it wrote in, or hooks are scheduled to run, it deletes what it can, returns, and
        is finished once they have ended, so what their hooks make does not outlive it
        (:meth:`settle` waits for that). Messages of the scope written before then go with it,
        and the counts returned are those of the first deletion.

        The forget leaves a mark of its scope (:mod:`narrmem.forget_marks`) by which a write of it
        made before and arriving late, from another process, is not stored (see
        :meth:`forgotten_after`). ``asked_at``: when the forget was asked, for one made late (a
        bot's backlog), so that what the person said after asking is not taken for before.

        A chat's forget takes the chats it was before too (:mod:`narrmem.chat_moves`: a Telegram
        group that became a supergroup), and, forgotten whole, the note of its move."""
        scope = scope_of(tenant, user_id, chat_id)
        asked = None if asked_at is None else aware_time_argument(asked_at, "asked_at")
        earlier: list[str] = []
        if scope.chat_id is not None:
            # The chats it was before (a Telegram group became a supergroup) are the same chat.
            earlier = await chat_moves.earlier_chats(self.store, scope.tenant, scope.chat_id)
        chats = [scope.chat_id, *earlier]

        async def forget_notes() -> None:
            if scope.chat_id is not None and scope.user_id is None:
                await chat_moves.forget_moves(self.store, scope.tenant, [c for c in chats if c is not None])

        scopes = [scope.model_copy(update={"chat_id": chat}) for chat in chats]
        counts = await self._forgetting.scopes(scopes, asked, then=forget_notes)
        await self._purge_marks()
        return counts

    @while_open
    async def forget_messages(
        self, *, chat_id: str, message_ids: Sequence[str], tenant: str = "default"
    ) -> dict[str, int]:
        """Delete what these messages left (episodes and the scenes built from them), as when a
        chat reports a message deleted. One that an ingest call of this process holds and has
        not written yet is not written. Each message leaves a mark, as in :meth:`forget`, dated
        when the forget is made (no later write of a deleted message is the chat's)."""
        counts = await self._forgetting.messages(scope_of(tenant, chat_id=chat_id), message_ids)
        await self._purge_marks()
        return counts

    @while_open
    async def forget_memories(
        self,
        memory_ids: Sequence[int],
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
    ) -> dict[str, int]:
        """Delete these memories by id, within the scope given (ids outside it are left): a scene
        a person asked to have forgotten. The messages they came from, and what else was made of
        them, stay (:meth:`forget_messages` deletes by message). Their words leave the process at
        once and the files at the next purge, as a deleted message's do."""
        scope = scope_of(tenant, user_id, chat_id)
        deleted = await self._forgetting.memories(scope, memory_id_list(memory_ids))
        return {"memories": deleted}

    @while_open
    async def inactive_people(
        self,
        *,
        before: datetime,
        tenant: str | None = None,
        limit: int = 1000,
        after: tuple[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """The people (of ``tenant``, or of every tenant) whose every memory was said before
        ``before``: per person ``tenant``, ``user_id``, ``memories`` and ``last_said``, in tenant
        and user id order, at most ``limit``; ``after``: the next page, after this (tenant, user
        id). It reads no memory's text and changes nothing. :meth:`forget_inactive` forgets them
        but those a plugin wrote of since (a fact the bot stated with a tool lately), and the
        people only plugins keep something of, with nothing of theirs newer:
        :func:`narrmem.retention.all_inactive` lists all it would forget."""
        return await retention.inactive_people(self.store, before, tenant=tenant, limit=limit, after=after)

    @while_open
    async def forget_inactive(
        self,
        *,
        before: datetime,
        tenant: str | None = None,
        force: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, int]:
        """Forget every person (of ``tenant``, or of every tenant) who has said nothing since
        ``before``, each as :meth:`forget` forgets, the files purged once at the end; a person who
        speaks as the pass reaches them is kept. ``before`` may not be later than the clock's now.
        Counts: ``people``, ``memories``, ``spoke_since`` (kept: they had spoken by their turn),
        ``refused`` (1 when no one in the store has spoken since ``before``, a clock that is
        wrong or a bot down that long: nothing is forgotten unless ``force``) and ``busy`` (1:
        another pass on the store is under way; nothing is done). ``progress(n)`` is called as
        people are done (a first pass over a large store takes minutes). See
        :mod:`narrmem.retention`."""
        counts = await retention.forget_inactive(
            self._forgetting,
            self.store,
            self.clock.now(),
            before,
            tenant=tenant,
            force=force,
            progress=progress,
        )
        await self._purge_marks()
        return counts

    async def _purge_marks(self) -> None:
        # After the forget, outside its turn to write: the forget is done whatever this finds.
        try:
            await self.forget_marks.purge_if_due()
        except Exception as exc:
            log.warning("expired forget marks could not be deleted now (%s)", type(exc).__name__)

    @while_open
    async def forgotten_after(
        self, message: Message | dict[str, Any], since: datetime, *, itself: bool = True
    ) -> bool:
        """Whether ``message`` (its person, chat, person in that chat, or, with ``itself``, the
        message itself) was forgotten after ``since``, in any process of the store, as far as
        forget marks are kept (``[storage] forget_marks_kept_s``). A write that waited since then
        (a bot's backlog) is dropped when this is true: made, it would store what the forget
        deleted. Reads only."""
        checked = as_message(message, index=None)
        at = await self.forget_marks.forgotten_by(checked, aware_time_argument(since, "since"), itself=itself)
        return at is not None

    @while_open
    async def stats(self) -> dict[str, Any]:
        """Store-wide figures, each plugin's own, and what is loaded."""
        return await answers.stats(self, self.tools)

    @while_open
    async def users(
        self, tenant: str | None = None, *, limit: int = 1000, after: str | None = None
    ) -> list[dict[str, Any]]:
        """Who has memories: per user of ``tenant`` (every tenant if ``None``) how many memories and
        scenes, in how many chats, and the time of the oldest and newest, in user id order. For
        inspection; it reads no memory's text and changes nothing. ``after`` (with a ``tenant``)
        gives the next page: the users after this id, the last of the previous page. A person no
        memory is kept of, whom plugins keep something of (a persona, facts a tool wrote), is a
        row with ``plugins_only`` and no counts."""
        return await answers.users(self, tenant, limit, after)

    @while_open
    async def tenants(self) -> list[str]:
        """Every tenant with memories, or with people plugins keep something of, in order.
        Changes nothing."""
        return await answers.tenants(self)
