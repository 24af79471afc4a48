"""Word lists the triage rules use, English and Chinese, and the commonest of other languages
(none that is also a first name, "Dale", "Claro", "Sim", or another word on its own, "gut"). Kept
apart from the rules so they can be read and extended without reading regular expressions."""

from __future__ import annotations

ACKNOWLEDGEMENTS = frozenset(
    """ok okay k kk okk okie okey yes yep yeah yup ya yea sure no nope nah thanks thank thx ty tysm cool
    nice fine alright right lol lmao rofl haha hahaha hehe hmm hm mm mhm ah oh ooh wow great good noted
    roger understood gotcha agreed same true indeed exactly perfect awesome np nw yw ikr wtf omg smh ugh
    yikes damn dang welp oof bruh first fair lovely brilliant sweet word bet yass yay woohoo sorry oops whoops anytime 👍 🙏 😂 🤣 ❤️
    👌 🙂 😊 😅 😆 😄 😁 🥲 🙌 👏 💯 🔥 +1
    好 好的 好滴 好嘞 嗯 嗯嗯 嗯呢 收到 哦 噢 喔 行 行吧 可以 对 对的 是 是的 谢谢 多谢 谢啦 哈哈 哈哈哈 呵呵
    知道了 明白 明白了 了解 懂了 没问题 ok的 好吧 记住了 离谱 无语 绝了 服了 醉了 晕 哎 唉 天哪 我去
    好哦 好呀 好啊 嗯呢 嗯啊 对对 对对对 是啊 是呀 可以可以 行行 笑死 笑死我了 牛 厉害 棒 太棒了 酷
    辛苦了 辛苦啦 谢了 嗯哼 好笑 感谢 那就这样 就这样 知道啦
    ок окей ага угу да нет спасибо спс пасиб хорошо ладно понял поняла понятно ясно класс круто супер
    отлично норм пон лол дякую добре
    ja nein danke jep klar genau stimmt
    oui merci ouais d'accord dac parfait mdr ptdr
    sí si gracias bueno perfecto
    não obrigado obrigada valeu beleza blz
    grazie perfetto
    evet hayır tamam teşekkürler sağol eyvallah harika
    はい うん ありがとう 了解 りょうかい おけ わかった なるほど
    네 응 ㅇㅇ ㅇㅋ 고마워 감사합니다 알겠어 좋아
    نعم لا شكرا تمام حسنا اوكي
    हाँ हां नहीं धन्यवाद शुक्रिया अच्छा ओके""".split()
)

ACKNOWLEDGEMENT_PHRASES = frozenset(
    {
        "thank you",
        "thanks a lot",
        "thanks so much",
        "thank you so much",
        "got it",
        "sounds good",
        "no problem",
        "no worries",
        "all right",
        "ok thanks",
        "okay thanks",
        "ok cool",
        "oh ok",
        "oh okay",
        "makes sense",
        "fair enough",
        "will do",
        "i'll remember",
        "i will remember",
        "i'll remember that",
        "记住了",
        "好的记住了",
        "知道啦",
        "明白啦",
        "i see",
        "alles klar",
        "danke schön",
        "vielen dank",
        "merci beaucoup",
        "muchas gracias",
        "muito obrigado",
        "muito obrigada",
        "большое спасибо",
        "ну ладно",
        "sağ ol",
        "ठीक है",
        "i know",
        "of course",
        "sure thing",
        "you bet",
        "good to know",
        "yes please",
        "no thanks",
        "ok got it",
        "okay got it",
        "好的谢谢",
        "好的收到",
        "why not",
        "sounds good to me",
        "sounds great",
        "works for me",
        "fine by me",
        "that works",
        "nice one",
        "good one",
        "fair point",
        "my bad",
        "no way",
        "all good",
        "perfect thank you",
        "thanks again",
        "thanks a bunch",
        "thank u",
        "太好笑了",
    }
)

# Checking whether the other side is there, leaving and coming back: conversation about the
# conversation, never about the user's life.
SMALL_TALK_EN = (
    r"(?:are |r )?(?:you|u|ya) (?:there|around|up|awake|free|busy|online|home|still there|still up|about)|"
    r"(?:is )?any(?:one|body) (?:there|home|around|up|here|online)|you busy|got a (?:sec|second|minute|min)|"
    r"ping|still there|brb|be right back|gtg|g2g|got(?:ta| to) (?:go|run)|(?:i )?(?:have|need) to (?:go|run)|afk(?: for a (?:bit|sec|second|while|minute))?|"
    r"off to bed|going to bed|heading (?:out|off)|"
    r"(?:sorry,? )?(?:i )?was afk|(?:i'?m )?back(?: now)?|i'?m here|talk (?:to you )?(?:later|tomorrow|soon)|"
    r"ttyl|catch you later|speak soon|see you (?:tomorrow|later|soon)|later|night night|nighty night|"
    r"how(?:'s| is| has) your day(?: going| been)?|how was your day|how you doing|how are things|what'?s new|"
    r"sorry for the late reply|sorry,? late reply"
)
SMALL_TALK_ZH = (
    r"在么|在嘛|在线吗|有人在吗|有空吗|忙吗|睡了吗|睡了没|醒了吗|醒了没|你在不在|在不在|"
    r"我先撤了|先撤了|先下了|我先下了|回头聊|等下聊|晚点聊|明天聊|改天聊|回来了|我回来了|我来了|去睡了|"
    r"最近咋样|吃了没|吃了吗|干嘛呢|在干嘛|在干啥|你呢"
)
# Sentence-final particles that add tone, not content (嗯嗯好的呀).
PARTICLES_ZH = "呀啊啦哈呢哦吧嘛噢哇吖滴嘞么"

