"""A pass run on a schedule by one of a store's workers at a time (the decay pass, retention).

Each worker keeps its own timer; the start of a pass is a compare-and-set of the store's note of
the last one (plugin state), so of three workers one runs it, once an interval, whichever timers
fire. A pass begun within the interval, a little short of it (the worker whose start it was must
not skip its next), is not begun again.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from narrmem.store import Store

# The share of the interval after which a pass is due again.
DUE_AFTER = 0.9


@dataclass(frozen=True)
class Began:
    """A pass this worker began: the note it replaced, and its own."""

    before: dict[str, Any] | None
    note: dict[str, Any]


async def begin_if_due(
    store: Store, namespace: str, key: str, now: datetime, interval: timedelta
) -> Began | None:
    """Begin a pass unless one began within the interval (or another worker's start came first):
    ``None`` then."""
    stored = await store.state_get(namespace, key)
    last = time_of(stored)
    # A start noted a little ahead is another worker's whose clock runs ahead of this one's (by
    # half an hour, both ran every pass); one noted further ahead than the interval was noted by
    # a clock that was wrong, and is none (the schedule would stop until that time came).
    if last is not None and -interval < now - last < DUE_AFTER * interval:
        return None
    note = {"at": now.isoformat()}
    if not await store.state_put_if(namespace, key, note, stored):
        return None
    return Began(stored, note)


async def give_back(store: Store, namespace: str, key: str, began: Began) -> None:
    """Undo the start of a pass that did not run (the pass is still due), unless another was
    noted since."""
    if began.before is None:
        await store.state_delete_if(namespace, key, began.note)
    else:
        await store.state_put_if(namespace, key, began.before, began.note)


def time_of(stored: dict[str, Any] | None) -> datetime | None:
    """The time a pass began, as noted; ``None`` for none, or a note not as written here."""
    try:
        at = datetime.fromisoformat(str((stored or {})["at"]))
    except (KeyError, ValueError):
        return None
    return at if at.tzinfo is not None else None


async def stop(task: asyncio.Task[Any] | None) -> None:
    """Cancel a schedule's task and wait for it to end."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
