"""RTM narrative trees (the ``rtm`` plugin): segmentation, tree shape, traversal, optimal depth,
ensembles against the exact theory, the four tools' validation and typed output, tree storage in
the SQLite database, and the retelling of a user's memories.

Everything runs on the hash embedder (fast, words not meaning) and real SQLite; one test, marked
slow, checks with the real model that the depth-1 abstract is about the story.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pluggy
import pytest
import pytest_asyncio
from _helpers import msg
from hypothesis import given, settings
from hypothesis import strategies as st
from narrmem_plugins.rtm import RTMPlugin, depth_for_budget, plugin_of, retelling, user_summary
from narrmem_plugins.rtm.ensemble import simulate, summarize
from narrmem_plugins.rtm.partition import random_compositions
from narrmem_plugins.rtm.segment import segment
from narrmem_plugins.rtm.theory import (
    expected_recall_lengths,
    expected_recall_lengths_exact,
    suggest_parameters,
)
from narrmem_plugins.rtm.traverse import find_optimal_depth, recall_lengths, recall_units
from narrmem_plugins.rtm.tree import Tree, build_shape, prefix_sums, unit_rows

from narrmem import ConfigError, InputError, Memory, hookimpl
from narrmem.testing import open_memory
from narrmem.text import estimate_tokens

STORY = """Once upon a time, a wise king ruled a small kingdom in the green valley of Aster. He loved his \
people, and they trusted him; the harvests were rich and the roads were safe.

One winter a stranger arrived at the gates: she carried a sealed letter from the northern mountains. The \
king read it in silence — his face went pale. The letter warned of a dragon that had woken beneath the \
ice, and it said the beast would come south when the snow melted.

The king gathered his council. The old general wanted to build walls, but the young treasurer said the \
kingdom had no gold. The queen listened carefully, and she proposed a different plan. She would ride \
north herself and speak with the mountain clans, because they had fought dragons before.

The journey was long and cold. The queen crossed frozen rivers, and her horse nearly fell twice. In the \
third week she reached the clan of the high pass. Their chief was suspicious at first, but he agreed to \
listen after she shared her bread with his children.

The clans knew an ancient song that could calm the dragon. Only a singer with a pure heart could sing \
it, they said. The queen was not a singer, so she asked who among them could carry the song. A shy \
shepherd girl stepped forward; she had sung to her flock every evening since she was small.

Meanwhile, in the valley, the king prepared for the worst. Farmers stored grain in the castle cellars, \
and blacksmiths forged spears day and night. Children were sent to the caves in the southern hills. The \
king walked the walls each night, and he wondered whether his queen was still alive.

When spring came, the dragon flew south. Its shadow covered the fields, and the people screamed in \
terror. But the queen returned on the same morning with the shepherd girl and twenty clan warriors. The \
girl climbed the tallest tower, and she began to sing.

The song rose over the valley like wind over water. The dragon circled the tower three times; then it \
landed in the meadow and closed its golden eyes. The girl kept singing until the beast fell asleep. The \
warriors bound it with no chains, because the song itself held it.

The kingdom was saved. The king thanked the clans and opened the mountain roads for trade. The shepherd \
girl became the royal singer, and every spring she sang to the sleeping dragon. The queen wrote down the \
ancient song, so the kingdom would never forget it.

