"""Small text helpers shared by triage, the keyword index and prompt budgeting."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

R = TypeVar("R")

# CJK Unified Ideographs (+ extension A), Hiragana/Katakana, Hangul syllables.
_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(rf"[^\W_{_CJK}]+", re.UNICODE)
_CJK_CHAR = re.compile(f"[{_CJK}]")
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+")  # what _WORD matches in ASCII text, found faster


# After . ! ? … followed by a space, or after a CJK full stop (no space follows it): "3.5" and
# "e.g.x" stay whole.
_SENTENCE_END = re.compile(r"(?<=[.!?。！？…])\s+|(?<=[。！？])")


def sentences(text: str) -> list[str]:
    """``text`` cut into its sentences, each stripped, empty ones left out."""
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def cjk_count(text: str) -> int:
    if text.isascii():  # most chat text: no scan needed
        return 0
    return len(_CJK_CHAR.findall(text))


def estimate_tokens(text: str) -> int:
    """A model-agnostic token estimate: one per CJK character, one per four other characters."""
    cjk = cjk_count(text)
    return cjk + math.ceil((len(text) - cjk) / 4)


def cjk_bigrams(run: str) -> list[str]:
    """Overlapping bigrams of a CJK run (a lone character stays a unigram).

    Chinese has no spaces, so a word index would see one giant token; bigrams are what
    Lucene's CJK analyzer does and match two-character words such as 摇滚, which a trigram
    index cannot.
    """
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def keyword_terms(text: str) -> list[str]:
    """Lower-cased word tokens plus CJK bigrams, in order."""
    if text.isascii():
        return _ASCII_WORD.findall(text.lower())
    terms: list[str] = []
    pos = 0
    for match in _CJK_RUN.finditer(text):
        terms.extend(w.lower() for w in _WORD.findall(text[pos : match.start()]))
        terms.extend(cjk_bigrams(match.group()))
        pos = match.end()
    terms.extend(w.lower() for w in _WORD.findall(text[pos:]))
    return terms


# English function words left out of keyword queries and topic words: they match nearly every
# memory and drown the words that carry meaning.
STOPWORDS = frozenset(
    """a an the and or but if then else of at by for with about against between into through during
    before after above below to from up down in out on off over under again further once here there
    when where why how all any both each few more most other some such no nor not only own same so than
    too very s t can will just don should now i me my myself we our ours ourselves you your yours
    yourself yourselves he him his himself she her hers herself it its itself they them their theirs
    themselves what which who whom this that these those am is are was were be been being have has had
    having do does did doing would could ought i'm you're he's she's it's we're they're i've you've
    we've they've i'd you'd he'd she'd we'd they'd i'll you'll he'll she'll we'll they'll isn't aren't
    wasn't weren't hasn't haven't hadn't doesn't don't didn't won't wouldn't shan't shouldn't can't
    cannot couldn't mustn't let's that's who's what's here's there's when's where's why's how's as
    until while also ever""".split()
)


def content_terms(text: str) -> list[str]:
    """The distinct keyword terms of ``text`` that carry meaning (no function words), in order."""
    seen: list[str] = []
    for term in keyword_terms(text):
        if term not in STOPWORDS and term not in seen:
            seen.append(term)
    return seen


def fts_document(text: str) -> str:
    """The text as it is written into the full-text index (CJK runs become bigrams)."""
    return " ".join(keyword_terms(text))


class ShortTextCache(Generic[R]):
    """``fn(text, *rest)`` with its results kept (least recently used first out, ``maxsize`` of
    them) for texts up to ``max_chars``; a longer text is worked out each time, since entries keyed
    by whole texts are bounded in number, not in size (16,384 of 16,000 characters held
    gigabytes). ``cache_clear`` drops every kept text (a forgotten one must not stay)."""

    def __init__(self, fn: Callable[..., R], *, max_chars: int, maxsize: int) -> None:
        self._fn = fn
        self._cached = functools.lru_cache(maxsize=maxsize)(fn)
        self.max_chars = max_chars
        functools.update_wrapper(self, fn)

    def __call__(self, text: str, *rest: Hashable) -> R:
        if len(text) > self.max_chars:
            return self._fn(text, *rest)
        return self._cached(text, *rest)

    def cache_clear(self) -> None:
        self._cached.cache_clear()

    def cache_info(self) -> Any:
        return self._cached.cache_info()


def short_text_cache(*, max_chars: int, maxsize: int) -> Callable[[Callable[..., R]], ShortTextCache[R]]:
    """Decorate ``fn(text, ...)`` as a :class:`ShortTextCache`."""

    def wrap(fn: Callable[..., R]) -> ShortTextCache[R]:
        return ShortTextCache(fn, max_chars=max_chars, maxsize=maxsize)

    return wrap
