"""The worked plugin of docs/plugins.md, installed the way a third party's is (a distribution with
an entry point in the ``narrmem`` group) and run through a real Memory."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import msg

import narrmem
from narrmem.config import load_settings
from narrmem.testing import TestingPlugin

EXAMPLE = Path(__file__).parent.parent / "docs" / "example_plugin" / "spoiler_guard.py"


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[None]:
    """A site folder holding the module and its distribution metadata, first on ``sys.path``: what
    ``pip install spoiler-guard`` leaves behind, as importlib.metadata sees it."""
    site = tmp_path / "site"
    info = site / "spoiler_guard-1.0.dist-info"
    info.mkdir(parents=True)
    shutil.copy(EXAMPLE, site / "spoiler_guard.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spoiler-guard\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[narrmem]\nspoiler_guard = spoiler_guard:SpoilerGuard\n")
    sys.path.insert(0, str(site))
    try:
        yield
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("spoiler_guard", None)


async def test_the_documented_plugin_runs_as_a_third_party_entry_point(
    installed: None, tmp_path: Path
) -> None:
    settings = load_settings(
        None,
        data_dir=str(tmp_path / "store"),
        embedder={"backend": "hash"},
        plugin={"spoiler_guard": {"marker": "||"}},
    )
    async with narrmem.Memory.open(
        settings=settings, plugins=[TestingPlugin()], load_entrypoints=True
    ) as mem:
        assert "spoiler_guard" in mem.host.plugin_names()
        spoiler = await mem.ingest(msg("m1", "||the butler did it, I decided to tell nobody||", user="ann"))
        kept = await mem.ingest(msg("m2", "I decided to learn the cello", user="ann"))
        assert (spoiler.stored, spoiler.reason, kept.stored) == (False, "spoiler", True)
        assert (await mem.call_tool("spoiler_count", {"user_id": "ann"}))["refused"] == 1
        with pytest.raises(narrmem.InputError, match="user_id"):
            await mem.call_tool("spoiler_count", {"user_id": ""})
        await mem.forget(user_id="ann")
        assert (await mem.call_tool("spoiler_count", {"user_id": "ann"}))["refused"] == 0


async def test_the_documented_plugin_validates_its_own_table(installed: None, tmp_path: Path) -> None:
    settings = load_settings(
        None,
        data_dir=str(tmp_path / "store"),
        embedder={"backend": "hash"},
        plugin={"spoiler_guard": {"markr": "!!"}},
    )
    with pytest.raises(narrmem.ConfigError, match="markr"):
        async with narrmem.Memory.open(settings=settings, plugins=[TestingPlugin()], load_entrypoints=True):
            pass


async def test_forgetting_a_user_leaves_the_user_whose_id_begins_with_theirs(
    installed: None, tmp_path: Path
) -> None:
    """``Store.state_delete`` deletes by key prefix: with the example's old keys (tenant and user
    joined by a separator), forgetting "ann" deleted "anna"'s count too."""
    settings = load_settings(None, data_dir=str(tmp_path / "store"), embedder={"backend": "hash"})
    async with narrmem.Memory.open(
        settings=settings, plugins=[TestingPlugin()], load_entrypoints=True
    ) as mem:
        await mem.ingest(msg("m1", "||the butler did it||", user="ann"))
        await mem.ingest(msg("m2", "||the gardener did it||", user="anna"))
        await mem.ingest(msg("m3", "||the cook did it||", user="anna"))
        await mem.forget(user_id="ann")
        assert (await mem.call_tool("spoiler_count", {"user_id": "ann"}))["refused"] == 0
        assert (await mem.call_tool("spoiler_count", {"user_id": "anna"}))["refused"] == 2
