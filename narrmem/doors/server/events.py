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

A stream resumes: the hub holds each tenant's latest events (:data:`RECENT_EVENTS` a tenant,
:data:`RECENT_TOTAL` in all), and a stream asked with the ``Last-Event-ID`` a client saw begins
with the events published after it. The hold is this process's (with the other workers' events it
was relayed, :mod:`narrmem.doors.server.relay`): an id not held, or one too old, begins the stream
with ``event: reset`` (events may have been missed). To hold an event,
what it cites is read at once, though no stream is listening (a read per trigger fired).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from narrmem import logs
from narrmem.errors import InputError
from narrmem.models import TriggerEvent
from narrmem.store import Broadcasts

if TYPE_CHECKING:
    from narrmem.doors.server.relay import EventRelay

log = logs.logger("narrmem.server")

STREAM_QUEUE = 100
WEBHOOK_QUEUE = 1000
# How often an open stream asks again whether its caller's key is still valid (a revoked key stops
# working within a second: its streams too).
KEY_RECHECK_SECONDS = 1.0
# The most of a webhook's reply that is read (the status says how it went; reading a short reply
# to its end lets the connection be used again).
WEBHOOK_REPLY_BYTES = 4096
# What a reconnecting stream can be given again: the latest RECENT_EVENTS events of each tenant,
# and no more than RECENT_TOTAL in all however many tenants and users there are (an event held
# takes about 2 KB: some 40 MB at most); past that, the tenant that published least lately lets go
# of its oldest first.
RECENT_EVENTS = 1000
RECENT_TOTAL = 20_000
# Seconds between tries to listen for the other workers' events while their store cannot be reached.
LISTEN_RETRY_SECONDS = 5.0
# The longest Last-Event-ID a stream accepts: the ids this server sends are 32 hex digits.
LAST_EVENT_ID_CHARS = 200


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


@dataclass(frozen=True)
class _Held:
    """An event held for a reconnecting stream; ``order`` counts the hub's publications (what a
    stream of every tenant sorts by)."""

    order: int
    item: Queued


