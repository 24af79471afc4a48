#!/usr/bin/env python
"""RTM narrative trees benchmark: build, traverse and a 200-tree ensemble, for a 500-word narrative
and a 10,000-clause one.

Narratives are generated deterministically (``random.Random(seed)``) from templates: paragraphs of
four to seven sentences, each paragraph about one topic (court, journey, dragon, village, war,
feast) with that topic's cast, places and deeds, so that a semantic split has shifts to find.
Sentences have one to three clauses (", and he ...", "; ...", ", but ..."), so the segmenter's
clause rules are exercised as well as pysbd.

Everything goes through ``Memory.call_tool`` in a temporary folder with real SQLite. The embedder is
the hash embedder from ``narrmem.testing`` by default (words, not meaning: it times the plugin, not
the model); ``--real`` uses the packaged all-MiniLM-L6-v2 instead (embedding then dominates the
build of the long narrative: minutes on two cores).

Measured with ``time.perf_counter`` (medians of ``--repeat`` runs where a step is repeatable):

* segment: ``segment(text)`` alone (pysbd sentences + clause rules).
* build: the first ``rtm_create_narrative_tree`` call (segment, embed once, shape, summarise, store).
* create again: the same call again (id lookup, one indexed read, no rebuild).
* traverse: ``rtm_traverse_narrative`` by ``treeId`` at depth 1, the middle depth and the deepest;
  and by text (found through the text's hash).
* optimal depth: ``rtm_find_optimal_depth`` by ``treeId``.
* ensemble: ``rtm_generate_ensemble`` with 200 trees: cold (segmenting the text, once) and warm
  (the plugin remembers the segmentation of its last few texts); the simulation plus statistics
  alone; the exact theory alone.

Usage:  python bench/rtm.py [--real] [--repeat 5] [--out bench/results/rtm.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from _common import machine_info, now_iso, peak_rss_mib, render_table, write_json
from narrmem_plugins.rtm import RTMPlugin
from narrmem_plugins.rtm.ensemble import simulate, summarize
from narrmem_plugins.rtm.segment import segment, segment_cached
from narrmem_plugins.rtm.theory import expected_recall_lengths

from narrmem.testing import open_memory

_STORY = json.loads((Path(__file__).parent / "data" / "rtm_story.json").read_text(encoding="utf-8"))
# Who did what where, by topic: the story's sentences are drawn from these.
TOPICS: dict[str, dict[str, list[str]]] = _STORY["topics"]
PRONOUN: dict[str, str] = _STORY["pronoun"]


# The steps timed, in the order they run (seconds in the report, milliseconds in the table).
TIMED = (
    "segment_s build_s create_again_s traverse_top_s traverse_mid_s traverse_deep_s traverse_by_text_s "
    "optimal_depth_s ensemble_tool_cold_s ensemble_tool_s ensemble_sim_s theory_s"
).split()


def _step_label(key: str) -> str:
    return f"{key.removesuffix('_s').replace('_', ' ')} (ms)"


def _sentence(rng: random.Random, topic: dict[str, list[str]]) -> tuple[str, int]:
    """One sentence and its number of clauses under the segmenter's rules."""
    who, did, where = rng.choice(topic["who"]), rng.choice(topic["did"]), rng.choice(topic["where"])
    subject = who[0].upper() + who[1:]
    pattern = rng.randrange(4)
    if pattern == 0:
        return f"{subject} {did} {where}.", 1
    if pattern == 1:
        pronoun = PRONOUN.get(who, "they" if who.endswith("s") else "he")
        return f"{subject} {did}, and {pronoun} {rng.choice(topic['did'])}.", 2
    if pattern == 2:
        other = rng.choice(topic["who"])
        return f"{subject} {did}; {other} {rng.choice(topic['did'])} {where}.", 2
    other = rng.choice(topic["who"])
    return f"{subject} {did} {where}, but {other} {rng.choice(topic['did'])}; nobody slept.", 3