Years later, the old king told the story to his grandchildren. He said that walls and spears had not \
saved the valley. Kindness to strangers had saved it, and so had the courage to listen. The children \
laughed, but they remembered the song."""

STORY_ZH = (
    "从前，山谷里有一位聪明的国王。他爱他的人民；人民也信任他。一个冬天，一个陌生人带来了一封信！"
    "国王读完信——脸色变得苍白。信里说，北方的冰下醒来了一条龙。王后决定亲自去北方，她要向山里的部落求助。"
    "部落知道一首古老的歌，那首歌可以让龙平静下来。一个害羞的牧羊女站了出来。春天来了，龙飞到了山谷。"
    "牧羊女爬上最高的塔，开始唱歌。龙慢慢地睡着了，王国得救了。"
)
TITLE = "The Lost Kingdom"
CREATE = "rtm_create_narrative_tree"
TRAVERSE = "rtm_traverse_narrative"
ENSEMBLE = "rtm_generate_ensemble"
OPTIMAL = "rtm_find_optimal_depth"


def rtm_plugins() -> list[object]:
    """The plugin, registered explicitly until the ``rtm`` entry point makes it a built-in (then
    registering it again would clash by name)."""
    installed = any(ep.name == "rtm" for ep in entry_points(group="narrmem"))
    return [] if installed else [RTMPlugin()]


@pytest_asyncio.fixture
async def mem(tmp_path: Path) -> AsyncIterator[Memory]:
    async with open_memory(tmp_path / "store", plugins=rtm_plugins()) as memory:
        yield memory


async def tree_rows(memory: Memory) -> int:
    async with memory.store.db.execute("SELECT COUNT(*) FROM rtm_trees") as cursor:  # type: ignore[attr-defined]
        row = await cursor.fetchone()
    return int(row[0])


def lines(count: int) -> str:
    """A text of ``count`` clauses, one per line (taken as is)."""
    return "\n".join(f"Event number {i} happened in the story." for i in range(count))


# --- theory and ensembles --------------------------------------------------------------------


def test_theory_matches_exact_recursion_and_known_value() -> None:
    floats = expected_recall_lengths(100, 4, 4)
    exact = expected_recall_lengths_exact(100, 4, 4)
    assert floats == pytest.approx([float(x) for x in exact], rel=1e-12)
    assert floats[0] == 1 and floats[-1] == pytest.approx(29.98, abs=0.01)
    # A one-clause node counts once at every depth: N(d, 1) = 1.
    assert expected_recall_lengths_exact(1, 4, 6) == [1] * 6
    assert expected_recall_lengths(1, 7, 12) == pytest.approx([1.0] * 12)
    # Longer texts approach K**(d-1) from below.
    deepest = [expected_recall_lengths(n, 4, 4)[-1] for n in (100, 1000, 10_000)]
    assert deepest == sorted(deepest) and 60 < deepest[-1] < 64


@pytest.mark.parametrize(("k", "d"), [(4, 4), (3, 5)])
def test_ensemble_mean_within_three_standard_errors_of_theory(k: int, d: int) -> None:
    sim = simulate(100, k, d, 400, seed=11)
    report = summarize(sim, 100, k, d)
    theory = expected_recall_lengths(100, k, d)
    for row, expected in zip(report["depths"], theory, strict=True):
        assert row["theoryRecallLength"] == pytest.approx(expected)
        assert abs(row["recallLengthMean"] - expected) <= 3 * row["recallLengthSem"] + 1e-9, row
        assert row["zScore"] is not None and abs(row["zScore"]) < 3
    assert report["depths"][0]["recallLengthMean"] == 1
    assert report["nodes"]["leafCountMean"] == pytest.approx(report["depths"][-1]["recallLengthMean"])


def test_single_tree_builder_counts_like_the_simulation_and_theory() -> None:
    """The tree builder's random model (one tree at a time) has the same law as the ensemble's."""
    clauses, k, d, trees = 40, 3, 4, 300
    lengths = np.array(
        [
            recall_lengths(build_shape(clauses, k, d, "random", rng=np.random.default_rng(seed)), d)
            for seed in range(trees)
        ]
    )
    theory = expected_recall_lengths(clauses, k, d)
    sem = lengths.std(axis=0, ddof=1) / np.sqrt(trees)
    assert np.all(np.abs(lengths.mean(axis=0) - theory) <= 3 * sem + 1e-9)


def test_random_compositions_are_uniform_weak_compositions() -> None:
    rng = np.random.default_rng(5)
    draws = random_compositions(rng, np.full(30_000, 3), 3)
    assert np.all(draws.sum(axis=1) == 3) and np.all(draws >= 0)
    counts = Counter(map(tuple, draws.tolist()))
    assert len(counts) == 10  # C(3+3-1, 3-1)
    expected = 30_000 / 10
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001


def test_ensemble_is_seeded() -> None:
    a, b, c = simulate(60, 4, 5, 50, 1), simulate(60, 4, 5, 50, 1), simulate(60, 4, 5, 50, 2)
    assert np.array_equal(a.recall, b.recall) and np.array_equal(a.total_nodes, b.total_nodes)
    assert not np.array_equal(a.recall, c.recall)


def test_suggested_parameters() -> None:
    assert suggest_parameters(64) == (4, 4)
    assert suggest_parameters(65) == (4, 5)
    assert suggest_parameters(1) == (4, 1)
    assert suggest_parameters(1000, compression=0.5) == (2, 11)
    assert suggest_parameters(10**9, compression=0.1) == (10, 10)


# --- segmentation ---------------------------------------------------------------------------


def test_segmentation_english_clauses() -> None:
    result = segment(STORY)
    assert result.language == "en" and result.mode == "prose"
    clauses = result.clauses
    assert all(c.strip() == c and re.search(r"\w", c) for c in clauses)
    assert "He loved his people," in clauses and "and they trusted him;" in clauses
    assert "One winter a stranger arrived at the gates:" in clauses
    assert "The king read it in silence —" in clauses and "his face went pale." in clauses
    assert "but the young treasurer said the kingdom had no gold." in clauses
    assert segment("It rained all day, and then we slept.").clauses == [
        "It rained all day,",
        "and then we slept.",
    ]
    # Nothing is lost or invented: the clauses give the words back in order.
    assert " ".join(clauses).split() == STORY.split()
    assert segment(STORY).clauses == clauses  # deterministic


def test_segmentation_keeps_abbreviations_and_short_intros() -> None:
    clauses = segment(
        "Dr. Smith arrived at 5 p.m. on Jan. 3rd. After dinner, he left. It rained, she said."
    ).clauses
    assert clauses == [
        "Dr. Smith arrived at 5 p.m. on Jan. 3rd.",
        "After dinner, he left.",
        "It rained, she said.",
    ]


def test_segmentation_chinese() -> None:
    result = segment(STORY_ZH)
    assert result.language == "zh"
    assert "国王读完信——" in result.clauses and "脸色变得苍白。" in result.clauses
    assert "他爱他的人民；" in result.clauses
    assert "".join(result.clauses) == STORY_ZH
    assert all(len(re.findall(r"\w", c)) >= 2 for c in result.clauses)
    assert segment("嗯，好的。我明天去北京，你呢？").clauses == ["嗯，好的。", "我明天去北京，", "你呢？"]


def test_one_clause_per_line_is_taken_as_is() -> None:
    text = "The king rode out, and he sang.\nThe queen waited; the night fell.\n\u3000\nA song rose.\n"
    result = segment(text)
    assert result.mode == "lines"
    assert result.clauses == [
        "The king rode out, and he sang.",
        "The queen waited; the night fell.",
        "A song rose.",
    ]
    assert segment("The king rode out\nThe queen waited").clauses == ["The king rode out", "The queen waited"]
    assert segment("One. Two, and he went.", mode="lines").clauses == ["One. Two, and he went."]
    # Hard-wrapped prose (a line continues the sentence above) is joined, not taken line by line.
    assert segment("The old king walked\nslowly to the tower. He looked\nat the valley.").clauses == [
        "The old king walked slowly to the tower.",
        "He looked at the valley.",
    ]


@pytest.mark.parametrize("text", ["", "   \n\n ", "— ; ,", "。，"])
def test_segmentation_never_yields_empty_clauses(text: str) -> None:
    assert segment(text).clauses == []


TOKENS = st.sampled_from(
    ["the", "king", "Dr.", "ran", "and", "I", "she", "but", "so", "e.g.", "5:30", "U.S.", "—", "-", ";", ":",
     ",", ".", "!", "?", "...", "\n", "\n\n", "国王", "很", "聪明", "。", "，", "；", "“", "”", "(", ")", '"']
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(TOKENS, max_size=40))
def test_segmentation_keeps_every_word_character_and_no_empty_clause(parts: list[str]) -> None:
    text = " ".join(parts)
    clauses = segment(text).clauses
    assert all(c == c.strip() and re.search(r"[^\W_]", c) for c in clauses)
    assert re.findall(r"[^\W_]", "".join(clauses)) == re.findall(r"[^\W_]", text)


@settings(max_examples=60, deadline=None)
@given(
    clauses=st.integers(1, 120),
    k=st.integers(2, 10),
    d=st.integers(1, 8),
    seed=st.integers(0, 2**32),
    partition=st.sampled_from(["random", "semantic"]),
)
def test_tree_invariants(clauses: int, k: int, d: int, seed: int, partition: Any) -> None:
    rng = np.random.default_rng(seed)
    prefix = prefix_sums(unit_rows(rng.normal(size=(clauses, 8))))
    shape = build_shape(clauses, k, d, partition, rng=rng, prefix=prefix)
    assert shape.depth[0] == 1 and shape.start[0] == 0 and shape.end[0] == clauses
    assert shape.depth.max() <= d and np.all(shape.end > shape.start)
    children = shape.children
    assert children.max() <= k
    for node in np.flatnonzero(children):  # children tile their parent's span, in order
        kids = np.flatnonzero(shape.parent == node)
        assert shape.start[kids[0]] == shape.start[node] and shape.end[kids[-1]] == shape.end[node]
        assert np.array_equal(shape.end[kids[:-1]], shape.start[kids[1:]])
        assert np.all(shape.depth[kids] == shape.depth[node] + 1)
    leaf = shape.is_leaf
    # A leaf spans one clause unless it sits at depth D; every internal node of 2+ clauses splits.
    assert np.all((shape.end - shape.start)[leaf & (shape.depth < d)] == 1)
    lengths = recall_lengths(shape, d)
    assert lengths[0] == 1 and lengths == sorted(lengths) and lengths[-1] == int(leaf.sum())
    for depth in range(1, d + 1):  # every recall sequence covers each clause exactly once
        units = recall_units(shape, depth)
        assert shape.start[units[0]] == 0 and shape.end[units[-1]] == clauses
        assert np.array_equal(shape.end[units[:-1]], shape.start[units[1:]])


# --- the tools: seed examples ---------------------------------------------------------------


async def test_create_tree_output_shape(mem: Memory) -> None:
    out = await mem.call_tool(
        CREATE, {"text": STORY, "title": TITLE, "type": "story", "maxBranchingFactor": 4, "maxRecallDepth": 6}
    )
    assert re.fullmatch(r"rtm_[0-9a-f]{12}", out["treeId"]) and out["created"] is True
    stats = out["stats"]
    assert set(stats) >= {"totalNodes", "leafCount", "depth", "avgBranching"}
    clauses = len(segment(STORY).clauses)
    assert stats["clauseCount"] == clauses and stats["leafCount"] == clauses  # D=6 reaches every clause
    assert 1 <= stats["depth"] <= 6 and 1 < stats["avgBranching"] <= 4
    assert stats["totalNodes"] == 1 + sum(
        k * n for k, n in map(lambda kv: (int(kv[0]), kv[1]), stats["branching"].items())
    )
    ratios = out["compressionRatio"]
    assert list(ratios) == [f"depth{d}" for d in range(1, stats["depth"] + 1)]
    assert ratios["depth1"] == pytest.approx(1 / stats["leafCount"], abs=1e-6)
    assert ratios[f"depth{stats['depth']}"] == 1.0
    assert list(ratios.values()) == sorted(ratios.values())
    assert out["parameters"]["partition"] == "semantic" and out["parameters"]["language"] == "en"
    assert set(out["scale"]) >= {"ratios", "settled", "unevenDensity"}


async def test_traversal_depth_one_is_an_abstract_and_deeper_is_more_detailed(mem: Memory) -> None:
    await mem.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 4, "maxRecallDepth": 6})
    abstract = await mem.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 1})
    assert abstract["recallLength"] == 1 and len(abstract["summaries"]) == 1
    assert abstract["summaries"] == abstract["recallSequence"]
    assert abstract["compressionRatio"] == pytest.approx(1 / abstract["leafCount"], abs=1e-6)
    assert abstract["clausesPerUnit"] == abstract["leafCount"]
    assert estimate_tokens(abstract["retelling"]) <= 48  # the default summary budget
    # Extractive and in the story's language: its words are the story's words.
    assert set(re.findall(r"\w+", abstract["retelling"].lower())) <= set(re.findall(r"\w+", STORY.lower()))
    detailed = await mem.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 4})
    assert detailed["recallLength"] > abstract["recallLength"]
    assert len(detailed["retelling"]) > len(abstract["retelling"])
    units = detailed["units"]
    assert units[0]["clauseStart"] == 0 and units[-1]["clauseEnd"] == detailed["leafCount"]
    assert all(a["clauseEnd"] == b["clauseStart"] for a, b in pairwise(units))
    full = await mem.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 12})
    assert full["retelling"].split() == STORY.split()  # the deepest retelling is the whole text
    assert full["compressionRatio"] == 1.0


async def test_find_optimal_depth_for_a_target(mem: Memory) -> None:
    out = await mem.call_tool(
        CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 4, "maxRecallDepth": 6}
    )
    lengths = [out["stats"]["recallLength"][f"depth{d}"] for d in range(1, out["stats"]["depth"] + 1)]
    for target in (1, 3, 10, 16, 20, 40, 500):
        found = await mem.call_tool(OPTIMAL, {"treeId": out["treeId"], "targetRecallLength": target})
        best = min(abs(n - target) for n in lengths)
        assert abs(found["actualRecallLength"] - target) == best
        assert found["actualRecallLength"] == lengths[found["optimalDepth"] - 1]
        assert found["accuracy"] == pytest.approx(max(0.0, 1 - best / target), abs=1e-6)
        assert len(found["searched"]) <= 3  # adjacent steps from the estimate, not a full scan here


def test_find_optimal_depth_prefers_the_shallower_tie_and_stays_in_range() -> None:
    lengths = [1, 4, 16, 48, 64]
    assert find_optimal_depth(lengths, 4, 10)["optimalDepth"] == 2  # |4-10| = |16-10|
    far = find_optimal_depth(lengths, 4, 1000)
    assert far["optimalDepth"] == 5 and far["accuracy"] == pytest.approx(64 / 1000)
    assert find_optimal_depth([1], 4, 7)["optimalDepth"] == 1


async def test_ensemble_tool(mem: Memory) -> None:
    numbers = {
        "text": lines(100),
        "title": "numbers",
        "ensembleSize": 400,
        "maxBranchingFactor": 4,
        "maxRecallDepth": 4,
        "seed": 3,
    }
    out = await mem.call_tool(ENSEMBLE, numbers)
    assert out["leafCount"] == 100 and [d["depth"] for d in out["depths"]] == [1, 2, 3, 4]
    assert out["depths"][3]["theoryRecallLength"] == pytest.approx(29.98, abs=0.01)
    assert out["maxAbsZScore"] < 3
    again = await mem.call_tool(ENSEMBLE, dict(numbers))
    assert again == out
    story = await mem.call_tool(ENSEMBLE, {"text": STORY, "title": TITLE, "ensembleSize": 200})
    assert story["seed"] == 0 and story["maxBranchingFactor"] == 4
    assert await tree_rows(mem) == 0  # ensembles are statistics, nothing is stored


# --- seeds, reuse, storage ------------------------------------------------------------------


async def test_same_seed_same_tree_different_seed_different_tree(tmp_path: Path) -> None:
    args = {
        "text": STORY,
        "title": TITLE,
        "maxBranchingFactor": 3,
        "maxRecallDepth": 5,
        "partition": "random",
    }
    shapes = []
    for folder, seed in (("a", 7), ("b", 7), ("c", 8)):
        async with open_memory(tmp_path / folder, plugins=rtm_plugins()) as memory:
            out = await memory.call_tool(CREATE, {**args, "seed": seed})
            deep = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 5})
            # At depth D every unit holds its whole span, even at the end of a single-child chain.
            assert deep["retelling"].split() == STORY.split()
            shapes.append(
                (out["treeId"], out["stats"], [(u["clauseStart"], u["clauseEnd"]) for u in deep["units"]])
            )
    assert shapes[0] == shapes[1]
    assert shapes[2][0] != shapes[0][0] and shapes[2][2] != shapes[0][2]


async def test_tree_is_reused_not_rebuilt(mem: Memory, tmp_path: Path) -> None:
    plugin = plugin_of(mem)
    first = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxRecallDepth": 6})
    assert await tree_rows(mem) == 1
    second = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxRecallDepth": 6})
    assert second["treeId"] == first["treeId"] and second["created"] is False
    traversed = await mem.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 2})
    assert traversed["treeId"] == first["treeId"]
    assert await tree_rows(mem) == 1
    # Any parameter that changes the tree makes another one; the title is part of the identity.
    other = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxRecallDepth": 5})
    renamed = await mem.call_tool(CREATE, {"text": STORY, "title": "Another title", "maxRecallDepth": 6})
    assert len({first["treeId"], other["treeId"], renamed["treeId"]}) == 3
    assert await tree_rows(mem) == 3
    # Traversal by text without parameters takes the newest tree of that text and title.
    latest = await mem.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 1})
    assert latest["treeId"] == other["treeId"]
    # The row survives a restart and is read back, not rebuilt.
    await mem.close()
    async with open_memory(tmp_path / "store", plugins=rtm_plugins()) as reopened:
        again = await reopened.call_tool(TRAVERSE, {"treeId": first["treeId"], "traversalDepth": 2})
        assert again == traversed
        assert await tree_rows(reopened) == 3
    assert plugin.trees.persistent


async def test_tree_writes_and_ingest_share_the_connection_safely(mem: Memory) -> None:
    """Tree rows are written in transactions on the store's connection while ingest writes too."""

    async def ingest() -> None:
        for i in range(40):
            await mem.ingest(msg(f"m{i}", f"I decided to take piano lesson {i} today, it was great"))

    async def create(offset: int) -> None:
        for i in range(offset, offset + 4):
            await mem.call_tool(CREATE, {"text": STORY, "title": f"copy {i}", "maxRecallDepth": 3})

    await asyncio.gather(ingest(), create(0), create(4))
    assert await tree_rows(mem) == 8
    assert (await mem.stats())["memories"] >= 40


