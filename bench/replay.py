#!/usr/bin/env python
"""Long-life replay: does memory stay true when a bot lives with it, message after message?

What runs
    For each LoCoMo conversation of ``--data`` (the same parsing as ``bench/locomo.py``):

    * **plain**: a fresh ``Memory`` ingests every turn (``ingest_many``), then the benchmark questions
      are asked (``recall(question, chat_id=…, k=25, reinforce=False)``, as ``bench/locomo.py`` does).
    * **replay**: a fresh ``Memory`` with reinforcement on lives the conversation as a bot would. A
      ``ManualClock`` follows the conversation's own dates. For every turn: ``ingest`` it, then
      ``context(turn text, user_id=speaker, chat_id=…, exclude_message_ids=[the turn])`` as the bot
      answering it. ``--offtopic`` queries (50 by default: questions about things no conversation
      speaks of, listed below) are mixed in at seeded random points, each a ``context()`` call for
      the speaker of that moment. Then the same questions are asked of the replayed store.

    Both stores answer the questions at the clock of the conversation's last turn, so decay is the
    same for both; only what reinforcement did differs.

Reported per conversation and overall
    R@5 / R@10 of the replayed store next to the plain one; reinforcements made during the replay
    (history rows with ``who = recall``); how many came from an off-topic query (all of those are
    irrelevant by construction) and how many went to a memory whose similarity to the query that
    caused it is below 0.3 (weakly related at best); the share of memories at importance ≥ 0.8
    (permanent: decay never touches them) and the mean stored importance, after plain ingest and
    after the replay.

Goals (issue: a memory that stays true over a bot's life)
    replayed R@10 ≥ plain R@10 − 0.005; 0 reinforcements from off-topic queries; permanent share
    after replay ≤ share at ingest + 5 points.

Usage:  python bench/replay.py --data /path/to/locomo-dev.json --out bench/results/replay-dev.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    SharedEmbedderPlugin,
    machine_info,
    mean,
    now_iso,
    parser_for,
    publish,
    render_table,
    start_shared_embedder,
    with_threads,
)
from locomo import Conversation, DataNotes, Retrieved, load_conversations, score_question, turn_message
from tqdm import tqdm

from narrmem import ManualClock, Memory
from narrmem.config import Settings, load_settings

KS = (5, 10)
QUESTION_K = 25
PERMANENT = 0.8
WEAK = 0.3
OFFTOPIC = (
    "What is the boiling point of mercury in kelvin?",
    "How do I configure a BGP route reflector on a Juniper router?",
    "What's the airspeed velocity of an unladen swallow?",
    "Explain the difference between the CUBIC and BBR congestion control algorithms.",
    "Who won the 1954 FIFA World Cup final?",
    "How many moons does Neptune have?",
    "What is the derivative of arctan(x)?",
    "Can you recommend a torque wrench for carbon bicycle frames?",
    "How do I fix a segmentation fault in my Fortran code?",
    "What is the half-life of carbon-14?",
    "Which enzyme breaks down lactose in the small intestine?",
    "How do I set up a Kubernetes ingress controller with TLS?",
    "What's the best way to descale an espresso machine boiler?",
    "Who wrote the opera Der Rosenkavalier?",
    "What is the tallest volcano in the solar system?",
    "How do I convert a PostgreSQL database from LATIN1 to UTF8?",
    "What is the capital city of Mongolia?",
    "How many bytes are in an IPv6 address?",
    "Explain the Krebs cycle step by step.",
    "Why does the Rust borrow checker reject two mutable references?",
    "What are the tax rules for cryptocurrency staking rewards in Germany?",
    "How do submarines regulate buoyancy?",
    "Which chess opening starts with 1.e4 c5?",
    "What's the melting point of tungsten?",
    "How do I replace the timing belt on a 2004 Honda Civic?",
    "What is the Schwarzschild radius of the sun?",
    "Who painted the ceiling of the Sistine Chapel?",
    "How do I compile a Linux kernel module for ARM?",
    "How does cricket's Duckworth-Lewis method work?",
    "What is the population of Reykjavik?",
    "How do antibiotics kill gram-negative bacteria?",
    "How do I write a SQL window function for a running total?",
    "What is the speed of sound in water?",
    "Which planet has the longest day?",
    "How does a Wankel rotary engine work?",
    "What's the chemical difference between baking soda and baking powder?",
    "How do I calibrate a 3D printer's extruder steps?",
    "Who discovered penicillin?",
    "How is the Pythagorean theorem used in land surveying?",
    "What's the gear ratio of a Shimano Ultegra crankset?",
    "How do I renew a Portuguese residence permit?",
    "What is the atomic number of osmium?",
    "How do I solder surface mount resistors?",
    "When was the Magna Carta signed?",
    "What does a quantum annealer do?",
    "How do I migrate a Django project from MySQL to SQLite?",
    "What is the function of the pancreatic islets?",
    "Which bird has the largest wingspan?",
    "How do I tune a PID controller for a quadcopter?",
    "What is the GDP of Luxembourg?",
)


def _importances(folder: Path, database: str) -> list[float]:
    con = sqlite3.connect(folder / database)
    try:
        return [float(r[0]) for r in con.execute("SELECT importance FROM memories")]
    finally:
        con.close()


def _reinforcements(folder: Path, database: str) -> int:
    con = sqlite3.connect(folder / database)
    try:
        [(n,)] = con.execute("SELECT COUNT(*) FROM memory_history WHERE who = 'recall'")
        return int(n)
    finally:
        con.close()


async def _questions(mem: Memory, conv: Conversation) -> list[dict[str, float]]:
    scores = []
    session_tokens = conv.session_tokens()
    for q in conv.questions:
        hits = await mem.recall(q.text, chat_id=conv.sample_id, k=QUESTION_K, reinforce=False)
        ranked = [Retrieved(ids=tuple(h.message_ids), text=h.text) for h in hits]
        scores.append(score_question(q, ranked, KS, session_tokens))
    return scores


def _importance_summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "memories": len(values),
        "permanent_share": sum(v >= PERMANENT for v in values) / max(1, len(values)),
        "mean_importance": mean(list(values)),
    }


async def plain(conv: Conversation, settings: Settings, shared: SharedEmbedderPlugin) -> dict[str, Any]:
    end = conv.turns[-1].ts
    with tempfile.TemporaryDirectory(prefix="narrmem-replay-") as folder:
        async with Memory.open(folder, settings=settings, plugins=[shared], clock=ManualClock(end)) as mem:
            await mem.ingest_many([turn_message(conv, t) for t in conv.turns])
            scores = await _questions(mem, conv)
        values = _importances(Path(folder), settings.storage.database)
    return {"scores": scores, **_importance_summary(values)}


async def replay(
    conv: Conversation, settings: Settings, shared: SharedEmbedderPlugin, offtopic: int, seed: int, bar: tqdm
) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{conv.sample_id}")
    turns = conv.turns
    # Off-topic queries come after seeded random turns (several may follow one turn).
    slots: dict[int, list[str]] = {}
    for query in rng.sample(OFFTOPIC, min(offtopic, len(OFFTOPIC))):
        slots.setdefault(rng.randrange(len(turns)), []).append(query)
    clock = ManualClock(turns[0].ts)
    counts = {"context_calls": 0, "offtopic_calls": 0, "offtopic_reinforcements": 0, "weak_reinforcements": 0}
    with tempfile.TemporaryDirectory(prefix="narrmem-replay-") as folder:
        async with Memory.open(folder, settings=settings, plugins=[shared], clock=clock) as mem:
            for n, turn in enumerate(turns):
                clock.set(max(clock.now(), turn.ts))
                await mem.ingest(turn_message(conv, turn))
                pack = await mem.context(
                    turn.text, user_id=turn.speaker, chat_id=conv.sample_id, exclude_message_ids=[turn.dia_id]
                )
                counts["context_calls"] += 1
                # A reinforced hit comes back with its new stored importance, above what it had now.
                counts["weak_reinforcements"] += sum(1 for h in pack.hits if _reinforced(h) and _weak(h))
                for query in slots.get(n, []):
                    before = _reinforcements(Path(folder), settings.storage.database)
                    await mem.context(query, user_id=turn.speaker, chat_id=conv.sample_id)
                    counts["offtopic_calls"] += 1
                    counts["offtopic_reinforcements"] += (
                        _reinforcements(Path(folder), settings.storage.database) - before
                    )
                bar.update(1)
            scores = await _questions(mem, conv)
        counts["reinforcements"] = _reinforcements(Path(folder), settings.storage.database)
        values = _importances(Path(folder), settings.storage.database)
    return {"scores": scores, **counts, **_importance_summary(values)}


def _reinforced(hit: Any) -> bool:
    # A reinforcement adds 0.05; the margin keeps rounding (why holds 4 decimals) from counting.
    return hit.why is not None and hit.importance > hit.why.importance_now + 0.01


def _weak(hit: Any) -> bool:
    return hit.why is not None and hit.why.dense is not None and hit.why.dense < WEAK


def _recall(scores: list[dict[str, float]]) -> dict[str, float]:
    return {f"R@{k}": mean([s[f"R@{k}"] for s in scores]) for k in KS}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    notes = DataNotes()
    conversations = load_conversations(Path(args.data), args.limit_conversations, notes)
    if not conversations:
        raise SystemExit(f"{args.data}: no conversation found")
    base = with_threads(load_settings(args.config), args.threads)
    # The replay is about reinforcement: it is on, and the scheduled decay pass is off (the
    # clock is simulated; importance after decay is computed from it when recall needs it).
    plugin_tables = {**base.plugin, "hippocampus": {**base.plugin.get("hippocampus", {}), "reinforce": True}}
    plugin_tables["hippocampus"]["interval_minutes"] = 0
    base = base.model_copy(update={"plugin": plugin_tables})
    inner, shared, settings = await start_shared_embedder(base)
    rows: dict[str, Any] = {}
    try:
        with tqdm(total=sum(len(c.turns) for c in conversations), file=sys.stderr, unit="turn") as bar:
            for conv in conversations:
                bar.set_description(conv.sample_id)
                rows[conv.sample_id] = {
                    "plain": await plain(conv, settings, shared),
                    "replay": await replay(conv, settings, shared, args.offtopic, args.seed, bar),
                }
    finally:
        await inner.close()
    per_conversation = {}
    for sample_id, row in rows.items():
        per_conversation[sample_id] = {
            side: {**_recall(row[side].pop("scores")), **row[side]} for side in ("plain", "replay")
        }
    overall = _overall(rows_scores=_collect(conversations, per_conversation), per=per_conversation)
    return {
        "benchmark": "locomo-long-life-replay",
        "data": args.data,
        "offtopic_per_conversation": args.offtopic,
        "seed": args.seed,
        "conversations": per_conversation,
        "overall": overall,
        "settings": base.model_dump(exclude={"data_dir"}),
        "date": now_iso(),
        "machine": machine_info(base),
        "seconds": time.perf_counter() - started,
    }


def _collect(conversations: Sequence[Conversation], per: dict[str, Any]) -> dict[str, list[float]]:
    """Question-weighted recall: each conversation's mean times its question count."""
    out: dict[str, list[float]] = {}
    for conv in conversations:
        n = len(conv.questions)
        for side in ("plain", "replay"):
            for k in KS:
                out.setdefault(f"{side} R@{k}", []).extend([per[conv.sample_id][side][f"R@{k}"]] * n)
    return out


