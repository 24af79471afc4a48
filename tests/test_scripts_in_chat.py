"""A bot's users who write in other scripts: their repeated topics are counted as an English
speaker's are (Russian, Korean, Japanese kana, Arabic, Hindi, German), labelled with words rather
than two bigrams glued together, and a text shortened for a budget or a platform's limit is cut
between characters as a reader sees them (an accent stays on its letter, an emoji whole)."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from narrmem_plugins.triage.counters import topic_label
from narrmem_plugins.triage.topics import shares_words

from narrmem.doors.integrations._common import clip
from narrmem.snippets import snippet
from narrmem.testing import open_memory
from narrmem.text import character_end, estimate_tokens

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
SAID_AGAIN = {
    "en": "Went running in the park again.",
    "ru": "Снова бегал в парке.",
    "ko": "또 공원에서 달렸어.",
    "ja": "また公園で走った。",
    "ar": "ركضت في الحديقة مرة أخرى.",
    "hi": "फिर से पार्क में दौड़ा।",
    "de": "Ich bin heute wieder im Park gelaufen.",
}


@pytest.mark.parametrize("language", sorted(SAID_AGAIN))
async def test_a_topic_said_again_is_counted_in_every_script(tmp_path: Path, language: str) -> None:
    """Before, only English, Chinese, Japanese (by its kanji) and Turkish ever made a topic: a
    word that was not ASCII never counted, and Korean or kana were compared by English words."""
    fired = []
    async with open_memory(tmp_path / "m") as memory:
        for n in range(4):
            result = await memory.ingest(
                {
                    "text": SAID_AGAIN[language],
                    "user_id": "u1",
                    "chat_id": "c1",
                    "message_id": f"m{n}",
                    "ts": (T0 + timedelta(hours=n)).isoformat(),
                }
            )
            fired += [(event.kind, event.label) for event in result.triggers]
    topics = [label for kind, label in fired if kind == "topic"]
    assert topics, fired
    # Named by what it is about, not by "ich" or "again".
    assert not {"ich", "heute", "снова", "फिर"} & set(topics[0].split())


def test_a_label_of_bigrams_is_a_word_not_two_glued() -> None:
    assert topic_label(["我们周末去公园跑步", "公园跑步很舒服"]) in {"公园跑", "园跑步", "公园", "跑步"}
    label = topic_label(["また公園で走った。", "公園で走るのが好き"])
    assert not any("\u3041" <= char <= "\u309f" for char in label), label  # no particle in it


def test_a_cut_falls_between_characters() -> None:
    family = "👨\u200d👩\u200d👧\u200d👦"
    text = "ab" + family + "cd"
    assert [character_end(text, i) for i in range(len(text) + 1)][2:10] == [2, 2, 2, 2, 2, 2, 2, 9]
    flags = "🇯🇵🇫🇷"
    assert [character_end(flags, i) for i in range(5)] == [0, 0, 2, 2, 4]
    assert character_end("ｶﾞﾝ", 1) == 0 and character_end("น้ำ", 2) == 0  # a voicing mark, SARA AM
    decomposed = unicodedata.normalize("NFD", "ぐぐ")
    assert character_end(decomposed, 1) == 0 and character_end(decomposed, 2) == 2
    assert character_end("प्रिया", 2) == 0  # प्र: the virama joins the two consonants
    assert character_end("प्रिया", 5) == 4


def test_a_snippet_keeps_a_letter_with_its_mark_and_an_emoji_whole() -> None:
    family, kana = "👨\u200d👩\u200d👧\u200d👦", unicodedata.normalize("NFD", "ぐ")
    for filler, tail in ((family, "\u200d"), (kana, "く")):
        text = filler * 200
        cut = snippet(text, "nothing in common", 48)
        assert cut.endswith("…") and not cut[:-1].endswith(tail), cut[-6:]


def test_a_reply_fits_telegrams_limit_in_its_own_units() -> None:
    """Telegram counts UTF-16 code units: 3,000 emoji fit 4,096 characters by code points, and the
    reply was refused as too long."""
    reply = clip("😀" * 3000, 4096)
    assert len(reply.encode("utf-16-le")) // 2 <= 4096 and reply.endswith("…")
    assert clip("x" * 5000, 4096) == "x" * 4095 + "…"
    assert clip("short", 2000) == "short"


async def test_a_name_in_another_script_is_one_node_whatever_its_case_or_form(tmp_path: Path) -> None:
    """SQLite's NOCASE folds ASCII alone: "Маша" and "маша", a composed and a decomposed "Jürgen",
    were two people of one chat's graph."""
    pairs = [("Маша", "маша"), ("Ωμέγα", "ωμέγα"), ("Jürgen", unicodedata.normalize("NFD", "Jürgen")),
             ("Jürgen", "JÜRGEN"), ("Masha", "masha")]  # fmt: skip
    async with open_memory(tmp_path / "m") as memory:
        for n, pair in enumerate(pairs):
            for name in pair:
                triplet = {"subject": "user", "relation": "knows", "object": name}
                await memory.call_tool(
                    "memory_commit", {"user_id": "u", "chat_id": f"c{n}", "triplets": [triplet]}
                )
            async with memory.store.sql() as db:
                rows = await db.fetchall(
                    "SELECT name FROM graph_nodes WHERE chat_id = ? AND name <> 'user'",
                    (f"c{n}",),
                )
            assert [row[0] for row in rows] == [pair[0]], pair
            # A purge names it as it is written anywhere else.
            dry = {"user_id": "u", "chat_id": f"c{n}", "mode": "soft", "dry_run": True}
            purged = await memory.call_tool("memory_purge", {**dry, "filters": {"object": pair[1]}})
            assert purged["matched"] == 1, pair


