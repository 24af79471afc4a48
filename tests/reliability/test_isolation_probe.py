"""Probes of every read path with other owners' secrets: no scope ever sees what it may not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from narrmem import Message, SceneDraft, Scope, hookimpl

from .common import LONG
from .isolation import PATHS, run_isolation

pytestmark = pytest.mark.reliability

PROBES = 3000 if LONG else 500


def test_no_read_path_shows_another_scope(tmp_path: Path) -> None:
    report = run_isolation(PROBES, seed=31, workdir=tmp_path, real_model=LONG)
    assert report["probes"] >= PROBES
    assert set(report["by_path"]) == set(PATHS)
    assert report["unexpected_errors"] == 0, report["error_examples"]
    # Not vacuous: answers hold their own scope's tokens, and an own token asked for is found.
    assert report["answers_with_own_tokens"] > report["probes"] // 3
    assert report["own_asked"] >= 10
    assert report["own_found"] >= 0.8 * report["own_asked"]
    assert report["population"]["scenes"] > 100 and report["population"]["facts"] > 100
    assert report["forgotten_people"] >= 2 and report["after_forget_probes"] > 0
    assert report["foreign_tokens"] == 0, (report["causes"], report["examples"])
    assert report["forgotten_found"] == 0, report["forgotten_examples"]


class QuotingComposer:
    """A scene composer that writes its Scene line from the chat's last turns, every speaker's
    words included: the leak the probes must see."""

    narrmem_name = "quoting_composer"

    @hookimpl(tryfirst=True)
    async def narrmem_compose_scene(self, memory: Any, message: Message) -> SceneDraft:
        chat = Scope(tenant=message.tenant, chat_id=message.chat_id)
        turns = await memory.store.recent(chat, kinds=["episode"], limit=4)
        words = " ".join(r.text for r in turns)
        return SceneDraft(time="now", scene=f"Talking about {words}", vibe="calm", core=message.text)


def test_the_probes_see_a_scene_that_quotes_other_speakers(tmp_path: Path) -> None:
    report: dict[str, Any] = run_isolation(
        150, seed=5, workdir=tmp_path, users=20, plugins=[QuotingComposer()]
    )
    assert report["foreign_tokens"] > 0
    assert report["causes"].get("user", 0) > 0
