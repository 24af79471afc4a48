"""A stream client that reconnects with the ``Last-Event-ID`` it saw is sent the events published
while it was away, in order, then the live ones: its tenant's only, none of a person forgotten
since. An id the server does not hold begins the stream with ``event: reset``; a malformed one is
a 422 naming the header."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import answer_status, read_posted_json, store_fingerprint
from fastapi import FastAPI
from test_server_events_forget import KAYAK, NOW, TIRED, _ingest_all, _said, _subscribed, _unread

from narrmem.clock import ManualClock
from narrmem.doors.server import create_app, events
from narrmem.doors.server.events import TriggerHub, WebhookOptions, event_id
from narrmem.memory import Memory
from narrmem.models import TriggerEvent
from narrmem.testing import open_memory


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t")


async def _fire(client: httpx.AsyncClient, user: str, tenant: str = "default") -> list[dict[str, Any]]:
    """The trigger events one user's tired week makes (in its own chat: each user's fire)."""
    fired = []
    for i in range(len(TIRED)):
        response = await client.post(
            "/v1/ingest", json={**_said(TIRED, i, user=user, chat=f"dm-{user}"), "tenant": tenant}
        )
        assert response.status_code == 200, response.text
        fired += response.json()["triggers"]
    assert fired, "the messages made no trigger event"
    return fired


def _id(event: dict[str, Any]) -> str:
    return event_id(TriggerEvent.model_validate(event))


def _frames(text: str) -> list[tuple[str, str | None, Any]]:
    """Each frame of a stream as (event, id, data); comments left out."""
    frames = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            frames.append((fields["event"], fields.get("id"), json.loads(fields["data"])))
    return frames


async def _resume(
    client: httpx.AsyncClient, last_id: str, *, events: int, tenant: str = "default", live: Any = None
) -> list[tuple[str, str | None, Any]]:
    """Reconnect with ``last_id``; ``live()`` (if given) publishes once the stream is open. The
    frames of the stream, ended after ``events`` trigger events or once quiet."""
    params = {"tenant": tenant, "max_events": events, "idle_seconds": 1}
    listening = asyncio.ensure_future(
        client.get("/v1/events", params=params, headers={"Last-Event-ID": last_id})
    )
    if live is not None:
        await asyncio.sleep(0.3)  # subscribed
        await live()
    response = await asyncio.wait_for(listening, 20)
    assert response.status_code == 200, response.text
    return _frames(response.text)


def _triggers(frames: list[tuple[str, str | None, Any]]) -> list[dict[str, Any]]:
    assert all(frame[0] == "trigger" and frame[1] == _id(frame[2]) for frame in frames), frames
    return [frame[2] for frame in frames]


@pytest.fixture
async def memory(tmp_path: Path) -> Any:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        yield memory


async def test_a_reconnect_gets_what_it_missed_in_order_then_the_live_events(memory: Memory) -> None:
    app = create_app(memory)
    async with _client(app) as client:
        seen = await _fire(client, "ann")
        missed = await _fire(client, "bob") + await _fire(client, "cy") + await _fire(client, "dee")
        live: list[dict[str, Any]] = []

        async def publish_live() -> None:
            live.extend(await _fire(client, "eve") + await _fire(client, "fay"))

        frames = await _resume(client, _id(seen[-1]), events=len(missed) + 2, live=publish_live)
        assert _triggers(frames) == missed + live  # none twice, none left out, in order
        # Resumed from the first it missed: the rest of it, no more; and reading changed nothing.
        before = await store_fingerprint(memory, keyword_tables=False)
        again = await _resume(client, _id(missed[0]), events=len(missed) + len(live))
        assert _triggers(again) == missed[1:] + live
        assert await store_fingerprint(memory, keyword_tables=False) == before


async def test_an_id_not_held_begins_with_a_reset_then_goes_on_live(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "RECENT_EVENTS", 2, raising=False)
    app = create_app(memory)
    async with _client(app) as client:
        [too_old] = await _fire(client, "ann")
        await _fire(client, "bob")
        await _fire(client, "cy")  # ann's event is let go for room
        for unknown, user in ((_id(too_old), "dee"), ("0" * 32, "eve"), ("from-another-worker", "fay")):
            live: list[dict[str, Any]] = []

            async def publish_live(user: str = user, into: list[dict[str, Any]] = live) -> None:
                into.extend(await _fire(client, user))

            frames = await _resume(client, unknown, events=1, live=publish_live)
            kind, frame_id, data = frames[0]
            assert (kind, frame_id, data["reason"]) == ("reset", None, "last_event_id_not_held")
            assert _triggers(frames[1:]) == live


async def test_a_replay_holds_only_the_callers_tenant(memory: Memory) -> None:
    app = create_app(memory)
    async with _client(app) as client:
        [seen] = await _fire(client, "ann", tenant="acme")
        others = await _fire(client, "ann", tenant="globex") + await _fire(client, "bob", tenant="globex")
        missed = await _fire(client, "bob", tenant="acme")
        frames = await _resume(client, _id(seen), events=10, tenant="acme")
        assert _triggers(frames) == missed
        # Another tenant's id read on this tenant's stream replays nothing of either: not held here.
        frames = await _resume(client, _id(others[0]), events=10, tenant="acme")
        assert [frame[0] for frame in frames] == ["reset"]


async def test_a_replay_after_a_forget_holds_nothing_of_the_forgotten_user(memory: Memory) -> None:
    app = create_app(memory)
    async with _client(app) as client:
        [seen] = await _fire(client, "ann")
        forgotten = await _ingest_all(client, KAYAK, user="kim", chat="kim-trips")
        kept = await _fire(client, "tom")
        forgotten += await _fire(client, "kim")
        response = await client.post("/v1/forget", json={"user_id": "kim"})
        assert response.status_code == 200, response.text
        frames = await _resume(client, _id(seen), events=10)
        assert _triggers(frames) == kept
        # The forgotten user's id is no longer held: a resume from it is a reset, not a replay.
        frames = await _resume(client, _id(forgotten[0]), events=10)
        assert [frame[0] for frame in frames] == ["reset"]


class NotKim:
    """A store in which kim was forgotten by another worker (the hub never heard of it)."""

    async def cited(self, event: TriggerEvent) -> tuple[int, ...]:
        return ()

    async def stands(self, event: TriggerEvent, cited: tuple[int, ...]) -> bool:
        return event.user_id != "kim"


async def test_a_replayed_event_is_checked_against_the_store_as_a_live_one() -> None:
    hub = TriggerHub(None, NotKim())
    fired = [
        TriggerEvent(kind="emotion", label="tired", count=3, user_id=user, chat_id="dm", message_ids=[user])
        for user in ("ann", "kim", "tom")
    ]
    for event in fired:
        await hub.publish(event)
    stream = hub.stream(
        "default", max_events=None, idle_timeout=0.3, keepalive=5, last_event_id=event_id(fired[0])
    )
    assert [TriggerEvent.model_validate(e) for e in await _unread(stream)] == [fired[2]]
    # Nothing held for a stream that did not ask to resume.
    assert await _unread(await _subscribed(hub)) == []


@pytest.mark.parametrize(
    "value",
    [b"a" * 201, b"abc\x01def", b"tab\there", b"del\x7f", "caf\u00e9".encode("latin-1")],
    ids=["too-long", "control", "tab", "delete", "not-ascii"],
)
async def test_a_malformed_last_event_id_is_422_naming_the_header(memory: Memory, value: bytes) -> None:
    app = create_app(memory)
    async with _client(app) as client:
        response = await client.get(
            "/v1/events", params={"max_events": 1, "idle_seconds": 0.2}, headers={"Last-Event-ID": value}
        )
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "Last-Event-ID"
        assert response.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"]


def _fired(user: str, tenant: str = "default") -> TriggerEvent:
    return TriggerEvent(
        kind="emotion", label="tired", count=3, tenant=tenant, user_id=user, chat_id="dm", message_ids=[user]
    )


async def _resumed(hub: TriggerHub, tenant: str | None, last: TriggerEvent) -> list[TriggerEvent]:
    stream = hub.stream(tenant, max_events=None, idle_timeout=0.3, keepalive=5, last_event_id=event_id(last))
    return [TriggerEvent.model_validate(event) for event in await _unread(stream)]


class SlowCites:
    """What an event cites is read from the store: a publication waits there, as on a busy one."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()

    async def cited(self, event: TriggerEvent) -> tuple[int, ...]:
        await self.answer.wait()
        return ()

    async def stands(self, event: TriggerEvent, cited: tuple[int, ...]) -> bool:
        return True


