"""Kill -9 at a random moment while ingesting (single and bulk) or forgetting, then reopen: nothing
acknowledged is lost, the vector index agrees with SQLite, an interrupted forget is finished."""

from __future__ import annotations

from pathlib import Path

import pytest

from .common import LONG
from .crash import FORGET_STEPS, run_crash

pytestmark = pytest.mark.reliability

# Quick: 15 runs in all (4 ingest and bulk, 3 on receipt, 3 forget, 5 forgets killed at each step);
# long: 65.
INGEST_RUNS = 32 if LONG else 4
FORGET_RUNS = 16 if LONG else 3
RECEIPT_RUNS = 12 if LONG else 3


def test_kill_during_ingest_loses_nothing_acknowledged(tmp_path: Path) -> None:
    figures = run_crash(INGEST_RUNS, seed=20260504, workdir=tmp_path, kinds=("ingest", "bulk"))
    assert figures["runs_by_kind"] == {"bulk": INGEST_RUNS // 2, "ingest": INGEST_RUNS - INGEST_RUNS // 2}
    assert figures["real_model_runs"] == {"bulk": 1, "ingest": 1}
    # The kills landed while the child was writing: there was something to lose.
    assert figures["acknowledged"] > 10 * INGEST_RUNS
    assert figures["children_finished_before_kill"] < INGEST_RUNS
    assert figures["failed_reopens"] == 0, figures["reopen_errors"]
    assert figures["lost"] == 0 and figures["scenes_lost"] == 0, figures["lost_examples"]
    assert figures["index_mismatches"] == 0
    assert figures["search_misses"] == 0
    assert figures["integrity_failures"] == 0, figures["integrity_examples"]
    assert figures["rebuilds_after_clean_close"] == 0


def test_kill_after_answers_on_receipt_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Acknowledged before it is written: the reopen writes what the killed process received."""
    figures = run_crash(RECEIPT_RUNS, seed=20261204, workdir=tmp_path, kinds=("receipt",))
    assert figures["runs_by_kind"] == {"receipt": RECEIPT_RUNS}
    assert figures["real_model_runs"] == {"receipt": 1}
    assert figures["acknowledged"] > 10 * RECEIPT_RUNS
    assert figures["children_finished_before_kill"] < RECEIPT_RUNS
    assert figures["failed_reopens"] == 0, figures["reopen_errors"]
    assert figures["lost"] == 0 and figures["scenes_lost"] == 0, figures["lost_examples"]
    assert figures["index_mismatches"] == 0
    assert figures["search_misses"] == 0
    assert figures["integrity_failures"] == 0, figures["integrity_examples"]
    assert figures["rebuilds_after_clean_close"] == 0


def test_kill_during_forget_is_finished_on_reopen(tmp_path: Path) -> None:
    figures = run_crash(FORGET_RUNS, seed=20260505, workdir=tmp_path, kinds=("forget",))
    assert figures["runs_by_kind"] == {"forget": FORGET_RUNS}
    assert figures["real_model_runs"] == {"forget": 1}
    assert figures["forgets_interrupted"] >= FORGET_RUNS // 2
    assert figures["forgets_returned"] > 0
    assert figures["failed_reopens"] == 0, figures["reopen_errors"]
    assert figures["forgets_half_done"] == 0, figures["leftover_examples"]
    assert figures["users_over_deleted"] == 0
    assert figures["leftover_traces"] == 0, figures["leftover_examples"]
    assert (
        figures["forgets_completed_on_reopen"] + figures["forgets_not_started"]
        == figures["forgets_interrupted"]
    )
    assert figures["index_mismatches"] == 0
    assert figures["integrity_failures"] == 0, figures["integrity_examples"]
    assert figures["rebuilds_after_clean_close"] == 0


def test_kill_at_each_step_of_a_forget(tmp_path: Path) -> None:
    steps = len(FORGET_STEPS)
    figures = run_crash(steps, seed=11, workdir=tmp_path, steps=FORGET_STEPS, real_model_runs=False)
    assert figures["steps_not_reached"] == []
    assert figures["steps_killed_at"] == dict.fromkeys(FORGET_STEPS, 1)
    assert figures["forgets_interrupted"] == len(FORGET_STEPS)
    assert figures["failed_reopens"] == 0, figures["reopen_errors"]
    assert figures["forgets_half_done"] == 0, figures["leftover_examples"]
    assert figures["users_over_deleted"] == 0
    assert figures["leftover_traces"] == 0, figures["leftover_examples"]
    assert figures["integrity_failures"] == 0, figures["integrity_examples"]
