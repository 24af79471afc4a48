"""An import killed at any point (a real process, SIGKILL) and run again ends as one whole import of
the same file: every table holds the same rows (memories, importance and importance after decay,
history, plugin state, the graph, RTM trees), and running it once more changes nothing.

The child process imports as ``narrmem import`` does and kills itself at a chosen step: when the
memories are committed, between two writes of the importance history, between two plugin state
entries, inside a plugin's transaction, or between two plugins' sections."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import variants
from test_transfer_full import REINFORCE, START, _fill

from narrmem import Message
from narrmem.clock import ManualClock
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_store
from narrmem.table_transfer import table_columns
from narrmem.testing import open_memory

TESTS = Path(__file__).parent
IMPORTED_AT = START + timedelta(days=60)  # the clock of every import, child and parent alike

SAID = [
    "I live in Lisbon now",
    "I work at Acme Robotics",
    "I'm so tired today, work was brutal",
    "I like jazz music a lot",
    "my girlfriend is Maria",
    "I'm tired again, could not sleep",
    "I plan to run a marathon",
    "I'm tired of this project honestly",
]

# The child: import FILE into FOLDER, and at the n-th call of STEP kill itself (SIGKILL, as a
# machine losing power or an operator's kill -9 would). A step ending in "+" kills when the call
# has returned; "insert_rows:TABLE" is the first write of that plugin table.
CHILD = """
import asyncio, os, signal, sys
sys.path.insert(0, sys.argv[1])
from narrmem import table_transfer
from test_import_interrupted import open_store
from narrmem.doors.importing import import_jsonl

folder, path, step, nth = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

def die():
    os.kill(os.getpid(), signal.SIGKILL)

async def main():
    async with open_store(folder) as memory:
        name, _, table = step.partition(":")
        if name == "insert_rows":
            real_insert = table_transfer.insert_rows
            async def insert_rows(db, into, rows, exclude=()):
                if into == table:
                    die()
                await real_insert(db, into, rows, exclude)
            table_transfer.insert_rows = insert_rows
        else:
            after = name.endswith("+")
            real = getattr(memory.store, name.rstrip("+"))
            calls = 0
            async def counted(*args, **kwargs):
                nonlocal calls
                calls += 1
                if calls == nth and not after:
                    die()
                result = await real(*args, **kwargs)
                if calls == nth:
                    die()
                return result
            setattr(memory.store, name.rstrip("+"), counted)
        await import_jsonl(memory, path)

asyncio.run(main())
"""


def open_store(folder: str | Path) -> Any:
    return open_memory(folder, clock=ManualClock(IMPORTED_AT), plugin=REINFORCE)


async def _export(folder: Path, path: Path) -> dict[str, int]:
    """A store with every kind of thing an export holds, exported to ``path``: a graph, an RTM tree,
    history rows of several instants per memory, importance after decay, two fired triggers, the
    context window the keyword context was written with."""
    clock = ManualClock(START)
    async with open_memory(folder, clock=clock, plugin=REINFORCE) as memory:
        await _fill(memory, clock)
        said: dict[str, list[Any]] = {}
        for user in ("ann", "bob"):
            said[user] = await memory.ingest_many(
                [
                    Message(
                        text=f"{text} (#{i})",
                        user_id=user,
                        chat_id=f"chat-{user}",
                        message_id=f"{user}{i}",
                        ts=clock.now() + timedelta(minutes=i),
                    )
                    for i, text in enumerate(SAID)
                ]
            )
        await memory.call_tool(
            "soul_narrative",
            {"action": "add", "user_id": "ann", "event": "Ann ran her first marathon", "importance": 0.9},
        )
        for _ in range(3):
            for user, results in said.items():
                for result in results[:6]:
                    await memory.mark_used(result.memory_ids, user_id=user)
            clock.advance(days=2)
            await memory.decay()
        return await export_store(memory, path)


# A column the database numbers itself, which an export leaves out (on PostgreSQL, the order RTM
# trees were written in; a trial write rolled back uses numbers up): its order is compared.
NUMBERED = {"rtm_trees": "written"}


async def _dump(folder: Path) -> dict[str, list[str]]:
    """Every row of every table of the store, each table's rows sorted."""
    async with open_store(folder) as memory, memory.store.sql() as db:
        if db.dialect == "sqlite":
            listed = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        else:
            listed = (
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() ORDER BY table_name"
            )
        dump = {}
        for (table,) in await db.fetchall(listed):
            shown = ", ".join(
                f'rank() OVER (ORDER BY "{c.name}")' if NUMBERED.get(table) == c.name else f'"{c.name}"'
                for c in await table_columns(db, table)
            )
            dump[table] = sorted(map(repr, await db.fetchall(f'SELECT {shown} FROM "{table}"')))
        return dump


