"""Recall@k of the PostgreSQL store's HNSW index against exact search, scoped as recall scopes it.

Fills a fresh database of the bench server with N clustered unit vectors (a heavy user holding
``--heavy-share`` of them, the rest spread over many users), then for sampled queries compares
``search_vectors`` (HNSW with iterative scans, or whatever plan PostgreSQL picks) with an exact scan
of the same scope. Run: ``python bench/pg_ann.py --size 20000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import _pgserver
import numpy as np
from narrmem_plugins.storage_postgres.store import PostgresStore

from narrmem import load_settings
from narrmem.models import MemoryRecord, Scope

DIM = 384


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = await _pgserver.fresh_settings(load_settings())
    storage = settings.storage
    assert storage.dsn is not None
    store = PostgresStore(
        storage.dsn.get_secret_value(),
        hnsw_m=storage.hnsw_m,
        hnsw_ef_construction=storage.hnsw_ef_construction,
        hnsw_ef_search=storage.hnsw_ef_search,
    )
    await store.open(dim=DIM, model="synthetic")
    rng = np.random.default_rng(args.seed)
    centers = rng.standard_normal((args.clusters, DIM)).astype(np.float32)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    start = time.perf_counter()
    for first in range(0, args.size, 1000):
        n = min(1000, args.size - first)
        vectors = centers[rng.integers(0, args.clusters, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(
            np.float32
        )
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        users = np.where(rng.random(n) < args.heavy_share, 0, rng.integers(1, args.users, n))
        records = [
            MemoryRecord(
                kind="episode",
                user_id=f"u{u}",
                chat_id=f"c{u}",
                text=f"memory {first + i}",
                created_at=t0 + timedelta(seconds=first + i),
                message_ids=[f"m{first + i}"],
            )
            for i, u in enumerate(users)
        ]
        await store.add(records, vectors)
    fill = time.perf_counter() - start
    report: dict[str, Any] = {
        "size": args.size,
        "hnsw": {
            "m": storage.hnsw_m,
            "ef_construction": storage.hnsw_ef_construction,
            "ef_search": store.hnsw_ef_search,
        },
        "fill_s": round(fill, 1),
    }
    for label, user in (("heavy user", "u0"), ("small user", "u1")):
        queries = []
        for _ in range(args.queries):
            query = centers[rng.integers(0, args.clusters)] + 0.6 * rng.standard_normal(DIM).astype(
                np.float32
            )
            queries.append(query / np.linalg.norm(query))
        report[label] = await ann_recall(store, Scope(user_id=user), queries, args.k)
    report["rows_heavy_user"] = len(await store.recent(Scope(user_id="u0"), limit=10**9))
    await store.close()
    return report


async def ann_recall(
    store: PostgresStore, scope: Scope, queries: Sequence[np.ndarray], k: int
) -> dict[str, Any]:
    """Recall@k of ``search_vectors`` (the HNSW index) against an exact scan of the same user's
    memories, with the median time of each, over ``queries``."""
    hits = total = 0
    ann_ms: list[float] = []
    exact_ms: list[float] = []
    for query in queries:
        t = time.perf_counter()
        ann = [i for i, _ in await store.search_vectors(scope, query, k)]
        ann_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        async with store.transaction() as conn:
            await conn.execute("SET LOCAL enable_indexscan = off")
            await conn.execute("SET LOCAL enable_bitmapscan = off")
            rows = await conn.fetch(
                "SELECT id FROM memories WHERE tenant = $3 AND user_id = $4 AND vector IS NOT NULL "
                "ORDER BY vector <#> $1 LIMIT $2",
                np.asarray(query, dtype=np.float32),
                k,
                scope.tenant,
                scope.user_id,
            )
        exact_ms.append((time.perf_counter() - t) * 1000)
        exact = [r[0] for r in rows]
        hits += len(set(ann) & set(exact))
        total += len(exact)
    return {
        "recall_at_k": round(hits / max(1, total), 4),
        "k": k,
        "queries": len(queries),
        "ann_ms_p50": round(float(np.median(ann_ms)), 2) if ann_ms else None,
        "exact_ms_p50": round(float(np.median(exact_ms)), 2) if exact_ms else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--heavy-share", type=float, default=0.3)
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    main()
