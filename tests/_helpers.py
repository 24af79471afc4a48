"""Small helpers shared by the test modules (not a test module itself)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from narrmem import hookimpl

DB_NAME = "narrmem.sqlite3"
INDEX_NAME = "vectors"
MANIFEST = "vectors/manifest.json"

# The long variants of some tests (more seeds; each step of a run killed on its own as well as
# all in one) run with NARRMEM_LONG_TESTS=1; the default run keeps one of each.
LONG_TESTS = os.environ.get("NARRMEM_LONG_TESTS", "") == "1"


def variants(*values: Any) -> list[Any]:
    """``values`` with NARRMEM_LONG_TESTS=1, else the first alone."""
    return list(values) if LONG_TESTS else list(values[:1])


def msg(
    message_id: str,
    text: str,
    *,
    user: str = "u1",
    chat: str = "c1",
    tenant: str = "default",
    ts: str = "2026-05-04T09:12:00+01:00",
    **extra: Any,
) -> dict[str, Any]:
    """A valid message as a plain dict (the JSON shape a bot would hand in)."""
    data: dict[str, Any] = {
        "text": text,
        "user_id": user,
        "chat_id": chat,
        "ts": ts,
        "message_id": message_id,
        "tenant": tenant,
    }
    data.update(extra)
    return data


def sql(folder: Path, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run a query straight against the store's SQLite file (not through narrmem)."""
    con = sqlite3.connect(folder / DB_NAME)
    try:
        return list(con.execute(query, tuple(params)).fetchall())
    finally:
        con.close()


