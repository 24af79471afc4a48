"""What a question asks for, read without a model, as factors on the fused ranking.

Readings, each a rule about how people ask rather than about any particular conversation:

* **Whose memory.** A question that names one of the people who speak in the memories it searches
  ("What did Melanie paint?") is about that person: memories of the speakers it does not name get
  ``unnamed_speaker_factor``. When it names every speaker, or none, nothing changes (in a user's own
  scope every memory is the user's).
* **A name for an answer.** "Where", "who", "whom" and "which" questions are answered by a name: a
  place, a person, a title. An English memory that names nothing (no capitalised word inside a
  sentence other than the question's own words, the speakers, "I" and calendar words) gets
  ``nameless_answer_factor``: "Where does she live now?" is answered by "I moved to Lisbon", not by
  "the movers broke my lamp", however close the second is in words.
* **What comes next.** A question about the future ("which book do we read next?", "what is she going
  to do?") is answered by a memory that speaks of the future ("next month's pick should be…", "I
  plan to…"): memories with no word of the future get ``future_factor``.
* **A pattern answers how someone feels.** A scene that counts a repeated mood ("said 'tired' 3 times
  this week", ``meta["type"] == "pattern"``) answers a question about feelings; to any other
  question it is a name and a mood word that match without answering, so it gets
  ``pattern_factor`` unless the question speaks of feelings (a mood triage knows, or feel, mood,
  emotion, 心情, 感觉, 情绪).
* **A day named.** A question that names a date ("on October 13, 2023", "in July 2023", "on May 3",
  "2023年5月") asks about what was said then: memories from outside that day or month and the
  ``dated_window_days`` after it (people tell of a day once it has happened) get ``dated_factor``.

All only lower scores (factors in [0, 1], through ``narrmem_weigh``, so ``Hit.why.importance_factor``
includes them), and a factor of 1 turns a reading off: ``[plugin.recall_intent]`` options. The
defaults were chosen on the LoCoMo tuning conversations and kept because they raised recall on the
validation conversations too (see the README's Benchmarks).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date, timedelta, tzinfo

from narrmem_plugins.question_dates import named_span, within
from narrmem_plugins.triage.counters import PATTERN_TYPE
from narrmem_plugins.triage.emotions import emotions_in
from narrmem_plugins.triage.language import has_cjk
from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import share
from narrmem.configured import Configured
from narrmem.models import MemoryRecord, RecallRequest, SceneDraft
from narrmem.view import MemoryView

NAME = "recall_intent"

_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")
_NAME_QUESTION = frozenset({"where", "who", "whom", "which"})
_FUTURE = re.compile(
    r"\b(?:next|upcoming|will|gonna|plan|plans|planning|planned|soon|tomorrow|future|someday)\b"
    # "going to" + a verb is the future; "going to the park" is a trip.
    r"|\bgoing to\b(?!\s+(?:a|an|the|my|your|his|her|our|their|this|that|these|those|some)\b)"
    r"|'ll\b|’ll\b|下个|下周|下次|明天|明年|打算|计划|将要",
    re.IGNORECASE,
)
_FEELINGS = re.compile(
    r"\b(?:feel|feels|feeling|feelings|felt|mood|moods|emotion|emotions|emotional)\b|心情|感觉|情绪",
    re.IGNORECASE,
)
_NOT_NAMES = frozenset(
    {
        "i",
        "i'm",
        "i've",
        "i'll",
        "i'd",
        "i’m",
        "i’ve",
        "i’ll",
        "i’d",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    }
)


class IntentOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unnamed_speaker_factor: float = share(
        0.8,
        "score factor for the memories of speakers a question does not name, when it names one",
    )
    nameless_answer_factor: float = share(
        0.7,
        "score factor for memories that name nothing, when a where/who/which question asks for a name",
    )
    future_factor: float = share(
        0.5,
        "score factor for memories that speak of no future, when a question asks what comes next",
    )
    pattern_factor: float = share(
        0.5,
        "score factor for a scene counting a repeated mood, when a question does not speak of feelings",
    )
    dated_factor: float = share(
        0.8,
        "score factor for memories from outside the date a question names and the window after it",
    )
    dated_window_days: int = Field(
        default=31, ge=0, le=3650, description="days after a named date whose memories still tell of it"
    )


class RecallIntent(Configured[IntentOptions], name=NAME, options=IntentOptions):
    @hookimpl
    def narrmem_weigh(
        self, memory: MemoryView, request: RecallRequest, records: dict[int, MemoryRecord]
    ) -> dict[int, float]:
        return intent_factors(
            request.query,
            records,
            unnamed_speaker_factor=self.options.unnamed_speaker_factor,
            nameless_answer_factor=self.options.nameless_answer_factor,
            future_factor=self.options.future_factor,
            pattern_factor=self.options.pattern_factor,
            dated_factor=self.options.dated_factor,
            dated_window=timedelta(days=self.options.dated_window_days),
            today=(asked := request.asked_at or memory.clock.now()).date(),
            zone=asked.tzinfo,
        )


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def named_speakers(query: str, speakers: Iterable[str]) -> set[str]:
    """The speakers the query names: every word of the name as a word of the query (a CJK name as
    a substring, since Chinese has no spaces)."""
    said = set(words(query))
    named: set[str] = set()
    for speaker in speakers:
        if has_cjk(speaker):
            if speaker in query:
                named.add(speaker)
        elif (parts := words(speaker)) and all(p in said for p in parts):
            named.add(speaker)
    return named


def asks_for_a_name(query: str) -> bool:
    """A where/who/whom/which question (its first three words hold the question word)."""
    return any(w in _NAME_QUESTION for w in words(query)[:3])


def names_something(text: str, known: set[str]) -> bool:
    """Whether ``text`` holds a capitalised word inside a sentence that is not in ``known``."""
    for sentence in _SENTENCE_END.split(text):
        for word in _WORD.findall(sentence)[1:]:
            lowered = word.lower()
            if word[0].isupper() and lowered not in _NOT_NAMES and lowered not in known:
                return True
    return False


def intent_factors(
    query: str,
    records: Mapping[int, MemoryRecord],
    *,
    unnamed_speaker_factor: float,
    nameless_answer_factor: float,
    future_factor: float = 1.0,
    pattern_factor: float = 1.0,
    dated_factor: float = 1.0,
    dated_window: timedelta = timedelta(days=31),
    today: date | None = None,
    zone: tzinfo | None = None,
) -> dict[int, float]:
    """A factor in [0, 1] per memory id that one of the readings lowers (the rest keep 1).
    ``today`` is the asker's day, ``zone`` the zone it is a day of: each memory is dated in it
    (``None``: in its own time's offset)."""
    factors: dict[int, float] = {}
    speakers = {r.speaker for r in records.values() if r.speaker}
    named = named_speakers(query, speakers)
    # By person, not by name: someone renamed ("Bob", now "Robert") is asked about under either,
    # and their memories under the other name are theirs all the same.
    people = {_person(r) for r in records.values() if r.speaker}
    named_people = {_person(r) for r in records.values() if r.speaker in named}
    if unnamed_speaker_factor < 1 and named_people and named_people != people:
        for memory_id, record in records.items():
            if _person(record) not in named_people:
                factors[memory_id] = unnamed_speaker_factor
    if nameless_answer_factor < 1 and asks_for_a_name(query) and not has_cjk(query):
        known = set(words(query)) | {w for s in speakers for w in words(s)}
        for memory_id, record in records.items():
            if not names_something(_said(record), known):
                factors[memory_id] = factors.get(memory_id, 1.0) * nameless_answer_factor
    if future_factor < 1 and _FUTURE.search(query):
        for memory_id, record in records.items():
            if not _FUTURE.search(_said(record)):
                factors[memory_id] = factors.get(memory_id, 1.0) * future_factor
    if pattern_factor < 1 and not asks_about_feelings(query):
        for memory_id, record in records.items():
            if record.meta.get("type") == PATTERN_TYPE:
                factors[memory_id] = factors.get(memory_id, 1.0) * pattern_factor
    # Without today a date with no year cannot be placed: the reading needs the clock's day.
    span = named_span(query, today) if dated_factor < 1 and today is not None else None
    if span is not None:
        for memory_id, record in records.items():
            when = record.created_at if zone is None else record.created_at.astimezone(zone)
            if not within(when.date(), span, dated_window):
                factors[memory_id] = factors.get(memory_id, 1.0) * dated_factor
    return factors


def _person(record: MemoryRecord) -> str | None:
    return record.user_id or record.speaker


def asks_about_feelings(query: str) -> bool:
    """Whether the question speaks of feelings: a mood triage counts, or a word for feelings."""
    return bool(_FEELINGS.search(query) or emotions_in(query))


def _said(record: MemoryRecord) -> str:
    """A scene's Core (the speaker's words; its other lines are labels), else the memory's text."""
    draft = SceneDraft.of(record)
    return draft.core if draft is not None and draft.core else record.text
