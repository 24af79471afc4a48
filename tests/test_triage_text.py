"""Triage's text helpers without a model: topic words without the chat's noise, and the speaker's
words in the third person for facts and scenes."""

from __future__ import annotations

import pytest
from narrmem_plugins.triage.ignore_rules import ignore_reason
from narrmem_plugins.triage.phrase import chinese_phrase, english_phrase
from narrmem_plugins.triage.topics import topic_words

from narrmem.person import fact_line, third_person


def test_topic_words_leave_out_greetings_placeholders_and_the_bot_name() -> None:
    texts = [
        "hey Nori, long run this morning, knee held up",
        "morning Nori! [photo] another long run, 16k",
        "Nori, thanks, the runs are getting easier",
    ]
    assert topic_words(texts, limit=2, names=["Nori"]) == ["run", "long"]
    assert "nori" in topic_words(texts, limit=5)  # a name is only noise once it is configured


FACT_LINES = {  # (relation, object as the user said it): the line a turn context shows
    ("plans", "quit my job"): "user plans to quit their job",
    ("plans", "moving to Lisbon with my partner"): "user plans on moving to Lisbon with their partner",
    ("dropped_plan", "sell my flat"): "user dropped the plan to sell their flat",
    ("likes", "my cat's snoring"): "user likes their cat's snoring",
    ("works_on", "a game with my brother"): "user works_on a game with their brother",
    ("plans", "辞掉我的工作"): "user plans 辞掉自己的工作",
}


@pytest.mark.parametrize(("fact", "line"), FACT_LINES.items())
def test_facts_read_as_a_third_person_would_say_them(fact: tuple[str, str], line: str) -> None:
    assert fact_line("user", *fact) == line


def test_third_person_keeps_words_that_only_contain_a_pronoun() -> None:
    assert third_person("I told my mum I'm fine, me and myself") == (
        "They told their mum they're fine, them and themselves"
    )
    assert third_person("user music mine") == "user music theirs"
    assert third_person("我们和我的朋友") == "他们和自己的朋友"


@pytest.mark.parametrize(
    ("core", "phrase"),
    [
        (
            "idk man, for me sleep is more important than grinding for another promotion",
            "Putting sleep before grinding for another promotion",
        ),
        (
            "for me, having my weekends free > making more money.",
            "Putting having their weekends free before making more money",
        ),
        (
            "first time i ever spoke up in a meeting with the VPs.",
            "Speaking up in a meeting with the VPs for the first time",
        ),
        (
            "I used to panic whenever my baby cried, now I'm calmer",
            "From panicking whenever their baby cried to being calmer",
        ),
        ("pls remember — i've decided to go vegetarian starting today", "Deciding to go vegetarian"),
        ("shouldn't have bought that coin.", "Regretting buying that coin"),
    ],
)
def test_english_scene_phrases_from_messy_chat(core: str, phrase: str) -> None:
    assert english_phrase(core) == phrase


@pytest.mark.parametrize(
    ("core", "phrase"),
    [
        ("帮我记一下，我决定明年去读研了", "决定去读研"),
        ("记住这一天，我终于拿到驾照了！", "拿到驾照"),
        ("说真的，对我来说身体比KPI重要一百倍", "身体比KPI重要一百倍"),
        ("以前我很焦虑，现在平静多了。", "以前很焦虑，现在平静多了"),
    ],
)
def test_chinese_scene_phrases_drop_the_subject_time_words_and_the_request(core: str, phrase: str) -> None:
    assert chinese_phrase(core) == phrase


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ok got it", "acknowledgement"),  # a phrase that starts with a word that is one on its own
        ("sounds good, got it, thanks", "acknowledgement"),
        ("fair enough, makes sense", "acknowledgement"),
        ("i'll remember that", "acknowledgement"),
        ("yep that works", "acknowledgement"),
        # One segment, several phrases without punctuation between them: read phrase by phrase.
        ("ok cool sounds good", "acknowledgement"),
        ("fair enough makes sense", "acknowledgement"),
        ("got it no worries", "acknowledgement"),
        ("got it, my flight lands at 9 on Friday", None),  # a phrase, then something to remember
        ("sounds good to my sister, she is moving to Porto", None),
    ],
)
def test_runs_of_acknowledgement_phrases_are_ignored_and_what_follows_them_is_not(
    text: str, reason: str | None
) -> None:
    assert ignore_reason(text, min_chars=2) == reason