def _killed_import(folder: Path, path: Path, step: str, nth: int) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(TESTS), str(folder), str(path), step, str(nth)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert child.returncode == -9, f"not killed at {step} #{nth}: {child.returncode}\n{child.stderr[-2000:]}"


# (step, which call): what the killed run had written when it died.
STEPS = {
    "memories committed, no history": ("import_records+", 1),
    "history half written": ("set_current_importance", 12),
    "history written, no state": ("state_put", 1),
    "one state entry of three": ("state_put", 2),
    "in the graph's transaction": ("insert_rows:graph_edges", 1),
    "between the graph and the trees": ("insert_rows:rtm_trees", 1),
}


# All steps in one run by default; each on its own too with NARRMEM_LONG_TESTS=1.
CASES = variants((list(STEPS), "each in turn"), *(([step], step) for step in STEPS))


@pytest.mark.parametrize("steps", [case for case, _ in CASES], ids=[name for _, name in CASES])
async def test_a_killed_import_run_again_ends_as_one_whole_import(tmp_path: Path, steps: list[str]) -> None:
    path, killed, clean = tmp_path / "export.jsonl", tmp_path / "killed", tmp_path / "clean"
    # Opened first, so that on PostgreSQL (TESTS_STORE=postgres) it has the database the child
    # process is given; each other folder gets one of its own.
    async with open_store(killed):
        pass
    written = await _export(tmp_path / "source", path)
    assert written["importance"] and written["state"] == 3 and written["rtm.trees"]
    async with open_store(clean) as memory:
        whole = await import_jsonl(memory, path)
    assert whole["importance"] > 12 and whole["imported"] == written["memories"]
    expected = await _dump(clean)
    assert {"memories", "memory_history", "plugin_state", "graph_edges", "rtm_trees"} <= set(expected)

    for step in steps:
        _killed_import(killed, path, *STEPS[step])
    async with open_store(killed) as memory:
        await import_jsonl(memory, path)
    assert await _dump(killed) == expected

    async with open_store(killed) as memory:
        again = await import_jsonl(memory, path)
    assert again["imported"] == 0 and not any(n for section, n in again.items() if section != "skipped")
    assert await _dump(killed) == expected


async def test_an_open_after_a_cut_import_says_so_until_it_is_run_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed after its memories, before the graph, the store opened as if whole: a bot wrote in
    it, took the ids the file's graph keeps, and every later run of the import was refused."""
    path, killed = tmp_path / "export.jsonl", tmp_path / "killed"
    async with open_store(killed):
        pass
    await _export(tmp_path / "source", path)
    _killed_import(killed, path, *STEPS["in the graph's transaction"])
    with caplog.at_level("WARNING", logger="narrmem"):
        async with open_store(killed) as memory:
            cut = (await memory.stats())["import_cut_short"]
            assert cut["file"] == str(path.resolve())
            await import_jsonl(memory, path)
            assert "import_cut_short" not in await memory.stats()
    assert any("did not end: run it again" in record.getMessage() for record in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="narrmem"):
        async with open_store(killed):
            pass
    assert not any("did not end" in record.getMessage() for record in caplog.records)
