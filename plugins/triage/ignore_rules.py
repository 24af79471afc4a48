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
    MEDIA_PLACEHOLDER,
    PARTICLES_ZH,
    SMALL_TALK_EN,
    SMALL_TALK_ZH,
    WEATHER,
    WEATHER_ZH,
)

from narrmem.text import STOPWORDS, marks

_TOKEN = re.compile(r"[^\s,.!?;:~…。，！？；：、]+")
_NO_WORDS = re.compile(r"^[\W_\d]*$")
_SEGMENTS = re.compile(r"[,.!?;~～…。，！？；、\n]+")
_ONE_GREETING = rf"(?:(?:{GREETINGS_EN})(?: {BOT_NAMES})?|(?:{GREETINGS_ZH})(?:呀|啊|哇|啦|哈|吖)*)"
_GREETING = re.compile(
    rf"^{_ONE_GREETING}(?:[ ,]+{_ONE_GREETING})*(?: (?:today|tonight|this morning|lately|these days))?$"
)
# Laughter in the languages bots most often hear too: ахаха, jajaja, kkkk, rsrs, ㅋㅋㅋ, ㅎㅎ, www, 笑, ههههه.
# One syllable of them is a word (ji, je, w): two at least.
_LAUGHTER = re.compile(
    r"^(?:[aа]?(?:ha|he|hi|ah|lo+l|lmf?ao|xd|呵|哈|嘿|嘻|233+|ха|хе|ах|хи|kk+|rs|ㅋ|ㅎ|ه)+"
    r"|(?:ja|je|ji){2,}|w{2,})$"
)
# Not a symbol: a letter's mark (Hindi's vowel signs; taken off, "ठीक है" was not "ok").
_SYMBOLS = re.compile(rf"[^\w\s'一-鿿{marks()}]+")
_SMALL_TALK = re.compile(
    r"^(?:(?:hey|hi|hello|yo|ok|okay|so|sorry|and)[ ,]+)?"
    r"(?:not much|nothing much|not a lot|same here|me too|you too|same to you|just chilling|nm|nmu|not bad|"
    r"pretty good|all good|i'm good|im good|i'm fine|im fine|i'm ok|i'm okay|fine thanks|good thanks|"
    r"doing well|doing good|and you|you|hbu|wbu|how about you|what about you|same|likewise|"
    r"还行|还好|一般般|一般|老样子|没什么|没事|挺好的|挺好|你呢|我也是|我很好|我也很好|都挺好|"
    rf"{SMALL_TALK_EN}|{SMALL_TALK_ZH})$"
)
_MEDIA = re.compile(MEDIA_PLACEHOLDER, re.IGNORECASE)


def _phrases_by_first_word(phrases: frozenset[str]) -> dict[str, tuple[tuple[str, ...], ...]]:
    """The phrases of several words, by their first word: a message's words are each compared
    with the few phrases that start with them, not with every phrase."""
    by_first: dict[str, tuple[tuple[str, ...], ...]] = {}
    for words in sorted(tuple(p.split()) for p in phrases if " " in p):
        by_first[words[0]] = (*by_first.get(words[0], ()), words)
    return by_first


_PHRASES = _phrases_by_first_word(ACKNOWLEDGEMENT_PHRASES)
_CJK_WORDS = sorted(
    (w for w in ACKNOWLEDGEMENTS | ACKNOWLEDGEMENT_PHRASES if all("\u4e00" <= ch <= "\u9fff" for ch in w)),
    key=len,
    reverse=True,
)
# Chinese small talk has no spaces between its parts (嗯嗯好的, 收到收到, 哈哈哈笑死): a segment is
# small talk when it is a run of such words and tone particles.
_ZH_SMALL_RUN = re.compile(
    rf"^(?:{GREETINGS_ZH}|{SMALL_TALK_ZH}|{'|'.join(_CJK_WORDS)}|哈+|嘿+|嘻+|呵+|[{PARTICLES_ZH}])+$"
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


def without_names(text: str, names: frozenset[str]) -> str:
    """``text`` without the bot's names said as a vocative or mention ("@Nori", "thanks Nori")."""
    pattern = r"@?\b(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b"
    return re.sub(pattern, " ", text, flags=re.IGNORECASE).strip(" ,")


def without_media(text: str) -> str:
    """``text`` without the placeholders chat exports write for media (``[photo]``, ``<attachment>``):
    a caption is what the person wrote, the placeholder is not."""
    return _MEDIA.sub(" ", text).strip()


def ignore_reason(
    text: str,
    *,
    min_chars: int,
    extra: frozenset[str] = frozenset(),
    names: frozenset[str] = frozenset(),
) -> str | None:
    """Why the message is not worth remembering, or ``None`` if it may be. ``names`` are the bot's
    own names: calling it by name ("thanks Nori", "Nori you there?") adds nothing."""
    raw = text.strip()
    if not raw:
        return "empty"
    raw = without_media(raw)
    if not raw:
        return "media without words"
    if names:
        raw = without_names(raw, names)
        if not _NO_WORDS.sub("", raw):
            return "greeting or small talk"  # the bot's name alone: a ping
    if _NO_WORDS.match(raw):
        return "no words"
    lowered = normalize(raw)
    if len(lowered) + sum(1 for ch in lowered if "\u4e00" <= ch <= "\u9fff") < min_chars:
        return "too short"
    segments = [s for s in (_SYMBOLS.sub(" ", part).strip() for part in _SEGMENTS.split(lowered)) if s]
    if lowered in extra or (segments and all(_is_acknowledgement(s) or s in extra for s in segments)):
        return "acknowledgement"
    if segments and all(_is_small_talk(s) for s in segments):
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


def _is_small_talk(segment: str) -> bool:
    return bool(
        _GREETING.match(segment)
        or _SMALL_TALK.match(segment)
        or _is_acknowledgement(segment)
        or _ZH_SMALL_RUN.match(segment.replace(" ", ""))
    )


def _is_acknowledgement(segment: str) -> bool:
    if segment in ACKNOWLEDGEMENT_PHRASES or _LAUGHTER.match(segment.replace(" ", "")):
        return True
    tokens = _TOKEN.findall(segment)
    return bool(tokens) and _covered(tokens)


def _covered(tokens: list[str]) -> bool:
    """Whether ``tokens`` are a run of acknowledgement words and phrases ("yep that works")."""
    reach = [True] + [False] * len(tokens)
    for i, token in enumerate(tokens):
        if not reach[i]:
            continue
        if token in ACKNOWLEDGEMENTS or _LAUGHTER.match(token):
            reach[i + 1] = True
        for phrase in _PHRASES.get(token, ()):
            if tuple(tokens[i : i + len(phrase)]) == phrase:
                reach[i + len(phrase)] = True
    return reach[-1]
