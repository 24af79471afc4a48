"""An edited message: what the old text left is forgotten and the new text is ingested in its
place, with the earlier texts kept in the new episode's ``meta["edits"]``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from narrmem.ingest import as_message, check_not_ahead
from narrmem.models import IngestResult, MemoryRecord, Message, Scope

if TYPE_CHECKING:
    from narrmem.memory import Memory


async def edit(memory: Memory, message: Message | dict[str, Any]) -> IngestResult:
    edited = as_message(message, None)
    # The message may still be on its way to the store (acknowledged on receipt).
    await memory.written(tenant=edited.tenant, chat_id=edited.chat_id)
    scope = Scope(tenant=edited.tenant, chat_id=edited.chat_id)
    ids = await memory.store.from_messages(edited.tenant, edited.chat_id, [edited.message_id])
    before = [r for r in (await memory.store.get(ids, scope)).values() if r.kind == "episode"]
    if before and all(r.text == edited.text for r in before):
        # Not an edit: platforms send updates that keep the text (a pin, a link preview). Taken
        # as one, it dropped the memory's reinforcement and history for a copy of itself.
        return IngestResult(
            message_id=edited.message_id,
            layer="accumulate",
            stored=False,
            duplicate=True,
            reason="the stored text is the same: nothing was edited",
            memory_ids=sorted(r.id for r in before if r.id is not None),
        )
    edits = [e for r in before for e in _earlier_edits(r)]
    edits += [{"text": r.text, "replaced_at": memory.clock.now().isoformat()} for r in before]
    meta = {**edited.meta, "edits": edits} if edits else edited.meta
    # Checked before the old message is forgotten: the earlier texts can take meta past its limit,
    # a date too far ahead is refused by ingest, and a refused edit must leave the old message as
    # it was (a date a day ahead forgot the old text and stored no new one).
    replacement = as_message(edited.model_copy(update={"meta": meta}), None)
    check_not_ahead([replacement], memory.clock.now(), memory.settings.storage.max_ts_ahead_s)
    # One piece of work that outlives a caller giving up (a timeout around the edit): cancelled
    # between the two steps, the edit left neither text.
    return await asyncio.shield(_replace(memory, edited, replacement))


async def _replace(memory: Memory, edited: Message, replacement: Message) -> IngestResult:
    await memory.forget_messages(
        chat_id=edited.chat_id, message_ids=[edited.message_id], tenant=edited.tenant
    )
    return await memory.ingest(replacement)


def _earlier_edits(record: MemoryRecord) -> list[Any]:
    """The texts an episode replaced; a caller's own ``meta["edits"]`` of another shape is not ours."""
    edits = record.meta.get("edits", [])
    return edits if isinstance(edits, list) else []
