"""Long memories come back as their most relevant sentences, so recall pays for what answers the
query and not for the rest of a long message (the whole text stays in ``Hit.detail``)."""

from __future__ import annotations

from narrmem.text import character_end, estimate_tokens, keyword_terms, sentences

_FUNCTION_WORDS = frozenset(
    "a an the and or but of to in on at for with is are was were be been i you he she it we they my your "
    "what when where who how did do does that this".split()
)


def snippet(text: str, query: str, budget: int) -> str:
    """``text`` if it fits ``budget`` tokens; else its sentences that share most words with the
    query, in their original order, within the budget (a single long sentence is cut at a word)."""
    if estimate_tokens(text) <= budget:
        return text
    found = sentences(text)
    wanted = {t for t in keyword_terms(query) if t not in _FUNCTION_WORDS}
    overlap = [len(wanted & set(keyword_terms(s))) for s in found]
    ranked = sorted((i for i in range(len(found)) if overlap[i]), key=lambda i: (-overlap[i], i))
    if not ranked:  # nothing in common with the query: the opening is the best guess
        return _cut(text, budget)
    chosen: list[int] = []
    used = 0
    for i in ranked:
        cost = estimate_tokens(found[i])
        if used + cost <= budget:
            chosen.append(i)
            used += cost
    if not chosen:
        return _cut(found[ranked[0]], budget)
    parts = [found[i] for i in sorted(chosen)]
    return " … ".join(parts) if len(parts) < len(found) else " ".join(parts)


def _cut(sentence: str, budget: int) -> str:
    low, high = 1, len(sentence)
    while low < high:  # the longest prefix that fits, ending "…"
        middle = (low + high + 1) // 2
        if estimate_tokens(sentence[:middle] + "…") <= budget:
            low = middle
        else:
            high = middle - 1
    cut = sentence[: character_end(sentence, low)]
    if " " in cut.strip():  # do not split a word
        cut = cut[: cut.rstrip().rfind(" ")]
    return cut.rstrip() + "…"
