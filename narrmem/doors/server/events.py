"""Trigger events for HTTP callers: a server-sent events stream per tenant and an optional webhook
with bounded retries. (What was counted and what fired, for the inspector, is read from the
store: ``Memory.patterns``.)

Nothing here slows ingest down: an event is put on bounded queues and the memory carries on; a
slow stream loses its oldest events, a webhook that keeps failing loses the event after its
retries. A forget takes its events off the queues, and stops the one being delivered; and before
each delivery the event is checked against the store, for a forget another process made
(:mod:`narrmem.doors.server.forgets`).

A stream ends when the server stops (:meth:`TriggerHub.stop_streams`), and when its caller's key is
no longer valid (checked at each event and every second): an open stream outlived both. A webhook
attempt is bounded as a whole, and its reply is judged by its status, its body read no further
than a few KB: a receiver that answered a byte at a time held the sender for ever, and a huge reply
was read whole into memory.

Delivery is at least once (a reply lost is an attempt failed, and the event is sent again): every
event carries an id made from what it says (:func:`event_id`), in the webhook's body and its
``Idempotency-Key`` header and as the stream frame's ``id:``, by which a receiver keeps one of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from narrmem.errors import InputError
from narrmem.models import TriggerEvent

log = logging.getLogger("narrmem.server")

STREAM_QUEUE = 100
WEBHOOK_QUEUE = 1000
# How often an open stream asks again whether its caller's key is still valid (a revoked key stops
# working within a second: its streams too).
KEY_RECHECK_SECONDS = 1.0
# The most of a webhook's reply that is read (the status says how it went; reading a short reply
# to its end lets the connection be used again).
WEBHOOK_REPLY_BYTES = 4096


@dataclass
class WebhookOptions:
    url: str
    attempts: int = 4
    backoff: float = 0.5  # seconds before the 2nd attempt; doubled each time
    timeout: float = 5.0  # seconds for an attempt as a whole: connecting, sending, the reply

    def __post_init__(self) -> None:
        # Refused at start-up: a URL the client cannot even parse failed every delivery, and
        # stopped the sender at the first event without a word.
        import httpx

        try:
            parsed = httpx.URL(self.url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise InputError(f"not a URL: {exc}", field="webhook") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise InputError("must be an http:// or https:// URL with a host", field="webhook")


class EventCheck(Protocol):
    """Reads whether an event still stands when it is about to be delivered."""

    async def cited(self, event: TriggerEvent) -> tuple[int, ...]:
        """What the event rests on, read when it is published."""
        ...

    async def stands(self, event: TriggerEvent, cited: tuple[int, ...]) -> bool:
        """Whether what ``cited`` named is still there."""
        ...


@dataclass(frozen=True)
class Queued:
    event: TriggerEvent
    cited: tuple[int, ...] = ()


@dataclass(eq=False)
class _Subscriber:
    tenant: str | None
    queue: asyncio.Queue[Queued] = field(default_factory=lambda: asyncio.Queue(STREAM_QUEUE))


class TriggerHub:
    def __init__(self, webhook: WebhookOptions | None = None, check: EventCheck | None = None) -> None:
        self.webhook = webhook
        self.check = check
        self._subscribers: set[_Subscriber] = set()
        self._outbox: asyncio.Queue[Queued] | None = None
        self._sender: asyncio.Task[None] | None = None
        # The event the webhook sender is delivering (between its retries too), and the task
        # delivering it, which a forget of it cancels.
        self._delivering: tuple[TriggerEvent, asyncio.Task[None]] | None = None
        self.delivered = 0
        self.dropped = 0
        self.forgotten = 0
        # Set once the server stops: every stream ends, and no new one begins.
        self._stopping = asyncio.Event()
        self._closed = False

    # --- in ---------------------------------------------------------------------------------

    async def publish(self, event: TriggerEvent) -> None:
        """The memory's trigger callback."""
        listening = [sub for sub in self._subscribers if sub.tenant is None or sub.tenant == event.tenant]
        if not listening and (self.webhook is None or self._closed):
            return
        item = Queued(event, await self._cited(event))
        for sub in listening:
            if sub.queue.full():
                sub.queue.get_nowait()  # a slow reader loses the oldest, never blocks ingest
            sub.queue.put_nowait(item)
        if self._closed:
            if self.webhook is not None:
                self.dropped += 1
                log.warning("webhook closed: trigger %s/%s not delivered", event.kind, event.label)
        elif self.webhook is not None:
            outbox = self._ensure_sender()
            if outbox.full():
                self.dropped += 1
                log.warning("webhook queue full: trigger %s/%s dropped", event.kind, event.label)
            else:
                outbox.put_nowait(item)

    async def _cited(self, event: TriggerEvent) -> tuple[int, ...]:
        if self.check is None:
            return ()
        try:
            return await self.check.cited(event)
        except Exception:
            log.exception("reading what a trigger event cites failed; it is checked by its user's scope")
            return ()

    async def _stands(self, item: Queued) -> bool | None:
        """Whether ``item`` may be delivered (``None``: the check could not be read; not now)."""
        if self.check is None:
            return True
        try:
            standing = await self.check.stands(item.event, item.cited)
        except Exception:
            log.exception("checking a trigger event against the store failed; not delivered now")
            return None
        if not standing:
            self.forgotten += 1
        return standing

    def drop(self, voided: Callable[[TriggerEvent], bool]) -> int:
        """Take every undelivered event ``voided`` names off the stream queues and the webhook
        queue, and cancel its delivery if the webhook sender holds one: nothing of it is sent
        once this returns. Synchronous, so no event slips between the queues meanwhile."""
        count = sum(_remove(sub.queue, voided) for sub in self._subscribers)
        if self._outbox is not None:
            count += _remove(self._outbox, voided, joined=True)
        if self._delivering is not None and voided(self._delivering[0]):
            self._delivering[1].cancel()
            self._delivering = None
            count += 1
        self.forgotten += count
        return count

    async def stream(
        self,
        tenant: str | None,
        *,
        max_events: int | None,
        idle_timeout: float | None,
        keepalive: float,
        still_allowed: Callable[[], Awaitable[bool]] | None = None,
    ) -> AsyncIterator[str]:
        """Server-sent events: ``event: trigger`` with the event as JSON; a comment line every
        ``keepalive`` seconds keeps proxies from closing a quiet stream. ``still_allowed`` says
        whether the caller may still read (its key not revoked): asked before each event and
        every second, the stream ends once it says no. The stream ends when the server stops."""
        sub = _Subscriber(tenant)
        self._subscribers.add(sub)
        sent = 0
        loop = asyncio.get_running_loop()
        last = loop.time()
        next_keepalive = last + keepalive
        next_check = last + KEY_RECHECK_SECONDS
        try:
            yield ": narrmem trigger stream\n\n"
            while max_events is None or sent < max_events:
                if self._stopping.is_set():
                    return
                now = loop.time()
                if still_allowed is not None and now >= next_check:
                    if not await still_allowed():
                        return
                    next_check = now + KEY_RECHECK_SECONDS
                if now >= next_keepalive:
                    yield ": keepalive\n\n"
                    next_keepalive = loop.time() + keepalive
                    continue
                until = min(next_keepalive, next_check) if still_allowed is not None else next_keepalive
                if idle_timeout is not None:
                    if now - last >= idle_timeout:
                        return
                    until = min(until, last + idle_timeout)
                item = await self._next(sub, until - now)
                if item is None:
                    continue  # a keepalive, a check of the key, the idle end or the server stopping
                if not await self._stands(item):
                    continue  # forgotten (or not known to stand) since it was published
                if still_allowed is not None and not await still_allowed():
                    return
                event = item.event
                sent += 1
                last = loop.time()
                next_keepalive = last + keepalive
                yield f"event: trigger\nid: {event_id(event)}\ndata: {event.model_dump_json()}\n\n"
        finally:
            self._subscribers.discard(sub)

    async def _next(self, sub: _Subscriber, within: float) -> Queued | None:
        """The subscriber's next event, or ``None`` after ``within`` seconds or once the server
        stops."""
        taking = asyncio.ensure_future(sub.queue.get())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait(
                [taking, stopping], timeout=max(within, 0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            if not taking.done():
                taking.cancel()
        if taking.done() and not taking.cancelled():
            return taking.result()
        return None

    def stop_streams(self) -> None:
        """End every stream now and any begun later (the server is stopping)."""
        self._stopping.set()

    # --- webhook ----------------------------------------------------------------------------

    def _ensure_sender(self) -> asyncio.Queue[Queued]:
        if self._outbox is None:
            self._outbox = asyncio.Queue(WEBHOOK_QUEUE)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_forever(self._outbox))
        return self._outbox

    async def _send_forever(self, outbox: asyncio.Queue[Queued]) -> None:
        import httpx

        assert self.webhook is not None
        options = self.webhook
        async with httpx.AsyncClient(timeout=options.timeout) as client:
            while True:
                item = await outbox.get()
                try:
                    await self._deliver_unless_forgotten(client, options, item)
                finally:
                    outbox.task_done()

    async def _deliver_unless_forgotten(self, client: Any, options: WebhookOptions, item: Queued) -> None:
        # Its own task, so that a forget can stop it in a retry's wait or mid-request.
        delivery = asyncio.get_running_loop().create_task(self._deliver(client, options, item))
        self._delivering = (item.event, delivery)
        try:
            await asyncio.wait([delivery])
        except asyncio.CancelledError:  # the hub is closing
            delivery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await delivery
            raise
        finally:
            if self._delivering is not None and self._delivering[1] is delivery:
                self._delivering = None
        if not delivery.cancelled():
            delivery.result()  # an unexpected error ends the sender; the next event starts another

    async def _deliver(self, client: Any, options: WebhookOptions, item: Queued) -> None:
        import httpx

        event = item.event
        body = event.model_dump(mode="json")
        key = event_id(event)
        delay = options.backoff
        for attempt in range(1, options.attempts + 1):
            standing = await self._stands(item)
            if standing is False:
                return  # forgotten by another process meanwhile
            try:
                if standing is None:
                    raise _NotKnownToStand
                # httpx's timeout bounds each read, not the attempt: bounded here as a whole.
                async with asyncio.timeout(options.timeout):
                    status = await _post(
                        client, options.url, {"type": "trigger", "id": key, "event": body}, key
                    )
                if status < 300:
                    self.delivered += 1
                    return
                problem = f"HTTP {status}"
            except (httpx.HTTPError, httpx.InvalidURL, _NotKnownToStand, TimeoutError) as exc:
                problem = type(exc).__name__
            if attempt < options.attempts:
                await asyncio.sleep(delay)
                delay *= 2
        self.dropped += 1
        log.warning(
            "webhook: trigger %s/%s not delivered after %d attempts (%s)",
            event.kind,
            event.label,
            options.attempts,
            problem,
        )

    async def drain(self, within: float = 5.0) -> int:
        """Wait (bounded) for the webhook queue to empty; used at shutdown and in tests. The number
        of events still undelivered (queued, or being delivered) then."""
        if self._outbox is None:
            return 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outbox.join(), within)
        return self._outbox.qsize() + (self._delivering is not None)

    async def shutdown(self, within: float) -> None:
        """The server has stopped: the streams end, the webhook gets at most ``within`` seconds to
        deliver what is queued (what is left is logged, not delivered), and the hub closes."""
        self.stop_streams()
        left = await self.drain(within)
        if left:
            log.warning("webhook: %d trigger event(s) not delivered at shutdown (after %g s)", left, within)
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None


