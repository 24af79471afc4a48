"""Segmentation: a narrative becomes a list of atomic clauses, the leaves of every RTM tree.

Two steps. Sentences come from pysbd (rule-based, English and Chinese, no model), run one
paragraph at a time: its cost grows faster than linearly with the length of what it is given,
so long paragraphs are also cut at safe sentence ends first. Sentences are then cut into clauses
at ``;``, ``:``, dashes and at commas or coordinating conjunctions that start a new finite
clause (", and I ...", ", but she ..."); Chinese sentences at ``，；：`` and dashes. Punctuation
stays with the clause it ends, a conjunction with the clause it starts, so joining the clauses
gives the text back.

Text given one clause per line is taken as is (``mode="lines"``, or detected by ``"auto"``).
Everything here is deterministic and never yields an empty clause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import TYPE_CHECKING, Literal

from narrmem.text import cjk_count

if TYPE_CHECKING:
    import pysbd

Language = Literal["en", "zh"]
Mode = Literal["auto", "lines", "prose"]

# pysbd slows down super-linearly past a few thousand characters; paragraphs longer than this
# are pre-cut at sentence ends no abbreviation can produce (a lower-case word of 3+ letters).
_PYSBD_CHUNK = 3000
_EN_SAFE_END = re.compile(r"(?<=[a-z]{3}[.!?])\s+(?=[\"'“‘(\[]?[A-Z])")
_ZH_SAFE_END = re.compile(r"(?<=[。！？])")

_WORDISH = re.compile(r"[^\W_]", re.UNICODE)
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_SPACES = re.compile(r"\s+")
# A line holding more than one sentence: a terminator followed by more text.
_INTERNAL_END = re.compile(r"[.!?…][\"'”’)\]]*\s+\S|[。！？][”’」』）]*\S")
_LINE_END_PUNCT = re.compile(r"[.!?;:,…。！？；：，\"'”’)\]」』）]$")

_PRONOUNS = r"(?:I|you|he|she|it|we|they|there)"
_ADVERBS = r"(?:then|so|now|also|still|soon|later|suddenly)"  # ", and then I ..."
_DETERMINERS = r"(?:the|a|an|his|her|their|its|my|our|your|this|that|these|those)"
# Verb-like words: auxiliaries, regular pasts, and the endings of common irregular pasts
# (flew, thought, sang, drank, rode, took, spoke). A heuristic, not a parser: it only decides
# whether ", and <noun phrase> <word>" starts a clause.
_FINITE = (
    r"(?:was|were|is|are|am|had|has|have|did|does|do|could|would|will|can|should|might|must|shall|may"
    r"|\w+ed|\w+ew|\w+ought|\w+ang|\w+ank|\w+ode|\w+ook|\w+oke)"
)
# Each pattern matches the separator (kept with the left clause); the split falls at its end.
_EN_SPLITS = [
    re.compile(r";\s+"),
    re.compile(r":\s+(?!\d)"),
    re.compile(r"\s*(?:—|--)\s*(?=\w)"),
    re.compile(r"\s+[–-]\s+"),
    # ", and I ...", ", but they ...": a conjunction and a subject pronoun.
    # ("for" is left out: ", for you" is far more often a phrase than "for" starting a clause.)
    re.compile(rf",\s+(?=(?:and|but|or|so|yet|nor)\s+(?:{_ADVERBS}\s+)?{_PRONOUNS}\b)"),
    # ", but ...", ", yet ...", ", so ...": these conjunctions after a comma nearly always begin a clause.
    re.compile(r",\s+(?=(?:but|yet|so)\s+\w)"),
    # ", and the king rode ...": a determiner, a noun and something verb-like.
    re.compile(rf",\s+(?=(?:and|or)\s+{_DETERMINERS}\s+\w+\s+{_FINITE}\b)"),
    # ", and Mary was ...": a capitalised name and a verb-like word.
    re.compile(rf",\s+(?=(?:and|but|or|so|yet)\s+[A-Z][a-z]+\s+{_FINITE}\b)"),
    # " but she ...": no comma, but an unmistakable conjunction plus a subject.
    re.compile(r"\s+(?=(?:but|yet)\s+(?:I|he|she|we|they)\b)"),
]
# ", she said" is not a clause of its own: a bare comma before a pronoun splits only between two
# parts that are long enough to hold a verb each.
_EN_COMMA_PRONOUN = re.compile(r",\s+(?=(?:I|you|he|she|we|they)\s+\w)")
_MIN_WORDS_BARE_COMMA = (4, 3)
_ZH_SPLITS = re.compile(r"[，；：]|——|—")


@dataclass(frozen=True)
class Segmentation:
    clauses: list[str]
    language: Language
    mode: Literal["lines", "prose"]


def detect_language(text: str) -> Language:
    """``zh`` when CJK characters make up at least a third of the non-space characters."""
    visible = len(_SPACES.sub("", text))
    return "zh" if visible and cjk_count(text) * 3 >= visible else "en"


def joiner(language: str) -> str:
    """How clauses join back into text: Chinese needs no spaces."""
    return "" if language == "zh" else " "


def segment(text: str, *, language: Language | Literal["auto"] = "auto", mode: Mode = "auto") -> Segmentation:
    """Clauses of ``text`` in order; ``language`` decides the sentence rules (``auto``: per paragraph)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lang: Language = detect_language(text) if language == "auto" else language
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    lines = [line for line in lines if _WORDISH.search(line)]
    if mode == "lines" or (mode == "auto" and looks_like_clause_lines(text, lines)):
        return Segmentation(clauses=lines, language=lang, mode="lines")
    clauses: list[str] = []
    for paragraph in _paragraphs(text):
        para_lang: Language = detect_language(paragraph) if language == "auto" else language
        for sentence in sentences(paragraph, para_lang):
            clauses.extend(split_clauses(sentence, para_lang))
    return Segmentation(clauses=clauses, language=lang, mode="prose")


