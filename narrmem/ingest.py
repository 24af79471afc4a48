"""The ingest pipeline: validate → triage → dedupe → records → embed → write → after-store →
triggers, for a batch of messages at a time.

Every message is validated before anything is written. Ignored messages stop after triage (no
embedding, no I/O). The model gets the kept messages' texts in groups while the rest of the batch
is triaged and the before-store hooks run; the records are written in groups as their vectors
arrive (one transaction each), so the store writes one group while the model embeds the next.
Then the after-store hooks (counters, facts, triggers) run in a task that overlaps the next
batch's embedding, so in bulk the model never waits for them. A batch is triaged only once the
batches before it are written (what triage and the hooks read of the store includes them).

A failure part-way (the model, the store) leaves the groups written before it whole, with their
after-store hooks run, and nothing of the rest; ingesting the same messages again stores the rest
(message ids make it idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from narrmem.errors import InputError
from narrmem.models import MAX_ID_CHARS, IngestResult, MemoryRecord, Message, TriageDecision, TriggerEvent
from narrmem.text import cjk_count

if TYPE_CHECKING:
    from narrmem.embed import Embedder
    from narrmem.lifecycle import MemoryLifecycle

log = logging.getLogger("narrmem")

TriggerCallback = Callable[[TriggerEvent], Awaitable[None]]
FALLBACK_DECISION = TriageDecision(layer="accumulate", reason="no triage plugin answered")
# Where bot libraries and chat exports put a person's display name in ``meta``.
DISPLAY_NAME_KEYS = ("display_name", "name", "username", "first_name")
MessageKey = tuple[str, str, str]  # (tenant, chat_id, message_id): a message's identity
# Texts sent to the model at a time during a batch's triage (more than the model thread's short
# lane holds, so an import's texts never go ahead of a query), and episodes written at a time.
EMBED_GROUP = 16
WRITE_GROUP = 32


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
    # The episode's embed_text as ingest wrote it, and what its vector is made of instead (the
    # decision's gist, attributed): a hook that rewrites the embed_text gets its own text embedded.
    written_embed_text: str | None = None
    gist_text: str | None = None

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


class _TextStream:
    """The texts of a batch on their way to the model, in groups: a group goes as soon as it is
    full, so the model works while the loop triages the rest; each text is embedded once."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.vectors: dict[str, np.ndarray] = {}
        self._waiting: list[str] = []
        self._sent: set[str] = set()
        self._groups: list[tuple[list[str], asyncio.Future[np.ndarray]]] = []

    def add(self, text: str) -> None:
        if text in self._sent:
            return
        self._sent.add(text)
        self._waiting.append(text)
        if len(self._waiting) >= EMBED_GROUP:
            self.flush()

    def flush(self) -> None:
        if self._waiting:
            group, self._waiting = self._waiting, []
            self._groups.append((group, asyncio.ensure_future(self.embedder.embed(group))))

    @property
    def done(self) -> bool:
        return not self._groups and not self._waiting

    async def next_group(self) -> None:
        """Wait for the oldest group sent and keep its vectors."""
        if self._groups:
            group, future = self._groups.pop(0)
            self.vectors.update(zip(group, await future, strict=True))

    def has_all(self, item: Pending) -> bool:
        return all(item.vector_text(r) in self.vectors for r in item.records)

    def vector(self, text: str) -> np.ndarray:
        return self.vectors[text]

    def cancel(self) -> None:
        for _, future in self._groups:
            future.cancel()


