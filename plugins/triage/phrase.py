"""The Scene field without an LLM: a short phrase from the message's own structure, who did what
to what, in the narrator's voice ("I decided to move to Lisbon next spring for a design job" →
"Deciding to move to Lisbon for a design job"; "我决定明年去考研了" → "决定去考研").

English: find the clause that carries the scene signal, its first-person subject and verb; the
verb becomes a gerund and the rest follows in the third person, without time words, fillers and
trailing reasons. Value judgements read "Putting A before B"; "used to …, now …" reads "From … to …".
Chinese: the signal's clause without the subject, time words and final particles.
A phrase is at most ``MAX_WORDS`` words (``MAX_ZH_CHARS`` characters).
"""

from __future__ import annotations

import re
from importlib import resources

from narrmem_plugins.triage.signals import candidates

from narrmem.person import third_person

MAX_WORDS = 12
MAX_ZH_CHARS = 20

_IRREGULAR = dict(
    line.split()
    for line in resources.files(__package__).joinpath("irregular_gerunds.txt").read_text("utf-8").splitlines()
    if line and not line.startswith("#")
)
_NOT_VERBS = frozenset(
    "finally just really actually officially already never eventually ultimately totally also still "
    "so kinda honestly literally somehow ever".split()
)
_SUBJECT = re.compile(
    r"(?:^|(?<=[\s,;:]))(?:i|we)(?P<aux>'ve|'d|'m|'re| have| had| am| are| was| were| did| do)?"
    r"(?P<adverbs>(?: (?:finally|just|really|actually|officially|already|never|eventually|ultimately|"
    r"totally|also|still|so|kinda|kind of|sort of|honestly|literally|somehow|ever))*)"
    r" (?P<verb>[a-z']+)(?P<rest>.*)$",
    re.IGNORECASE,
)
_SUBJECTLESS = re.compile(
    r"^(?:(?:ok|okay|so|well|and|btw|yeah|finally|just|officially|today|tonight|yesterday|guess what)[ ,!]+)*"
    r"(?P<verb>[a-z]+ed|got|went|made|quit|chose|gave|ran|won|hit|paid|did|took|tried|regret|wish)\b"
    r"(?P<rest>.*)$",
    re.IGNORECASE,
)
_HEDGE = re.compile(
    r"^(?:(?:so|ok|okay|well|honestly|anyway|btw|also|and|but|yeah|lol|idk|man|for me|to me|looking back|"
    r"i (?:think|guess|feel like|believe|realized|realised)(?: that)?|i(?:'ve| have) come to (?:think|"
    r"believe|realize|realise)(?: that)?|(?:please |pls |can you |could you )?(?:remember|note|keep in mind)"
    r"(?: this| that)?(?: one)?)[ ,:—–-]+)+",
    re.IGNORECASE,
)
_TIME = re.compile(
    r"\s+(?:next|last|this) (?:spring|summer|autumn|fall|winter|week|month|year|weekend|morning|"
    r"evening|time)\b|\s+(?:today|tonight|yesterday|tomorrow|finally|at last|again|already|anymore|"
    r"any more|now|these days|last night|this morning|right now|in the end|honestly|lol|haha|tbh)\b",
    re.IGNORECASE,
)
_CUT = re.compile(
    r"\s*(?:[,;:(—–]|\s-\s|\.\s|!|\?|\.$)|\s+(?:because|cause|since|but|so that|so|which|after all|"
    r"even though|though|although|and then|while)\s|"
    r"\s+and (?=(?:nobody|everybody|everyone|it|he|she|they|i|we)\b)",
    re.IGNORECASE,
)
_VALUE = re.compile(
    r"^(?P<a>.+?)\s+(?:is|are|matters?|means?)\s+(?:(?:so|much|way|far)\s+)?(?:more important|worth more|"
    r"more valuable|more)\s+(?:to (?:me|us)\s+)?than\s+(?P<b>.+)$|^i(?:'d| would) rather (?P<r>.+)$|"
    r"^(?P<c>.+?)\s+(?:beats|trumps|outweighs|comes before)\s+(?P<d>.+)$|"
    r"^what (?:really |truly )?matters(?: most)?(?: to (?:me|us))? is(?: that)? (?P<m>.+)$|"
    r"^(?P<e>[^>]+?)\s*>+\s*(?P<f>[^>]+)$",
    re.IGNORECASE,
)
_REGRET = re.compile(
    r"(?:\bi |^)(?:really |honestly |definitely )?(?:shouldn't|should not|should never|shouldnt) have "
    r"(?P<verb>\w+)(?P<rest>.*)$|"
    r"\bif only i (?P<wish>.+)$",
    re.IGNORECASE,
)
_MODALS = frozenset("should could would might will can must shall may".split())
_TURN = re.compile(r"used to (?P<old>.+?)[,;.]?\s+(?:but\s+)?now\s+(?P<new>.+)$", re.IGNORECASE)
_FIRST_TIME = re.compile(
    r"^(?:my )?first time (?:ever )?(?P<act>\w+ing\b.*)$|"
    r"\bfirst time (?:that )?i (?:ever )?(?P<verb>\w+)(?P<after>.*)$|"
    r"\b(?:it|this|that|today|tonight) (?:was|is) (?:my|our) (?:very )?first (?:ever )?"
    r"(?P<noun>\w+)(?: ever)?(?P<rest>.*)$",
    re.IGNORECASE,
)
_FROM_TO = re.compile(r"^from .+? to .+$", re.IGNORECASE)
# Words a cut phrase must not end on ("than about the", "and").
_DANGLING = re.compile(
    r"(?:\s+(?:the|a|an|about|of|to|and|or|than|with|for|in|on|at|from|by|their|starting|since|as))+$",
    re.IGNORECASE,
)
_AND_PAST = re.compile(r"\band (\w+ed|went|got|made|took|quit|left|gave|came|ran)\b")
_TAIL = re.compile(r"[\s\W_]+$")
_EMOJI = re.compile(r"[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F]+")


