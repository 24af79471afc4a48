"""PostgreSQL behind a connection pooler: a real PgBouncer (Debian's ``pgbouncer``) in front of the
tests' server.

In session mode (a connection keeps one server session) the store works as on the server itself:
before, PgBouncer refused the pool's startup parameters (``hnsw.ef_search``), and the open failed
as "cannot be reached now" (exit 75, try again later), which no retry mends. In transaction or
statement mode (each transaction on whichever session is free) the open is refused naming
``storage.dsn``: before, with the startup parameters ignored as PgBouncer suggests, the store
opened, the fence between workers was lost after every few writes, a recall lost its keyword
source, and a run of two workers hung."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from _helpers import msg
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.advisory import AdvisoryLock, lock_key

from narrmem import ConfigError, StoreUnavailableError
from narrmem.testing import open_memory

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# What PgBouncer's error message tells a user to add when it refuses a startup parameter.
IGNORED = "ignore_startup_parameters = hnsw.ef_search,hnsw.iterative_scan,plan_cache_mode,extra_float_digits"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _pgbouncer(dsn: str, **options: str) -> Iterator[str]:
    """PgBouncer in front of the database of ``dsn`` (the tests' server's socket), with
    ``options`` in its ``[pgbouncer]`` section; yields the DSN through it."""
    if not os.path.exists(PGBOUNCER):
        pytest.fail("these tests need PgBouncer: apt-get install pgbouncer (the README's test command does)")
    base, _, query = dsn.partition("?")
    socket_dir = query.split("host=", 1)[1].split("&", 1)[0]
    [port] = [
        name.rsplit(".", 1)[1]
        for name in os.listdir(socket_dir)
        if name.startswith(".s.PGSQL.") and not name.endswith(".lock")
    ]
    database = base.rsplit("/", 1)[1]
    folder = Path(tempfile.mkdtemp(prefix="narrmem-pgbouncer-"))
    folder.chmod(0o777)  # PgBouncer refuses to run as root: it runs as the server's user
    (folder / "users.txt").write_text('"postgres" ""\n')
    listen = _free_port()
    settings = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(listen),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(folder / "users.txt"),
        "logfile": str(folder / "pgbouncer.log"),
        "default_pool_size": "20",
        **options,
    }
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={socket_dir} port={port}\n[pgbouncer]\n"
        + "".join(f"{key} = {value}\n" for key, value in settings.items() if key != "raw")
        + options.get("raw", "")
        + "\n"
    )
    as_user = ["-u", Path(socket_dir).owner()] if os.geteuid() == 0 else []
    process = subprocess.Popen(
        [PGBOUNCER, "-q", *as_user, str(folder / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen), timeout=0.1):
                break
            if process.poll() is not None:
                raise AssertionError(
                    f"pgbouncer did not start: {process.stderr.read().decode() if process.stderr else ''}"
                )
            time.sleep(0.02)
        yield f"postgresql://postgres@127.0.0.1:{listen}/{database}"
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


async def _warm(pooled: str, sessions: int) -> None:
    """Have the pooler open ``sessions`` server sessions, left idle (it opens them as needed)."""
    clients = [await asyncpg.connect(pooled, statement_cache_size=0) for _ in range(sessions)]
    try:
        held = [client.transaction() for client in clients]
        for client, transaction in zip(clients, held, strict=True):
            await transaction.start()
            await client.fetchval("SELECT 1")
        for transaction in held:
            await transaction.commit()
    finally:
        for client in clients:
            await client.close()


def _storage(dsn: str) -> dict[str, object]:
    return {"backend": "postgres", "dsn": dsn, "timeout_s": 10}


async def _tables(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))
    finally:
        await conn.close()


@pytest.mark.parametrize(
    "options",
    [
        {"pool_mode": "transaction", "raw": IGNORED},
        {"pool_mode": "transaction", "server_round_robin": "1", "raw": IGNORED},
        {"pool_mode": "transaction", "default_pool_size": "1", "raw": IGNORED},
        {"pool_mode": "transaction", "raw": IGNORED, "warm": "3"},
        {
            "pool_mode": "transaction",
            "server_round_robin": "1",
            "default_pool_size": "2",
            "raw": IGNORED,
            "warm": "2",
        },
        {"pool_mode": "statement", "raw": IGNORED},
    ],
    ids=[
        "transaction",
        "transaction-round-robin",
        "transaction-one-session",
        "transaction-three-idle-sessions",
        "transaction-round-robin-two-idle-sessions",
        "statement",
    ],
)
async def test_a_pooler_that_moves_sessions_is_refused_naming_the_setting(
    tmp_path: Path, options: dict[str, str]
) -> None:
    dsn = await fresh_database("pooler")
    warm = int(options.pop("warm", "0"))
    with _pgbouncer(dsn, **options) as pooled:
        await _warm(pooled, warm)
        with pytest.raises(ConfigError) as refused:
            async with open_memory(tmp_path / "m", storage=_storage(pooled)):
                pass
    assert str(refused.value).startswith("storage.dsn: postgresql://postgres@127.0.0.1:")
    assert "session mode" in str(refused.value)
    assert await _tables(dsn) == 0  # refused before the schema was made


async def test_the_command_line_exits_2_with_the_setting_named(tmp_path: Path) -> None:
    dsn = await fresh_database("pooler")
    with _pgbouncer(dsn, pool_mode="transaction", raw=IGNORED) as pooled:
        env = {**os.environ, "NARRMEM_STORAGE__BACKEND": "postgres", "NARRMEM_STORAGE__DSN": pooled}
        messages = tmp_path / "messages.jsonl"
        messages.write_text(json.dumps(msg("1", "I adopted a greyhound named Pixel", user="ann")) + "\n")
        done = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "narrmem.doors.cli",
                "ingest",
                str(messages),
                "--data",
                str(tmp_path / "m"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert "narrmem: error: storage.dsn: " in done.stderr and "session mode" in done.stderr
    assert "Traceback" not in done.stderr


KEEPALIVES_SET = "SELECT count(*) FROM pg_settings WHERE name LIKE 'tcp_keepalives_%' AND source = 'session'"


@pytest.mark.parametrize("raw", ["", IGNORED], ids=["as-installed", "startup-parameters-ignored"])
async def test_two_workers_through_a_session_pooler_work_as_on_the_server(tmp_path: Path, raw: str) -> None:
    dsn = await fresh_database("pooler")
    with _pgbouncer(dsn, pool_mode="session", raw=raw) as pooled:
        async with (
            open_memory(tmp_path / "a", storage=_storage(pooled)) as worker_a,
            open_memory(tmp_path / "b", storage=_storage(pooled)) as worker_b,
        ):
            await asyncio.gather(
                *(
                    (worker_a if i % 2 else worker_b).ingest(
                        msg(
                            f"{user}{i}",
                            f"I adopted a greyhound named Pixel, walk number {i}",
                            user=user,
                            chat=f"c-{user}",
                        )
                    )
                    for i in range(12)
                    for user in ("ann", "bob")
                )
            )
            await worker_a.settle()
            await worker_b.settle()
            assert len(await worker_a.recall("greyhound", user_id="bob", k=20)) == 12
            heard: list[str] = []
            listening = await worker_b.store.listen("narrmem_pooler_test", heard.append, lambda: None)
            try:
                await worker_a.store.broadcast("narrmem_pooler_test", "hello")
                for _ in range(100):
                    if heard:
                        break
                    await asyncio.sleep(0.05)
            finally:
                await listening.close()
            assert heard == ["hello"]  # LISTEN and NOTIFY pass a session pooler
            await worker_a.forget(user_id="ann")
            assert await worker_b.recall("greyhound", user_id="ann", k=20) == []
            assert len(await worker_b.recall("greyhound", user_id="bob", k=20)) == 12
            for _ in range(6):  # the settings of every session, after the pool's resets too
                async with worker_b.store.pool.acquire() as conn:
                    assert await conn.fetchval("SHOW hnsw.iterative_scan") == "strict_order"
                    assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
                    # Read as set (a Unix socket, as here, shows them as 0).
                    assert await conn.fetchval(KEEPALIVES_SET) == 3
            # A lock knows its session by the server's pid: the client's is the pooler's key.
            lock = AdvisoryLock(worker_b.store.pool.raw, lock_key("pooled job"), "pooled job")
            assert await lock.take()
            try:
                assert lock.server_pid == await lock.holder()
            finally:
                await lock.release()


async def test_the_pools_settings_outlive_its_resets_on_the_server_itself(tmp_path: Path) -> None:
    dsn = await fresh_database("pooler")
    async with open_memory(
        tmp_path / "m", storage={"backend": "postgres", "dsn": dsn, "hnsw_ef_search": 123}
    ) as memory:
        for _ in range(6):
            async with memory.store.pool.acquire() as conn:
                await conn.execute("SET hnsw.ef_search = 7")  # a plugin's own setting, reset on release
                assert await conn.fetchval("SHOW hnsw.iterative_scan") == "strict_order"
        async with memory.store.pool.acquire() as conn:
            assert await conn.fetchval("SHOW hnsw.ef_search") == "123"


async def test_a_session_pooler_with_no_free_session_says_so(tmp_path: Path) -> None:
    dsn = await fresh_database("pooler")
    with _pgbouncer(dsn, pool_mode="session", default_pool_size="1") as pooled:
        with pytest.raises(StoreUnavailableError) as waited:
            async with open_memory(tmp_path / "m", storage={**_storage(pooled), "timeout_s": 2}):
                pass
    said = str(waited.value)
    assert "answered one session but not a second within 2 s" in said and "session mode" in said