def narrative(*, words: int | None = None, clauses: int | None = None, seed: int = 7) -> str:
    """Paragraphs of 4-7 sentences on one topic each, until ``words`` words or ``clauses`` clauses."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    count_words = count_clauses = 0
    names = sorted(TOPICS)
    while True:
        topic = TOPICS[rng.choice(names)]
        sentences = []
        for _ in range(rng.randint(4, 7)):
            sentence, n = _sentence(rng, topic)
            if clauses is not None and count_clauses + n > clauses:
                sentence, n = f"{rng.choice(topic['who']).capitalize()} waited.", 1
            sentences.append(sentence)
            count_words += len(sentence.split())
            count_clauses += n
            if (words is not None and count_words >= words) or (
                clauses is not None and count_clauses >= clauses
            ):
                paragraphs.append(" ".join(sentences))
                return "\n\n".join(paragraphs)
        paragraphs.append(" ".join(sentences))


def _rtm_plugins() -> list[object]:
    """The plugin, registered explicitly until the ``rtm`` entry point makes it a built-in."""
    return [] if any(ep.name == "rtm" for ep in entry_points(group="narrmem")) else [RTMPlugin()]


async def _timed(fn: Callable[[], Awaitable[Any]], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


async def bench_text(name: str, text: str, *, real: bool, repeat: int) -> dict[str, Any]:
    title = f"bench {name}"
    segment("Warm up the segmenter. It loads its rules once.")  # not part of any timing
    row: dict[str, Any] = {"narrative": name, "chars": len(text), "words": len(text.split())}
    start = time.perf_counter()
    clauses = segment(text).clauses
    row["segment_s"] = time.perf_counter() - start
    row["clauses"] = len(clauses)
    with tempfile.TemporaryDirectory(prefix="narrmem-rtm-bench-") as folder:
        async with open_memory(Path(folder) / "store", real_model=real, plugins=_rtm_plugins()) as memory:
            create_args = {"text": text, "title": title, "maxBranchingFactor": 4}
            build_s, created = await _timed(
                lambda: memory.call_tool("rtm_create_narrative_tree", create_args), 1
            )
            row["build_s"] = build_s
            row["create_again_s"], again = await _timed(
                lambda: memory.call_tool("rtm_create_narrative_tree", create_args), repeat
            )
            assert again["treeId"] == created["treeId"] and not again["created"]
            stats = created["stats"]
            row.update(
                depth=stats["depth"],
                total_nodes=stats["totalNodes"],
                leaf_count=stats["leafCount"],
                avg_branching=stats["avgBranching"],
                scale_settled=created["scale"]["settled"],
            )
            tid = created["treeId"]
            for label, depth in (("top", 1), ("mid", max(1, stats["depth"] // 2)), ("deep", stats["depth"])):
                row[f"traverse_{label}_s"], out = await _timed(
                    lambda d=depth: memory.call_tool(  # type: ignore[misc]
                        "rtm_traverse_narrative", {"treeId": tid, "traversalDepth": d}
                    ),
                    repeat,
                )
                row[f"recall_{label}"] = out["recallLength"]
            row["traverse_by_text_s"], _ = await _timed(
                lambda: memory.call_tool(
                    "rtm_traverse_narrative", {"text": text, "title": title, "traversalDepth": 2}
                ),
                repeat,
            )
            row["optimal_depth_s"], found = await _timed(
                lambda: memory.call_tool(
                    "rtm_find_optimal_depth",
                    {"treeId": tid, "targetRecallLength": max(1, len(clauses) // 10)},
                ),
                repeat,
            )
            row["optimal_depth"] = found["optimalDepth"]
            ensemble_args = {
                "text": text,
                "title": title,
                "ensembleSize": 200,
                "maxBranchingFactor": 4,
                "seed": 1,
            }
            segment_cached.cache_clear()  # the first call segments the text, as a fresh process would
            row["ensemble_tool_cold_s"], ens = await _timed(
                lambda: memory.call_tool("rtm_generate_ensemble", ensemble_args), 1
            )
            row["ensemble_tool_s"], ens = await _timed(
                lambda: memory.call_tool("rtm_generate_ensemble", ensemble_args), repeat
            )
            k, d, n = 4, ens["maxRecallDepth"], len(clauses)

            async def pure() -> dict[str, Any]:
                return summarize(simulate(n, k, d, 200, 1), n, k, d)

            async def theory() -> list[float]:
                return expected_recall_lengths(n, k, d)

            row["ensemble_sim_s"], _ = await _timed(pure, repeat)
            row["theory_s"], _ = await _timed(theory, repeat)
            row["ensemble_depth"] = d
            row["ensemble_max_abs_z"] = ens["maxAbsZScore"]
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = {"500 words": narrative(words=500, seed=7), "10,000 clauses": narrative(clauses=10_000, seed=8)}
    rows = [await bench_text(name, text, real=args.real, repeat=args.repeat) for name, text in texts.items()]
    return {
        "benchmark": "rtm",
        "date": now_iso(),
        "embedder": "all-MiniLM-L6-v2 (real)" if args.real else "hash (narrmem.testing.HashEmbedder)",
        "repeat": args.repeat,
        "machine": machine_info(),
        "peak_rss_mib": peak_rss_mib(),
        "results": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--real", action="store_true", help="embed with the real model instead of the hash one"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each repeatable step (median)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    headers = ["step", *(r["narrative"] for r in report["results"])]
    table = [
        ["clauses", *(r["clauses"] for r in report["results"])],
        ["tree depth / nodes", *(f"{r['depth']} / {r['total_nodes']:,}" for r in report["results"])],
        *([_step_label(key), *(r[key] * 1000 for r in report["results"])] for key in TIMED),
        ["ensemble max |z| vs theory", *(r["ensemble_max_abs_z"] for r in report["results"])],
    ]
    print(f"RTM benchmark, embedder: {report['embedder']}, medians of {args.repeat}")
    print(render_table(headers, table, digits=2))
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
