"""``narrmem serve`` stopping and holding on: SIGTERM and SIGINT close the memory and the webhook
queue and exit 0, an open event stream ends instead of holding the stop for ever, a revoked key's
stream ends, a webhook attempt is bounded as a whole, an export stops once its client is gone, and
slow clients cannot hold connections without bound."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import DB_NAME, answer_status, msg, read_posted_json

from narrmem.clock import ManualClock
from narrmem.doors.server import KeyFile, KeyRing, WebhookOptions, create_app
from narrmem.doors.server.events import TriggerHub
from narrmem.doors.transfer import export_store
from narrmem.inbox import NAMESPACE as INBOX
from narrmem.models import IncomingMessage, TriggerEvent
from narrmem.settling import NAMESPACE as SETTLING
from narrmem.testing import HASH_EMBEDDER, open_memory

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
TIRED = ["so tired today", "so tired again today", "still so tired today", "tired today again"]

# `narrmem serve` as the command runs it, with the tests' hash embedder registered (the command
# loads no test plugin of its own).
SERVE = """
import sys
from narrmem.memory import Memory
from narrmem.testing import TestingPlugin
plain_open = Memory.open
def with_hash_embedder(*args, **options):
    options["plugins"] = [TestingPlugin(), *options.get("plugins", ())]
    return plain_open(*args, **options)
Memory.open = with_hash_embedder
from narrmem.doors.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    def __init__(self, process: subprocess.Popen[bytes], folder: Path, port: int, log: Path) -> None:
        self.process = process
        self.folder = folder
        self.port = port
        self.log = log
        self.base = f"http://127.0.0.1:{port}"

    def said(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM, within: float = 60) -> tuple[int, float]:
        """Send ``sig``; the exit code and the seconds the process took to exit."""
        began = time.monotonic()
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"narrmem serve did not exit within {within} s of signal {sig}")
        return code, time.monotonic() - began


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Served] = []

    def start(*options: str) -> Served:
        folder, port = tmp_path / "d", _free_port()
        command = [sys.executable, "-c", SERVE, "serve", "--data", str(folder), "--port", str(port), *options]
        env = {**os.environ, "NARRMEM_EMBEDDER__BACKEND": HASH_EMBEDDER}
        log = tmp_path / f"serve-{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=out)
        served = Served(process, folder, port, log)
        started.append(served)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"narrmem serve exited with {process.returncode}: {served.said()}")
            try:
                if httpx.get(f"{served.base}/v1/stats", timeout=2).status_code == 200:
                    return served
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("narrmem serve did not answer in time")

    yield start
    for served in started:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()


def _state_entries(folder: Path, namespace: str) -> int:
    con = sqlite3.connect(folder / DB_NAME)
    try:
        [(n,)] = con.execute("SELECT COUNT(*) FROM plugin_state WHERE namespace = ?", (namespace,)).fetchall()
        return int(n)
    finally:
        con.close()


def _stored_message_ids(folder: Path) -> set[str]:
    con = sqlite3.connect(folder / DB_NAME)
    try:
        rows = con.execute("SELECT message_ids FROM memories WHERE kind = 'episode'").fetchall()
        return {mid for (ids,) in rows for mid in json.loads(ids)}
    finally:
        con.close()


# --- SIGTERM and SIGINT -----------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_closes_the_memory_what_came_on_receipt_is_written_and_settled(serve: Any, sig: int) -> None:
    served = serve()
    sent: set[str] = set()

    async def ingest() -> None:
        async with httpx.AsyncClient(base_url=served.base, timeout=30) as client:

            async def batch(b: int) -> None:
                messages = [
                    msg(
                        f"m{b}-{i}",
                        f"I adopted a kitten named zq{b}x{i} at the shelter",
                        user=f"u{b}",
                        chat=f"c{b}",
                    )
                    for i in range(8)
                ]
                answer = await client.post(
                    "/v1/ingest/batch?acknowledge=on_receipt", json={"messages": messages}
                )
                assert answer.status_code == 200, answer.text
                sent.update(
                    m["message_id"] for m, r in zip(messages, answer.json(), strict=True) if r["stored"]
                )

            await asyncio.gather(*(batch(b) for b in range(40)))

    asyncio.run(ingest())
    assert sent
    code, _ = served.stop(sig)
    # Read straight from the file, before any open could finish what the process left.
    assert _state_entries(served.folder, INBOX) == 0
    assert _state_entries(served.folder, SETTLING) == 0
    assert sent <= _stored_message_ids(served.folder)
    assert code == 0, served.said()


