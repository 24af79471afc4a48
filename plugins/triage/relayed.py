"""Others' words in a message: what its author quotes or relays is not the author's own life.

A reply that quotes ("> I decided to quit my job" then "lol no you didn't"), a pasted chat log
("Bob: hey" / "Alice: I moved to Berlin"), and relayed speech ("Alice told me: I moved to
Berlin", "my sister said, I hate cats", 小明说：我住在北京) speak in the first person of someone
else. Scenes and facts are read from the rest (:func:`without_relayed`); the message itself is
kept as written, since that is what its author said.

Quotation marks are read where their words are (see ``signals.quoted_positions``). The author's
own reported speech stays theirs ("I stood up and said: I quit!", "I finally told him: I'm
moving"), and so do their headings ("Update: I got the job", "Me: …", "@team: I got promoted"):
a speaker is someone named, a pronoun for someone else, or "my sister"-like, and a log is two
lines or more opened by two names or more."""

from __future__ import annotations

import re

# Discord's and Markdown's block quote: "> " quotes its line, ">>> " the rest of the message.
_QUOTED_LINE = re.compile(r"^[ \t]*>(?:[ \t]|$)")
_QUOTED_REST = re.compile(r"^[ \t]*>>>(?:[ \t]|$)")

_CAPITAL = "A-ZÀ-ÖØ-ÞĀĂĄĆĈĊČĎĐĒĔĖĘĚĜĞĠĢĤĦĨĪĬĮİĲĴĶĹĻĽĿŁŃŅŇŊŌŎŐŒŔŖŘŚŜŞŠŢŤŦŨŪŬŮŰŲŴŶŸŹŻŽ"
# A line of a chat log: "Name:" or "@name:" / "<@123>:" and what follows.
_LABEL = re.compile(
    rf"^[ \t]*(?P<who>@[\w.]{{1,40}}|<@!?\d{{1,25}}>|"
    rf"[{_CAPITAL}][\w'.-]{{0,30}}(?:[ ][{_CAPITAL}][\w'.-]{{0,30}})?)"
    r"[ \t]*(?:\([^)\n]{0,40}\))?[ \t]*:[ \t]+\S"
)
# Labels a writer gives their own lines: themselves, or headings (a diary's days too).
_ME = frozenset("me i myself".split())
_HEADINGS = frozenset(
    "update edit note ps p.s pps fyi btw tldr pros cons todo reminder question answer summary context goal "
    "goals status result results plan step warning spoiler news today yesterday tomorrow morning evening "
    "day week breakfast lunch dinner mood option".split()
)
_CALENDAR = frozenset(
    "monday tuesday wednesday thursday friday saturday sunday january february march april may june july "
    "august september october november december".split()
)

_NOT_A_SPEAKER = r"(?!(?:I|And|Then|So|But|Or|Finally|Honestly|Also|Just|Literally|Actually|Even|Always|Once|It|This|That|There|We|What|Which|Who|Me|Still|Later)\b)"  # noqa: E501
# Someone else who says, tells or writes, then punctuation and first-person words: direct speech,
# its first person the speaker's ("Alice told me: I moved"). Without the punctuation it is indirect,
# and the first person the author's ("Mom told me I'm adopted", "Bob said that I live in Paris").
_RELAY_EN = re.compile(
    r"(?<![\w'@<>!])"
    r"(?:(?i:(?:my|his|her|our|their|your|the|a|an)\s+[a-z][\w'-]{0,30})|(?i:he|she|they|someone|somebody|"
    r"everyone|everybody|nobody|you|u)|" + _NOT_A_SPEAKER + rf"[{_CAPITAL}][\w'.-]{{0,30}}|@[\w.]{{1,40}}|"
    r"<@!?\d{1,25}>)"
    r"\s+(?i:(?:just|then|also|literally|once|even|always|actually|finally)\s+)?"
    r"(?i:said|says|told\s+(?:me|us|everyone|him|her|them)|tells\s+(?:me|us)|texted(?:\s+(?:me|us))?|"
    r"wrote|writes|replied|messaged(?:\s+(?:me|us))?|posted|was\s+like)"
    r"[ \t]*(?:[:,\-—–][ \t]*[\"“'«]?|[\"“'«])[ \t]*"
    r"(?=(?i:i|i'm|im|i've|ive|i'd|i'll|my|me|we|we're|our)\b)"
)
_QUOTING_EN = re.compile(r"\(\s*(?i:quoting)\s+[^)\n]{1,40}\)[ \t]*:[ \t]*")
# 她说：我… / 小明告诉我，我…: not 我说 (the author's own), 小说 (a novel) or 听说 (heard that).
_RELAY_ZH = re.compile(
    r"(?<![我小听])(?:跟我说|对我说|告诉我|发消息说|说|讲|写道|回复)道?[：:，,][ \t]*[“\"「『]?[ \t]*(?=我)"
)
_OPENING = re.compile(r"[\"“«「『]")
_CLOSING = re.compile(r"[\"”»」』]")
_SENTENCE_END = re.compile(r"[.!?。！？…]|$", re.MULTILINE)


