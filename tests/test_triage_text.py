"""Triage's text helpers without a model: topic words without the chat's noise, and the speaker's
words in the third person for facts and scenes."""

from __future__ import annotations

import pytest
from narrmem_plugins.triage.person import fact_line, third_person
from narrmem_plugins.triage.topics import topic_words


def test_topic_words_leave_out_greetings_placeholders_and_the_bot_name() -> None:
    texts = [
        "hey Nori, long run this morning, knee held up",
        "morning Nori! [photo] another long run, 16k",
        "Nori, thanks, the runs are getting easier",
    ]
    assert topic_words(texts, limit=2, names=["Nori"]) == ["run", "long"]
    assert "nori" in topic_words(texts, limit=5)  # a name is only noise once it is configured


@pytest.mark.parametrize(
    ("relation", "obj", "line"),
    [
        ("plans", "quit my job", "user plans to quit their job"),
        ("plans", "moving to Lisbon with my partner", "user plans on moving to Lisbon with their partner"),
        ("dropped_plan", "sell my flat", "user dropped the plan to sell their flat"),
        ("likes", "my cat's snoring", "user likes their cat's snoring"),
        ("works_on", "a game with my brother", "user works_on a game with their brother"),
        ("plans", "辞掉我的工作", "user plans 辞掉自己的工作"),
    ],
)
def test_facts_read_as_a_third_person_would_say_them(relation: str, obj: str, line: str) -> None:
    assert fact_line("user", relation, obj) == line


def test_third_person_keeps_words_that_only_contain_a_pronoun() -> None:
    assert third_person("I told my mum I'm fine, me and myself") == (
        "They told their mum they're fine, them and themselves"
    )
    assert third_person("user music mine") == "user music theirs"
    assert third_person("我们和我的朋友") == "他们和自己的朋友"
