"""Group commit for single ingests: a bot's concurrent chats each call ``ingest`` for one message,
and the kept messages that arrive while others are being stored wait for them and are then stored
together, with one embedding call and one transaction (``[storage] group_commit``).

Triage runs in the caller's own task, so an ignored message still returns at once and never waits
behind a write. One committer task at a time takes what is waiting, in arrival order (the messages
of one chat keep theirs), and answers each caller with its own result. A message alone is stored
alone, as before; the wait only ever lasts as long as the store already in progress.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import TYPE_CHECKING

from narrmem.ingest import Pending, ignored
from narrmem.models import IngestResult, Message

if TYPE_CHECKING:
    from narrmem.ingest import IngestPipeline

# Set inside the committer's task (and the tasks it starts): an ingest made from an after-store
# hook or a trigger callback goes straight through instead of waiting for its own committer.
_COMMITTING: ContextVar[bool] = ContextVar("narrmem_group_commit", default=False)

Waiting = tuple[Pending, "asyncio.Future[IngestResult]"]


class GroupCommit:
    def __init__(self, pipeline: IngestPipeline) -> None:
        self.pipeline = pipeline
        self._waiting: list[Waiting] = []
        self._committer: asyncio.Task[None] | None = None

    async def ingest(self, message: Message) -> IngestResult:
        if _COMMITTING.get():
            [result] = await self.pipeline.run([message], None)
            return result
        errors: list[str] = []
        item = Pending(0, message, await self.pipeline.triage(message, errors), errors)
        if item.decision.layer == "ignore":
            return ignored(item)
        answer: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, answer))
        if self._committer is None:
            self._committer = asyncio.create_task(self._commit(), name="narrmem-group-commit")
        # A caller cancelled before its message is taken leaves nothing stored (see _commit).
        return await answer

    async def drain(self) -> None:
        """Wait until everything waiting is stored (``Memory.close`` calls it first)."""
        while self._committer is not None:
            await asyncio.shield(self._committer)

    async def _commit(self) -> None:
        _COMMITTING.set(True)  # this task's own context, and so its children's
        try:
            while self._waiting:
                size = self.pipeline.memory.settings.storage.batch_size
                taken = [(item, answer) for item, answer in self._waiting[:size] if not answer.done()]
                del self._waiting[:size]
                if taken:
                    await self._store(taken)
        except BaseException:
            for _, answer in self._waiting:
                answer.cancel()
            self._waiting.clear()
            raise
        finally:
            self._committer = None

    async def _store(self, taken: list[Waiting]) -> None:
        items = [item for item, _ in taken]
        for index, item in enumerate(items):
            item.index = index
        results = [
            IngestResult(message_id=item.message.message_id, layer=item.decision.layer, stored=False)
            for item in items
        ]
        try:
            finishing = await self.pipeline.store_triaged(items, results, None)
            if finishing is not None:
                await finishing
        except Exception as exc:
            # What failed failed for the whole group (one transaction): every caller hears it.
            for _, answer in taken:
                if not answer.done():
                    answer.set_exception(exc)
            return
        except BaseException:
            for _, answer in taken:
                answer.cancel()
            raise
        for (_, answer), result in zip(taken, results, strict=True):
            if not answer.done():
                answer.set_result(result)