class IngestPipeline:
    def __init__(
        self, memory: MemoryLifecycle, write_lock: asyncio.Lock, callbacks: list[TriggerCallback]
    ) -> None:
        self.memory = memory
        self.write_lock = write_lock
        self.callbacks = callbacks

    async def run(
        self, messages: Sequence[Message | dict[str, Any]], progress: Callable[[int], None] | None
    ) -> list[IngestResult]:
        validated = [as_message(m, index=i if len(messages) > 1 else None) for i, m in enumerate(messages)]
        # A batch's results are filled in by its after-store task, which may still run while the
        # next batch embeds: the lists are read only once every task is done.
        batches: list[list[IngestResult]] = []
        batch_size = self.memory.settings.storage.batch_size
        finishing: asyncio.Future[None] | None = None
        try:
            for start in range(0, len(validated), batch_size):
                chunk = validated[start : start + batch_size]
                batch, finishing = await self._batch(chunk, finishing)
                batches.append(batch)
                if progress is not None:
                    progress(len(chunk))
        finally:
            if finishing is not None:
                await finishing
        return [result for batch in batches for result in batch]

    async def _batch(
        self, messages: list[Message], previous: asyncio.Future[None] | None
    ) -> tuple[list[IngestResult], asyncio.Future[None] | None]:
        """Triage, embed and write one batch; return its results (filled in by the after-store
        task for kept messages) and that task. ``previous`` is the last batch's."""
        results = [IngestResult(message_id=m.message_id, layer="accumulate", stored=False) for m in messages]
        # The duplicate check reads the store while triage runs; triage never writes messages.
        checking = asyncio.ensure_future(self._already_stored(messages))
        texts = _TextStream(self.memory.embedder)
        kept: list[Pending] = []
        written: list[Pending] = []
        try:
            stored: set[MessageKey] | None = None
            seen: set[MessageKey] = set()
            for i, message in enumerate(messages):
                errors: list[str] = []
                item = Pending(i, message, await self.triage(message, errors), errors)
                await yield_every(i)
                if item.decision.layer == "ignore":
                    results[i] = ignored(item)
                    continue
                if stored is None:
                    stored = await checking
                if item.key in seen or item.key in stored:
                    results[i] = duplicate(item.message, item.decision)
                    continue
                seen.add(item.key)
                self._prepare(item)
                kept.append(item)
                # The model starts on the first texts while the rest of the batch is triaged.
                texts.add(item.vector_text(item.records[0]))
            texts.flush()
            await asyncio.sleep(0)  # hand the last texts to the model before the hooks hold the loop
            if not kept:
                if previous is not None:
                    await previous
                return results, None
            for n, item in enumerate(kept):
                await yield_every(n)
                await self.memory.host.call("narrmem_before_store", **item.hook_arguments(self.memory))
            # A hook may add records (a scene) or change what an episode embeds: those texts are
            # embedded now, so every record gets the vector of its own text.
            for item in kept:
                for record in item.records:
                    texts.add(item.vector_text(record))
            texts.flush()
            if previous is not None:
                await previous
            # Written in groups as their vectors arrive: the store writes one while the model
            # embeds the next, and only the last group's write is left when the model is done.
            ready = 0
            while ready < len(kept):
                await texts.next_group()
                end = ready
                while end < len(kept) and texts.has_all(kept[end]):
                    end += 1
                if end == ready and texts.done:
                    raise RuntimeError(f"no vector for a record of message {kept[end].message.message_id!r}")
                if end - ready >= WRITE_GROUP or (end > ready and texts.done):
                    group = kept[ready:end]
                    for item in group:
                        item.vectors = np.vstack([texts.vector(item.vector_text(r)) for r in item.records])
                    written.extend(await self._write(group, results))
                    ready = end
        except BaseException:
            texts.cancel()
            if written:
                # What is written is kept whole: its after-store hooks (counters, facts) run.
                await self._after_store(written, results)
            raise
        finally:
            if not checking.done():
                checking.cancel()
        return results, asyncio.ensure_future(self._after_store(written, results))

    def _prepare(self, item: Pending) -> None:
        """The episode a kept message leaves, and the text its vector is made of."""
        episode = self.episode(item.message, item.decision)
        item.records = [episode]
        item.written_embed_text = episode.embed_text
        if item.decision.gist is not None:
            item.gist_text = attributed(item.message, item.decision.gist)

    async def _write(self, items: list[Pending], results: list[IngestResult]) -> list[Pending]:
        async with self.write_lock:
            vectors = np.vstack([item.vectors for item in items if item.vectors is not None])
            await self.memory.store.add([r for item in items for r in item.records], vectors)
        # Another ingest (of this process or another sharing the store) may have stored a message
        # since the check before embedding: the store skipped its episode and what came with it
        # (the episode's id stays None; its own unique check decides), so it is a duplicate here.
        for item in items:
            if item.records[0].id is None:
                results[item.index] = duplicate(item.message, item.decision)
        return [item for item in items if item.records[0].id is not None]

    async def _after_store(self, items: list[Pending], results: list[IngestResult]) -> None:
        for n, item in enumerate(items):
            await yield_every(n)
            result = IngestResult(
                message_id=item.message.message_id,
                layer=item.decision.layer,
                stored=True,
                reason=item.decision.reason,
                type=item.decision.type,
                memory_ids=[r.id for r in item.records if r.id is not None],
                records=item.records,
                scene=next((r for r in item.records if r.kind == "scene"), None),
            )
            await self.memory.host.call(
                "narrmem_after_store", **item.hook_arguments(self.memory), vectors=item.vectors, result=result
            )
            result.notes.extend(item.errors)
            await self.deliver(result.triggers)
            results[item.index] = result

    async def triage(self, message: Message, errors: list[str]) -> TriageDecision:
        host = self.memory.host
        decision = await host.call_first("narrmem_triage", memory=self.memory, message=message, errors=errors)
        if decision is None:
            return FALLBACK_DECISION
        if not isinstance(decision, TriageDecision):
            log.error("triage returned %r, not a TriageDecision; keeping the message", decision)
            return FALLBACK_DECISION
        return decision

    async def _already_stored(self, messages: list[Message]) -> set[MessageKey]:
        by_chat: dict[tuple[str, str], list[str]] = {}
        for message in messages:
            by_chat.setdefault((message.tenant, message.chat_id), []).append(message.message_id)
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
        for event in events:
            await self.memory.host.call("narrmem_on_trigger", memory=self.memory, event=event)
            for callback in self.callbacks:
                try:
                    await callback(event)
                except Exception:
                    log.exception("trigger callback %r failed", callback)


