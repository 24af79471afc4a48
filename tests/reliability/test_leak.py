"""After forget and close, no byte of the data folder holds a forgotten user's markers or vectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from .common import LONG
from .leak import STORED, SURFACES, TENANTS, run_leak

pytestmark = pytest.mark.reliability

USERS = 12 if LONG else 6


@pytest.mark.parametrize("acknowledge", ["after_hooks", "on_receipt"])
def test_forget_leaves_no_byte_behind(tmp_path: Path, acknowledge: str) -> None:
    """With ``on_receipt`` every message also passed through the store as it came."""
    report = run_leak(USERS, seed=7, workdir=tmp_path, real_model=LONG, acknowledge=acknowledge)
    assert report["forgotten"] == USERS // 2
    assert report["markers_forgotten"] == report["forgotten"] * len(SURFACES)
    # The search sees what is stored: every marker and vector that stays is found.
    kept_people = len(TENANTS) * USERS - report["forgotten"]
    assert report["kept_markers"] == kept_people * len(STORED)
    assert report["kept_markers_found"] == report["kept_markers"], report["kept_missing"]
    assert report["kept_vectors_checked"] > 0
    assert report["kept_vectors_found"] == report["kept_vectors_checked"]
    assert report["vectors_checked"] > report["vectors_unverifiable"]
    # And nothing of the forgotten users is left, in answers or in bytes.
    assert report["answers_with_forgotten"] == 0
    assert report["leaked_markers"] == 0, (report["by_surface"], report["by_file"], report["examples"])
    assert report["vectors_found"] == 0, report["vectors_by_file"]
