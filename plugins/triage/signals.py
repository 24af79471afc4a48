"""Layer 3: does a message mark a moment worth a scene, and of which type?

A keyword is never enough. A match counts only when the clause that holds it is about the
speaker (first person, or no subject at all as in "finally done!"), is a statement (not a
question), is real (not a hypothetical, a plan or a wish) and is not negated. The embedding
check against prototype sentences (see ``prototypes.py``) comes after, in the plugin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from narrmem_plugins.triage.language import (
    HYPOTHETICAL_EN,
    HYPOTHETICAL_ZH,
    NEGATION_EN,
    NEGATION_ZH,
    clause_at,
    is_question,
    normalize,
    sentences,
    third_person_start,
)
from narrmem_plugins.triage.relayed import without_relayed

SCENE_TYPES = ("decision", "value", "emotional_turn", "milestone", "first_time", "regret")

CATEGORY = {
    "decision": "decision",
    "value": "preference",
    "emotional_turn": "emotion_change",
    "milestone": "milestone",
    "first_time": "milestone",
    "regret": "general",
    None: "general",
}

_FEELING_EN = (
    r"hat\w*|lov\w*|lik\w*|scared|afraid|terrified|fear\w*|anxious|anxiety|calm\w*|happy|sad|depress\w*|"
    r"hope\w*|confident|insecure|angry|grateful|excit\w*|bored|nervous|relax\w*|miserable|content|lost|"
    r"motivated|numb|lonely|proud|asham\w*|dread\w*|enjoy\w*|joy|despair|panic\w*|peace\w*|awful|"
    r"broken|whole|okay|ok|fine|better|worse|worried|stressed|burn\w* out|overwhelmed|resent\w*|"
    r"excited|curious|indifferent|obsess\w*|comfortable|uncomfortable|shy|open|closed|cynical|optimistic|"
    r"cry\w*|cried|laugh\w*|smil\w*|look\w* forward|bor\w*|"
    r"pessimistic|skeptical|sceptical|embrac\w*|accept\w*|avoid\w*|dislik\w*|tolerat\w*|apprecia\w*|"
    r"jealous|envious|bitter|insecure|shy"
)
_FEELING_ZH = (
    r"讨厌|喜欢|害怕|焦虑|平静|开心|难过|绝望|希望|紧张|放松|自信|自卑|迷茫|爱上|享受|抗拒|排斥|接受|恐惧|"
    r"痛苦|快乐|期待|失望|愤怒|释然|坦然|热爱|厌倦|抵触|怕|爱|恨|烦|乐在其中|不安|安心|踏实|无聊|酷刑|难受|"
    r"离不开|上瘾|痛恨|头疼|崩溃|哭|不敢"
)

# Each pattern: (type, strength, compiled regex, negation-is-part-of-pattern).
_PATTERNS: list[tuple[str, float, re.Pattern[str], bool]] = []


def _add(kind: str, strength: float, pattern: str, negation_inside: bool = False) -> None:
    _PATTERNS.append((kind, strength, re.compile(pattern), negation_inside))


# Order matters only for ties: the stronger, more specific type wins (see ``detect``).
_add(
    "regret",
    0.9,
    r"\b(?:shouldn't have|should not have|should've never|should never have|shouldnt have|regret\w*|"
    r"wish i(?: had| hadn't| hadnt| didn't| had not| could have| would have|'d)|if only i (?:had|hadn't|could)|"
    r"\bi should(?:'ve| have) (?:\w+ed|been|done|gone|known|taken|told|said|left|stayed|seen|spent|kept|"
    r"bought|sold|quit|gotten|got)\b|my mistake was|(?:my |the )?biggest mistake (?:of my life |i (?:ever )?made )?was|i messed up|i screwed up|i blew it|i feel (?:so )?(?:bad|terrible|awful|"
    r"guilty) (?:about|for|that)|lesson learned)\b",
    negation_inside=True,
)
_add("regret", 0.9, r"后悔|真不该|悔不当初|早知道|要是当初|当初要是|如果当初|内疚|愧疚", negation_inside=True)
_add(
    "regret",
    0.8,
    r"(?:^|我|我们|昨天|今天|那天|刚才|当时|当初)(?:真的|实在|确实)?不(?:应|)该.{1,30}(?:的|了)[\s。.!！…]*$",
    negation_inside=True,
)
_add(
    "emotional_turn",
    0.9,
    rf"\bfrom (?:being |feeling )?(?:\w+ ){{0,2}}(?:{_FEELING_EN})\b.{{0,40}}?\bto (?:being |feeling )?"
    rf"(?:\w+ ){{0,2}}\w+|\bfrom (?:\w+ ){{0,3}}to (?:being |feeling )?(?:\w+ ){{0,2}}(?:{_FEELING_EN})\b",
)
_add(
    "emotional_turn",
    0.85,
    rf"\bused to (?:\w+ ){{0,4}}(?:{_FEELING_EN})\b.{{0,80}}\b(?:now|these days|nowadays|anymore|no longer|"
    rf"today)\b|\bi'?m no longer (?:\w+ )?(?:{_FEELING_EN})\b|"
    rf"\bi'?m not (?:\w+ ){{0,2}}(?:{_FEELING_EN})\b.{{0,60}}\bany ?more\b|\bi (?:don't|do not) (?:\w+ )?(?:{_FEELING_EN})"
    rf"\b.{{0,30}}\banymore\b|\b(?:i've|i have) come to (?:love|accept|enjoy|appreciate|terms)\b|"
    rf"\b(?:i|i've|i have) (?:finally )?(?:fell in love with|grew to (?:love|like|accept)|started to (?:love|enjoy|like|accept)|"
    rf"changed my mind about|made (?:my )?peace with)\b|\bused to (?:think|find|feel|believe|consider|see)\b"
    rf".{{0,80}}\b(?:now|these days|nowadays|anymore)\b|\b(?:i've|i have|i) (?:finally )?(?:forgiven|forgave|"
    rf"let go of|moved on from|gotten over|got over|overcome|overcame)\b|\bi finally feel (?:at peace|happy|okay|ok|better|"
    rf"like myself|free|calm|confident)\b",
    negation_inside=True,
)
_add(
    "emotional_turn",
    0.9,
    rf"从.{{0,20}}(?:{_FEELING_ZH}).{{0,20}}(?:到|变成|变得|转为).{{0,12}}|从.{{0,20}}(?:到|变成|变得).{{0,12}}"
    rf"(?:{_FEELING_ZH})|以前.{{0,24}}(?:{_FEELING_ZH}).{{0,24}}(?:现在|如今|后来|这几年)|"
    rf"(?:以前|过去|原来|曾经)我?(?:总|一直)?(?:觉得|认为|以为|很|特别|超).{{0,30}}(?:现在|如今|后来)|"
    rf"不再(?:那么)?(?:{_FEELING_ZH})|再也不(?:怕|讨厌|恨|焦虑)|(?:爱上了|慢慢喜欢上|开始喜欢上?了|释然了|想开了|放下了)",
    negation_inside=True,
)
_add(
    "value",
    0.85,
    r"\bmore important (?:to me )?than\b|\bmatters? (?:\w+ )?(?:more|most)\b|\bis worth more (?:to me )?than\b|"
    r"\b[a-z]+ ?>+ ?[a-z]+\b|"
    r"\bmore valuable than\b|\bcare (?:\w+ )?(?:more|most) about\b|\bvalue\w* .{1,40}? (?:over|more than|above)\b|"
    r"\bprefer .{1,40}? over\b|\bnothing is more important than\b|\bthe (?:most )?important thing "
    r"(?:is|in life|for me|to me)\b|\bwhat (?:really |truly )?matters (?:is|to me|most)\b|"
    r"\bi(?:'d| would) rather .{1,40}? (?:than|and have|instead)\b|\b(?:is|are) (?:my|the) (?:top |number one |first )?priority\b|"
    r"\bprioriti[sz]e .{1,40}? over\b|\bfor me,? .{1,40}?\b(?:beats|trumps|outweighs|comes before)\b|"
    r"\b(?:always |will always )?comes? first\b",
)
_add(
    "value",
    0.85,
    r"比.{1,24}?(?:更重要|重要|更有意义|更值得|更关键|更珍贵|更要紧)|最重要的是|对我来说.{0,12}(?:最重要|更重要|意义)|"
    r"(?:^|[，,])[^，,。]{1,8}?(?:才是)?最(?:重要|要紧)(?:[了的啊吧]|[。！!，,]|$)|我更在乎|我更看重|我更在意|宁(?:可|愿).{1,24}也不|(?:是|才是)(?:我的)?第一位|才是最重要的",
)
_add(
    "decision",
    0.9,
    r"\b(?:decided|decide|made (?:up )?my mind|made the (?:call|decision)|made a decision|chose|"
    r"have chosen|'ve chosen|settled on|opted (?:for|to)|gave up(?: on)?|giving up(?: on)?|quit|"
    r"from now on|handed my (?:notice|resignation) in|(?:i'm|i am) (?:finally )?leaving my (?:job|company|position|team|"
    r"husband|wife|partner|boyfriend|girlfriend)|turning down (?:the|their|an|a|that|this|my)|(?:told|informed) (?:my )?(?:boss|manager|team|landlord|"
    r"parents|family)(?: today| yesterday| that)* i(?:'m| am) (?:leaving|quitting|resigning|moving out)|"
    r"quitting|resigned|handed in my (?:notice|resignation)|turned down|accepted (?:the|their|an|that|a) "
    r"(?:offer|job|position|proposal)|signed (?:the|a) (?:contract|lease|offer)|broke up with|"
    r"dropped out|dropping out|(?:i'm|i am|we're|we are) going with|(?:i'll|i will) go with|"
    r"went with|committed to|said (?:yes|no) to|picked (?:the|option))\b|^(?:going|gonna go) with\b",
)
_add(
    "decision",
    0.9,
    r"决定|下定决心|最终选择|最后选择|选择了|放弃了|辞职了|提了辞职|递了辞呈|不干了|分手了|退学了|"
    r"提了离职|提离职了|退出了|(?:最后|最终)(?:还是)?选了|我还是选了|把.{1,12}?(?:拒了|辞了)|拒绝了.{0,8}(?:offer|工作|邀请|机会)|接受了.{0,8}(?:offer|工作|邀请|机会)|签了.{0,6}(?:合同|约)|定了[,，]",
)
_add(
    "milestone",
    0.9,
    r"\b(?:finally|at last|officially)\b.{0,24}\b(?:finished|completed|graduated|passed|shipped|launched|"
    r"released|published|submitted|defended|paid off|achieved|made it|did it|done|got|hit|reached|"
    r"crossed|won|bought|moved|signed)\b|\b(?:just |)(?:finished|completed|submitted|defended|ran) (?:my|our|the) "
    r"(?:(?:very )?first )?(?:half |full )?(?:thesis|dissertation|degree|phd|master'?s|project|novel|book|first draft|manuscript|marathon|"
    r"course|certification|bootcamp|album|app|renovation|report)\b|\bgraduated(?: from)?\b|\bgot "
    r"(?:promoted|engaged|married|hired|accepted|tenure|my (?:license|licence|degree|phd|visa|green card|"
    r"citizenship|black belt))\b|\b(?:we|i) (?:just )?(?:shipped|launched|released|published)\b|\bpassed "
    r"(?:my|the) (?:\w+ )?(?:exam|test|bar|boards|driving test|defense|defence)\b|\bi did it\b|"
    r"\bbought (?:my|our) first\b|\bpaid off (?:my|the|our)\b|\bhit \d[\d,.]* ?(?:k|subscribers|users|"
    r"followers|stars|downloads|customers)\b|\b\d+ (?:days|weeks|months|years) (?:sober|clean|smoke[- ]free)\b",
)
_add(
    "milestone",
    0.9,
    r"终于.{0,12}(?:完成|做完|写完|毕业|拿到|通过|上线|发布|搞定|考过|考上|买了|实现|达成|跑完|成功|做到|还清|"
    r"投出去|交上去|提交了|寄出去|发出去|开业|开张|出版|攒够|存够|还完)|(?:店|工作室|公司)(?:今天|终于|正式)?(?:开业|开张|上市)了|"
    r"(?:书|专辑|小说|论文)(?:终于|正式)?(?:出版|发表)了|"
    r"终于把.{1,24}了|"
    r"(?:完成|写完|做完|跑完)了.{0,8}(?:论文|项目|报告|比赛|马拉松|课程|作品|书|毕设|初稿)|毕业了|升职了|转正了|"
    r"拿到了.{0,8}(?:offer|证|学位|驾照|签证|录取)|发布了第一|正式上线|上线了|订婚了|结婚了|领证了|"
    r"(?:考过|通过)了.{0,8}(?:考试|面试|答辩|考核)|答辩通过|(?:还清|付清)了",
)
_add(
    "first_time",
    0.9,
    r"\bnever (?:been|done|tried|seen|had|eaten|felt|ridden|driven|flown|played|sung|spoken) (?:\w+ ){1,4}before "
    r"(?:today|tonight|this (?:week|weekend|morning|year|trip))\b|"
    r"\b(?:for the (?:very )?first time|(?:my )?first time (?:ever|in my life|in (?:years|ages|forever)|i|i've|"
    r"i have|that i|\w+ing)|the first time i|"
    r"first[- ]ever|never (?:done|tried|been|seen|had|eaten|felt) (?:this|that|it|anything like (?:this|that)|"
    r"\w+) before)\b|\bmy (?:very )?first (?!thought|reaction|question|guess|impression|instinct|choice|"
    r"name|language|time)\w+",
)
_add("first_time", 0.9, r"第一次|头一回|头一次|首次|生平第一|人生第一")

_EXPLICIT = re.compile(
    r"^(?:(?:please|pls|plz|hey|ok|okay|and|also|btw)[ ,]+)*(?:remember|don't forget|do not forget|"
    r"never forget|note (?:that|this|down)|keep in mind|make a note|save (?:this|that))\b|\b(?:please|pls|you should|can you|"
    r"could you|i want you to|i need you to) (?:remember|note|keep in mind|make a note|save)\b|"
    r"(?:^|请|帮我|你要|你得|一定要|务必)(?:记住|记一下|记下来|记下)|别忘了|不要忘了|千万别忘"
)
_NOT_EXPLICIT = re.compile(
    r"\b(?:can't|cannot|couldn't|don't|do not|did you|do you|i|you) (?:even )?remember\b(?! (?:this|that))|"
    r"记不住|不记得|记得吗|还记得|记住了"
)

_SCHEDULED = re.compile(
    r"^[\w' ]{0,20}?\b(?:starts|begins|is (?:tomorrow|next|on|at)|will|tomorrow|next (?:week|month|year))\b"
)
_ROUTINE = re.compile(r"\b(?:again|as usual|like every|every (?:day|week|month))\b|又|照常|照例")

# "tonight was my first stand-up set": the subject is a time, the moment the speaker's.
_OWN_FIRST = re.compile(r"\b(?:was|is|'s) (?:my|our) (?:very )?first\b")
# "tom regrets selling his guitar": a scene verb in the third person singular has someone else as
# its subject ("i" never takes the -s).
_SOMEONE_ELSES = re.compile(r"(?:regrets|decides|chooses|wishes)\b")
# 我从来没觉得钱比家人重要: the judgement is denied, however far before the match the 没 is.
_DENIED_JUDGEMENT_ZH = re.compile(r"(?:不|没|没有|从来?没|从不|并不|并没有?)(?:觉得|认为|以为|感觉)")

PRIORITY = {"regret": 6, "emotional_turn": 5, "value": 4, "decision": 3, "milestone": 2, "first_time": 1}


@dataclass(frozen=True)
class Signal:
    type: str | None
    strength: float
    sentence: str
    explicit: bool
    reason: str


# The same request in the other languages bots most often hear (Russian, Ukrainian, German,
# French, Spanish, Portuguese, Italian, Turkish, Japanese, Korean, Arabic, Hindi): "Запомни: …"
# was kept as any message, at 0.30, where "remember: …" is a moment at 0.9 or more. As in
# English, the request opens its sentence (after a "please", a name and a comma): inside one it is
# a quote, a title or a statement ("mi abuela recuerda que…", "ich denk daran, …"). Japanese and
# Korean end a sentence with it, and "thanks for remembering" (覚えておいてくれて, 기억해 줘서)
# is none. A question is never a request.
_PLEASE_OTHER = (
    r"(?:(?:пожалуйста|будь добр|bitte|s'il te plaît|s'il vous plaît|por favor|per favore|lütfen|"
    r"ну|и|а|ok|okay|hey),?\s+|[^\W\d_]{2,20},\s+)"  # a please, or a name and its comma
)
_EXPLICIT_OTHER = re.compile(
    rf"^(?:{_PLEASE_OTHER})?(?:запомни(?:те)?|не забудь(?:те)?|имей(?:те)? в виду|запам'ятай(?:те)?|"
    r"merk (?:dir|euch)|merken sie sich|vergiss (?:das )?nicht|vergessen sie nicht|denk(?: bitte)? daran|"
    r"souviens-toi|souvenez-vous|rappelle-toi|n'oublie pas|n'oubliez pas|retiens (?:que|bien)|"
    r"acuérdate|recuerda que|no (?:te )?olvides|ten en cuenta|"
    r"lembre-se|lembra-te|não (?:se )?esqueça|não te esqueças|"
    r"ricordati|ricordatevi|non dimenticare|tieni a mente|"
    r"unutma(?:yın)?\b[,!:]|aklında tut|"
    r"لا تنس(?:ى|ي)?|"
    r"याद रख(?:ना|ो|िए|ें)|भूलना मत)(?!\w)|"
    r"(?:覚えておいて|覚えといて|忘れないで)(?:ね|よ|ください|下さい)?[。！!]*$|"
    r"^(?:覚えておいて|覚えといて|忘れないで)(?:ね|よ|ください|下さい)?[、，,]|"
    r"(?:기억해\s?줘|기억해\s?주세요|잊지\s?마(?:세요)?)[.!~]*$|"
    r"^(?:기억해\s?줘|기억해\s?주세요|잊지\s?마(?:세요)?)[,，]"
)
_QUESTION_END = ("?", "？", "؟")


def explicit_request(text: str) -> str | None:
    """The sentence that asks the bot to remember something, if any."""
    for sentence in sentences(normalize(text)):
        if _EXPLICIT.search(sentence) and not _NOT_EXPLICIT.search(sentence):
            return str(sentence)
        if _EXPLICIT_OTHER.search(sentence) and not sentence.rstrip().endswith(_QUESTION_END):
            return str(sentence)
    return None


_TURN_ACROSS = re.compile(
    rf"\b(?:\w+ (?:years?|months?|weeks?) ago|back then|a while ago|last year|used to)\b.{{0,160}}?"
    rf"\bnow (?:i|i'm|im|it's|i've)? ?(?:actually |finally |really |kinda |truly |genuinely |so )?(?:{_FEELING_EN})\b|"
    rf"\b(?:\w+ (?:years?|months?|weeks?) ago|back then|last year|at first)\b[^.!?]{{0,40}}?\bi "
    rf"(?:was |felt |used to be )?(?:so |really |very )?(?:{_FEELING_EN})\b"
    rf".{{0,80}}?\bnow\b"
)
# Said with a wink: "/s", "jk", "just kidding", 🙄, 才怪.
_SARCASM = re.compile(
    r"(?:^|\s)/s\b|\bjk\b|\b(?:just|only) kidding\b|\blol not\b|\bnot!|\byeah,? right\b|"
    r"\bsaid no one ever\b|\(not\)|🙄|才怪|呵呵|[(（]不是[)）]"
)
# Someone else's words in quotation marks ("she texted me "i regret everything""), unless the
# speaker quotes themselves ("i told him "i'm leaving"").
_OWN_QUOTE = re.compile(
    r"\b(?:i|we) (?:said|say|told(?: \w+){1,3}|wrote|replied|answered|texted(?: \w+){1,3}|was like)[ ,:]*$|"
    r"我(?:跟.{1,6})?(?:说|讲|回|告诉.{1,6})[:：，, ]*$"
)
_OPEN_QUOTES = frozenset('"「『')
_CLOSE_QUOTES = frozenset('"」』')


def quoted_positions(sentence: str, state: tuple[bool, bool]) -> tuple[set[int], tuple[bool, bool]]:
    """Positions of ``sentence`` inside someone else's quotation, and the state at its end (inside a
    quotation, the speaker's own): quotes span sentence breaks (""i finally got the job!" he said")."""
    quoted: set[int] = set()
    inside, own = state
    for i, ch in enumerate(sentence):
        opening = not inside and ch in _OPEN_QUOTES
        closing = inside and ch in _CLOSE_QUOTES
        if opening:
            inside, own = True, bool(_OWN_QUOTE.search(sentence[:i]))
        elif closing:
            inside = False
        elif inside and not own:
            quoted.add(i)
    return quoted, (inside, own)


