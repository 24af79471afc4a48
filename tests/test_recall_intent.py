"""What a question asks for, read without a model (plugins/recall_intent.py): whose memory, a name for
an answer, what comes next; each reading only lowers the memories that do not fit."""

from __future__ import annotations

from datetime import UTC, datetime

from narrmem_plugins.recall_intent import asks_for_a_name, intent_factors, named_speakers, names_something

from narrmem.models import MemoryRecord

AT = datetime(2026, 5, 1, tzinfo=UTC)


def record(text: str, speaker: str) -> MemoryRecord:
    return MemoryRecord(text=text, user_id=speaker.lower(), chat_id="c", speaker=speaker, created_at=AT)


def factors(query: str, records: dict[int, MemoryRecord]) -> dict[int, float]:
    return intent_factors(
        query, records, unnamed_speaker_factor=0.8, nameless_answer_factor=0.7, future_factor=0.9
    )


def test_a_named_speaker_keeps_their_memories_and_lowers_the_others() -> None:
    records = {1: record("I paint sunsets.", "Melanie"), 2: record("I paint too.", "Caroline")}
    assert named_speakers("What did Melanie paint?", ["Melanie", "Caroline"]) == {"Melanie"}
    assert factors("What did Melanie paint?", records) == {2: 0.8}
    # Naming every speaker, or none, changes nothing.
    assert factors("What did Melanie and Caroline paint?", records) == {}
    assert factors("What was painted?", records) == {}


def test_speaker_names_match_whole_words_and_cjk_names_as_substrings() -> None:
    assert named_speakers("What did Melanies paint?", ["Melanie"]) == set()
    assert named_speakers("What does Ann Lee like?", ["Ann Lee", "Ann"]) == {"Ann Lee", "Ann"}
    assert named_speakers("伟喜欢什么音乐？", ["伟", "Bob"]) == {"伟"}


def test_where_who_which_questions_ask_for_a_name() -> None:
    assert asks_for_a_name("Where does Alice live now?")
    assert asks_for_a_name("So which book is next?")
    assert not asks_for_a_name("What did Alice decide about her job?")
    assert not asks_for_a_name("Did she say where she went?")  # the question word comes too late


def test_a_name_is_a_capitalised_word_inside_a_sentence_not_already_known() -> None:
    known = {"alice", "live"}
    assert names_something("Morning! I just moved to Lisbon last week.", known)
    assert not names_something("So tired today. The movers broke my lamp.", known)
    assert not names_something("I told Alice on Sunday, in May.", known)  # known name, calendar words
    assert not names_something("I'm home. I'll stay.", known)


def test_a_where_question_lowers_memories_that_name_nothing() -> None:
    records = {
        1: record("I just moved to Lisbon last week.", "Alice"),
        2: record("The movers broke my lamp.", "Alice"),
    }
    assert factors("Where does Alice live now?", records) == {2: 0.7}


def test_a_question_about_what_comes_next_lowers_memories_without_a_future() -> None:
    records = {
        1: record("Next month's pick should be Piranesi.", "Alice"),
        2: record("I read on the treadmill.", "Bob"),
        3: record("我打算明年去云南。", "伟"),
    }
    assert factors("What do they read next?", records) == {2: 0.9}
    assert factors("What do they read?", records) == {}


def test_readings_multiply() -> None:
    records = {1: record("I read on the treadmill.", "Bob"), 2: record("I will read Piranesi.", "Alice")}
    assert factors("Which book will Alice read?", records) == {1: 0.8 * 0.7 * 0.9}
