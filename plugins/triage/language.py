"""Language helpers for the triage rules: normalization, clauses, questions, person, negation."""

from __future__ import annotations

import re

FIRST_PERSON_EN = (
    r"\b(?:i|i'm|im|i've|ive|i'd|i'll|me|my|mine|myself|we|we're|we've|we'd|we'll|our|ours|us)\b"
)
FIRST_PERSON_ZH = r"我|咱"
_FIRST_PERSON = re.compile(FIRST_PERSON_EN + "|" + FIRST_PERSON_ZH)

_APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "＇": "'", "“": '"', "”": '"'})
_SPACES = re.compile(r"\s+")
_SENTENCES = re.compile(r"(?<=[.!?。！？…])\s*|\n+")
_CLAUSES = re.compile(r"[;；，,]\s*|\s+(?:but|and then|so|because|although|though|while)\s+|[—–]+|\s-\s")

_SUBJECT = (
    r"(?:you|u|ya|he|she|they|it|we|i|anyone|anybody|someone|somebody|everyone|the|this|that|there|ur|your)"
)
_QUESTION_START = re.compile(
    r"^(?:(?:so|and|but|hey|ok|okay|well|um|lol|btw|also)[ ,]+)?"
    r"(?:(?:what|what's|whats|why|how|how's|when|where|where's|who|who's|which|whose|any idea|anyone know)\b|"
    rf"(?:did|do|does|didn't|don't|doesn't|have|has|haven't|had|are|aren't|is|isn't|was|wasn't|were|will|"
    rf"won't|would|wouldn't|should|shouldn't|could|couldn't|can|can't|may|shall) {_SUBJECT}\b)"
)
# "what matters most to me is ...", "what i need is ...": a statement that starts with "what".
_CLEFT = re.compile(
    r"^(?:(?:and|but|so|honestly|really)[ ,]+)?what "
    r"(?!(?:is|was|are|were|do|does|did|should|would|could|can|will|if|about|time|day|date|year|month|"
    r"kind|sort|type)\b)(?:[\w']+ ){1,6}(?:is|was)\b"
)
_STATEMENT_START = re.compile(r"^(?:i|i'm|im|i've|ive|we|we're|my|our|me)\b")
_QUESTION_END_ZH = re.compile(r"(?:吗|呢|么|嘛|没有|没)[\s?？。!！~～]*$")
# 几 asks "how many" except in 这几年 / 前几天 / 好几次 ("these few years", "a few days ago").
_INTERROGATIVE_ZH = re.compile(
    r"多少|哪(?:里|儿|个|些|条|位|年|天|国|种)?|什么|啥|谁|为什么|为啥|怎么|怎样|如何|有多(?:长|高|远|大|重|久|深|宽)|"
    r"(?<![这那前后好十头最])几(?:个|年|月|天|点|号|岁|次|种|条|位)"
)
_FACTUAL_START = re.compile(
    r"^(?:(?:so|and|but|hey|ok|okay|btw|also|quick question)[ ,:]+)?"
    r"(?P<ask>what|what's|whats|who|who's|whom|whose|where|where's|when|which|"
    r"how (?:many|much|long|far|old|big|tall|fast|often|deep|high|do you say|does)|"
    r"why (?:is|are|do|does|did|was|were)|is (?:the|a|an|there)|"
    r"is it true|convert|calculate|spell|"
    r"are (?:the|there)|was (?:the|a|an|there)|were (?:the|there)|does (?:the|a|an)|do (?:the|cats|dogs|"
    r"people)|did (?:the|a|an)|can (?:a|an|the|cats|dogs|you tell me)|define|explain|translate)\b"
)
_AUXILIARY_START = re.compile(r"(?:is|are|was|were|does|do|did|can)\b")
# "还没想好选哪个专业": a question embedded in a statement about oneself, not a question.
_EMBEDDED_QUESTION_ZH = re.compile(
    r"(?:想好|知道|确定|决定|记得|清楚|纠结|考虑|看看|想想|不懂|搞不懂).{0,8}(?:哪|什么|怎么|多少|谁|几)"
)
_ADVICE_ZH = re.compile(
    r"要注意什么|注意些什么|该怎么办|怎么办|有什么建议|求推荐|求建议|该选哪|选哪个好|"
    r"(?:要|该|应该|得)(?:带|买|送|准备|穿|说)(?:点|些)?(?:什么|啥)"
)
_TAG_QUESTION = re.compile(r"[, ](?:right|correct|isn't it|aren't they|don't they|doesn't it|no)\s*\?+$")
_FACTUAL_A_NOT_A = re.compile(r"是不是|有没有|对不对")
_A_NOT_A = re.compile(r"是不是|有没有|要不要|能不能|会不会|对不对|好不好|可不可以|行不行")

