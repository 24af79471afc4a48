"""Scope isolation (hash embedder, many probes): no recall, tool call or store search ever returns a
memory of another user, chat or tenant, even when the query is that memory's exact text."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from _helpers import msg, store_sql

from narrmem import Memory, Scope
from narrmem.testing import open_memory

TENANTS = ["default", "t2"]
USERS = ["u1", "u2"]
CHATS = ["c1", "c2"]
SHARED = ["coffee", "garden", "piano", "train", "weekend", "sister", "rain", "book", "movie", "dinner"]


def _corpus() -> list[dict[str, Any]]:
    """Three messages per (tenant, user, chat), with shared words everywhere and one unique token each."""
    rng = random.Random(7)
    out = []
    for tenant, user, chat in itertools.product(TENANTS, USERS, CHATS):
        token = f"secret{tenant}{user}{chat}"
        for n in range(3):
            words = rng.sample(SHARED, 4)
            text = f"{token} {' '.join(words)} note {n}"
            out.append(msg(f"{user}-{chat}-{n}", text, user=user, chat=chat, tenant=tenant))
    return out


CORPUS = _corpus()


def _in_scope(item: dict[str, Any], scope: dict[str, Any]) -> bool:
    return (
        item["tenant"] == scope["tenant"]
        and scope.get("user_id") in (None, item["user_id"])
        and scope.get("chat_id") in (None, item["chat_id"])
    )


def _random_scope(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["user", "chat", "both"])
    scope: dict[str, Any] = {"tenant": rng.choice(TENANTS)}
    if kind in ("user", "both"):
        scope["user_id"] = rng.choice(USERS)
    if kind in ("chat", "both"):
        scope["chat_id"] = rng.choice(CHATS)
    return scope


def _random_query(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return str(rng.choice(CORPUS)["text"])  # someone's exact text (often another scope's)
    if roll < 0.75:
        tenant, user, chat = rng.choice(TENANTS), rng.choice(USERS), rng.choice(CHATS)
        return f"secret{tenant}{user}{chat}"
    return " ".join(rng.sample(SHARED, rng.randint(1, 4)))


def _probes(rng: random.Random, count: int) -> Iterator[tuple[dict[str, Any], str]]:
    """``count`` random (scope, query) probes, drawn lazily: a caller may draw from ``rng`` between them."""
    for _ in range(count):
        yield _random_scope(rng), _random_query(rng)


@pytest_asyncio.fixture
async def populated(tmp_path: Path) -> AsyncIterator[tuple[Memory, dict[int, dict[str, Any]]]]:
    async with open_memory(tmp_path / "store") as mem:
        results = await mem.ingest_many(CORPUS)
        assert all(r.stored for r in results)
        by_id = {r.memory_ids[0]: item for r, item in zip(results, CORPUS, strict=True)}
        yield mem, by_id


def _check_hits(hits: list[Any], scope: dict[str, Any]) -> None:
    for hit in hits:
        assert hit.tenant == scope["tenant"], (scope, hit)
        if "user_id" in scope:
            assert hit.user_id == scope["user_id"], (scope, hit)
        if "chat_id" in scope:
            assert hit.chat_id == scope["chat_id"], (scope, hit)


async def test_two_hundred_cross_probes_leak_nothing(populated: Any) -> None:
    mem, by_id = populated
    rng = random.Random(2024)
    answered = exact_found = exact_asked = 0
    for scope, query in _probes(rng, 200):
        k = rng.randint(1, 30)
        hits = await mem.recall(query, k=k, **scope)
        assert len(hits) <= k
        _check_hits(hits, scope)
        # Cross-check with the stored rows themselves, not only the hit's own labels.
        for hit in hits:
            assert _in_scope(by_id[hit.id], scope)
        answered += bool(hits)
        own = [item for item in CORPUS if item["text"] == query and _in_scope(item, scope)]
        if own and k >= 3:
            exact_asked += 1
            exact_found += own[0]["message_id"] in {mid for h in hits for mid in h.message_ids}
    # The probes were not vacuous: most found something, and an in-scope exact text is found.
    assert answered > 150
    assert exact_asked > 0 and exact_found == exact_asked
    # And all of this was read-only.
    assert await store_sql(mem, "SELECT COUNT(*) FROM memories") == [(len(CORPUS),)]


async def test_full_scope_recall_returns_exactly_the_scope(populated: Any) -> None:
    """With k large enough, a probe that matches everything returns all of the scope and nothing else."""
    mem, by_id = populated
    query = " ".join(SHARED) + " note"
    for tenant in TENANTS:
        scopes = [{"tenant": tenant, "user_id": u} for u in USERS]
        scopes += [{"tenant": tenant, "chat_id": c} for c in CHATS]
        scopes += [{"tenant": tenant, "user_id": u, "chat_id": c} for u in USERS for c in CHATS]
        for scope in scopes:
            hits = await mem.recall(query, k=100, **scope)
            expected = {mid for mid, item in by_id.items() if _in_scope(item, scope)}
            assert {h.id for h in hits} == expected, scope


async def test_store_level_searches_filter_by_scope(populated: Any) -> None:
    """The store contract itself (not just the host's re-check) keeps scopes apart."""
    mem, by_id = populated
    for scope, query in _probes(random.Random(99), 60):
        [vector] = await mem.embedder.embed([query])
        vector_hits = await mem.store.search_vectors(Scope(**scope), vector, 50)
        keyword_hits = await mem.store.search_keywords(Scope(**scope), query, 50)
        records = await mem.store.get(list(by_id), Scope(**scope))
        for mid, _ in [*vector_hits, *keyword_hits]:
            assert _in_scope(by_id[mid], scope), (scope, query, mid)
        assert set(records) == {mid for mid, item in by_id.items() if _in_scope(item, scope)}


async def test_tenant_isolation(populated: Any) -> None:
    mem, _ = populated
    for item in CORPUS:
        other = "t2" if item["tenant"] == "default" else "default"
        hits = await mem.recall(item["text"], user_id=item["user_id"], chat_id=item["chat_id"], tenant=other)
        assert hits and all(h.tenant == other for h in hits)
        assert item["message_id"] in {m for h in hits for m in h.message_ids}  # same ids, other tenant's copy
        assert all(h.text.split()[0] == f"secret{other}{item['user_id']}{item['chat_id']}" for h in hits)
        # A tenant with no data sees nothing at all.
        assert await mem.recall(item["text"], user_id=item["user_id"], tenant="t3") == []


async def test_tool_calls_and_context_respect_scope(populated: Any) -> None:
    mem, _ = populated
    for scope, query in _probes(random.Random(5), 40):
        out = await mem.call_tool("narrmem_recall", json.dumps({"query": query, "k": 20, **scope}))
        for hit in out["hits"]:
            assert hit["tenant"] == scope["tenant"]
            assert scope.get("user_id") in (None, hit["user_id"])
            assert scope.get("chat_id") in (None, hit["chat_id"])
        pack = await mem.context(query, k=20, **scope)
        _check_hits(pack.hits, scope)
        rendered = pack.render()
        for item in CORPUS:
            if not _in_scope(item, scope):
                assert item["text"] not in rendered
