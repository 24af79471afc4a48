"""Several workers of one PostgreSQL store, each with its own ``narrmem serve``: a forget made by
one worker voids the trigger events another has not delivered yet, on its event stream and on
its webhook (being retried), though that worker's process never hears of the forget. So do a
deleted and an edited message that an event cites."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from _helpers import answer_status, read_posted_json
from _postgres import fresh_database
from test_server_events_forget import KAYAK, NOW, TIRED, _hub, _ingest_all, _said, _subscribed, _unread

from narrmem.clock import ManualClock
from narrmem.doors.server import WebhookOptions, create_app
from narrmem.testing import open_memory


def _workers(tmp_path: Path, dsn: str) -> tuple[Any, Any]:
    storage = {"backend": "postgres", "dsn": dsn}
    return (
        open_memory(tmp_path / "a", clock=ManualClock(NOW), storage=storage),
        open_memory(tmp_path / "b", clock=ManualClock(NOW), storage=storage),
    )


async def _all_heard(hub: Any, count: int) -> None:
    """Wait until ``hub`` holds ``count`` events: relayed, a worker's own come back to it a
    moment after the ingest answered."""
    for _ in range(500):
        if hub.held >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{hub.held} events heard, not {count}")


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t")


async def test_another_workers_forget_voids_the_stream_and_the_webhook(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    up = asyncio.Event()
    first_refused = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_posted_json(reader)
        if up.is_set():
            received.append(body["event"])
        first_refused.set()
        await answer_status(writer, 200 if up.is_set() else 503)

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=8, backoff=0.2, timeout=5)
    one, two = _workers(tmp_path, await fresh_database("events"))
    try:
        async with one as worker_a, two as worker_b:
            app_a, app_b = create_app(worker_a, webhook=webhook), create_app(worker_b)
            hub = _hub(app_a)
            stream = await _subscribed(hub)
            async with _client(app_a) as client_a:
                forgotten = await _ingest_all(client_a, KAYAK, user="kim", chat="dm-kim")
                kept = await _ingest_all(client_a, TIRED, user="tom", chat="dm-tom")
            await _all_heard(hub, len(forgotten) + len(kept))
            await asyncio.wait_for(first_refused.wait(), 5)  # kim's event is being retried
            async with _client(app_b) as client_b:
                response = await client_b.post("/v1/forget", json={"user_id": "kim"})
                assert response.status_code == 200, response.text
            assert await _unread(stream) == kept
            up.set()
            await hub.drain(10)
            assert received == kept
            assert hub.forgotten == 2 * len(forgotten)  # once on the stream, once on the webhook
            await hub.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_message_deleted_or_edited_by_another_worker_voids_the_events_citing_it(
    tmp_path: Path,
) -> None:
    one, two = _workers(tmp_path, await fresh_database("events"))
    async with one as worker_a, two as worker_b:
        app_a, app_b = create_app(worker_a), create_app(worker_b)
        stream = await _subscribed(_hub(app_a))
        async with _client(app_a) as client_a:
            [deleted] = await _ingest_all(client_a, KAYAK, user="kim", chat="dm-kim")
            [edited] = await _ingest_all(client_a, TIRED, user="ann", chat="dm-ann")
            kept = await _ingest_all(client_a, TIRED, user="tom", chat="dm-tom")
        await _all_heard(_hub(app_a), 2 + len(kept))
        async with _client(app_b) as client_b:
            response = await client_b.post(
                "/v1/messages/delete", json={"chat_id": "dm-kim", "message_ids": [deleted["message_ids"][0]]}
            )
            assert response.status_code == 200, response.text
            # The edit keeps the message id; the event's words are the old text's.
            index = int(edited["message_ids"][-1][1:])
            new_text = {**_said(TIRED, index, user="ann", chat="dm-ann"), "text": "had a lovely day out"}
            response = await client_b.post("/v1/edit", json=new_text)
            assert response.status_code == 200, response.text
        assert await _unread(stream) == kept
