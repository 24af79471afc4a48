"""Does a message refer back to earlier conversation ("just now", "last time", 刚才, 上次…)? Then the
turn context brings the whole working memory chain, not only the tasks in progress.

A recap question ("What did we talk about?", "remind me what I said", 我们聊过什么) asks for the
conversation itself, not for a topic in it: its words ("talk", "said") name no memory, so a keyword
or vector search for them finds the wrong things. The turn context answers it with the chat's recent
narrative instead, in the order it happened.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PHRASES_EN = (
    r"just now|before|earlier|last time|previously|previous|the other day|that thing|the thing we|"
    r"we talked|we discussed|we were talking|we said|you said|remember when|do you remember|"
    r"where were we|go back to|back to|continue|carry on|pick up where"
)
# "what did we talk about", "what have we discussed", "remind me what I said", "what was I saying".
_RECAP_EN = (
    r"what\s+(?:did|have|had)\s+(?:we|i)\s+(?:just\s+)?(?:talk(?:ed)?|chat(?:ted)?|discuss(?:ed)?|say|said|"
    r"tell\s+you|told\s+you|mention(?:ed)?)|what\s+(?:were|was)\s+(?:we|i)\s+(?:talking|chatting|saying)|"
    r"remind\s+me\s+(?:of\s+)?what\s+(?:i|we)\s+(?:said|told\s+you|talked\s+about|discussed|mentioned)|"
    r"(?:give\s+me\s+a\s+|a\s+quick\s+)?recap|summar(?:ize|ise)\s+(?:our|the|this)\s+(?:conversation|chat)"
)
_RECAP_ZH = (
    r"我们(?:刚才|刚刚|之前|上次|以前)?(?:都)?(?:聊|谈|说|讲)(?:过|了)?(?:些)?(?:什么|啥)|"
    r"我(?:刚才|刚刚|之前|上次|以前)?(?:都)?(?:说|讲|提)(?:过|了)?(?:些)?(?:什么|啥)|"
    r"(?:总结|回顾)一下(?:我们)?(?:的)?(?:聊天|对话)"
)
_REFERS = re.compile(
    rf"\b(?:{_PHRASES_EN})\b|{_RECAP_EN}|刚才|刚刚|之前|上次|以前|那件事|那个事|那事|继续|接着|回到|聊过|谈过|{_RECAP_ZH}",
    re.IGNORECASE,
)
_RECAP = re.compile(rf"(?:\b(?:{_RECAP_EN})\b|{_RECAP_ZH})", re.IGNORECASE)
# What may follow a recap question without giving it a topic: times, fillers, "so far", "with you".
_RECAP_TAIL = re.compile(
    r"^(?:\s|[?？!！.。,，~～]|about|so\s+far|just\s+now|before|earlier|last\s+time|today|yesterday|"
    r"previously|recently|lately|with\s+you|to\s+you|again|please|us|of|all|this\s+(?:week|morning)|"
    r"那时|那次|呢|吗|来着|了|过|啊|呀|吧|一下|我们|今天|昨天|最近)*$",
    re.IGNORECASE,
)


def refers_back(text: str, extra: Sequence[str] = ()) -> bool:
    if _REFERS.search(text):
        return True
    lowered = text.lower()
    return any(phrase.lower() in lowered for phrase in extra if phrase.strip())


def asks_for_recap(text: str) -> bool:
    """Whether ``text`` asks what was said, with no topic of its own: "What did we talk about?",
    "remind me what I said", 我们聊过什么 — but not "what did we say about Lisbon?"."""
    match = _RECAP.search(text)
    return match is not None and _RECAP_TAIL.match(text[match.end() :]) is not None