async def test_traverse_by_text_builds_with_defaults_once(mem: Memory) -> None:
    out = await mem.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 1})
    assert out["recallLength"] == 1 and await tree_rows(mem) == 1
    created = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE})
    assert created["treeId"] == out["treeId"] and created["created"] is False
    assert created["parameters"]["depthSuggested"] is True
    assert created["parameters"]["maxRecallDepth"] == suggest_parameters(created["stats"]["clauseCount"])[1]


async def test_trees_are_scoped_by_tenant(mem: Memory) -> None:
    out = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE, "tenant": "acme"})
    await mem.call_tool(TRAVERSE, {"treeId": out["treeId"], "tenant": "acme", "traversalDepth": 1})
    with pytest.raises(InputError) as info:
        await mem.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 1})
    assert info.value.field == "treeId"
    other = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE, "tenant": "globex"})
    assert other["treeId"] != out["treeId"]


async def test_chinese_tree(mem: Memory) -> None:
    out = await mem.call_tool(CREATE, {"text": STORY_ZH, "title": "失落的王国", "maxBranchingFactor": 3})
    assert out["parameters"]["language"] == "zh"
    abstract = await mem.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 1})
    assert abstract["recallLength"] == 1 and re.search(r"[\u4e00-\u9fff]", abstract["retelling"])
    assert " " not in abstract["retelling"]
    full = await mem.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 12})
    assert full["retelling"] == STORY_ZH


