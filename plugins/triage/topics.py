"""What a message is about, in words: its content words without the chat's noise (function words,
greetings and thanks, the bot's own name, media placeholders, time words, chat fillers), for topic
counts and their labels.

Two English mentions are one topic only when they share a content word (by a light stem:
"apartments" and "apartment", "running" and "run"): two messages that both start with "hey Nori"
are alike to an embedding model, but they are not about the same thing. Chinese keeps its own rule
(two shared content bigrams), see ``counters.py``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from narrmem_plugins.triage.ignore_rules import without_media

from narrmem.text import STOPWORDS, keyword_terms

NOISE = frozenset(
    """hey hi hello hiya yo sup morning evening night afternoon good great nice thanks thank thx ty
    bye cheers welcome lol lmao haha hahaha hehe omg wow yeah yep yes nope okay ok sure cool
    please sorry oops ugh hmm yay
    photo picture image video voice message sticker attachment gif file audio media omitted
    today tonight yesterday tomorrow week weekend month year day days time times now later soon
    just really like know think get got gets getting going gonna wanna want also yeah one much
    still finally already again lot lots bit kinda pretty thing things stuff way something anything
    everything nothing did done doing make made makes take took went goes come came say said says tell
    told start started starts new first last next back well even maybe actually literally
    don didn isn wasn aren weren couldn wouldn shouldn hasn haven doesn won ain
    """.split()
)
_DOUBLE_END = re.compile(r"([b-df-hj-np-tv-z])\1$")


def stem(word: str) -> str:
    """A light English stem: "apartments" → "apartment", "running" → "run", "studies" → "study"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    for suffix in ("ing", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            return _DOUBLE_END.sub(r"\1", word)
    return word


def content_words(text: str, names: Iterable[str] = ()) -> list[str]:
    """The English content words of ``text`` in order (repeats kept), noise and ``names`` left out."""
    skip = NOISE | {n.lower() for n in names}
    return [
        term
        for term in keyword_terms(without_media(text))
        if len(term) > 2
        and term.isascii()
        and not term[0].isdigit()  # "14k", "6x800m", "2024": amounts, not topics
        and term not in STOPWORDS
        and term not in skip
    ]


def content_stems(text: str, names: Iterable[str] = ()) -> set[str]:
    return {stem(word) for word in content_words(text, names)}


def shares_words(a: str, b: str, names: Iterable[str] = ()) -> bool:
    """Whether two English messages share a content word (noise and names left out)."""
    return bool(content_stems(a, names) & content_stems(b, names))


def topic_words(
    texts: list[str], limit: int = 3, names: Iterable[str] = (), *, min_share: float = 0.0
) -> list[str]:
    """The words most of ``texts`` use, in their most common spelling: the ones in most texts
    first, then the more frequent, then the earlier; only words in at least ``min_share`` of the
    texts (the first word always)."""
    in_texts: Counter[str] = Counter()
    total: Counter[str] = Counter()
    spellings: dict[str, Counter[str]] = {}
    for text in texts:
        words = content_words(text, names)
        for word in words:
            total[stem(word)] += 1
            spellings.setdefault(stem(word), Counter())[word] += 1
        in_texts.update({stem(word) for word in words})
    order = list(spellings)
    ranked = sorted(order, key=lambda s: (-in_texts[s], -total[s], order.index(s)))
    kept = [s for i, s in enumerate(ranked) if i == 0 or in_texts[s] >= min_share * len(texts)]
    return [_spelling(spellings[s]) for s in kept[:limit]]


def _spelling(counts: Counter[str]) -> str:
    return min(counts, key=lambda word: (-counts[word], len(word), word))
