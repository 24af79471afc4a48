"""``bench/ab.py`` compares two source trees in alternating child processes: each child imports
the narrmem of its own tree, the stores are filled alike, and the report holds every round."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _helpers import LONG_TESTS

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import ab

pytestmark = pytest.mark.slow
# The tool's other modes each start children that load the model: with NARRMEM_LONG_TESTS=1.
long_only = pytest.mark.skipif(not LONG_TESTS, reason="a long variant: NARRMEM_LONG_TESTS=1")

ROOT = Path(__file__).parent.parent


def test_two_trees_alternate_and_fill_alike(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    code = ab.main(
        [
            "--a",
            str(ROOT),
            "--b",
            str(ROOT),
            "--size",
            "300",
            "--pairs",
            "2",
            "--samples",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert [r["order"] for r in report["rounds"]] == ["AB", "BA"]
    assert report["fill"]["A"] == report["fill"]["B"]
    assert report["fill"]["A"]["records"] == 300
    for name in ("A", "B"):
        figures = report["median"][name]
        assert set(figures) == set(ab.FIGURES)
        assert all(value > 0 for value in figures.values())
    assert set(report["b_over_a"]) == set(ab.FIGURES)


def test_a_child_runs_the_narrmem_of_its_tree(tmp_path: Path) -> None:
    """A tree whose narrmem cannot be imported fails its child, named in the error: the child
    does not fall back to the installed narrmem."""
    broken = tmp_path / "tree"
    (broken / "narrmem").mkdir(parents=True)
    (broken / "plugins").mkdir()
    (broken / "narrmem" / "__init__.py").write_text("raise ImportError('the broken tree')\n")
    with pytest.raises(SystemExit, match="the broken tree"):
        ab.run_child(broken, tmp_path / "shim", "fill", str(tmp_path / "store"), "10", "7")


@long_only
def test_bulk_rounds_alone_compare_the_bulk_ratio(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    code = ab.main(
        ["--a", str(ROOT), "--b", str(ROOT), "--size", "0", "--bulk", "40", "--pairs", "1", "--out", str(out)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["fill"] == {}
    for name in ("A", "B"):
        assert set(report["median"][name]) == set(ab.BULK_FIGURES)
        assert 0 < report["median"][name]["bulk_ratio"] < 5
    assert set(report["b_over_a"]) == set(ab.BULK_FIGURES)


def test_nothing_to_compare_is_refused() -> None:
    with pytest.raises(SystemExit) as exc:
        ab.parse_args(["--a", ".", "--b", ".", "--size", "0"])
    assert exc.value.code == 2


@long_only
def test_the_same_store_is_filled_once_and_copied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ab.json"
    args = ["--a", str(ROOT), "--b", str(ROOT), "--size", "200", "--pairs", "1", "--samples", "3"]
    assert ab.main([*args, "--same-store", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["fill"]["A"] == report["fill"]["B"] and report["fill"]["A"]["records"] == 200
    assert "filling B" not in capsys.readouterr().err
    assert set(report["b_over_a"]) == set(ab.FIGURES)


@long_only
def test_read_only_rounds_read_one_store_filled_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ab.json"
    args = ["--a", str(ROOT), "--b", str(ROOT), "--size", "200", "--pairs", "2", "--samples", "3"]
    assert ab.main([*args, "--read-only", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "filling B" not in capsys.readouterr().err
    assert report["fill"]["A"] == report["fill"]["B"] and report["fill"]["A"]["records"] == 200
    for name in ("A", "B"):
        assert set(report["median"][name]) == set(ab.READ_FIGURES)
        assert all(value > 0 for value in report["median"][name].values())
