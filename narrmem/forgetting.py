"""Forgetting as a durable job: written down before anything is deleted, finished (its record
deleted) only when every plugin has scrubbed its copies, resumed on the next open after a crash.

A user's or a chat's forget then leaves no byte of what it deleted in the store's files; a deleted
message (an edit does this too) is gone from every row without that cost on each edit.

A user's or a chat's forget run from hooks or a trigger callback does not wait for the messages
being written meanwhile (:mod:`narrmem.fence`): their hooks may still make facts or counts of the
scope. When such messages of the scope are under way (or other workers share the store), the
scope is forgotten again once they have ended, by a task that holds nothing back until then. The
second forget is written down with the first, so a crash in between leaves it to the next open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from narrmem.checks import has_surrogate
from narrmem.errors import InputError
from narrmem.fence import ScopeKey, inside_own_work, not_own_work
from narrmem.models import MAX_ID_CHARS, ForgetJob, Scope
from narrmem.recent_vectors import ForgetsRecentTexts

if TYPE_CHECKING:
    from narrmem.fence import Fence
    from narrmem.inbox import Inbox
    from narrmem.lifecycle import MemoryLifecycle
    from narrmem.settling import Settling

log = logging.getLogger("narrmem")


class Forgetting:
    def __init__(
        self,
        memory: MemoryLifecycle,
        write_lock: asyncio.Lock,
        settling: Settling,
        inbox: Inbox,
        fence: Fence,
    ) -> None:
        self.memory = memory
        self.write_lock = write_lock
        self.settling = settling
        self.inbox = inbox
        self.fence = fence
        self._again_later: set[asyncio.Task[None]] = set()

    async def _quiet(self) -> None:
        # The batches being written have run their hooks (or scheduled them), what was received is
        # written (its entries deleted), and the hooks of what was acknowledged have run, first:
        # none of it writes after the forget. Batches begun meanwhile wait for the forget.
        await self.inbox.drained()
        await self.settling.settle()

    async def scope(self, scope: Scope, *, replacing: ForgetJob | None = None) -> dict[str, int]:
        """Forget a user and/or a chat. ``replacing``: the record of a second forget written down
        earlier, which this one's record takes over."""
        from_hooks = inside_own_work()
        store = self.memory.store
        async with self.fence.forgetting():
            await self._quiet()
            async with self.write_lock:
                job = await store.begin_forget(**scope.model_dump())
                if replacing is not None:
                    await store.finish_forget(replacing, purge=False)
                counts = await self.finish(job)
                if from_hooks:
                    ends = self.fence.under_way(lambda key: covers(scope, key))
                    if ends or self.fence.workers is not None:
                        again = await store.begin_forget(**scope.model_dump())
                        self._forget_again_later(scope, ends, again)
        return counts

    def _forget_again_later(self, scope: Scope, ends: list[asyncio.Future[None]], job: ForgetJob) -> None:
        task = asyncio.get_running_loop().create_task(self._again_after(scope, ends, job))
        self._again_later.add(task)
        task.add_done_callback(self._again_later.discard)

    async def _again_after(self, scope: Scope, ends: list[asyncio.Future[None]], job: ForgetJob) -> None:
        # Fenced as any caller's forget: it waits for every unit begun before it (of this worker
        # and, on a store that fences workers, of every other) and holds new ones back.
        with not_own_work():
            try:
                await asyncio.gather(*(asyncio.shield(end) for end in ends))
                await self.scope(scope, replacing=job)
            except Exception:
                log.exception("forgetting a scope again after the messages under way failed; next open does")

    async def forgotten_again(self) -> None:
        """Wait for the second forgets of the forgets run from hooks (none inside hooks: they may
        be waiting for the code that asks)."""
        while self._again_later and not inside_own_work():
            await asyncio.wait(set(self._again_later))

    async def messages(self, scope: Scope, message_ids: Sequence[str]) -> dict[str, int]:
        ids = message_id_list(message_ids)
        async with self.fence.forgetting():
            await self._quiet()
            async with self.write_lock:
                job = await self.memory.store.begin_forget(
                    tenant=scope.tenant, user_id=None, chat_id=scope.chat_id, messages=ids
                )
                counts = await self.finish(job)
        return {"memories": counts.get("memories", 0)}

    async def again(self, scope: Scope, message_ids: Sequence[str]) -> None:
        """Forget messages written after a forget that named them had begun (by another worker of a
        shared store, see :mod:`narrmem.inbox`): their after-store hooks run first, then they are
        deleted as :meth:`messages` does, without waiting for what was received (the caller is
        the one writing it)."""
        await self.settling.settle()
        async with self.write_lock:
            job = await self.memory.store.begin_forget(
                tenant=scope.tenant, user_id=None, chat_id=scope.chat_id, messages=list(message_ids)
            )
            await self.finish(job)

    async def finish(self, job: ForgetJob) -> dict[str, int]:
        """Delete what ``job`` names and let every plugin scrub its copies; safe to run again."""
        store = self.memory.store
        # Received messages go first: a worker that writes one of them afterwards finds its entry
        # gone and forgets it again (narrmem.inbox), while one whose entry it deleted first wrote
        # it before the deletions below.
        await self.inbox.drop(job)
        if job.messages is None:
            removed = await store.recent(job.scope, limit=2**62)
            counts = await store.forget(tenant=job.tenant, user_id=job.user_id, chat_id=job.chat_id)
        else:
            assert job.chat_id is not None
            ids = await store.from_messages(job.tenant, job.chat_id, job.messages)
            removed = list((await store.get(ids, job.scope)).values())
            counts = {"memories": await store.delete(ids, job.scope)}
        embedder = self.memory.embedder
        if isinstance(embedder, ForgetsRecentTexts):
            embedder.forget_recent_texts()
        told = {"memory": self.memory, "removed": removed, **job.model_dump(exclude={"id"})}
        await self.memory.host.call("narrmem_after_forget", isolate=False, **told)
        await self.settling.drop(job)
        await store.finish_forget(job, purge=job.messages is None)
        return counts

    async def resume(self) -> None:
        if self.memory.read_only:
            return  # the process that writes the folder finishes them
        for job in await self.memory.store.pending_forgets():
            log.warning("finishing a forget that was interrupted (job %d)", job.id)
            async with self.write_lock:
                await self.finish(job)


def covers(scope: Scope, key: ScopeKey) -> bool:
    """Whether a message of ``key`` (tenant, user, chat) is in ``scope``."""
    tenant, user_id, chat_id = key
    return scope.tenant == tenant and scope.user_id in (None, user_id) and scope.chat_id in (None, chat_id)


def message_id_list(message_ids: Sequence[str]) -> list[str]:
    if isinstance(message_ids, str) or not isinstance(message_ids, Sequence):
        raise InputError("must be a list of message ids", field="message_ids")
    for i, mid in enumerate(message_ids):
        if not isinstance(mid, str) or not 0 < len(mid) <= MAX_ID_CHARS:
            raise InputError(f"must be a string of 1 to {MAX_ID_CHARS} characters", field=f"message_ids[{i}]")
        if has_surrogate(mid):
            raise InputError("holds a lone surrogate (not valid Unicode)", field=f"message_ids[{i}]")
    return list(message_ids)