@lru_cache(maxsize=4)
def segment_cached(
    text: str, language: Language | Literal["auto"] = "auto", mode: Mode = "auto"
) -> Segmentation:
    """:func:`segment`, remembered for the last few texts: a create, traverse and ensemble of the same
    long text segment it once (pysbd takes seconds on a book). Do not mutate the result."""
    return segment(text, language=language, mode=mode)


def looks_like_clause_lines(text: str, lines: list[str]) -> bool:
    """One unit per line: several lines, no blank line between them, none holding two sentences,
    and either every line ends in punctuation or no line starts in lower case (which is what
    hard-wrapped prose looks like)."""
    if len(lines) < 2 or _BLANK_LINE.search(text.strip()):
        return False
    if any(_INTERNAL_END.search(line) for line in lines):
        return False
    if all(_LINE_END_PUNCT.search(line) for line in lines):
        return True
    return not any(line[0].islower() for line in lines)


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs; single line breaks inside one are just wrapping."""
    out = []
    for block in _BLANK_LINE.split(text):
        parts = [p.strip() for p in block.split("\n") if p.strip()]
        if not parts:
            continue
        joined = parts[0]
        for part in parts[1:]:
            # Chinese wraps without spaces; joining two CJK characters with a space would add one.
            glue = "" if cjk_count(joined[-1]) and cjk_count(part[0]) else " "
            joined += glue + part
        out.append(joined)
    return out


@lru_cache(maxsize=2)
def _segmenter(language: Language) -> pysbd.Segmenter:
    # Imported here: pysbd loads the rules of every language it knows, a cost every open would
    # pay though only summarizing uses it.
    import pysbd

    return pysbd.Segmenter(language=language, clean=False)


def sentences(paragraph: str, language: Language) -> list[str]:
    segmenter = _segmenter(language)
    found: list[str] = []
    for chunk in _chunks(paragraph, language):
        found.extend(s.strip() for s in segmenter.segment(chunk) if _WORDISH.search(s))
    return found


def _chunks(paragraph: str, language: Language) -> list[str]:
    if len(paragraph) <= _PYSBD_CHUNK:
        return [paragraph]
    safe = _ZH_SAFE_END if language == "zh" else _EN_SAFE_END
    pieces = [p for p in safe.split(paragraph) if p.strip()]
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + len(piece) > _PYSBD_CHUNK:
            chunks.append(current)
            current = ""
        current = f"{current}{joiner(language)}{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def split_clauses(sentence: str, language: Language) -> list[str]:
    """Cut one sentence into clauses; a fragment with no word character is merged, never emitted."""
    if language == "zh":
        cuts = sorted({m.end() for m in _ZH_SPLITS.finditer(sentence)})
        return _merge_short(_cut(sentence, cuts), min_chars=2, glue="")
    cuts_set: set[int] = set()
    for pattern in _EN_SPLITS:
        cuts_set.update(m.end() for m in pattern.finditer(sentence))
    for m in _EN_COMMA_PRONOUN.finditer(sentence):
        left, right = sentence[: m.start()], sentence[m.end() :]
        if len(left.split()) >= _MIN_WORDS_BARE_COMMA[0] and len(right.split()) >= _MIN_WORDS_BARE_COMMA[1]:
            cuts_set.add(m.end())
    return _merge_short(_cut(sentence, sorted(cuts_set)), min_chars=1, glue=" ")


def _cut(sentence: str, cuts: list[int]) -> list[str]:
    bounds = [0, *(c for c in cuts if 0 < c < len(sentence)), len(sentence)]
    return [sentence[a:b].strip() for a, b in pairwise(bounds)]


def _merge_short(parts: list[str], *, min_chars: int, glue: str) -> list[str]:
    """Fragments with fewer than ``min_chars`` word characters ("嗯，", a stray dash) join the next one
    (the previous one at the end of the sentence)."""
    out: list[str] = []
    carry = ""
    for part in parts:
        if not part:
            continue
        text = f"{carry}{glue}{part}" if carry else part
        if len(_WORDISH.findall(text)) < min_chars:
            carry = text
            continue
        out.append(text)
        carry = ""
    if carry:
        if out:
            out[-1] = f"{out[-1]}{glue if _WORDISH.search(carry) else ''}{carry}"
        elif _WORDISH.search(carry):
            out.append(carry)
    return out
