"""Edits under way, where the other workers of a shared store can see them.

An edit's new text is a message under way from the edit's start (:mod:`narrmem.in_flight`), but
only in its own process; its hold of the fence between processes begins once its forget of the
old text holds the gate (:meth:`narrmem.fence.Fence.reserve`). Another worker's forget of the
person, the chat or the message that runs in between therefore neither waits for the new text nor
finds it. When the old text was already stored as the edit began, the edit learns of such a
forget from the old text being gone; when it was not (still on its way in a third worker), it
could not, and wrote the new text after the forget had returned.

So an edit puts a mark in the store as it begins (plugin state, namespace :data:`NAMESPACE`: the
ids that name the message), every forget deletes the marks of what it forgets (but an edit's
forget of the old text, which voids no edit: another edit of the same message under way replaces
the text too), and the edit, once it holds the fence, stores nothing if its mark is gone. A mark
is deleted as its edit ends.

Before the edit forgets the old text, its mark takes the new message too (:meth:`EditMarks.keep`):
a process killed between that forget and the new text's write lost both texts. The next open
makes the edits of a process that stopped in the middle of one again, from their marks (a forget
of the message, its chat or its person, finished first, has deleted the mark: nothing is made).

The edit's own forget of the old text may be the one a stopped process left unfinished, and the
next open finishes it before the edits are made again: finished as any forget of the message, it
deleted the mark that held the new text, and both texts were lost. So as that forget begins, the
mark notes the last forget job begun before it (:meth:`EditMarks.forgetting`), and once begun,
the forget's own job (:meth:`EditMarks.forgetting_job`): that job, or when the edit stopped before
naming it, the first job of the message recorded after the one noted (forgets of one message are
begun one at a time), is the edit's own, and is finished leaving the mark be
(:meth:`EditMarks.own_forget`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from narrmem import logs
from narrmem.errors import InputError
from narrmem.models import Message
from narrmem.settling import entry_message, forgotten_by, stopped_owners

if TYPE_CHECKING:
    from narrmem.lifecycle import MemoryLifecycle
    from narrmem.models import ForgetJob
    from narrmem.settling import Settling

log = logs.logger("narrmem")

NAMESPACE = "narrmem.edits"


MARK_IDS = ("tenant", "user_id", "chat_id", "message_id")
FORGETTING_AFTER = "forgetting_after"  # the last forget job begun before the edit's own
FORGETTING_JOB = "forgetting_job"  # the edit's own forget job, once begun


def check_entry(key: str, value: dict[str, Any]) -> None:
    """Refuse a mark (of an imported file) that this module would not read back."""
    if ":" not in key:
        raise InputError("is not a key of an edit's mark (token:id)", field="key")
    for name in MARK_IDS:
        if not isinstance(value.get(name), str) or not value[name]:
            raise InputError("must be the text of an id", field=f"value.{name}")
    extra = set(value) - {*MARK_IDS, "message", FORGETTING_AFTER, FORGETTING_JOB}
    if extra:
        raise InputError(f"an edit's mark holds no {sorted(extra)[0]!r}", field="value")
    for name in (FORGETTING_AFTER, FORGETTING_JOB):
        job = value.get(name)
        if name in value and (not isinstance(job, int) or isinstance(job, bool) or job < 0):
            raise InputError("must be a forget job's id (a whole number, 0 or more)", field=f"value.{name}")
    if "message" in value:
        kept = entry_message(value["message"])
        if [getattr(kept, name) for name in MARK_IDS] != [value[name] for name in MARK_IDS]:
            raise InputError("is not the message the mark names", field="value.message")


class EditMarks:
    def __init__(self, memory: MemoryLifecycle, settling: Settling) -> None:
        self.memory = memory
        # Marks carry the settling token, whose claim says whether their process is still there.
        self.settling = settling

    async def mark(self, message: Message) -> str:
        """Put the mark of an edit of ``message`` in the store; returns its key."""
        await self.settling.claim()
        key = f"{self.settling.token}:{uuid.uuid4().hex}"
        ids = {
            "tenant": message.tenant,
            "user_id": message.user_id,
            "chat_id": message.chat_id,
            "message_id": message.message_id,
        }
        await self.memory.store.state_put(NAMESPACE, key, ids)
        return key

    async def keep(self, key: str, replacement: Message) -> bool:
        """Add the new message to the mark ``key`` (the next open makes the edit again from it if
        this process stops first); ``False`` if a forget has deleted the mark already."""
        store = self.memory.store
        ids = await store.state_get(NAMESPACE, key)
        if ids is None:
            return False
        value = {**ids, "message": replacement.model_dump(mode="json")}
        return await store.state_put_if(NAMESPACE, key, value, ids)

    async def forgetting(self, key: str, last_job: int) -> None:
        """Note in the mark ``key`` that its edit's forget of the old text begins now, after the
        forget job ``last_job`` (the last one begun); a mark a forget deleted stays deleted."""
        store = self.memory.store
        value = await store.state_get(NAMESPACE, key)
        if value is not None:
            await store.state_put_if(NAMESPACE, key, {**value, FORGETTING_AFTER: last_job}, value)

    async def forgetting_job(self, key: str, job_id: int) -> None:
        """Note in the mark ``key`` the id of its edit's own forget job, once begun: the next open
        then knows that job by its id (a delete of the message recorded later by another worker,
        both processes stopped, was taken for the edit's own, and the edit was made again)."""
        store = self.memory.store
        value = await store.state_get(NAMESPACE, key)
        if value is not None:
            await store.state_put_if(NAMESPACE, key, {**value, FORGETTING_JOB: job_id}, value)

    async def own_forget(self, job: ForgetJob, pending: Sequence[ForgetJob]) -> bool:
        """Whether ``job`` (recorded, not finished) is an edit's own forget of its old text: the
        job its mark names, or, when the edit stopped before it could name it, the first job of
        that one message recorded after the last job its mark noted (``pending``: every job
        recorded and not finished)."""
        if job.messages is None or len(job.messages) != 1 or job.chat_id is None:
            return False
        for _, value in await self.memory.store.state_items(NAMESPACE):
            after = value.get(FORGETTING_AFTER)
            if not isinstance(after, int) or "message" not in value:
                continue
            if (value.get("tenant"), value.get("chat_id"), value.get("message_id")) != (
                job.tenant,
                job.chat_id,
                job.messages[0],
            ):
                continue
            named = value.get(FORGETTING_JOB)
            if isinstance(named, int):
                if named == job.id:
                    return True
                continue
            first = min(
                (
                    other.id
                    for other in pending
                    if other.id > after
                    and (other.tenant, other.chat_id, other.messages)
                    == (job.tenant, job.chat_id, job.messages)
                ),
                default=None,
            )
            if first == job.id:
                return True
        return False

    async def forget_begun(self, key: str) -> bool:
        """Whether the edit of mark ``key`` had begun to forget its old text (which may be gone);
        ``True`` when that cannot be read: the mark, which holds the new text, is then kept."""
        try:
            value = await self.memory.store.state_get(NAMESPACE, key)
        except Exception:
            return True
        return value is not None and FORGETTING_AFTER in value

    async def still_marked(self, key: str) -> bool:
        """Whether no forget has deleted the mark since it was put."""
        return await self.memory.store.state_get(NAMESPACE, key) is not None

    async def unmark(self, key: str) -> None:
        try:
            await self.memory.store.state_delete(NAMESPACE, key)
        except Exception:
            # The edit is done either way; the mark names no text, a forget of its scope deletes
            # it, and so does the next open once this process has stopped.
            log.exception("deleting the mark of an edit that ended failed; it is left in the store")

    async def drop(self, job: ForgetJob) -> None:
        """Delete the marks of the edits of what ``job`` forgets."""
        store = self.memory.store
        for key, value in await store.state_items(NAMESPACE):
            if forgotten_by(value, job):
                await store.state_delete(NAMESPACE, key)

    async def recover(self) -> list[Message]:
        """Delete the marks of processes that stopped in the middle of an edit; returns the new
        messages of those that had kept one, to be made again."""
        store = self.memory.store
        gone = 0
        again: list[Message] = []
        async for entries in stopped_owners(store, NAMESPACE, self.settling.token, self.settling.owners_gone):
            for key, value in entries:
                kept = value.get("message")
                if isinstance(kept, dict):
                    try:
                        again.append(Message.model_validate(kept))
                    except InputError:
                        log.exception("an edit left by a stopped process is not a valid message; dropped")
                await store.state_delete(NAMESPACE, key)
                gone += 1
        if gone:
            log.info(
                "deleted the marks of %d edits whose process stopped (%d to make again)", gone, len(again)
            )
        return again
