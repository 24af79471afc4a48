"""What a message is about, in words: its content words without the chat's noise (function words,
greetings and thanks, the bot's own name, media placeholders, time words, chat fillers), for topic
counts and their labels.

Two English mentions are one topic only when they share a content word (by a light stem:
"apartments" and "apartment", "running" and "run"): two messages that both start with "hey Nori"
are alike to an embedding model, but they are not about the same thing. Chinese keeps its own rule
(two shared content bigrams), see ``counters.py``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

from narrmem_plugins.triage.ignore_rules import without_media

from narrmem.text import STOPWORDS, in_bigrams, keyword_terms, short_text_cache

NOISE = frozenset(
    """hey hi hello hiya yo sup morning evening night afternoon good great nice thanks thank thx ty
    bye cheers welcome lol lmao haha hahaha hehe omg wow yeah yep yes nope okay ok sure cool
    please sorry oops ugh hmm yay
    photo picture image video voice message sticker attachment gif file audio media omitted
    today tonight yesterday tomorrow week weekend month year day days time times now later soon
    just really like know think get got gets getting going gonna wanna want also yeah one much
    still finally already again lot lots bit kinda pretty thing things stuff way something anything
    everything nothing did done doing make made makes take took went goes come came say said says tell
    told start started starts new first last next back well even maybe actually literally
    don didn isn wasn aren weren couldn wouldn shouldn hasn haven doesn won ain
    """.split()
)
# The function words of the other languages bots most often hear, as keyword_terms spells them
# (accents of Latin letters folded): "ich bin" named a German user's topics. Words that are also
# English words or names, or parts of them, are left out ("ben", "bin", "var", "con", "los",
# "uber", "mit"): the lists apply to every message, English too.
_OTHER_FUNCTION_WORDS = """
    und der ist nicht auf ein eine einen einem sich auch wie wir ihr sie mein meine dein deine
    noch nur habe haben sind aber oder wenn dann schon heute doch jetzt sehr bei nach zum zur weil
    dass kann wird werden wieder immer ich bist
    une que dans pour avec mais ses nous vous ils suis était aussi cette leur aujourd'hui demain
    una pero muy está este estoy hoy ayer mañana también tengo tiene
    não muito ontem amanhã estou você meu minha
    sono anche molto oggi ieri domani questo questa
    için ile çok gibi daha siz onlar bugün dün yarın şimdi yok değil
    что это как так все она они его мне меня был была было уже еще ещё вот тут там когда если или
    для без под над только очень тоже просто сегодня вчера завтра мой моя мое моё мои твой наш
    нас вас него неё нее сейчас потом даже снова опять
    मैं मेरा मेरी मेरे हूँ हैं था थी थे बहुत फिर और भी आज यह वह कुछ नहीं
    أنا أنت هذا هذه التي الذي على إلى مرة جدا اليوم أخرى كان كانت لكن
