"""Small text helpers shared by triage, the keyword index and prompt budgeting."""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

R = TypeVar("R")

# CJK Unified Ideographs (+ extension A), Hiragana/Katakana, Hangul syllables.
_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af"
_CJK_CHAR = re.compile(f"[{_CJK}]")
# Indexed as overlapping bigrams: CJK, and the scripts written without spaces between words (Thai,
# Lao, Myanmar, Khmer), whose runs were one word each: a word inside a sentence was never found.
# Hangul jamo too, the letters of a syllable not composed into one.
_BIGRAMMED = _CJK + r"\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u1100-\u11ff\u3130-\u318f"
_BIGRAMMED_RUN = re.compile(f"[{_BIGRAMMED}]+")
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+")  # what a word is in ASCII text, found faster
# The accents of a Latin letter once decomposed (NFD), folded away as FTS5's remove_diacritics
# does; other scripts' marks (Devanagari's vowel signs, Cyrillic's breve) are part of their words.
# Marks people type or leave out as they please, so a word is found either way: the accents of
# Latin letters, Greek accents and breathings ("Καλημέρα" typed "καλημερα"), Arabic vowel marks
# and tatweel (as Lucene's Arabic normalizer), Hebrew points. A mark that makes another letter of
# a script (Cyrillic й, Devanagari's vowel signs) is part of its word.
_OPTIONAL_MARKS = re.compile(
    r"(?<=[a-z\u00c0-\u024f\u1e00-\u1eff\u2c60-\u2c7f\ua720-\ua7ff])[\u0300-\u036f\u1dc0-\u1dff]+"
    r"|(?<=[\u0370-\u03ff\u1f00-\u1fff])[\u0300-\u036f]+"
    r"|(?<=[\u0400-\u04ff])[\u0300\u0301]"
    r"|[\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e8\u06ea-\u06ed\u0640]"
    r"|[\u0591-\u05bd\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7]"
)


@functools.cache
def marks() -> str:
    """The combining marks of the Basic Multilingual Plane (Mn, Mc, Me), as the inside of a
    regular expression's ``[...]``: ``\\w`` takes no mark, so a Hindi word fell into its
    consonants (प्रिया into प र य) and a decomposed "Jürgen" into two words. Built when first
    asked (10 ms)."""
    ranges: list[str] = []
    start = end = None
    for code in range(0x300, 0x10000):
        if unicodedata.category(chr(code))[0] == "M":
            if start is None:
                start = code
            end = code
        elif start is not None:
            ranges.append(f"\\u{start:04x}-\\u{end:04x}")
            start = None
    return "".join(ranges)


@functools.cache
def _word() -> re.Pattern[str]:
    """A word: a letter or digit, then letters, digits and the combining marks inside them
    (:func:`marks`). A mark alone is no word: the variation selector after ❤️ made one, shared by
    every memory with that emoji, and found them by it."""
    letter = rf"[^\W_{_BIGRAMMED}]"
    return re.compile(rf"{letter}(?:{letter}|[{marks()}])*")


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


# Characters a token of a current model's tokenizer (o200k) holds, by script, rounded down so that
# a budget is not overrun (measured on one sentence in each: Greek 2.6, Hebrew 2.5, Arabic and
# Persian 2.8, Thai 2.3, Hindi 3.5, Russian 3.7, against English's 4.5): each script's ranges.
_CHARS_PER_TOKEN = (
    (((0x0370, 0x03FF), (0x1F00, 0x1FFF), (0x0590, 0x05FF), (0xFB1D, 0xFB4F)), 2.3),
    (((0x0600, 0x08FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)), 2.5),
    (((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF)), 2.0),
    (((0x0900, 0x0DFF),), 3.0),
    (((0x0400, 0x052F),), 3.5),
)
# Each script's characters turned into a marker of its own by one str.translate, then counted
# (five regular expressions over the text cost 20 times as much); the markers themselves, should
# a text hold them, count as other characters.
_MARKERS = tuple(chr(n) for n in range(1, len(_CHARS_PER_TOKEN) + 1))
_SCRIPT_OF: dict[int, str | int] = {ord(m): " " for m in _MARKERS}
for _marker, (_ranges, _) in zip(_MARKERS, _CHARS_PER_TOKEN, strict=True):
    for _first, _last in _ranges:
        _SCRIPT_OF.update(dict.fromkeys(range(_first, _last + 1), _marker))
_RATES = tuple(chars for _, chars in _CHARS_PER_TOKEN)


def token_counts(text: str) -> tuple[int, ...]:
    """What the token estimate counts of ``text``: its CJK characters, its characters of each
    script of :data:`_CHARS_PER_TOKEN`, and the rest. Counts of texts add up to the counts of
    the texts joined, so a prompt built line by line is measured without measuring it whole
    again at every line (:func:`tokens_of`)."""
    if text.isascii():
        return (0, *(0 for _ in _RATES), len(text))
    cjk = cjk_count(text)
    marked = text.translate(_SCRIPT_OF)
    scripts = tuple(marked.count(marker) for marker in _MARKERS)
    return (cjk, *scripts, len(text) - cjk - sum(scripts))


