"""Trigger events shared by the workers of one store.

A worker's hub publishes the events of the messages that worker ingested; behind a load balancer, a
stream opened on one worker saw a third of its tenant's events with three workers. On a store that
:class:`~narrmem.store.Broadcasts` (PostgreSQL: ``NOTIFY``), each worker also sends its events to
the others and takes theirs, so a stream on any worker carries every event of its tenant, and a
stream that resumes on another worker finds its last id held there too (once both were up when it
was sent). A worker's webhook sends its own events only: the others send theirs. A worker's own events are
streamed when heard back, like the others': every worker then streams them all in the one order
PostgreSQL delivers them in, and a stream that resumes on another worker misses none and repeats
none (streamed as they were published, the workers' orders differed when they ingested at once).

Nothing waits for it: an event is put on a bounded queue and sent by a task (the oldest dropped
when full, logged). An event's payload is the event as JSON, compressed when long; one still over
the store's limit is not relayed (logged). When the session that listens ended and listens
again, what was sent meanwhile is missed: the hub then begins its streams again with
``event: reset``. A forget made by another worker does not reach this one's process, but every
event is checked against the store before it is streamed (:mod:`narrmem.doors.server.forgets`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from narrmem import logs
from narrmem.models import TriggerEvent
from narrmem.store import Broadcasts, Listening

log = logs.logger("narrmem.server")

CHANNEL = "narrmem_trigger_events"
# Events waiting to be sent, and sent by others waiting to be taken, at most.
SEND_QUEUE = 1000
TAKE_QUEUE = 10_000


class EventRelay:
    def __init__(
        self,
        store: Broadcasts,
        receive: Callable[[TriggerEvent, tuple[int, ...] | None], Awaitable[None]],
        missed: Callable[[], None],
    ) -> None:
        self.origin = uuid.uuid4().hex  # this worker, in what it sends (its own come back to it)
        self._store = store
        self._receive = receive
        self._missed = missed
        self._outgoing: asyncio.Queue[tuple[TriggerEvent, tuple[int, ...]]] = asyncio.Queue(SEND_QUEUE)
        self._incoming: asyncio.Queue[tuple[bool, TriggerEvent, tuple[int, ...] | None]] = asyncio.Queue(
            TAKE_QUEUE
        )
        self._listening: Listening | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._starting = asyncio.Lock()
        self.sent = 0
        self.received = 0
        self.dropped = 0

    @property
    def listening(self) -> bool:
        return self._listening is not None

    async def start(self) -> None:
        """Listen for the other workers' events (once; the store's error when it cannot)."""
        async with self._starting:
            if self._listening is not None:
                return
            self._listening = await self._store.listen(CHANNEL, self._heard, self._missed)
            self._tasks = [
                asyncio.ensure_future(self._send_forever()),
                asyncio.ensure_future(self._take_forever()),
            ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        listening, self._listening = self._listening, None
        if listening is not None:
            await listening.close()

    def send(self, event: TriggerEvent, cited: tuple[int, ...] = ()) -> None:
        """Have ``event``, published here, sent to the other workers with what it cites (the
        memories it rests on, read here as it was published)."""
        if self._outgoing.full():
            self._outgoing.get_nowait()
            self._count_dropped("the queue of events to send to the other workers is full")
        self._outgoing.put_nowait((event, cited))

    async def _send_forever(self) -> None:
        limit = self._store.broadcast_limit
        while True:
            event, cited = await self._outgoing.get()
            payload = encode(self.origin, event, limit, cited)
            if payload is None:
                self._count_dropped(f"a {event.kind} event too long to send to the other workers")
                await self._here_only(event, cited)
                continue
            try:
                await self._store.broadcast(CHANNEL, payload)
            except Exception as exc:
                self._count_dropped(f"sending an event to the other workers failed ({type(exc).__name__})")
                await self._here_only(event, cited)
                continue
            self.sent += 1

    async def _here_only(self, event: TriggerEvent, cited: tuple[int, ...]) -> None:
        """An event of this worker that will not be heard back: streamed here all the same."""
        try:
            await self._receive(event, cited)
        except Exception:
            log.exception("an event of this worker could not be published here")

    def _heard(self, payload: str) -> None:
        decoded = decode(payload)
        if decoded is None:
            log.warning("a message on %s that is not a trigger event was left", CHANNEL)
            return
        origin, event, cited = decoded
        # This worker's own come back too: every worker streams them in the order heard.
        if self._incoming.full():
            self._incoming.get_nowait()
            self._count_dropped("the queue of events from the other workers is full")
            self._missed()
        self._incoming.put_nowait((origin == self.origin, event, cited))

    async def _take_forever(self) -> None:
        while True:
            own, event, cited = await self._incoming.get()
            try:
                await self._receive(event, cited)
            except Exception:
                log.exception("a relayed event could not be published here")
                continue
            if not own:
                self.received += 1

    def _count_dropped(self, why: str) -> None:
        self.dropped += 1
        # The kind and counts only: an event's label is the person's own words.
        log.warning("%s; %d event(s) not relayed so far", why, self.dropped)


def encode(origin: str, event: TriggerEvent, limit: int, cited: tuple[int, ...] = ()) -> str | None:
    """The payload that carries ``event`` and what it cites; ``None`` when over ``limit`` bytes
    even compressed."""
    body = {"e": event.model_dump(mode="json"), "c": list(cited)}
    plain = json.dumps({"o": origin, **body}, ensure_ascii=False, separators=(",", ":"))
    if len(plain.encode()) <= limit:
        return plain
    packed = base64.b64encode(zlib.compress(json.dumps(body).encode(), 9)).decode()
    small = json.dumps({"o": origin, "z": packed}, separators=(",", ":"))
    return small if len(small) <= limit else None


def decode(payload: str) -> tuple[str, TriggerEvent, tuple[int, ...] | None] | None:
    """``(origin, event, cited)`` of a payload :func:`encode` made (``cited`` ``None`` when it
    names none: read where it is heard); ``None`` for anything else."""
    try:
        data: Any = json.loads(payload)
        body = json.loads(zlib.decompress(base64.b64decode(data["z"]))) if "z" in data else data
        cited = body.get("c")
        named = (
            tuple(int(n) for n in cited if isinstance(n, int) and not isinstance(n, bool)) if cited else None
        )
        return str(data["o"]), TriggerEvent.model_validate(body["e"]), named
    except (ValueError, KeyError, TypeError, AttributeError, zlib.error, ValidationError):
        return None