"""
NOISE = NOISE | frozenset(term for word in _OTHER_FUNCTION_WORDS.split() for term in keyword_terms(word))
_DOUBLE_END = re.compile(r"([b-df-hj-np-tv-z])\1$")

# Texts up to this long are kept in the caches below (a chat message almost always is).
CACHED_CHARS = 2_000


def stem(word: str) -> str:
    """A light English stem: "apartments" → "apartment", "running" → "run", "studies" → "study"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    for suffix in ("ing", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            return _DOUBLE_END.sub(r"\1", word)
    return word


def content_words(text: str, names: Iterable[str] = ()) -> list[str]:
    """The English content words of ``text`` in order (repeats kept), noise and ``names`` left out."""
    return list(_analysed(text, _lowered(names))[0])


def content_stems(text: str, names: Iterable[str] = ()) -> set[str]:
    return set(_analysed(text, _lowered(names))[1])


def shares_words(a: str, b: str, names: Iterable[str] = ()) -> bool:
    """Whether two English messages share a content word (noise and names left out)."""
    skip = _lowered(names)
    return not set(_analysed(a, skip)[1]).isdisjoint(_analysed(b, skip)[1])


def topic_words(
    texts: list[str], limit: int = 3, names: Iterable[str] = (), *, min_share: float = 0.0
) -> list[str]:
    """The words most of ``texts`` use, in their most common spelling: the ones in most texts
    first, then the more frequent, then the earlier; only words in at least ``min_share`` of the
    texts (the first word always)."""
    skip = _lowered(names)
    in_texts: Counter[str] = Counter()
    total: Counter[str] = Counter()
    spellings: dict[str, Counter[str]] = {}
    for text in texts:
        words, stems = _analysed(text, skip)
        for word, stemmed in zip(words, stems, strict=True):
            total[stemmed] += 1
            spelled = spellings.get(stemmed)
            if spelled is None:  # not setdefault: it would build a Counter for every word
                spelled = spellings[stemmed] = Counter()
            spelled[word] += 1
        in_texts.update(set(stems))
    position = {s: i for i, s in enumerate(spellings)}
    ranked = sorted(spellings, key=lambda s: (-in_texts[s], -total[s], position[s]))
    kept = [s for i, s in enumerate(ranked) if i == 0 or in_texts[s] >= min_share * len(texts)]
    return [_spelling(spellings[s]) for s in kept[:limit]]


@short_text_cache(max_chars=CACHED_CHARS, maxsize=16_384)
def _analysed(text: str, names: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``text``'s content words and their stems. Cached: the topic counter reads the same recent
    messages again for every new one (a message's words are read once, not once per neighbour)."""
    skip = NOISE | names
    words = tuple(
        term
        for term in keyword_terms(without_media(text))
        if len(term) > 2
        and not in_bigrams(term)  # CJK and Thai: their bigrams, compared by their own rule
        and not term[0].isdigit()  # "14k", "6x800m", "2024": amounts, not topics
        and term not in STOPWORDS
        and term not in skip
    )
    return words, tuple(stem(word) for word in words)


# Two-character sequences too common in Chinese, Korean and Thai chat to say what a message is
# about: Korean's polite and formal endings (습니다, 어요, 했어) and Thai's particles (ครับ, ค่ะ,
# นะ) end nearly every sentence, and made one topic of five unrelated ones.
_COMMON_BIGRAMS = frozenset(
    "我的 我们 一个 今天 昨天 明天 现在 还是 就是 什么 怎么 这个 那个 "
    "因为 所以 但是 觉得 真的 有点 已经 一下 "
    "습니 니다 합니 입니 있습 했습 어요 아요 해요 세요 예요 에요 이에 였어 했어 었어 았어 어서 "
    "는데 은데 에서 으로 이야 거야 있어 없어 같아 너무 정말 진짜 오늘 어제 내일 그리고 그래 "
    "คร รั ับ ค่ ่ะ คะ นะ จ้ ้า ๆ ฉั ัน ผม วั ันน นี้ ที่ และ ไม ม่ ได ด้".split()
)


# Japanese writes its grammar in hiragana: a bigram that holds one (た公, で走) is a particle
# against a word, not what the message is about.
_HIRAGANA = re.compile("[\u3041-\u309f]")
# Thai's leading vowels, written before the consonant they follow in speech (เ แ โ ใ ไ).
_THAI_MARK = re.compile("[\u0e40-\u0e44]")


@short_text_cache(max_chars=CACHED_CHARS, maxsize=16_384)
def content_bigrams(text: str) -> frozenset[str]:
    """The content bigrams of ``text``'s CJK, Korean and Thai runs (the common ones and those
    holding Japanese grammar left out). Cached, as :func:`_analysed` is: a message is compared
    with up to 64 earlier ones."""
    return frozenset(
        t
        for t in keyword_terms(text)
        if len(t) == 2
        and in_bigrams(t)
        and t not in _COMMON_BIGRAMS
        and not _HIRAGANA.search(t)
        # Thai vowel and tone marks are no letters: a bigram that begins or ends with one is
        # half a syllable (ครั).
        and not (unicodedata.combining(t[0]) or unicodedata.combining(t[1]) or _THAI_MARK.match(t[0]))
    )


def forget_cached_words() -> None:
    """Drop every cached message text: a forgotten message's words must not stay in memory."""
    _analysed.cache_clear()
    content_bigrams.cache_clear()


def _lowered(names: Iterable[str]) -> frozenset[str]:
    if isinstance(names, frozenset):
        return _lowered_set(names)
    return frozenset(n.lower() for n in names)


@lru_cache(maxsize=64)
def _lowered_set(names: frozenset[str]) -> frozenset[str]:
    """The bot's names, lowered: the same few sets, asked for once per comparison."""
    return frozenset(n.lower() for n in names)


def _spelling(counts: Counter[str]) -> str:
    return min(counts, key=lambda word: (-counts[word], len(word), word))
