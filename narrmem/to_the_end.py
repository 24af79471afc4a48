"""Work that, once begun, is finished even when its caller is cancelled.

A bot's calls are cancelled in its real life (a handler under ``asyncio.timeout``, a library
cancelling its tasks at shutdown, an HTTP client that hangs up). Some steps must not stop half
way: a store's write whose rows are committed but whose vectors are not yet in the vector index
left a memory that no vector search could find, for good; a close that stopped after its first
step left the data folder locked and threads that kept the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from narrmem import logs
from narrmem.fence import inside_own_work

T = TypeVar("T")
log = logs.logger("narrmem")


async def to_the_end(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end in a task of its own. A cancel of the caller waits for it to end,
    then is raised (so ``asyncio.timeout`` still times out); its own failure is raised as ever."""
    task = asyncio.ensure_future(work)
    return await finished(task)


async def finished(task: asyncio.Future[T]) -> T:
    """``task``'s result once it has ended, whatever cancels the caller meanwhile (the cancel is
    raised after it)."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise  # the work itself was cancelled (by the event loop's end, say)
            if not task.done():
                cancelled = True
                continue
            raise
        if cancelled:
            raise asyncio.CancelledError
        return result


class Outlasting:
    """Work run on to its end though its caller gives up, whose caller's cancel is raised at once
    (a timeout around ``forget`` or ``edit`` times out on time), kept here so that
    :meth:`Memory.settle <narrmem.memory.Memory.settle>` can wait for it: untracked, an edit
    whose caller gave up was still under way after ``settle()``, the old text recalled."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._tasks: set[asyncio.Task[Any]] = set()  # kept referenced while they run

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._log_failure)
            raise

    def running(self) -> int:
        """How many are still under way."""
        return len(self._tasks)

    async def ended_within(self, seconds: float) -> int:
        """:meth:`ended`, for ``seconds`` at most (a close must not wait for ever for work a
        plugin holds); how many are still under way then."""
        with contextlib.suppress(TimeoutError):
            # ended() only waits (asyncio.wait): its cancel leaves the work running.
            await asyncio.wait_for(self.ended(), seconds)
        return self.running()

    async def ended(self) -> None:
        """Wait for the work whose callers gave up; at once inside hooks or a unit of
        :mod:`narrmem.fence`, which that work may be waiting for."""
        while self._tasks and not inside_own_work():
            # asyncio.wait, not gather: a gather that is cancelled cancels what it waits for (an
            # export whose client hung up settles first, and cut a forget short).
            await asyncio.wait(list(self._tasks))

    def _log_failure(self, task: asyncio.Task[Any]) -> None:
        # Its caller has gone: no one else hears of it.
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s whose caller gave up failed: %r", self.what, task.exception(), exc_info=task.exception()
            )