async def store_sql(memory: Any, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run a read through the store's own SQL connection (``store.sql()``): the same query on
    either backend, for a test that runs on both (see ``TESTS_STORE`` in conftest)."""
    async with memory.store.sql() as db:
        rows: list[tuple[Any, ...]] = await db.fetchall(query, params)
    return rows


def on_sqlite(memory: Any) -> bool:
    """Whether the memory is on the SQLite store (whose files and FAISS index a test may read)."""
    return bool(memory.settings.storage.backend == "sqlite")


# A forget holds the gate of the fence between workers (narrmem_plugins.storage_postgres).
GATE_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted "
    "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1"
)


async def forget_begun(memory: Any) -> None:
    """Until a forget just called on ``memory`` has begun, so that a message sent now comes after
    it: the next turn of the loop on SQLite; on PostgreSQL, once the forget holds the gate between
    workers (a forget there begins once no other worker's forget can come before its end)."""
    await asyncio.sleep(0)
    if on_sqlite(memory):
        return
    from narrmem_plugins.storage_postgres.workers_fence import GATE

    high, low = (GATE >> 32) & 0xFFFFFFFF, GATE & 0xFFFFFFFF
    while True:
        if await memory.store.pool.fetchval(GATE_HELD, high, low):
            return
        await asyncio.sleep(0.005)


async def store_count(memory: Any, table: str = "memories") -> int:
    """``count_rows`` through the store (either backend)."""
    [(n,)] = await store_sql(memory, f"SELECT COUNT(*) FROM {table}")
    return int(n)


STORE_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    "postgres": "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
}


async def store_fingerprint(memory: Any, *, keyword_tables: bool = True) -> list[Any]:
    """Every row of every table of the store (the store's own and the plugins'), through its own
    connection: what a call that must write nothing leaves as it was. ``keyword_tables=False``
    leaves out SQLite's full-text tables."""
    async with memory.store.sql() as db:
        names = sorted(r[0] for r in await db.fetchall(STORE_TABLES[db.dialect]))
        assert "memories" in names
        tables = [t for t in names if keyword_tables or "fts" not in t]
        return [(t, sorted(map(repr, await db.fetchall(f'SELECT * FROM "{t}"')))) for t in tables]


def count_rows(folder: Path, table: str = "memories") -> int:
    [(n,)] = sql(folder, f"SELECT COUNT(*) FROM {table}")
    return int(n)


def index_file_ids(folder: Path) -> list[int]:
    """The ids stored in the persisted index's row files, read with numpy directly."""
    ids: list[int] = [
        int(i) for path in sorted((folder / INDEX_NAME).glob("ids-*.npy")) for i in np.load(path)[:, 0]
    ]
    for rows in sorted((folder / INDEX_NAME).glob("rows-*.npz")):
        with np.load(rows) as arrays:
            ids.extend(int(i) for name in arrays.files if name.endswith("_ids") for i in arrays[name])
    return sorted(ids)


def index_file_vectors(folder: Path) -> np.ndarray:
    """Every vector in the persisted index's files (to prove a forgotten one is gone): the vector
    files, and any vectors an older format kept in the row files."""
    parts = [np.load(path) for path in sorted((folder / INDEX_NAME).glob("vectors-*.npy"))]
    for rows in sorted((folder / INDEX_NAME).glob("rows-*.npz")):
        with np.load(rows) as arrays:
            parts.extend(arrays[name] for name in arrays.files if name.endswith("_vectors"))
    parts = [p for p in parts if len(p)]
    return np.vstack(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def hit_keys(hits: Sequence[Any]) -> list[tuple[int, tuple[str, ...]]]:
    """What identifies a recall result: ids and provenance, in order."""
    return [(h.id, tuple(h.message_ids)) for h in hits]


def run_narrmem(
    *args: str,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float = 300,
    entry: Sequence[str] = ("-m", "narrmem.doors.cli"),
) -> subprocess.CompletedProcess[str]:
    """The ``narrmem`` command in a child process started as ``python ENTRY ARGS``, its output
    captured as text; the exit code is the caller's to check."""
    return subprocess.run(
        [sys.executable, *entry, *args],
        capture_output=True,
        text=True,
        env=dict(env),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def write_export(path: Path, lines: list[dict[str, Any]], *, end: bool = True) -> Path:
    """Write ``lines`` (a header first) as an export file. With ``end``, the end line is counted
    anew for the lines given (a file a test composed is whole); without it, written as given."""
    if end:
        header, *body = lines
        body = [line for line in body if line.get("section") != "end"]
        counts: dict[str, int] = {}
        for line in body:
            section = line.get("section", "memories")
            counts[section] = counts.get(section, 0) + 1
        lines = [header, *body]
        if header.get("version", 0) >= 3:
            lines.append({"section": "end", "lines": counts})
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    return path


async def run_python(script: str, *args: str) -> str:
    """Run ``script`` in a Python process of its own (a process that stops as a real one does,
    with ``os._exit`` or a kill); its standard output, once it exited with code 0."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(worker.communicate(), timeout=300)
    assert worker.returncode == 0, err.decode()[-3000:]
    return out.decode()


async def read_posted_json(reader: asyncio.StreamReader) -> Any:
    """The JSON body of one HTTP request read from a raw connection (a webhook endpoint's side)."""
    return (await read_posted(reader))[1]


async def read_posted(reader: asyncio.StreamReader) -> tuple[dict[str, str], Any]:
    """The headers (names in lower case) and JSON body of one HTTP request read from a raw
    connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    headers = {
        name.strip().lower().decode(): value.strip().decode()
        for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
    }
    return headers, json.loads(await reader.readexactly(int(headers["content-length"])))


async def answer_status(writer: asyncio.StreamWriter, status: int) -> None:
    """Answer a raw HTTP request with ``status`` and an empty body, and close the connection."""
    writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
    await writer.drain()
    writer.close()


class PluginErrors:
    """Every error a plugin raised that the host isolated and reported."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, BaseException]] = []

    @hookimpl
    def narrmem_plugin_error(self, plugin_name: str, hook_name: str, error: BaseException) -> None:
        self.seen.append((plugin_name, hook_name, error))


def free_port() -> int:
    """A port of the loopback address nothing listens on now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def narrmem_serve(folder: Path, port: int, *options: str) -> Iterator[subprocess.Popen[str]]:
    """A real ``narrmem serve`` on ``folder`` and ``port``, once it says it serves; stopped with
    SIGTERM at the end of the block (its exit code is then the process's ``returncode``)."""
    command = [sys.executable, "-m", "narrmem.doors.cli", "serve", "--data", str(folder), "--port", str(port)]
    server = subprocess.Popen(
        [*command, *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if "narrmem serving" in line:
                break
        yield server
    finally:
        server.terminate()
        server.wait(timeout=30)


def decision_scene(message_id: str, day: int, core: str, start: datetime) -> Any:
    """A decision scene of ``val`` in ``dm``, said ``day`` days after ``start``, built by its
    draft as triage builds one (for the tests of scenes that quote earlier ones)."""
    from narrmem.models import MemoryRecord, SceneDraft

    draft = SceneDraft(time=f"day {day}", scene="a talk", vibe="calm", core=core, category="decision")
    return MemoryRecord(
        kind="scene",
        user_id="val",
        chat_id="dm",
        text=draft.render(),
        created_at=start + timedelta(days=day),
        message_ids=[message_id],
        meta={**draft.stored(), "type": "decision"},
    )