def candidates(text: str) -> list[Signal]:
    """Every scene signal in ``text`` that survives the subject, mood and negation checks, one per
    type (its strongest), strongest first; an explicit request with no typed signal gives a
    ``type=None`` signal."""
    # A quoted or relayed "I decided to quit my job" is someone else's moment, and a quoted
    # "please remember that…" someone else's request.
    text = without_relayed(text)
    explicit = explicit_request(text) is not None
    original = sentences(text.strip())
    normalized = [normalize(s) for s in original]
    best: dict[str, Signal] = {}
    # Said with a wink, a scene word is no moment; an explicit "remember this" still counts.
    sarcastic = bool(_SARCASM.search(normalize(text)))
    state = (False, False)
    for raw, sentence in zip(original, normalized, strict=True):
        if sarcastic:
            break
        quoted, state = quoted_positions(sentence, state)
        for kind, strength, pattern, negation_inside in _PATTERNS:
            for match in pattern.finditer(sentence):
                if match.start() in quoted or _problem(sentence, match, negation_inside, kind):
                    continue
                if kind not in best or strength > best[kind].strength:
                    best[kind] = Signal(kind, strength, raw, explicit, f"{kind} signal")
                break
    whole = normalize(text)
    if (
        "emotional_turn" not in best
        and not sarcastic
        and _TURN_ACROSS.search(whole)
        and not third_person_start(whole)
    ):
        best["emotional_turn"] = Signal(
            "emotional_turn", 0.8, text.strip(), explicit, "emotional_turn signal"
        )
    if "regret" in best and best.get("decision", best["regret"]).sentence == best["regret"].sentence:
        # "i regret dropping out": the decision is what is regretted, the moment is the regret.
        best.pop("decision", None)
    found = sorted(best.values(), key=lambda s: (s.strength, PRIORITY[s.type or ""]), reverse=True)
    if not found and explicit:
        found = [Signal(None, 1.0, text.strip(), True, "explicit request to remember")]
    return found