NEGATION_EN = re.compile(
    r"\b(?:not|no|never|n't|haven't|hasn't|hadn't|didn't|don't|doesn't|can't|cannot|couldn't|won't|"
    r"wouldn't|isn't|aren't|wasn't|weren't|yet to|have yet|hardly|barely|nobody|nothing)\b|n't\b"
)
NEGATION_ZH = re.compile(r"(?:没有|没|不|未|别|还没|无法|并非)$")

HYPOTHETICAL_EN = re.compile(
    r"\b(?:if|unless|whether|maybe|perhaps|might|may|could|would|should|thinking about|thinking of|"
    r"considering|consider|planning to|plan to|planning on|hoping to|hope to|want to|wanna|wish to|"
    r"going to|gonna|will|'ll|about to|trying to|try to|someday|one day|tomorrow|next week|next month|"
    r"next year|in case|supposed to|need to|have to|hard to|easy to|how to|when you|suppose|imagine|"
    r"every time|everytime|whenever|always|usually|each time)\b"
)
HYPOTHETICAL_ZH = re.compile(
    r"如果|要是|假如|假设|万一|可能|也许|或许|大概|打算|准备|想要|考虑|将来|以后|明天|下周|下个月|明年|"
    r"该不该|要不要|能不能|会不会|是否|想不想|希望|需要|得去|应该会|每次|每当|总是|一到|要做|等我|等到|到时候"
)

THIRD_PERSON_START_EN = re.compile(
    r"^(?:(?:so|and|but|well|ok|okay|lol|omg|guess what|btw|also|yesterday|today|last \w+)[ ,]+)*"
    r"(?:he|she|they|he's|she's|they're|it|his|her|their|people|everyone|everybody|someone|somebody|"
    r"nobody|you|you're|you've|your|a friend|a coworker|a colleague|this guy|this girl|"
    r"(?:my|our) (?:\w+ )?(?:friend|friends|brother|sister|mom|mother|mum|dad|father|parents|wife|husband|"
    r"boss|colleague|colleagues|coworker|coworkers|son|daughter|partner|boyfriend|girlfriend|roommate|"
    r"cousin|uncle|aunt|grandma|grandpa|grandmother|grandfather|kid|kids|team|manager|neighbor|neighbour|"
    r"teacher|classmate|classmates|family|bf|gf|bff|buddy|sis|bro|niece|nephew|client|landlord|"
    r"doctor|therapist|ceo|founder|company|coach|principal|professor|supervisor|lead|in-laws|grandparents))\b"
)
# "sarah has ...", "jake finally ...": a name as the subject. An abstract noun looks the same
# ("loyalty is worth more than talent"), so value judgements skip this check.
NAMED_START_EN = re.compile(
    r"^(?:(?:so|and|but|well|ok|okay|lol|omg|guess what|btw|also|yesterday|today|last \w+)[ ,]+)*"
    r"(?!(?:i|we|i've|we've|i'm|just|finally|so|and|today|tonight|yesterday|this|that|there|here|then|also|"
    r"life|everything|nothing)\b)[a-z]+ (?:has|had|is|was|just|finally)\b"
)
THIRD_PERSON_START_ZH = re.compile(
    r"^(?:昨天|今天|刚才|上周|听说)?(?:他|她|他们|她们|它|你|您|你们|别人|大家|有人|人们|"
    r"(?:同事|朋友|老板|室友|同学|老婆|老公|儿子|女儿|老妈|老爸|爸妈|领导|邻居|表哥|表姐|闺蜜|哥们)(?!们?和我)|"
    r"我(?:的)?(?:朋友|好友|闺蜜|哥们|哥哥|哥|姐姐|姐|弟弟|弟|妹妹|妹|妈妈|妈|爸爸|爸|父母|老婆|老公|同事|老板|"
    r"领导|儿子|女儿|室友|男朋友|女朋友|男友|女友|家人|同学|表哥|表姐|表妹|表弟|堂哥|堂姐|堂妹|堂弟|老师|邻居|孩子|客户|"
    r"爷爷|奶奶|外婆|外公|姥姥|姥爷|舅舅|叔叔|阿姨|姑姑|侄子|侄女|外甥|外甥女|太太|先生|对象|师傅|学生|上司))"
)


