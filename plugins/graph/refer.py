"""Does a message refer back to earlier conversation ("just now", "last time", 刚才, 上次…)? Then the
turn context brings the whole working memory chain, not only the task in progress."""

from __future__ import annotations

import re
from collections.abc import Sequence

_PHRASES_EN = (
    r"just now|before|earlier|last time|previously|previous|the other day|that thing|the thing we|"
    r"we talked|we discussed|we were talking|we said|you said|remember when|do you remember|"
    r"where were we|go back to|back to|continue|carry on|pick up where"
)
_REFERS = re.compile(
    rf"\b(?:{_PHRASES_EN})\b|刚才|刚刚|之前|上次|以前|那件事|那个事|那事|继续|接着|回到", re.IGNORECASE
)


def refers_back(text: str, extra: Sequence[str] = ()) -> bool:
    if _REFERS.search(text):
        return True
    lowered = text.lower()
    return any(phrase.lower() in lowered for phrase in extra if phrase.strip())