def tokens_of(counts: tuple[int, ...]) -> int:
    """The token estimate of what :func:`token_counts` counted."""
    cjk, *scripts, rest = counts
    return cjk + math.ceil(sum(n / chars for n, chars in zip(scripts, _RATES, strict=True)) + rest / 4)


def added(*counts: tuple[int, ...]) -> tuple[int, ...]:
    """The counts of texts joined (a separator is a text too)."""
    return tuple(map(sum, zip(*counts, strict=True)))


def estimate_tokens(text: str) -> int:
    """A model-agnostic token estimate: one per CJK character, one per four characters of Latin
    text, and as many as a current tokenizer spends on the other scripts (two and a half
    characters a token of Arabic, two of Thai): counted at four, a Thai, Greek or Hebrew memory
    took up to 1.6 times its share of a budget."""
    if text.isascii():
        return math.ceil(len(text) / 4)
    return tokens_of(token_counts(text))


def cjk_bigrams(run: str) -> list[str]:
    """Overlapping bigrams of a CJK run (a lone character stays a unigram).

    Chinese has no spaces, so a word index would see one giant token; bigrams are what
    Lucene's CJK analyzer does and match two-character words such as 摇滚, which a trigram
    index cannot.
    """
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def in_bigrams(text: str) -> bool:
    """Whether ``text`` holds a character of a script indexed as bigrams (CJK, kana, Hangul,
    Thai and its neighbours): its words are those bigrams."""
    return not text.isascii() and _BIGRAMMED_RUN.search(text) is not None


def _continues(before: str, after: str) -> bool:
    """Whether ``after`` belongs to the character ``before`` ends: a combining mark, a variation
    selector, an emoji's skin tone or tag, a joined emoji (either side of the zero-width joiner),
    the vowel or final of a Hangul syllable spelt as its letters, the consonant a virama joins
    to the one before it (प्र is one character to a Hindi reader)."""
    code = ord(after)
    return (
        before == "\u200d"
        or code in _EXTENDS
        or (unicodedata.combining(before) == 9 and after.isalpha())
        or code == 0x200D
        or unicodedata.category(after)[0] == "M"
        or 0xFE00 <= code <= 0xFE0F
        or 0x1F3FB <= code <= 0x1F3FF
        or 0xE0020 <= code <= 0xE01EF
        or 0x1160 <= code <= 0x11FF
    )


# What Unicode's segmentation keeps with the character before beyond the marks: the halfwidth
# kana's voicing marks (ｶﾞ), Thai and Lao SARA AM (น้ำ), the zero-width non-joiner.
_EXTENDS = frozenset({0xFF9E, 0xFF9F, 0x0E33, 0x0EB3, 0x200C})


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def character_end(text: str, end: int) -> int:
    """The largest index at most ``end`` that cuts ``text`` between two characters as a reader
    sees them: a cut at a code point took an accent off its letter (ぐ came back く), a family
    emoji apart at its joiners, a flag in half."""
    end = max(0, min(end, len(text)))
    while 0 < end < len(text) and _continues(text[end - 1], text[end]):
        end -= 1
    if 0 < end < len(text) and _regional(text[end]):
        flags = 0
        while flags < end and _regional(text[end - 1 - flags]):
            flags += 1
        end -= flags % 2  # an odd count before: the last one is half of the flag that goes on
    return end


# Latin letters no decomposition takes the accent off, folded as tantivy's ascii_fold would.
_LATIN_LETTERS = str.maketrans(
    {"ı": "i", "ø": "o", "æ": "ae", "œ": "oe", "ł": "l", "đ": "d", "ħ": "h", "þ": "th"}
    # Letters typed for one another: Russian ё written е, Arabic alef maqsura and ya, ta marbuta
    # and ha, and the Arabic and Persian forms of ya and kaf (as Lucene's normalizers fold them).
    | {"ё": "е", "ى": "ی", "ي": "ی", "ة": "ه", "ك": "ک"}
)


def folded(text: str) -> str:
    """``text`` as keywords compare it: composed and compatible forms made one (NFKC: a macOS
    client sends "é" as "e" and an accent, a Japanese keyboard fullwidth letters, which matched
    nothing typed elsewhere), case-folded (ß as ss, İ as i), without the accents of Latin letters
    (ø as o, đ as d) and the marks people leave out in other scripts (ё as е, Greek accents,
    Arabic vowel marks, Hebrew points), so that FTS5, tantivy and PostgreSQL, each handed these
    words, find the same rows."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_LATIN_LETTERS)
    decomposed = unicodedata.normalize("NFD", text)
    bare = _OPTIONAL_MARKS.sub("", decomposed)
    return text if bare == decomposed else unicodedata.normalize("NFC", bare)


def keyword_terms(text: str) -> list[str]:
    """The words of ``text`` (:func:`folded`) plus the bigrams of its CJK and unspaced runs, in
    order."""
    if text.isascii():
        return _ASCII_WORD.findall(text.lower())
    text = folded(text)
    word = _word()
    terms: list[str] = []
    pos = 0
    for match in _BIGRAMMED_RUN.finditer(text):
        terms.extend(word.findall(text[pos : match.start()]))
        terms.extend(cjk_bigrams(match.group()))
        pos = match.end()
    terms.extend(word.findall(text[pos:]))
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
