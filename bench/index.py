#!/usr/bin/env python
"""narrmem vector index benchmark: one user's shard at each of ``--sizes`` vectors, searched exactly and
through its HNSW graph, with the recall of HNSW against exact search and the latency of both.

Vectors: ``--pool`` distinct generated chat messages (``_chatgen``) embedded for real with the configured
embedder, and each indexed vector a pool vector plus Gaussian noise (sigma ``--noise`` per dimension),
renormalised; queries are generated questions ("what did I say about ...?", far from any stored message,
the hard case for a graph) and, in one row, held-out generated statements (close to stored ones, as a
paraphrase is), both embedded for real. Everything goes through the
product's ``VectorIndex`` (the thread hop included), with the configured ``[storage]`` HNSW settings:

1. exact: the shard with no graph (``hnsw_threshold`` above the size), a matrix product per query;
2. hnsw: the same rows after the background build (its time is reported), searched at ``ef_search`` and
   at each of ``--ef`` (recall@10 against exact and latency for each). Two recalls: by id (the share of
   exact search's top 10 returned) and by score (the share of returned hits scoring at least exact
   search's 10th: the bulk vectors are noisy copies of ``--pool`` messages, so hundreds of rows tie
   for the last places at 1M, and the id figure then mostly measures which copy won the tie);
3. mapped: the index saved and opened again in a copy of its folder, as a restarted process finds
   it (the graph mapped from its file), with ``--outside`` rows written since: searched exactly
   beside the mapped graph (latency, and recall@10 against exact search over all the rows);
4. tombstones: ``--delete`` of the rows removed (below the rebuild ratio, so the graph keeps them as
   tombstones), then searched again (recall against exact search over the live rows).

Usage:  python bench/index.py --out bench/results/index.json            (default sizes 100000 1000000)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _chatgen import ChatGenerator
from _common import (
    default_embedder,
    latency_summary,
    machine_info,
    now_iso,
    params_of,
    parser_for,
    peak_rss_mib,
    publish,
    render_table,
)
from narrmem_plugins.storage_sqlite.vector_index import (
    OUTSIDE_GRAPH_LIMIT,
    Consistency,
    IndexOptions,
    Owner,
    VectorIndex,
)

from narrmem import load_settings

CHUNK = 50_000
USER = ("default", "heavy")


async def embed_all(embedder: Any, texts: list[str]) -> np.ndarray:
    parts = [await embedder.embed(texts[i : i + 256]) for i in range(0, len(texts), 256)]
    return np.vstack(parts).astype(np.float32)


def noisy(pool: np.ndarray, n: int, noise: float, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((n, pool.shape[1]), dtype=np.float32)
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        block = pool[rng.integers(0, len(pool), m)] + rng.normal(0.0, noise, (m, pool.shape[1]))
        out[start : start + m] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


async def fill(index: VectorIndex, vectors: np.ndarray) -> None:
    for start in range(0, len(vectors), CHUNK):
        part = vectors[start : start + CHUNK]
        ids = np.arange(start + 1, start + len(part) + 1, dtype=np.int64)
        await index.add(ids, part, [Owner(USER[0], USER[1], "dm")] * len(part))


async def timed_searches(
    index: VectorIndex, queries: np.ndarray, k: int
) -> tuple[list[list[tuple[int, float]]], dict[str, float]]:
    found, seconds = [], []
    for query in queries:
        start = time.perf_counter()
        hits = await index.search(query, k, tenant=USER[0], user_id=USER[1], chat_id=None)
        seconds.append(time.perf_counter() - start)
        found.append(hits)
    summary = latency_summary(seconds)
    summary["p95_ms"] = float(np.percentile(np.asarray(seconds) * 1000, 95))
    return found, summary


def recall_at(found: list[list[tuple[int, float]]], truth: list[list[tuple[int, float]]], k: int) -> float:
    """Share of the exact top ``k`` ids that the search returned."""
    return float(
        np.mean(
            [
                len({i for i, _ in f[:k]} & {i for i, _ in t[:k]}) / k
                for f, t in zip(found, truth, strict=True)
            ]
        )
    )


def score_recall_at(
    found: list[list[tuple[int, float]]], truth: list[list[tuple[int, float]]], k: int
) -> float:
    """Share of returned hits scoring at least the exact k-th best: with near-duplicate memories many
    rows tie for the last places, and any of them is as good an answer as the one exact search kept."""
    shares = []
    for f, t in zip(found, truth, strict=True):
        kth = t[min(k, len(t)) - 1][1]
        shares.append(sum(score >= kth - 1e-5 for _, score in f[:k]) / k)
    return float(np.mean(shares))


async def measure_size(
    args: argparse.Namespace,
    options: IndexOptions,
    vectors: np.ndarray,
    queries: np.ndarray,
    statements: np.ndarray,
    folder: Path,
) -> dict[str, Any]:
    n = len(vectors)
    out: dict[str, Any] = {"vectors": n}
    exact_options = dataclasses.replace(options, hnsw_threshold=n + 1)
    exact = VectorIndex(folder / f"exact-{n}", vectors.shape[1], exact_options)
    await fill(exact, vectors)
    truth, out["exact"] = await timed_searches(exact, queries, args.k)
    statement_truth, _ = await timed_searches(exact, statements, args.k)
    await exact.close()
    del exact

    index = VectorIndex(folder / f"hnsw-{n}", vectors.shape[1], options)
    start = time.perf_counter()
    await fill(index, vectors)
    await index.settle()
    out["hnsw_build_s"] = time.perf_counter() - start
    assert index.describe()["hnsw_shards"] == 1, index.describe()
    found, out["hnsw"] = await timed_searches(index, queries, args.k)
    out["hnsw"]["recall_at_k"] = recall_at(found, truth, args.k)
    out["hnsw"]["score_recall_at_k"] = score_recall_at(found, truth, args.k)
    found, out["hnsw_statements"] = await timed_searches(index, statements, args.k)
    out["hnsw_statements"]["recall_at_k"] = recall_at(found, statement_truth, args.k)
    out["hnsw_statements"]["score_recall_at_k"] = score_recall_at(found, statement_truth, args.k)
    out["hnsw"]["ef_search"] = options.ef_search
    out["ef_sweep"] = []
    for ef in args.ef:
        index.options = dataclasses.replace(options, ef_search=ef)
        swept, summary = await timed_searches(index, queries, args.k)
        out["ef_sweep"].append(
            {
                "ef_search": ef,
                "recall_at_k": recall_at(swept, truth, args.k),
                "score_recall_at_k": score_recall_at(swept, truth, args.k),
                **summary,
            }
        )
    index.options = options
    if args.outside:
        out["hnsw_mapped_outside"] = await mapped_with_rows_outside(args, index, vectors, queries, folder)

    deleted = np.random.default_rng(args.seed).choice(n, int(n * args.delete), replace=False) + 1
    await index.remove(deleted.astype(np.int64), [USER])
    assert index.describe()["tombstones"] == len(deleted) and not index.describe()["hnsw_builds_running"]
    found, out["hnsw_tombstones"] = await timed_searches(index, queries, args.k)
    live = np.ones(n, dtype=bool)
    live[deleted - 1] = False
    scores = queries @ vectors[live].T
    live_ids = np.flatnonzero(live) + 1
    live_truth = [[(int(live_ids[i]), float(row[i])) for i in np.argsort(-row)[: args.k]] for row in scores]
    out["hnsw_tombstones"]["recall_at_k"] = recall_at(found, live_truth, args.k)
    out["hnsw_tombstones"]["score_recall_at_k"] = score_recall_at(found, live_truth, args.k)
    out["hnsw_tombstones"]["deleted"] = len(deleted)
    out["hnsw_tombstones"]["returned_deleted"] = len(
        {i for f in found for i in f} & {int(d) for d in deleted}
    )
    await index.close()
    out["peak_rss_mib"] = peak_rss_mib()
    return out


async def mapped_with_rows_outside(
    args: argparse.Namespace, index: VectorIndex, vectors: np.ndarray, queries: np.ndarray, folder: Path
) -> dict[str, Any]:
    """The shard as a restarted process finds it: its graph mapped from the saved files, and
    ``--outside`` rows written since (FAISS cannot add to a mapped graph: they are searched exactly
    beside it until ``OUTSIDE_GRAPH_LIMIT`` of them have the graph copied into memory)."""
    n = len(vectors)
    await index.save()
    copy = folder / f"mapped-{n}"
    shutil.copytree(index.path, copy)
    mapped = VectorIndex(copy, vectors.shape[1], index.options)
    ids = np.arange(1, n + 1, dtype=np.int64)
    assert await mapped.load(Consistency.known(ids, {})), mapped.rebuilt_reason
    rng = np.random.default_rng(args.seed + 1)
    extra = vectors[rng.integers(0, n, args.outside)]
    extra = extra + rng.normal(0.0, args.noise, extra.shape)
    extra = (extra / np.linalg.norm(extra, axis=1, keepdims=True)).astype(np.float32)
    extra_ids = np.arange(n + 1, n + args.outside + 1, dtype=np.int64)
    await mapped.add(extra_ids, extra, [Owner(USER[0], USER[1], "dm")] * args.outside)
    described = mapped.describe()
    assert described["rows_outside_graphs"] == args.outside and not described["hnsw_builds_running"]
    found, summary = await timed_searches(mapped, queries, args.k)
    every = np.vstack([vectors, extra])
    scores = queries @ every.T
    truth = [[(int(i) + 1, float(row[i])) for i in np.argsort(-row)[: args.k]] for row in scores]
    await mapped.close()
    shutil.rmtree(copy)
    return {
        **summary,
        "rows_outside": args.outside,
        "recall_at_k": recall_at(found, truth, args.k),
        "score_recall_at_k": score_recall_at(found, truth, args.k),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = load_settings(args.config)
    options = IndexOptions.from_settings(settings.storage)
    embedder = default_embedder(settings)
    await embedder.start()
    gen = ChatGenerator(args.seed)
    pool = await embed_all(embedder, gen.unique_contents(args.pool))
    queries = await embed_all(embedder, [gen.query() for _ in range(args.queries)])
    statements = await embed_all(embedder, gen.unique_contents(args.pool + args.queries)[args.pool :])
    await embedder.close()
    rng = np.random.default_rng(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="narrmem-index-") as tmp:
        for size in sorted(args.sizes):
            print(f"size {size:,} ...", file=sys.stderr)
            vectors = noisy(pool, size, args.noise, rng)
            results.append(await measure_size(args, options, vectors, queries, statements, Path(tmp)))
            del vectors
    return {
        "options": options.__dict__,
        "results": results,
        "settings": settings.model_dump(),
        "m": machine_info(),
    }


def print_report(report: dict[str, Any]) -> None:
    rows = []
    for r in report["results"]:
        n = f"{r['vectors']:,}"
        rows.append([n, "exact", "-", r["exact"]["p50_ms"], r["exact"]["p95_ms"], 1.0, 1.0])
        h, t = r["hnsw"], r["hnsw_tombstones"]
        runs = [("hnsw", h["ef_search"], h)]
        runs += [("  hnsw ef sweep", s["ef_search"], s) for s in r["ef_sweep"]]
        if "hnsw_mapped_outside" in r:
            o = r["hnsw_mapped_outside"]
            runs.append((f"hnsw mapped, {o['rows_outside']:,} rows outside", h["ef_search"], o))
        runs.append((f"hnsw, {t['deleted']:,} tombstones", h["ef_search"], t))
        runs.append(("hnsw, statement queries", h["ef_search"], r["hnsw_statements"]))
        for label, ef, m in runs:
            rows.append([n, label, ef, m["p50_ms"], m["p95_ms"], m["recall_at_k"], m["score_recall_at_k"]])
    print(
        f"\nOne user's shard, k={report['params']['k']}: search latency (ms, thread hop included) "
        "and recall@k vs exact"
    )
    print(
        render_table(["vectors", "search", "ef", "p50", "p95", "recall@k", "score recall@k"], rows, digits=3)
    )
    for r in report["results"]:
        print(
            f"{r['vectors']:,}: HNSW build {r['hnsw_build_s']:.1f}s (background, one thread); "
            f"deleted rows returned: {r['hnsw_tombstones']['returned_deleted']}; "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="vectors in the shard"
    )
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--pool", type=int, default=4000, help="distinct messages embedded for real")
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument(
        "--ef", type=int, nargs="*", default=[32, 64, 128, 256], help="ef_search values to sweep"
    )
    parser.add_argument("--delete", type=float, default=0.1, help="share of rows deleted (tombstoned)")
    parser.add_argument(
        "--outside",
        type=int,
        default=OUTSIDE_GRAPH_LIMIT - 1,
        help="rows written after the graph's file, searched beside it once it is mapped (0: skip)",
    )
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--config", help="a narrmem TOML config file (default: defaults + NARRMEM_ env)")
    args = parser.parse_args(argv)
    if min(args.sizes) < 2 or args.queries < 1 or args.pool < 1 or not 0 <= args.delete < 1:
        parser.error("--sizes must be >= 2, --queries and --pool positive, --delete in [0, 1)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    body = asyncio.run(run(args))
    report = {
        "benchmark": "index",
        "params": params_of(args),
        "options": body["options"],
        "results": body["results"],
        "date": now_iso(),
        "machine": body["m"],
        "seconds": time.perf_counter() - started,
    }
    return publish(report, args.out, print_report)


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
