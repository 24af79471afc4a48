"""The days a question names: "on October 13, 2023", "in July 2023", "between August 11 and August
15 2023", "on 3 May", "2023年5月3日", "5月", "2023-05-03". Read with a few patterns rather than a
date-parsing library: those guess a date in any number ("the 3 kids"), and a question that names no
date must name none here.

A date without a year is the latest such day (or month) not after ``today``: "what did I say on
May 3?" asks about the last May 3; in English its month must be capitalised ("may 2 of us come?"
names no date). A month without a day or a year ("in May") is too loose a reading of English and
names nothing; in Chinese "5月" is unambiguous.

Days named relative to ``today`` count too, as a bot's users ask: "yesterday", "the day before
yesterday", "3 days ago", "last week" / "this week" (calendar weeks from Monday), "2 weeks ago",
"last month" / "this month", "on Monday" / "last Friday" (the latest such day before today), and
in Chinese 昨天, 前天, 三天前, 上周, 本周, 上个月, 这个月. "Today" (今天) names nothing: "how are
you today?" asks about now, not about what was said today.

Only a question names a date here (:func:`is_question`): a bot's recall query is often the user's
own message, and "I'm seeing Tom on Friday" asks for memories of Tom, not of last Friday.
"""

from __future__ import annotations

import calendar
import re
from datetime import date, timedelta

