"""Shared fixtures: narrmem's own testing fixtures (``memory``, ``memory_factory``) plus helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest_plugins = ["narrmem.testing"]

TESTS_DIR = Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


@pytest.fixture(autouse=True)
def _clean_narrmem_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No NARRMEM_* variable from the outside world may change what a test sees."""
    import os

    for key in list(os.environ):
        if key.startswith("NARRMEM_"):
            monkeypatch.delenv(key)
