"""A narrative tree over one user's memories: a retelling of who they are, at any depth or budget.

Each memory is one clause, oldest first (scenes by their core sentence, episodes as attributed
speech; an episode a scene was made from is left out, the scene says it better). The tree is
semantic, built lazily and cached per (tenant, user) under a fingerprint of the memories it tells
(their ids and texts): a new, edited or forgotten memory rebuilds it on the next call, whichever
worker wrote it. Forgetting in this process also drops it at once. The cache keeps the trees of the
``user_summaries_kept`` users asked most recently: a bot whose users each ask once keeps no more.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from narrmem_plugins.rtm.build import build_tree
from narrmem_plugins.rtm.options import RTMOptions
from narrmem_plugins.rtm.segment import detect_language, joiner
from narrmem_plugins.rtm.summarize import Summarizer
from narrmem_plugins.rtm.theory import suggest_parameters
from narrmem_plugins.rtm.traverse import (
    compression,
    depth_for_budget,
    recall_sequence,
    recall_units,
)
from narrmem_plugins.rtm.tree import Tree
from pydantic import ValidationError

from narrmem.errors import InputError
from narrmem.models import MemoryRecord, Scope
from narrmem.text import estimate_tokens
from narrmem.view import MemoryView

_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class _Cached:
    fingerprint: int
    newest_id: int
    records: list[MemoryRecord]
    tree: Tree


class UserSummaries:
    def __init__(self) -> None:
        # Least recently asked first; bounded in ``_keep``.
        self._cache: OrderedDict[tuple[str, str], _Cached] = OrderedDict()

    def clear(self) -> None:
        self._cache.clear()

    def forget_chat(self, tenant: str, chat_id: str) -> None:
        """Drop the cached trees that tell a memory of ``chat_id`` (another worker deleted some of
        its messages: the others' retellings stay, checked against the store when asked)."""
        for key in list(self._cache):
            if key[0] == tenant and any(r.chat_id == chat_id for r in self._cache[key].records):
                del self._cache[key]

    def forget(self, tenant: str, user_id: str | None) -> None:
        """Drop cached trees a forget may have touched (a chat forget touches every user in it)."""
        for key in list(self._cache):
            if key[0] == tenant and (user_id is None or key[1] == user_id):
                del self._cache[key]

    async def summary(
        self,
        memory: MemoryView,
        options: RTMOptions,
        summarizer: Summarizer | None,
        *,
        user_id: str,
        depth: int | None = None,
        token_budget: int | None = None,
        tenant: str = "default",
    ) -> dict[str, Any]:
        try:
            scope = Scope(tenant=tenant, user_id=user_id)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        if depth is not None and depth < 1:
            raise InputError("depth must be at least 1", field="depth")
        if token_budget is not None and token_budget < 1:
            raise InputError("token_budget must be at least 1", field="token_budget")
        cached = await self._tree(memory, options, summarizer, scope)
        if cached is None:
            return _empty(tenant, user_id)
        tree = cached.tree
        records = cached.records
        chosen = _choose_depth(tree, depth, token_budget, options)
        text = _dated_retelling(tree, chosen, records)
        budget = options.user_token_budget if token_budget is None and depth is None else token_budget
        # The dates cost a few tokens a unit: a shallower telling when they take it past the budget.
        while budget is not None and chosen > 1 and estimate_tokens(text) > budget:
            chosen -= 1
            text = _dated_retelling(tree, chosen, records)
        units = recall_units(tree.shape, chosen).tolist()
        return {
            "tenant": tenant,
            "user_id": user_id,
            "memoryCount": len(records),
            "newestMemoryId": cached.newest_id,
            "depth": chosen,
            "maxDepth": tree.max_depth,
            "retelling": text,
            "tokens": estimate_tokens(text),
            "fits": token_budget is None or estimate_tokens(text) <= token_budget,
            **compression(tree, chosen),
            "recallSequence": recall_sequence(tree, chosen),
            "units": [
                {
                    "text": tree.summaries[i],
                    "memories": int(tree.shape.end[i] - tree.shape.start[i]),
                    "from": records[int(tree.shape.start[i])].created_at.isoformat(),
                    "to": records[int(tree.shape.end[i]) - 1].created_at.isoformat(),
                }
                for i in units
            ],
        }

    async def _tree(
        self, memory: MemoryView, options: RTMOptions, summarizer: Summarizer | None, scope: Scope
    ) -> _Cached | None:
        key = (scope.tenant, str(scope.user_id))
        # Read every time: another worker may have added, edited or forgotten one of them (a cache
        # kept under the newest id alone would go on telling what was forgotten there).
        kinds = list(options.user_kinds)
        recent = await memory.store.recent(scope, kinds=kinds, limit=options.user_memory_limit)
        records = _distinct(list(reversed(recent)))
        if not records:
            self._cache.pop(key, None)
            return None
        fingerprint = hash(tuple((r.id, r.index_text) for r in records))
        cached = self._cache.get(key)
        if cached is not None and cached.fingerprint == fingerprint:
            self._cache.move_to_end(key)
            return cached
        clauses = [clause_of(r) for r in records]
        branching, max_depth = suggest_parameters(len(clauses), options.compression)
        tree = await build_tree(
            memory,
            clauses,
            detect_language(" ".join(clauses)),
            branching=branching,
            max_depth=max_depth,
            partition="semantic",
            seed=None,
            options=options,
            summarizer=summarizer,
        )
        cached = _Cached(fingerprint, int(recent[0].id or 0), records, tree)
        self._keep(key, cached, options.user_summaries_kept)
        return cached

    def _keep(self, key: tuple[str, str], cached: _Cached, capacity: int) -> None:
        self._cache.pop(key, None)
        self._cache[key] = cached
        while len(self._cache) > capacity:
            self._cache.popitem(last=False)

    def cached_users(self) -> list[tuple[str, str]]:
        """The (tenant, user) pairs whose tree is in memory, least recently asked first."""
        return list(self._cache)


def clause_of(record: MemoryRecord) -> str:
    """One line per memory: a scene's core sentence, an episode as attributed speech."""
    return _SPACES.sub(" ", record.index_text).strip() or record.text.strip()


def _distinct(records: list[MemoryRecord]) -> list[MemoryRecord]:
    """Leave out episodes whose messages a scene already tells."""
    told = [set(r.message_ids) for r in records if r.kind == "scene" and r.message_ids]
    return [
        r
        for r in records
        if r.kind == "scene" or not r.message_ids or not any(set(r.message_ids) <= s for s in told)
    ]


def _dated_retelling(tree: Tree, depth: int, records: list[MemoryRecord]) -> str:
    """The retelling at ``depth``, each unit with the days of the memories it tells ("[2026-01-05]",
    "[2026-01 – 2026-06]"), and the newest memory after it when the last unit's summary does not
    tell it ("Latest: [2026-09-12] …"): undated and without it, a life told in the present ("I
    live in Lisbon… I work at Banco Azul") read as the present months after a move and a new job."""
    parts = []
    units = recall_units(tree.shape, depth).tolist()
    for i in units:
        first = records[int(tree.shape.start[i])].created_at
        last = records[int(tree.shape.end[i]) - 1].created_at
        if first.date() == last.date():
            when = f"{first:%Y-%m-%d}"
        elif (first.year, first.month) == (last.year, last.month):
            when = f"{first:%Y-%m}"
        else:
            when = f"{first:%Y-%m} – {last:%Y-%m}"
        parts.append(f"[{when}] {tree.summaries[i]}")
    newest = len(records) - 1
    final = units[-1] if units else None
    if final is not None and tree.clauses[newest].casefold() not in tree.summaries[final].casefold():
        latest = "最近：" if tree.language == "zh" else "Latest: "
        parts.append(f"{latest}[{records[newest].created_at:%Y-%m-%d}] {tree.clauses[newest]}")
    return str(joiner(tree.language).join(parts))


def _choose_depth(tree: Tree, depth: int | None, token_budget: int | None, options: RTMOptions) -> int:
    """``depth`` if given (capped at the tree's), ``token_budget`` if given (the deepest that fits),
    both: the shallower; neither: the deepest that fits the options' default budget."""
    if token_budget is None and depth is None:
        return int(depth_for_budget(tree, options.user_token_budget))
    chosen = tree.max_depth if depth is None else min(depth, tree.max_depth)
    if token_budget is not None:
        chosen = min(chosen, depth_for_budget(tree, token_budget))
    return int(chosen)


def _empty(tenant: str, user_id: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "user_id": user_id,
        "memoryCount": 0,
        "newestMemoryId": None,
        "depth": 0,
        "maxDepth": 0,
        "retelling": "",
        "tokens": 0,
        "fits": True,
        "compressionRatio": 0.0,
        "tokenCompressionRatio": 0.0,
        "recallSequence": [],
        "units": [],
    }
