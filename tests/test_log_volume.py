"""How much narrmem logs when something goes wrong for a long time (narrmem/logs.py): a kind of
line at most a few times a minute, then how many were held back; no traceback for an expected
failure. Before, a bot whose PostgreSQL went away logged a full traceback (two, chained) for every
message's recall, and a plugin failing on every message an ERROR per message: at 10 messages a
second, 36,000 of each an hour."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from _pgproxy import behind_proxy

from narrmem import hookimpl, logs
from narrmem.doors.integrations._common import turn_context
from narrmem.errors import InputError, StoreUnavailableError
from narrmem.models import Message
from narrmem.testing import open_memory


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    ticking = _Clock()
    monkeypatch.setattr(logs.REPEATS, "clock", ticking)
    return ticking


def _lines(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(start)]


async def test_a_store_away_is_said_a_few_times_a_minute_without_tracebacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, clock: _Clock
) -> None:
    caplog.set_level(logging.WARNING)
    async with behind_proxy(tmp_path, timeout_s=2) as (memory, proxy):
        proxy.cut()
        for i in range(20):
            message = Message(**msg(f"q{i}", "what is my dog called?", user="ann"))
            pack = await turn_context(memory, message, k=5, scope="user")
            assert pack.hits == []  # the bot goes on without memories
        said = _lines(caplog, "narrmem could not recall for a message")
        assert len(said) == logs.BURST
        # The store's own words say why (no password in them), without a traceback.
        assert all(
            r.exc_info is None and "(StoreUnavailableError: PostgreSQL at " in r.getMessage() for r in said
        )
        assert "more like this in the next 60 s are not shown" in said[-1].getMessage()
        clock.now += logs.WINDOW_S
        await turn_context(memory, Message(**msg("q99", "and my cat?", user="ann")), k=5, scope="user")
        said = _lines(caplog, "narrmem could not recall for a message")
        assert len(said) == logs.BURST + 1
        assert "[15 more like this before were not shown]" in said[-1].getMessage()
        assert not [r for r in caplog.records if r.exc_info and r.name.startswith("narrmem")]


class _FailsEveryTime:
    narrmem_name = "fails_every_time"

    @hookimpl
    def narrmem_after_store(self, message: Any) -> None:
        raise RuntimeError("this plugin is broken")


class _FailsOnce:
    narrmem_name = "fails_once"

    @hookimpl
    def narrmem_after_store(self, message: Any) -> None:
        if message.message_id == "20":
            raise RuntimeError("this plugin failed once")


async def test_a_plugin_failing_on_every_message_is_said_a_few_times_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, clock: _Clock
) -> None:
    caplog.set_level(logging.WARNING)
    async with open_memory(tmp_path / "m", plugins=[_FailsEveryTime(), _FailsOnce()]) as memory:
        for i in range(30):
            await memory.ingest(msg(str(i), f"I decided to adopt a greyhound, day {i}", user="ann"))
        said = _lines(caplog, "plugin 'fails_every_time' failed in narrmem_after_store")
        assert len(said) == logs.BURST
        # Another plugin's failure is not hidden behind the first one's.
        assert len(_lines(caplog, "plugin 'fails_once' failed in narrmem_after_store")) == 1
        assert len(memory.host.errors) == 31  # every failure is still counted where it is kept


def test_kinds_levels_and_loggers_are_counted_apart(caplog: pytest.LogCaptureFixture, clock: _Clock) -> None:
    caplog.set_level(logging.DEBUG)
    one, other = logs.logger("narrmem.test_one"), logs.logger("narrmem.test_other")
    for _ in range(20):
        one.warning("the webhook at %s did not answer", "http://hook.example")
        one.warning("another kind of line")
        other.warning("the webhook at %s did not answer", "http://hook.example")
        one.error("the webhook at %s did not answer", "http://hook.example")
        one.info("an info line passes every time")
    shown = [(r.name, r.levelno, r.msg.split(" [")[0]) for r in caplog.records]
    assert (
        shown.count(("narrmem.test_one", logging.WARNING, "the webhook at %s did not answer")) == logs.BURST
    )
    assert shown.count(("narrmem.test_one", logging.WARNING, "another kind of line")) == logs.BURST
    assert (
        shown.count(("narrmem.test_other", logging.WARNING, "the webhook at %s did not answer")) == logs.BURST
    )
    assert shown.count(("narrmem.test_one", logging.ERROR, "the webhook at %s did not answer")) == logs.BURST
    assert shown.count(("narrmem.test_one", logging.INFO, "an info line passes every time")) == 20
    # The note goes after the line, formatted with its arguments.
    assert next(r.getMessage() for r in caplog.records if "not shown" in r.getMessage()).startswith(
        "the webhook at http://hook.example did not answer [more like this"
    )


def test_an_unexpected_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture, clock: _Clock) -> None:
    caplog.set_level(logging.WARNING)
    log = logs.logger("narrmem.test_tracebacks")
    try:
        raise KeyError("a bug")
    except KeyError:
        log.exception("something unexpected")
    try:
        try:
            raise OSError("connection reset")
        except OSError as exc:
            raise StoreUnavailableError("the store went away") from exc
    except StoreUnavailableError:
        log.exception("an expected failure")
    unexpected, expected = caplog.records
    assert unexpected.exc_info is not None
    assert expected.exc_info is None
    assert expected.getMessage() == "an expected failure (StoreUnavailableError: the store went away)"


def test_the_kinds_remembered_are_bounded(clock: _Clock) -> None:
    log = logs.logger("narrmem.test_bounded")
    for i in range(logs.KINDS_KEPT * 2):
        log.warning(f"a line built with its value in it: {i}")
    assert len(logs.REPEATS) <= logs.KINDS_KEPT


async def test_a_server_answering_500_or_501_says_so_in_its_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, both answers left no line: a model process that kept dying failed every request
    # with nothing in the operator's log.
    import httpx

    from narrmem.doors.server import create_app
    from narrmem.errors import ModelProcessError, PluginError

    caplog.set_level(logging.WARNING)
    async with open_memory(tmp_path / "m") as memory:
        app = create_app(memory)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            for error, status in (
                (ModelProcessError("the model's process ended"), 500),
                (PluginError("no rtm"), 501),
            ):

                async def fails(*args: Any, error: Exception = error, **kwargs: Any) -> Any:
                    raise error

                monkeypatch.setattr(memory, "recall", fails)
                answer = await client.post(
                    "/v1/recall", json={"query": "ann's dog", "scope": {"user_id": "ann"}}
                )
                assert answer.status_code == status
    said = [r.getMessage() for r in caplog.records if r.name == "narrmem.server"]
    assert said == [
        "POST /v1/recall answered 500: ModelProcessError",
        "POST /v1/recall answered 501: PluginError",
    ]


def test_a_bug_met_while_handling_an_expected_failure_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture, clock: _Clock
) -> None:
    caplog.set_level(logging.WARNING)
    log = logs.logger("narrmem.test_context")
    try:
        try:
            raise StoreUnavailableError("the store went away")
        except StoreUnavailableError:
            {}["missing"]  # a bug in the handling
    except KeyError:
        log.exception("could not do it")
    try:
        raise InputError("must be at most 16000 characters: 'what a person said'", field="text", line=3)
    except InputError:
        log.exception("could not do it")
    bug, refused = caplog.records
    assert bug.exc_info is not None and bug.getMessage() == "could not do it"
    # A refusal keeps where it is, not its text (which may quote the input).
    assert (
        refused.exc_info is None
        and refused.getMessage() == "could not do it (InputError in field 'text', line 3)"
    )


def test_lines_named_by_their_kind_and_the_switch(caplog: pytest.LogCaptureFixture, clock: _Clock) -> None:
    caplog.set_level(logging.WARNING)
    log = logs.logger("narrmem.test_named")
    for i in range(20):
        log.warning("trigger %s dropped", f"id-{i:04d}", extra={"repeats_as": "mood"})
    assert len(caplog.records) == logs.BURST  # one kind, though each line names another event
    caplog.clear()
    logs.REPEATS.burst = 0
    try:
        for _ in range(20):
            log.warning("every line passes")
    finally:
        logs.REPEATS.burst = logs.BURST
    assert len(caplog.records) == 20
