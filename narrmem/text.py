"""Small text helpers shared by triage, the keyword index and prompt budgeting."""

from __future__ import annotations

import math
import re

# CJK Unified Ideographs (+ extension A), Hiragana/Katakana, Hangul syllables.
_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(rf"[^\W_{_CJK}]+", re.UNICODE)
_CJK_CHAR = re.compile(f"[{_CJK}]")


def cjk_count(text: str) -> int:
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
    terms: list[str] = []
    pos = 0
    for match in _CJK_RUN.finditer(text):
        terms.extend(w.lower() for w in _WORD.findall(text[pos : match.start()]))
        terms.extend(cjk_bigrams(match.group()))
        pos = match.end()
    terms.extend(w.lower() for w in _WORD.findall(text[pos:]))
    return terms


def fts_document(text: str) -> str:
    """The text as it is written into the full-text index (CJK runs become bigrams)."""
    return " ".join(keyword_terms(text))
