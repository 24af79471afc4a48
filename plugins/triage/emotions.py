"""Which moods a message states ("so tired", "好累"), negation-aware ("not tired" states none)."""

from __future__ import annotations

import re
from typing import Any

from narrmem_plugins.triage.language import normalize
from narrmem_plugins.triage.lexicon import EMOTIONS

_NEGATED_EN = re.compile(
    r"\b(?:not|never|no longer|isn't|aren't|wasn't|don't|didn't|hardly|n't)\s+(?:\w+\s+)?$"
)
_NEGATED_ZH = re.compile(r"(?:不|没|没有|不再|一点也不|并不)$")


def _compile() -> list[tuple[str, re.Pattern[str]]]:
    compiled = []
    for label, (english, chinese) in EMOTIONS.items():
        words = "|".join(re.escape(w) for w in english)
        hanzi = "|".join(re.escape(w) for w in chinese)
        compiled.append((label, re.compile(rf"\b(?:{words})\b|{hanzi}")))
    return compiled


_PATTERNS = _compile()


def emotions_in(text: str) -> list[str]:
    """Emotion labels stated in ``text``, in lexicon order, each at most once."""
    lowered = normalize(text)
    found = []
    for label, pattern in _PATTERNS:
        for match in pattern.finditer(lowered):
            before = lowered[max(0, match.start() - 24) : match.start()]
            if _NEGATED_EN.search(before) or _NEGATED_ZH.search(before[-4:]):
                continue
            found.append(label)
            break
    return found


def moods_of(meta: dict[str, Any]) -> list[str]:
    """The moods a stored message states, as triage wrote them in its ``meta["emotions"]``: a list
    of lexicon labels. A caller's own ``emotions`` of another shape (a bot's ``{"detected":
    "tired"}``, a label triage does not know) is the caller's data, not a mood: read as one, it
    counted on one store and not the other, or failed the count of every later message."""
    stated = meta.get("emotions")
    if not isinstance(stated, list):
        return []
    return [m for m in dict.fromkeys(x for x in stated if isinstance(x, str)) if m in EMOTIONS]


def intensity(text: str) -> float:
    """0..1: how strongly feeling is expressed (mood words, exclamation marks, shouting)."""
    moods = len(emotions_in(text))
    exclamations = min(3, text.count("!") + text.count("！"))
    letters = [c for c in text if c.isalpha() and c.isascii()]
    shouting = 1 if len(letters) >= 8 and sum(c.isupper() for c in letters) / len(letters) > 0.6 else 0
    return min(1.0, (moods + 0.3 * exclamations + shouting) / 3)