# --- validation -----------------------------------------------------------------------------

BAD_CALLS: list[tuple[str, str, dict[str, Any], str]] = [
    ("K=11", CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 11}, "maxBranchingFactor"),
    ("K=1", CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 1}, "maxBranchingFactor"),
    ("D=0", CREATE, {"text": STORY, "title": TITLE, "maxRecallDepth": 0}, "maxRecallDepth"),
    ("D=13", TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 13}, "traversalDepth"),
    ("unknown field", CREATE, {"text": STORY, "title": TITLE, "colour": "blue"}, "colour"),
    ("no title", CREATE, {"text": STORY}, "title"),
    ("empty title", CREATE, {"text": STORY, "title": ""}, "title"),
    ("long title", CREATE, {"text": STORY, "title": "t" * 201}, "title"),
    ("bad partition", CREATE, {"text": STORY, "title": TITLE, "partition": "chaos"}, "partition"),
    ("seed without random", CREATE, {"text": STORY, "title": TITLE, "seed": 3}, "seed"),
    ("negative seed", CREATE, {"text": STORY, "title": TITLE, "partition": "random", "seed": -1}, "seed"),
    (
        "both sources",
        TRAVERSE,
        {"text": STORY, "title": TITLE, "treeId": "rtm_0123456789ab", "traversalDepth": 1},
        "text",
    ),
    ("neither source", TRAVERSE, {"title": TITLE, "traversalDepth": 1}, "text"),
    ("neither source (optimal)", OPTIMAL, {"targetRecallLength": 5}, "text"),
    ("text without title", OPTIMAL, {"text": STORY, "targetRecallLength": 5}, "title"),
    ("bad tree id", TRAVERSE, {"treeId": "tree-1", "traversalDepth": 1}, "treeId"),
    ("unknown tree id", TRAVERSE, {"treeId": "rtm_0123456789ab", "traversalDepth": 1}, "treeId"),
    (
        "parameters beside a tree",
        TRAVERSE,
        {"treeId": "rtm_0123456789ab", "traversalDepth": 1, "maxBranchingFactor": 3},
        "maxBranchingFactor",
    ),
    (
        "language beside a tree",
        TRAVERSE,
        {"treeId": "rtm_0123456789ab", "traversalDepth": 1, "language": "zh"},
        "language",
    ),
    (
        "segmentation beside a tree",
        OPTIMAL,
        {"treeId": "rtm_0123456789ab", "targetRecallLength": 5, "segmentation": "lines"},
        "segmentation",
    ),
    ("target 0", OPTIMAL, {"text": STORY, "title": TITLE, "targetRecallLength": 0}, "targetRecallLength"),
    ("ensemble of 0", ENSEMBLE, {"text": STORY, "title": TITLE, "ensembleSize": 0}, "ensembleSize"),
    ("ensemble too big", ENSEMBLE, {"text": STORY, "title": TITLE, "ensembleSize": 10_001}, "ensembleSize"),
    (
        "ensemble partition",
        ENSEMBLE,
        {"text": STORY, "title": TITLE, "ensembleSize": 5, "partition": "random"},
        "partition",
    ),
    ("text too long", CREATE, {"text": "word " * 100_001, "title": TITLE}, "text"),
    ("no clause", CREATE, {"text": "— ; ,", "title": TITLE}, "text"),
    ("no clause (ensemble)", ENSEMBLE, {"text": "...", "title": TITLE, "ensembleSize": 5}, "text"),
    ("text is a number", CREATE, {"text": 42, "title": TITLE}, "text"),
]


