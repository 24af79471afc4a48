"""Isolation probes: a seeded population of users in three tenants (the same user ids in several
tenants, as different people), busy group chats and direct chats, every (tenant, user, chat) with
secret tokens of its own in its messages (scenes, facts, plain remarks) and in what the tools wrote
for it (hand-written scenes, personas, tasks); each tenant has an rtm tree of its own.

A probe calls one read path with one scope and a question (often another owner's token or message,
sometimes the scope's own token), serializes everything the call returned, and counts every token
the scope may not see:

* a user scope (tenant, user) sees that user's tokens from every chat;
* a chat scope (tenant, chat) sees every member's tokens of that chat;
* a (tenant, user, chat) scope sees only that user's tokens of that chat;
* ``turn_context`` shows the user's facts and persona from every chat (user scope) but its
  ``memories`` only from the chat; ``persona_get`` with a chat may fall back to the user's default
  persona; the rtm tools see their tenant's trees.

Then some people are forgotten, and no answer anywhere may hold their tokens any more.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narrmem import ManualClock, Memory, NarrmemError
from narrmem.testing import open_memory

from .common import (
    BASE_TS,
    TREE,
    Corpus,
    Owner,
    build_corpus,
    excerpt,
    figures_dict,
    sql,
    tallies,
    to_json,
    tokens_in,
)

PATHS = (
    "recall user",
    "recall chat",
    "recall user+chat",
    "context user",
    "context chat",
    "context user+chat",
    "turn_context",
    "summary",
    "narrmem_recall",
    "soul_narrative search",
    "soul_narrative list",
    "soul_narrative get",
    "memory_recall",
    "memory_purge dry_run",
    "persona_get",
    "task_query",
    "rtm_traverse_narrative",
    "rtm_find_optimal_depth",
)
# Paths where asking for the scope's own token must find it (the probes are not vacuous).
FINDING_PATHS = frozenset(
    {"recall user", "recall chat", "recall user+chat", "context user", "context chat", "context user+chat"}
)
DIRECT_CHAT = "_direct"  # where the graph and soul_narrative tools write without a chat
ScopeKey = tuple[str, str | None, str | None]


@dataclass
class Probe:
    path: str
    scope: ScopeKey
    query: str
    own: str | None = None  # the scope's own token asked for, if any
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    counts: Counter[str] = field(
        default_factory=tallies(
            "probes foreign_probes foreign_tokens own_asked own_found answers_with_own_tokens "
            "unexpected_errors forgotten_people after_forget_probes forgotten_found"
        )
    )
    by_path: Counter[str] = field(default_factory=Counter)
    foreign_by_path: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    error_examples: list[str] = field(default_factory=list)
    forgotten_examples: list[dict[str, Any]] = field(default_factory=list)
    population: dict[str, Any] = field(default_factory=dict)
    real_model: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        causes = Counter(_cause(e) for e in self.examples)
        cut = {"examples": 10, "forgotten_examples": 10, "error_examples": 10}
        return figures_dict(self, cut=cut, causes=dict(sorted(causes.items())))


def _cause(example: dict[str, Any]) -> str:
    """Which boundary a found token crossed: tenant, user (another person of the tenant), or chat
    (the same person, another chat)."""
    tenant, user, _ = example["scope"]
    owner = example["owner"]
    if owner[0] != tenant:
        return "tenant"
    if user is not None and owner[1] != user:
        return "user"
    if user is None:
        return "chat (another chat's member)"
    return "chat (the same user's other chat)"


def run_isolation(
    probes: int,
    seed: int,
    workdir: Path,
    *,
    users: int | None = None,
    real_model: bool = False,
    plugins: Sequence[object] = (),
) -> dict[str, Any]:
    """Build the population (``users``: 60, or 200 from 3,000 probes on), run ``probes`` probes
    over every read path, forget about a tenth of the people, and probe again (a fifth as many,
    plus a sweep of every forgotten token through the paths that could still hold it)."""
    if users is None:
        users = 200 if probes >= 3000 else 60
    return asyncio.run(_run(probes, seed, workdir, users, real_model, plugins))


async def _run(
    probes: int, seed: int, workdir: Path, users: int, real_model: bool, plugins: Sequence[object]
) -> dict[str, Any]:
    started = time.perf_counter()
    rng = random.Random(seed)
    corpus = build_corpus(rng, users)
    report = Report(real_model=real_model)
    clock = ManualClock(BASE_TS.replace(month=6))
    folder = workdir / "isolation"
    async with open_memory(folder, real_model=real_model, clock=clock, plugins=plugins) as mem:
        results = await mem.ingest_many(corpus.messages)
        trees = await _write_with_tools(mem, corpus, rng)
        scenes = [
            (int(i), Owner(str(t), str(u), str(c)))
            for i, t, u, c in sql(
                folder, "SELECT id, tenant, user_id, chat_id FROM memories WHERE kind = 'scene'"
            )
        ]
        report.population = {
            "users": users,
            "people": len(corpus.people),
            "tenants": len(corpus.tenants),
            "chats": len(corpus.members),
            "group_chats": sum(1 for _, c in corpus.members if c.startswith("g")),
            "messages": len(corpus.messages),
            "stored": sum(r.stored for r in results),
            "scenes": len(scenes),
            "facts": sql(folder, "SELECT COUNT(*) FROM graph_edges")[0][0],
            "tokens": len(corpus.owners),
        }
        runner = _Runner(mem, corpus, trees, scenes, report)
        for _ in range(probes):
            await runner.run(_draw(rng, corpus, trees, scenes), forgotten=set())
        forgotten = _pick_forgotten(rng, corpus)
        for tenant, user in sorted(forgotten):
            await mem.forget(user_id=user, tenant=tenant)
        report.counts["forgotten_people"] = len(forgotten)
        gone = {t for t, o in corpus.owners.items() if (o.tenant, o.user_id) in forgotten}
        runner.scenes = [(i, o) for i, o in scenes if (o.tenant, o.user_id) not in forgotten]
        after = [_draw(rng, corpus, trees, runner.scenes) for _ in range(max(1, probes // 5))]
        after += _sweep(rng, corpus, forgotten)
        for probe in after:
            await runner.run(probe, forgotten=gone)
        report.counts["after_forget_probes"] = len(after)
    report.seconds = time.perf_counter() - started
    return report.as_dict()


# --- the population's tool data -----------------------------------------------------------------


async def _write_with_tools(mem: Memory, corpus: Corpus, rng: random.Random) -> dict[str, str]:
    """Hand-written scenes, personas and tasks for some people; one rtm tree per tenant. Returns
    the tree id of each tenant."""
    for tenant, user in corpus.people:
        chats = corpus.chats_of(tenant, user)
        if rng.random() < 0.5:
            chat = rng.choice([*chats, None])
            token = corpus.token_for(Owner(tenant, user, chat or DIRECT_CHAT), rng)
            corpus.spoken.add(token)
            args = {
                "action": "add",
                "user_id": user,
                "tenant": tenant,
                "event": f"I promised {token} to myself",
            }
            await mem.call_tool("soul_narrative", {**args, **({"chat_id": chat} if chat else {})})
        if rng.random() < 0.4:
            chat = rng.choice([*chats, None])
            token = corpus.token_for(Owner(tenant, user, chat or DIRECT_CHAT), rng)
            args = {"user_id": user, "tenant": tenant, "description": f"a coach who knows {token}"}
            await mem.call_tool("persona_set", {**args, **({"chat_id": chat} if chat else {})})
        if rng.random() < 0.4:
            chat = rng.choice(chats)
            token = corpus.token_for(Owner(tenant, user, chat), rng)
            await mem.call_tool(
                "task_create",
                {
                    "user_id": user,
                    "chat_id": chat,
                    "tenant": tenant,
                    "task_id": f"t-{token}",
                    "description": f"book the {token} trip",
                    "info_nodes": [token],
                },
            )
    trees = {}
    for tenant in corpus.tenants:
        owner = Owner(tenant, TREE, TREE)
        lines = [f"The {corpus.token_for(owner, rng)} story begins at the harbour." for _ in range(6)]
        out = await mem.call_tool(
            "rtm_create_narrative_tree", {"text": " ".join(lines), "title": "harbour", "tenant": tenant}
        )
        trees[tenant] = str(out["treeId"])
    return trees


def _pick_forgotten(rng: random.Random, corpus: Corpus) -> set[tuple[str, str]]:
    in_groups = sorted(
        {(t, u) for (t, c), members in corpus.members.items() if c.startswith("g") for u in members}
    )
    return set(rng.sample(in_groups, max(2, len(corpus.people) // 10)))


# --- drawing probes ------------------------------------------------------------------------------


def _draw(
    rng: random.Random, corpus: Corpus, trees: dict[str, str], scenes: list[tuple[int, Owner]]
) -> Probe:
    path = rng.choice(PATHS)
    tenant, user = rng.choice(corpus.people)
    chats = corpus.chats_of(tenant, user)
    chat = rng.choice(chats)
    if path in ("recall chat", "context chat"):
        scope: ScopeKey = (tenant, None, chat)
    elif path in ("recall user", "context user", "summary"):
        scope = (tenant, user, None)
    elif path in ("recall user+chat", "context user+chat"):
        if rng.random() < 0.15:  # a chat the user is not in: nothing of anyone there may come back
            chat = rng.choice([c for t, c in corpus.members if t == tenant])
        scope = (tenant, user, chat)
    elif path in ("turn_context", "task_query"):
        scope = (tenant, user, chat)
    elif path.startswith("rtm_"):
        scope = (tenant, None, None)
    else:
        scope = (tenant, user, chat if rng.random() < 0.5 else None)
    query, own = _question(rng, corpus, scope)
    extra: dict[str, Any] = {}
    if path == "soul_narrative get" and not scenes:
        path = "soul_narrative list"
    if path == "soul_narrative get":
        own_scenes = [i for i, o in scenes if _visible(o, scope)]
        pool = own_scenes if own_scenes and rng.random() < 0.3 else [i for i, _ in scenes]
        extra["id"] = rng.choice(pool)
    if path.startswith("rtm_"):
        extra["treeId"] = trees[rng.choice(sorted(trees))]
    return Probe(path, scope, query, own, extra)


def _question(rng: random.Random, corpus: Corpus, scope: ScopeKey) -> tuple[str, str | None]:
    """Another owner's token (a neighbour's, most of the time), the scope's own token, another
    owner's whole message, or a mix."""
    own_tokens = [t for t in corpus.spoken if _visible(corpus.owners[t], scope)]
    own_tokens.sort()
    foreign = _neighbours(corpus, scope)
    roll = rng.random()
    if roll < 0.2 and own_tokens:
        token = rng.choice(own_tokens)
        return f"what about {token}?", token
    if roll < 0.6 and foreign:
        return rng.choice(foreign), None
    if roll < 0.8:
        texts = [m.text for m in corpus.messages if not _visible(_owner_of(m), scope)]
        return rng.choice(texts), None
    token = rng.choice(own_tokens) if own_tokens else "coffee"
    return f"I decided about {rng.choice(foreign or ['rain'])} and {token}", None


