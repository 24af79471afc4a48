"""A forget made by one worker of a shared PostgreSQL store reaches what the other workers keep in
RAM: their cached chat turns, retellings and label vectors of the scope go when they are told
(``narrmem_forgotten_elsewhere``, over the store's ``NOTIFY``), where before they stayed until
evicted (weeks, in a quiet chat). A listener that lost its connection drops every cache."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _helpers import msg
from _postgres import fresh_database
from narrmem_plugins.graph import GraphPlugin
from narrmem_plugins.recall_hybrid import HybridRecall
from narrmem_plugins.rtm import RTMPlugin

from narrmem import ManualClock, hookimpl
from narrmem.testing import open_memory

T0 = datetime(2026, 5, 1, 9, tzinfo=UTC)


def said(message_id: str, text: str, user: str, minutes: float, chat: str = "g1") -> dict[str, Any]:
    return msg(message_id, text, user=user, chat=chat, ts=(T0 + timedelta(minutes=minutes)).isoformat())


class Told:
    narrmem_name = "told"

    def __init__(self) -> None:
        self.scopes: list[tuple[str | None, str | None, str | None]] = []

    @hookimpl
    def narrmem_forgotten_elsewhere(
        self, tenant: str | None, user_id: str | None, chat_id: str | None
    ) -> None:
        self.scopes.append((tenant, user_id, chat_id))


async def until(condition: Any, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not told in time")


async def test_another_workers_forget_empties_this_workers_caches(tmp_path: Path) -> None:
    storage = {"backend": "postgres", "dsn": await fresh_database("notices")}
    clock = ManualClock(T0 + timedelta(hours=1))
    told = Told()
    async with (
        open_memory(tmp_path / "a", clock=clock, storage=storage, plugins=[told]) as a,
        open_memory(tmp_path / "b", clock=clock, storage=storage) as b,
    ):
        for k in range(3):
            await a.ingest(
                said(f"a{k}", f"my sister Lucia moved to Porto, she teaches violin {k}", "ann", 2 * k)
            )
            await a.ingest(said(f"b{k}", f"the garden tomatoes are ripening, batch {k}", "bob", 2 * k + 1))
        await a.summary(user_id="ann")
        await a.recall("where does Lucia live", user_id="ann", reinforce=False)
        hybrid = a.host.plugin(HybridRecall)
        rtm = a.host.plugin(RTMPlugin)
        graph = a.host.plugin(GraphPlugin)
        hybrid._recent[("default", "g1")] = [(T0, "a0", "my sister Lucia moved to Porto")]
        assert ("default", "ann") in rtm.users.cached_users()

        await b.forget(user_id="ann")
        await until(lambda: ("default", "ann", None) in told.scopes)
        assert ("default", "g1") not in hybrid._recent
        assert ("default", "ann") not in rtm.users.cached_users()
        assert graph._graph is not None and len(graph._graph.label_vectors) == 0

        # A deleted message of a chat: that chat's turns go.
        hybrid._recent[("default", "g1")] = [(T0, "b0", "the garden tomatoes")]
        await b.forget_messages(chat_id="g1", message_ids=["b0"])
        await until(lambda: ("default", None, "g1") in told.scopes)
        assert ("default", "g1") not in hybrid._recent
        # Its own forgets are not told back to it.
        assert all(scope[1] != "bob" for scope in told.scopes)
        await a.forget(user_id="bob")
        await asyncio.sleep(0.5)
        assert all(scope[1] != "bob" for scope in told.scopes)


async def test_a_listener_that_lost_its_connection_drops_every_cache(tmp_path: Path) -> None:
    storage = {"backend": "postgres", "dsn": await fresh_database("notices")}
    told = Told()
    async with open_memory(tmp_path / "a", clock=ManualClock(T0), storage=storage, plugins=[told]) as a:
        hybrid = a.host.plugin(HybridRecall)
        hybrid._recent[("t1", "c1")] = [(T0, "m1", "a turn")]
        notices = a._forgetting.notices
        assert notices._listening is not None
        notices._lost()
        await until(lambda: (None, None, None) in told.scopes)
        assert not hybrid._recent