@dataclass(eq=False)
class _Subscriber:
    tenant: str | None
    queue: asyncio.Queue[Queued] = field(default_factory=lambda: asyncio.Queue(STREAM_QUEUE))
    missed: bool = False  # events of other workers went by unseen: the stream says reset
    overflowed: bool = False  # its reader fell STREAM_QUEUE events behind: the oldest went


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
        # Tenant -> event id -> the event, both in publication order (the tenant that published
        # last at the end).
        self._recent: OrderedDict[str, OrderedDict[str, _Held]] = OrderedDict()
        self._published = 0
        self._held = 0
        # The forgets made while events were being published (kept only while one is).
        self._publishing = 0
        self._voids_made = 0
        self._voids: list[tuple[int, Callable[[TriggerEvent], bool]]] = []
        # The latest publication let go for room (not by a forget): a stream of every tenant cannot
        # resume from before it without a gap.
        self._let_go_through = 0
        # The other workers' events (:mod:`narrmem.doors.server.relay`), on a store shared by
        # processes that can carry them; and the publication after which some of theirs were
        # missed: no stream resumes from before it.
        self.relay: EventRelay | None = None
        self._missed_through = 0
        self._listen_task: asyncio.Task[None] | None = None
        self._listen_failed = False
        self._listen_tried = -LISTEN_RETRY_SECONDS

    def relay_with(self, store: Broadcasts) -> None:
        """Share events with the other workers of ``store`` (listening from :meth:`start`, or
        from the first event or stream)."""
        from narrmem.doors.server.relay import EventRelay

        self.relay = EventRelay(store, self.receive, self.missed)

    async def start(self) -> None:
        """Listen for the other workers' events now (a server about to serve): a stream that
        resumes here finds theirs held from this moment. A store that cannot be reached is
        logged, and listening is tried again at the next event or stream."""
        if self.relay is None or self.relay.listening:
            return
        try:
            await self.relay.start()
            if self._listen_failed:
                self.missed()  # the other workers' events sent before now were not heard
        except Exception as exc:
            self._listen_failed = True
            log.warning(
                "listening for the other workers' events failed (%s); trying again later", type(exc).__name__
            )

    # --- in ---------------------------------------------------------------------------------

    def _listen_soon(self) -> None:
        """Begin listening in the background if not yet (at most one try every few seconds):
        neither an event nor a stream waits for it."""
        if self.relay is None or self.relay.listening:
            return
        now = asyncio.get_running_loop().time()
        trying = self._listen_task is not None and not self._listen_task.done()
        if not trying and now - self._listen_tried >= LISTEN_RETRY_SECONDS:
            self._listen_tried = now
            self._listen_task = asyncio.ensure_future(self.start())

    async def publish(self, event: TriggerEvent) -> None:
        """The memory's trigger callback: an event of this process's messages. Relayed, it is
        held and streamed here when heard back (:meth:`receive`), so that every worker streams
        every worker's events in one order (the order PostgreSQL delivers them in): a stream
        resumed on another worker then misses none and repeats none."""
        self._listen_soon()
        relay = None if self._closed else self.relay
        heard_back = relay is not None and relay.listening
        item = await self._publish(event, stream=not heard_back, webhook=True)
        if relay is not None and item is not None and heard_back:
            # With what it cites, read here as it was published: read where it is heard, after
            # another worker deleted its messages, it would rest on its user's scope alone. Not
            # while not listening: streamed here already, it was sent once listening began, the
            # other workers streamed it as new, hours late, and this one streamed it twice.
            relay.send(event, item.cited)

    async def receive(self, event: TriggerEvent, cited: tuple[int, ...] | None = None) -> None:
        """An event relayed (another worker's, or this one's heard back), with what it cites as its
        worker read it: streamed and held here, not sent to the webhook (its worker's sends it)."""
        await self._publish(event, stream=True, webhook=False, cited=cited)

    def missed(self) -> None:
        """Events of other workers went by unseen: every open stream says ``event: reset``, and
        none resumes from before now."""
        self._missed_through = self._published
        for sub in self._subscribers:
            sub.missed = True

    async def _publish(
        self, event: TriggerEvent, *, stream: bool, webhook: bool, cited: tuple[int, ...] | None = None
    ) -> Queued | None:
        """Hold and stream ``event`` (``stream``), queue it for the webhook (``webhook``); the
        item, or ``None`` when a forget took it meanwhile."""
        # A forget made while what the event cites is read found it nowhere to drop: the forgets
        # made meanwhile are asked of it once the read is done.
        begun = self._voids_made
        self._publishing += 1
        try:
            item = Queued(event, await self._cited(event) if cited is None else cited)
        finally:
            self._publishing -= 1
        voided_meanwhile = any(voided(event) for made, voided in self._voids if made > begun)
        if not self._publishing:
            self._voids.clear()
        if voided_meanwhile:
            self.forgotten += 1
            return None
        # Held and queued in one step, with no await between, and the subscribers read after the
        # await: a stream that subscribes meanwhile either finds it held (and replays it) or is
        # given it live, never neither nor both.
        if stream and self._hold(item):
            listening = [sub for sub in self._subscribers if sub.tenant is None or sub.tenant == event.tenant]
            for sub in listening:
                if sub.queue.full():
                    sub.queue.get_nowait()  # a slow reader loses the oldest, never blocks ingest
                    sub.overflowed = True  # and is told so: its next id is past the gap
                sub.queue.put_nowait(item)
        if not webhook:
            return item
        if self._closed:
            if self.webhook is not None:
                self.dropped += 1
                log.warning(
                    "webhook closed: %s trigger %s not delivered",
                    event.kind,
                    event_id(event),
                    extra={"repeats_as": event.kind},  # one kind of line per kind of event, not per event
                )
        elif self.webhook is not None:
            outbox = self._ensure_sender()
            if outbox.full():
                # The oldest goes: after an endpoint down for hours, what it is sent first is
                # the latest, not hours-old events ahead of a queue that dropped every new one.
                oldest = outbox.get_nowait()
                outbox.task_done()
                self.dropped += 1
                log.warning(
                    "webhook queue full: %s trigger %s dropped",
                    oldest.event.kind,
                    event_id(oldest.event),
                    extra={"repeats_as": oldest.event.kind},
                )
            outbox.put_nowait(item)
        return item

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

    def _hold(self, item: Queued) -> bool:
        """Hold ``item`` for resuming streams; ``False`` when it is held already (the same firing
        again, by this worker's hooks run again or by another worker): it was streamed then."""
        self._published += 1
        tenant = item.event.tenant
        ring = self._recent.setdefault(tenant, OrderedDict())
        self._recent.move_to_end(tenant)
        key = event_id(item.event)
        if key in ring:
            return False
        ring[key] = _Held(self._published, item)
        self._held += 1
        if len(ring) > RECENT_EVENTS:
            self._let_go_oldest(tenant)
        while self._held > RECENT_TOTAL:
            self._let_go_oldest(next(iter(self._recent)))
        return True

    def _let_go_oldest(self, tenant: str) -> None:
        ring = self._recent[tenant]
        _, oldest = ring.popitem(last=False)
        self._held -= 1
        self._let_go_through = max(self._let_go_through, oldest.order)
        if not ring:
            del self._recent[tenant]

    def _held_after(self, tenant: str | None, last_event_id: str) -> list[Queued] | None:
        """The events of ``tenant`` (``None``: every tenant) published after the one of
        ``last_event_id``, in order; ``None`` when that one is not held, or when events after it
        were let go for room (a resume from it would have a gap)."""
        if tenant is not None:
            # Read from the tenant's own hold only: another tenant's events are never looked at.
            ring = self._recent.get(tenant)
            seen = None if ring is None else ring.get(last_event_id)
            if ring is None or seen is None or seen.order <= self._missed_through:
                return None
            # A tenant's hold lets go of its oldest first: everything after a held event is held.
            return [held.item for held in ring.values() if held.order > seen.order]
        seen = next((ring[last_event_id] for ring in self._recent.values() if last_event_id in ring), None)
        if seen is None or seen.order <= max(self._let_go_through, self._missed_through):
            return None
        after = [held for ring in self._recent.values() for held in ring.values() if held.order > seen.order]
        return [held.item for held in sorted(after, key=lambda held: held.order)]

    def drop(self, voided: Callable[[TriggerEvent], bool]) -> int:
        """Take every undelivered event ``voided`` names off the stream queues and the webhook
        queue, and cancel its delivery if the webhook sender holds one: nothing of it is sent
        once this returns. Synchronous, so no event slips between the queues meanwhile. The events
        held for reconnecting streams go too (not counted: they were delivered, or are queued),
        and so does one being published (what it cites still being read)."""
        self._voids_made += 1
        if self._publishing:
            self._voids.append((self._voids_made, voided))
        for tenant, ring in list(self._recent.items()):
            for key in [key for key, held in ring.items() if voided(held.item.event)]:
                del ring[key]
                self._held -= 1
            if not ring:
                del self._recent[tenant]
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
        last_event_id: str | None = None,
    ) -> AsyncIterator[str]:
        """Server-sent events: ``event: trigger`` with the event as JSON; a comment line every
        ``keepalive`` seconds keeps proxies from closing a quiet stream. ``still_allowed`` says
        whether the caller may still read (its key not revoked): asked before each event and
        every second, the stream ends once it says no. The stream ends when the server stops.

        With ``last_event_id`` (a reconnecting client's ``Last-Event-ID``) the stream begins with
        the held events published after that one, then goes on live; an id not held begins it
        with ``event: reset`` instead."""
        self._listen_soon()
        sub = _Subscriber(tenant)
        self._subscribers.add(sub)
        # Read in the same step as the subscription (no await between): what was published before
        # is held and replayed, what is published after is queued live; none is in both.
        replay = None if last_event_id is None else self._held_after(tenant, last_event_id)
        backlog = deque(replay or ())
        sent = 0
        loop = asyncio.get_running_loop()
        last = loop.time()
        next_keepalive = last + keepalive
        next_check = last + KEY_RECHECK_SECONDS
        try:
            yield ": narrmem trigger stream\n\n"
            if last_event_id is not None and replay is None:
                yield f"event: reset\ndata: {RESET_DATA}\n\n"
            while max_events is None or sent < max_events:
                if self._stopping.is_set():
                    return
                if sub.missed:
                    sub.missed = False
                    yield f"event: reset\ndata: {MISSED_DATA}\n\n"
                if sub.overflowed:
                    sub.overflowed = False
                    yield f"event: reset\ndata: {OVERFLOW_DATA}\n\n"
                now = loop.time()
                if still_allowed is not None and now >= next_check:
                    if not await still_allowed():
                        return
                    next_check = now + KEY_RECHECK_SECONDS
                if now >= next_keepalive:
                    yield ": keepalive\n\n"
                    next_keepalive = loop.time() + keepalive
                    continue
                if backlog:
                    item: Queued | None = backlog.popleft()
                else:
                    until = min(next_keepalive, next_check) if still_allowed is not None else next_keepalive
                    if idle_timeout is not None:
                        if now - last >= idle_timeout and sub.queue.empty():
                            return  # idle: nothing came for idle_timeout (what came is sent first)
                        until = min(until, last + idle_timeout)
                    item = await self._next(sub, until - now)
                if item is None:
                    continue  # a keepalive, a check of the key, the idle end or the server stopping
                # A replayed event is checked as a live one: a forget since is not brought back.
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

    @property
    def streams(self) -> int:
        """The event streams open."""
        return len(self._subscribers)

    @property
    def held(self) -> int:
        """The events held for streams that resume."""
        return self._held

    @property
    def webhook_waiting(self) -> int:
        """The events waiting for the webhook."""
        return 0 if self._outbox is None else self._outbox.qsize()

    @property
    def stopping(self) -> bool:
        """Whether the server has begun to stop (:meth:`stop_streams`)."""
        return self._stopping.is_set()

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
        # The event's id, not its label: a label is the person's own words (a topic, a value's
        # sentence), and a log outlives a forget of them.
        log.warning(
            "webhook: %s trigger %s not delivered after %d attempts (%s)",
            event.kind,
            event_id(event),
            options.attempts,
            problem,
            extra={"repeats_as": event.kind},
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
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listen_task
        if self.relay is not None:
            await self.relay.close()
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


# The frame that begins a resumed stream whose Last-Event-ID is not held: too old, from another
# worker's stream, or of an event forgotten since. The client carries on from now.
RESET_DATA = json.dumps(
    {
        "reason": "last_event_id_not_held",
        "detail": "events published while disconnected may have been missed",
    }
)

# The frame an open stream is sent when events of other workers went by unseen (the session that
# listens for them ended and listens again): some of its tenant's may be missing.
MISSED_DATA = json.dumps(
    {
        "reason": "other_workers_events_missed",
        "detail": "events published by other workers meanwhile may have been missed",
    }
)


# The frame an open stream is sent when it read too slowly and its oldest queued events went (a
# stream's queue holds STREAM_QUEUE): without it the client's next id was past the gap, and no
# resume could bring those events back.
OVERFLOW_DATA = json.dumps(
    {
        "reason": "stream_fell_behind",
        "detail": f"this stream read too slowly: events beyond the {STREAM_QUEUE} queued were dropped",
    }
)


def printable_event_id(value: str | None) -> str | None:
    """A Last-Event-ID as a client sends it back: printable ASCII (the ids sent are hex); an empty
    one is none (an SSE client sends it so after an empty ``id:``)."""
    if value is not None and not all(" " <= char <= "~" for char in value):
        raise ValueError("must be printable ASCII, without control characters")
    return value or None


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
