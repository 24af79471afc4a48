"""A plugin whose after-store hook finds the store unreachable (it went away between the message's
write and that hook) has its hook run again for that message once the store answers, in the same
process, and at the next open when the process stopped first; the plugins whose hooks ran are not
run twice. Before, the failure was isolated and logged, the record of the hooks' work deleted, and
what that plugin derives of the message (facts, counts) was lost for good."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from _pgproxy import behind_proxy

from narrmem import Memory, StoreUnavailableError, hookimpl, settling, trying_again
from narrmem.testing import open_memory


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.05, 0.1))
    monkeypatch.setattr(trying_again, "RETRY_EVERY", 0.2)


class Derives:
    """A plugin that derives something of each stored message in the store; ``away`` times its
    hook finds the store unreachable."""

    def __init__(self, name: str, away: int = 0) -> None:
        self.narrmem_name = name
        self.away = away
        self.derived: list[str] = []

    @hookimpl
    def narrmem_after_store(self, message: Any) -> None:
        if self.away:
            self.away -= 1
            raise StoreUnavailableError("the database went away after the write")
        self.derived.append(message.message_id)


async def _entries(memory: Memory) -> list[tuple[str, dict[str, Any]]]:
    return await memory.store.state_items(settling.NAMESPACE)


async def _until(check: Any, what: str) -> None:
    for _ in range(300):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


@pytest.mark.parametrize("acknowledge", ["after_hooks", "after_write", "on_receipt"])
async def test_a_hook_that_found_the_store_away_runs_again_for_its_message_alone(
    tmp_path: Path, acknowledge: str
) -> None:
    flaky, steady = Derives("flaky", away=2), Derives("steady")
    async with open_memory(
        tmp_path / "m", plugins=[flaky, steady], storage={"acknowledge": acknowledge}
    ) as memory:
        result = await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
        assert result.stored
        await memory.written(user_id="ann")
        await memory.settle()
        if acknowledge == "after_hooks":
            assert any("'flaky' found the store unreachable" in note for note in result.notes)
        assert flaky.derived == [] and steady.derived == ["1"]

        async def paid() -> bool:
            return flaky.derived == ["1"] and not await _entries(memory)

        await _until(paid, "the owed hook did not run again, or its entry stayed")
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="ann"))
        await memory.settle()
        # Each hook ran once for each message: the steady plugin's were not run again.
        assert flaky.derived == ["1", "2"] and steady.derived == ["1", "2"]


async def test_messages_owed_by_many_ingests_are_paid_by_one_loop(tmp_path: Path) -> None:
    """A store away for an hour left a batch owing per message, each with a retry loop of its
    own: 36,000 loops at 10 messages a second, each trying the store as it came back (and each
    logging every try). One loop pays them all."""
    flaky = Derives("flaky", away=10_000)
    async with open_memory(tmp_path / "m", plugins=[flaky]) as memory:
        for i in range(30):
            await memory.ingest(msg(str(i), f"I adopted a greyhound, walk number {i}", user="ann"))
        await memory.settle()
        assert memory.hooks_owed == 30
        assert memory._settling.trying_again.under_way == 1
        flaky.away = 3  # the store answers after three more tries

        async def paid() -> bool:
            return memory.hooks_owed == 0 and not await _entries(memory)

        await _until(paid, "the owed hooks were not all run again")
        assert sorted(flaky.derived, key=int) == list(map(str, range(30)))
        assert memory._settling.trying_again.under_way == 0
        # A later failure starts the loop again.
        flaky.away = 1
        await memory.ingest(msg("30", "I grow tomatoes on my balcony", user="ann"))
        await memory.settle()
        await _until(paid, "the hook owed after the loop ended was not run again")
        assert flaky.derived[-1] == "30"


class AwayForOne:
    """A plugin whose own backend is away for one message, whatever the store does."""

    narrmem_name = "away_for_one"

    def __init__(self) -> None:
        self.derived: list[str] = []

    @hookimpl
    def narrmem_after_store(self, message: Any) -> None:
        if message.message_id == "0":
            raise StoreUnavailableError("this plugin's own service is away")
        self.derived.append(message.message_id)


async def test_a_message_whose_plugin_is_always_away_holds_no_other_back(tmp_path: Path) -> None:
    stuck, flaky = AwayForOne(), Derives("flaky", away=10_000)
    async with open_memory(tmp_path / "m", plugins=[stuck, flaky]) as memory:
        for i in range(6):
            await memory.ingest(msg(str(i), f"I adopted a greyhound, walk number {i}", user="ann"))
        await memory.settle()
        flaky.away = 2

        async def others_paid() -> bool:
            return sorted(flaky.derived) == [str(i) for i in range(6)] and memory.hooks_owed == 1

        await _until(others_paid, "the messages owed after the stuck one were not run again")
        assert sorted(stuck.derived) == ["1", "2", "3", "4", "5"]


async def test_a_loop_that_ended_without_paying_is_started_again(tmp_path: Path) -> None:
    flaky = Derives("flaky", away=10_000)
    async with open_memory(tmp_path / "m", plugins=[flaky]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
        await memory.settle()
        loop = memory._settling._paying
        assert loop is not None
        loop.cancel()  # as a hook's await of a future cancelled elsewhere would end it
        await asyncio.gather(loop, return_exceptions=True)
        flaky.away = 1
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="ann"))
        await memory.settle()

        async def paid() -> bool:
            return memory.hooks_owed == 0 and not await _entries(memory)

        await _until(paid, "no loop tried the owed hooks again")
        assert sorted(flaky.derived) == ["1", "2"]


async def test_what_is_still_owed_at_close_runs_at_the_next_open_for_that_plugin_alone(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "m"
    away, steady = Derives("flaky", away=1_000), Derives("steady")
    async with open_memory(folder, plugins=[away, steady]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="ann"))

        async def marked() -> bool:
            return [v.get("owed") for _, v in await _entries(memory)] == [["flaky"], ["flaky"]]

        await _until(marked, "the entries were not marked with the plugin whose hook is owed")
    assert away.derived == [] and steady.derived == ["1", "2"]

    back, steady_again = Derives("flaky"), Derives("steady")
    async with open_memory(folder, plugins=[back, steady_again]) as memory:
        assert back.derived == ["1", "2"]
        assert steady_again.derived == []  # its hooks had run: not a second time
        assert await _entries(memory) == []


async def test_closed_at_once_after_the_failure_the_next_open_runs_the_owed_plugin_alone(
    tmp_path: Path,
) -> None:
    """Closed before the first try again (a bot stopped right after an outage began): the marks
    were only written by that try, and the next open ran every plugin's hooks again."""
    folder = tmp_path / "m"
    away, steady = Derives("flaky", away=1_000), Derives("steady")
    async with open_memory(folder, plugins=[away, steady]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
    back, steady_again = Derives("flaky"), Derives("steady")
    async with open_memory(folder, plugins=[back, steady_again]):
        assert back.derived == ["1"] and steady_again.derived == []


async def test_what_a_stopped_process_owed_and_finds_the_store_away_again_is_tried_by_the_next(
    tmp_path: Path,
) -> None:
    """The hooks a stopped process owed find the store away again at the next open: that
    process takes them as its own and tries again (they were left to the open after it)."""
    folder = tmp_path / "m"
    async with open_memory(folder, plugins=[Derives("flaky", away=1_000)]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
    again = Derives("flaky", away=1)
    async with open_memory(folder, plugins=[again]) as memory:

        async def paid() -> bool:
            return again.derived == ["1"] and not await _entries(memory)

        await _until(paid, "the owed hook was not tried again by the process that found it owed")


async def test_a_message_forgotten_while_its_hook_is_owed_is_not_run_again(tmp_path: Path) -> None:
    flaky = Derives("flaky", away=1_000)
    async with open_memory(tmp_path / "m", plugins=[flaky]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="bob"))
        await asyncio.sleep(0.2)
        assert flaky.derived == []
        await memory.forget(user_id="ann")
        flaky.away = 0

        async def paid() -> bool:
            return not await _entries(memory)

        await _until(paid, "the owed entries stayed")
        assert flaky.derived == ["2"]
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'ann'") == [(0,)]


async def test_a_real_outage_between_the_write_and_the_hooks_on_postgresql(tmp_path: Path) -> None:
    """PostgreSQL goes away right after a message is written (a plugin of the test's, whose hook
    runs first, cuts it): the built-in plugins' hooks find it unreachable. Once it is back, they
    run for that message, and what they derive is there: the graph's fact of it."""
    from _pgproxy import Proxy

    class CutsAfterTheWrite:
        narrmem_name = "cuts"

        def __init__(self) -> None:
            self.proxy: Proxy | None = None

        @hookimpl
        def narrmem_after_store(self, message: Any) -> None:
            if self.proxy is not None and message.message_id == "3":
                self.proxy.cut()

    async with behind_proxy(tmp_path) as (memory, proxy):
        cuts = CutsAfterTheWrite()
        memory.host.register(cuts, name="cuts")  # registered last: its hook runs first
        cuts.proxy = proxy
        result = await memory.ingest(msg("3", "I work as a nurse at the city hospital", user="ann"))
        assert result.stored
        owed = {note.split("'")[1] for note in result.notes if "found the store unreachable" in note}
        assert "graph" in owed, result.notes
        await asyncio.sleep(0.2)
        proxy.mode = "pass"

        async def paid() -> bool:
            return not await _entries(memory)

        await _until(paid, "the owed hooks did not run once the server was back")
        facts = await memory.call_tool(
            "memory_recall", {"user_id": "ann", "chat_id": "c1", "query_intent": "nurse"}
        )
        assert "user job nurse at the city hospital" in facts["rendered"], facts


async def test_an_owed_hook_that_closes_the_memory_does_not_hang_the_close(tmp_path: Path) -> None:
    """A hook tried again whose work closes the memory (a trigger callback that shuts the bot
    down): the close waited for the try, and the try for the close."""

    class Closes:
        narrmem_name = "closes"

        def __init__(self) -> None:
            self.away = 1
            self.memory: Memory | None = None
            self.closed = False

        @hookimpl
        async def narrmem_after_store(self) -> None:
            if self.away:
                self.away -= 1
                raise StoreUnavailableError("the database went away after the write")
            assert self.memory is not None
            await self.memory.close()
            self.closed = True

    closes = Closes()
    async with open_memory(tmp_path / "m", plugins=[closes]) as memory:
        closes.memory = memory
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))

        async def closed() -> bool:
            return closes.closed

        await asyncio.wait_for(_until(closed, "the close from the owed hook did not return"), 30)
        assert memory.closed