@pytest.mark.parametrize(("case", "tool", "args", "field"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
async def test_bad_calls_name_the_field(
    mem: Memory, case: str, tool: str, args: dict[str, Any], field: str
) -> None:
    with pytest.raises(InputError) as info:
        await mem.call_tool(tool, args)
    assert info.value.field == field, str(info.value)
    assert field in str(info.value)
    assert await tree_rows(mem) == 0


async def test_plugin_options(tmp_path: Path) -> None:
    options = {"rtm": {"branching": 3, "summary_tokens": 12}}
    async with open_memory(tmp_path / "opts", plugins=rtm_plugins(), plugin=options) as memory:
        out = await memory.call_tool(CREATE, {"text": STORY, "title": TITLE})
        assert out["parameters"]["maxBranchingFactor"] == 3 and out["stats"]["avgBranching"] <= 3
        top = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 1})
        assert estimate_tokens(top["retelling"]) <= 12
    with pytest.raises(ConfigError, match=r"plugin\.rtm\.colour"):
        await open_memory(tmp_path / "bad", plugins=rtm_plugins(), plugin={"rtm": {"colour": "blue"}})


async def test_tools_are_registered_with_schemas(mem: Memory) -> None:
    assert {CREATE, TRAVERSE, ENSEMBLE, OPTIMAL} <= set(mem.tools.names())
    schema = mem.tools.get(CREATE).input_schema()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["maxBranchingFactor"]["anyOf"][0] == {
        "maximum": 10,
        "minimum": 2,
        "type": "integer",
    }


