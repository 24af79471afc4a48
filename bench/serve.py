"""Ingest and recall over HTTP (``narrmem serve`` on loopback, 16 concurrent httpx clients) next to
the same calls in process, on the same kind of store: requests per second and p50/p95 latency.

    python bench/serve.py [--requests 400] [--clients 16] [--real-model] [--json out.json]

The server runs in its own process (uvicorn on 127.0.0.1, a free port) so the clients do not share
its event loop. Bounded: a fixed number of requests per phase and a time limit per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

WORDS = "job marathon sister hiking bank cat greyhound novel garden piano coffee train city".split()
START = datetime(2026, 1, 1, tzinfo=UTC)


def message(i: int) -> dict[str, Any]:
    a, b = WORDS[i % len(WORDS)], WORDS[(i * 7) % len(WORDS)]
    return {
        "text": f"I keep thinking about my {a} and the {b}, day {i}",
        "user_id": f"u{i % 20}",
        "chat_id": f"c{i % 20}",
        "message_id": f"m{i}",
        "ts": (START + timedelta(minutes=i)).isoformat(),
    }


def query(i: int) -> dict[str, Any]:
    return {"query": f"what about the {WORDS[i % len(WORDS)]}?", "scope": {"user_id": f"u{i % 20}"}}


async def run_phase(
    name: str, call: Callable[[int], Awaitable[None]], n: int, clients: int, limit_s: float
) -> dict[str, Any]:
    latencies: list[float] = []
    counter = iter(range(n))
    deadline = time.perf_counter() + limit_s

    async def worker() -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    latencies.sort()
    q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else latencies * 19
    return {
        "phase": name,
        "requests": len(latencies),
        "clients": clients,
        "seconds": round(elapsed, 3),
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p95_ms": round(q[18] * 1000, 2),
    }


SERVER = """
import asyncio, sys, uvicorn
from narrmem.doors.server import create_app
from narrmem.testing import open_memory

async def main(folder, port, real):
    async with open_memory(folder, real_model=real) as memory:
        config = uvicorn.Config(create_app(memory), host="127.0.0.1", port=port, log_level="warning",
                                lifespan="off")
        await uvicorn.Server(config).serve()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(folder: Path, port: int, real_model: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", SERVER, str(folder), str(port), "1" if real_model else "0"],
        env={**os.environ, "NARRMEM_PLUGIN__HIPPOCAMPUS__REINFORCE": "false"},
    )


async def over_http(port: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        for _ in range(600):
            try:
                if (await client.get("/v1/tenants")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError("the server did not start")

        async def ingest(i: int) -> None:
            (await client.post("/v1/ingest", json=message(i))).raise_for_status()

        async def recall(i: int) -> None:
            (await client.post("/v1/recall", json=query(i))).raise_for_status()

        return [
            await run_phase("http ingest", ingest, args.requests, args.clients, args.limit),
            await run_phase("http recall", recall, args.requests, args.clients, args.limit),
        ]


async def in_process(folder: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    from narrmem.testing import open_memory

    os.environ["NARRMEM_PLUGIN__HIPPOCAMPUS__REINFORCE"] = "false"
    async with open_memory(folder, real_model=args.real_model) as memory:

        async def ingest(i: int) -> None:
            await memory.ingest(message(i))

        async def recall(i: int) -> None:
            q = query(i)
            await memory.recall(q["query"], user_id=q["scope"]["user_id"])

        return [
            await run_phase("in-process ingest", ingest, args.requests, args.clients, args.limit),
            await run_phase("in-process recall", recall, args.requests, args.clients, args.limit),
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per phase")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per phase at most")
    parser.add_argument("--real-model", action="store_true", help="all-MiniLM-L6-v2 (default: hash embedder)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="narrmem-bench-serve-") as tmp:
        rows = asyncio.run(in_process(Path(tmp) / "in-process", args))
        port = free_port()
        proc = start_server(Path(tmp) / "http", port, args.real_model)
        try:
            rows += asyncio.run(over_http(port, args))
        finally:
            proc.terminate()
            proc.wait(30)
    report = {
        "embedder": "all-MiniLM-L6-v2 (onnx)" if args.real_model else "hash (test embedder)",
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    print(f"embedder: {report['embedder']}, {args.clients} clients, {args.requests} requests/phase")
    print(f"{'phase':<20}{'requests':>9}{'req/s':>9}{'p50 ms':>9}{'p95 ms':>9}")
    for row in rows:
        print(f"{row['phase']:<20}{row['requests']:>9}{row['rps']:>9}{row['p50_ms']:>9}{row['p95_ms']:>9}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
