"""What a stopped export leaves (narrmem.doors.export_files): the next export to the same file
deletes it; an export still running elsewhere and files that are not an export's are left be."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import msg

from narrmem.doors import export_files
from narrmem.doors.transfer import export_jsonl
from narrmem.testing import open_memory

# A process that begins an export's file as an export does (its header, then a memory of Ann's)
# and is killed before it is complete.
# With ``named``, on a system (or file system) without unnamed files: the export's file has its
# name from the start.
KILLED_EXPORT = """
import os, signal, sys
from pathlib import Path
from narrmem.doors import export_files
target, named = Path(sys.argv[1]), sys.argv[3] == "named"
if named:
    export_files._unnamed_file = lambda folder: None
with export_files.partial_file(target) as out:
    out.write(sys.argv[2] + "\\n" + '{"text": "Ann: my PIN is 4321"}\\n')
    out.flush()
    print("\\n".join(str(p) for p in target.parent.glob("." + target.name + ".*.partial")), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_export(target: Path, header: str, *, named: bool = True) -> Path | None:
    """The file of an export to ``target`` whose process was killed in the middle, if it left one."""
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_EXPORT, str(target), header, "named" if named else "unnamed"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode < 0  # killed, as a process stopped in the middle of an export
    left = killed.stdout.strip()
    return Path(left) if left else None


def text_of(path: Path) -> str:
    return path.read_text()


def unnamed_files(folder: Path) -> bool:
    fd = export_files._unnamed_file(folder)
    if fd is not None:
        os.close(fd)
    return fd is not None


def files_in(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def partials(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.*.partial"))


async def header_line(tmp_path: Path) -> str:
    async with open_memory(tmp_path / "store") as memory:
        await memory.ingest(msg("1", "My PIN is 4321, do not tell anyone", user="ann"))
        target = tmp_path / "probe.jsonl"
        await export_jsonl(memory, target)
    return target.read_text().splitlines()[0]


async def test_the_file_a_killed_export_left_is_deleted_by_the_next_export(tmp_path: Path) -> None:
    header = await header_line(tmp_path)
    target = tmp_path / "backup.jsonl"
    left = killed_export(target, header)
    assert left is not None and partials(target) == [left] and "4321" in text_of(left)
    async with open_memory(tmp_path / "store") as memory:
        await export_jsonl(memory, target)
    assert partials(target) == []
    assert json.loads(target.read_text().splitlines()[0])["format"] == json.loads(header)["format"]


async def test_a_killed_export_leaves_no_file_where_files_can_be_unnamed(tmp_path: Path) -> None:
    """Linux's unnamed files: the export's file has no name until it is complete, and a process
    killed while it writes leaves nothing (a named file stayed, the words of people forgotten since
    in it, until the next export to the same file)."""
    header = await header_line(tmp_path)
    target = tmp_path / "backup.jsonl"
    if not unnamed_files(tmp_path):
        pytest.skip("no unnamed files on this system or file system")
    before = files_in(tmp_path)
    assert killed_export(target, header, named=False) is None
    assert files_in(tmp_path) == before
    async with open_memory(tmp_path / "store") as memory:
        await export_jsonl(memory, target)
    assert json.loads(target.read_text().splitlines()[0])["format"] == json.loads(header)["format"]
    assert partials(target) == []


async def test_a_running_exports_file_and_files_not_an_exports_are_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_files, "_unnamed_file", lambda folder: None)  # named from the start
    header = await header_line(tmp_path)
    target = tmp_path / "backup.jsonl"
    export = export_files.partial_file(target)  # held, as by an export in another process
    out = export.__enter__()
    out.write(header + "\n")
    out.flush()
    [running] = partials(target)
    mine = target.parent / f".{target.name}.notes.partial"
    mine.write_text("my own notes, named like an export's file\n")
    empty = target.parent / f".{target.name}.abcd1234.partial"
    empty.write_text("")
    fifo = target.parent / f".{target.name}.fifo1234.partial"
    os.mkfifo(fifo)  # opened to be read, it would wait for a writer
    try:
        async with open_memory(tmp_path / "store") as memory:
            await export_jsonl(memory, target)
        assert partials(target) == sorted([running, mine, empty, fifo])
        assert mine.read_text() == "my own notes, named like an export's file\n"
    finally:
        with contextlib.suppress(RuntimeError):
            export.__exit__(RuntimeError, RuntimeError("stopped"), None)  # deletes it
    async with open_memory(tmp_path / "store") as memory:
        await export_jsonl(memory, target)  # the running one has stopped since
    assert partials(target) == sorted([mine, empty, fifo])
