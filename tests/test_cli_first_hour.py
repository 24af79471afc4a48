"""What a new user meets in the first hour: ``--version``, read commands on a folder that holds no
store, a naive timestamp, a missing torch and the first start's ONNX export, the package metadata."""

from __future__ import annotations

import logging
import os
import subprocess
import tomllib
from datetime import datetime
from pathlib import Path

import pytest
from _helpers import run_narrmem
from narrmem_plugins.embedder_onnx import OnnxEmbedder

from narrmem import InputError, Message, __version__

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {"HF_HUB_OFFLINE": "1"}


def narrmem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_narrmem(*args, cwd=cwd, env=ENV)


def test_version(tmp_path: Path) -> None:
    done = narrmem("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"narrmem {__version__}"


@pytest.mark.parametrize(
    "args",
    [
        ["recall", "where do I live?", "--user", "u1"],
        ["recall", "where do I live?", "--user", "u1", "--reinforce"],
        ["stats"],
        ["export", "out.jsonl"],
        ["history", "1"],
    ],
)
def test_a_read_command_on_a_missing_store_exits_2_and_creates_nothing(
    tmp_path: Path, args: list[str]
) -> None:
    data = tmp_path / "nowhere"
    done = narrmem(*args, "--data", str(data), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"no narrmem store at {data}" in done.stderr
    assert not data.exists() and not (tmp_path / "out.jsonl").exists()


def test_a_naive_timestamp_is_an_input_error_naming_ts() -> None:
    with pytest.raises(InputError) as caught:
        Message(text="hi", user_id="u1", chat_id="c1", ts=datetime(2024, 5, 1, 12), message_id="1")
    assert caught.value.field == "ts" and "timezone" in str(caught.value)


def test_a_first_start_without_torch_exports_and_runs(tmp_path: Path) -> None:
    """The default onnx backend builds its export from the weights without torch: a first start
    with torch unimportable says it exports, then answers."""
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from narrmem.doors.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = ENV | {"NARRMEM_EMBEDDER__CACHE_DIR": str(tmp_path / "cache")}
    done = run_narrmem("triage", "I moved to Lisbon last spring", cwd=tmp_path, env=env, entry=("-c", code))
    assert done.returncode == 0, done.stderr
    assert "exporting the embedding model to ONNX" in done.stderr  # said before the export starts


def test_the_torch_backend_without_torch_names_the_extra(tmp_path: Path) -> None:
    """The sentence-transformers backend does need torch: the user is told what to install, not
    'internal error: ModuleNotFoundError'."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['sentence_transformers'] = None; "
        "from narrmem.doors.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = ENV | {"NARRMEM_EMBEDDER__BACKEND": "sentence-transformers"}
    done = run_narrmem("triage", "I moved to Lisbon last spring", cwd=tmp_path, env=env, entry=("-c", code))
    assert done.returncode == 2, done.stderr
    assert "narrmem[torch]" in done.stderr and "internal error" not in done.stderr


@pytest.mark.slow
async def test_the_first_start_says_it_exports_and_later_starts_do_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="narrmem.onnx"):
        first = OnnxEmbedder(None, tmp_path)
        await first.start()
        await first.close()
        exported = [r.getMessage() for r in caplog.records]
        caplog.clear()
        again = OnnxEmbedder(None, tmp_path)
        await again.start()
        await again.close()
    assert len(exported) == 1 and "exporting the embedding model to ONNX once" in exported[0]
    assert caplog.records == []


def test_package_metadata_has_keywords_classifiers_and_the_torch_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert {"memory", "chatbot", "mcp"} <= set(project["keywords"])
    assert "Programming Language :: Python :: 3.11" in project["classifiers"]
    assert any(c.startswith("Framework :: AsyncIO") for c in project["classifiers"])
    assert any("sentence-transformers" in dep for dep in project["optional-dependencies"]["torch"])
