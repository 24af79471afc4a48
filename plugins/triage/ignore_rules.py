"""Layer 1: what is not worth memory. Plain string rules, so an ignored message costs microseconds
and never an embedding."""

from __future__ import annotations

import re

from narrmem_plugins.triage.language import (
    FIRST_PERSON_EN,
    FIRST_PERSON_ZH,
    is_factual_question,
    normalize,
)
from narrmem_plugins.triage.lexicon import (
    ACKNOWLEDGEMENT_PHRASES,
    ACKNOWLEDGEMENTS,
    BOT_NAMES,
    GREETINGS_EN,
    GREETINGS_ZH,
    WEATHER,
    WEATHER_ZH,
)

from narrmem.text import STOPWORDS

_TOKEN = re.compile(r"[^\s,.!?;:~…。，！？；：、]+")
_NO_WORDS = re.compile(r"^[\W_\d]*$")
_SEGMENTS = re.compile(r"[,.!?;~～…。，！？；、\n]+")
_ONE_GREETING = rf"(?:(?:{GREETINGS_EN})(?: {BOT_NAMES})?|(?:{GREETINGS_ZH})(?:呀|啊|哇|啦|哈|吖)*)"
_GREETING = re.compile(
    rf"^{_ONE_GREETING}(?:[ ,]+{_ONE_GREETING})*(?: (?:today|tonight|this morning|lately|these days))?$"
)
_LAUGHTER = re.compile(r"^(?:(?:ha|he|hi|ah|lo+l|lmf?ao|xd|呵|哈|嘿|嘻|233+)+)$")
_SYMBOLS = re.compile(r"[^\w\s'一-鿿]+")
_SMALL_TALK = re.compile(
    r"^(?:not much|nothing much|not a lot|same here|me too|you too|same to you|just chilling|nm|nmu|not bad|"
    r"pretty good|all good|i'm good|im good|i'm fine|im fine|i'm ok|i'm okay|fine thanks|good thanks|"
    r"doing well|doing good|and you|you|hbu|wbu|how about you|what about you|same|likewise|"
    r"还行|还好|一般般|一般|老样子|没什么|没事|挺好的|挺好|你呢|我也是|我很好|我也很好|都挺好)$"
)
_DATE_TIME = re.compile(
    r"\b(?:what(?:'s| is) the time|what time is it|what time it is|do you have the time|"
    r"what(?:'s| is) (?:the )?date|what date is it|today's date|what day is (?:it|today)|"
    r"what(?:'s| is) today|what year is it|what month is it)\b|"
    r"几点了|现在几点|几点钟|几月几号|(?:今天|明天|昨天|后天|前天|现在)(?:是)?(?:几号|星期几|礼拜几|周几|几月|什么日子)"
)
_WEATHER = re.compile(rf"\b(?:{WEATHER})\b|{WEATHER_ZH}")
_REQUEST = re.compile(
    r"\b(?:remind me|tell me|let me know|show me|give me|can you tell me|could you tell me)\b"
)
_PERSONAL = re.compile(FIRST_PERSON_EN + "|" + FIRST_PERSON_ZH)


def ignore_reason(text: str, *, min_chars: int, extra: frozenset[str] = frozenset()) -> str | None:
    """Why the message is not worth remembering, or ``None`` if it may be."""
    raw = text.strip()
    if not raw:
        return "empty"
    if _NO_WORDS.match(raw):
        return "no words"
    lowered = normalize(raw)
    if len(lowered) + sum(1 for ch in lowered if "\u4e00" <= ch <= "\u9fff") < min_chars:
        return "too short"
    segments = [s for s in (_SYMBOLS.sub(" ", part).strip() for part in _SEGMENTS.split(lowered)) if s]
    if lowered in extra or (segments and all(_is_acknowledgement(s) or s in extra for s in segments)):
        return "acknowledgement"
    if segments and all(
        _GREETING.match(s) or _SMALL_TALK.match(s) or _is_acknowledgement(s) for s in segments
    ):
        return "greeting or small talk"
    personal = bool(_PERSONAL.search(_REQUEST.sub("", lowered)))
    if _DATE_TIME.search(lowered) and not personal:
        return "date or time query"
    if not personal and segments and all(_is_weather(s) or _is_acknowledgement(s) for s in segments):
        return "weather small talk"
    if not personal and is_factual_question(lowered):
        return "general question"
    return None


_WEATHER_FILLER = frozenset(
    """it it's its is was so very really too again today tonight outside out here there lol omg what a the
    such nice lovely beautiful terrible awful crazy wild insane this that day morning week weekend all
    still kinda pretty quite super and finally getting got like first year went wtf lmao""".split()
)


def _is_weather(segment: str) -> bool:
    """About the weather and nothing else: a weather word and at most three other content words."""
    if not _WEATHER.search(segment):
        return False
    if any("\u4e00" <= ch <= "\u9fff" for ch in segment):
        return len(segment) <= 16
    words = [
        w
        for w in _TOKEN.findall(segment)
        if w not in _WEATHER_FILLER and w not in STOPWORDS and not w.isdigit() and not _WEATHER.search(w)
    ]
    return len(words) <= 3


def _is_acknowledgement(segment: str) -> bool:
    if segment in ACKNOWLEDGEMENT_PHRASES or _LAUGHTER.match(segment.replace(" ", "")):
        return True
    tokens = _TOKEN.findall(segment)
    return bool(tokens) and all(t in ACKNOWLEDGEMENTS for t in tokens)
