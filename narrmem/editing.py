"""An edited message: what the old text left is forgotten and the new text is ingested in its
place, with the earlier texts kept in the new episode's ``meta["edits"]``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from narrmem import logs
from narrmem.ingest import as_message, check_not_ahead
from narrmem.models import MAX_META_BYTES, IngestResult, MemoryRecord, Message, Scope, edit_time_or_none

if TYPE_CHECKING:
    from narrmem.config import Acknowledge
    from narrmem.edit_marks import EditMarks
    from narrmem.fence import Fence
    from narrmem.in_flight import Call, CallsUnderWay
    from narrmem.memory import Memory
    from narrmem.to_the_end import Outlasting

log = logs.logger("narrmem")


class ForgetsMessages(Protocol):
    async def __call__(
        self,
        scope: Scope,
        message_ids: Sequence[str],
        *,
        sparing: Call | None = None,
        carrying: int | None = None,
        edit_mark: str | None = None,
    ) -> dict[str, int]: ...


class Ingests(Protocol):
    async def __call__(
        self,
        messages: Sequence[Message | dict[str, Any]],
        progress: Callable[[int], None] | None,
        acknowledge: Acknowledge | None = None,
        *,
        call: Call | None = None,
        held: int | None = None,
    ) -> list[IngestResult]: ...


class OneEditAtATime:
    """The edits of one message in this process, one after another, in the order they came. Two
    at once each forgot the old text, and each one's forget dropped the other's new text on its
    way to the store: both answered "forgotten meanwhile" and the message was lost. (Workers of
    a shared store are kept apart by the fence between them and the edits' marks.)"""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, message: Message) -> AsyncIterator[None]:
        key = (message.tenant, message.chat_id, message.message_id)
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:  # first come, first served
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]  # bounded by the edits under way
            else:
                self._locks[key] = (lock, users - 1)


@dataclass(frozen=True)
class EditSteps:
    """What an edit uses of its memory beyond the public calls."""

    calls: CallsUnderWay
    fence: Fence
    marks: EditMarks
    forget_messages: ForgetsMessages
    ingest: Ingests
    one_at_a_time: OneEditAtATime
    outlasting: Outlasting


async def edit(memory: Memory, message: Message | dict[str, Any], steps: EditSteps) -> IngestResult:
    edited = as_message(message, None)
    # One piece of work that outlives a caller giving up (a timeout around the edit): cancelled
    # between the two steps, the edit left neither text. settle() waits for it.
    return await steps.outlasting.run(_edit(memory, edited, steps))


async def _edit(memory: Memory, edited: Message, steps: EditSteps) -> IngestResult:
    # Before the fence's hold is reserved: a forget of an edit holding the message would wait
    # for a hold reserved by an edit waiting for the message.
    async with steps.one_at_a_time.of(edited):
        return await _edit_alone(memory, edited, steps)


async def _edit_alone(memory: Memory, edited: Message, steps: EditSteps) -> IngestResult:
    # The new text is a message under way from the edit's start (narrmem.in_flight): a forget of
    # its person or chat that begins before it is written drops it. Registered only once the
    # edit's own forget of the old text had ended, it was written after a forget of the person
    # that began meanwhile, and outlived it. On a store shared by processes, its hold of the fence
    # between them is taken up as the edit's forget hands the fence over: another worker's forget
    # that came meanwhile waits for it (before, it did not, and the new text outlived it too).
    # Another worker's forget that comes before the edit's own forget holds the gate (and so
    # before that hold) deletes the edit's mark: narrmem.edit_marks.
    held = steps.fence.reserve()
    try:
        with steps.calls.under_way([edited]) as call:
            mark = await steps.marks.mark(edited)
            keep = False
            try:
                return await _replace(memory, edited, call, held, mark, steps)
            except Exception:
                # Failed once its forget had begun (the new text's write found the store away):
                # the old text may be gone, and the mark holds the only copy of the new one. It
                # stays, and the next open makes the edit again from it; deleted, neither text was
                # left.
                keep = mark is not None and await steps.marks.forget_begun(mark)
                if keep:
                    log.warning(
                        "an edit failed after its old text went; its new text is kept for the next open"
                    )
                raise
            finally:
                if mark is not None and not keep:
                    await steps.marks.unmark(mark)
    finally:
        steps.fence.let_go(held)  # unless the new text's write took it over


