"""The per-turn flow answers for whoever reads the answer: asked in a group, the person's facts
and memories are those said in that group; what they told the bot in private, or in another
group, stays out. Before, the facts came from every chat of theirs: a DM's "I work at the
Ministry of Defence and I'm dating Jordan" was in the prompt of an answer in #general, while the
memories beside it (and ``context``) kept to the group."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from _helpers import msg

from narrmem.doors.server import create_app
from narrmem.testing import open_memory

pytestmark = pytest.mark.slow

DM, GROUP, OTHER_GROUP = "dm-111", "general", "book-club"
SAID = [
    msg("m1", "I work at the Ministry of Defence", user="111", chat=DM, ts="2026-05-04T09:00:00+00:00"),
    msg("m2", "I like hiking in the mountains", user="111", chat=GROUP, ts="2026-05-04T09:05:00+00:00"),
    msg("m3", "I live in Porto", user="111", chat=OTHER_GROUP, ts="2026-05-04T09:10:00+00:00"),
]


def _told(answer: dict[str, object]) -> str:
    return str(answer["rendered"]) + str(answer["facts"]) + str(answer["memories"])


async def test_a_group_answer_holds_only_what_was_said_in_that_group(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", real_model=True) as mem:
        await mem.ingest_many(SAID)
        facts = await mem.call_tool("memory_facts", {"user_id": "111"})
        assert {f["object"] for f in facts["facts"]} >= {"Ministry of Defence", "hiking in the mountains"}

        group = await mem.turn_context(
            "anyone up for hiking? where do you work?", user_id="111", chat_id=GROUP
        )
        assert "hiking" in _told(group)
        assert "Ministry" not in _told(group) and "Porto" not in _told(group)

        # In the direct chat, what the person said anywhere: the bot talks to them alone.
        private = await mem.turn_context("where do I work and live?", user_id="111", chat_id=DM, private=True)
        assert {"Ministry of Defence", "Porto"} <= {f["object"] for f in private["facts"]}
        assert any("Porto" in hit["text"] for hit in private["memories"])
        # Not said to be private, a direct chat is a chat like any other.
        plain = await mem.turn_context("where do I work and live?", user_id="111", chat_id=DM)
        assert "Porto" not in _told(plain) and "Ministry of Defence" in _told(plain)

        app = create_app(mem)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            body = {"text": "where do you work?", "user_id": "111", "chat_id": GROUP}
            over_http = (await c.post("/v1/turn-context", json=body)).json()
            assert "Ministry" not in _told(over_http)
            body = {**body, "chat_id": DM, "private": True}
            over_http = (await c.post("/v1/turn-context", json=body)).json()
            assert "Ministry of Defence" in {f["object"] for f in over_http["facts"]}
