"""What a message says without the small talk around it: the text its episode's vector is made of.

A chat message often wraps one piece of news in greetings, thanks and reactions ("Hey John, been a
few days! I donated my old car to the shelter yesterday. Wow, thanks!"). Embedded whole, its vector
sits between the news and the pleasantries, and a question about the car finds it less readily. So
the episode's vector is made of the message less its small-talk sentences; the keyword index and
what recall returns keep the whole message. It also makes the text the model reads shorter.

A sentence is small talk when it has at most ``SMALL_TALK_WORDS`` words and opens with thanks, a
greeting, laughter or a reaction (``lexicon.SMALL_TALK_OPENERS``), or when the ignore layer would
drop it as a message of its own (哈哈, 谢谢, "see you!"). The word limit was chosen on the LoCoMo
tuning conversations (3 to 5 alike, 8 lower) and the whole rule kept because it raised recall on
the validation conversations too (the README's Benchmarks).
"""

from __future__ import annotations

import re

from narrmem_plugins.triage.ignore_rules import ignore_reason
from narrmem_plugins.triage.language import normalize
from narrmem_plugins.triage.lexicon import SMALL_TALK_OPENERS

from narrmem.text import sentences

SMALL_TALK_WORDS = 5
_WORDS = re.compile(r"[\w']+")
_CJK_STOPS = "。！？"
_SMALL_TALK_REASONS = frozenset({"acknowledgement", "greeting or small talk", "no words"})


def gist(text: str) -> str | None:
    """``text`` without its small-talk sentences, or ``None`` when that would leave it whole or
    empty (then the whole message is what it says)."""
    parts = sentences(text)
    if len(parts) < 2:
        return None
    kept = [sentence for sentence in parts if not is_small_talk(sentence)]
    if not kept or len(kept) == len(parts):
        return None
    # Chinese and Japanese sentences follow each other without a space.
    return "".join(s if i == 0 or kept[i - 1][-1] in _CJK_STOPS else " " + s for i, s in enumerate(kept))


def is_small_talk(sentence: str) -> bool:
    """Whether ``sentence``, inside a longer message, only keeps the conversation going."""
    words = _WORDS.findall(normalize(sentence))
    if not words:  # an emoji, ";)"
        return True
    if len(words) <= SMALL_TALK_WORDS and (
        words[0] in SMALL_TALK_OPENERS or " ".join(words[:2]) in SMALL_TALK_OPENERS
    ):
        return True
    return ignore_reason(sentence, min_chars=0) in _SMALL_TALK_REASONS
