"""A TCP proxy in front of the tests' PostgreSQL that can end every connection and refuse new ones
(a server down or failing over) or pass no byte either way (a server that stalls), and a memory
stored behind it."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
from collections.abc import AsyncIterator
from pathlib import Path

from _helpers import msg
from _postgres import fresh_database

from narrmem import Memory
from narrmem.testing import open_memory


class Proxy:
    """TCP in front of the server's socket: ``pass``, ``down`` or ``stall``."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.mode = "pass"
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._links: list[dict[str, bool]] = []  # each connection's state: silenced or not
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    def cut(self) -> None:
        self.mode = "down"
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    def silence(self) -> None:
        """The connections open now pass no byte either way and are never closed, while new ones
        pass: a failover or a network cut that sends no reset, seen from the client."""
        for link in self._links:
            link["silent"] = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "down":
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
        self._writers += [writer, up_writer]
        link = {"silent": False}
        self._links.append(link)
        for a, b in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pipe(a, b, link))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: dict[str, bool]
    ) -> None:
        try:
            while data := await source.read(65536):
                while self.mode == "stall":  # noqa: ASYNC110 (a plain attribute the test flips)
                    await asyncio.sleep(0.02)
                if self.mode == "down":
                    break
                if link["silent"]:
                    continue
                sink.write(data)
                await sink.drain()
            while link["silent"]:  # the other end went: not told  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sink.transport.abort()


@contextlib.asynccontextmanager
async def behind_proxy(tmp_path: Path, timeout_s: float = 30.0) -> AsyncIterator[tuple[Memory, Proxy]]:
    dsn = await fresh_database("unreachable")
    base, _, query = dsn.partition("?")
    folder = query.split("host=", 1)[1].split("&", 1)[0]
    [socket_path] = [p for p in glob.glob(os.path.join(folder, ".s.PGSQL.*")) if not p.endswith(".lock")]
    proxy = Proxy(socket_path)
    await proxy.start()
    database = base.rsplit("/", 1)[1]
    storage = {"backend": "postgres", "dsn": f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}"}
    try:
        async with open_memory(tmp_path / "m", storage={**storage, "timeout_s": timeout_s}) as memory:
            await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
            await memory.ingest(msg("2", "I moved to Lisbon last spring", user="ann"))
            await memory.settle()
            try:
                yield memory, proxy
            finally:
                proxy.mode = "pass"
    finally:
        await proxy.stop()
