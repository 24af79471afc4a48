"""``narrmem demo`` shows what makes narrmem different, through the real command and the real model:
the scenes it wrote, a fact from the graph, a trigger firing, recall, and a memory fading and then
reinforced, with the history that records it. It writes only a new store."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from _helpers import run_narrmem

pytestmark = pytest.mark.slow

ENV = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {"HF_HUB_OFFLINE": "1"}


def narrmem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_narrmem(*args, cwd=cwd, env=ENV | {"TMPDIR": str(cwd)}, timeout=600)


def _number(label: str, text: str) -> float:
    found = re.search(rf"{label}:\s+([0-9.]+)", text)
    assert found, (label, text)
    return float(found.group(1))


def test_the_demo_shows_scenes_facts_a_trigger_recall_and_fading(tmp_path: Path) -> None:
    done = narrmem("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    scenes = out.split("== Scenes it wrote")[1].split("==")[0]
    assert "[decision] Alice, from dm-alice-3:" in scenes and "Scene: Deciding to quit" in scenes
    facts = out.split("== Facts in the graph")[1].split("==")[0]
    assert re.search(r"alice: user -\w+-> .+\(from dm-alice-\d+\)", facts), facts
    triggers = out.split("== Triggers")[1].split("==")[0]
    assert re.search(r"topic '.+' for (alice|bob|wei): ", triggers), triggers
    assert "? What did Alice decide about her job?" in out and "<- dm-alice-3" in out
    today = _number("importance today", out)
    faded = _number("90 days later, never recalled", out)
    reinforced = _number("the bot uses it in an answer that day", out)
    assert today > faded and reinforced > faded, (today, faded, reinforced)
    assert re.search(r"history: 2026-08-28 bot: [0-9.]+ -> [0-9.]+ \(used\)", out), out
    # A temporary folder of its own (under TMPDIR, here tmp_path), gone afterwards; no store in cwd.
    assert "ran in a temporary folder" in out
    assert not list(tmp_path.glob("narrmem-demo-*")) and not list(tmp_path.rglob("*.sqlite3"))


def test_the_demo_keeps_a_new_data_folder_and_refuses_an_existing_store(tmp_path: Path) -> None:
    data = tmp_path / "demo-data"
    done = narrmem("demo", "--k", "1", "--data", str(data), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (data / "narrmem.sqlite3").is_file() and f"store is in {data}" in done.stdout
    again = narrmem("demo", "--data", str(data), cwd=tmp_path)
    assert again.returncode == 2
    assert "already holds one" in again.stderr and "--data" in again.stderr
