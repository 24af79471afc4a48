"""Bad input at every door gets a clear error and loses nothing: the seeded fuzz run of
``fuzz.py`` over the API, the tools, the CLI, config and environment, chat imports and export
files. About 2,000 inputs by default; 10,000 with NARRMEM_RELIABILITY_LONG=1."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from narrmem import InputError, Memory

from .common import LONG
from .fuzz import run_fuzz

pytestmark = pytest.mark.reliability

COUNT = 10_000 if LONG else 2_000
SEED = 20261201
DOORS = {"api", "tool", "import", "cli", "config", "subprocess"}


def test_fuzz_every_door(tmp_path: Path) -> None:
    figures = run_fuzz(COUNT, SEED, tmp_path)
    assert figures["inputs"] == COUNT
    assert figures["accepted"] + figures["refused"] + figures["untyped"] == COUNT
    assert set(figures["by_door"]) == DOORS
    # Mostly bad input, and every door refused some of it: the harness reached the checks.
    assert figures["refused"] > 0.7 * COUNT
    assert all(counts.get("refused", 0) > 0 for counts in figures["by_door"].values()), figures["by_door"]
    assert figures["untyped"] == 0, figures["untyped_kinds"]
    assert figures["cli_tracebacks"] == 0, figures["cli_traceback_examples"]
    assert figures["cli_messages_not_one_line"] == 0, figures["cli_message_examples"]
    assert figures["rows_changed_by_refused"] == 0, figures["rows_changed_examples"]
    assert figures["foreign_files_touched"] == 0, figures["foreign_files"]
    # An exception a plugin raised and the host isolated is a crash nobody typed either.
    assert figures["logged_errors"] == 0, figures["logged_error_kinds"]


def _same(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figures.items() if k != "seconds_by_door"}


def test_the_same_seed_runs_the_same_inputs(tmp_path: Path) -> None:
    first = run_fuzz(120, 7, tmp_path / "first")
    again = run_fuzz(120, 7, tmp_path / "again")
    other = run_fuzz(120, 8, tmp_path / "other")
    assert _same(first) == _same(again)
    assert _same(first) != _same(other)


def test_the_harness_sees_what_it_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness that counts nothing proves nothing: break narrmem on purpose and watch it count."""
    numbers = itertools.count()

    async def untyped(self: Memory, memory_id: int) -> dict[str, Any]:
        raise AttributeError("history broken on purpose")

    async def writes_then_refuses(self: Memory, now: Any = None) -> dict[str, int]:
        message = {
            "text": "written before refusing",
            "user_id": "u9",
            "chat_id": "c9",
            "ts": "2026-05-04T09:00:00+00:00",
            "message_id": f"w{next(numbers)}",
        }
        await self.ingest(message)
        raise InputError("refused after a write", field="now")

    monkeypatch.setattr(Memory, "history", untyped)
    monkeypatch.setattr(Memory, "decay", writes_then_refuses)
    figures = run_fuzz(600, 3, tmp_path)
    kinds = figures["untyped_kinds"]
    assert any(kind.startswith("AttributeError") for kind in kinds), kinds
    assert figures["rows_changed_by_refused"] > 0
