"""Work that failed, tried again in the background until it is done or the memory closes.

A forget whose finishing failed and the after-store hooks that found the store away are tried
again by the same process after :data:`RETRY_DELAYS` and then every :data:`RETRY_EVERY` seconds
(the delays of the event loop's clock): before, they waited for the next open, weeks later for a
bot that runs for weeks. What is still undone at close stays recorded in the store for the next
open, which does it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from narrmem import logs
from narrmem.errors import ClosedError

log = logs.logger("narrmem")

RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
RETRY_EVERY = 300.0
CLOSE_WAIT_S = 5.0  # the longest a close waits for the tries it cancels


class TryingAgain:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    def keep_trying(self, work: Callable[[], Awaitable[None]], what: str) -> asyncio.Task[None] | None:
        """Run ``work`` in the background after :data:`RETRY_DELAYS`, then every
        :data:`RETRY_EVERY` seconds, until it succeeds or :meth:`close` (its first try failed).
        ``what`` names it in the log, and must quote nothing a person said. The task that
        tries (``None`` once closing)."""
        if self._closing:
            log.warning("%s failed as the memory closed: not tried again in this process", what)
            return None
        task = asyncio.get_running_loop().create_task(self._until_done(work, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def under_way(self) -> int:
        """How many pieces of work wait for another try."""
        return len(self._tasks)

    async def _until_done(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        for attempt in itertools.count():
            await asyncio.sleep(RETRY_DELAYS[attempt] if attempt < len(RETRY_DELAYS) else RETRY_EVERY)
            if self._closing:
                log.warning("%s was not done before the memory closed", what)
                return
            try:
                await work()
            except ClosedError:
                return
            except Exception as exc:
                # The kind only: a plugin's error may quote what the person said.
                log.warning("%s failed again (%s); trying again", what, type(exc).__name__)
                continue
            log.warning("%s, which had failed, is done", what)
            return

    async def close(self, closing: asyncio.Task[Any] | None = None) -> None:
        """Stop trying: what is undone stays recorded for the next open. ``closing``: the task
        that called the memory's close, which a try may be (work whose callback closes the
        memory): it ends with its own try, and waiting for it here would wait for ever."""
        self._closing = True
        tasks = [task for task in self._tasks if task is not closing and task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a try that waits for the close itself (its callback closed the memory
            # while another close ran) ends only after it; it finds the memory shut.
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
