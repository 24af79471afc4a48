"""Facts a message states about its author, without an LLM: a documented rule set for English and
Chinese (the seed's must-write table: preferences, what the user works on, plans, where they are).

How a message is read:

1. It is cut into sentences, and each sentence into clauses (at , ; ， ； and at "but/because"/
   但是/因为…). A sentence whose first clause asks states nothing; otherwise each clause that asks
   (ends with ?/？, starts like an English question, or in Chinese ends with 吗/么 or asks with
   什么/谁/哪/怎么/多少/是不是…) is dropped: "I like rock, do you?" keeps "I like rock".
2. Leading fillers ("so", "btw", "honestly", 其实, 对了…) are dropped; a leading hedge ("I think",
   "maybe", "probably", 我觉得, 可能, 好像…) is dropped and makes the fact speculative.
3. The clause must then *start* with the speaker ("I", "I'm", 我): reported speech ("he said I like…"),
   conditionals ("if I like…"), and third-person clauses ("my brother likes…", 他喜欢…) never match.
4. The first rule that matches gives the relation; negated forms have their own rules and their own
   relation ("I don't like rock (anymore)", 我不再喜欢摇滚了 → ``dislikes``), so a negation can never be
   read as the positive fact. Hedging adverbs inside the clause ("I might like", 我可能喜欢) make it
   speculative too.
5. The object is cut at connectors and trailing time words ("anymore", "right now", 了/呢/吧) and
   leading articles; pronouns ("it", "you", 你, 这个), prepositional starts and objects of more than
   8 words (20 Chinese characters) are dropped.

Relations: ``likes``/``dislikes``, ``works_on``/``stopped_working_on``, ``plans``/``dropped_plan``,
``located_at``/``left`` (needs a present-time marker: "I'm currently at X", "I'm at X right now",
我现在在X), ``lives_in`` ("I live in X", "I moved to X", 我住在X), ``works_at`` ("I work at X", 我在X工作),
``job`` ("I work as a X", "my job is X", 我是一名X), ``partner`` ("my girlfriend is X", "I'm dating
X", 我男朋友叫X) and ``age`` ("I'm 30", "I just turned 30", 我今年30岁); these five and ``located_at``
hold one value at a time (see :mod:`.vocabulary`). Leaving retires them: ``no_longer_works_at`` ("I
quit my job at X", "I don't work at X anymore", 我从X离职了), ``moved_away_from`` ("I don't live in X
anymore", 我不住在X了) and ``broke_up_with`` ("X and I broke up", 我和X分手了). A one-value fact told as
the past of a life ("I moved to Berlin 10 years ago", "when I was 8", 小时候) is none.
Inferred, never said: going to a concert of X ("I went to a Coldplay concert",
我去了周杰伦的演唱会) gives a speculative ``likes``.
The subject of every fact is ``user``, the message's author.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from narrmem_plugins.graph.vocabulary import USER, is_node_name
from narrmem_plugins.triage.language import has_cjk, is_question, sentences, third_person_start
from narrmem_plugins.triage.relayed import without_relayed

from narrmem.person import third_person

EXPLICIT = 0.9
HEDGED = 0.5
INFERRED = 0.4
MAX_WORDS = 8
MAX_ZH_CHARS = 20
# Objects are places: cut at "for", "with"…
PLACES = ("located_at", "left", "lives_in", "works_at", "moved_away_from", "no_longer_works_at")


@dataclass(frozen=True)
class Fact:
    relation: str
    object: str
    speculative: bool
    confidence: float
    rule: str
    subject: str = USER
    # A one-value fact told as the past of a life ("I moved to Berlin 10 years ago"): about how
    # many years before the message it was so. Written as said then, it replaces nothing said
    # since (the writer stores it as history when a later value holds).
    years_ago: float = 0.0


@dataclass(frozen=True)
class Rule:
    name: str
    relation: str
    pattern: re.Pattern[str]
    inferred: bool = False


# --- English ----------------------------------------------------------------------------------

_ADV = (
    r"(?:(?:really|truly|absolutely|totally|just|still|also|actually|definitely|honestly|kinda|kind\s+of|"
    r"sort\s+of|probably|might|may|do|currently|now|busy|mostly|mainly|always|genuinely|seriously)\s+)*"
)
_IM = r"(?:i'm|i\s+am|im)"
_OBJ = r"(?P<obj>.+)$"


def _en(name: str, relation: str, body: str, *, inferred: bool = False) -> Rule:
    return Rule(name, relation, re.compile("^" + body, re.IGNORECASE), inferred)


EN_RULES = [
    _en(
        "en_not_like",
        "dislikes",
        rf"i\s+{_ADV}(?:don't|do\s+not|dont|no\s+longer|never)\s+(?:(?:really|much|particularly|actually|even|"
        rf"ever|quite)\s+)*(?:like|love|enjoy|care\s+for|dig)\s+{_OBJ}",
    ),
    _en(
        "en_hate",
        "dislikes",
        rf"i\s+{_ADV}(?:hate|dislike|detest|loathe|can't\s+stand|cannot\s+stand)\s+{_OBJ}",
    ),
    _en(
        "en_not_fan",
        "dislikes",
        rf"{_IM}\s+{_ADV}(?:not|no\s+longer)\s+(?:(?:really|that|so|much\s+of)\s+)*(?:(?:a\s+)?(?:big\s+|huge\s+)?"
        rf"fan\s+of|into)\s+{_OBJ}",
    ),
    _en("en_like", "likes", rf"i\s+{_ADV}(?:like|love|enjoy|adore|prefer|dig)\s+{_OBJ}"),
    _en(
        "en_fan",
        "likes",
        rf"{_IM}\s+{_ADV}(?:(?:a\s+)?(?:big\s+|huge\s+|massive\s+)?fan\s+of|into|obsessed\s+with|crazy\s+about|"
        rf"passionate\s+about)\s+{_OBJ}",
    ),
    _en(
        "en_stopped_work",
        "stopped_working_on",
        rf"(?:{_IM}\s+{_ADV}(?:not|no\s+longer)\s+(?:working\s+on|building|developing)|i\s+{_ADV}(?:stopped|quit|"
        rf"have\s+stopped|'ve\s+stopped)\s+(?:working\s+on|building|developing)|i\s+{_ADV}(?:don't|do\s+not|"
        rf"no\s+longer)\s+work\s+on)\s+{_OBJ}",
    ),
    # Leaving a job, a home, a partner: the fact that held is retired (vocabulary.OPPOSITES), not
    # left standing beside what came next. Before the positive rules, as the other negations are.
    _en(
        "en_left_job",
        "no_longer_works_at",
        rf"(?:i\s+{_ADV}(?:quit|left)\s+my\s+(?:job|position|role)\s+(?:at|with)\s+|"
        rf"i\s+{_ADV}(?:don't|do\s+not|dont|no\s+longer)\s+work\s+(?:at|for)\s+|{_IM}\s+{_ADV}(?:not|no\s+longer)\s+"
        rf"working\s+(?:at|for)\s+|i\s+{_ADV}got\s+(?:fired|laid\s+off)\s+(?:from|by)\s+){_OBJ}",
    ),
    _en(
        "en_moved_away",
        "moved_away_from",
        rf"(?:i\s+{_ADV}(?:don't|do\s+not|dont|no\s+longer)\s+live\s+in|{_IM}\s+{_ADV}(?:not|no\s+longer)\s+living\s+in|"
        rf"i\s+{_ADV}moved\s+(?:out\s+of|away\s+from))\s+{_OBJ}",
    ),
    _en(
        "en_broke_up",
        "broke_up_with",
        rf"(?:i\s+{_ADV}(?:broke\s+up|split\s+up|separated)\s+with|{_IM}\s+{_ADV}(?:not|no\s+longer)\s+"
        rf"(?:dating|seeing|married\s+to)|i\s+{_ADV}(?:divorced|dumped))\s+{_OBJ}",
    ),
    _en(
        "en_works_at",
        "works_at",
        rf"(?:i\s+{_ADV}(?:work|am\s+working)\s+(?:at|for)|{_IM}\s+{_ADV}working\s+(?:at|for)|"
        rf"i\s+{_ADV}(?:got\s+a\s+job|started\s+a\s+(?:new\s+)?job)\s+at)\s+{_OBJ}",
    ),
    _en(
        "en_job",
        "job",
        rf"(?:i\s+{_ADV}work\s+as|{_IM}\s+{_ADV}working\s+as|i\s+{_ADV}(?:got\s+a\s+job|started)\s+as)"
        rf"\s+(?:an?\s+)?{_OBJ}",
    ),
    _en("en_age", "age", rf"(?:{_IM}\s+{_ADV}|i\s+{_ADV}turned\s+)(?P<obj>\d{{1,3}})(?:\s+years?\s+old)?$"),
    _en(
        "en_work",
        "works_on",
        rf"(?:{_IM}|i've\s+been|i\s+have\s+been|ive\s+been)\s+{_ADV}(?:working\s+on|building|developing|coding|"
        rf"designing|writing)\s+{_OBJ}",
    ),
    _en("en_work_on", "works_on", rf"i\s+{_ADV}work\s+on\s+{_OBJ}"),
    _en(
        "en_drop_plan",
        "dropped_plan",
        rf"(?:i\s+{_ADV}(?:don't|do\s+not|dont|no\s+longer)\s+(?:plan|intend)\s+(?:to|on)|{_IM}\s+{_ADV}(?:not|"
        rf"no\s+longer)\s+(?:planning|going|intending)\s+(?:to|on)|i\s+{_ADV}(?:gave\s+up|have\s+given\s+up|"
        rf"'ve\s+given\s+up|dropped|abandoned)\s+(?:on\s+)?(?:the\s+|my\s+)?(?:plan\s+to|idea\s+of|plans?\s+to))"
        rf"\s+{_OBJ}",
    ),
    _en(
        "en_plan",
        "plans",
        rf"(?:i\s+{_ADV}(?:plan|intend|aim|decided|have\s+decided|'ve\s+decided)\s+(?:to|on)|{_IM}\s+{_ADV}"
        rf"(?:planning|intending|aiming)\s+(?:to|on)|my\s+plan\s+is\s+to)\s+{_OBJ}",
    ),
    _en(
        "en_left",
        "left",
        rf"{_IM}\s+(?:no\s+longer\s+(?:at|in)\s+{_OBJ}|not\s+(?:at|in)\s+(?P<obj2>.+?)\s+any\s*more$)",
    ),
    _en(
        "en_at",
        "located_at",
        rf"{_IM}\s+(?:(?:currently|now|right\s+now|at\s+the\s+moment|still|already)\s+)+(?:at|in)\s+{_OBJ}",
    ),
    _en(
        "en_at_now",
        "located_at",
        rf"{_IM}\s+(?:at|in)\s+(?P<obj>.+?)\s+(?:right\s+now|now|at\s+the\s+moment|currently)"
        r"(?:\s+(?:for|with|on)\b.*)?$",
    ),
    _en(
        "en_live",
        "lives_in",
        rf"(?:i\s+{_ADV}(?:live|am\s+living)\s+in|{_IM}\s+{_ADV}living\s+in|i\s+{_ADV}(?:moved|have\s+moved|"
        rf"'ve\s+moved|relocated)\s+to)\s+{_OBJ}",
    ),
    _en(
        "en_concert",
        "likes",
        rf"i\s+{_ADV}(?:went\s+to|saw|attended|got\s+tickets\s+(?:for|to)|bought\s+tickets\s+(?:for|to))\s+"
        rf"(?:(?:a|an|the|another)\s+)?(?P<obj>[\w'&.\- ]{{1,40}}?)(?:'s)?\s+"
        rf"(?:concert|gig|show|festival)\b.*$",
        inferred=True,
    ),
]

_EN_FILLER = re.compile(
    r"^(?:so|well|btw|honestly|actually|also|and|but|oh|anyway|anyways|ok|okay|yeah|yes|yep|lol|haha|hey|hi|"
    r"hmm|um|uh|fun\s+fact|by\s+the\s+way|you\s+know\s+what|you\s+know|to\s+be\s+honest|tbh|fyi|guess\s+what|"
    r"plus)\b[\s,:!\-]*",
    re.IGNORECASE,
)
_EN_HEDGE = re.compile(
    r"^(?:i\s+think|i\s+guess|i\s+suppose|i\s+believe|i\s+feel\s+like|i'd\s+say|maybe|perhaps|probably|"
    r"apparently|it\s+seems)\b[\s,]*(?:that\s+)?",
    re.IGNORECASE,
)
_EN_HEDGE_INSIDE = re.compile(r"\b(?:probably|might|may|kinda|kind\s+of|sort\s+of)\b", re.IGNORECASE)
_EN_CUT = re.compile(
    r"\s+(?:because|cause|since|but|although|though|which|who|when|whenever|if|unless|so\s+that|so|"
    r"and\s+then|while|as\s+well\s+as|like\s+i\s+said|back\s+(?:in|then|when)|at\s+the\s+time|"
    r"growing\s+up|in\s+(?:19|20)\d\d|-\s)\b.*$",
    re.IGNORECASE,
)
# "Google as an engineer", "Lisbon until June", "Porto alone": the place, not what follows it.
_EN_CUT_PLACE = re.compile(
    r"\s*\(.*$|\s+(?:for|with|waiting|doing|to|as|until|till|since|alone|after|on\s+(?:a|my|the)\s+\w+)\b.*$"
    # "and moved to Leeds", "and I love it"; not "Procter and Gamble", "Trinidad and Tobago"
    r"|\s+and\s+(?-i:(?=[a-z]|I\b)).*$",
    re.IGNORECASE,
)
_EN_TAIL = re.compile(
    r"(?:\s+(?:anymore|any\s+more|now|right\s+now|these\s+days|nowadays|lately|recently|currently|"
    r"at\s+the\s+moment|today|tonight|a\s+lot|so\s+much|very\s+much|too|as\s+well|either|haha|lol|still|"
    r"again|really|next\s+(?:week|month|year|weekend)|this\s+(?:week|month|year|weekend)|tomorrow|soon|"
    r"someday|one\s+day|later|last\s+(?:week|month|year|weekend|night|summer|spring|fall|autumn|winter)|"
    r"(?:a|an|one|two|three|a\s+few|\d+)\s+(?:days?|weeks?|months?|years?|decades?)\s+ago))+$",
    re.IGNORECASE,
)
_EN_LEAD = re.compile(r"^(?:the|a|an|my|our|some)\s+", re.IGNORECASE)
_EN_PRONOUNS = frozenset(
    "it that this them you him her me us those these everything something anything nothing what how when "
    "where why who whom which there here one".split()
)
_EN_BAD_START = frozenset("about for with from at in on of if because and or but as by".split())

# --- Chinese ----------------------------------------------------------------------------------

_ZADV = (
    r"(?:真的|真|很|挺|特别|超级|超|非常|最|也|还|一直|比较|蛮|好|都|可能|也许|大概|好像|应该|确实|其实|"
    r"最近|现在|目前|正|这段时间|这阵子|这几天)*"
)
_ZH_VERB_START = re.compile(
    r"^(?:做|搞|弄|开发|写|学|看|玩|吃|忙|想|听|打|上班|上学|上课|等|准备|考虑|研究|找|用|跑|休息|睡|工作)"
)
_ZH_PLACE_TAIL = re.compile(r"(?:出差|工作|上班|上学|旅游|旅行|玩|度假|开会|读书|学习|呆着|待着)$")


def _zh(name: str, relation: str, body: str, *, inferred: bool = False) -> Rule:
    return Rule(name, relation, re.compile("^" + body), inferred)


ZH_RULES = [
    _zh(
        "zh_left_job",
        "no_longer_works_at",
        rf"我{_ZADV}(?:已经)?(?:从(?P<obj>.+?)离职了?$|不(?:再)?在(?P<obj2>.+?)(?:工作|上班)了$)",
    ),
    _zh(
        "zh_moved_away",
        "moved_away_from",
        rf"我{_ZADV}(?:已经)?(?:不(?:再)?住在(?P<obj>.+?)了$|搬离了?(?P<obj2>.+?)了?$)",
    ),
    _zh("zh_broke_up", "broke_up_with", rf"我{_ZADV}(?:和|跟)(?P<obj>.+?)分手了?$"),
    _zh(
        "zh_not_like",
        "dislikes",
        rf"我{_ZADV}(?:(?:已经|现在)?(?:不再|没那么|没有那么|再也不|不是很|不太|不怎么|不)(?:喜欢|爱)|讨厌|厌恶|受不了|"
        rf"反感){_OBJ}",
    ),
    _zh("zh_like", "likes", rf"我{_ZADV}(?:喜欢|爱|热爱|迷上了?|偏爱|钟爱)(?:上了?)?{_OBJ}"),
    _zh(
        "zh_stopped_work",
        "stopped_working_on",
        rf"我{_ZADV}(?:已经)?(?:不再(?:做|搞|开发|负责)(?P<obj>.+)$|"
        rf"(?:不|没)(?:在)?(?:做|搞|开发|负责)(?P<obj2>.+?)了$)",
    ),
    _zh("zh_work", "works_on", rf"我{_ZADV}(?:(?:正)?在(?:做|搞|弄|开发|写|忙|研究)|负责){_OBJ}"),
    _zh(
        "zh_drop_plan",
        "dropped_plan",
        rf"我{_ZADV}(?:已经)?(?:不打算|不准备|不计划|不再打算|放弃了?(?:计划)?)(?:要|去|再)?{_OBJ}",
    ),
    _zh("zh_plan", "plans", rf"我{_ZADV}(?:打算|计划|准备|决定)(?:要|去)?{_OBJ}"),
    _zh("zh_left", "left", r"我(?:已经)?(?:不在(?P<obj>.+?)了$|离开了?(?P<obj2>.+?)了?$)"),
    _zh(
        "zh_at",
        "located_at",
        rf"(?:(?:现在|目前|此刻)我|我(?:现在|目前|此刻|这会儿|人))(?:正|还|已经)?在{_OBJ}",
    ),
    _zh("zh_works_at", "works_at", rf"我{_ZADV}(?:在(?P<obj>.+?)(?:工作|上班|任职)$|入职了?(?P<obj2>.+)$)"),
    _zh(
        "zh_job",
        "job",
        rf"我{_ZADV}(?:是(?:一名|一个|个)?(?P<obj>.+?)(?:，|$)(?<=师|员|生|家|手|工)|是做(?P<obj2>.+?)的$)",
    ),
    _zh("zh_age", "age", r"我(?:今年)?(?P<obj>\d{1,3})岁(?:了)?$"),
    _zh("zh_live", "lives_in", rf"我{_ZADV}(?:住在|搬到了?|搬去了?){_OBJ}"),
    _zh(
        "zh_concert",
        "likes",
        r"我(?:昨天|今天|上周|刚|刚刚|前几天|周末)*(?:去|去看|看)了?(?:一场|一个|场)?(?P<obj>[^，。]{1,12}?)的?"
        r"(?:演唱会|音乐节|现场|livehouse)",
        inferred=True,
    ),
]

# "My partner is Sam", "my job is nursing": the speaker's own relation, although the clause starts
# like third-person talk ("my partner likes…"), so these are tried before that check.
OWN_RULES = [
    _en(
        "en_partner",
        "partner",
        r"(?:my\s+(?:partner|boyfriend|girlfriend|husband|wife|fianc[ée]e?|spouse)(?:'s\s+name)?\s+is|"
        rf"{_IM}\s+{_ADV}(?:dating|married\s+to|engaged\s+to|seeing))\s+{_OBJ}",
    ),
    _en(
        "en_my_job",
        "job",
        rf"my\s+(?:new\s+|current\s+)?(?:job|profession|occupation)\s+is\s+(?:an?\s+)?{_OBJ}",
    ),
    _en("en_my_age", "age", r"my\s+age\s+is\s+(?P<obj>\d{1,3})$"),
    # "Sam and I broke up": the speaker, though the clause opens with a name.
    _en(
        "en_we_broke_up",
        "broke_up_with",
        r"(?P<obj>\S+(?:\s\S+)?)\s+and\s+i\s+(?:just\s+|finally\s+)?(?:broke|split)\s+up\b(?!\s+(?:the|a|an)\b).*$",
    ),
    _zh(
        "zh_partner",
        "partner",
        r"我(?:的)?(?:男朋友|女朋友|男友|女友|老公|老婆|对象|伴侣|先生|太太)(?:叫|是)(?P<obj>.+)$",
    ),
    _zh("zh_my_job", "job", r"我(?:的)?(?:工作|职业)是(?P<obj>.+)$"),
]

_ZH_FILLER = re.compile(
    r"^(?:其实|对了|嗯+|哈哈+|说真的|话说|顺便说一下|老实说|不过|但是|而且|还有|另外|然后|所以)[，,\s]*"
)
_ZH_HEDGE = re.compile(r"^(?:我觉得|我感觉|感觉|好像|可能|也许|大概|估计|应该)[，,\s]*")
_ZH_HEDGE_INSIDE = re.compile(r"可能|也许|大概|好像|应该|估计")
_ZH_CUT = re.compile(r"(?:因为|但是|可是|不过|所以|而且|然后|的时候).*$")
_ZH_TAIL = re.compile(r"[了呢吧啊呀哦啦嘛哈~～!！。.…\s]+$")
_ZH_LEAD = re.compile(r"^(?:一个|一款|一场|一份|一些|一部|一本|一家|个)")
_ZH_PRONOUNS = frozenset("你 他 她 它 你们 他们 她们 这个 那个 这 那 这些 那些 自己 谁 什么 您".split())
_ZH_QUESTION = re.compile(
    r"(?:吗|么)[\s?？。!！~～]*$|什么|啥|谁|哪|为什么|为啥|怎么|怎样|如何|多少|几(?:个|年|月|天|点|号|岁|次|种)|"
    r"是不是|有没有|要不要|能不能|会不会|对不对|好不好"
)

_CLAUSES = re.compile(
    r"[,;，；:：]\s*|\s[-–—]\s|\s+(?:but|because|and\s+then|although|though|while)\s+|但是|可是|因为|不过|而且|"
    # "I work at the Ministry and I'm dating Jordan": two facts, not a ministry that dates.
    r"\s+and\s+(?=(?:i|i'm|im|i've|ive|my)\b)",
    re.IGNORECASE,
)
_SPACE_RUNS = re.compile(r"[ \t\u00a0\u3000]{2,}")
_APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "＇": "'"})


_BROKE_UP_NEXT = re.compile(r"i\s+(?:just\s+|finally\s+)?(?:broke|split)\s+up\b", re.IGNORECASE)


def _clauses(sentence: str) -> list[str]:
    """The sentence cut at :data:`_CLAUSES`, at "and I…" too ("I'm 30 and I live in Paris"), but
    for "Sam and I broke up", where the name is whom the speaker left."""
    clauses, start = [], 0
    for match in _CLAUSES.finditer(sentence):
        before = sentence[start : match.start()]
        if match.group().strip().lower() == "and" and _BROKE_UP_NEXT.match(sentence, match.end()):
            continue
        clauses.append(before)
        start = match.end()
    clauses.append(sentence[start:])
    return clauses


def asks(sentence: str) -> bool:
    """Whether the sentence is a question (it then states no fact)."""
    stripped = sentence.strip()
    if stripped.endswith(("?", "？")):
        return True
    if has_cjk(stripped):
        return bool(_ZH_QUESTION.search(stripped))
    return bool(is_question(stripped.lower()))


def extract(text: str) -> list[Fact]:
    """The facts ``text`` states about its author, in order, each once."""
    facts: list[Fact] = []
    seen: set[tuple[str, str]] = set()
    # What the author quotes or relays ("Alice told me: I moved to Berlin") is someone else's life.
    # Runs of spaces are one: the rules' patterns take time with the square of such a run.
    text = _SPACE_RUNS.sub(" ", text.translate(_APOSTROPHES))
    for sentence in sentences(without_relayed(text)):
        clauses = _clauses(sentence)
        if asks(clauses[0]):
            continue  # "Do you think I like rock, or not?": the whole sentence asks
        for clause in clauses:
            if asks(clause):
                continue  # "I like rock, do you?" / 我喜欢摇滚，你呢？: only the question is dropped
            fact = _clause_fact(clause)
            # A name a node cannot have (a NUL in the text) failed the message's whole write of
            # facts: that fact is left out, the others kept.
            if fact is None or not (is_node_name(fact.object) and is_node_name(fact.subject)):
                continue
            if (fact.relation, fact.object.lower()) not in seen:
                seen.add((fact.relation, fact.object.lower()))
                facts.append(fact)
    return facts


# A clause's closing punctuation and emoji: rules that end at the clause's end ("I'm 30", "I'm in
# Osaka now", 我在阿里巴巴工作) read nothing of "I'm 30." or 我在阿里巴巴工作。 otherwise.
_CLOSING = re.compile(r"[\s.!?~…。！？:;\-\u2600-\u27bf\U0001f000-\U0001faff\ufe0f]+$")


def _clause_fact(clause: str) -> Fact | None:
    body, hedged = _strip_lead(_CLOSING.sub("", clause.strip()))
    if not body:
        return None
    chinese = has_cjk(body[:2]) or body.startswith("我")
    rules = OWN_RULES + (ZH_RULES if chinese else EN_RULES)
    if third_person_start(body.lower()):
        rules = OWN_RULES
    for rule in rules:
        match = rule.pattern.match(body)
        if match is None:
            continue
        raw = match.group("obj") or (match.groupdict().get("obj2") or "")
        obj = _clean_zh(raw, rule.relation) if chinese else _clean_en(raw, rule.relation)
        prefix = body[: match.start("obj") if match.group("obj") else match.start("obj2")]
        if obj is None or not _fits(rule.relation, obj, prefix, chinese, raw, rule.name):
            return None
        inside = (_ZH_HEDGE_INSIDE if chinese else _EN_HEDGE_INSIDE).search(prefix) is not None
        speculative = rule.inferred or hedged or inside
        confidence = INFERRED if rule.inferred else HEDGED if speculative else EXPLICIT
        ago = _years_ago(rule.relation, body, chinese)
        return Fact(rule.relation, obj, speculative, confidence, rule.name, years_ago=ago)
    return None


# A partner is someone named ("my girlfriend is Sam", "I'm married to Ana Lima"), not what they
# do or are ("my girlfriend is moving to Berlin", "my wife is sick", "my husband is 45", "I'm dating
# someone who…"): the relation holds one value, and those replaced the name.
_NAME_PARTICLES = frozenset("de da del dos van von der la le di bin al".split())
# What follows "my girlfriend is" when it is not a name: chat is typed in lower case, so a name
# is told from these, not by its capital.
_EN_NOT_A_NAME = frozenset(
    "someone somebody nobody anyone sick ill pregnant amazing awesome great busy tired away here there home "
    "back mad angry upset sad happy fine ok okay cute beautiful pretty smart funny crazy annoying late out "
    "gone asleep best lovely perfect sweet nice kind jealous depressed gorgeous weird boring older younger "
    "taller shorter cool wonderful mine so very really too such not also still always never just the a an "
    "hot cold hungry sleepy drunk ready right wrong single married lucky done he she they him her them it "
    "myself yourself himself herself themselves again any abroad overseas downstairs upstairs vegan".split()
)
_NAMED = re.compile(r"(?:name\s+is|叫)\s*$", re.IGNORECASE)
# Many, not someone: "I'm dating apps again", "I broke up with friends".
_EN_PLURALS = frozenset(
    "friends apps guys girls people things clients results stars kids folks others men women".split()
)
_PAIRED = re.compile(
    r"\b(?:dating|married\s+to|engaged\s+to|(?:broke|split)\s+up\s+with|divorced)\s*$", re.IGNORECASE
)
_ZH_NOT_A_NAME = re.compile(r"[师员生家手工的人]$|^(?:一个|个|在|很|挺|太|有)")
# "my job is killing me / so boring / fine": how the job feels, not what it is.
_EN_NOT_A_JOB = frozenset(
    "me us him her them you so too very really pretty super kinda quite such boring fine ok okay great good "
    "bad hard tough awful terrible crazy insane fun exhausting tiring amazing horrible stressful annoying "
    "easy busy demanding hell rough chill cool nice weird lame draining killing done over gone".split()
)


# Where someone lives or works holds one value at a time, so what is not a place must not replace
# it: "I moved to a new team / the couch / Python 3", "I live in fear", "I work at home", "I'm in
# trouble now", "I'm in a meeting right now".
_EN_NOT_A_STATE = frozenset(
    "fear peace denial hope hell heaven harmony poverty luxury trouble love pain shock hurry luck charge "
    "debt danger doubt tears awe moment past present future mood zone process middle".split()
)
_EN_NOT_A_PLACE = {
    "located_at": _EN_NOT_A_STATE,
    "left": _EN_NOT_A_STATE,
    "moved_away_from": _EN_NOT_A_STATE,
    "no_longer_works_at": _EN_NOT_A_STATE
    | frozenset("home night nights weekends weekend free money".split()),
    "lives_in": _EN_NOT_A_STATE | frozenset("team couch bed floor sofa chair desk computer room".split()),
    "works_at": _EN_NOT_A_STATE
    | frozenset(
        "home night nights weekends weekend desk computer living pace loss reason change promotion age hour "
        "hours while bit cause".split()
    ),
}
_EN_SOME = re.compile(r"^(?:a|an|my|our|your|his|her|their|another|some)\s", re.IGNORECASE)
_EN_CAPITALISED = re.compile(r"[A-Z]")


_NEW_JOB = re.compile(
    r"\b(?:got|started|took|found|landed)\s+(?:a|my)\s+(?:new\s+)?job\s+(?:at|with)\s*$", re.I
)


def _place(obj: str, raw: str, said: str, relation: str) -> bool:
    if any(w.lower() in _EN_NOT_A_PLACE[relation] for w in obj.split()):
        return False
    # "a new team", "my parents' place": no city; but a workplace may be told so ("I started a new
    # job at a Porto startup" is where they work now).
    if _EN_SOME.match(raw.strip()) and not (relation == "works_at" and _NEW_JOB.search(said)):
        return False
    if obj.split()[0].lower() in ("same", "different", "other", "another"):
        return False  # "He and I work at the same company"
    if relation == "lives_in" and any(word.isdigit() for word in obj.split()):
        return False  # "I moved to Python 3"
    # A writer who capitalises ("I moved to…") names a city with a capital: "I moved to the new
    # office" is no move of home. All in lower case, a name cannot be told from a word.
    return relation != "lives_in" or not _EN_CAPITALISED.search(said) or obj[:1].isupper()


# "I like to think so", "I'd hate to say it": a way of speaking, not a liking.
_EN_MANNER = re.compile(r"^to\s+(?:think|say|believe|imagine|hope|know|see|admit|be\s+honest)\b", re.I)


# A move told as the past of a life ("I moved to Berlin 10 years ago", "… when I was 8", "back in
# 2010"): a one-value relation written as of the message replaced where someone lives now.
_EN_YEARS_AGO = re.compile(
    r"\b(?P<n>[2-9]|\d{2,}|two|three|four|five|six|seven|eight|nine|ten|many|several|a\s+few|some)\s+"
    r"(?P<unit>years|decades)\s+ago\b",
    re.IGNORECASE,
)
_EN_LONG_AGO = re.compile(
    r"\b(?:when\s+i\s+was|as\s+a\s+(?:kid|child|teen(?:ager)?|baby|student)|back\s+(?:in|then|when)|"
    r"growing\s+up|at\s+the\s+time|years\s+back)\b",
    re.IGNORECASE,
)
_ZH_YEARS_AGO = re.compile(r"(?P<n>\d+|[两三四五六七八九十几多])年前")
_ZH_LONG_AGO = re.compile(r"小时候|那时候|当时|以前")
_NUMBERS = {
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}
_NUMBERS |= {"两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
LONG_AGO_YEARS = (
    10.0  # "when I was 8", "back in the day", 小时候: long enough to be before any value said since
)
_ONE_VALUE = ("lives_in", "works_at", "job", "partner", "located_at")


def _years_ago(relation: str, clause: str, chinese: bool) -> float:
    """How many years before the message a one-value fact was told as holding (0: now)."""
    if relation not in _ONE_VALUE:
        return 0.0
    counted = (_ZH_YEARS_AGO if chinese else _EN_YEARS_AGO).search(clause)
    if counted is not None:
        n = counted.group("n").lower()
        years = float(n) if n.isdigit() else float(_NUMBERS.get(n, 3))
        return years * (10 if counted.groupdict().get("unit", "").lower() == "decades" else 1)
    return LONG_AGO_YEARS if (_ZH_LONG_AGO if chinese else _EN_LONG_AGO).search(clause) else 0.0


def _fits(relation: str, obj: str, said: str, chinese: bool, raw: str = "", rule: str = "") -> bool:
    """Whether ``obj`` can be a value of ``relation``; ``said`` is the clause before the object."""
    if relation in PLACES and not chinese:
        return _place(obj, raw, said, relation)
    if relation in ("partner", "broke_up_with"):
        named = _NAMED.search(said) is not None  # "my girlfriend's name is…", 我女朋友叫…
        paired = _PAIRED.search(said) is not None or rule == "en_we_broke_up"
        if chinese:
            return len(obj) <= 4 and (named or _ZH_NOT_A_NAME.search(obj) is None)
        if re.match(r"(?:a|an|the|my|our|another|some)\s", raw.strip(), re.IGNORECASE):
            return False  # "my wife is a doctor", "… is the best"
        words = obj.split()
        if not 1 <= len(words) <= 3 or any(not w.replace("-", "").replace("'", "").isalpha() for w in words):
            return False  # "45", "moving to Berlin next month"
        if words[0].lower() in _EN_NOT_A_NAME:
            return False  # "He and I broke up", "I'm dating myself lol"
        if words[0][0].isupper():
            return all(w[0].isupper() or w in _NAME_PARTICLES for w in words)
        # In lower case only a name said to be one, or whom one dates or married: "my wife is
        # abroad", "I'm seeing friends tonight", "I'm dating apps again" name no one.
        return named or (
            paired
            and len(words) == 1
            and words[0].lower() not in _EN_PLURALS
            and not words[0].endswith(("ing", "ed", "ly"))
        )
    if relation == "job" and not chinese:
        return not any(word.lower() in _EN_NOT_A_JOB for word in obj.split()[:2])
    if relation in ("likes", "dislikes") and not chinese:
        return _EN_MANNER.match(obj) is None
    return True


def _strip_lead(clause: str) -> tuple[str, bool]:
    hedged = False
    while True:
        for pattern, is_hedge in (
            (_EN_FILLER, False),
            (_ZH_FILLER, False),
            (_EN_HEDGE, True),
            (_ZH_HEDGE, True),
        ):
            match = pattern.match(clause)
            if match and match.end() > 0:
                clause = clause[match.end() :].strip()
                hedged = hedged or is_hedge
                break
        else:
            return clause, hedged


def _clean_en(raw: str, relation: str) -> str | None:
    if len(raw.split()) > 4 * MAX_WORDS:
        return None  # far past what an object may be; the loops below are not for thousands of words
    obj = raw.strip().rstrip(".!?~… ")
    obj = _EN_CUT.sub("", obj)
    if relation in PLACES:
        obj = _EN_CUT_PLACE.sub("", obj)
    previous = None
    while previous != obj:
        previous = obj
        obj = _EN_TAIL.sub("", obj).strip().rstrip(".!?~…, ")
        obj = _EN_LEAD.sub("", obj)
    words = obj.split()
    if not words or len(words) > MAX_WORDS or "?" in obj:
        return None
    first = words[0].lower()
    # "US", "IT" are names, not pronouns.
    if (first in _EN_PRONOUNS and not (len(words[0]) > 1 and words[0].isupper())) or first in _EN_BAD_START:
        return None
    return third_person(obj)


def _clean_zh(raw: str, relation: str) -> str | None:
    obj = _ZH_CUT.sub("", raw.strip())
    obj = _ZH_TAIL.sub("", obj)
    if relation in PLACES:
        if _ZH_VERB_START.match(obj):
            return None  # 我现在在上班: doing, not somewhere
        obj = _ZH_PLACE_TAIL.sub("", obj)
    obj = _ZH_LEAD.sub("", obj).strip()
    if not obj or len(obj) > MAX_ZH_CHARS or obj in _ZH_PRONOUNS or "？" in obj or "?" in obj:
        return None
    return third_person(obj)
