"""Work that, once begun, is finished even when its caller is cancelled.

A bot's calls are cancelled in its real life (a handler under ``asyncio.timeout``, a library
cancelling its tasks at shutdown, an HTTP client that hangs up). Some steps must not stop half
way: a store's write whose rows are committed but whose vectors are not yet in the vector index
left a memory that no vector search could find, for good; a close that stopped after its first
step left the data folder locked and threads that kept the process from exiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
