"""Others' words in a message: what its author quotes or relays is not the author's own life.

A reply that quotes ("> I decided to quit my job" then "lol no you didn't"), a pasted chat log
("@bob: I work at Google"), and relayed speech ("Alice told me: I moved to Berlin", "he said, I
like rock", 小明说：我住在北京) speak in the first person of someone else. Scenes and facts are
read from the rest (:func:`without_relayed`); the message itself is kept as written, since that
is what its author said.

Quotation marks are read where their words are (see ``signals.quoted_positions``), and a
speaker's own reported speech ("I told him: I'm quitting") stays theirs."""

from __future__ import annotations

import re

# Discord's and Markdown's block quote: "> " quotes its line, ">>> " the rest of the message.
_QUOTED_LINE = re.compile(r"^[ \t]*>(?:[ \t]|$)")
_QUOTED_REST = re.compile(r"^[ \t]*>>>(?:[ \t]|$)")

# A chat log's speaker: a mention ("@bob:", Discord's "<@123>:") opens someone else's line; a name
# does in a log of two such lines or more (one "Update: I got the job" is its author's heading).
_MENTION_LABEL = re.compile(r"^[ \t]*(?:@[\w.]+|<@!?\d+>)[ \t]*(?:\([^)\n]{0,40}\))?[ \t]*:[ \t]*")
_NAME_LABEL = re.compile(
    r"^[ \t]*[A-Z][\w'.-]{0,30}(?:[ ][A-Z][\w'.-]{0,30})?[ \t]*(?:\([^)\n]{0,40}\))?[ \t]*:[ \t]+\S"
)

_FIRST_PERSON_NEXT = r"(?=(?:i|i'm|im|i've|ive|i'd|i'll|my|me|we|we're|our)\b)"
# Someone who says, tells or writes, then punctuation and first-person words: direct speech, the
# first person the speaker's ("Alice told me: I moved"). Without the punctuation it is indirect
# and the first person is the author's ("Mom told me I'm adopted", "Bob said that I live in Paris").
_RELAY_EN = re.compile(
    r"(?<![\w'])(?P<who>[\w'@<>!]+)\s+(?:(?:just|then|also|literally|once|even|always|actually)\s+)?"
    r"(?:said|says|told\s+(?:me|us|everyone|him|her|them)|tells\s+(?:me|us)|texted(?:\s+(?:me|us))?|"
    r"wrote|writes|replied|messaged(?:\s+(?:me|us))?|posted|was\s+like)"
    r"[ \t]*(?:[:,\-—–][ \t]*[\"“'«]?|[\"“'«])[ \t]*" + _FIRST_PERSON_NEXT,
    re.IGNORECASE,
)
# Not someone: the author ("I said, I…"), a thing ("it was like, I couldn't breathe"), an adverb.
_NOT_SOMEONE = frozenset(
    "i we it this that there which what who just then also literally once even always actually".split()
)
_QUOTING_EN = re.compile(r"\(\s*quoting\s+[^)\n]{1,40}\)[ \t]*:[ \t]*", re.IGNORECASE)
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
    told me: …") to its end."""
    lines = text.split("\n")
    logged = sum(1 for line in lines if _NAME_LABEL.match(line)) >= 2
    kept: list[str] = []
    for line in lines:
        if _QUOTED_REST.match(line):
            break
        if _QUOTED_LINE.match(line) or _MENTION_LABEL.match(line) or (logged and _NAME_LABEL.match(line)):
            continue
        kept.append(_without_relayed_speech(line))
    return "\n".join(kept)


def _without_relayed_speech(line: str) -> str:
    while True:
        opened = _first_relay(line)
        if opened is None:
            return line
        # Quoted, the words end with the quotation ('she texted "I'm moving" and I cried');
        # otherwise with the sentence.
        quote = _OPENING.search(opened.group())
        closing = _CLOSING.search(line, opened.end()) if quote is not None else None
        end = closing or _SENTENCE_END.search(line, opened.end())
        stop = end.end() if end is not None else len(line)
        head = line[: opened.start()].rstrip(" \t,:;-—–")
        line = head + (" " if head and stop < len(line) else "") + line[stop:].lstrip()


def _first_relay(line: str) -> re.Match[str] | None:
    found = [m for m in _RELAY_EN.finditer(line) if m.group("who").lower() not in _NOT_SOMEONE]
    found += [m for m in (_QUOTING_EN.search(line), _RELAY_ZH.search(line)) if m is not None]
    return min(found, key=lambda m: (m.start(), m.end()), default=None)