async def _replace(
    memory: Memory, edited: Message, call: Call, held: int | None, mark: str | None, steps: EditSteps
) -> IngestResult:
    scope = Scope(tenant=edited.tenant, chat_id=edited.chat_id)
    # Whether the old text is stored as the edit begins: if it is gone by the time the edit's
    # forget begins, something forgot it meanwhile (see below).
    stored_at_start = bool(await _episodes(memory, edited, scope))
    # The message may still be on its way to the store (acknowledged on receipt).
    await memory.written(tenant=edited.tenant, chat_id=edited.chat_id)
    before = await _episodes(memory, edited, scope)
    if not before and await memory.forgotten_after(edited, edited.ts, itself=False):
        # Nothing of it is stored because its person or chat was forgotten since it was said: the
        # edit (a platform's update of an old message, a pin, a link preview taken off) would
        # store the forgotten words again, as new. (The message's own forget is not asked: a
        # caption taken off and later written anew is new words, and a deleted message has none.)
        return _forgotten_since(edited)
    if before and all(r.text == edited.text for r in before):
        # Not an edit: platforms send updates that keep the text (a pin, a link preview). Taken
        # as one, it dropped the memory's reinforcement and history for a copy of itself.
        return _unchanged(edited, before, "the stored text is the same: nothing was edited")
    latest = memory.clock.now() + timedelta(seconds=memory.settings.storage.max_ts_ahead_s)
    stale = _older_edit(edited, before, latest)
    if stale is not None:
        return stale
    edits = [e for r in before for e in _earlier_edits(r)]
    edits += [{"text": r.text, "replaced_at": memory.clock.now().isoformat()} for r in before]
    kept = kept_edits(edited.meta, edits)
    meta = {**edited.meta, "edits": kept} if kept else edited.meta
    # Checked before the old message is forgotten: the earlier texts can take meta past its limit,
    # a date too far ahead is refused by ingest, and a refused edit must leave the old message as
    # it was (a date a day ahead forgot the old text and stored no new one).
    replacement = as_message(edited.model_copy(update={"meta": meta}), None)
    check_not_ahead([replacement], memory.clock.now(), memory.settings.storage.max_ts_ahead_s)
    # Kept with the mark before the old text goes: a process killed between the two steps lost
    # both texts; the next open makes the edit again from it.
    if mark is not None and not await steps.marks.keep(mark, replacement):
        return _forgotten_meanwhile(edited)
    counts = await steps.forget_messages(
        scope, [edited.message_id], sparing=call, carrying=held, edit_mark=mark
    )
    # From here the edit holds the fence between processes (its forget handed it over): no other
    # worker's forget comes between this check and the new text's write.
    gone = (stored_at_start or before) and not counts.get("memories")
    if gone or (mark is not None and not await steps.marks.still_marked(mark)):
        # What the edit read was gone by the time its forget began, or its mark was: a delete of
        # the message or a forget of its chat or person came in between, in this worker or
        # another (whose forget this edit could not hold back: it waited for it at the gate).
        # The new text goes with it.
        return _forgotten_meanwhile(edited)
    [result] = await steps.ingest([replacement], None, call=call, held=held)
    return result


def _older_edit(edited: Message, before: list[MemoryRecord], latest: datetime) -> IngestResult | None:
    """The answer to an edit older than the one stored, by ``meta.edited_at`` (the integrations
    set it; an HTTP client may): a retry of an earlier edit that arrives after a later one would
    replace the newer text with the older. ``None``: ``edited`` is newer, or either is undated. A
    stored date past ``latest`` (the clock's now and the time ahead taken) is none: stored before
    such dates were refused, it would refuse every edit after it."""
    sent = _edited_at(edited.meta)
    stored = [t for r in before if (t := _edited_at(r.meta)) is not None and t <= latest]
    if sent is None or not stored or sent >= max(stored):
        return None
    return _unchanged(
        edited, before, "an older edit than the one stored (meta.edited_at): nothing was changed"
    )