def ignored(item: Pending) -> IngestResult:
    return IngestResult(
        message_id=item.message.message_id,
        layer="ignore",
        stored=False,
        reason=item.decision.reason,
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


def speaker_of(message: Message) -> str:
    """Who said it: ``speaker``, else a display name from ``meta``, else the user id. Recall needs
    the attribution (questions name people), so a message never goes without one."""
    if message.speaker:
        return message.speaker
    for key in DISPLAY_NAME_KEYS:
        value = message.meta.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_ID_CHARS]
    return message.user_id


def attributed(message: Message, text: str | None = None) -> str:
    """The message (or ``text``, a part of it) as reported speech ("Ann said, "…""): who said it
    is part of what it means, and questions name people ("what did Ann decide?")."""
    speaker = speaker_of(message)
    said = message.text if text is None else text
    if cjk_count(said) * 2 > len(said):
        return f"{speaker}说：“{said}”"
    return f'{speaker} said, "{said}"'


async def yield_every(n: int, every: int = 8) -> None:
    """Let the event loop run between messages of a batch: a hook whose awaits complete at once
    never suspends, and a batch of them would otherwise hold the loop for tens of milliseconds."""
    if n % every == every - 1:
        await asyncio.sleep(0)


def as_message(message: Message | dict[str, Any], index: int | None) -> Message:
    try:
        return Message.model_validate(message)
    except ValidationError as exc:
        prefix = f"messages[{index}]." if index is not None else ""
        raise InputError.from_pydantic(exc, prefix=prefix) from exc
