"""A DSN's secrets never shown: the password (in the URL, as the first or a later query parameter,
or as a keyword) and the client key's passphrase (``sslpassword``). Before, a password given as
the first query parameter (``postgresql://bot@db/narrmem?password=...``, which libpq and asyncpg
take) was printed whole in every error, log line and ``stats`` output naming the store, and
``sslpassword`` anywhere."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _postgres import dsn_for, fresh_database
from narrmem_plugins.storage_postgres.dsn import mask_dsn, scrub

from narrmem import StoreError
from narrmem.testing import open_memory

SECRET = "hunter2-zq7"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://bot:{SECRET}@db.example/narrmem",
        f"postgresql://bot@db.example/narrmem?password={SECRET}",
        f"postgresql://bot@db.example/narrmem?sslmode=require&password={SECRET}",
        f"postgresql://bot@db.example/narrmem?PASSWORD={SECRET}&sslmode=require",
        f"postgresql://bot@db.example/narrmem?sslpassword={SECRET}",
        f"postgresql://bot@db.example/narrmem?pass%77ord={SECRET}",
        f"postgres://bot:{SECRET}@h1:5432,h2:5433/narrmem",
        f"host=db.example user=bot password={SECRET} dbname=narrmem",
        f"host=db.example user=bot sslpassword='{SECRET}' dbname=narrmem",
        "postgresql://bot:hunter2%40zq7@db.example/narrmem",
    ],
)
def test_no_form_of_a_secret_is_shown(dsn: str) -> None:
    shown = mask_dsn(dsn)
    assert "hunter2" not in shown and "***" in shown
    assert "db.example" in shown or "h1:5432" in shown  # the rest stays, to tell stores apart
    # The password as a message may quote it: as given, and decoded (%40 is @).
    quoted = "hunter2@zq7" if "%40" in dsn else SECRET
    said = scrub(f"could not connect to {dsn}: the password for bot was {quoted}", dsn)
    assert "hunter2" not in said


def _with_first(dsn: str, first: str) -> str:
    """``dsn`` (the tests' server, by its socket folder) with ``first`` as its first query parameter."""
    base, _, query = dsn.partition("?")
    return f"{base}?{first}&{query}"


async def test_an_error_naming_the_store_does_not_show_a_query_password(tmp_path: Path) -> None:
    dsn = _with_first(dsn_for("no_such_database"), f"password={SECRET}")
    with pytest.raises(StoreError) as refused:
        async with open_memory(tmp_path / "m", storage={"backend": "postgres", "dsn": dsn}):
            pass
    assert "no_such_database" in str(refused.value)
    assert SECRET not in str(refused.value)


async def test_the_command_line_does_not_show_a_query_password(tmp_path: Path) -> None:
    dsn = _with_first(await fresh_database("secrets"), f"password={SECRET}")  # the server trusts its socket
    env = {**os.environ, "NARRMEM_STORAGE__BACKEND": "postgres", "NARRMEM_STORAGE__DSN": dsn}
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        json.dumps(
            {
                "text": "I adopted a greyhound",
                "user_id": "ann",
                "chat_id": "c1",
                "message_id": "1",
                "ts": "2026-05-04T09:12:00+00:00",
            }
        )
        + "\n"
    )
    outputs: dict[str, str] = {}
    for command in (
        ["ingest", str(messages)],
        ["stats", "--json"],
        ["stats"],
        ["recall", "greyhound", "--user", "ann", "--json"],
    ):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "narrmem.doors.cli", "--verbose", *command, "--data", str(tmp_path / "m")],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        outputs[" ".join(command[:2])] = done.stdout + done.stderr
    assert "greyhound" in outputs["recall greyhound"]
    assert [command for command, output in outputs.items() if SECRET in output] == []