def detect(text: str) -> Signal | None:
    """The strongest surviving signal (rules only; the plugin adds the prototype check)."""
    found = candidates(text)
    return found[0] if found else None


def _problem(sentence: str, match: re.Match[str], negation_inside: bool, kind: str) -> str | None:
    clause, offset = clause_at(sentence, match.start())
    before = clause[: match.start() - offset]
    if is_question(clause) or (
        clause.strip() == sentence.strip() and sentence.rstrip().endswith(("?", "？"))
    ):
        return "a question"
    someone = third_person_start(clause, names=kind != "value")
    if (someone and not _OWN_FIRST.search(clause)) or _SOMEONE_ELSES.match(sentence[match.start() :]):
        return "about someone else"
    if HYPOTHETICAL_EN.search(before) or HYPOTHETICAL_ZH.search(before):
        return "hypothetical or planned"
    if _DENIED_JUDGEMENT_ZH.search(before):
        return "negated"
    if not negation_inside:
        words = before.split()[-4:]
        if NEGATION_EN.search(" ".join(words)) or NEGATION_ZH.search(before[-3:]):
            return "negated"
        after = sentence[match.end() : match.end() + 12]
        if re.match(r"\s*yet\b", after):
            return "not yet"
    if _SCHEDULED.match(sentence[match.end() : match.end() + 40]):
        return "scheduled, not lived"
    if kind == "milestone" and _ROUTINE.search(sentence):
        return "routine"
    elif re.search(r"\b(?:don't|do not|never|no|not|won't)\s+(?:\w+\s+)?$", before) or re.search(
        r"(?:不|没|没有|从不|从没)$", before
    ):
        if not re.match(r"(?:不(?:应|)该|不再|再也不)", sentence[match.start() :]):
            return "negated"
    return None