def normalize(text: str) -> str:
    return _SPACES.sub(" ", text.translate(_APOSTROPHES).strip().lower())


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCES.split(text) if s and s.strip()]


def clause_at(sentence: str, position: int) -> tuple[str, int]:
    """The clause of ``sentence`` that contains ``position``, and the offset where it starts."""
    start = 0
    for match in _CLAUSES.finditer(sentence):
        if match.start() > position:
            break
        if match.end() <= position:
            start = match.end()
    end = len(sentence)
    for match in _CLAUSES.finditer(sentence, position):
        end = match.start()
        break
    return sentence[start:end], start


def is_question(text: str) -> bool:
    stripped = text.strip()
    if not stripped or (_CLEFT.match(stripped) and not stripped.endswith(("?", "？"))):
        return False
    if stripped.endswith(("?", "？")):
        # "i went from dreading mondays to loving them??" is an exclamation, not a question.
        return not _STATEMENT_START.match(stripped) or bool(_QUESTION_START.match(stripped))
    return bool(
        _QUESTION_START.match(stripped)
        or _QUESTION_END_ZH.search(stripped)
        or _A_NOT_A.search(stripped)
        or (has_cjk(stripped) and _INTERROGATIVE_ZH.search(stripped) and not stripped.endswith(("。", "！")))
    )


def is_factual_question(text: str) -> bool:
    """A question about the world (not about the speaker's own life): starts like a quiz question,
    or in Chinese asks with an interrogative word."""
    stripped = text.strip()
    start = _FACTUAL_START.match(stripped)
    asked = stripped.endswith(("?", "？"))
    # "did a 10k run today" is a statement with its subject left out: an auxiliary start asks only
    # with a question mark; "who wrote 1984" asks without one.
    if start and (asked or (len(stripped) < 80 and not _AUXILIARY_START.match(stripped, start.start("ask")))):
        return True
    if _TAG_QUESTION.search(stripped):
        return True
    if not has_cjk(stripped) or _ADVICE_ZH.search(stripped):
        return False
    return bool(
        (_INTERROGATIVE_ZH.search(stripped) and not _EMBEDDED_QUESTION_ZH.search(stripped))
        or stripped.endswith(("?", "？"))
        or _QUESTION_END_ZH.search(stripped)
        or _FACTUAL_A_NOT_A.search(stripped)
    )


def first_person(text: str) -> bool:
    return bool(_FIRST_PERSON.search(text))


def third_person_start(clause: str, *, names: bool = True) -> bool:
    """Whether ``clause`` starts with someone other than the speaker; ``names=False`` leaves out
    the "<word> is/has ..." check for names."""
    clause = clause.strip()
    return bool(
        THIRD_PERSON_START_EN.match(clause)
        or THIRD_PERSON_START_ZH.match(clause)
        or (names and NAMED_START_EN.match(clause))
    )


_CJK = re.compile("[\u4e00-\u9fff]")


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None
