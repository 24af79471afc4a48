"""``ContextPack.render(token_budget)``: best hits first, never over the budget."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from _helpers import msg

from narrmem import ContextPack, Hit, Memory, Scope
from narrmem.text import estimate_tokens

HEADER = "What you remember about this conversation:"


def _hit(n: int, text: str, speaker: str | None = None) -> Hit:
    return Hit(
        id=n,
        kind="episode",
        text=text,
        score=1.0 / (n + 1),
        importance=0.3,
        created_at=datetime(2026, 5, n % 28 + 1, tzinfo=UTC),
        message_ids=[str(n)],
        tenant="default",
        user_id="u1",
        chat_id="c1",
        speaker=speaker,
    )


def _pack(texts: list[str]) -> ContextPack:
    return ContextPack(query="q", scope=Scope(user_id="u1"), hits=[_hit(i, t) for i, t in enumerate(texts)])


def test_render_without_budget_lists_every_hit_in_order() -> None:
    pack = ContextPack(
        query="q",
        scope=Scope(user_id="u1"),
        hits=[_hit(0, "first memory", speaker="Ana"), _hit(1, "second memory"), _hit(2, "我喜欢摇滚乐")],
    )
    assert pack.render().splitlines() == [
        HEADER,
        "- [2026-05-01, episode] Ana: first memory",
        "- [2026-05-02, episode] second memory",
        "- [2026-05-03, episode] 我喜欢摇滚乐",
    ]


def test_empty_pack_and_tiny_budget_render_nothing() -> None:
    assert _pack([]).render() == ""
    assert _pack([]).render(1000) == ""
    assert _pack(["a memory"]).render(0) == ""
    assert _pack(["a memory"]).render(estimate_tokens(HEADER)) == ""  # a header alone is not worth sending


@pytest.mark.parametrize("length", [1, 3, 4, 5, 8, 13, 40, 41, 120])
def test_render_prefix_grows_with_budget(length: int) -> None:
    pack = _pack([f"{i}" + "x" * length for i in range(6)] + ["摇滚" * length])
    full = pack.render().splitlines()
    previous = 0
    for budget in range(0, estimate_tokens(pack.render()) + 20):
        lines = pack.render(budget).splitlines()
        assert lines == full[: len(lines)], "best hits first, none skipped"
        assert len(lines) >= previous, "a bigger budget never renders less"
        previous = len(lines)
    assert previous == len(full)


def test_rendered_text_fits_the_token_budget() -> None:
    over = []
    for length in [1, 2, 3, 4, 5, 8, 13, 36, 40, 41, 120]:
        pack = _pack(["x" * length for _ in range(8)] + ["我喜欢摇滚乐" * (length % 5 + 1)])
        for budget in range(0, estimate_tokens(pack.render()) + 20):
            rendered = pack.render(budget)
            if estimate_tokens(rendered) > budget:
                over.append((length, budget, estimate_tokens(rendered)))
    assert over == [], f"(hit text length, budget, estimated tokens rendered) over budget: {over[:5]}"


async def test_context_from_memory_renders_within_budget(memory: Memory) -> None:
    await memory.ingest_many(
        [msg(str(i), f"note {i}: the garden needs watering and the tomatoes are ripe") for i in range(10)]
    )
    pack = await memory.context("garden tomatoes", user_id="u1", k=8)
    assert len(pack.hits) == 8
    assert pack.scope == Scope(user_id="u1")
    full = pack.render()
    assert full.count("\n- [") == 8
    small = pack.render(60)
    assert 0 < small.count("\n- [") < 8
    assert full.startswith(small)