# --- summaries ------------------------------------------------------------------------------


async def test_custom_summarizer_and_hook(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []

    async def headline(clauses: list[str], language: str) -> str:
        seen.append((len(clauses), language))
        return f"[{len(clauses)} clauses]"

    async with open_memory(tmp_path / "custom", plugins=rtm_plugins()) as memory:
        plugin_of(memory).summarizer = headline
        out = await memory.call_tool(CREATE, {"text": STORY, "title": TITLE})
        top = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 1})
        assert top["retelling"] == f"[{out['stats']['clauseCount']} clauses]"
        assert out["parameters"]["summarizer"].startswith("custom:")
        assert seen and all(lang == "en" for _, lang in seen)

    hookspec = pluggy.HookspecMarker("narrmem")

    class SummarizeSpec:
        """The hook as the host will declare it (firstresult)."""

        @hookspec(firstresult=True)
        def narrmem_summarize(self, memory: Any, clauses: list[str], language: str) -> str | None:
            """An abstractive summary of ``clauses`` or ``None``."""

    class LLMish:
        @hookimpl
        def narrmem_summarize(self, clauses: list[str], language: str) -> str | None:
            return "THE GIST" if len(clauses) > 10 else None  # None: fall back to extractive

    async with open_memory(tmp_path / "hook", plugins=rtm_plugins()) as memory:
        if not hasattr(memory.host.pm.hook, "narrmem_summarize"):  # until hookspecs.py declares it
            memory.host.pm.add_hookspecs(SummarizeSpec)
        memory.host.pm.register(LLMish(), name="llmish")
        out = await memory.call_tool(CREATE, {"text": STORY, "title": TITLE})
        assert out["parameters"]["summarizer"] == "hook:llmish"
        top = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 1})
        assert top["retelling"] == "THE GIST"
        deep = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 3})
        assert any(s != "THE GIST" for s in deep["summaries"])


