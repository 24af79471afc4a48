"""The speaker's words as someone else would report them: "quit my job" → "quit their job",
"我的工作" → "自己的工作". Used for the Scene phrase and for facts about the user ("user plans to
quit their job"), which a reader sees in the third person.

Gender is not known, so English uses singular "they" and Chinese uses 自己 (possessive) and TA.
"""

from __future__ import annotations

import re

_EN = {
    "i": "they",
    "me": "them",
    "my": "their",
    "mine": "theirs",
    "myself": "themselves",
    "i'm": "they're",
    "im": "they're",
    "i've": "they've",
    "ive": "they've",
    "i'd": "they'd",
    "i'll": "they'll",
    "we": "they",
    "us": "them",
    "our": "their",
    "ours": "theirs",
    "ourselves": "themselves",
    "we're": "they're",
    "we've": "they've",
    "we'd": "they'd",
    "we'll": "they'll",
}
_EN_WORD = re.compile(r"(?<![\w'’])(?:" + "|".join(sorted(_EN, key=len, reverse=True)) + r")(?![\w'’])", re.I)
# "I am" / "I was" read "they are" / "they were" once the pronoun changes.
_AGREEMENT = ((re.compile(r"\bthey am\b"), "they are"), (re.compile(r"\bthey was\b"), "they were"))
_ZH = (
    (re.compile(r"我们的|咱们的"), "他们的"),
    (re.compile(r"我们|咱们"), "他们"),
    (re.compile(r"我的"), "自己的"),
)
_ZH_SELF = re.compile(r"我自己")
_ZH_I = re.compile(r"我")


def _english(match: re.Match[str]) -> str:
    """The third-person word, capitalised where the original was for its own sake ("My", not "I")."""
    original = match.group()
    if original in ("US", "ME", "MY"):  # the US, Maine, Malaysia: names, not the speaker
        return original
    word = _EN[original.lower().replace("’", "'")]
    capital = original[0].isupper() and (match.start() == 0 or not original.lower().startswith("i"))
    return word.capitalize() if capital else word


def third_person(text: str) -> str:
    """``text`` with the speaker's first-person words in the third person (English and Chinese)."""
    result = _EN_WORD.sub(_english, text)
    for pattern, replacement in _AGREEMENT:
        result = pattern.sub(replacement, result)
    for pattern, replacement in _ZH:
        result = pattern.sub(replacement, result)
    result = _ZH_SELF.sub("自己", result)
    return _ZH_I.sub("TA", result)


# How a relation reads before its object when the object is a verb phrase: "plans" + "quit their
# job" → "plans to quit their job", "plans" + "moving abroad" → "plans on moving abroad".
_VERB_RELATIONS = {"plans": ("plans to", "plans on"), "dropped_plan": ("dropped the plan to", "gave up on")}
_GERUND = re.compile(r"^\w+ing\b")


def fact_line(subject: str, relation: str, obj: str) -> str:
    """A fact as a reader would say it: "user plans to quit their job" (object in the third person,
    the relation joined to a verb object with "to" / "on")."""
    obj = third_person(obj)
    if relation in _VERB_RELATIONS and obj.isascii() and not re.match(r"^(?:to|on)\b", obj):
        infinitive, gerund = _VERB_RELATIONS[relation]
        return f"{subject} {gerund if _GERUND.match(obj) else infinitive} {obj}"
    return f"{subject} {relation} {obj}"