async def test_an_event_published_as_a_stream_resumes_comes_once() -> None:
    check = SlowCites()
    hub = TriggerHub(None, check)
    check.answer.set()
    before = _fired("ann")
    await hub.publish(before)
    check.answer.clear()
    meanwhile = _fired("bob")
    publishing = asyncio.ensure_future(hub.publish(meanwhile))
    await asyncio.sleep(0.05)  # waiting on the store
    stream = hub.stream(None, max_events=None, idle_timeout=0.3, keepalive=5, last_event_id=event_id(before))
    assert (await anext(stream)).startswith(": narrmem")  # subscribed, the held events read
    check.answer.set()
    await publishing
    assert [TriggerEvent.model_validate(event) for event in await _unread(stream)] == [meanwhile]
    assert await _resumed(hub, None, before) == [meanwhile]


async def test_a_stream_of_every_tenant_resumes_in_order_and_the_hold_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events, "RECENT_TOTAL", 4, raising=False)
    hub = TriggerHub()
    fired = [_fired("ann", "acme"), _fired("bob", "globex"), _fired("cy", "acme"), _fired("dee", "globex")]
    for event in fired:
        await hub.publish(event)
    assert await _resumed(hub, None, fired[0]) == fired[1:]
    assert await _resumed(hub, "globex", fired[1]) == fired[3:]
    # Past the bound acme, quiet the longest, lets go of its oldest: a resume from it is a reset.
    await hub.publish(_fired("eve", "globex"))
    assert await _begins(hub, "acme", fired[0]) == "event: reset"
    assert await _resumed(hub, "acme", fired[2]) == []
    assert await _resumed(hub, None, fired[1]) == [*fired[2:], _fired("eve", "globex")]
    # And of its last: a stream of every tenant cannot resume from before it without a gap.
    await hub.publish(_fired("fay", "globex"))
    assert await _begins(hub, None, fired[1]) == "event: reset"
    assert await _resumed(hub, "globex", fired[1]) == [
        fired[3],
        _fired("eve", "globex"),
        _fired("fay", "globex"),
    ]


