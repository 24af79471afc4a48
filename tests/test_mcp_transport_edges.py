"""``narrmem mcp`` over stdio at the edges of its transport: a client that dies while a call is in
flight, and lines whose JSON the transport's parser refuses though JSON allows them (a number of
thousands of digits, nesting hundreds deep). The server runs as a real subprocess each time."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from narrmem import Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.slow

SERVER = [sys.executable, "-m", "narrmem.doors.cli", "mcp", "--data"]
HELLO = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
CALLS_IN_FLIGHT = 40

# The client: a process of its own speaking JSON-RPC on two pipes to the server. It sends many
# ingests at once, says so when the first is answered (the rest are still being worked through),
# then waits to be killed.
CLIENT = """
import json, os, sys, time
to_server = os.fdopen(int(sys.argv[1]), "w")
from_server = os.fdopen(int(sys.argv[2]))
def send(message):
    to_server.write(json.dumps(message) + "\\n")
    to_server.flush()
send(json.loads(sys.argv[3]))
from_server.readline()
send(json.loads(sys.argv[4]))
for n in range(int(sys.argv[5])):
    arguments = {"user_id": "u1", "chat_id": "c1", "message_id": f"m{n}",
                 "text": f"Message {n}: I am repainting the kitchen in sage green."}
    send({"jsonrpc": "2.0", "id": n + 1, "method": "tools/call",
          "params": {"name": "narrmem_ingest", "arguments": arguments}})
from_server.readline()
print("ANSWERING", flush=True)
time.sleep(600)
"""


def _environment() -> dict[str, str]:
    # The test's NARRMEM_ defaults (and its store, on PostgreSQL) go to the server too.
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def test_a_client_killed_mid_call_ends_the_server_with_exit_0(tmp_path: Path) -> None:
    """A client killed while its calls were in flight made the server's answer meet a broken pipe,
    and the server exited 1 with "internal error: ExceptionGroup". A client leaving is a normal end:
    exit 0, nothing on stderr about an error, and the store as consistent as after any call."""
    data = tmp_path / "data"
    server_reads, client_writes = os.pipe()
    client_reads, server_writes = os.pipe()
    server = subprocess.Popen(
        [*SERVER, str(data)],
        stdin=server_reads,
        stdout=server_writes,
        stderr=subprocess.PIPE,
        env=_environment(),
    )
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLIENT,
            str(client_writes),
            str(client_reads),
            json.dumps(HELLO),
            json.dumps(INITIALIZED),
            str(CALLS_IN_FLIGHT),
        ],
        pass_fds=(client_writes, client_reads),
        stdout=subprocess.PIPE,
        text=True,
    )
    # Only the two processes hold the pipes: the client's death is all the server sees.
    for fd in (server_reads, client_writes, client_reads, server_writes):
        os.close(fd)
    try:
        assert client.stdout is not None
        ready, _, _ = select.select([client.stdout], [], [], 300)
        assert ready and client.stdout.readline().strip() == "ANSWERING"
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
        _, stderr = server.communicate(timeout=120)
    finally:
        for process in (client, server):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    errors = stderr.decode(errors="replace")
    assert "internal error" not in errors, errors
    assert server.returncode == 0, errors

    sent = {f"m{n}" for n in range(CALLS_IN_FLIGHT)}
    stored = _stored_message_ids_and_figures(data)
    assert stored["episodes"], "not one ingest was done before the client left"
    assert set(stored["episodes"]) <= sent
    assert len(stored["episodes"]) == len(set(stored["episodes"]))
    assert stored["memories"] == stored["vectors_indexed"]


def _stored_message_ids_and_figures(data: Path) -> dict[str, Any]:
    import asyncio

    async def read() -> dict[str, Any]:
        async with open_memory(data, real_model=True, read_only=True) as memory:
            episodes = await memory.store.recent(Scope(user_id="u1"), limit=CALLS_IN_FLIGHT * 2)
            figures = await memory.stats()
        message_ids = [m for r in episodes if r.kind == "episode" for m in r.message_ids]
        return {"episodes": message_ids, **{k: figures[k] for k in ("memories", "vectors_indexed")}}

    return asyncio.run(read())


@contextmanager
def _raw_server(data: Path) -> Iterator[tuple[Callable[[str], None], Callable[[], dict[str, Any]]]]:
    """``narrmem mcp`` spoken to in raw JSON-RPC lines (which no SDK client would send), initialized;
    yields ``send(line)`` and ``answer()``."""
    server = subprocess.Popen(
        [*SERVER, str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_environment()
    )
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout

    def send(line: str) -> None:
        stdin.write(line.encode() + b"\n")
        stdin.flush()

    def answer() -> dict[str, Any]:
        ready, _, _ = select.select([stdout], [], [], 120)
        assert ready, "no answer"
        reply: dict[str, Any] = json.loads(stdout.readline())
        return reply

    try:
        send(json.dumps(HELLO))
        assert "result" in answer()
        send(json.dumps(INITIALIZED))
        yield send, answer
    finally:
        stdin.close()
        server.wait(timeout=60)


def _recall(request_id: int, arguments: str) -> str:
    return (
        f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call",'
        f'"params":{{"name":"narrmem_recall","arguments":{arguments}}}}}'
    )


def test_an_integer_of_thousands_of_digits_is_named_by_its_field(tmp_path: Path) -> None:
    """Valid JSON-RPC, but the transport's parser (and Python's ``int``) stop at about 4300 digits:
    it was answered "not a JSON-RPC message" (-32700), naming nothing. It is invalid params, for
    the request's id, naming the argument."""
    with _raw_server(tmp_path / "d") as (send, answer):
        send(_recall(7, '{"user_id":"u1","query":"hi","k":%s}' % ("9" * 5000)))
        refused = answer()
        assert refused["id"] == 7
        assert refused["error"]["code"] == -32602
        assert "'params.arguments.k'" in refused["error"]["message"]
        send(_recall(8, '{"user_id":"u1","query":"hi"}'))
        assert "result" in answer()  # and the server goes on


def test_nesting_too_deep_is_named_by_the_path_to_where_it_stops(tmp_path: Path) -> None:
    """The transport's parser refuses nesting past 200 levels. 300 levels (which Python's own parser
    reads) and 5000 (which it cannot) were answered naming "the request", no field: the answer
    names the path to the first value nested too deep, under the argument that holds it."""
    with _raw_server(tmp_path / "d") as (send, answer):
        for request_id, levels in ((7, 300), (8, 5000)):
            send(
                _recall(request_id, '{"user_id":"u1","query":"hi","deep":%s}' % ("[" * levels + "]" * levels))
            )
            refused = answer()
            assert refused["id"] == request_id
            assert refused["error"]["code"] == -32602
            where = refused["error"]["message"].split("'")[1]
            assert where.startswith("params.arguments.deep[0][0]"), where
            assert set(where.removeprefix("params.arguments.deep").split("]")) == {"[0", ""}
        send(_recall(9, '{"user_id":"u1","query":"hi"}'))
        assert "result" in answer()