def _unchanged(edited: Message, before: list[MemoryRecord], reason: str) -> IngestResult:
    """The answer to an edit that changes nothing: a duplicate, naming the stored memories."""
    return IngestResult(
        message_id=edited.message_id,
        layer="accumulate",
        stored=False,
        duplicate=True,
        reason=reason,
        memory_ids=sorted(r.id for r in before if r.id is not None),
    )


def _edited_at(meta: dict[str, Any]) -> datetime | None:
    # A stored memory's meta may predate the check a message's meta now gets (as_message).
    return edit_time_or_none(meta)


def _forgotten_since(edited: Message) -> IngestResult:
    return IngestResult(
        message_id=edited.message_id,
        layer="accumulate",
        stored=False,
        reason="forgotten since it was said: its chat or its user was forgotten after it",
    )


def _forgotten_meanwhile(edited: Message) -> IngestResult:
    return IngestResult(
        message_id=edited.message_id,
        layer="accumulate",
        stored=False,
        reason="forgotten before it was written: the message, its chat or its user was "
        "forgotten while it was being edited",
    )


async def _episodes(memory: Memory, message: Message, scope: Scope) -> list[MemoryRecord]:
    """The episodes stored for ``message``'s id in its chat."""
    ids = await memory.store.from_messages(message.tenant, message.chat_id, [message.message_id])
    return [r for r in (await memory.store.get(ids, scope)).values() if r.kind == "episode"]


# The earlier texts an episode keeps: the latest, at most this many, within half of what meta
# may hold. All of them were kept: a status message edited every day took its meta past its limit
# within weeks (a 1,900-character text at its 33rd edit), and from then on every edit of it was
# refused, the memory left on an old text.
EDITS_KEPT = 20
EDITS_BYTES = MAX_META_BYTES // 2


def kept_edits(meta: dict[str, Any], edits: list[Any]) -> list[Any]:
    """The latest of ``edits`` (oldest first) that an episode whose meta is otherwise ``meta``
    keeps: at most :data:`EDITS_KEPT`, within :data:`EDITS_BYTES` and what ``meta`` leaves of
    :data:`~narrmem.models.MAX_META_BYTES`; the newest, cut to fit if it must be, as long as
    there is room for a start of it (none when ``meta`` itself is near its limit)."""
    # The bytes the list may take as JSON, its brackets included ("edits": [] is counted in meta).
    limit = min(EDITS_BYTES, MAX_META_BYTES - _json_bytes({**meta, "edits": []}) + 2)
    kept: list[Any] = []
    used = 2
    for edit in reversed(edits[-EDITS_KEPT:]):
        # json.dumps writes ", " between items: 2 bytes more for each but the first.
        size = _json_bytes(edit) + (2 if kept else 0)
        if used + size <= limit:
            kept.append(edit)
            used += size
            continue
        if not kept and isinstance(edit, dict) and isinstance(edit.get("text"), str):
            cut = _cut(edit, limit - 2)
            if _json_bytes([cut]) <= limit:
                kept.append(cut)
        break
    kept.reverse()
    return kept


def _cut(edit: dict[str, Any], budget: int) -> dict[str, Any]:
    """The edit with its text's longest start that fits ``budget`` bytes as JSON, marked cut."""
    text = edit["text"]
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if _json_bytes({**edit, "text": text[:middle], "cut": True}) <= budget:
            low = middle
        else:
            high = middle - 1
    return {**edit, "text": text[:low], "cut": True}


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _earlier_edits(record: MemoryRecord) -> list[Any]:
    """The texts an episode replaced; a caller's own ``meta["edits"]`` of another shape is not ours."""
    edits = record.meta.get("edits", [])
    return edits if isinstance(edits, list) else []
