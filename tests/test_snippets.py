"""Long memories come back as their sentences that answer the query, within the token budget."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from narrmem.snippets import snippet
from narrmem.text import estimate_tokens

LONG = (
    "I went to a support group yesterday and it was so powerful. The stories were inspiring! "
    "We also had pizza afterwards and talked about weekend plans with everyone there. "
    "Then I walked home along the river, which took almost an hour in the rain."
)


def test_short_text_is_returned_whole() -> None:
    assert snippet("I like rock music", "music", 48) == "I like rock music"


def test_long_text_keeps_the_sentences_that_share_the_query_words() -> None:
    short = snippet(LONG, "when did she go to the support group?", 30)
    assert short.startswith("I went to a support group yesterday")
    assert "river" not in short
    assert estimate_tokens(short) <= 30


def test_sentences_stay_in_their_order() -> None:
    short = snippet(LONG, "pizza river", 40)
    assert short.index("pizza") < short.index("river")


def test_chinese_is_cut_by_characters() -> None:
    text = (
        "我最近在做一个开源的天气预报项目，用 Rust 写的，已经有五十个星了，"
        "下个月准备发布第二个版本。还有很多工作要做。"
    )
    short = snippet(text, "天气预报项目", 20)
    assert short.startswith("我最近在做一个开源的天气预报项目") and short.endswith("…")
    assert estimate_tokens(short) <= 20


@given(text=st.text(min_size=1, max_size=2000), query=st.text(max_size=50), budget=st.integers(8, 200))
def test_never_over_budget_and_never_empty(text: str, query: str, budget: int) -> None:
    short = snippet(text, query, budget)
    assert short.strip() or not text.strip()
    assert estimate_tokens(short) <= max(
        budget, estimate_tokens(text) if estimate_tokens(text) <= budget else budget
    )
