"""A PostgreSQL that cannot be reached: every call fails with ``StoreUnavailableError`` (503 with
``Retry-After`` over HTTP), within ``storage.timeout_s`` when the server stalls, and the store
works again when the server is back. Before, the same outage answered 409, 500 and 501 by route,
and 200 with nothing in it (patterns, decay), which a bot could not tell from "nothing is stored";
a stalled server held every call for good.

A real server behind a TCP proxy of the test's, which can end every connection and refuse new ones
(a server down or failing over) or pass no byte either way (a server that stalls)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from _helpers import msg
from _pgproxy import behind_proxy
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.reach import unreachable

from narrmem import Memory, StoreError, StoreUnavailableError
from narrmem.doors.server import create_app
from narrmem.errors import PluginError
from narrmem.testing import open_memory

# Every route that reads or writes the store, with a valid request.
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/ingest", {"json": msg("3", "I started learning the cello", user="ann")}),
    ("POST", "/v1/recall", {"json": {"query": "greyhound", "scope": {"user_id": "ann"}}}),
    ("POST", "/v1/context", {"json": {"text": "pets?", "user_id": "ann"}}),
    ("POST", "/v1/turn-context", {"json": {"text": "my pet", "user_id": "ann", "chat_id": "c1"}}),
    ("GET", "/v1/patterns", {"params": {"user_id": "ann"}}),
    ("GET", "/v1/summary", {"params": {"user_id": "ann"}}),
    ("GET", "/v1/users", {}),
    ("GET", "/v1/tenants", {}),
    ("GET", "/v1/stats", {}),
    ("GET", "/v1/export", {}),
    ("GET", "/v1/memories/1/history", {}),
    ("POST", "/v1/forget", {"json": {"user_id": "bob"}}),
    ("POST", "/v1/messages/delete", {"json": {"chat_id": "c1", "message_ids": ["9"]}}),
    ("POST", "/v1/decay", {"json": {}}),
    ("POST", "/v1/edit", {"json": msg("2", "I moved to Porto last spring", user="ann")}),
]


async def _answers(memory: Memory) -> dict[str, httpx.Response]:
    transport = httpx.ASGITransport(create_app(memory))
    async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test", timeout=60) as client:
        return {path: await client.request(method, path, **kw) for method, path, kw in ROUTES}


async def test_every_route_answers_503_while_the_server_is_down_and_works_once_it_is_back(
    tmp_path: Path,
) -> None:
    async with behind_proxy(tmp_path) as (memory, proxy):
        proxy.cut()
        answers = await _answers(memory)
        wrong = {path: (a.status_code, a.text[:80]) for path, a in answers.items() if a.status_code != 503}
        assert not wrong
        for answer in answers.values():
            assert answer.headers["Retry-After"].isdigit() and answer.json()["detail"]
        with pytest.raises(StoreUnavailableError):
            await memory.ingest(msg("3", "I started learning the cello", user="ann"))
        with pytest.raises(StoreUnavailableError):
            await memory.patterns(user_id="ann")

        proxy.mode = "pass"  # back: the pool opens new sessions, nothing was lost
        again = await memory.ingest(msg("3", "I started learning the cello", user="ann"))
        assert again.stored
        assert (await memory.ingest(msg("3", "I started learning the cello", user="ann"))).duplicate
        await memory.settle()
        hits = await memory.recall("learning the cello", user_id="ann", reinforce=False)
        assert any("cello" in hit.text for hit in hits), [h.text for h in hits]
        dog = await memory.recall("my greyhound", user_id="ann", reinforce=False)
        assert any("greyhound" in hit.text for hit in dog)


async def test_a_stalled_server_fails_each_call_within_the_time_limit(tmp_path: Path) -> None:
    async with behind_proxy(tmp_path, timeout_s=1.0) as (memory, proxy):
        proxy.mode = "stall"
        calls = {
            "ingest": memory.ingest(msg("3", "I started learning the cello", user="ann")),
            "recall": memory.recall("greyhound", user_id="ann", reinforce=False),
            "forget": memory.forget(user_id="bob"),
            "users": memory.users(),
            "patterns": memory.patterns(user_id="ann"),
        }
        for name, call in calls.items():
            # Without the limit these wait for as long as the server stalls (here, for good).
            with pytest.raises(StoreUnavailableError, match="within 1 s"):
                await asyncio.wait_for(call, 30)
            assert name
        proxy.mode = "pass"
        assert (await memory.ingest(msg("3", "I started learning the cello", user="ann"))).stored
        assert await memory.recall("greyhound", user_id="ann", reinforce=False)


async def test_refusals_stay_store_errors_and_are_not_unavailable(tmp_path: Path) -> None:
    """A missing database is a refusal: trying again gives the same answer (409, not 503)."""
    dsn = await fresh_database("refused")
    missing = dsn.replace("/refused_", "/no_such_database_", 1)
    with pytest.raises(StoreError) as refused:
        async with open_memory(tmp_path / "m", storage={"backend": "postgres", "dsn": missing}):
            pass
    assert not isinstance(refused.value, StoreUnavailableError)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError(), True),
        (asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"), True),
        (asyncpg.CannotConnectNowError("the database system is starting up"), True),
        (asyncpg.TooManyConnectionsError("sorry, too many clients already"), True),
        (asyncpg.InterfaceError("connection is closed"), True),
        (asyncpg.InterfaceError("pool is closing"), True),
        (asyncpg.UniqueViolationError("duplicate key"), False),
        (asyncpg.InvalidPasswordError("password authentication failed"), False),
        (asyncpg.InterfaceError("cannot perform operation: another operation is in progress"), False),
        (ValueError("bad"), False),
        (asyncio.CancelledError(), False),
    ],
)
def test_what_counts_as_unreachable(error: BaseException, expected: bool) -> None:
    assert unreachable(error) is expected


async def test_an_isolated_hook_does_not_hide_an_unreachable_store(tmp_path: Path) -> None:
    """The host isolates a plugin's failure (left out of the answer), but not an unreachable
    store: the answer would pass for "nothing stored"."""
    from narrmem import hookimpl

    class Unreachable:
        @hookimpl
        def narrmem_patterns(self, memory: Any, user: Any, now: Any) -> Any:
            raise StoreUnavailableError("the database is down")

    class Broken:
        @hookimpl
        def narrmem_patterns(self, memory: Any, user: Any, now: Any) -> Any:
            raise RuntimeError("a bug")

    async with open_memory(tmp_path / "m") as memory:
        memory.host.pm.register(Broken(), name="broken")
        await memory.patterns(user_id="ann")  # a plugin's bug: isolated, reported
        assert any(name == "broken" for name, _, _ in memory.host.errors)
        memory.host.pm.register(Unreachable(), name="unreachable")
        with pytest.raises(StoreUnavailableError):
            await memory.patterns(user_id="ann")
        with pytest.raises(StoreUnavailableError):
            await memory.host.call_every("narrmem_patterns", memory=memory, user=None, now=None)
        memory.host.pm.unregister(name="unreachable")

        class UnreachableAfterTheWork:
            @hookimpl
            def narrmem_after_store(self) -> None:
                raise StoreUnavailableError("the database went away after the write")

        # After the call's work (the message is written): isolated as any failure, since a retry
        # would find the message stored and run no hook.
        memory.host.pm.register(UnreachableAfterTheWork(), name="after_the_work")
        assert (await memory.ingest(msg("5", "I sing in a choir on Tuesdays", user="ann"))).stored
        assert any(name == "after_the_work" for name, _, _ in memory.host.errors)
        with pytest.raises(PluginError, match="broken"):  # any other failure of a hook that must all run
            await memory.host.call_every("narrmem_patterns", memory=memory, user=None, now=None)


def test_the_command_line_exits_75_when_the_store_cannot_be_reached(tmp_path: Path) -> None:
    """A backup job or a script told "try again later" (sysexits' EX_TEMPFAIL), not 2 ("your input
    is wrong"), when PostgreSQL is down; a refusal stays 2."""
    import socket

    from _helpers import run_narrmem

    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {
        "NARRMEM_STORAGE__BACKEND": "postgres",
        "NARRMEM_STORAGE__DSN": f"postgresql://postgres@127.0.0.1:{port}/narrmem",
        "NARRMEM_STORAGE__TIMEOUT_S": "5",
    }
    done = run_narrmem("stats", "--data", str(tmp_path / "d"), cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 75, done.stderr
    assert "cannot be reached" in done.stderr and "try again later" in done.stderr


async def test_an_import_waiting_for_another_importer_is_not_cut_by_the_time_limit(tmp_path: Path) -> None:
    """timeout_s is for a stalled server, not for statements whose length is the data's or another
    importer's: an import waits for the one before it (its table lock), however long."""
    from datetime import UTC, datetime

    import numpy as np
    from narrmem_plugins.storage_postgres.store import PostgresStore

    from narrmem.models import MemoryRecord

    dsn = await fresh_database("import_waits")
    # A limit the statements after the wait keep to on a loaded machine (the suite runs on two
    # workers), and a wait well over it.
    store = PostgresStore(dsn, timeout_s=0.6)
    await store.open(dim=4, model="m")
    try:
        other = await asyncpg.connect(dsn)  # another importer, holding the lock for a while
        try:
            taken = other.transaction()
            await taken.start()
            await other.execute("LOCK TABLE memories IN SHARE ROW EXCLUSIVE MODE")
            vector = np.ones(4, dtype=np.float32) / 2
            record = MemoryRecord(
                kind="episode",
                user_id="u",
                chat_id="c",
                text="kept",
                message_ids=["m1"],
                created_at=datetime.now(UTC),
            )
            importing = asyncio.ensure_future(store.import_records([(record, vector)]))
            await asyncio.sleep(2.0)  # over three times the limit
            assert not importing.done()
            await taken.rollback()
        finally:
            await other.close()
        assert await asyncio.wait_for(importing, 10) == {"imported": 1, "skipped": 0}
    finally:
        await store.close()


async def test_a_forget_waiting_at_the_fence_of_a_stalled_server_ends(tmp_path: Path) -> None:
    """A forget's session waits at the fence for the other workers' writes, as long as they take;
    but one kept from an earlier forget waited for good once the server stalled. The server is
    asked whether it still answers while it waits."""
    async with behind_proxy(tmp_path, timeout_s=1.0) as (memory, proxy):
        await memory.forget(user_id="bob")  # its session is kept for the next forget
        proxy.mode = "stall"
        with pytest.raises(StoreUnavailableError, match="within 1 s"):
            await asyncio.wait_for(memory.forget(user_id="ann"), 30)
        proxy.mode = "pass"
        assert (await memory.forget(user_id="ann"))["memories"] == 2
