"""Hybrid recall: vector candidates (FAISS) and keyword candidates (FTS5 BM25), both filtered by
scope inside the store's queries, fused with weighted reciprocal rank fusion.

What the keyword index sees of an episode is more than its text: who said it, the date it was
said (so "in May" and "on Friday" can match), and the chat's turns just before and after it,
because a reply ("yes, twice, it was amazing") often only makes sense with the question it
answers, and the reply to a message often names what it was about ("congrats on the new job!"
after "I got it!!"). A message's words reach the turns before it in the transaction that writes
it (``narrmem_context_lines``): they are there exactly when the message is. The text returned by
recall stays the message alone, so context costs no prompt tokens.

The earlier turns come from a small per-process cache of each chat's last turns (it also holds the
turns of a batch not written yet). On a store that several processes share (PostgreSQL) another
worker may have stored a later turn, or forgotten a user whose words the cache still holds: there
the turns the store holds are read for every message (one indexed query), and the cache adds only
this process's turns not written yet. A forget that lands between reading a message's context and
writing it is caught after the write: a context turn no longer stored is scrubbed.

Defaults were chosen on the LoCoMo development split (see the README's Benchmarks): the keyword
side, which matches names and rare words exactly, is the stronger source on conversational
memory, so it weighs 1.0 against the vector side's 0.45, and RRF's damping k is 20 rather than
the usual 60 so that agreement near the top of both lists counts more than long tails. Words
found only in the context count two thirds of the message's own words. The fused ranking is
then re-scored by a small model of what answers a question (``answer_ranking``: match strength,
how much a memory says, whether it asks, names, its conversation), fitted the same way.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from narrmem_plugins.answer_ranking import AnswerWeights, answer_scores, forget_cached_texts
from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import Settings, share
from narrmem.configured import Configured
from narrmem.models import Candidate, ContextLine, MemoryRecord, Message, RecallRequest, Scope
from narrmem.ranking import reciprocal_rank_fusion
from narrmem.store import Store, scope_pages, shared_by_processes
from narrmem.view import MemoryView

NAME = "recall_hybrid"
CHATS_KEPT = 10_000
# Messages of a span of a chat forgotten at once up to which each is looked up on its own (past
# it, one read of the span's episodes costs less: measured crossing at about 6 in 20,000 rows).
LOOKUPS_PER_FORGET = 4
# The widest context window (minutes) turns of this store were written with: a forget's scrub
# reads the turns that close to each forgotten one, and the setting may have been wider before.
WIDEST_WINDOW = (NAME, "widest_context_minutes")
# The longest stretch of a chat a forget's scrub reads at once (see _spans).
LONGEST_SPAN = timedelta(days=1)
# The widest context window the setting allows (minutes), and a page of a chat read at once.
WIDEST_ALLOWED = 10_080
CHAT_PAGE = 5_000


class HybridOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidates: int = Field(default=50, ge=1, le=10_000, description="candidates taken from each source")
    rrf_k: float = Field(default=20.0, gt=0, le=10_000, description="RRF damping constant")
    vector_weight: float = Field(default=0.45, ge=0, le=100)
    keyword_weight: float = Field(default=1.0, ge=0, le=100)
    context_turns: int = Field(default=2, ge=0, le=20, description="earlier turns added to the keyword index")
    replies_in_context: bool = Field(
        default=True,
        description="a message's words join the keyword context of the context_turns before it too "
        "(a reply often names what they were about)",
    )
    context_minutes: float = Field(
        default=60.0,
        gt=0,
        le=WIDEST_ALLOWED,
        description="earlier turns older than this are another conversation",
    )
    dates_in_keywords: bool = Field(default=True, description="index the weekday and date of each message")
    context_weight: float = share(
        0.667, "weight of words found only in the date and the turns around (two thirds: the tantivy index's)"
    )
    rank_answers: bool = Field(
        default=True, description="re-score the fused ranking by what answers (false: fusion alone)"
    )
    answer: AnswerWeights = Field(default_factory=AnswerWeights)

    def fusion_weights(self, overrides: Mapping[str, float]) -> dict[str, float]:
        """Each source's weight in the fusion: these options', then ``[recall] weights``."""
        return {"vector": self.vector_weight, "keyword": self.keyword_weight, **overrides}


class HybridRecall(Configured[HybridOptions], name=NAME, options=HybridOptions):
    def __init__(self) -> None:
        super().__init__()
        self.recall_weights: dict[str, float] = {}
        # The last few turns of each chat, newest last: context for the next message without a
        # query per message. Bounded; a miss falls back to the store.
        self._recent: OrderedDict[tuple[str, str], list[tuple[datetime, str, str]]] = OrderedDict()
        # Shared store: this process's turns not written yet, by chat (the cache's only use there).
        self._unwritten: dict[tuple[str, str], set[str]] = {}
        # Shared store: the turns a message's context took from this process's cache, by message;
        # checked against the store once it is written (see narrmem_after_store).
        self._from_cache: OrderedDict[tuple[str, str, str], dict[str, str]] = OrderedDict()
        self._window_recorded = False

    def configured(self, settings: Settings) -> None:
        self.recall_weights = dict(settings.recall.weights)

    @hookimpl
    async def narrmem_before_store(
        self, memory: MemoryView, message: Message, records: list[MemoryRecord]
    ) -> None:
        episode = records[0]
        own = episode.index_text
        parts: list[str] = []
        if self.options.dates_in_keywords:
            parts.append(_date_line(message.ts))
        if self.options.context_turns:
            context, cached = await self._context(memory, message)
            parts.extend(text for _, text in context)
            if context:
                episode.meta["context_message_ids"] = [mid for mid, _ in context]
            used = {mid: text for mid, text in context if mid in cached}
            if used:
                self._from_cache[(message.tenant, message.chat_id, message.message_id)] = used
                while len(self._from_cache) > CHATS_KEPT:
                    self._from_cache.popitem(last=False)
        episode.context_text = "\n".join(parts) or None
        self._remember(message, own)
        if shared_by_processes(memory.store):
            key = (message.tenant, message.chat_id)
            kept = {mid for _, mid, _ in self._recent[key]}
            self._unwritten[key] = (self._unwritten.get(key, set()) | {message.message_id}) & kept

    @hookimpl
    def narrmem_forgotten_elsewhere(self, tenant: str | None, chat_id: str | None) -> None:
        """Another worker's forget: the texts the answer model read, and the cached turns of the
        chat (of every chat of the tenant, for a person's: which chats they spoke in is not told)."""
        forget_cached_texts()
        for key in list(self._recent):
            if tenant is None or (key[0] == tenant and chat_id in (None, key[1])):
                del self._recent[key]
                self._unwritten.pop(key, None)

    @hookimpl
    def narrmem_after_delete(self, tenant: str, removed: list[MemoryRecord]) -> None:
        """A memory deleted by id: the answer model's cache of texts read may hold its text, and
        the cached turns of its chat (the next message's keyword context would take its words
        from them; read from the store, they are gone)."""
        forget_cached_texts()
        for record in removed:
            self._recent.pop((tenant, record.chat_id), None)
            self._unwritten.pop((tenant, record.chat_id), None)

    @hookimpl
    async def narrmem_after_forget(
        self,
        memory: MemoryView,
        tenant: str,
        sources: dict[str, list[str]],
        removed: list[MemoryRecord],
    ) -> None:
        """Scrub forgotten turns from the keyword context of the turns around them: other
        speakers' rows in a group chat held those words too. Only the turns within the context
        window of a forgotten one are read (a forget of a person in a busy channel read the whole
        channel's history into memory). The answer model's cache of texts read goes too."""
        forget_cached_texts()
        window = await self._windows(memory)
        said_at = {
            (r.chat_id, mid): r.created_at for r in removed if r.kind == "episode" for mid in r.message_ids
        }
        for chat_id, message_ids in sources.items():
            self._recent.pop((tenant, chat_id), None)
            self._unwritten.pop((tenant, chat_id), None)
            chat = Scope(tenant=tenant, chat_id=chat_id)
            timed = {mid: said_at[(chat_id, mid)] for mid in message_ids if (chat_id, mid) in said_at}
            timed |= await _episode_times(memory, chat, set(message_ids) - set(timed))
            found: dict[int | None, MemoryRecord] = {}
            for since, until, gone in _spans(timed, window):
                for record in await self._holding_words_of(memory, chat, gone, since, until):
                    found[record.id] = record
            # Messages with no episode, gone or stored (a forget finished after a crash, or at an
            # open): the whole chat, read a page at a time (never all of it at once).
            untimed = set(message_ids) - set(timed)
            if len(untimed) > LOOKUPS_PER_FORGET:
                async for page in _chat_pages(memory, chat):
                    for record in page:
                        if untimed & set(record.meta.get("context_message_ids", [])):
                            found[record.id] = record
            elif untimed:
                for record in await self._holding_words_of(memory, chat, untimed, None, None):
                    found[record.id] = record
            for record in found.values():
                await memory.store.update(self._without_context(record))

    @hookimpl
    async def narrmem_person_records(
        self, memory: MemoryView, tenant: str, user_id: str
    ) -> dict[str, list[dict[str, Any]]] | None:
        """Where the person's words are kept as keyword context of others' turns around them in
        their chats (what their forget scrubs): each such memory's id and chat, and the person's
        messages whose words it holds (the words themselves are the person's own episodes')."""
        said: dict[str, set[str]] = {}
        async for page in scope_pages(memory.store, Scope(tenant=tenant, user_id=user_id), kinds=["episode"]):
            for record in page:
                said.setdefault(record.chat_id, set()).update(record.message_ids)
        copies: list[dict[str, Any]] = []
        for chat_id, theirs in sorted(said.items()):
            # Each of their chats read once, a page at a time (a forget reads only the turns
            # around each message, which for a heavy person read a chat many times over).
            holding: list[dict[str, Any]] = []
            async for page in _chat_pages(memory, Scope(tenant=tenant, chat_id=chat_id)):
                for record in page:
                    held = theirs.intersection(record.meta.get("context_message_ids", []))
                    if held and record.id is not None and record.user_id != user_id:
                        holding.append(
                            {"memory_id": record.id, "chat_id": chat_id, "message_ids": sorted(held)}
                        )
            copies += sorted(holding, key=lambda copy: copy["memory_id"])
        return {f"{NAME}.context": copies} if copies else None

    async def _holding_words_of(
        self,
        memory: MemoryView,
        chat: Scope,
        gone: set[str],
        since: datetime | None,
        until: datetime | None,
    ) -> list[MemoryRecord]:
        """The chat's episodes written from ``since`` to ``until`` whose keyword context holds
        words of the messages ``gone``. A few are looked up by id, the store filtering the rows'
        meta; more, the span's episodes are read once."""
        store = memory.store
        if len(gone) > LOOKUPS_PER_FORGET:
            every = await _between(store, chat, since, until, kinds=["episode"], limit=2**62)
            return [r for r in every if gone & set(r.meta.get("context_message_ids", []))]
        found: dict[int | None, MemoryRecord] = {}
        for message_id in sorted(gone):
            held = ("context_message_ids", message_id)
            for record in await _between(
                store, chat, since, until, kinds=["episode"], limit=2**62, meta_has=held
            ):
                found[record.id] = record
        return list(found.values())

    async def _windows(self, memory: MemoryView) -> Callable[[datetime], timedelta]:
        """The context window (either side) of a turn said at a given time: the widest this
        store's turns were written with since it was first recorded (:meth:`_record_window`),
        or this process's if wider; before then, the widest the setting allows (a store of an
        earlier version says nothing of the windows it was written with)."""
        known = _recorded(await memory.store.state_get(*WIDEST_WINDOW))
        widest = timedelta(minutes=max(known[0] if known else 0.0, self.options.context_minutes))
        recorded_since = known[1] if known else None
        unknown = timedelta(minutes=WIDEST_ALLOWED)

        def window(said_at: datetime) -> timedelta:
            return widest if recorded_since is not None and said_at >= recorded_since else unknown

        return window

    async def _record_window(self, memory: MemoryView) -> None:
        """Note this process's context window in the store if it is the widest yet (once a
        process, with its first message written), and from when on the record holds."""
        for _ in range(5):  # other workers may record theirs at once
            stored = await memory.store.state_get(*WIDEST_WINDOW)
            known = _recorded(stored)
            if known is not None and known[0] >= self.options.context_minutes:
                break
            # Turns written before now by an earlier version may be dated a little ahead.
            since = known[1] if known else memory.clock.now() + timedelta(days=1)
            # A record without its time (an earlier version's) keeps its width all the same.
            earlier = stored.get("minutes") if stored is not None else None
            minutes = max(self.options.context_minutes, earlier if isinstance(earlier, int | float) else 0)
            value = {"minutes": minutes, "since": since.isoformat()}
            if await memory.store.state_put_if(*WIDEST_WINDOW, value, stored):
                break
        else:
            return  # tried again with the next message
        self._window_recorded = True

    @hookimpl
    def narrmem_context_lines(self, records: list[MemoryRecord]) -> list[ContextLine] | None:
        """This message's words for the keyword context of the turns before it
        (``replies_in_context``), written with it; its id beside them (``context_message_ids``)
        is what a forget of it scrubs them by, as for earlier turns."""
        if not records or not self.options.replies_in_context:
            return None
        earlier = list(records[0].meta.get("context_message_ids", []))
        return [ContextLine(message_ids=earlier, text=records[0].index_text)] if earlier else None

    @hookimpl
    async def narrmem_after_store(
        self, memory: MemoryView, message: Message, records: list[MemoryRecord]
    ) -> None:
        """On a store several processes share, another worker may forget a turn after this
        message's context was read and before it was written, too late for that worker's scrub to
        see it: a context turn that is gone by now is scrubbed here."""
        if not self._window_recorded and self.options.context_turns:
            await self._record_window(memory)
        if not shared_by_processes(memory.store):
            return
        self._unwritten.get((message.tenant, message.chat_id), set()).discard(message.message_id)
        cached = self._from_cache.pop((message.tenant, message.chat_id, message.message_id), {})
        episode = records[0] if records else None
        context = [] if episode is None else list(episode.meta.get("context_message_ids", []))
        if episode is not None and episode.id is not None and context:
            stored = await memory.store.stored_message_ids(message.tenant, message.chat_id, context)
            if set(context) - stored or (cached and not await self._stored_as(memory, message, cached)):
                self._recent.pop((message.tenant, message.chat_id), None)
                await memory.store.update(self._without_context(episode))

    async def _stored_as(self, memory: MemoryView, message: Message, cached: dict[str, str]) -> bool:
        """Whether the turns taken from this process's cache are stored with the words it held: a
        turn this process never wrote (a forget took it on its way: an edit in another worker)
        may be stored by another worker in other words."""
        chat = Scope(tenant=message.tenant, chat_id=message.chat_id)
        ids = await memory.store.from_messages(message.tenant, message.chat_id, sorted(cached))
        texts = {
            r.message_ids[0]: r.index_text
            for r in (await memory.store.get(ids, chat)).values()
            if r.kind == "episode" and r.message_ids
        }
        return all(texts.get(mid) == text for mid, text in cached.items())

    def _without_context(self, record: MemoryRecord) -> MemoryRecord:
        """``record`` with its earlier turns taken out of its keyword context (the date stays)."""
        record.meta = {k: v for k, v in record.meta.items() if k != "context_message_ids"}
        first = (record.context_text or "").split("\n")[0]
        record.context_text = first if DATE_LINE.fullmatch(first) else None
        return record

    async def _context(self, memory: MemoryView, message: Message) -> tuple[list[tuple[str, str]], set[str]]:
        """The earlier turns for ``message``'s keyword context, and (on a shared store) the ids of
        those taken from this process's cache rather than the store."""
        key = (message.tenant, message.chat_id)
        turns = self._recent.get(key)
        cached: set[str] = set()
        if shared_by_processes(memory.store):
            unwritten = self._unwritten.get(key, set())
            turns = [turn for turn in turns or [] if turn[1] in unwritten]
        if turns is None or shared_by_processes(memory.store):
            recent = await memory.store.recent(
                Scope(tenant=message.tenant, chat_id=message.chat_id),
                kinds=["episode"],
                limit=self.options.context_turns,
            )
            stored = [
                (r.created_at, r.message_ids[0], r.index_text) for r in reversed(recent) if r.message_ids
            ]
            # Stored turns (any worker's) and this process's turns not written yet, once each:
            # the stored words win (another worker's edit stored new words under the id).
            merged = {mid: (ts, mid, text) for ts, mid, text in [*(turns or []), *stored]}
            cached = {mid for _, mid, _ in turns or []} - {mid for _, mid, _ in stored}
            turns = sorted(merged.values(), key=lambda turn: turn[0])
        oldest = message.ts - timedelta(minutes=self.options.context_minutes)
        earlier = [(mid, text) for ts, mid, text in turns if oldest <= ts <= message.ts]
        return earlier[-self.options.context_turns :], cached

    def _remember(self, message: Message, text: str) -> None:
        key = (message.tenant, message.chat_id)
        turns = self._recent.pop(key, [])
        turns.append((message.ts, message.message_id, text))
        self._recent[key] = turns[-max(1, self.options.context_turns) :]
        while len(self._recent) > CHATS_KEPT:
            evicted, _ = self._recent.popitem(last=False)
            self._unwritten.pop(evicted, None)

    @hookimpl
    async def narrmem_recall_prefetch(self, memory: MemoryView, request: RecallRequest) -> list[Candidate]:
        """Keyword candidates: they need no query vector, so they are searched while it is embedded."""
        store = memory.store
        hits = await store.search_keywords(
            request.scope,
            request.query,
            max(self.options.candidates, request.k),
            context_weight=self.options.context_weight,
            kinds=request.kinds,
        )
        return _candidates("keyword", hits)

    @hookimpl
    async def narrmem_recall_candidates(
        self, memory: MemoryView, request: RecallRequest, query_vector: np.ndarray
    ) -> list[Candidate]:
        store = memory.store
        n = max(self.options.candidates, request.k)
        return _candidates(
            "vector", await store.search_vectors(request.scope, query_vector, n, kinds=request.kinds)
        )

    @hookimpl
    def narrmem_rank(
        self, candidates: list[Candidate], records: dict[int, MemoryRecord]
    ) -> list[tuple[int, float]]:
        weights = self.options.fusion_weights(self.recall_weights)
        fused = reciprocal_rank_fusion(candidates, k=self.options.rrf_k, weights=weights, normalize=True)
        if not self.options.rank_answers:
            return fused
        return answer_scores(fused, candidates, records, self.options.answer, self.options.rrf_k, weights)


async def _between(
    store: Store, chat: Scope, since: datetime | None, until: datetime | None, **options: Any
) -> list[MemoryRecord]:
    """``store.recent`` from ``since`` to ``until``; a store written before ``until`` was part of
    the protocol is read from ``since`` on, and the rows after ``until`` are left out here."""
    try:
        return await store.recent(chat, since=since, until=until, **options)
    except TypeError:
        rows = await store.recent(chat, since=since, **options)
        return [r for r in rows if until is None or r.created_at <= until]


def _recorded(stored: dict[str, Any] | None) -> tuple[float, datetime] | None:
    """The widest window recorded and since when, from the state entry (``None``: none)."""
    if stored is None or not isinstance(stored.get("minutes"), int | float):
        return None
    try:
        since = datetime.fromisoformat(str(stored.get("since")))
    except ValueError:
        return None
    return (float(stored["minutes"]), since) if since.tzinfo is not None else None


def _chat_pages(memory: MemoryView, chat: Scope) -> AsyncIterator[list[MemoryRecord]]:
    """The chat's episodes, newest first, a page at a time."""
    return scope_pages(memory.store, chat, kinds=["episode"], page=CHAT_PAGE)


async def _episode_times(memory: MemoryView, chat: Scope, messages: set[str]) -> dict[str, datetime]:
    """When each of ``messages`` that still has an episode in ``chat`` was said (another
    speaker's turn that a forgotten scene cited, say)."""
    if not messages:
        return {}
    assert chat.chat_id is not None
    ids = await memory.store.from_messages(chat.tenant, chat.chat_id, sorted(messages))
    records = await memory.store.get(ids, chat) if ids else {}
    return {
        mid: r.created_at
        for r in records.values()
        if r.kind == "episode"
        for mid in r.message_ids
        if mid in messages
    }


def _spans(
    said_at: Mapping[str, datetime], window_of: Callable[[datetime], timedelta]
) -> list[tuple[datetime, datetime, set[str]]]:
    """The times around each message (its window either side: the turns whose context it was in,
    after it, and with ``replies_in_context`` before it), overlapping ones merged up to
    :data:`LONGEST_SPAN`, with the messages each covers."""
    spans: list[tuple[datetime, datetime, set[str]]] = []
    for mid, at in sorted(said_at.items(), key=lambda item: item[1]):
        window = window_of(at)
        since, until = at - window, at + window
        # Merged up to a day long: a person who wrote every hour for months would make one span
        # of the whole channel, all read at once.
        if spans and since <= spans[-1][1] and until - spans[-1][0] <= LONGEST_SPAN + 2 * window:
            first, last, gone = spans[-1]
            spans[-1] = (first, max(until, last), gone | {mid})
        else:
            spans.append((since, until, {mid}))
    return spans


def _date_line(ts: datetime) -> str:
    """The first line of a message's keyword context: its weekday and date (``DATE_LINE``)."""
    return ts.strftime("%A %-d %B %Y")


# A turn's line is never one: it is attributed ('Ann said, "…"').
DATE_LINE = re.compile(r"[A-Z][a-z]+day \d{1,2} [A-Z][a-z]+ \d{4}")


def _candidates(source: str, hits: list[tuple[int, float]]) -> list[Candidate]:
    return [
        Candidate(memory_id=mid, source=source, rank=rank, score=score)
        for rank, (mid, score) in enumerate(hits)
    ]