ASKED_TO_REMEMBER = [
    "Запомни: у меня аллергия на орехи.",
    "Merk dir: mein Geburtstag ist am 3. Mai.",
    "N'oublie pas que je suis végétarienne.",
    "No olvides que mi hija se llama Lucía.",
    "Não se esqueça: sou alérgica a amendoim.",
    "Ricordati che domani parto per Roma.",
    "Unutma, yarın önemli bir sınavım var.",
    "覚えておいて、私の誕生日は5月3日です。",
    "내 생일은 5월 3일이야, 기억해줘.",
    "याद रखना, मेरा जन्मदिन 3 मई को है।",
    "لا تنسى أن عيد ميلادي في مايو",
]


NOT_ASKED = [
    "Ты помнишь, что я говорил вчера?",  # a question
    "기억해 줘서 고마워",  # thanks for remembering
    "覚えておいてくれてありがとう",
    "أمي لا تنسى أبدا عيد ميلادي",  # my mother never forgets my birthday
    "Mi abuela recuerda que vivíamos en Madrid",
    "Ich denk daran, nach Berlin zu ziehen",
    "My favorite song is Vergiss nicht",
    "Bu unutma sorunu beni korkutuyor",
    "Je retiens bien les noms des gens",
]


async def test_a_request_to_remember_is_one_in_every_language(tmp_path: Path) -> None:
    """A request to remember ("Запомни: …") was kept as any message, at 0.30, where "remember:
    …" is a moment of at least 0.9; a question, a quote, a title or a statement ("ich denk daran,
    …") is not a request."""
    async with open_memory(tmp_path / "m") as memory:
        for n, text in enumerate([*ASKED_TO_REMEMBER, "Nori, запомни: я не ем мясо.", *NOT_ASKED]):
            decision = await memory.triage(
                {"text": text, "user_id": "u", "chat_id": "c", "message_id": f"m{n}", "ts": T0.isoformat()}
            )
            asked = text not in NOT_ASKED
            assert (decision.layer == "scene" and decision.importance >= 0.9) == asked, (text, decision)


SMALL_TALK = ["Спасибо!", "ага, понятно", "ахахаха", "ㅋㅋㅋㅋ", "ㅇㅋ", "jajaja", "kkkkk", "Danke!",
              "Alles klar", "merci beaucoup", "ありがとう", "www", "ههههه", "ठीक है", "Sağ ol",
              "Valeu!"]  # fmt: skip