def test_an_open_event_stream_ends_and_sigterm_exits_at_once(serve: Any) -> None:
    served = serve()
    with httpx.stream("GET", f"{served.base}/v1/events", params={"keepalive": 0.2}, timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith(": narrmem")
        assert next(lines) == ""
        code, took = served.stop(signal.SIGTERM, within=30)
        rest = list(lines)  # the stream ends cleanly: no error reading it to its end
    assert code == 0, served.said()
    assert took < 8, f"took {took:.1f} s"
    assert all(line in ("", ": keepalive") for line in rest)


# --- limits on slow clients -------------------------------------------------------------------


async def _slow_request(port: int, length: int = 1000) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent a request's head and the start of its body, and no more."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
        + b'{"text": '
    )
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, within: float) -> tuple[int, bytes]:
    """The status and body of the answer on a raw connection (read until it closes)."""
    raw = await asyncio.wait_for(reader.read(), within)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def test_requests_beyond_max_connections_get_503_in_json_and_liveness_is_still_answered(serve: Any) -> None:
    """A request beyond the limit is a 503 as every other of the server: JSON with ``detail`` and
    ``Retry-After`` (uvicorn's own was plain text without it, which a client parsing the error
    body failed on). ``/healthz`` is answered however busy (a liveness probe that met the limit
    had the supervisor restart a busy process); ``/readyz`` is not (busy is not ready)."""
    served = serve("--max-connections", "4", "--body-timeout", "120")

    async def get(path: str) -> tuple[int, dict[str, str], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return int(lines[0].split(" ")[1]), headers, body

    async def crowd() -> None:
        held = [await _slow_request(served.port) for _ in range(4)]
        await asyncio.sleep(0.3)
        status, headers, body = await get("/v1/stats")
        assert status == 503 and headers["retry-after"] == "1", (status, headers, body)
        assert headers["content-type"] == "application/json"
        assert "at once" in json.loads(body)["detail"]
        assert (await get("/healthz"))[0] == 200
        assert (await get("/readyz"))[0] == 503
        for _, slow in held:
            slow.close()
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(base_url=served.base) as client:
            assert (await client.get("/v1/stats")).status_code == 200

    asyncio.run(crowd())
    assert served.stop()[0] == 0


def test_a_body_not_whole_within_body_timeout_is_408_and_the_connection_closes(serve: Any) -> None:
    served = serve("--body-timeout", "1")

    async def trickle() -> None:
        reader, writer = await _slow_request(served.port)
        began = time.monotonic()

        async def drip() -> None:
            # Never idle, never whole, until shortly before the deadline: a byte still on its way
            # when the server answers and closes is answered with a reset, which may discard the
            # answer before it is read.
            while time.monotonic() - began < 0.6:
                await asyncio.sleep(0.2)
                writer.write(b" ")

        dripping = asyncio.create_task(drip())
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            # Stop sending once the answer came, as a client does: a byte sent after the server
            # closed is answered with a reset, which may arrive before the body is read.
            dripping.cancel()
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await asyncio.wait_for(reader.readexactly(length), 10)
            status = int(head.split(b" ")[1])
            assert b"connection: close" in head.lower()
            try:
                closed = await asyncio.wait_for(reader.read(), 10)
            except ConnectionResetError:
                closed = b""
            assert closed == b""  # nothing more: the server closed the connection
        finally:
            dripping.cancel()
            writer.close()
        assert status == 408
        assert set(json.loads(body)) <= {"detail", "field"} and "1 s" in json.loads(body)["detail"]
        assert time.monotonic() - began < 5

    asyncio.run(trickle())
    assert served.stop()[0] == 0


# --- event streams and revoked keys -----------------------------------------------------------


def _tired(i: int) -> dict[str, Any]:
    when = (NOW - timedelta(days=6 - i)).isoformat()
    return msg(f"t{i}", TIRED[i], user="tom", chat="dm-tom", ts=when, tenant="A")


async def _subscribed(hub: TriggerHub) -> None:
    """Until a stream has subscribed to the hub."""
    for _ in range(1000):
        if hub._subscribers:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no stream subscribed")


async def test_a_revoked_keys_open_stream_ends_and_gets_no_more_events(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    entry, key = KeyFile(folder).create("A")
    ring = KeyRing.in_folder(folder, reload_seconds=0)
    async with open_memory(folder, clock=ManualClock(NOW)) as memory:
        app = create_app(memory, keys=ring)
        hub: TriggerHub = app.state.narrmem.hub
        headers = {"Authorization": f"Bearer {key}"}
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as client:

            async def listen() -> str:
                params = {"max_events": 1, "idle_seconds": 30, "keepalive": 0.2}
                response = await client.get("/v1/events", params=params)
                return response.text

            listener = asyncio.ensure_future(listen())
            await _subscribed(hub)
            KeyFile(folder).revoke(entry.id)
            admin = KeyFile(folder).create("A")[1]  # the triggers are fired with a key still valid
            fired = []
            for i in range(4):
                answer = await client.post(
                    "/v1/ingest", json=_tired(i), headers={"Authorization": f"Bearer {admin}"}
                )
                assert answer.status_code == 200, answer.text
                fired += answer.json()["triggers"]
            assert fired, "the messages fired no trigger"
            text = await asyncio.wait_for(listener, 5)  # ended, long before its idle end
        assert "event: trigger" not in text


async def test_a_valid_keys_stream_still_gets_its_events(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    _, key = KeyFile(folder).create("A")
    ring = KeyRing.in_folder(folder, reload_seconds=0)
    async with open_memory(folder, clock=ManualClock(NOW)) as memory:
        app = create_app(memory, keys=ring)
        hub: TriggerHub = app.state.narrmem.hub
        transport = httpx.ASGITransport(app)
        headers = {"X-API-Key": key}
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as client:
            params = {"max_events": 1, "idle_seconds": 30, "keepalive": 0.2}
            listener = asyncio.ensure_future(client.get("/v1/events", params=params))
            await _subscribed(hub)
            await asyncio.sleep(1.2)  # past a check of the key
            for i in range(4):
                assert (await client.post("/v1/ingest", json=_tired(i))).status_code == 200
            text = (await asyncio.wait_for(listener, 10)).text
        [data] = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert json.loads(data)["label"] == "tired"


# --- the webhook: an attempt bounded as a whole ----------------------------------------------


def _event() -> TriggerEvent:
    return TriggerEvent(kind="emotion", label="tired", count=3, user_id="tom", chat_id="dm-tom")


async def test_a_webhook_that_answers_a_byte_at_a_time_is_given_up_after_the_timeout() -> None:
    attempts = 0

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        await reader.readuntil(b"\r\n\r\n")
        try:
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(200):  # a header a byte at a time: each read gets something in time
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.1)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=2, backoff=0.05, timeout=0.5)
    hub = TriggerHub(webhook)
    try:
        began = time.monotonic()
        await hub.publish(_event())
        await hub.drain(10)
        assert time.monotonic() - began < 3
        assert (attempts, hub.delivered, hub.dropped) == (2, 0, 1)
    finally:
        await hub.close()
        listener.close()
        await listener.wait_closed()


async def test_a_webhooks_huge_reply_is_not_read() -> None:
    body = 200 * 2**20
    written = 0
    finished = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await reader.readuntil(b"\r\n\r\n")
        chunk = b"x" * 65536
        try:
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {body}\r\n\r\n".encode())
            while written < body:
                writer.write(chunk)
                await writer.drain()
                written += len(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            finished.set()

    listener = await asyncio.start_server(flood, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=2, backoff=0.05, timeout=5)
    hub = TriggerHub(webhook)
    try:
        await hub.publish(_event())
        await hub.drain(10)
        assert (hub.delivered, hub.dropped) == (1, 0)
        await asyncio.wait_for(finished.wait(), 10)
        assert written < body // 4, f"{written} of {body} bytes were read"
    finally:
        await hub.close()
        listener.close()
        await listener.wait_closed()


async def test_at_shutdown_the_webhook_queue_gets_a_bounded_time_and_what_is_left_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=4, backoff=0.05, timeout=30)
    hub = TriggerHub(webhook)
    try:
        for _ in range(3):
            await hub.publish(_event())
        began = time.monotonic()
        await hub.shutdown(0.5)
        assert time.monotonic() - began < 3
        assert "3 trigger event(s) not delivered at shutdown" in caplog.text
        await hub.publish(_event())  # once closed, nothing starts another sender
        assert hub._sender is None
    finally:
        await hub.close()
        listener.close()
        await listener.wait_closed()


async def test_sigterm_delivers_the_triggers_of_what_was_acknowledged_before_exiting(serve: Any) -> None:
    received: list[dict[str, Any]] = []

    async def hook(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A slow receiver: the event is on its way when the signal comes, and counts as received
        # once answered to a sender still there.
        body = await read_posted_json(reader)
        await asyncio.sleep(1)
        if reader.at_eof():
            writer.close()
            return
        received.append(body)
        await answer_status(writer, 200)

    listener = await asyncio.start_server(hook, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        served = await asyncio.to_thread(serve, "--webhook", f"http://127.0.0.1:{port}/hook")
        async with httpx.AsyncClient(base_url=served.base, timeout=30) as client:
            for i in range(4):
                tired = {**_tired(i), "tenant": "default"}
                answer = await client.post("/v1/ingest?acknowledge=after_write", json=tired)
                assert answer.status_code == 200, answer.text
        code, _ = await asyncio.to_thread(served.stop)
        assert [body["event"]["label"] for body in received] == ["tired"]
        assert code == 0, served.said()
    finally:
        listener.close()
        await listener.wait_closed()


# --- the export -------------------------------------------------------------------------------


async def _memory_with_lines(folder: Path, count: int) -> Any:
    """A memory of ``count`` stored messages: an export of several pieces."""
    memory = await open_memory(folder, clock=ManualClock(NOW))
    texts = [f"I adopted a kitten named zq{i} at the shelter" for i in range(count)]
    await memory.ingest_many([IncomingMessage(**msg(f"m{i}", text)) for i, text in enumerate(texts)])
    return memory


async def test_an_export_in_pieces_is_the_same_bytes(tmp_path: Path) -> None:
    memory = await _memory_with_lines(tmp_path / "m", 120)
    try:
        app = create_app(memory)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            sent = (await client.get("/v1/export")).content
        await export_store(memory, tmp_path / "whole.jsonl")
        assert len(sent) > 3 * 64 * 1024  # in several pieces
        assert sent == (tmp_path / "whole.jsonl").read_bytes()
    finally:
        await memory.close()


async def test_an_export_stops_once_its_client_is_gone(tmp_path: Path) -> None:
    """As uvicorn hears of it: a connection found broken as a piece is written is known to be gone
    once the loop turns (``connection_lost`` is called soon); until then what is sent goes to the
    dead socket (a warning each), and then a send fails."""
    memory = await _memory_with_lines(tmp_path / "m", 120)
    try:
        app = create_app(memory)
        loop = asyncio.get_running_loop()
        cut = gone = False
        sent_after_the_cut = 0

        def lost() -> None:
            nonlocal gone
            gone = True

        async def send(message: dict[str, Any]) -> None:
            nonlocal cut, sent_after_the_cut
            if message["type"] != "http.response.body" or not message.get("body"):
                return
            if gone:
                raise OSError("the client is gone")
            if cut:
                sent_after_the_cut += 1
            elif b'"section"' in message["body"]:  # the connection breaks at the first memory sent
                cut = True
                loop.call_soon(lost)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/v1/export",
            "raw_path": b"/v1/export",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"t")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        with contextlib.suppress(Exception):
            await app(scope, receive, send)
        assert cut and gone
        assert sent_after_the_cut == 0
    finally:
        await memory.close()