async def test_depth_for_budget(mem: Memory) -> None:
    out = await mem.call_tool(CREATE, {"text": STORY, "title": TITLE})
    plugin = plugin_of(mem)
    stored = await plugin.trees.get("default", out["treeId"])
    assert stored is not None
    tree: Tree = stored.tree
    sizes = [estimate_tokens(retelling(tree, d)) for d in range(1, tree.max_depth + 1)]
    for budget in (5, sizes[1], sizes[2] - 1, sizes[-1], 10**6):
        depth = depth_for_budget(tree, budget)
        fitting = [d for d, size in enumerate(sizes, start=1) if size <= budget]
        assert depth == (max(fitting) if fitting else 1)


# --- a user's memories ----------------------------------------------------------------------

USER_LINES = [
    "I started learning the piano this spring",
    "my piano teacher says my left hand is lazy",
    "practised scales for an hour before work",
    "we adopted a grey cat called Miso from the shelter",
    "Miso knocked my coffee off the desk this morning",
    "the vet says Miso is healthy but a bit fat",
    "I decided to quit my job at the bank",
    "handed in my notice today, my manager was surprised",
    "starting at a small design studio next month",
    "first week at the studio, everyone is kind",
    "my sister is getting married in Lisbon in June",
    "booked flights to Lisbon for the wedding",
]


async def test_user_summary(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "users", plugins=rtm_plugins()) as memory:
        for i, text in enumerate(USER_LINES):
            await memory.ingest(msg(f"m{i}", text, ts=f"2026-05-{i + 1:02d}T09:00:00+00:00"))
        await memory.ingest(msg("other", "a different user's secret plan", user="u2"))
        plugin = plugin_of(memory)

        top = await user_summary(memory, user_id="u1", depth=1)
        assert top["depth"] == 1 and len(top["recallSequence"]) == 1 and top["memoryCount"] == len(USER_LINES)
        assert top["units"][0]["from"].startswith("2026-05-01") and top["units"][0]["to"].startswith(
            "2026-05-12"
        )
        full = await user_summary(memory, user_id="u1", depth=12)
        assert full["depth"] == full["maxDepth"] and len(full["recallSequence"]) == len(USER_LINES)
        assert "piano" in full["recallSequence"][0] and "Lisbon" in full["recallSequence"][-1]
        assert "secret" not in full["retelling"]

        budget = await user_summary(memory, user_id="u1", token_budget=40)
        assert budget["tokens"] <= 40 or budget["depth"] == 1
        assert budget["depth"] < full["depth"]

        cached = plugin.users._cache[("default", "u1")]
        await user_summary(memory, user_id="u1", depth=2)
        assert plugin.users._cache[("default", "u1")] is cached  # nothing new: not rebuilt
        await memory.ingest(msg("m99", "the wedding in Lisbon was beautiful", ts="2026-06-20T09:00:00+00:00"))
        refreshed = await user_summary(memory, user_id="u1", depth=12)
        assert refreshed["memoryCount"] == len(USER_LINES) + 1 and "wedding" in refreshed["retelling"]

        await memory.forget(user_id="u1")
        assert ("default", "u1") not in plugin.users._cache
        gone = await user_summary(memory, user_id="u1")
        assert gone["memoryCount"] == 0 and gone["retelling"] == ""
        with pytest.raises(InputError) as info:
            await user_summary(memory, user_id="")
        assert info.value.field == "user_id"