def without_relayed(text: str) -> str:
    """``text`` without what its author relays of others' words: quoted lines, the lines of a
    pasted chat log, and each relayed first-person sentence from where it is introduced ("Alice
    told me: …") to its end, or to the end of its quotation."""
    lines = text.split("\n")
    labels = [_label(line) for line in lines]
    if any(label and label not in _ME and label not in _CALENDAR for label in labels):
        # Beside someone's name, "May:" and "April:" are people too ("May: I moved to Berlin!" /
        # "Bob: nice"); alone they head a diary's days.
        labels = [_label(line, calendar_names=True) for line in lines]
    else:
        labels = [None if label in _CALENDAR else label for label in labels]
    others = {label for label in labels if label and label not in _ME}
    # A log: two labelled lines or more, someone else's among them ("Mom: I moved to Berlin!" /
    # "Me: wow"); only the others' lines go.
    logged = bool(others) and sum(1 for label in labels if label) >= 2 and len(set(labels) - {None}) >= 2
    kept: list[str] = []
    for line, label in zip(lines, labels, strict=True):
        if _QUOTED_REST.match(line):
            break
        if _QUOTED_LINE.match(line) or (logged and label in others):
            continue
        kept.append(_without_relayed_speech(line))
    return "\n".join(kept)


def _label(line: str, *, calendar_names: bool = False) -> str | None:
    """Whose line this is, by its label: a name, a mention, "me"; a heading is none (a day or a
    month is left to the caller, as a name or a heading)."""
    match = _LABEL.match(line)
    if match is None:
        return None
    who = match.group("who").lower()
    if who in _CALENDAR or who.split()[0] in _CALENDAR:
        return who if calendar_names or who in _CALENDAR else None
    return None if who in _HEADINGS or who.split()[0] in _HEADINGS else who


def _without_relayed_speech(line: str) -> str:
    spans: list[tuple[int, int]] = []
    position = 0
    # Each pattern's next match, searched again only once passed: a line of thousands of relays
    # is read once, not once a relay.
    upcoming = {pattern: pattern.search(line) for pattern in (_RELAY_EN, _QUOTING_EN, _RELAY_ZH)}
    while True:
        for pattern, known in upcoming.items():
            if known is not None and known.start() < position:
                upcoming[pattern] = pattern.search(line, position)
        found = [m for m in upcoming.values() if m is not None]
        if not found:
            break
        opened = min(found, key=lambda m: (m.start(), m.end()))
        # Quoted, the words end with the quotation ('she texted "I'm moving" and I cried');
        # otherwise with the sentence.
        closing = _CLOSING.search(line, opened.end()) if _OPENING.search(opened.group()) else None
        end = closing or _SENTENCE_END.search(line, opened.end())
        stop = max(end.end() if end is not None else len(line), opened.end())
        spans.append((opened.start(), stop))
        position = stop
    if not spans:
        return line
    parts, last = [], 0
    for start, stop in spans:
        parts.append(line[last:start].rstrip(" \t,:;-—–"))
        last = stop
    parts.append(line[last:].lstrip())
    return " ".join(part for part in parts if part)
