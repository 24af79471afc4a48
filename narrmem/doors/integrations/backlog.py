"""A bot's writes that the store could not take, made once it answers again.

A message, an edit, the forget of deleted messages or a person's ``forgetme`` that fails with
:class:`~narrmem.errors.StoreUnavailableError` (a PostgreSQL down, restarting, failing over, or
stalled past ``[storage] timeout_s``) is not dropped: it waits here and is tried again after
:data:`RETRY_DELAYS` and then every :data:`RETRY_EVERY` seconds until the store answers. While
some wait, the calls that come go behind them, so the order a chat saw is kept: a message
deleted during the outage is forgotten after it is stored, not before (which would leave it
stored for good), and an edit lands on the message it edits.

Held in this process, for one memory: at most :data:`MAX_WAITING` calls; when full, the oldest
message or edit goes to make room (a forget goes only when nothing else is left to drop), logged
with a count. What still waits when the memory closes is logged as not made. A call that fails in
another way once the store answers (a refusal) is logged and dropped, as it would have been at
once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from narrmem.errors import ClosedError, StoreUnavailableError

if TYPE_CHECKING:
    from narrmem.memory import Memory

log = logging.getLogger("narrmem.doors.integrations")

T = TypeVar("T")
Kind = Literal["message", "edit", "forget of deleted messages", "forget of a person"]
# Kept when the backlog is full, as long as anything else can go: what a person took back.
FORGETS: frozenset[str] = frozenset({"forget of deleted messages", "forget of a person"})

MAX_WAITING = 10_000
# Seconds before each try again after a failure; then every RETRY_EVERY while the store is away.
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0)
RETRY_EVERY = 30.0


@dataclass
class _Waiting:
    kind: Kind
    call: Callable[[], Awaitable[Any]]


class Backlog:
    """The writes of one memory's bot integrations that wait for the store (see the module)."""

    def __init__(self) -> None:
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._drainer: asyncio.Task[None] | None = None
        self._empty = asyncio.Event()
        self._empty.set()
        self.dropped = 0  # calls dropped to make room, since the start

    def __len__(self) -> int:
        return len(self._waiting)

    async def run(self, kind: Kind, call: Callable[[], Awaitable[T]]) -> T | None:
        """``call()``'s answer; ``None`` when it waits here (the store cannot be reached, or
        earlier calls wait). Any other error of the call is raised."""
        if self._waiting:
            self._keep(kind, call)
            return None
        try:
            return await call()
        except StoreUnavailableError as exc:
            log.warning("the store cannot be reached; the %s waits (%s)", kind, type(exc).__name__)
            self._keep(kind, call)
            return None

    async def drained(self) -> None:
        """Wait until nothing waits (made, dropped, or given up at close)."""
        await self._empty.wait()

    def _keep(self, kind: Kind, call: Callable[[], Awaitable[Any]]) -> None:
        if len(self._waiting) >= MAX_WAITING:
            self._make_room()
        self._waiting.append(_Waiting(kind, call))
        self._empty.clear()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())

    def _make_room(self) -> None:
        # The first is the one being tried: it stays. A message or an edit goes before a forget.
        victims = [n for n, w in enumerate(self._waiting) if n > 0 and w.kind not in FORGETS]
        index = victims[0] if victims else 1
        dropped = self._waiting[index]
        del self._waiting[index]
        self.dropped += 1
        log.error(
            "%d writes wait for the store, the most kept: the oldest waiting %s is dropped (%d so far)",
            MAX_WAITING,
            dropped.kind,
            self.dropped,
        )

    async def _drain(self) -> None:
        failures = 0
        try:
            while self._waiting:
                await asyncio.sleep(RETRY_DELAYS[failures] if failures < len(RETRY_DELAYS) else RETRY_EVERY)
                while self._waiting:
                    first = self._waiting[0]
                    try:
                        await first.call()
                    except StoreUnavailableError:
                        failures += 1
                        break
                    except ClosedError:
                        log.error("the memory closed with %d writes not made (the store was away)", len(self))
                        self._waiting.clear()
                        return
                    except Exception:
                        log.exception("a waiting %s was refused once the store answered; dropped", first.kind)
                    failures = 0
                    self._waiting.popleft()
                if not self._waiting:
                    log.warning("the store answers again: every waiting write is made")
        finally:
            if not self._waiting:
                self._empty.set()


_BACKLOGS: weakref.WeakKeyDictionary[Memory, Backlog] = weakref.WeakKeyDictionary()


def backlog_of(memory: Memory) -> Backlog:
    """The backlog every integration on ``memory`` shares (so their writes keep one order)."""
    backlog = _BACKLOGS.get(memory)
    if backlog is None:
        backlog = _BACKLOGS[memory] = Backlog()
    return backlog
