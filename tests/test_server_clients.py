"""The HTTP API as clients in other languages use it: JSON as Go's and JavaScript's encoders write
it (``null`` for a nil slice or an unset field), requests sent again after a timeout, a body sent
without its Content-Type, and answers whose status says whether trying again can help."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from _helpers import msg, store_fingerprint

from narrmem.clock import ManualClock
from narrmem.doors.server import create_app
from narrmem.doors.server.app import RETRY_UNAVAILABLE_AFTER_S
from narrmem.errors import InputError
from narrmem.memory import Memory
from narrmem.models import Message, Scope
from narrmem.testing import open_memory

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


async def _client(memory: Memory) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(create_app(memory))
    async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
        yield client


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Memory, httpx.AsyncClient]]:
    async with open_memory(tmp_path, clock=ManualClock(NOW)) as memory:
        async for client in _client(memory):
            yield memory, client


async def test_asked_at_is_read_on_recall_and_context_as_the_senders_calendar(tmp_path: Path) -> None:
    """``asked_at`` on /v1/recall and /v1/context was refused whatever its value (422 "Input
    should be a valid datetime": a strict body takes a datetime object only, never JSON's text).
    Monday 20:00 at -07:00 is Tuesday in UTC: "yesterday" is the asker's Sunday, the park."""
    zone = timezone(timedelta(hours=-7))
    said = {
        "park": datetime(2026, 3, 8, 15, 0, tzinfo=zone),  # Sunday, the asker's
        "club": datetime(2026, 3, 9, 10, 0, tzinfo=zone),  # Monday
    }
    asked = datetime(2026, 3, 9, 20, 0, tzinfo=zone)
    clock = ManualClock(said["park"].astimezone(UTC))
    async with open_memory(tmp_path, real_model=True, clock=clock) as memory:
        for where, ts in said.items():
            clock.set(ts.astimezone(UTC))
            await memory.ingest(msg(where, f"played tennis with Sam at the {where}", ts=ts.isoformat()))
        clock.set(asked.astimezone(UTC))
        question = "what did I play with Sam yesterday?"
        async for client in _client(memory):
            recall = await client.post(
                "/v1/recall",
                json={"query": question, "scope": {"user_id": "u1"}, "asked_at": asked.isoformat()},
            )
            assert recall.status_code == 200, recall.text
            assert "park" in recall.json()[0]["text"]
            context = await client.post(
                "/v1/context", json={"user_id": "u1", "text": question, "asked_at": asked.isoformat()}
            )
            assert context.status_code == 200, context.text
            assert "park" in context.json()["hits"][0]["text"]
            # Still checked as a message's ts is: a time without its offset is named.
            naive = await client.post(
                "/v1/context", json={"user_id": "u1", "text": question, "asked_at": "2026-03-09T20:00:00"}
            )
            assert naive.status_code == 422 and naive.json()["field"] == "asked_at"


async def test_null_is_taken_as_left_out_where_a_field_has_a_default(
    served: tuple[Memory, httpx.AsyncClient],
) -> None:
    """Go encodes a nil slice or map as null, and an unset field as null: ``"meta": null``,
    ``"exclude_message_ids": null``, ``"tenant": null`` were each refused with a 422."""
    memory, client = served
    body = {**msg("m1", "I adopted a greyhound named Pixel"), "meta": None, "speaker": None, "tenant": None}
    stored = await client.post("/v1/ingest", json=body)
    assert stored.status_code == 200, stored.text
    assert stored.json()["stored"] is True
    [record] = (await memory.store.get(stored.json()["memory_ids"], None)).values()
    assert (record.tenant, record.meta.get("edits")) == ("default", None)
    context = await client.post(
        "/v1/context", json={"user_id": "u1", "text": "greyhound", "exclude_message_ids": None, "k": None}
    )
    assert context.status_code == 200, context.text
    assert [h["text"] for h in context.json()["hits"]] == [record.text]
    recall = await client.post(
        "/v1/recall", json={"query": "greyhound", "scope": {"user_id": "u1", "tenant": None}, "kinds": None}
    )
    assert recall.status_code == 200 and len(recall.json()) == 1
    # The Python API keeps a tenant of None an error: a bot whose tenant came out None by
    # mistake must not read or forget in the default tenant.
    with pytest.raises(InputError, match="tenant"):
        await memory.recall("greyhound", user_id="u1", tenant=None)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="tenant"):
        await memory.forget(user_id="u1", tenant=None)  # type: ignore[arg-type]
    # A field that has no default is still required: null is named, and nothing is written.
    before = await store_fingerprint(memory, keyword_tables=False)
    missing = await client.post("/v1/ingest", json={**msg("m2", "x"), "text": None})
    assert missing.status_code == 422 and missing.json()["field"] == "text"
    assert await store_fingerprint(memory, keyword_tables=False) == before


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_415_naming_the_content_type(
    served: tuple[Memory, httpx.AsyncClient], content_type: str | None
) -> None:
    """A body without its Content-Type (a raw request in Go leaves it out) was a 422 "Input
    should be a valid dictionary" with no field: the client could not tell what was wrong."""
    memory, client = served
    content = json.dumps(msg("m1", "I adopted a greyhound named Pixel")).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    before = await store_fingerprint(memory, keyword_tables=False)
    refused = await client.post("/v1/ingest", content=content, headers=headers)
    assert refused.status_code == 415, refused.text
    assert "Content-Type: application/json" in refused.json()["detail"]
    assert str(content_type) in refused.json()["detail"]
    assert await store_fingerprint(memory, keyword_tables=False) == before
    taken = await client.post(
        "/v1/ingest", content=content, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert taken.status_code == 200 and taken.json()["stored"] is True
    # A query parameter's error on a call without a body is still a 422 naming it.
    bad_query = await client.get("/v1/users", params={"limit": "many"})
    assert bad_query.status_code == 422


async def test_a_page_of_another_site_cannot_start_the_decay_pass(
    served: tuple[Memory, httpx.AsyncClient],
) -> None:
    """A form, or an empty body, is posted by any page without the browser asking first: with no
    body to check, ``/v1/decay`` ran the store-wide pass for it on a server without keys."""
    memory, client = served
    await client.post("/v1/ingest", json=msg("m1", "I adopted a greyhound named Pixel"))
    before = await store_fingerprint(memory, keyword_tables=False)
    site = {"origin": "https://elsewhere.example"}
    for headers, content in [
        ({"content-type": "application/x-www-form-urlencoded"}, b"a=1"),
        ({"content-type": "text/plain"}, b""),
        ({"content-type": "multipart/form-data; boundary=x"}, b"--x--"),
        ({}, b""),
    ]:
        refused = await client.post("/v1/decay", content=content, headers={**site, **headers})
        assert refused.status_code in (415, 422), (headers, refused.text)
    assert await store_fingerprint(memory, keyword_tables=False) == before  # no pass ran
    ran = await client.post("/v1/decay", json={})
    assert ran.status_code == 200 and ran.json()["memories"] >= 1
    assert (await client.post("/v1/decay", json={"now": "2027-01-01T00:00:00Z"})).status_code == 422


async def test_ids_left_out_of_a_context_are_checked_as_a_deletes_are(
    served: tuple[Memory, httpx.AsyncClient],
) -> None:
    """NUL, a lone surrogate, an empty or a 5,000-character id in ``exclude_message_ids`` were
    taken (200, a filter that matches nothing), where ``/v1/messages/delete`` refuses them."""
    _, client = served
    await client.post("/v1/ingest", json=msg("m1", "I adopted a greyhound named Pixel"))
    for bad in ("a\\u0000b", "\\ud800", "", "x" * 5000):
        body = f'{{"text": "my dog?", "user_id": "u1", "exclude_message_ids": ["m1", "{bad}"]}}'
        for path in ("/v1/context", "/v1/recall"):
            sent = (
                body
                if path == "/v1/context"
                else body.replace('"text"', '"query"').replace(
                    '"user_id": "u1"', '"scope": {"user_id": "u1"}'
                )
            )
            answer = await client.post(path, content=sent, headers={"content-type": "application/json"})
            assert answer.status_code == 422, (path, bad, answer.text)
            assert answer.json()["field"] == "exclude_message_ids[1]", answer.text
    good = await client.post(
        "/v1/context", json={"text": "my dog?", "user_id": "u1", "exclude_message_ids": ["m2"]}
    )
    assert good.status_code == 200


async def test_an_ingest_sent_again_names_the_memories_the_first_call_stored(
    served: tuple[Memory, httpx.AsyncClient],
) -> None:
    """A client whose first call timed out after the write sends it again: the answer said
    ``memory_ids: []``, and the ids (for mark-used, say) were lost to it."""
    _, client = served
    first = (await client.post("/v1/ingest", json=msg("m1", "I adopted a greyhound named Pixel"))).json()
    other = (await client.post("/v1/ingest", json=msg("m2", "I moved to Lisbon in March"))).json()
    assert first["stored"] and first["memory_ids"] and other["stored"]
    again = (await client.post("/v1/ingest", json=msg("m1", "I adopted a greyhound named Pixel"))).json()
    assert (again["duplicate"], again["stored"]) == (True, False)
    assert again["memory_ids"] == first["memory_ids"]
    batch = await client.post(
        "/v1/ingest/batch",
        json={"messages": [msg("m2", "I moved to Lisbon in March"), msg("m3", "my sister is called Ana")]},
    )
    [m2, m3] = batch.json()
    assert (m2["duplicate"], m2["memory_ids"]) == (True, other["memory_ids"])
    assert m3["stored"] and not set(m3["memory_ids"]) & set(first["memory_ids"] + other["memory_ids"])
    # Another chat's message of the same id is its own message, not a duplicate.
    elsewhere = (await client.post("/v1/ingest", json=msg("m1", "I adopted a cat", chat="c2"))).json()
    assert elsewhere["stored"] and not set(elsewhere["memory_ids"]) & set(first["memory_ids"])


async def test_a_closed_memory_is_503_with_retry_after(tmp_path: Path) -> None:
    """A worker stopping answered 503 without Retry-After, unlike every other 503."""
    memory = await open_memory(tmp_path, clock=ManualClock(NOW))
    async for client in _client(memory):
        await memory.close()
        answer = await client.post("/v1/recall", json={"query": "x", "scope": {"user_id": "u1"}})
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == str(RETRY_UNAVAILABLE_AFTER_S)


async def test_an_edit_date_that_cannot_be_compared_is_refused_naming_it(
    served: tuple[Memory, httpx.AsyncClient],
) -> None:
    """Telegram's ``edit_date`` is a number: sent as it came, it was taken as no date (200), and a
    late retry of an earlier edit replaced the newer text; an edit dated 2999 was the newest for
    ever, every later one refused as older. Both are a 422 naming ``meta.edited_at`` now, and the
    stored text stays."""
    memory, client = served
    await client.post("/v1/ingest", json=msg("m1", "I adopted a greyhound named Pixel"))
    before = await store_fingerprint(memory)
    undated = ("2026-06-01T11:02:00", "yesterday", {"at": 1})
    for bad in (1780315320, "1780315320", *undated, "2999-01-01T00:00:00Z"):
        body = {**msg("m1", "I adopted a greyhound named Rex"), "meta": {"edited_at": bad}}
        for path in ("/v1/edit", "/v1/ingest"):
            answer = await client.post(path, json=body)
            assert answer.status_code == 422, (path, bad, answer.text)
            assert "edited_at" in answer.text
    assert await store_fingerprint(memory) == before
    with pytest.raises(InputError) as error:
        await memory.edit({**msg("m1", "I adopted a greyhound named Rex"), "meta": {"edited_at": 1780315320}})
    assert error.value.field == "meta.edited_at"
    # Checked of what a caller hands in, not of what was stored before the check: a held
    # message or an owed hook's, rebuilt from the store, failed every later open.
    stored_before = {**msg("m1", "I adopted a greyhound named Rex"), "meta": {"edited_at": 1780315320}}
    assert Message.model_validate(stored_before).meta["edited_at"] == 1780315320
    later = await memory.edit(
        {**msg("m1", "I adopted a greyhound named Rex"), "meta": {"edited_at": "2026-06-02T11:02:00Z"}}
    )
    assert later.stored is True  # a day ahead at most, as ts
    too_far = {**msg("m1", "I adopted a greyhound named Max"), "meta": {"edited_at": "2026-06-05T11:02:00Z"}}
    with pytest.raises(InputError) as error:
        await memory.edit(too_far)
    assert error.value.field == "meta.edited_at"


async def test_an_older_edit_arriving_after_a_newer_one_changes_nothing(
    served: tuple[Memory, httpx.AsyncClient],
) -> None:
    """A client's edit timed out, the next edit of the message went through, then the first
    was sent again: it replaced the newer text with the older. Edits dated in ``meta.edited_at``
    (as the integrations date them) are now taken only when newer than the stored one."""
    memory, client = served

    def edit(text: str, at: str | None) -> dict[str, object]:
        return {**msg("m1", text), "meta": {} if at is None else {"edited_at": at}}

    await client.post("/v1/ingest", json=msg("m1", "I adopted a greyhound named Pixel"))
    newer = await client.post(
        "/v1/edit", json=edit("I adopted a greyhound named Rex", "2026-06-01T11:02:00Z")
    )
    assert newer.json()["stored"] is True
    older = await client.post(
        "/v1/edit", json=edit("I adopted a greyhound named Pixie", "2026-06-01T13:01:00+02:00")
    )
    assert older.status_code == 200 and older.json()["duplicate"] is True
    assert older.json()["memory_ids"] == newer.json()["memory_ids"]
    episodes = await memory.store.recent(Scope(user_id="u1"), limit=10)
    assert [r.text for r in episodes if r.kind == "episode"] == ["I adopted a greyhound named Rex"]
    # A later edit, and an undated one, are taken as always.
    latest = await client.post(
        "/v1/edit", json=edit("I adopted a greyhound named Max", "2026-06-01T11:05:00Z")
    )
    assert latest.json()["stored"] is True
    undated = await client.post("/v1/edit", json=edit("I adopted a greyhound named Bo", None))
    assert undated.json()["stored"] is True
