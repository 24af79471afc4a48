"""From text to a stored tree: segment, embed once, shape, summarise, store; or find it stored.

A tree's id is ``rtm_`` + 12 hex digits of a sha256 over everything that decides the tree: the
tenant, the user and chat whose words it holds (when named), the title, the text, K, D (or
"suggested"), the partition model and seed, the language and segmentation modes, who writes
summaries, the embedder and the summary options. The id is known before any work is done, so asking
for a tree that exists costs one indexed read.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal

import numpy as np
from narrmem_plugins.rtm.options import RTMOptions
from narrmem_plugins.rtm.segment import Language, Mode, segment_cached
from narrmem_plugins.rtm.store import StoredTree, TreeStore
from narrmem_plugins.rtm.summarize import Summarizer, summarize_shape, summarizer_label
from narrmem_plugins.rtm.theory import expected_recall_lengths, suggest_parameters
from narrmem_plugins.rtm.traverse import balanced_recall_lengths, tree_stats
from narrmem_plugins.rtm.tree import FORMAT_VERSION, Partition, Tree, build_shape, prefix_sums, unit_rows

from narrmem.errors import InputError
from narrmem.view import MemoryView

DEFAULT_SEED = 0  # the random model without a seed still builds the same tree every time
# What of a tree's identity its row keeps in columns of their own, not in its parameters.
STORED_APART = ("tenant", "title", "textSha", "userId", "chatId")


@dataclass(frozen=True)
class TreeRequest:
    """What a caller asked for; ``None`` means "the default" (resolved from the options or the text)."""

    text: str
    title: str
    tenant: str = "default"
    user_id: str | None = None
    chat_id: str | None = None
    type: str = "story"
    branching: int | None = None
    max_depth: int | None = None
    partition: Partition | None = None
    seed: int | None = None
    language: Language | Literal["auto"] = "auto"
    segmentation: Mode = "auto"

    @property
    def pinned(self) -> bool:
        """Whether any tree parameter was given (otherwise the newest tree of this text will do)."""
        given = (self.branching, self.max_depth, self.partition, self.seed)
        return any(v is not None for v in given) or (self.language, self.segmentation) != ("auto", "auto")


def text_sha(text: str) -> str:
    normalized = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    return hashlib.sha256(normalized.encode()).hexdigest()


def identity(request: TreeRequest, options: RTMOptions, summarizer: str, embedder: str) -> dict[str, Any]:
    """Everything that decides the tree, with defaults resolved as far as they can be without the text."""
    partition = request.partition or "semantic"
    # Whose words: the same text of two people is two trees, each going with its own forget. Left
    # out when not named, so that the trees that name no one keep the ids they had before.
    owner = {
        key: value
        for key, value in (("userId", request.user_id), ("chatId", request.chat_id))
        if value is not None
    }
    return {
        **owner,
        "format": FORMAT_VERSION,
        "tenant": request.tenant,
        "title": request.title,
        "textSha": text_sha(request.text),
        "maxBranchingFactor": request.branching or options.branching,
        "maxRecallDepth": request.max_depth or "suggested",
        "partition": partition,
        "seed": (DEFAULT_SEED if request.seed is None else request.seed) if partition == "random" else None,
        "language": request.language,
        "segmentation": request.segmentation,
        "summarizer": summarizer,
        "embedder": embedder,
        "summaryTokens": options.summary_tokens,
        "summaryClauses": options.summary_clauses,
        "balance": options.balance,
    }


def tree_id(ident: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return "rtm_" + digest[:12]


async def get_or_build(
    memory: MemoryView,
    trees: TreeStore,
    request: TreeRequest,
    options: RTMOptions,
    summarizer: Summarizer | None = None,
) -> tuple[StoredTree, bool]:
    """The stored tree for ``request`` (``False``) or a new one, stored (``True``)."""
    label = summarizer_label(memory, summarizer)
    ident = identity(request, options, label, memory.embedder.name)
    tid = tree_id(ident)
    found = await trees.get(request.tenant, tid)
    if found is not None:
        return found, False
    # Seconds of work for a long text: off the event loop, which other users' calls share.
    sections = await asyncio.to_thread(segment_cached, request.text, request.language, request.segmentation)
    if not sections.clauses:
        raise InputError("the text holds no clause (no letter or digit)", field="text")
    if len(sections.clauses) > options.max_clauses:
        raise InputError(
            f"the text has {len(sections.clauses)} clauses; at most {options.max_clauses} fit a tree",
            field="text",
        )
    k = int(ident["maxBranchingFactor"])
    depth = request.max_depth or suggest_parameters(len(sections.clauses), 1 / k)[1]
    params = {
        **{key: value for key, value in ident.items() if key not in STORED_APART},
        "maxRecallDepth": depth,
        "depthSuggested": request.max_depth is None,
        "type": request.type,
        "clauseCount": len(sections.clauses),
        "detectedLanguage": sections.language,
        "segmentationUsed": sections.mode,
    }
    tree = await build_tree(
        memory,
        list(sections.clauses),
        sections.language,
        branching=k,
        max_depth=depth,
        partition=ident["partition"],
        seed=ident["seed"],
        options=options,
        summarizer=summarizer,
    )
    tree.params = params
    row = StoredTree(
        tree_id=tid,
        tenant=request.tenant,
        title=request.title,
        text_sha=ident["textSha"],
        params=params,
        tree=tree,
        created_at=memory.clock.now().astimezone(UTC).isoformat(),
        user_id=request.user_id,
        chat_id=request.chat_id,
    )
    written = await trees.put(row)
    if not written:  # built concurrently by another call: keep the one stored first
        stored = await trees.get(request.tenant, tid)
        if stored is not None:
            return stored, False
    return row, True


async def build_tree(
    memory: MemoryView,
    clauses: list[str],
    language: str,
    *,
    branching: int,
    max_depth: int,
    partition: Partition,
    seed: int | None,
    options: RTMOptions,
    summarizer: Summarizer | None = None,
) -> Tree:
    """Embed the clauses once, shape the tree, summarise every node."""
    unit = unit_rows(await memory.embedder.embed(clauses))
    prefix = prefix_sums(unit)
    rng = np.random.default_rng(DEFAULT_SEED if seed is None else seed) if partition == "random" else None
    shape = await asyncio.to_thread(
        functools.partial(
            build_shape,
            len(clauses),
            branching,
            max_depth,
            partition,
            rng=rng,
            prefix=prefix,
            balance=options.balance,
        )
    )
    summaries = await summarize_shape(
        shape,
        clauses,
        unit,
        prefix,
        language,
        max_tokens=options.summary_tokens,
        max_clauses=options.summary_clauses,
        memory=memory,
        custom=summarizer,
    )
    return Tree(
        clauses=clauses,
        language=language,
        shape=shape,
        summaries=summaries,
        params={"maxBranchingFactor": branching, "maxRecallDepth": max_depth, "partition": partition},
    )


def stats_of(tree: Tree) -> dict[str, Any]:
    """:func:`tree_stats` with the right reference for the scale check: the theory for random
    trees, an evenly split tree for semantic ones."""
    k = int(tree.params.get("maxBranchingFactor", 4))
    depth = tree.max_depth
    if tree.params.get("partition") == "random":
        reference: list[float] = expected_recall_lengths(len(tree.clauses), k, depth)
    else:
        reference = [float(x) for x in balanced_recall_lengths(len(tree.clauses), k, depth)]
    return dict(tree_stats(tree, reference))
