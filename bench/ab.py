#!/usr/bin/env python
"""Two checkouts of narrmem, the same traffic, interleaved: is B slower than A, or is it the machine?

A whole ``bench/speed.py`` run takes minutes, and a 2-core machine drifts by 10-30 % over that
long; two runs of one commit, minutes apart, differ as much as a real regression. This script
compares two source trees (two commits checked out side by side, e.g. with ``git worktree``) on
one fixed workload, alternating A and B in fresh processes, so that drift hits both alike:

1. For each tree, one store of ``--size`` memories is filled once with ``store.add`` (the bulk fill of
   ``bench/speed.py``: the same seeded people, texts, vectors and times for both trees), in that
   tree's code. With ``--same-store`` A's store is filled and B gets a copy of its files: the
   vector index's graphs are built in the background while a store fills, so how much of a heavy
   user's memories they cover (the rest is searched exactly) can differ from one fill to the
   next, and a heavy user's recall time with it.
2. ``--pairs`` rounds; each round runs a child process per tree (the order alternates by round). A
   child opens its tree's store and, with new seeded traffic of its round: ``--samples`` single
   ``ingest`` calls of stored messages, then ``--samples`` heavy-user recalls three times (the
   middle of the three p50s is kept) and ``--samples`` typical-user recalls, all with the query
   embedding, and the process CPU time per stored ingest and per heavy-user recall.
3. With ``--bulk N``, each round also runs a child per tree on a fresh, empty store: the bulk ratio
   of ``bench/speed.py`` (``ingest_many`` of N new messages against raw embedding of the texts it
   embeds for them, in 512-message parts, alternating which goes first; the store grows by each part,
   as in that benchmark). ``--size 0`` skips the filled store and its latencies: bulk rounds only.
4. The report: each round's figures side by side, the median over rounds of each, and B / A.

``--read-only`` times recalls only: A's code fills one store, and every child of either tree opens
that very store read-only (no reinforcement, nothing written), so no round changes what the next
one reads and no copy or second fill can differ.

The traffic generator and this script are the running tree's; only ``narrmem`` and its plugins
come from the tree under test (``PYTHONPATH`` puts it first, ``narrmem_plugins`` pointing at its
``plugins`` folder).

Usage:  python bench/ab.py --a /tmp/old --b . --out bench/results/ab.json
        python bench/ab.py --a /tmp/old --b . --size 0 --bulk 2048 --pairs 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _chatgen import ChatGenerator
from _common import latency_summary, machine_info, now_iso, process_cpu_s, render_table, write_json

FIGURES = (
    "ingest_stored_p50_ms",
    "recall_heavy_p50_ms",
    "recall_typical_p50_ms",
    "cpu_ingest_ms",
    "cpu_recall_ms",
)
BULK_FIGURES = ("bulk_ratio", "bulk_msg_per_s", "raw_msg_per_s")
READ_FIGURES = ("recall_heavy_p50_ms", "recall_typical_p50_ms", "cpu_recall_ms")


def tree_environment(tree: Path, shim: Path) -> dict[str, str]:
    """An environment whose ``narrmem`` and ``narrmem_plugins`` are ``tree``'s."""
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "narrmem_plugins"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(tree.resolve() / "plugins")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), str(shim)])
    return env


async def fill_store(folder: Path, size: int, seed: int) -> dict[str, Any]:
    from speed import Population, fill

    from narrmem import Memory, load_settings

    gen = ChatGenerator(seed)
    pop = Population(gen=gen, people=gen.people(500), heavy_share=0.2)
    mem = await Memory.open(folder, settings=load_settings())
    try:
        texts = gen.unique_contents(1000)
        vectors = np.vstack([await mem.embedder.embed(texts[i : i + 64]) for i in range(0, len(texts), 64)])
        stats = await fill(mem, pop, texts, vectors, size, 0.02, np.random.default_rng(seed))
        await mem.store.index.settle()
    finally:
        await mem.close()
    return {"records": stats["records"], "heavy_user_memories": pop.counts[pop.heavy.user_id]}


async def workload(folder: Path, seed: int, round_no: int, samples: int) -> dict[str, Any]:
    from speed import Population, time_ingest

    from narrmem import Memory, load_settings

    gen = ChatGenerator(seed * 1000 + round_no)
    pop = Population(gen=gen, people=ChatGenerator(seed).people(500), heavy_share=0.2)
    pop._next = (round_no + 1) * 10_000_000  # message ids never met in an earlier round
    # Each round's traffic after the last's (a round's is hours long), within the ten years a
    # bench memory takes ahead of the wall clock.
    pop._clock = (round_no + 1) * 1e7
    mem = await Memory.open(folder, settings=load_settings())
    try:
        await mem.embedder.embed(["warm up the model"])
        cpu = process_cpu_s(mem)
        stored = await time_ingest(mem, pop, samples, ignored=False)
        cpu_ingest = (process_cpu_s(mem) - cpu) / samples
        recalls = await time_recalls(mem, pop, gen, samples, reinforce=True)
    finally:
        await mem.close()
    return {"ingest_stored_p50_ms": stored["p50_ms"], **recalls, "cpu_ingest_ms": cpu_ingest * 1000}


