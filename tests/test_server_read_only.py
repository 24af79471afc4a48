"""``narrmem serve --read-only`` beside the process that writes the store (a bot on the SQLite
default, which holds the folder): the inspector and every read answer, with what the bot writes
meanwhile; every write is refused with 409 and changes nothing. Without it the server was refused
("in use"), so the inspector could not look at a running bot's memory."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from _helpers import msg
from test_rest_example import _free_port, _wait_until_up

from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only("a data folder held by the writing process")
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


async def test_the_inspector_reads_a_running_bots_store_and_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "bot"
    async with open_memory(folder, real_model=True) as bot:
        await bot.ingest(msg("m1", "I adopted a greyhound named Pixel", user="ann", ts=T0.isoformat()))
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        refused = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "narrmem.doors.cli", "serve", "--data", str(folder), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode == 2 and "in use" in refused.stderr
        command = [sys.executable, "-m", "narrmem.doors.cli", "serve", "--read-only", "--data", str(folder)]
        server = await asyncio.to_thread(
            subprocess.Popen, [*command, "--port", str(port)], stderr=subprocess.DEVNULL
        )
        try:
            await asyncio.to_thread(_wait_until_up, base, server)
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                assert (await client.get("/ui/")).status_code == 200
                users = (await client.get("/v1/users", params={"tenant": "default"})).json()
                assert [u["user_id"] for u in users] == ["ann"]
                # What the bot writes meanwhile is read.
                await bot.ingest(
                    msg("m2", "I decided to quit my job at the bank", user="ann", ts=T0.isoformat())
                )
                hits = await client.post(
                    "/v1/recall", json={"query": "quit my job", "scope": {"user_id": "ann"}}
                )
                assert "quit my job" in hits.json()[0]["text"]
                before = await bot.store.table_counts()
                for path, body in (
                    ("/v1/ingest", msg("m3", "I moved to Porto", user="ann")),
                    ("/v1/forget", {"user_id": "ann"}),
                    ("/v1/decay", {}),
                ):
                    answer = await client.post(path, json=body)
                    assert answer.status_code == 409 and "read-only" in answer.text, (path, answer.text)
                assert await bot.store.table_counts() == before
        finally:
            server.terminate()
            await asyncio.to_thread(server.wait, 30)