def _neighbours(corpus: Corpus, scope: ScopeKey) -> list[str]:
    """Tokens the scope may not see but that live closest to it: co-members of its chats, the same
    user id or chat id in other tenants, the members' other chats."""
    tenant, user, chat = scope
    near: list[str] = []
    for token, owner in corpus.owners.items():
        if _visible(owner, scope):
            continue
        same_user = user is not None and owner.user_id == user
        same_chat = chat is not None and owner.chat_id == chat
        co_member = owner.tenant == tenant and (
            (user is not None and user in corpus.members.get((tenant, owner.chat_id), []))
            or (chat is not None and owner.user_id in corpus.members.get((tenant, chat), []))
        )
        if same_user or same_chat or co_member:
            near.append(token)
    return near


def _owner_of(message: Any) -> Owner:
    return Owner(message.tenant, message.user_id, message.chat_id)


def _visible(owner: Owner, scope: ScopeKey) -> bool:
    tenant, user, chat = scope
    return owner.tenant == tenant and user in (None, owner.user_id) and chat in (None, owner.chat_id)


def _sweep(rng: random.Random, corpus: Corpus, forgotten: set[tuple[str, str]]) -> list[Probe]:
    """Every forgotten person's tokens asked of the scopes that saw them: the person, their chats,
    their co-members (user and turn context), and the same user id in other tenants."""
    probes = []
    for tenant, user in sorted(forgotten):
        tokens = [t for t, o in corpus.owners.items() if (o.tenant, o.user_id) == (tenant, user)]
        query = " ".join(tokens[:10])
        probes.append(Probe("recall user", (tenant, user, None), query))
        probes.append(Probe("summary", (tenant, user, None), query))
        probes.append(Probe("memory_recall", (tenant, user, None), query))
        probes.append(Probe("soul_narrative list", (tenant, user, None), query))
        probes.append(Probe("persona_get", (tenant, user, None), query))
        for other in corpus.tenants:
            if other != tenant and (other, user) in corpus.people:
                probes.append(Probe("recall user", (other, user, None), query))
        for chat in corpus.chats_of(tenant, user):
            probes.append(Probe("recall chat", (tenant, None, chat), query))
            probes.append(Probe("context chat", (tenant, None, chat), query))
            members = [m for m in corpus.members[(tenant, chat)] if m != user]
            for member in rng.sample(members, min(2, len(members))):
                probes.append(Probe("turn_context", (tenant, member, chat), query))
                probes.append(Probe("recall user", (tenant, member, None), query))
                probes.append(Probe("summary", (tenant, member, None), query))
                probes.append(Probe("soul_narrative search", (tenant, member, chat), query))
                probes.append(Probe("soul_narrative list", (tenant, member, None), query))
    return probes