async def test_user_summaries_kept_in_memory_are_bounded(tmp_path: Path) -> None:
    """A bot whose users each ask for their summary once must not keep every user's tree (and the
    memories it tells) for as long as it runs: only the most recently asked stay, and a tree asked
    for again after it went is built again, the same."""
    async with open_memory(
        tmp_path / "kept", plugins=rtm_plugins(), plugin={"rtm": {"user_summaries_kept": 2}}
    ) as memory:
        users = ["u1", "u2", "u3"]
        for user in users:
            for i, text in enumerate(USER_LINES[:5]):
                ts = f"2026-05-{i + 1:02d}T09:00:00+00:00"
                await memory.ingest(msg(f"{user}-m{i}", f"{text} ({user})", user=user, ts=ts))
        plugin = plugin_of(memory)
        first = await user_summary(memory, user_id="u1", depth=12)
        await user_summary(memory, user_id="u2", depth=12)
        assert plugin.users.cached_users() == [("default", "u1"), ("default", "u2")]
        await user_summary(memory, user_id="u1", depth=1)  # asked again: the most recent now
        await user_summary(memory, user_id="u3", depth=12)
        assert plugin.users.cached_users() == [("default", "u1"), ("default", "u3")]
        for user in users:  # each in turn evicts the least recently asked
            await user_summary(memory, user_id=user, depth=12)
        assert plugin.users.cached_users() == [("default", "u2"), ("default", "u3")]
        again = await user_summary(memory, user_id="u1", depth=12)
        assert again == first

    async with open_memory(
        tmp_path / "none", plugins=rtm_plugins(), plugin={"rtm": {"user_summaries_kept": 0}}
    ) as memory:
        for i, text in enumerate(USER_LINES[:5]):
            await memory.ingest(msg(f"m{i}", text, ts=f"2026-05-{i + 1:02d}T09:00:00+00:00"))
        told = await user_summary(memory, user_id="u1", depth=12)
        assert told["memoryCount"] == 5 and plugin_of(memory).users.cached_users() == []


# --- with the real model --------------------------------------------------------------------


@pytest.mark.slow
async def test_real_model_abstract_is_about_the_story(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "real", real_model=True, plugins=rtm_plugins()) as memory:
        out = await memory.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 4})
        abstract = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 1})
        assert abstract["recallLength"] == 1
        assert re.search(r"\b(king|queen|dragon|kingdom|song)\b", abstract["retelling"], re.IGNORECASE)
        second = await memory.call_tool(TRAVERSE, {"treeId": out["treeId"], "traversalDepth": 2})
        assert 2 <= second["recallLength"] <= 4
        found = await memory.call_tool(OPTIMAL, {"treeId": out["treeId"], "targetRecallLength": 16})
        assert found["optimalDepth"] == 3 and found["accuracy"] >= 0.5


async def test_memory_summary_goes_through_the_hook(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "summary", plugins=rtm_plugins()) as memory:
        for i, text in enumerate(USER_LINES):
            await memory.ingest(msg(f"m{i}", text, ts=f"2026-05-{i + 1:02d}T09:00:00+00:00"))
        top = await memory.summary(user_id="u1", depth=1)
        assert top["depth"] == 1 and top["retelling"]
        fitted = await memory.summary(user_id="u1", token_budget=60)
        assert fitted["tokens"] <= 60 or fitted["depth"] == 1
        with pytest.raises(InputError):
            await memory.summary(user_id="")


async def test_a_long_texts_work_runs_off_the_event_loop(tmp_path: Path, monkeypatch: Any) -> None:
    """Segmenting, shaping and simulating a 500,000-character text take seconds: on the event
    loop they held every other user's call that long."""
    import threading

    from narrmem_plugins.rtm import build, tools

    on_loop: list[str] = []

    def watched(module: Any, name: str) -> None:
        original = getattr(module, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                on_loop.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, run)

    for module, name in [(build, "segment_cached"), (build, "build_shape"), (tools, "segment_cached")]:
        watched(module, name)
    watched(tools, "simulate")
    watched(tools, "summarize")
    story = "Once upon a time a king ruled. A threat came. A knight rode out. She found a village."
    async with open_memory(tmp_path / "m", plugins=rtm_plugins()) as memory:
        await memory.call_tool("rtm_create_narrative_tree", {"text": story, "title": "K"})
        ensemble = {"text": story + " Peace came.", "title": "K", "ensembleSize": 50}
        await memory.call_tool("rtm_generate_ensemble", ensemble)
    assert on_loop == []


async def test_the_tree_built_last_is_found_by_its_time_not_its_text(tmp_path: Path) -> None:
    """Trees were ordered by their creation time's text: with a clock in a zone that left daylight
    saving time between two builds, the later (01:10-08:00) sorted before the earlier (01:50-07:00)
    and a traverse by text used the older tree."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from narrmem.clock import ManualClock

    california = ZoneInfo("America/Los_Angeles")
    clock = ManualClock(datetime(2026, 11, 1, 8, 50, tzinfo=UTC).astimezone(california))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 2})
        clock.advance(minutes=20)  # 01:10 in the zone, an hour earlier on its face
        later = await memory.call_tool(CREATE, {"text": STORY, "title": TITLE, "maxBranchingFactor": 3})
        found = await memory.call_tool(TRAVERSE, {"text": STORY, "title": TITLE, "traversalDepth": 2})
        assert found["treeId"] == later["treeId"]
