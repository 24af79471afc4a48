"""Node summaries. A leaf says its own clause(s); an internal node says what its span is about.

Who writes an internal node's summary, first answer wins:

1. the ``summarizer`` callable the plugin was built with (``RTMPlugin(summarizer=...)``);
2. the ``narrmem_summarize`` hook (firstresult), when the host declares it, so an LLM plugin can
   write abstractive summaries;
3. the built-in extractive summary: the span's most central clauses (embedding centrality, chosen
   to cover the span rather than restate one theme) that fit the token budget, in narrative order,
   in the text's own language (:func:`extractive`).

Identical spans share one summary (a random tree can give a node a single child with the same
span), so a paid summarizer is asked once per span.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable

import numpy as np
from narrmem_plugins.rtm.segment import joiner
from narrmem_plugins.rtm.tree import Shape

from narrmem.text import cjk_count, estimate_tokens
from narrmem.view import MemoryView

Summarizer = Callable[[list[str], str], Awaitable[str | None] | str | None]
HOOK = "narrmem_summarize"
ELLIPSIS = "…"
_LEADING_CONJUNCTION = re.compile(r"^(?:and|but|or|so|yet|nor|for)\s+(?=\w)", re.IGNORECASE)
_EN_TRAILING = re.compile(r"\s*[,;:—–-]+$")
_ZH_TRAILING = re.compile(r"[，；：、—]+$")


def hook_available(memory: MemoryView) -> bool:
    """Whether the host declares ``narrmem_summarize`` and some plugin implements it."""
    hook = getattr(memory.host.pm.hook, HOOK, None)
    return hook is not None and bool(hook.get_hookimpls())


def summarizer_label(memory: MemoryView, custom: Summarizer | None) -> str:
    """Names who writes summaries; part of a tree's identity, so switching summarizer rebuilds."""
    if custom is not None:
        return f"custom:{getattr(custom, '__qualname__', type(custom).__name__)}"
    if memory is not None and hook_available(memory):
        names = sorted(impl.plugin_name for impl in getattr(memory.host.pm.hook, HOOK).get_hookimpls())
        return "hook:" + ",".join(names)
    return "extractive"


async def summarize_shape(
    shape: Shape,
    clauses: list[str],
    unit: np.ndarray,
    prefix: np.ndarray,
    language: str,
    *,
    max_tokens: int,
    max_clauses: int,
    memory: MemoryView | None = None,
    custom: Summarizer | None = None,
) -> list[str]:
    """One summary per node, pre-order. ``unit`` are the unit clause vectors, ``prefix`` their
    cumulative sums (see :func:`narrmem_plugins.rtm.tree.prefix_sums`)."""
    glue = joiner(language)
    use_hook = memory is not None and hook_available(memory)
    leaf = shape.is_leaf
    done: dict[tuple[int, int, bool], str] = {}
    out: list[str] = []
    for i, (s, e) in enumerate(zip(shape.start.tolist(), shape.end.tolist(), strict=True)):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # thousands of nodes: other calls on the loop take turns
        # Keyed by leafness too: a random tree's chain can end in a depth-D leaf with the span of
        # the internal node above it, and that leaf must still hold its whole span.
        key = (s, e, bool(leaf[i]))
        if key in done:
            out.append(done[key])
            continue
        span = clauses[s:e]
        if e - s == 1 or leaf[i]:
            # A leaf-level node at depth D holds its span: at the deepest level the retelling
            # is the whole text, which is what a compression ratio of 1.0 promises.
            text = glue.join(span)
        else:
            gist = await _abstractive(span, language, memory, custom, use_hook)
            text = gist or ""
            if not text:
                text = extractive(span, unit[s:e], prefix[e] - prefix[s], language, max_tokens, max_clauses)
        done[key] = text
        out.append(text)
    return out


async def _abstractive(
    span: list[str], language: str, memory: MemoryView | None, custom: Summarizer | None, use_hook: bool
) -> str | None:
    if custom is not None:
        value = custom(list(span), language)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, str) and value.strip():
            return value.strip()
    if use_hook and memory is not None:
        value = await memory.host.call_first(HOOK, memory=memory, clauses=list(span), language=language)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


YIELD_EVERY = 64  # nodes summarised between two turns of the event loop
CANDIDATES = 64  # clauses of a long span considered for its summary (the nearest to its centroid)


def extractive(
    span: list[str],
    vectors: np.ndarray,
    centroid: np.ndarray,
    language: str,
    max_tokens: int,
    max_clauses: int,
) -> str:
    """The span's most central clauses that fit ``max_tokens`` (at most ``max_clauses``), in
    narrative order: a gist of the span, not its opening.

    Centrality is embedding centrality: how much of the span a clause stands for, the sum of its
    positive cosine similarities to the other clauses of the span. Clauses are chosen greedily by how
    much of the rest of the span they cover that the chosen ones do not yet (the coverage objective of
    extractive summarisation: ``sum_j max_i∈chosen sim(j, i)``), so a second clause adds a second theme
    instead of restating the first, and an outlier, which covers only itself, is never chosen; only
    whole clauses that still fit the budget are candidates. Only when no clause fits is the most
    central one cut at a word boundary. Long spans are judged on the
    :data:`CANDIDATES` clauses nearest their centroid, so the cost stays linear in the span.
    """
    glue = joiner(language)
    near = np.argsort(-(vectors @ centroid), kind="stable")[:CANDIDATES]
    sims = np.clip(vectors @ vectors[near].T, 0.0, None)  # (span, candidates)
    # A clause's gain is what it says of the *other* clauses: an outlier covers only itself.
    others = sims.copy()
    others[near, np.arange(len(near))] = 0.0
    covered = np.zeros(len(span))
    picked: list[int] = []
    while len(picked) < max_clauses:
        gains = np.maximum(others - covered[:, None], 0.0).sum(axis=0)
        best = None
        for c in np.argsort(-gains, kind="stable").tolist():
            index = int(near[c])
            if index in picked or (gains[c] <= 0 and picked):
                continue
            if estimate_tokens(glue.join(span[i] for i in sorted([*picked, index]))) <= max_tokens:
                best = c
                break
        if best is None:
            break
        picked.append(int(near[best]))
        covered = np.maximum(covered, sims[:, best])
    chosen = sorted(picked) or [int(near[0])]
    text = glue.join(tidy(span[i], language) for i in chosen)
    return clip(text, max_tokens)


def tidy(clause: str, language: str) -> str:
    """A clause made to stand alone: no leading conjunction, a capital, a full stop instead of the
    comma, semicolon or dash that tied it to its neighbour."""
    if language == "zh":
        return _ZH_TRAILING.sub("。", clause)
    text = _LEADING_CONJUNCTION.sub("", clause)
    text = _EN_TRAILING.sub(".", text)
    return text[:1].upper() + text[1:] if text else clause


def clip(text: str, max_tokens: int) -> str:
    """``text`` cut to about ``max_tokens`` estimated tokens, at a word boundary where there is one."""
    if estimate_tokens(text) <= max_tokens:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # longest prefix (plus the ellipsis) that fits
        mid = (lo + hi + 1) // 2
        if estimate_tokens(text[:mid] + ELLIPSIS) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    cut = text[:lo]
    if lo < len(text) and not cjk_count(text[lo - 1 : lo + 1]) and " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:—-，；：") + ELLIPSIS
