"""Several workers of one PostgreSQL store behind a load balancer: a stream opened on any worker
carries the events of every worker's messages, a stream resumes on another worker, and a worker's
webhook sends only its own. Before, each worker streamed only the events of the messages it had
ingested itself (with three workers, a third of them). Real servers' apps on a real PostgreSQL,
the events carried by its NOTIFY."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _helpers import answer_status, read_posted_json
from _postgres import dsn_for, fresh_database
from prometheus_client import generate_latest
from test_server_events_forget import KAYAK, NOW, TIRED, _hub, _ingest_all
from test_server_events_workers import _client, _workers
from test_server_metrics import _samples, _value

from narrmem import StoreUnavailableError
from narrmem.clock import ManualClock
from narrmem.doors.server import WebhookOptions, create_app
from narrmem.doors.server.metrics import ServerMetrics
from narrmem.doors.server.relay import decode, encode
from narrmem.models import TriggerEvent
from narrmem.testing import open_memory


@contextlib.asynccontextmanager
async def _two_servers(
    tmp_path: Path, dsn: str, options_a: dict[str, Any] | None = None, options_b: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """Two workers' apps on one PostgreSQL, each listening for the other's events from the start."""
    one, two = _workers(tmp_path, dsn)
    async with one as worker_a, two as worker_b:
        app_a, app_b = create_app(worker_a, **(options_a or {})), create_app(worker_b, **(options_b or {}))
        hub_a, hub_b = _hub(app_a), _hub(app_b)
        await hub_a.start()
        await hub_b.start()
        try:
            yield app_a, app_b
        finally:
            await hub_a.close()
            await hub_b.close()


async def _frames(stream: AsyncIterator[str], count: int) -> list[str]:
    """The next ``count`` frames that are not comments (keepalives)."""
    frames: list[str] = []
    while len(frames) < count:
        chunk = await asyncio.wait_for(anext(stream), 10)
        if not chunk.startswith(":"):
            frames.append(chunk)
    return frames


def _event(frame: str) -> dict[str, Any]:
    assert frame.startswith("event: trigger"), frame
    data: dict[str, Any] = json.loads(frame.split("data: ", 1)[1])
    return data


def _id(frame: str) -> str:
    return frame.split("id: ", 1)[1].split("\n", 1)[0]


async def test_a_stream_on_one_worker_carries_the_events_of_another_workers_messages(tmp_path: Path) -> None:
    dsn = await fresh_database("relay")
    metrics_a, metrics_b = ServerMetrics(), ServerMetrics()
    async with _two_servers(tmp_path, dsn, {"metrics": metrics_a}, {"metrics": metrics_b}) as (app_a, app_b):
        hub_b = _hub(app_b)
        on_b = hub_b.stream("default", max_events=None, idle_timeout=None, keepalive=30)
        assert (await anext(on_b)).startswith(": narrmem")
        async with _client(app_a) as client_a:
            made_on_a = await _ingest_all(client_a, KAYAK, user="kim", chat="dm-kim")
        async with _client(app_b) as client_b:
            made_on_b = await _ingest_all(client_b, TIRED, user="tom", chat="dm-tom")
        frames = await _frames(on_b, len(made_on_a) + len(made_on_b))
        assert [_event(f) for f in frames] == made_on_a + made_on_b
        assert hub_b.relay is not None and hub_b.relay.received == len(made_on_a)
        scraped_a = _samples((await asyncio.to_thread(generate_latest, metrics_a.registry)).decode())
        scraped_b = _samples((await asyncio.to_thread(generate_latest, metrics_b.registry)).decode())
        assert _value(scraped_a, "narrmem_events_relayed_total", direction="sent") == len(made_on_a)
        assert _value(scraped_b, "narrmem_events_relayed_total", direction="received") == len(made_on_a)
        assert _value(scraped_b, "narrmem_events_relay_listening") == 1.0


async def test_a_stream_resumes_on_another_worker_and_webhooks_send_their_own(tmp_path: Path) -> None:
    posted: list[dict[str, Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posted.append((await read_posted_json(reader))["event"])
        await answer_status(writer, 200)

    receiver = await asyncio.start_server(handle, "127.0.0.1", 0)
    webhook = WebhookOptions(url=f"http://127.0.0.1:{receiver.sockets[0].getsockname()[1]}/hook")
    dsn = await fresh_database("relay")
    try:
        # Both workers post to the same receiver, as a deployment's workers do.
        async with _two_servers(tmp_path, dsn, {"webhook": webhook}, {"webhook": webhook}) as (app_a, app_b):
            hub_a, hub_b = _hub(app_a), _hub(app_b)
            on_a = hub_a.stream("default", max_events=None, idle_timeout=None, keepalive=30)
            assert (await anext(on_a)).startswith(": narrmem")
            async with _client(app_a) as client_a:
                made = await _ingest_all(client_a, KAYAK, user="kim", chat="dm-kim")
                made += await _ingest_all(client_a, TIRED, user="tom", chat="dm-tom")
            first = (await _frames(on_a, 1))[0]
            await on_a.aclose()  # the client's connection drops after the first event
            # B holds A's events: the client, sent to B by the load balancer, resumes there.
            for _ in range(100):
                if hub_b.held >= len(made):
                    break
                await asyncio.sleep(0.05)
            resumed = hub_b.stream(
                "default",
                max_events=len(made) - 1,
                idle_timeout=5,
                keepalive=30,
                last_event_id=_id(first),
            )
            frames = [f async for f in resumed if not f.startswith(":")]
            assert [_event(f) for f in frames] == made[1:]
            await hub_a.drain(10)
            await hub_b.drain(10)
            assert posted == made  # once each: B's webhook did not send A's events again
    finally:
        receiver.close()
        await receiver.wait_closed()


async def test_a_stream_is_told_when_other_workers_events_were_missed(tmp_path: Path) -> None:
    dsn = await fresh_database("relay")
    database = dsn.split("?", 1)[0].rsplit("/", 1)[1]
    async with _two_servers(tmp_path, dsn) as (app_a, app_b):
        hub_b = _hub(app_b)
        on_b = hub_b.stream("default", max_events=None, idle_timeout=None, keepalive=0.2)
        assert (await anext(on_b)).startswith(": narrmem")
        # B's listening session ends (a restart of the server, a failover): B listens again and
        # tells its streams that what was sent meanwhile may be missing.
        admin = await asyncpg.connect(dsn_for("postgres"))
        try:
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = $1 AND query LIKE 'LISTEN%'",
                database,
            )
        finally:
            await admin.close()
        assert ended == 4  # A's and B's: each listens for events and for forgets
        [reset] = await _frames(on_b, 1)
        assert reset.startswith("event: reset") and "other_workers_events_missed" in reset
        async with _client(app_a) as client_a:
            made = await _ingest_all(client_a, KAYAK, user="kim", chat="dm-kim")
        frames = await _frames(on_b, len(made))  # listening again: A's events come through
        assert [_event(f) for f in frames] == made


def test_an_event_is_carried_whole_compressed_when_long_and_refused_when_too_long() -> None:
    event = TriggerEvent(kind="topic", label="kayak trip", count=3, user_id="kim", message_ids=["m1", "m2"])
    assert decode(encode("w1", event, 7999, (4, 9)) or "") == ("w1", event, (4, 9))
    assert decode(encode("w1", event, 7999) or "") == ("w1", event, None)  # cites nothing: read where heard
    many = event.model_copy(update={"message_ids": [f"message-{n:06d}" for n in range(2000)]})
    packed = encode("w1", many, 7999, (7,))
    assert packed is not None and len(packed.encode()) <= 7999 and '"z"' in packed
    assert decode(packed) == ("w1", many, (7,))
    noise = event.model_copy(
        update={"suggestion": "".join(chr(0x4E00 + (n * 7919) % 20000) for n in range(6000))}
    )
    assert encode("w1", noise, 7999) is None
    assert decode("not json") is None
    assert decode(json.dumps({"o": "w1", "e": {"kind": "topic"}})) is None


async def test_workers_ingesting_at_once_stream_every_event_in_one_order(tmp_path: Path) -> None:
    """Each worker streamed its own events as published and the others' as heard: when two
    ingested at once their streams differed in order, and a stream resumed on the other worker
    from an id lost the events that worker had placed before it. Every event is now streamed as
    heard back, in the order PostgreSQL delivers them to all."""
    dsn = await fresh_database("relay")
    async with _two_servers(tmp_path, dsn) as (app_a, app_b):
        hub_a, hub_b = _hub(app_a), _hub(app_b)
        on_a = hub_a.stream("default", max_events=None, idle_timeout=None, keepalive=30)
        on_b = hub_b.stream("default", max_events=None, idle_timeout=None, keepalive=30)
        assert (await anext(on_a)).startswith(": narrmem") and (await anext(on_b)).startswith(": narrmem")
        async with _client(app_a) as client_a, _client(app_b) as client_b:
            users = [f"p{n}" for n in range(4)]
            made = await asyncio.gather(
                *(_ingest_all(client_a, KAYAK, user=u, chat=f"dm-{u}") for u in users[:2]),
                *(_ingest_all(client_b, TIRED, user=u, chat=f"dm-{u}") for u in users[2:]),
            )
        total = sum(len(m) for m in made)
        order_a = [_id(f) for f in await _frames(on_a, total)]
        order_b = [_id(f) for f in await _frames(on_b, total)]
        assert order_a == order_b and len(set(order_a)) == total
        # A client that saw A's stream up to its second event resumes on B with the rest.
        resumed = hub_b.stream(
            "default", max_events=total - 2, idle_timeout=5, keepalive=30, last_event_id=order_a[1]
        )
        assert [_id(f) for f in [f async for f in resumed if not f.startswith(":")]] == order_a[2:]


async def test_a_relayed_event_rests_on_what_its_worker_read_not_on_a_later_read(tmp_path: Path) -> None:
    """An event heard by another worker after its messages were deleted: read there, what it
    cites was already gone, and it rested on its user's scope alone (streamed while the user had
    other memories in the chat). It now carries what its worker read as it was published."""
    from narrmem.doors.server.events import TriggerHub
    from narrmem.doors.server.forgets import StillStored

    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        async with _client(create_app(memory)) as client:
            [event] = await _ingest_all(client, KAYAK, user="kim", chat="dm-kim")
            await _ingest_all(client, TIRED, user="kim", chat="dm-kim", ids="t")  # she keeps other memories
        made = TriggerEvent.model_validate(event)
        cited = await StillStored(memory).cited(made)
        assert cited
        await memory.forget_messages(chat_id="dm-kim", message_ids=made.message_ids)
        hub = TriggerHub(None, StillStored(memory))
        stream = hub.stream("default", max_events=None, idle_timeout=0.3, keepalive=30)
        assert (await anext(stream)).startswith(": narrmem")
        await hub.receive(made, cited)
        assert [f async for f in stream if f.startswith("event: trigger")] == []
        await hub.close()


async def test_an_event_published_while_its_worker_did_not_listen_is_not_relayed_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that cannot listen (its listening session could not be opened) streams its
    events itself. They were also queued for the other workers and sent once it listened again:
    streamed there as new, hours late, and streamed a second time here when heard back."""
    dsn = await fresh_database("relay")
    one, two = _workers(tmp_path, dsn)
    async with one as worker_a, two as worker_b:
        app_a, app_b = create_app(worker_a), create_app(worker_b)
        hub_a, hub_b = _hub(app_a), _hub(app_b)
        await hub_b.start()
        listen = worker_a.store.listen

        async def away(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError("the listening session could not be opened")

        monkeypatch.setattr(worker_a.store, "listen", away)
        try:
            on_a = hub_a.stream("default", max_events=None, idle_timeout=None, keepalive=0.2)
            on_b = hub_b.stream("default", max_events=None, idle_timeout=None, keepalive=0.2)
            assert (await anext(on_a)).startswith(": narrmem") and (await anext(on_b)).startswith(": narrmem")
            async with _client(app_a) as client_a:
                early = await _ingest_all(client_a, KAYAK, user="kim", chat="dm-kim")
            assert [_event(f) for f in await _frames(on_a, len(early))] == early  # streamed here
            monkeypatch.setattr(worker_a.store, "listen", listen)
            await hub_a.start()
            async with _client(app_a) as client_a:
                late = await _ingest_all(client_a, TIRED, user="tom", chat="dm-tom")
            assert [_event(f) for f in await _frames(on_b, len(late))] == late  # not the early ones
            frames = await _frames(on_a, len(late) + 1)
            assert frames[0].startswith("event: reset")  # it listens now: the others' may be missing
            assert [_event(f) for f in frames[1:]] == late  # none twice
        finally:
            await hub_a.close()
            await hub_b.close()