def _overall(rows_scores: dict[str, list[float]], per: dict[str, Any]) -> dict[str, Any]:
    sides: dict[str, Any] = {}
    for side in ("plain", "replay"):
        memories = sum(c[side]["memories"] for c in per.values())
        permanent = sum(c[side]["permanent_share"] * c[side]["memories"] for c in per.values())
        mean_importance = sum(c[side]["mean_importance"] * c[side]["memories"] for c in per.values())
        sides[side] = {
            **{f"R@{k}": float(np.mean(rows_scores[f"{side} R@{k}"])) for k in KS},
            "permanent_share": permanent / max(1, memories),
            "mean_importance": mean_importance / max(1, memories),
        }
    for key in (
        "reinforcements",
        "offtopic_reinforcements",
        "weak_reinforcements",
        "context_calls",
        "offtopic_calls",
    ):
        sides["replay"][key] = sum(c["replay"][key] for c in per.values())
    sides["goals"] = {
        "replayed R@10 >= plain R@10 - 0.005": sides["replay"]["R@10"] >= sides["plain"]["R@10"] - 0.005,
        "0 reinforcements from off-topic queries": sides["replay"]["offtopic_reinforcements"] == 0,
        "permanent share <= ingest share + 5 points": sides["replay"]["permanent_share"]
        <= sides["plain"]["permanent_share"] + 0.05,
    }
    return sides


