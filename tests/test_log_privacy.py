"""What narrmem logs names no one: a log is kept by the bot's host, where a forget never reaches.
A trigger's label (a person's own words: a topic, a value's sentence) was logged at WARNING at
every webhook failure, a plugin's error quoting a graph node's name at ERROR, and the ids of a
person who asked to be forgotten at ERROR when the forget failed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem import InputError, hookimpl
from narrmem.doors.integrations import _common
from narrmem.doors.server import WebhookOptions
from narrmem.doors.server.events import TriggerHub, event_id
from narrmem.models import TriggerEvent
from narrmem.testing import open_memory

SAID = "I'd never forgive Jonathan for leaving"


async def test_a_webhook_that_fails_is_logged_by_the_events_id_not_its_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event = TriggerEvent(
        kind="value", label=SAID, count=3, user_id="kim-secret", chat_id="dm", message_ids=["m1"]
    )
    hub = TriggerHub(WebhookOptions(url="http://127.0.0.1:9/hook", attempts=1, backoff=0.01, timeout=2))
    with caplog.at_level(logging.WARNING):
        await hub.publish(event)
        await hub.drain(10)
        await hub.close()
    assert "not delivered" in caplog.text and event_id(event) in caplog.text
    assert "Jonathan" not in caplog.text and "kim-secret" not in caplog.text


class _QuotesWhatWasSaid:
    narrmem_name = "quotes"

    @hookimpl
    async def narrmem_after_store(self, **_: Any) -> None:
        raise InputError(f"node '{SAID}' is an EntityNode, not a StateNode", field="object_type")


async def test_a_plugins_error_is_logged_by_its_kind_its_words_at_debug_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_memory(tmp_path / "m", plugins=[_QuotesWhatWasSaid()]) as memory:
        with caplog.at_level(logging.DEBUG, logger="narrmem"):
            await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="kim-secret"))
            await memory.settle()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("plugin 'quotes' failed in narrmem_after_store: InputError" in line for line in errors)
    assert not any("Jonathan" in line for line in errors)
    assert any("Jonathan" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


async def test_a_forget_that_fails_in_a_bot_logs_no_id_of_the_person(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_memory(tmp_path / "m") as memory:

        async def failing(**_: Any) -> dict[str, int]:
            raise ConnectionError("the store went away")

        memory.forget = failing  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING):
            reply = await _common.forget_user(
                memory, tenants=["default"], user_id="kim-secret", aliases=["tg:77"]
            )
    assert "could not forget" in reply
    assert "could not forget a user" in caplog.text
    assert "kim-secret" not in caplog.text and "tg:77" not in caplog.text