async def time_recalls(
    mem: Any, pop: Any, gen: ChatGenerator, samples: int, *, reinforce: bool
) -> dict[str, float]:
    """Heavy-user recalls three times ``samples`` (the middle of the three p50s is kept, with the
    process CPU per recall), then ``samples`` typical-user recalls; ten warm-up recalls first."""
    from speed import forget_recent

    queries = [gen.query() for _ in range(4 * samples + 10)]
    for query in queries[:10]:
        await mem.recall(query, user_id=pop.heavy.user_id, k=10, reinforce=reinforce)
    heavy: list[float] = []
    cpu = process_cpu_s(mem)
    for part in range(3):
        durations = []
        for query in queries[10 + part * samples : 10 + (part + 1) * samples]:
            forget_recent(mem)  # the questions repeat: each recall embeds its own
            start = time.perf_counter()
            await mem.recall(query, user_id=pop.heavy.user_id, k=10, reinforce=reinforce)
            durations.append(time.perf_counter() - start)
        heavy.append(latency_summary(durations)["p50_ms"])
    cpu_recall = (process_cpu_s(mem) - cpu) / (3 * samples)
    typical = []
    for query in queries[10 + 3 * samples :]:
        forget_recent(mem)
        start = time.perf_counter()
        await mem.recall(query, user_id=pop.typical.user_id, k=10, reinforce=reinforce)
        typical.append(time.perf_counter() - start)
    return {
        "recall_heavy_p50_ms": sorted(heavy)[1],
        "recall_typical_p50_ms": latency_summary(typical)["p50_ms"],
        "cpu_recall_ms": cpu_recall * 1000,
    }


async def read_workload(folder: Path, seed: int, round_no: int, samples: int) -> dict[str, Any]:
    """Recalls only, on a store opened read-only: both trees read the very same bytes, and nothing
    a round does changes what the next one reads."""
    from speed import Population

    from narrmem import Memory, load_settings

    gen = ChatGenerator(seed * 1000 + round_no)
    pop = Population(gen=gen, people=ChatGenerator(seed).people(500), heavy_share=0.2)
    mem = await Memory.open(folder, settings=load_settings(), read_only=True)
    try:
        await mem.embedder.embed(["warm up the model"])
        return await time_recalls(mem, pop, gen, samples, reinforce=False)
    finally:
        await mem.close()


async def bulk_ratio(seed: int, round_no: int, n: int) -> dict[str, Any]:
    from speed import Population, embed_raw, embedded_text, forget_recent

    from narrmem import Memory, load_settings

    gen = ChatGenerator(seed * 1000 + round_no)
    pop = Population(gen=gen, people=ChatGenerator(seed).people(500), heavy_share=0.2)
    part = 512
    raw_s = pipe_s = 0.0
    with tempfile.TemporaryDirectory(prefix="narrmem-ab-bulk-") as folder:
        mem = await Memory.open(folder, settings=load_settings())
        try:
            await mem.embedder.embed(["warm up the model"])
            texts = gen.unique_contents(n)
            chunk = mem.settings.storage.batch_size
            for i, offset in enumerate(range(0, n, part)):
                messages = [pop.message(t, prefix="bulk") for t in texts[offset : offset + part]]
                embedded = [embedded_text(m) for m in messages]
                for side in ("raw", "pipe") if i % 2 == 0 else ("pipe", "raw"):
                    start = time.perf_counter()
                    if side == "raw":
                        await embed_raw(mem, embedded, chunk)
                        raw_s += time.perf_counter() - start
                    else:
                        forget_recent(mem)  # the raw side embedded these very texts
                        await mem.ingest_many(messages)
                        pipe_s += time.perf_counter() - start
        finally:
            await mem.close()
    return {"bulk_ratio": raw_s / pipe_s, "bulk_msg_per_s": n / pipe_s, "raw_msg_per_s": n / raw_s}


