"""The days a question names: "on October 13, 2023", "in July 2023", "between August 11 and August
15 2023", "on 3 May", "2023年5月3日", "5月", "2023-05-03". Read with a few patterns rather than a
date-parsing library: those guess a date in any number ("the 3 kids"), and a question that names no
date must name none here.

A date without a year is the latest such day (or month) not after ``today``: "what did I say on
May 3?" asks about the last May 3; in English its month must be capitalised ("may 2 of us come?"
names no date). A month without a day or a year ("in May") is too loose a reading of English and
names nothing; in Chinese "5月" is unambiguous.
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

Span = tuple[date, date]


def named_span(question: str, today: date) -> Span | None:
    """The first and last day the question names (one day, a month, or the days between), or
    ``None`` when it names no date."""
    spans: list[Span] = []
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