_MONTHS = {name.lower(): n for n, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): n for n, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_ENGLISH = [
    # 13 October 2023 / 13th of October, 2023 / 13 October
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
    # October 13, 2023 / October 13th / October 13
    re.compile(rf"\b{_MONTH}\s+{_DAY}(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
    # October 2023
    re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE),
]
_ISO = re.compile(r"\b(?P<year>(?:19|20)\d\d)-(?P<month>[01]\d)-(?P<day>[0-3]\d)\b")
_CHINESE = re.compile(
    r"(?:(?P<year>(?:19|20)\d\d)年)?(?P<month>1[0-2]|0?[1-9])月(?:(?P<day>[0-3]?\d)[日号])?"
)
# "between August 11 and August 15 2023": the year written once, after the second day.
_RANGE_YEAR = re.compile(rf"\band\s+{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE)

_WEEKDAYS = {name.lower(): n for n, name in enumerate(calendar.day_name)}
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "a": 1, "an": 1}
_CN_NUMBERS = {"一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "几": 0}
_AGO = re.compile(
    r"\b(?P<n>\d{1,2}|one|two|three|four|five|six|seven|a|an)\s+(?P<unit>days?|weeks?)\s+ago\b", re.I
)
_CN_AGO = re.compile(r"(?P<n>\d{1,2}|[一两二三四五六七])(?:个)?(?P<unit>天|星期|礼拜|周)(?:以)?前")
_RELATIVE = [
    (re.compile(r"\bthe day before yesterday\b", re.I), "day", 2),
    (re.compile(r"\byesterday\b", re.I), "day", 1),
    (re.compile(r"\blast week\b", re.I), "week", 1),
    (re.compile(r"\bthis week\b", re.I), "week", 0),
    (re.compile(r"\blast month\b", re.I), "month", 1),
    (re.compile(r"\bthis month\b", re.I), "month", 0),
    (re.compile(r"前天"), "day", 2),
    (re.compile(r"昨天|昨晚"), "day", 1),
    (re.compile(r"上(?:个)?(?:周|星期|礼拜)"), "week", 1),
    (re.compile(r"(?:本|这)(?:个)?(?:周|星期|礼拜)"), "week", 0),
    (re.compile(r"上(?:个)?月"), "month", 1),
    (re.compile(r"(?:本|这个)月"), "month", 0),
]
_WEEKDAY = re.compile(r"\b(?:on|last)\s+(?P<day>" + "|".join(_WEEKDAYS) + r")\b", re.I)
_QUESTION_START = re.compile(
    r"^\s*(?:what|when|where|who|whom|which|why|how|did|do|does|was|were|is|are|can|could|have|has|"
    r"had|tell me|remind me|remember)\b",
    re.I,
)
_CN_QUESTION = re.compile(r"[吗呢]|什么|哪|谁|几|怎么|多少|是否")

Span = tuple[date, date]


def is_question(text: str) -> bool:
    """A question mark, an English question word or auxiliary first, or a Chinese question word."""
    return "?" in text or "？" in text or bool(_QUESTION_START.search(text) or _CN_QUESTION.search(text))


def named_span(question: str, today: date) -> Span | None:
    """The first and last day the question names (one day, a month, the days between, or a day,
    week or month relative to ``today``), or ``None`` when it names no date or is no question."""
    if not is_question(question):
        return None
    spans: list[Span] = _relative_spans(question, today)
    taken: list[tuple[int, int]] = []
    shared_year = _RANGE_YEAR.search(question)
    for pattern in (*_ENGLISH, _ISO, _CHINESE):
        for match in pattern.finditer(question):
            if any(start < match.end() and match.start() < end for start, end in taken):
                continue  # a shorter pattern inside a date already read
            groups = match.groupdict()
            month = _month_number(groups["month"])
            year = groups.get("year")
            if year is None and pattern in _ENGLISH and shared_year is not None:
                year = shared_year.group("year")
            if year is None and pattern in _ENGLISH and not groups["month"][0].isupper():
                continue  # "we may 2 of us go?", "march 5 miles": a date without a year is capitalised
            span = _span(month, groups.get("day"), int(year) if year else None, today)
            if span is not None:
                spans.append(span)
                taken.append((match.start(), match.end()))
    if not spans:
        return None
    return min(s[0] for s in spans), max(s[1] for s in spans)


def _relative_spans(question: str, today: date) -> list[Span]:
    spans: list[Span] = []
    for pattern, unit, n in _RELATIVE:
        if pattern.search(question):
            spans.append(_back(today, unit, n))
            question = pattern.sub(" ", question)  # "the day before yesterday" is not also "yesterday"
    for pattern, numbers in ((_AGO, _NUMBERS), (_CN_AGO, _CN_NUMBERS)):
        for match in pattern.finditer(question):
            raw = match.group("n")
            n = int(raw) if raw.isdigit() else numbers.get(raw.lower(), 0)
            unit = match.group("unit").lower()
            if n > 0:
                spans.append(_back(today, "day" if unit.startswith("day") or unit == "天" else "week", n))
    for match in _WEEKDAY.finditer(question):
        back = (today.weekday() - _WEEKDAYS[match.group("day").lower()] - 1) % 7 + 1
        day = today - timedelta(days=back)
        spans.append((day, day))
    return spans


def _back(today: date, unit: str, n: int) -> Span:
    """The day, calendar week (from Monday) or month ``n`` units before ``today``'s (0: this one,
    up to today)."""
    if unit == "day":
        day = today - timedelta(days=n)
        return day, day
    if unit == "week":
        monday = today - timedelta(days=today.weekday()) - timedelta(weeks=n)
        return monday, min(today, monday + timedelta(days=6))
    year, month = divmod(today.year * 12 + today.month - 1 - n, 12)
    first = date(year, month + 1, 1)
    return first, min(today, date(year, month + 1, calendar.monthrange(year, month + 1)[1]))


def _month_number(text: str) -> int:
    return int(text) if text.isdigit() else _MONTHS[text.lower().rstrip(".")]


def _span(month: int, day: str | None, year: int | None, today: date) -> Span | None:
    if not 1 <= month <= 12:
        return None
    if year is None:
        year = today.year
        if (month, int(day) if day else 1) > (today.month, today.day):
            year -= 1  # not yet this year: the last one
    last = calendar.monthrange(year, month)[1]
    if day is None:
        return date(year, month, 1), date(year, month, last)
    if not 1 <= int(day) <= last:
        return None
    named = date(year, month, int(day))
    return named, named


def within(day: date, span: Span, after: timedelta) -> bool:
    """Whether ``day`` falls in the span or in the ``after`` that follows it (people tell of a day
    once it has happened)."""
    return span[0] <= day <= span[1] + after