def run_child(tree: Path, shim: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        env=tree_environment(tree, shim),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"child for {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    trees = {"A": Path(args.a), "B": Path(args.b)}
    figures = ((READ_FIGURES if args.read_only else FIGURES) if args.size else ()) + (
        BULK_FIGURES if args.bulk else ()
    )
    fills = {}
    for name, tree in trees.items():
        if not args.size:
            break
        if args.read_only and name == "B":
            fills["B"] = fills["A"]  # B reads A's store itself, read-only
            continue
        if args.same_store and name == "B":
            # One store's files for both: what the background graph builds cover can differ from
            # one fill to the next, and a heavy user's search time with it.
            shutil.copytree(work / "A", work / "B")
            fills["B"] = fills["A"]
            continue
        print(f"filling {name} ({tree}) to {args.size:,} ...", file=sys.stderr)
        fills[name] = run_child(
            tree, work / f"shim-{name}", "fill", str(work / name), str(args.size), str(args.seed)
        )
    rounds: list[dict[str, Any]] = []
    for round_no in range(args.pairs):
        order = ["A", "B"] if round_no % 2 == 0 else ["B", "A"]
        row: dict[str, Any] = {"order": "".join(order)}
        for name in order:
            shim = work / f"shim-{name}"
            row[name] = {}
            if args.size:
                row[name] |= run_child(
                    trees[name],
                    shim,
                    "read" if args.read_only else "work",
                    str(work / ("A" if args.read_only else name)),
                    str(args.seed),
                    str(round_no),
                    str(args.samples),
                )
            if args.bulk:
                row[name] |= run_child(
                    trees[name], shim, "bulk", "-", str(args.seed), str(round_no), str(args.bulk)
                )
        print(f"round {round_no + 1}: {json.dumps(row)}", file=sys.stderr)
        rounds.append(row)
    medians = {
        name: {figure: statistics.median(r[name][figure] for r in rounds) for figure in figures}
        for name in trees
    }
    return {
        "trees": {name: str(tree.resolve()) for name, tree in trees.items()},
        "fill": fills,
        "rounds": rounds,
        "median": medians,
        "b_over_a": {figure: medians["B"][figure] / medians["A"][figure] for figure in figures},
    }


def print_report(report: dict[str, Any]) -> None:
    rows = [
        [
            figure,
            f"{report['median']['A'][figure]:.2f}",
            f"{report['median']['B'][figure]:.2f}",
            f"{ratio:.3f}",
        ]
        for figure, ratio in report["b_over_a"].items()
    ]
    print(render_table(["median over rounds", "A", "B", "B / A"], rows))
    for n, row in enumerate(report["rounds"], 1):
        for figure, label in (
            ("recall_heavy_p50_ms", "heavy-user recall p50 ms"),
            ("bulk_ratio", "bulk ratio"),
        ):
            if figure in row[row["order"][0]]:
                cells = "  ".join(f"{name} {row[name][figure]:.2f}" for name in row["order"])
                print(f"round {n} {label}: {cells}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--a", required=True, help="the reference source tree (holds narrmem/ and plugins/)")
    parser.add_argument("--b", required=True, help="the source tree compared with it")
    parser.add_argument(
        "--size",
        type=int,
        default=100_000,
        help="memories in each store (default 100000; 0: bulk rounds only)",
    )
    parser.add_argument("--bulk", type=int, default=0, help="also the bulk ratio on this many new messages")
    parser.add_argument(
        "--same-store",
        action="store_true",
        help="fill one store with A's code and give B a copy (trees that read the same store format)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="recall only: A's code fills one store, and both trees' children open it read-only",
    )
    parser.add_argument("--pairs", type=int, default=4, help="rounds of one A and one B child (default 4)")
    parser.add_argument("--samples", type=int, default=200, help="ingests and recalls per timed set")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.size < 0 or args.bulk < 0 or (args.size == 0 and args.bulk == 0):
        parser.error("--size and --bulk: not negative, and not both 0 (nothing to compare)")
    return args


def child(argv: list[str]) -> int:
    kind, folder, *rest = argv
    if kind == "bulk":
        seed, round_no, n = (int(x) for x in rest)
        result = asyncio.run(bulk_ratio(seed, round_no, n))
    elif kind == "fill":
        size, seed = int(rest[0]), int(rest[1])
        Path(folder).mkdir(parents=True, exist_ok=True)
        result = asyncio.run(fill_store(Path(folder), size, seed))
    elif kind == "read":
        seed, round_no, samples = (int(x) for x in rest)
        result = asyncio.run(read_workload(Path(folder), seed, round_no, samples))
    else:
        seed, round_no, samples = (int(x) for x in rest)
        result = asyncio.run(workload(Path(folder), seed, round_no, samples))
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["--child"]:
        return child(raw[1:])
    args = parse_args(raw)
    with tempfile.TemporaryDirectory(prefix="narrmem-ab-") as tmp:
        report = {
            "when": now_iso(),
            "machine": machine_info(),
            "params": vars(args),
            **compare(args, Path(tmp)),
        }
    print_report(report)
    if args.out:
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