def print_report(report: dict[str, Any]) -> None:
    headers = [
        "conversation",
        "store",
        "R@5",
        "R@10",
        "permanent",
        "mean imp.",
        "reinf.",
        "off-topic",
        "weak",
    ]
    rows = []
    for sample_id, sides in [*report["conversations"].items(), ("overall", report["overall"])]:
        for side in ("plain", "replay"):
            row = sides[side]
            rows.append(
                [
                    sample_id,
                    side,
                    row["R@5"],
                    row["R@10"],
                    row["permanent_share"],
                    row["mean_importance"],
                    row.get("reinforcements", "-"),
                    row.get("offtopic_reinforcements", "-"),
                    row.get("weak_reinforcements", "-"),
                ]
            )
    print(render_table(headers, rows))
    print()
    for goal, met in report["overall"]["goals"].items():
        print(f"{'met ' if met else 'MISS'}  {goal}")
    print(f"elapsed: {report['seconds']:.1f}s")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    parser.add_argument("--data", required=True, help="a LoCoMo-format JSON file")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--offtopic", type=int, default=50, help="off-topic context() calls per conversation")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N")
    parser.add_argument("--config", help="a narrmem TOML config file")
    parser.add_argument("--threads", type=int, default=None, help="embedder CPU threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return publish(asyncio.run(run(args)), args.out, print_report)


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
