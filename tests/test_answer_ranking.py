"""The hybrid recall's answer model (plugins/answer_ranking.py): its signals, its window sums, and
what it changes in a real store (real embedding model, SQLite file, FAISS index)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from narrmem_plugins.answer_ranking import SIGNALS, AnswerWeights, _window_sums, answer_scores, answer_signals

from narrmem.clock import ManualClock
from narrmem.models import Candidate, MemoryRecord
from narrmem.ranking import reciprocal_rank_fusion
from narrmem.testing import open_memory

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def record(mid: int, text: str, minutes: float = 0.0) -> MemoryRecord:
    return MemoryRecord(
        id=mid,
        kind="episode",
        text=text,
        tenant="default",
        user_id="ann",
        chat_id="dm",
        created_at=T0 + timedelta(minutes=minutes),
        message_ids=[f"m{mid}"],
    )


def candidates(vector: list[int], keyword: list[tuple[int, float]]) -> list[Candidate]:
    out = [
        Candidate(memory_id=m, source="vector", rank=r, score=0.6 - 0.01 * r) for r, m in enumerate(vector)
    ]
    out += [Candidate(memory_id=m, source="keyword", rank=r, score=s) for r, (m, s) in enumerate(keyword)]
    return out


def scores(records: dict[int, MemoryRecord], cands: list[Candidate], **weights: float) -> dict[int, float]:
    fused = reciprocal_rank_fusion(cands, k=20, weights={"vector": 0.45, "keyword": 1.0}, normalize=True)
    return dict(answer_scores(fused, cands, records, AnswerWeights(**weights), rrf_k=20))


def test_a_question_is_not_its_own_answer() -> None:
    records = {1: record(1, "Where did you go in May?"), 2: record(2, "We went to Lisbon in May, lovely.")}
    # The question matches the query's words best in both sources.
    ranked = scores(records, candidates([1, 2], [(1, 9.0), (2, 8.5)]))
    assert ranked[2] > ranked[1]
    # The same two with the question signal off: the better match wins again.
    assert scores(records, candidates([1, 2], [(1, 9.0), (2, 8.5)]), question=0.0)[1] > ranked[1]


def test_a_message_that_says_more_outranks_a_bare_reply() -> None:
    records = {
        1: record(1, "haha yes!"),
        2: record(2, "I adopted a rescue greyhound called Pepper from the shelter in Leeds last month."),
    }
    ranked = scores(records, candidates([1, 2], [(1, 5.0), (2, 5.0)]))
    assert ranked[2] > ranked[1]


def test_scores_are_estimates_in_the_unit_interval_and_only_stored_ids_are_ranked() -> None:
    records = {1: record(1, "I paint landscapes."), 2: record(2, "Painting relaxes me.")}
    cands = candidates([1, 2, 3], [(3, 4.0), (1, 2.0)])  # 3 was not read back (out of scope)
    fused = reciprocal_rank_fusion(cands, k=20, normalize=True)
    ranked = answer_scores(fused, cands, records, AnswerWeights(), rrf_k=20)
    assert {mid for mid, _ in ranked} == {1, 2}
    assert all(0.0 < score < 1.0 for _, score in ranked)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)


def test_signals_are_what_the_docs_say() -> None:
    records = {
        1: record(1, "Ann met Tom in Paris?"),
        2: record(2, "ok", minutes=30),
        3: record(3, "x", minutes=200),
    }
    facts = Candidate(memory_id=3, source="facts", rank=0, score=1.0)
    cands = [*candidates([2, 1], [(1, 10.0), (3, 5.0)]), facts]
    fused = reciprocal_rank_fusion(cands, k=20, normalize=True)
    signals = {
        mid: dict(zip(SIGNALS, values, strict=True))
        for mid, values in answer_signals(fused, cands, records, rrf_k=20, window_minutes=60).items()
    }
    assert signals[1]["vector"] == pytest.approx(21 / 22)
    assert signals[2]["vector"] == 1.0 and signals[3]["vector"] == 0.0
    assert signals[2]["similarity"] == pytest.approx(0.0) and signals[1]["similarity"] == pytest.approx(-0.01)
    assert signals[3]["similarity"] == pytest.approx(-0.01)  # not a vector hit: at most the last one's
    assert (signals[1]["keyword"], signals[3]["keyword"], signals[2]["keyword"]) == (1.0, 0.5, 0.0)
    assert (signals[3]["other_sources"], signals[1]["other_sources"]) == (1.0, 0.0)
    silenced = answer_signals(
        fused, cands, records, rrf_k=20, window_minutes=60, source_weights={"facts": 0.0}
    )
    assert dict(zip(SIGNALS, silenced[3], strict=True))["other_sources"] == 0.0  # [recall] weights 0
    assert signals[1]["question"] == 1.0 and signals[2]["question"] == 0.0
    assert signals[1]["names"] == 2.0  # Tom, Paris; not the sentence's first word
    f = dict(fused)
    assert signals[1]["window"] == pytest.approx(f[2])  # 30 minutes apart; 3 is 200 minutes away
    assert signals[3]["window"] == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 600), st.floats(0, 1, allow_nan=False)), min_size=1, max_size=40),
    st.floats(1, 120),
)
def test_window_sums_equal_the_pairwise_sums(points: list[tuple[int, float]], minutes: float) -> None:
    fused = [(i, score) for i, (_, score) in enumerate(points)]
    times = {i: T0 + timedelta(minutes=m) for i, (m, _) in enumerate(points)}
    sums = _window_sums(fused, times, minutes)
    for i, (m, _) in enumerate(points):
        expected = sum(s for j, (n, s) in enumerate(points) if j != i and abs(n - m) <= minutes)
        assert sums[i] == pytest.approx(expected, abs=1e-9)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_in_a_real_store_the_answer_outranks_a_question_fusion_put_above_it(tmp_path: Path) -> None:
    said = [
        "Work work work, honestly work is all I do these days and I am tired of work.",
        "I started as a nurse at St Mary's hospital in Leeds in March, mostly night shifts.",
        "My brother does something in finance, I never understood what exactly.",
        "Is work ever going to calm down for you?",
    ]
    ranked: dict[bool, list[str]] = {}
    for on in (True, False):
        clock = ManualClock(T0 + timedelta(days=10))
        plugin = {"recall_hybrid": {"rank_answers": on}}
        async with open_memory(tmp_path / str(on), real_model=True, clock=clock, plugin=plugin) as mem:
            for i, text in enumerate(said):
                message = {"text": text, "user_id": "ann", "chat_id": "c", "speaker": "Ann"}
                await mem.ingest({**message, "ts": T0 + timedelta(days=i), "message_id": f"t{i}"})
            hits = await mem.recall("What does Ann do for work?", chat_id="c", k=4, reinforce=False)
            ranked[on] = [h.message_ids[0] for h in hits]
    assert sorted(ranked[True]) == sorted(ranked[False]) == ["t0", "t1", "t2", "t3"]
    # Fusion alone: the question (more of the query's words) above the nurse, who comes last.
    assert ranked[False].index("t3") < ranked[False].index("t1") == 3
    # The model: the statement that answers above the question.
    assert ranked[True].index("t1") < ranked[True].index("t3")