# --- running probes -------------------------------------------------------------------------------


@dataclass
class _Runner:
    mem: Memory
    corpus: Corpus
    trees: dict[str, str]
    scenes: list[tuple[int, Owner]]
    report: Report

    async def run(self, probe: Probe, *, forgotten: set[str]) -> None:
        report = self.report
        report.counts["probes"] += 1
        report.by_path[probe.path] += 1
        try:
            answer = await self._call(probe)
        except NarrmemError as exc:
            report.refused[probe.path] += 1
            answer = exc
        except Exception as exc:  # a read path that crashes is a failure of its own
            report.counts["unexpected_errors"] += 1
            report.error_examples.append(f"{probe.path} {probe.scope}: {type(exc).__name__}: {exc}")
            return
        checks = [(to_json(answer), probe.scope)]
        if probe.path == "turn_context" and isinstance(answer, dict):
            # The facts and persona are the user's (every chat); the memories only this chat's.
            tenant, user, _ = probe.scope
            checks = [(to_json(answer["memories"]), probe.scope), (to_json(answer), (tenant, user, None))]
        extra_scopes: list[ScopeKey] = []
        if probe.path == "persona_get":
            extra_scopes.append((probe.scope[0], probe.scope[1], DIRECT_CHAT))
        found_foreign = 0
        seen_own = False
        for text, scope in checks:
            for token in tokens_in(text, self.corpus.owners):
                owner = self.corpus.owners[token]
                if token in forgotten:
                    report.counts["forgotten_found"] += 1
                    report.forgotten_examples.append(self._example(probe, token, owner, text))
                    continue
                if _visible(owner, scope) or any(_visible(owner, s) for s in extra_scopes):
                    seen_own = True
                    continue
                found_foreign += 1
                report.examples.append(self._example(probe, token, owner, text))
        report.counts["answers_with_own_tokens"] += seen_own
        if found_foreign:
            report.counts["foreign_probes"] += 1
            report.counts["foreign_tokens"] += found_foreign
            report.foreign_by_path[probe.path] += found_foreign
        if probe.own is not None and probe.path in FINDING_PATHS and not forgotten:
            report.counts["own_asked"] += 1
            report.counts["own_found"] += probe.own in checks[0][0]

    def _example(self, probe: Probe, token: str, owner: Owner, text: str) -> dict[str, Any]:
        return {
            "path": probe.path,
            "scope": list(probe.scope),
            "query": probe.query[:120],
            "token": token,
            "owner": [owner.tenant, owner.user_id, owner.chat_id],
            "excerpt": excerpt(text, token),
        }

    async def _call(self, probe: Probe) -> Any:
        tenant, user, chat = probe.scope
        mem = self.mem
        path = probe.path
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "recall": lambda: mem.recall(probe.query, user_id=user, chat_id=chat, tenant=tenant, k=10),
            "context": lambda: mem.context(probe.query, user_id=user, chat_id=chat, tenant=tenant, k=10),
        }
        kind = path.split(" ")[0]
        if kind in calls:
            result = await calls[kind]()
            if kind == "context":
                return {"hits": result.hits, "rendered": result.render()}
            return result
        scoped = {"tenant": tenant, "user_id": user, **({"chat_id": chat} if chat else {})}
        if path == "turn_context":
            assert user is not None and chat is not None
            return await mem.turn_context(probe.query, user_id=user, chat_id=chat, tenant=tenant)
        if path == "summary":
            assert user is not None
            return await mem.summary(user_id=user, tenant=tenant)
        if path == "narrmem_recall":
            return await mem.call_tool("narrmem_recall", {**scoped, "query": probe.query, "k": 10})
        if path == "soul_narrative search":
            return await mem.call_tool("soul_narrative", {**scoped, "action": "search", "query": probe.query})
        if path == "soul_narrative list":
            return await mem.call_tool("soul_narrative", {**scoped, "action": "list", "k": 50})
        if path == "soul_narrative get":
            return await mem.call_tool("soul_narrative", {**scoped, "action": "get", "id": probe.extra["id"]})
        if path == "memory_recall":
            intent = ",".join(tokens_in(probe.query, self.corpus.owners)[:8]) or probe.query[:200]
            return await mem.call_tool("memory_recall", {**scoped, "query_intent": intent, "limit": 50})
        if path == "memory_purge dry_run":
            tokens = tokens_in(probe.query, self.corpus.owners) or ["the"]
            filters = {"object_contains": tokens[0]}
            return await mem.call_tool("memory_purge", {**scoped, "filters": filters, "dry_run": True})
        if path == "persona_get":
            return await mem.call_tool("persona_get", scoped)
        if path == "task_query":
            return await mem.call_tool("task_query", scoped)
        if path == "rtm_traverse_narrative":
            args = {"tenant": tenant, "treeId": probe.extra["treeId"], "traversalDepth": 2}
            return await mem.call_tool("rtm_traverse_narrative", args)
        if path == "rtm_find_optimal_depth":
            args = {"tenant": tenant, "treeId": probe.extra["treeId"], "targetRecallLength": 3}
            return await mem.call_tool("rtm_find_optimal_depth", args)
        raise AssertionError(f"no probe for path {path}")
