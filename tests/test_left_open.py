"""A memory its program leaves open is closed when the program's ``asyncio.run`` ends: the process
exits (the store's connection thread would otherwise keep it alive forever, holding the data
folder), and the after-store hooks still waiting are not lost. Real SQLite file, real model, real
processes."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from narrmem.settling import NAMESPACE
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only

LEFT_OPEN = textwrap.dedent(
    """
    import asyncio, sys
    from narrmem.testing import open_memory

    async def main(folder, ending, ts):
        memory = await open_memory(folder, real_model=True, storage={"acknowledge": "after_write"})
        for n, text in enumerate(["so tired today", "so tired again today", "still so tired today"]):
            result = await memory.ingest({"text": text, "user_id": "ann", "chat_id": "dm-ann", "ts": ts,
                                          "message_id": f"ann-{n}"})
            print(result.stored, result.settled, flush=True)
        if ending == "raises":
            raise RuntimeError("the bot's own code failed")
        # "returns": the program forgot to close the memory

    asyncio.run(main(*sys.argv[1:4]))
    """
)


async def run_left_open(folder: Path, ending: str) -> tuple[int | None, str, str]:
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LEFT_OPEN,
        str(folder),
        ending,
        (datetime.now(UTC) - timedelta(hours=1)).isoformat(),  # within the readout's window
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(worker.communicate(), timeout=120)
    except TimeoutError:
        worker.kill()
        await worker.wait()
        pytest.fail(f"a program that left its memory open ({ending}) did not exit")
    return worker.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("ending", ["returns", "raises"])
async def test_a_memory_left_open_lets_its_process_exit_losing_no_hook(tmp_path: Path, ending: str) -> None:
    code, out, err = await run_left_open(tmp_path, ending)
    assert code == (0 if ending == "returns" else 1), err[-3000:]
    assert out.split() == ["True", "False"] * 3  # stored, acknowledged before their hooks ran
    if ending == "raises":
        assert "the bot's own code failed" in err
    # Nothing is lost: the hooks ran at the close, or (cancelled with the loop) at the next open.
    async with open_memory(tmp_path, real_model=True) as memory:  # the folder is free again
        counts = (await memory.patterns(user_id="ann"))["counts"]
        assert await memory.store.state_items(NAMESPACE) == []
    assert ("emotion", "tired", 3) in {(c["kind"], c["label"], c["count"]) for c in counts}


async def test_a_closed_memory_leaves_no_task_behind(tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    memory = await open_memory(tmp_path)
    guards = [t for t in asyncio.all_tasks() - before if "close the memory" in t.get_name()]
    assert len(guards) == 1  # the task that closes it with the loop
    await memory.close()
    assert asyncio.all_tasks() - before == set()
    await memory.close()  # twice is harmless