async def _begins(hub: TriggerHub, tenant: str | None, last: TriggerEvent) -> str:
    """The first line of a resumed stream's first frame after its opening comment."""
    stream = hub.stream(tenant, max_events=None, idle_timeout=0.3, keepalive=5, last_event_id=event_id(last))
    assert (await anext(stream)).startswith(": narrmem")
    first = await anext(stream)
    await stream.aclose()
    return first.split("\n", 1)[0]


async def test_a_stream_that_falls_behind_is_told_before_what_it_gets_next() -> None:
    """A stream's queue keeps its newest STREAM_QUEUE events: a reader slower than that lost the
    oldest without a word, and its next Last-Event-ID was past the gap, so no resume could bring
    them back. It is now sent a reset first."""
    fired = [_fired(f"u{n}") for n in range(events.STREAM_QUEUE + 5)]
    check = SlowCites()
    check.answer.set()
    hub = TriggerHub(None, check)
    stream = await _subscribed(hub)
    for event in fired:
        await hub.publish(event)
    frames = []
    async for chunk in stream:
        if chunk.startswith("event:"):
            frames.append(chunk)
    kinds = [frame.split("\n", 1)[0] for frame in frames]
    assert kinds[0] == "event: reset" and "stream_fell_behind" in frames[0]
    received = [TriggerEvent.model_validate(json.loads(f.split("data: ", 1)[1])) for f in frames[1:]]
    assert received == fired[5:]
    # What it lost is still held: a resume from the last id it saw before the gap brings it back.
    assert await _resumed(hub, None, fired[0]) == fired[1:]


async def test_a_webhook_down_for_long_is_sent_the_latest_events_when_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its queue full (an endpoint that takes each event seconds to fail), the newest event was
    dropped: when the endpoint came back it was sent events hours old, and what happened during
    the outage was lost. The oldest goes now, and the metrics count both outcomes."""
    monkeypatch.setattr(events, "WEBHOOK_QUEUE", 3)
    posted: list[str] = []
    back = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_posted_json(reader)
        if not back.is_set():
            await answer_status(writer, 503)
            return
        posted.append(body["event"]["user_id"])
        await answer_status(writer, 200)

    receiver = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = receiver.sockets[0].getsockname()[1]
    check = SlowCites()
    check.answer.set()
    hub = TriggerHub(WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=30, backoff=0.05), check)
    try:
        for n in range(8):
            await hub.publish(_fired(f"u{n}"))
        back.set()
        await hub.drain(10)
        # The newest three were kept (and the first, if the sender had taken it before the rest).
        assert posted[-3:] == ["u5", "u6", "u7"] and set(posted) <= {"u0", "u5", "u6", "u7"}
        assert (hub.delivered, hub.dropped) == (len(posted), 8 - len(posted))
    finally:
        await hub.close()
        receiver.close()
