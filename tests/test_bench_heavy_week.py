"""``bench/heavy_week.py`` fills one user's week and times plain and mood messages after it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import heavy_week

pytestmark = pytest.mark.slow


def test_a_small_week_is_timed_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "week.json"
    assert heavy_week.main(["--messages", "30", "--samples", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    assert result["memories"] >= 30
    assert result["mood_messages"] == 3
    assert result["plain"]["p50_ms"] > 0 and result["mood"]["p50_ms"] > 0
    assert result["mood_messages_counted"] >= 1  # the same mood said twice in the week is counted


def test_too_few_samples_are_refused() -> None:
    with pytest.raises(SystemExit) as exc:
        heavy_week.parse_args(["--samples", "1"])
    assert exc.value.code == 2