def event_id(event: TriggerEvent) -> str:
    """The event's id: a digest of what it says, so the same firing has the same id however often
    it is sent (a webhook's retries, whose reply was lost; the hooks of a message run again at an
    open after a stop) and a receiver keeps one of each. Two firings differ in their count or
    the messages they cite."""
    said = event.model_dump(mode="json", include=EVENT_ID_FIELDS)
    return hashlib.blake2b(json.dumps(said, sort_keys=True).encode(), digest_size=16).hexdigest()


EVENT_ID_FIELDS = {
    "tenant",
    "user_id",
    "chat_id",
    "kind",
    "label",
    "count",
    "message_ids",
    "cause_message_id",
}


async def _post(client: Any, url: str, payload: dict[str, Any], key: str) -> int:
    """POST ``payload`` (``key`` as its ``Idempotency-Key``); the reply's status, having read no
    more than a few KB of its body."""
    async with client.stream("POST", url, json=payload, headers={"Idempotency-Key": key}) as response:
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read >= WEBHOOK_REPLY_BYTES:
                break  # the rest is never read: the connection is closed, not used again
        status: int = response.status_code
        return status


class _NotKnownToStand(Exception):
    """The store could not say whether the event still stands: this attempt is not made."""


def _remove(
    queue: asyncio.Queue[Queued], voided: Callable[[TriggerEvent], bool], *, joined: bool = False
) -> int:
    """Take the events ``voided`` names out of ``queue``, keeping the others in order. A queue
    whose ``join`` is awaited (``joined``) counts each taken event as done."""
    kept: list[Queued] = []
    removed = 0
    while not queue.empty():
        item = queue.get_nowait()
        if joined:
            queue.task_done()
        if voided(item.event):
            removed += 1
        else:
            kept.append(item)
    for item in kept:
        queue.put_nowait(item)
    return removed
