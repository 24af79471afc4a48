"""``narrmem_weigh``: each plugin's weight is shown in ``Why.boosts`` under its name, and a weight
outside [0, 1], which the hook's contract forbids, is reported as that plugin's error and left out
(before, it was clamped without a word: a weight of 2 cancelled another plugin's decay)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem import hookimpl
from narrmem.testing import open_memory


class Weighs:
    narrmem_name = "weighs"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    @hookimpl
    def narrmem_weigh(self, records: dict[int, Any]) -> dict[int, float]:
        return dict.fromkeys(records, self.weight)


async def _why(tmp_path: Path, weight: float) -> tuple[Any, list[tuple[str, str]]]:
    async with open_memory(tmp_path / str(weight), plugins=[Weighs(weight)]) as mem:
        await mem.ingest(msg("m1", "I adopted a greyhound named Pixel", user="ann"))
        [hit, *_] = await mem.recall("greyhound Pixel", user_id="ann", reinforce=False)
        errors = [(plugin, hook) for plugin, hook, _ in mem.host.errors]
    return hit.why, errors


async def test_each_plugins_weight_is_shown_by_name(tmp_path: Path) -> None:
    why, errors = await _why(tmp_path, 0.5)
    assert errors == []
    assert why.boosts["weighs"] == 0.5 and "hippocampus" in why.boosts
    # Each is rounded to four places on its own: the product of the rounded boost may differ
    # from the rounded product in the last place, as the clock's time of day has it.
    assert why.importance_factor == pytest.approx(0.5 * why.boosts["hippocampus"], abs=1.5e-4)


async def test_a_weight_of_zero_sinks_the_memory(tmp_path: Path) -> None:
    import numpy as np

    why, errors = await _why(tmp_path, 0.0)
    assert errors == [] and why.boosts["weighs"] == 0.0 and why.importance_factor == 0.0
    why, errors = await _why(tmp_path / "np", np.float64(0.5))
    assert errors == [] and why.boosts["weighs"] == 0.5


async def test_a_weight_outside_the_contract_is_reported_and_left_out(tmp_path: Path) -> None:
    for weight in (2.0, -1.0, float("nan")):
        why, errors = await _why(tmp_path, weight)
        assert errors == [("weighs", "narrmem_weigh")], weight
        assert "weighs" not in why.boosts
        assert why.importance_factor == why.boosts["hippocampus"]