def gerund(verb: str) -> str:
    """The -ing form of an English verb given in the base or past form ("decided" → "deciding")."""
    word = verb.lower()
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word.endswith("ing"):
        return word
    if word.endswith("ied"):
        return word[:-3] + "ying"
    if word.endswith("eed"):
        return word[:-1] + "ing"
    if word.endswith("ed"):
        return word[:-2] + "ing"
    if word.endswith("ie"):
        return word[:-2] + "ying"
    if word.endswith("ic"):
        return word + "king"  # panic → panicking
    if word.endswith("e") and not word.endswith(("ee", "ye", "oe")):
        return word[:-1] + "ing"
    return word + "ing"


def _trim(text: str) -> str:
    """The words up to the first clause break, without time words, in at most MAX_WORDS words."""
    text = _EMOJI.sub(" ", text)
    cut = _CUT.search(text)
    if cut is not None and cut.start() > 0:
        text = text[: cut.start()]
    previous = None
    while previous != text:
        previous = text
        text = _TIME.sub("", text)
    words = text.split()[:MAX_WORDS]
    return _DANGLING.sub("", _TAIL.sub("", " ".join(words)))


def _lower_start(text: str) -> str:
    """A sentence's first word loses the capital it had for starting the sentence ("Health")."""
    head = text.split(" ", 1)[0]
    return text[:1].lower() + text[1:] if head[1:].islower() else text


def _capital(phrase: str) -> str:
    return phrase[:1].upper() + phrase[1:]


def _english_act(clause: str) -> str | None:
    """Gerund + object for the clause's first-person act, or None when it has no such act."""
    match = _SUBJECT.search(clause)
    if match is not None:
        verb, rest = match.group("verb"), match.group("rest")
        aux = (match.group("aux") or "").strip().lower()
        if verb.lower() in _NOT_VERBS or verb.lower().rstrip("n't") in _MODALS:
            return None
        if aux in {"'m", "am", "'re", "are", "was", "were"} and not verb.lower().endswith("ing"):
            if verb.lower() in {"no", "not"}:
                return "No longer" + _strip_not(rest) if verb.lower() == "not" else "No" + rest
            return "Being " + verb + rest
        if verb.lower() == "not" or (verb.lower() in {"didn't", "don't"}):
            return "Not " + rest.strip()
        return gerund(verb) + rest
    match = _SUBJECTLESS.search(clause)
    if match is not None:
        return gerund(match.group("verb")) + match.group("rest")
    return None


def _strip_not(rest: str) -> str:
    return re.sub(r"\s+any ?more\b", "", rest)


def _value(clause: str) -> str | None:
    """ "A matters more than B" → "Putting A before B"; "I'd rather X" → "Preferring to X"."""
    value = _VALUE.search(clause)
    if value is None:
        return None
    for more, less in (("a", "b"), ("c", "d"), ("e", "f")):
        if value.group(more):
            # "idk man, for me sleep is ...": A is the last clause before the verb.
            side = _HEDGE.sub("", re.split(r"[,;:]\s*", value.group(more))[-1])
            return f"Putting {_lower_start(_trim(side))} before {_trim(value.group(less))}"
    if value.group("r"):
        return "Preferring to " + value.group("r")
    return "Caring most that " + value.group("m")


