"""Liveness and readiness over HTTP: what a supervisor, a container orchestrator or a load balancer
in front of several workers asks. There was neither: the only way to tell a worker was up was a
call that needed a key, and a worker that had begun to stop still looked as ready as any."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import free_port, msg, narrmem_serve
from _postgres import fresh_database

from narrmem.doors.server import KeyFile, KeyRing, create_app, health
from narrmem.testing import open_memory

SERVE = [sys.executable, "-m", "narrmem.doors.cli", "serve"]


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://narrmem.test")


async def test_a_serving_worker_is_alive_and_ready_without_a_key(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    KeyFile(folder).create("acme")
    async with open_memory(folder) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="alice-secret"))
        app = create_app(memory, keys=KeyRing.in_folder(folder, reload_seconds=0))
        async with _client(app) as client:
            assert (await client.get("/v1/stats")).status_code == 401  # the rest needs a key
            alive = await client.get("/healthz")
            ready = await client.get("/readyz")
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert "alice" not in alive.text + ready.text


async def test_a_worker_that_begins_to_stop_is_not_ready_but_still_alive(tmp_path: Path) -> None:
    """A load balancer sends no more requests to a worker that is stopping: it finishes its own."""
    async with open_memory(tmp_path / "m") as memory:
        app = create_app(memory)
        async with _client(app) as client:
            app.state.narrmem.hub.stop_streams()  # what `narrmem serve` does on SIGTERM
            ready = await client.get("/readyz")
            alive = await client.get("/healthz")
    assert ready.status_code == 503 and ready.json()["detail"] == "the server is stopping"
    assert ready.headers["Retry-After"] == "1"
    assert alive.status_code == 200


async def test_a_closed_memory_or_a_store_that_does_not_answer_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = await open_memory(tmp_path / "m")
    app = create_app(memory)
    async with _client(app) as client:
        original = memory.store.state_get
        answers = asyncio.Event()

        async def stuck(*args: Any, **kwargs: Any) -> Any:
            # A PostgreSQL that has stalled: its driver's read does not end when cancelled (the
            # first probe waited for it, as long as the stall lasted).
            while not answers.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await answers.wait()
            return await original(*args, **kwargs)

        monkeypatch.setattr(health, "READY_WITHIN_S", 0.2)
        monkeypatch.setattr(memory.store, "state_get", stuck)
        slow = await asyncio.wait_for(client.get("/readyz"), 5)
        again = await asyncio.wait_for(client.get("/readyz"), 1)  # no second read behind the first
        monkeypatch.setattr(memory.store, "state_get", original)
        answers.set()
        await asyncio.sleep(0.05)
        assert again.status_code == 503
        assert (await client.get("/readyz")).status_code == 200
        await memory.close()
        closed = await client.get("/readyz")
    assert slow.status_code == 503 and "did not answer within 0.2 s" in slow.json()["detail"]
    assert closed.status_code == 503 and closed.json()["detail"] == "the memory is closed"


async def test_a_worker_whose_postgresql_went_away_is_not_ready(tmp_path: Path) -> None:
    storage = {"backend": "postgres", "dsn": await fresh_database("health")}
    async with open_memory(tmp_path / "m", storage=storage) as memory:
        app = create_app(memory)
        async with _client(app) as client:
            assert (await client.get("/readyz")).status_code == 200
            await memory.store.pool.close()  # type: ignore[attr-defined]
            gone = await client.get("/readyz")
    assert gone.status_code == 503 and gone.json()["detail"].startswith("the store cannot be read")


def test_narrmem_serve_answers_readyz(tmp_path: Path) -> None:
    """The real server, as a probe reaches it."""
    port = free_port()
    with narrmem_serve(tmp_path / "m", port):
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
    assert (answer.status_code, answer.json()) == (200, {"status": "ready"})


def test_a_worker_asked_to_stop_answers_not_ready_while_it_drains(tmp_path: Path) -> None:
    """SIGTERM closed the listener at once: a load balancer's next probe met a refused connection,
    with no moment in which the worker said it was stopping. With --drain-seconds it goes on
    serving that long, /readyz answering 503, then stops and exits 0."""
    import signal
    import time

    port = free_port()
    with narrmem_serve(tmp_path / "m", port, "--drain-seconds", "2") as server:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
        asked = time.monotonic()
        server.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        draining = httpx.get(f"{base}/readyz", timeout=10)
        served = httpx.get(f"{base}/v1/stats", timeout=10)
        assert server.wait(timeout=30) == 0
        took = time.monotonic() - asked
    assert draining.status_code == 503 and draining.json()["detail"] == "the server is stopping"
    assert served.status_code == 200
    assert 1.5 < took < 20


async def test_a_500_answer_leaves_the_connection_usable(tmp_path: Path) -> None:
    """Answered by Starlette's outermost handler, an unexpected error was raised again after its
    500, and uvicorn closed the connection: the client's next request on it failed (20 of 30 while
    a PostgreSQL was down)."""
    import uvicorn

    async with open_memory(tmp_path / "m") as memory:
        app = create_app(memory)

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionResetError("the database went away")

        memory.store.users = broken  # type: ignore[method-assign]
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off")
        )
        serving = asyncio.ensure_future(server.serve())
        try:
            for _ in range(500):  # until it listens
                if server.started:
                    break
                await asyncio.sleep(0.01)
            # One connection, as a client's pool keeps it: a request, its answer, the next request.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answers = []
            for path in ("/v1/users", "/healthz", "/v1/users", "/healthz"):
                writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                await writer.drain()
                answers.append(await _answer(reader))
            writer.close()
            assert [status for status, _ in answers] == [500, 200, 500, 200]
            assert json.loads(answers[0][1])["detail"].startswith("internal error")
        finally:
            server.should_exit = True
            await serving


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """An HTTP/1.1 answer's status and body (by its Content-Length); (0, b"") when the connection
    was closed instead."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) if not reader.at_eof() else b""
    if not head:
        return 0, b""
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length"))
    return int(lines[0].split()[1]), await reader.readexactly(length)