SAID_OF_THEMSELVES = ["Я купила новую машину", "मैं कल दिल्ली जा रहा हूँ", "Ich habe morgen eine Prüfung",
                      "우리 딸이 오늘 처음 걸었어", "Mañana empiezo un trabajo nuevo",
                      # Names, answering "what is your son called?", and words of their own.
                      "Dale", "Claro", "Sim", "Jo", "Gut", "笑笑", "草草"]  # fmt: skip


async def test_small_talk_in_other_languages_is_ignored_and_news_kept(tmp_path: Path) -> None:
    """ "спасибо", "ㅋㅋㅋ", "ठीक है" were kept as memories (the ignore layer knew English and
    Chinese small talk alone, and took a Hindi word's vowel signs for punctuation)."""
    async with open_memory(tmp_path / "m") as memory:
        for n, text in enumerate([*SMALL_TALK, *SAID_OF_THEMSELVES]):
            said = {"text": text, "user_id": "u", "chat_id": "c", "message_id": f"m{n}", "ts": T0.isoformat()}
            decision = await memory.triage(said)
            assert (decision.layer == "ignore") == (text in SMALL_TALK), (text, decision)


# One sentence in each script, with the tokens o200k (a current model's tokenizer) gives it.
TOKENIZED = {
    "I went running in the park again this morning and my knee hurts a little bit now.": 18,
    "Сегодня утром я снова бегал в парке, и теперь у меня немного болит колено.": 20,
    "आज सुबह मैं फिर से पार्क में दौड़ा और अब मेरे घुटने में थोड़ा दर्द है।": 20,
    "เช้านี้ฉันไปวิ่งที่สวนอีกครั้งและตอนนี้เข่าของฉันเจ็บนิดหน่อย": 26,
    "ركضت في الحديقة مرة أخرى هذا الصباح والآن ركبتي تؤلمني قليلا.": 22,
    "הבוקר שוב רצתי בפארק ועכשיו הברך שלי קצת כואבת.": 19,
    "Σήμερα το πρωί έτρεξα ξανά στο πάρκο και τώρα πονάει λίγο το γόνατό μου.": 29,
    "今天早上我又去公园跑步了，现在膝盖有点疼。": 19,
}


def test_the_token_estimate_does_not_undercount_other_scripts() -> None:
    """Counted at four characters a token, Thai, Greek and Hebrew came to 0.6 of their tokens: a
    budget of them held 1.6 times what it was set to."""
    for text, tokens in TOKENIZED.items():
        assert tokens <= estimate_tokens(text) <= 1.3 * tokens, text


def test_function_words_of_other_languages_are_not_english_names() -> None:
    assert shares_words("Had lunch with Ben today", "Ben called me again about the move")
    assert shares_words("The VAR decision was a joke", "VAR ruined the match again")


UNRELATED = {
    "th": ["เมื่อวานผมซื้อโทรศัพท์ใหม่ครับ", "สัปดาห์หน้าพี่สาวผมจะมาเยี่ยมครับ", "อากาศที่นี่แย่มากครับ",
           "ผมเริ่มเรียนกีตาร์แล้วครับ", "วันนี้งานเหนื่อยมากครับ"],
    "ko": ["어제 새 휴대폰을 샀습니다", "다음 주에 언니가 방문합니다", "여기 날씨가 정말 나쁩니다",
           "기타를 배우기 시작했습니다", "오늘 일이 너무 힘들었습니다", "주말에 영화를 봤습니다"],
}  # fmt: skip


@pytest.mark.parametrize("language", sorted(UNRELATED))
async def test_unrelated_messages_make_no_topic_by_their_endings(tmp_path: Path, language: str) -> None:
    """Every Korean formal sentence ends in 습니다, every Thai one of a man's in ครับ: counted by
    shared bigrams, five unrelated messages made one topic ('습니다', 'ครั')."""
    async with open_memory(tmp_path / "m", real_model=True) as memory:
        topics = []
        for n, text in enumerate(UNRELATED[language]):
            said = {"text": text, "user_id": "u", "chat_id": "c", "message_id": f"m{n}",
                    "ts": (T0 + timedelta(hours=n)).isoformat()}  # fmt: skip
            result = await memory.ingest(said)
            topics += [count.label for count in result.counts if count.kind == "topic" and count.count > 1]
        assert topics == []