# What chat exports write in place of media: Telegram (``[photo]``, ``[sticker 😍]``), Discord
# (``[attachment: x.png]``), WhatsApp (``<Media omitted>``), WeChat (``[图片]``). A message made of
# these alone says nothing a person wrote.
MEDIA_PLACEHOLDER = (
    r"\[(?:photo|image|picture|video|video message|voice message|voice|audio|gif|animation|sticker|file|"
    r"document|location|live location|contact|poll|attachment|link|图片|照片|表情|动画表情|语音|视频|文件|位置|链接|"
    r"红包|转账|名片)(?:[ :][^\]]*)?\]|<(?:attachment|media omitted|(?:image|video|audio|gif|sticker|document) "
    r"omitted)>|\b(?:image|video|audio|gif|sticker|document) omitted\b"
)

GREETINGS_EN = (
    r"hi|hello|hey|heya|hiya|yo|sup|howdy|hi there|hey there|hello there|good morning|good afternoon|"
    r"good evening|good night|morning|evening|night|gm|gn|nite|bye|bye bye|goodbye|see you|see ya|cya|"
    r"later|ttyl|take care|have a nice day|have a good day|have a good one|welcome back|long time no see|"
    r"how are you|how are you doing|how r u|how's it going|hows it going|how's your day|what's up|whats up|"
    r"wassup|how have you been|nice to meet you|you there|are you there|anyone there"
)
GREETINGS_ZH = (
    r"你好|您好|嗨|哈喽|哈啰|早|早上好|早安|中午好|下午好|晚上好|晚安|拜拜|再见|回头见|明天见|在吗|在不在|"
    r"你在吗|最近怎么样|最近好吗|你好吗|吃了吗|吃饭了吗|好久不见|嗨嗨|哈喽哈喽|早呀|早啊"
)
# Words that open a sentence of small talk inside a longer message ("Thanks, Mel!", "Wow, so
# cool!", "Hey Jon!"): thanks, greetings, laughter and reactions. Not yes, no, sure or oh: a short
# sentence opening with them is often an answer ("No, I'm allergic.").
SMALL_TALK_OPENERS = frozenset(
    """thanks thank thx ty wow woah whoa aw aww haha hahaha hehe lol lmao omg yay woohoo congrats
    congratulations amazing awesome cool nice great lovely glad sweet totally definitely absolutely sounds
    hi hello hey heya hiya yo howdy bye goodbye morning evening night later""".split()
) | frozenset(
    {"good morning", "good afternoon", "good evening", "good night", "see you", "see ya", "take care"}
)
BOT_NAMES = r"(?:bot|buddy|friend|there|everyone|all|guys|folks|mate|man|dude|朋友|大家)"

WEATHER = (
    r"weather|rain|raining|rainy|sunny|sunshine|cloudy|snow|snowing|windy|humid|foggy|storm|stormy|"
    r"thunder|hot today|cold today|so hot|so cold|freezing|chilly|heatwave|forecast|temperature|degrees|"
    r"pouring|drizzl\w*|hail\w*|sleet|humidity|breeze|sunny|snowfall|blizzard"
)
WEATHER_ZH = r"天气|下(?:大|小|暴|中)?雨|下(?:大|小)?雪|晴天|阴天|刮风|好热|好冷|真热|真冷|太热|太冷|降温|升温|气温|温度|台风|雾霾|闷热"

# Emotion labels for counting repeated moods. Each label lists English words and Chinese words.
EMOTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tired": (
        (
            "tired",
            "exhausted",
            "drained",
            "worn out",
            "burnt out",
            "burned out",
            "sleepy",
            "knackered",
            "wiped out",
            "fatigued",
        ),
        ("累", "疲惫", "疲倦", "困", "乏", "没精神", "心累"),
    ),
    "stressed": (
        ("stressed", "stress", "overwhelmed", "under pressure", "swamped", "overloaded"),
        ("压力", "焦头烂额", "忙死", "喘不过气"),
    ),
    "anxious": (
        ("anxious", "worried", "worry", "worrying", "nervous", "scared", "afraid", "panicking", "uneasy"),
        ("焦虑", "担心", "紧张", "害怕", "不安", "慌"),
    ),
    "sad": (
        ("sad", "down", "depressed", "unhappy", "miserable", "heartbroken", "blue", "crying", "cried"),
        ("难过", "伤心", "郁闷", "沮丧", "失落", "哭", "抑郁"),
    ),
    "angry": (
        ("angry", "furious", "pissed", "annoyed", "frustrated", "mad at", "irritated", "fed up"),
        ("生气", "气死", "烦", "恼火", "愤怒", "火大"),
    ),
    "lonely": (("lonely", "alone", "isolated", "left out"), ("孤独", "寂寞", "孤单")),
    "happy": (
        ("happy", "excited", "thrilled", "glad", "delighted", "overjoyed", "proud", "grateful", "relieved"),
        ("开心", "高兴", "快乐", "兴奋", "激动", "骄傲", "欣慰", "幸福"),
    ),
}