def _english_special(clause: str) -> str | None:
    value = _value(clause)
    if value is not None:
        return value
    if _FROM_TO.match(clause):
        return _capital(clause)
    turn = _TURN.search(clause)
    if turn is not None:
        old = _english_act("i " + turn.group("old")) or turn.group("old")
        new = _english_act(turn.group("new")) or turn.group("new")
        return f"From {_trim(old).lower()} to {_trim(new).lower()}"
    regret = _REGRET.search(clause)
    if regret is not None:
        if regret.group("wish"):
            return "Wishing they " + regret.group("wish")
        return "Regretting " + gerund(regret.group("verb")) + regret.group("rest")
    first = _FIRST_TIME.search(clause)
    if first is not None and first.group("act"):
        return f"{_trim(first.group('act'))} for the first time"
    if first is not None and first.group("verb"):
        return f"{_trim(gerund(first.group('verb')) + first.group('after'))} for the first time"
    if first is not None:
        return f"First {first.group('noun')}{first.group('rest')}"
    return None


def english_phrase(core: str) -> str | None:
    """The Scene phrase for an English sentence, or None when it has no first-person act."""
    clause = _HEDGE.sub("", core.strip())
    special = _english_special(clause)
    if special is not None:
        phrase = third_person(_trim(special) if not special.startswith("From") else special)
        return _capital(_DANGLING.sub("", " ".join(phrase.split()[:MAX_WORDS])))
    act = _english_act(clause)
    if act is None:
        return None
    phrase = _AND_PAST.sub(lambda m: "and " + gerund(m.group(1)), _trim(third_person(act)))
    return _capital(phrase) if phrase else None


_ZH_CLAUSES = re.compile(r"[，,；;：:。！!？?…～~]+")
# "帮我记一下，…" / "记住这一天，…": the request is not the moment; what follows it is.
_ZH_REQUEST = re.compile(
    r"^(?:请|帮我|你要|一定要|务必)?(?:记住|记一下|记下来|记下)(?:这一天|啊|哦|了)?[：:，,\s]*"
)
_ZH_HEDGE = re.compile(r"^(?:对我来说|在我看来|说真的|老实说|其实|我觉得|我现在觉得|现在觉得|觉得)[，,\s]*")
_ZH_SUBJECT = re.compile(r"(^|[，,]|以前|过去|原来|曾经|现在|如今)(?:我们|咱们|我)")
_ZH_TIME = re.compile(
    r"今天|昨天|明天|今年|明年|去年|刚刚|刚才|刚|最后还是|最后|最终|终于|已经|这次|那天|当初|当时|下周|上周|"
    r"下个月|上个月|周末|今晚|早上|晚上|真的|其实|还是"
)
_ZH_PARTICLES = re.compile(r"(?<![多死])[了啦呀啊吧呢哦嘛的]+$")


def chinese_phrase(core: str) -> str:
    """The Scene phrase for a Chinese sentence: the clause with the scene signal (else the first
    one), without its subject, time words and final particles."""
    core = _ZH_REQUEST.sub("", core.strip()) or core.strip()
    clauses = [c.strip() for c in _ZH_CLAUSES.split(core) if c.strip()]
    chosen = next((c for c in clauses if candidates(c)), None)
    # A signal only the whole sentence carries (以前…，现在…) keeps the sentence.
    clause = chosen or _TAIL.sub("", core.strip())
    clause = _ZH_HEDGE.sub("", _EMOJI.sub("", clause))
    clause = _ZH_SUBJECT.sub(r"\1", clause)
    clause = _ZH_TIME.sub("", clause)
    clause = _ZH_SUBJECT.sub(r"\1", clause)
    if "把" not in clause:  # 把offer拒了 needs its 了
        clause = _ZH_PARTICLES.sub("", clause).strip()
    return third_person(clause)[:MAX_ZH_CHARS] or core.strip()[:MAX_ZH_CHARS]


_KIND = {
    "decision": "A decision",
    "value": "What matters",
    "emotional_turn": "A change of heart",
    "milestone": "A milestone",
    "first_time": "A first",
    "regret": "A regret",
}


def fallback_phrase(core: str, scene_type: str | None) -> str:
    """When the sentence has no first-person act to build on: the kind of moment and the sentence's
    first clause in the third person ("A decision: ten years was enough")."""
    kind = _KIND.get(scene_type or "", "A note to keep")
    words = _trim(third_person(_HEDGE.sub("", core.strip()))).split()[: MAX_WORDS - len(kind.split())]
    head = _DANGLING.sub("", " ".join(words))
    return f"{kind}: {_lower_start(head)}" if head else kind
