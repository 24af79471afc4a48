"""Malformed settings through the real ``narrmem`` command: exit code 2, a message naming the
setting, and nothing created or changed on disk (the temporary folder, which holds the working
directory, is compared file by file before and after). Also an export aimed at a symbolic link."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_narrmem
from narrmem_plugins import embedder_onnx

from narrmem.config import EmbedderSettings, RecallSettings, StorageSettings, load_settings
from narrmem.errors import ConfigError

pytestmark = pytest.mark.sqlite_only("the CLI on --data folders of the SQLite store, read as files")

ENV = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {"HF_HUB_OFFLINE": "1"}
MESSAGE = {
    "text": "I love hiking in the Alps every summer",
    "user_id": "u1",
    "chat_id": "c1",
    "ts": "2026-01-01T10:00:00+00:00",
    "message_id": "1",
}


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``: a link's target, a file's bytes and inode, a folder."""
    found: dict[str, tuple[Any, ...]] = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(folder, name)
            if path.is_symlink():
                found[str(path)] = ("link", os.readlink(path))
            elif path.is_file():
                found[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_ino)
            else:
                found[str(path)] = ("folder",)
    return found


def narrmem(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_narrmem(*args, cwd=cwd, env=ENV | (env or {}), timeout=600)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The working directory of the command, inside the snapshotted temporary folder."""
    (tmp_path / "work").mkdir()
    (tmp_path / "messages.jsonl").write_text(json.dumps(MESSAGE) + "\n", encoding="utf-8")
    return tmp_path / "work"


def refused_ingest(
    work: Path, setting: str, *, toml: str | None = None, env: dict[str, str] | None = None
) -> None:
    """``narrmem ingest`` with the config ``toml`` or the variables ``env``: exit 2 naming ``setting``,
    no data folder, nothing changed under the temporary folder."""
    root = work.parent
    args = ["ingest", str(root / "messages.jsonl"), "--data", str(root / "data")]
    if toml is not None:
        (root / "config.toml").write_text(toml, encoding="utf-8")
        args += ["--config", str(root / "config.toml")]
    before = snapshot(root)
    done = narrmem(*args, cwd=work, env=env)
    assert done.returncode == 2, done.stderr
    assert setting in done.stderr
    assert "internal error" not in done.stderr
    assert not (root / "data").exists()
    assert snapshot(root) == before


# --- embedder.cache_dir ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "env"),
    [
        pytest.param('[embedder]\ncache_dir = "a\\u0000b"\n', None, id="nul-in-toml"),
        pytest.param('[embedder]\ncache_dir = " "\n', None, id="blank-in-toml"),
        pytest.param('[embedder]\ncache_dir = ""\n', None, id="empty-in-toml"),
        pytest.param(None, {"NARRMEM_EMBEDDER__CACHE_DIR": " "}, id="blank-in-environment"),
    ],
)
def test_cache_dir_that_names_no_folder_is_refused(
    work: Path, toml: str | None, env: dict[str, str] | None
) -> None:
    refused_ingest(work, "embedder.cache_dir", toml=toml, env=env)


def test_cache_dir_whose_onnx_entry_is_a_users_file_is_refused_before_a_store_is_made(work: Path) -> None:
    cache = work.parent / "cache"
    cache.mkdir()
    (cache / "onnx").write_text("my notes about onnx\n", encoding="utf-8")
    refused_ingest(work, "embedder.cache_dir", toml=f'[embedder]\ncache_dir = "{cache}"\n')


def test_cache_dir_that_is_a_users_file_is_refused(work: Path) -> None:
    cache = work.parent / "notes.txt"
    cache.write_text("mine\n", encoding="utf-8")
    refused_ingest(work, "embedder.cache_dir", toml=f'[embedder]\ncache_dir = "{cache}"\n')


@pytest.mark.slow
def test_model_files_that_cannot_be_written_are_a_config_error(tmp_path: Path) -> None:
    """The folder is taken after the memory was opened (between the check and the export): the
    failure is still an error naming the setting, and the user's file is left as it was."""
    embedder = embedder_onnx.OnnxEmbedder(None, embedder_onnx.check_cache_dir(tmp_path), quantize="none")
    (tmp_path / "onnx").write_text("mine\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"embedder\.cache_dir"):
        embedder._prepare()
    assert (tmp_path / "onnx").read_text(encoding="utf-8") == "mine\n"


# --- numbers are not booleans ----------------------------------------------------------------------


def test_a_boolean_number_setting_is_refused_by_the_command(work: Path) -> None:
    refused_ingest(work, "storage.batch_size", toml="[storage]\nbatch_size = true\n")


NUMBER_SETTINGS = [
    (section, name)
    for section, model in (
        ("storage", StorageSettings),
        ("embedder", EmbedderSettings),
        ("recall", RecallSettings),
    )
    for name, info in model.model_fields.items()
    if info.annotation in (int, float)
]


@pytest.mark.parametrize(("section", "name"), NUMBER_SETTINGS, ids=[f"{s}.{n}" for s, n in NUMBER_SETTINGS])
@pytest.mark.parametrize("value", [True, False])
def test_every_number_setting_refuses_a_boolean(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, section: str, name: str, value: bool
) -> None:
    for key in [k for k in os.environ if k.startswith("NARRMEM_")]:
        monkeypatch.delenv(key)
    config = tmp_path / "config.toml"
    config.write_text(f"[{section}]\n{name} = {str(value).lower()}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{section}\.{name}: .*not {str(value).lower()}"):
        load_settings(config)


def test_a_weight_that_is_a_boolean_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in [k for k in os.environ if k.startswith("NARRMEM_")]:
        monkeypatch.delenv(key)
    config = tmp_path / "config.toml"
    config.write_text("[recall]\nweights = { vector = true }\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"recall\.weights: .*'vector' must be a number"):
        load_settings(config)


def test_numbers_from_the_environment_and_the_file_are_still_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in [k for k in os.environ if k.startswith("NARRMEM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("NARRMEM_STORAGE__BATCH_SIZE", "5")
    monkeypatch.setenv("NARRMEM_STORAGE__MAX_TS_AHEAD_S", "3.5")
    monkeypatch.setenv("NARRMEM_EMBEDDER__THREADS", "2")
    monkeypatch.setenv("NARRMEM_RECALL__WEIGHTS", '{"vector": 2}')
    config = tmp_path / "config.toml"
    config.write_text("[storage]\nhnsw_m = 16\nhnsw_rebuild_ratio = 0.5\n", encoding="utf-8")
    settings = load_settings(config)
    assert settings.storage.batch_size == 5
    assert settings.storage.max_ts_ahead_s == 3.5
    assert settings.embedder.threads == 2
    assert settings.recall.weights == {"vector": 2.0}
    assert (settings.storage.hnsw_m, settings.storage.hnsw_rebuild_ratio) == (16, 0.5)


# --- no data folder for a store that is not there --------------------------------------------------


@pytest.mark.parametrize(
    "toml",
    [
        pytest.param('[storage]\nbackend = "nosuch"\n', id="unknown-backend"),
        pytest.param('[plugins]\ndisabled = ["storage_sqlite"]\n', id="backend-disabled"),
    ],
)
def test_a_store_backend_that_is_not_there_creates_no_data_folder(work: Path, toml: str) -> None:
    refused_ingest(work, "storage.backend", toml=toml)


# --- an export aimed at a symbolic link ------------------------------------------------------------


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stored")
    (root / "messages.jsonl").write_text(json.dumps(MESSAGE) + "\n", encoding="utf-8")
    done = narrmem("ingest", str(root / "messages.jsonl"), "--data", str(root / "data"), cwd=root)
    assert done.returncode == 0, done.stderr
    return root / "data"


@pytest.mark.slow
@pytest.mark.parametrize("dangling", [False, True], ids=["link-to-an-export", "dangling-link"])
def test_an_export_to_a_symbolic_link_is_refused(stored: Path, tmp_path: Path, dangling: bool) -> None:
    earlier = tmp_path / "old-export.jsonl"
    done = narrmem("export", str(earlier), "--data", str(stored), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    link = tmp_path / "latest.jsonl"
    link.symlink_to(tmp_path / "gone.jsonl" if dangling else earlier)
    before = snapshot(tmp_path)
    done = narrmem("export", str(link), "--data", str(stored), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "latest.jsonl" in done.stderr and "symbolic link" in done.stderr
    assert snapshot(tmp_path) == before
    assert link.is_symlink()


async def test_every_plugins_number_option_refuses_a_boolean(tmp_path: Path) -> None:
    """A plugin's own ``[plugin.<name>]`` table too: ``candidates = true`` was one candidate."""
    from narrmem.configured import Configured
    from narrmem.testing import open_memory

    async with open_memory(tmp_path / "m") as memory:
        configured = [p for p in memory.host.pm.get_plugins() if isinstance(p, Configured)]
    numbers = [
        (plugin.narrmem_name, name)
        for plugin in configured
        for name, info in type(plugin.options).model_fields.items()
        if info.annotation in (int, float, int | None, float | None)
    ]
    assert len({plugin for plugin, _ in numbers}) >= 5  # triage, recall, hippocampus, proactive...
    for plugin, name in numbers:
        with pytest.raises(ConfigError, match=re.escape(f"plugin.{plugin}.{name}: must be a number")):
            async with open_memory(tmp_path / "n", plugin={plugin: {name: True}}):
                pass
    with pytest.raises(ConfigError, match=re.escape("plugin.recall_hybrid.answer.bias: must be a number")):
        async with open_memory(tmp_path / "n", plugin={"recall_hybrid": {"answer": {"bias": False}}}):
            pass


async def test_a_folder_given_in_code_over_the_environments_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A service sets NARRMEM_DATA_DIR and runs a bot that names its folder (as the examples did):
    the bot wrote one folder and `narrmem stats` read the other, and nothing said so."""
    from narrmem.memory import Memory
    from narrmem.testing import HASH_EMBEDDER, TestingPlugin

    monkeypatch.setenv("NARRMEM_DATA_DIR", str(tmp_path / "service"))
    settings = load_settings(embedder={"backend": HASH_EMBEDDER})
    with caplog.at_level("WARNING", logger="narrmem"):
        async with Memory.open(str(tmp_path / "code"), settings=settings, plugins=[TestingPlugin()]):
            pass
        async with Memory.open(settings=settings, plugins=[TestingPlugin()]) as memory:
            assert memory.data_dir == tmp_path / "service"
        # The same folder spelled otherwise is no other folder.
        async with Memory.open(f"{tmp_path / 'service'}/", settings=settings, plugins=[TestingPlugin()]):
            pass
    named = [r.getMessage() for r in caplog.records if "NARRMEM_DATA_DIR" in r.getMessage()]
    assert len(named) == 1 and str(tmp_path / "code") in named[0]
    assert not (tmp_path / "service" / "code").exists()
