"""A forget takes the server's undelivered trigger events of what it forgot with it: those queued
for an event stream, those waiting for the webhook, and the one the webhook is being retried with.
However the forget is made: a route, the Python API, a hook."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from _helpers import answer_status, msg, read_posted_json
from fastapi import FastAPI

from narrmem.clock import ManualClock
from narrmem.doors.server import WebhookOptions, create_app
from narrmem.doors.server.events import TriggerHub
from narrmem.models import TriggerEvent
from narrmem.testing import open_memory

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
KAYAK = [
    "planning my zqkayak trip to the zqfjord",
    "zqkayak trip to the zqfjord again planning",
    "still planning the zqkayak zqfjord trip",
    "the zqkayak zqfjord trip planning continues",
]
TIRED = ["so tired today", "so tired again today", "still so tired today", "tired today again"]


def _said(texts: list[str], i: int, *, user: str, chat: str, ids: str = "m") -> dict[str, Any]:
    when = (NOW - timedelta(days=6 - i)).isoformat()
    return msg(f"{ids}{i}", texts[i], user=user, chat=chat, ts=when)


def _hub(app: FastAPI) -> TriggerHub:
    hub: TriggerHub = app.state.narrmem.hub
    return hub


async def _ingest_all(client: httpx.AsyncClient, texts: list[str], **where: str) -> list[dict[str, Any]]:
    """The trigger events the messages made."""
    events = []
    for i in range(len(texts)):
        response = await client.post("/v1/ingest", json=_said(texts, i, **where))
        assert response.status_code == 200, response.text
        events += response.json()["triggers"]
    assert events, "the messages made no trigger event"
    return events


async def _unread(stream: AsyncIterator[str]) -> list[dict[str, Any]]:
    """The events a subscriber that has not read yet gets, until the stream falls quiet."""
    events = []
    async for chunk in stream:
        if chunk.startswith("event: trigger"):
            events.append(json.loads(chunk.split("data: ", 1)[1]))
    return events


async def _subscribed(hub: TriggerHub) -> AsyncIterator[str]:
    stream = hub.stream(None, max_events=None, idle_timeout=0.5, keepalive=5)
    assert (await anext(stream)).startswith(": narrmem")  # subscribed; reads nothing more yet
    return stream


async def test_a_user_forgotten_over_http_is_not_streamed_to_a_subscriber_that_had_not_read(
    tmp_path: Path,
) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        app = create_app(memory)
        stream = await _subscribed(_hub(app))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            await _ingest_all(client, KAYAK, user="kim", chat="dm-kim")
            kept = await _ingest_all(client, TIRED, user="tom", chat="dm-tom")
            # Another tenant's kim and tom are others.
            for user in ("kim", "tom"):
                response = await client.post("/v1/forget", json={"user_id": user, "tenant": "elsewhere"})
                assert response.status_code == 200, response.text
            response = await client.post("/v1/forget", json={"user_id": "kim"})
            assert response.status_code == 200, response.text
        assert await _unread(stream) == kept
        assert _hub(app).forgotten >= 1


async def test_a_forget_through_the_python_api_empties_the_webhook_queue_and_stops_the_retries(
    tmp_path: Path,
) -> None:
    received: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    up = asyncio.Event()
    first_refused = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_posted_json(reader)
        (received if up.is_set() else refused).append(body["event"])
        first_refused.set()
        await answer_status(writer, 200 if up.is_set() else 503)

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=8, backoff=0.2, timeout=5)
    try:
        async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
            app = create_app(memory, webhook=webhook)
            hub = _hub(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
                # kim's first event is being retried (the endpoint is down), the rest wait behind it.
                forgotten = await _ingest_all(client, KAYAK, user="kim", chat="dm-kim")
                forgotten += await _ingest_all(client, TIRED, user="kim", chat="dm-kim", ids="t")
                kept = await _ingest_all(client, TIRED, user="tom", chat="dm-tom")
            await asyncio.wait_for(first_refused.wait(), 5)
            assert refused[0] == forgotten[0]

            await memory.forget(user_id="kim")
            up.set()
            await hub.drain(10)
            assert received == kept
            assert hub.forgotten == len(forgotten)
            await hub.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_deleted_message_takes_the_events_that_cite_it_in_its_chat(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        app = create_app(memory)
        stream = await _subscribed(_hub(app))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            [cites] = await _ingest_all(client, KAYAK, user="kim", chat="dm-kim")
            # The same message ids in another chat: its events stay.
            kept = await _ingest_all(client, TIRED, user="tom", chat="dm-tom")
            assert set(cites["message_ids"]) & {e for k in kept for e in k["message_ids"]}
            response = await client.post(
                "/v1/messages/delete", json={"chat_id": "dm-kim", "message_ids": [cites["message_ids"][0]]}
            )
            assert response.status_code == 200, response.text
        assert await _unread(stream) == kept


async def test_a_forget_made_by_a_trigger_callback_drops_the_event_it_answers(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        app = create_app(memory)
        stream = await _subscribed(_hub(app))

        async def forget_who_said_it(event: TriggerEvent) -> None:
            if event.user_id == "kim":
                await memory.forget(user_id=event.user_id, tenant=event.tenant)

        memory.on_trigger(forget_who_said_it)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            await _ingest_all(client, KAYAK, user="kim", chat="dm-kim")
            kept = await _ingest_all(client, TIRED, user="tom", chat="dm-tom")
        await memory.settle()
        assert await _unread(stream) == kept


class Unreadable:
    """A check whose store cannot be read at first (a connection lost for a moment)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0

    async def cited(self, event: TriggerEvent) -> tuple[int, ...]:
        return (1,)

    async def stands(self, event: TriggerEvent, cited: tuple[int, ...]) -> bool:
        self.asked += 1
        if self.asked <= self.failures:
            raise ConnectionError("store unreachable")
        return True


async def test_an_event_not_known_to_stand_is_held_back_until_the_store_answers() -> None:
    received: list[dict[str, Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append((await read_posted_json(reader))["event"])
        await answer_status(writer, 200)

    event = TriggerEvent(
        kind="topic", label="kayak", count=3, user_id="kim", chat_id="dm", message_ids=["m1"]
    )
    streams = TriggerHub(None, Unreadable(failures=1))
    stream = await _subscribed(streams)
    await streams.publish(event)
    assert await _unread(stream) == []  # not known to stand: not streamed

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=4, backoff=0.05, timeout=5)
    check = Unreadable(failures=2)
    hub = TriggerHub(webhook, check)
    try:
        await hub.publish(event)
        await hub.drain(10)
        # Held back at two attempts, sent at the third.
        assert received == [event.model_dump(mode="json")]
        assert check.asked == 3 and hub.delivered == 1
    finally:
        await hub.close()
        listener.close()
        await listener.wait_closed()


class SlowToRead:
    """A check whose read of what an event cites waits until let go (a busy store)."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.go = asyncio.Event()

    async def cited(self, event: TriggerEvent) -> tuple[int, ...]:
        self.reading.set()
        await self.go.wait()
        return (1,)

    async def stands(self, event: TriggerEvent, cited: tuple[int, ...]) -> bool:
        return True


async def test_a_forget_made_while_an_event_is_being_published_takes_it_too() -> None:
    """The forget found the event on no queue (what it cites was still being read): queued and
    held afterwards, it was streamed, and kept in memory for a stream that resumes."""
    event = TriggerEvent(
        kind="topic", label="kayak", count=3, user_id="kim", chat_id="dm", message_ids=["m1"]
    )
    check = SlowToRead()
    hub = TriggerHub(None, check)
    stream = await _subscribed(hub)
    publishing = asyncio.ensure_future(hub.publish(event))
    await check.reading.wait()
    hub.drop(lambda e: e.user_id == "kim")  # a forget of kim, as ForgetsVoidEvents makes it
    check.go.set()
    await publishing
    assert await _unread(stream) == []
    assert hub.held == 0 and hub.forgotten == 1
