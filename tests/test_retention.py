"""Retention: the people who have said nothing for a while are forgotten, by the store's own
queries, as a forget forgets (nothing of them stays), a person who speaks as the pass reaches them
kept, and a pass that would forget everyone (a clock a year ahead) refused. The schedule runs one
pass per interval across a store's workers; the CLI lists who would go without changing anything."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, on_sqlite, store_sql
from narrmem_plugins.retention import Retention

from narrmem import ManualClock, Scope, forgetting, hookimpl, retention, trying_again
from narrmem.errors import ConfigError, InputError, PluginError
from narrmem.forgetting import PURGE_OWED
from narrmem.testing import open_memory

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
YEAR_AGO = NOW - timedelta(days=365)


def said(
    message_id: str, text: str, user: str, days_ago: float, chat: str = "group", tenant: str = "default"
) -> dict[str, Any]:
    return msg(
        message_id, text, user=user, chat=chat, tenant=tenant, ts=(NOW - timedelta(days=days_ago)).isoformat()
    )


HISTORY = [
    said("1", "my favourite food is spicy ramen with a soft egg", "ann", 500),
    said("2", "we moved to Lisbon last spring, the light there is amazing", "ann", 400),
    said("3", "I adopted a greyhound named Pixel from the shelter", "bob", 420),
    said("4", "I decided to quit my job at the bank and study pottery", "bob", 30),
    said("5", "the bakery shifts start at five and I am always tired", "cat", 10),
    said("6", "my sister is getting married in Porto this autumn", "ann", 600, chat="other", tenant="guild"),
    said("7", "our band finally booked a gig at the harbour bar", "dan", 2, chat="other", tenant="guild"),
]


async def texts(memory: Any, user: str, tenant: str = "default") -> list[str]:
    found = await memory.store.recent(Scope(tenant=tenant, user_id=user), kinds=["episode"], limit=100)
    return sorted(r.text for r in found)


async def test_the_people_silent_since_the_time_are_listed_without_a_change_then_forgotten(
    tmp_path: Path,
) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        before_stats = await memory.stats()
        listed = await memory.inactive_people(before=YEAR_AGO)
        assert [(p["tenant"], p["user_id"]) for p in listed] == [("default", "ann"), ("guild", "ann")]
        assert (
            listed[0]["memories"] >= 2 and listed[0]["last_said"] == (NOW - timedelta(days=400)).isoformat()
        )
        # Paged, and a tenant of its own; the listing wrote nothing.
        first = await memory.inactive_people(before=YEAR_AGO, limit=1)
        assert (
            await memory.inactive_people(before=YEAR_AGO, after=(first[0]["tenant"], first[0]["user_id"]))
            == listed[1:]
        )
        assert [p["user_id"] for p in await memory.inactive_people(before=YEAR_AGO, tenant="guild")] == [
            "ann"
        ]
        assert await memory.stats() == before_stats

        counts = await memory.forget_inactive(before=YEAR_AGO)
        assert counts["people"] == 2 and counts["memories"] >= 3 and counts["spoke_since"] == 0
        assert counts["refused"] == 0
        assert await texts(memory, "ann") == [] and await texts(memory, "ann", "guild") == []
        # bob spoke within the year (his old memory stays with him), cat and dan too.
        assert (
            len(await texts(memory, "bob")) == 2
            and await texts(memory, "cat")
            and await texts(memory, "dan", "guild")
        )
        # Nothing left to find the second time.
        assert (await memory.forget_inactive(before=YEAR_AGO))["people"] == 0
        # The person did not ask: no forget mark. A late write of what they said within the
        # year (a bot's catch-up after downtime) is stored, and an old one goes at the next pass.
        recent = said("50", "I finally opened my own ceramics studio in Lisbon", "ann", 2)
        assert not await memory.forgotten_after(recent, NOW - timedelta(days=1))
        [late, old] = await memory.ingest_many(
            [recent, said("1", HISTORY[0]["text"], "ann", 500)], history=True
        )
        assert late.stored and old.stored
        assert (await memory.forget_inactive(before=YEAR_AGO))["people"] == 0
        assert len(await texts(memory, "ann")) == 2


@pytest.mark.sqlite_only("reads the SQLite file's bytes")
async def test_no_byte_of_a_person_forgotten_for_silence_stays_in_the_files(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        await memory.forget_inactive(before=YEAR_AGO)
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"ramen" not in data and b"Lisbon" not in data and b"married in Porto" not in data, path
    assert b"greyhound" in (folder / "narrmem.sqlite3").read_bytes()  # bob's, who stays


async def test_a_person_who_speaks_as_the_pass_reaches_them_is_kept(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        store = memory.store
        listing = store.inactive_people

        async def listed_then_ann_speaks(*args: Any, **kwargs: Any) -> Any:
            page = await listing(*args, **kwargs)
            if page and page[0].user_id == "ann" and page[0].tenant == "default":
                await memory.ingest(said("9", "back from Lisbon, I missed this group so much", "ann", 0))
            return page

        store.inactive_people = listed_then_ann_speaks  # type: ignore[method-assign]
        counts = await memory.forget_inactive(before=YEAR_AGO, tenant="default")
        assert counts == {"people": 0, "memories": 0, "spoke_since": 1, "refused": 0, "busy": 0}
        assert len(await texts(memory, "ann")) == 3


async def test_a_message_received_and_waiting_for_its_write_keeps_the_person(tmp_path: Path) -> None:
    # Acknowledged on receipt, its write fails (a lock held a moment) until the pass has run: it
    # waits for its next try, a memory of no one's yet, as the pass reaches her.
    async with open_memory(
        tmp_path / "m", clock=ManualClock(NOW), storage={"acknowledge": "on_receipt"}
    ) as memory:
        await memory.ingest_many(HISTORY)
        await memory.settle()
        store = memory.store
        failed: list[str] = []
        passed = asyncio.Event()
        for name in ("add_with_context", "add"):
            write = getattr(store, name)

            async def fails_until_passed(*args: Any, _write: Any = write, **kwargs: Any) -> Any:
                if not passed.is_set():
                    failed.append("locked")
                    raise sqlite3.OperationalError("database is locked")
                return await _write(*args, **kwargs)

            setattr(store, name, fails_until_passed)
        received = await memory.ingest(
            said("9", "back from Lisbon, I opened a ceramics studio by the river", "ann", 0)
        )
        assert received.stored and not received.written
        for _ in range(100):
            if failed:
                break
            await asyncio.sleep(0.02)
        assert failed
        counts = await memory.forget_inactive(before=YEAR_AGO, tenant="default")
        passed.set()
        assert counts["people"] == 0 and counts["spoke_since"] == 1
        for _ in range(100):  # its next try comes 2 s after the first failed
            if len(await texts(memory, "ann")) == 3:
                break
            await asyncio.sleep(0.05)
        assert len(await texts(memory, "ann")) == 3


async def test_a_message_another_worker_received_keeps_the_person(tmp_path: Path) -> None:
    from narrmem.inbox import NAMESPACE

    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        # Another worker's entry: received on receipt, its write not yet made.
        message = {**said("9", "back from Lisbon at last", "ann", 0), "speaker": None, "meta": {}}
        await memory.store.state_put(NAMESPACE, "other-worker:1", {"message": message, "decision": {}})
        counts = await memory.forget_inactive(before=YEAR_AGO, tenant="default")
        assert counts["people"] == 0 and counts["spoke_since"] == 1
        assert len(await texts(memory, "ann")) == 2
        await memory.store.state_delete(NAMESPACE, "other-worker:1")


async def test_a_message_received_during_the_persons_forget_is_kept(tmp_path: Path) -> None:
    async with open_memory(
        tmp_path / "m", clock=ManualClock(NOW), storage={"acknowledge": "on_receipt"}
    ) as memory:
        await memory.ingest_many(HISTORY)
        await memory.settle()
        store = memory.store
        begin = store.begin_forget
        answers: list[Any] = []

        async def she_speaks_as_it_begins(**scope: Any) -> Any:
            job = await begin(**scope)
            if scope.get("user_id") == "ann" and not answers:
                new = said("9", "back from Lisbon, I opened a ceramics studio", "ann", 0)
                answers.append(await asyncio.wait_for(memory.ingest(new), 5))
            return job

        store.begin_forget = she_speaks_as_it_begins  # type: ignore[method-assign]
        counts = await memory.forget_inactive(before=YEAR_AGO, tenant="default")
        assert counts["people"] == 1 and answers[0].stored
        await memory.settle()
        assert await texts(memory, "ann") == ["back from Lisbon, I opened a ceramics studio"]


@pytest.mark.sqlite_only("reads the SQLite file's bytes")
async def test_a_pass_cancelled_midway_leaves_no_byte_of_whom_it_forgot(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        store = memory.store
        begin = store.begin_forget
        begun = asyncio.Event()

        async def slow_begin(**scope: Any) -> Any:
            job = await begin(**scope)
            begun.set()
            await asyncio.sleep(0.2)  # the first person's forget takes a moment
            return job

        store.begin_forget = slow_begin  # type: ignore[method-assign]
        task = asyncio.create_task(memory.forget_inactive(before=YEAR_AGO, tenant="default"))
        await begun.wait()
        task.cancel()  # a timeout around the call, a bot's shutdown
        with pytest.raises(asyncio.CancelledError):
            await task
        # The forget it began went on to its end, and the purge it owed was run.
        assert await texts(memory, "ann") == []
        assert await store.state_get(*PURGE_OWED) is None
    data = b"".join(path.read_bytes() for path in folder.rglob("*") if path.is_file())
    assert b"ramen" not in data and b"Lisbon" not in data


async def test_one_pass_at_a_time_and_a_silent_tenant_of_its_own_goes(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        await memory.ingest(said("60", "our guild raid night is every Thursday", "zed", 700, tenant="gone"))
        first, second = await asyncio.gather(
            memory.forget_inactive(before=YEAR_AGO, tenant="default"),
            memory.forget_inactive(before=YEAR_AGO, tenant="default"),
        )
        assert sorted([first["busy"], second["busy"]]) == [0, 1]
        assert first["people"] + second["people"] == 1
        # Everyone of "gone" is silent, not everyone of the store: the clock is right.
        counts = await memory.forget_inactive(before=YEAR_AGO, tenant="gone")
        assert counts["refused"] == 0 and counts["people"] == 1 and await texts(memory, "zed", "gone") == []


async def test_a_pass_that_would_forget_everyone_is_refused_unless_forced(tmp_path: Path) -> None:
    # The machine's clock woke two years ahead: no one has spoken "in a year".
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW + timedelta(days=730))) as memory:
        await memory.ingest_many(HISTORY)
        later_year_ago = NOW + timedelta(days=365)
        counts = await memory.forget_inactive(before=later_year_ago)
        assert counts["refused"] == 1 and counts["people"] == 0
        assert await texts(memory, "cat")
        assert (await memory.forget_inactive(before=later_year_ago, tenant="default"))["refused"] == 1
        forced = await memory.forget_inactive(before=later_year_ago, force=True)
        assert forced["people"] == 5 and await texts(memory, "cat") == []


async def test_a_write_dated_by_a_clock_a_year_ahead_does_not_let_the_pass_forget_everyone(
    tmp_path: Path,
) -> None:
    # The machine woke 400 days ahead; a minute later a message came over the ingest tool without
    # a time (dated by that clock), then the schedule's pass ran: that one write was someone who
    # had spoken since the cut-off, and everyone else went, cat who spoke ten days before.
    clock = ManualClock(NOW)
    policy = {"retention": {"inactive_days": 365}}
    async with open_memory(tmp_path / "m", clock=clock, plugin=policy) as memory:
        await memory.ingest_many(HISTORY)
        clock.set(NOW + timedelta(days=400))
        stated = await memory.call_tool(
            "narrmem_ingest",
            {"text": "I decided to open a bakery", "user_id": "eve", "chat_id": "c-eve", "message_id": "e1"},
        )
        assert stated["memory_ids"]
        plugin = memory.host.plugin(Retention)
        assert plugin is not None
        counts = await plugin.pass_if_due(memory)
        assert counts is not None and counts["refused"] == 1 and counts["people"] == 0
        assert await texts(memory, "cat") and await texts(memory, "bob")
        # An hour on, asked by hand: still refused (the writes of the last day are not counted).
        clock.set(NOW + timedelta(days=400, hours=1))
        assert (await memory.forget_inactive(before=NOW + timedelta(days=35)))["refused"] == 1
        # The clock put right: the pass forgets whom the policy names, and no one else.
        clock.set(NOW)
        counts = await memory.forget_inactive(before=YEAR_AGO)
        assert counts["refused"] == 0 and counts["people"] == 2  # ann, in both tenants
        assert await texts(memory, "cat") and await texts(memory, "ann") == []


async def test_a_pass_over_an_empty_store_or_a_bot_started_today_is_not_refused(tmp_path: Path) -> None:
    """Nothing said before the last day: no one can be found silent, and the pass is not refused
    (it was, with a warning that the clock was wrong, on every fresh install for a day)."""
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        assert (await memory.forget_inactive(before=YEAR_AGO))["refused"] == 0
        await memory.ingest(said("1", "I adopted a greyhound named Pixel", "ann", 0.25))
        counts = await memory.forget_inactive(before=NOW - timedelta(days=1))
        assert counts["refused"] == 0 and counts["people"] == 0 and await texts(memory, "ann")


async def test_a_pass_tells_its_progress_person_by_person(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        done: list[int] = []
        counts = await memory.forget_inactive(before=YEAR_AGO, progress=done.append)
        assert done == [1, 1] and counts["people"] == 2
        with pytest.raises(InputError) as wrong:
            await memory.forget_inactive(before=YEAR_AGO, progress="bar")  # type: ignore[arg-type]
        assert wrong.value.field == "progress"


async def test_bad_arguments_are_refused_naming_the_field(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        with pytest.raises(InputError) as later:
            await memory.forget_inactive(before=NOW + timedelta(hours=1))
        assert later.value.field == "before"
        with pytest.raises(InputError) as naive:
            await memory.forget_inactive(before=datetime(2025, 1, 1))
        assert naive.value.field == "before"
        with pytest.raises(InputError) as force:
            await memory.forget_inactive(before=YEAR_AGO, force="false")  # type: ignore[arg-type]
        assert force.value.field == "force"
        with pytest.raises(InputError) as page:
            await memory.inactive_people(before=YEAR_AGO, after=("default",))  # type: ignore[arg-type]
        assert page.value.field == "after"
        with pytest.raises(InputError) as limit:
            await memory.inactive_people(before=YEAR_AGO, limit=0)
        assert limit.value.field == "limit"
        assert len(await texts(memory, "ann")) == 2


async def test_the_schedule_runs_one_pass_an_interval_across_workers(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    options = {"retention": {"inactive_days": 365, "interval_hours": 24}}
    async with open_memory(tmp_path / "m", clock=clock, plugin=options) as memory:
        await memory.ingest_many(HISTORY)
        plugin = memory.host.plugin(Retention)
        assert plugin is not None
        first = await plugin.pass_if_due(memory)
        assert first is not None and first["people"] == 2
        assert await plugin.pass_if_due(memory) is None  # within the interval
        # A second worker of the store finds the pass begun within the interval.
        other = Retention()
        other.options = plugin.options
        assert await other.pass_if_due(memory) is None
        clock.advance(hours=25)
        await memory.ingest(said("10", "I am learning to sail on the river this summer", "eve", 500))
        # A command's pass holds the store: the scheduled one finds it busy, and stays due.
        async with memory.store.exclusive("retention"):
            busy = await plugin.pass_if_due(memory)
        assert busy is not None and busy["busy"] == 1 and len(await texts(memory, "eve")) == 1
        again = await plugin.pass_if_due(memory)
        assert again is not None and again["people"] == 1 and await texts(memory, "eve") == []


async def test_the_policy_is_off_by_default_and_a_fraction_of_a_day_is_refused(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest_many(HISTORY)
        plugin = memory.host.plugin(Retention)
        assert plugin is not None and await plugin.pass_if_due(memory) is None
        assert len(await texts(memory, "ann")) == 2
    with pytest.raises(ConfigError, match="inactive_days"):
        async with open_memory(tmp_path / "n", plugin={"retention": {"inactive_days": 0.3}}):
            pass


async def test_the_cli_lists_who_would_go_then_forgets_them(tmp_path: Path) -> None:
    from narrmem.doors import cli

    data = tmp_path / "data"
    now = datetime.now(UTC)
    recent = [{**m, "ts": (now - (NOW - datetime.fromisoformat(m["ts"]))).isoformat()} for m in HISTORY]
    async with open_memory(data, real_model=True) as memory:
        await memory.ingest_many(recent)
    base = ["--data", str(data)]
    file = data / "narrmem.sqlite3"
    before = file.read_bytes() if file.exists() else None
    assert await asyncio.to_thread(cli.main, ["retention", "--days", "365", "--dry-run", *base]) == 0
    assert before is None or file.read_bytes() == before  # a dry run reads only
    assert await asyncio.to_thread(cli.main, ["retention", "--before", "2026-01-01", *base]) == 2
    today = datetime.now(UTC).isoformat()
    assert await asyncio.to_thread(cli.main, ["retention", "--before", today, *base]) == 2  # under a day
    # No one has spoken for a day (the newest memory is two days old): refused, dry run or not.
    assert await asyncio.to_thread(cli.main, ["retention", "--days", "1", "--dry-run", *base]) == 1
    assert await asyncio.to_thread(cli.main, ["retention", "--days", "1", *base]) == 1
    assert await asyncio.to_thread(cli.main, ["retention", *base]) == 2  # no days, none configured
    assert await asyncio.to_thread(cli.main, ["retention", "--days", "365", "--json", *base]) == 0
    async with open_memory(data, real_model=True, read_only=True) as memory:
        assert await texts(memory, "ann") == [] and len(await texts(memory, "bob")) == 2


async def test_the_cli_dry_run_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from narrmem.doors import cli

    data = tmp_path / "data"
    now = datetime.now(UTC)
    async with open_memory(data, real_model=True) as memory:
        await memory.ingest_many(
            [{**m, "ts": (now - (NOW - datetime.fromisoformat(m["ts"]))).isoformat()} for m in HISTORY]
        )
    capsys.readouterr()
    arguments = ["retention", "--days", "365", "--dry-run", "--json", "--data", str(data)]
    assert await asyncio.to_thread(cli.main, arguments) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["people"] == 2 and [p["user_id"] for p in report["inactive"]] == ["ann", "ann"]
    async with open_memory(data, real_model=True, read_only=True) as memory:
        assert len(await texts(memory, "ann")) == 2 and len(await texts(memory, "ann", "guild")) == 1


async def test_people_known_only_by_what_the_tools_wrote_go_when_nothing_of_theirs_is_new(
    tmp_path: Path,
) -> None:
    """A bot that writes what it learns with the graph's tools alone (over MCP) stores no memory:
    retention found no one, and their facts and trees stayed for good."""
    clock = ManualClock(YEAR_AGO - timedelta(days=30))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        for person in ("ann", "bob"):
            await memory.call_tool(
                "memory_commit",
                {
                    "user_id": person,
                    "chat_id": f"dm-{person}",
                    "triplets": [{"subject": "user", "relation": "likes", "object": f"jazz of {person}"}],
                },
            )
        await memory.call_tool(
            "rtm_create_narrative_tree",
            {"text": "I moved to Lisbon. Then I found a job. It rained.", "title": "t", "user_id": "ann"},
        )
        clock.set(NOW - timedelta(days=3))  # bob is told of again lately
        await memory.call_tool(
            "memory_commit",
            {
                "user_id": "bob",
                "chat_id": "dm-bob",
                "triplets": [{"subject": "user", "relation": "likes", "object": "blues"}],
            },
        )
        clock.set(NOW)
        listed = [p async for p in retention.all_inactive(memory, YEAR_AGO)]
        assert [(p["user_id"], p["memories"]) for p in listed] == [("ann", 0)]
        counts = await memory.forget_inactive(before=YEAR_AGO)
        assert (counts["people"], counts["memories"]) == (1, 0)
        held = {
            table: {r[0] for r in await store_sql(memory, f"SELECT DISTINCT user_id FROM {table}")}
            for table in ("graph_nodes", "graph_edges", "rtm_trees")
        }
        assert held == {"graph_nodes": {"bob"}, "graph_edges": {"bob"}, "rtm_trees": set()}
        # Someone with a memory since is theirs to keep, whatever the tools wrote long ago.
        await memory.ingest(said("70", "I still listen to jazz every evening", "bob", 1, chat="dm-bob"))
        assert [p async for p in retention.all_inactive(memory, YEAR_AGO)] == []


async def commit(memory: Any, person: str, likes: str) -> None:
    triplet = {"subject": "user", "relation": "likes", "object": likes}
    await memory.call_tool(
        "memory_commit", {"user_id": person, "chat_id": f"dm-{person}", "triplets": [triplet]}
    )


async def facts_of(memory: Any, person: str) -> int:
    [(n,)] = await store_sql(memory, "SELECT COUNT(*) FROM graph_edges WHERE user_id = ?", [person])
    return int(n)


async def test_what_a_plugin_wrote_lately_keeps_a_person_and_a_silent_store_of_tools_is_refused(
    tmp_path: Path,
) -> None:
    clock = ManualClock(YEAR_AGO - timedelta(days=30))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        # ann: a memory of long ago, a fact the bot stated of her with a tool lately.
        await memory.ingest(said("80", "I keep bees on the roof of our building", "ann", 500))
        for person in ("ann", "bob", "cat"):
            await commit(memory, person, f"old jazz of {person}")
        # The clock woke 400 days ahead: no one said or was told of anything since, by its year.
        clock.set(NOW + timedelta(days=400))
        counts = await memory.forget_inactive(before=NOW + timedelta(days=35))
        assert counts["refused"] == 1 and await facts_of(memory, "bob") == 1
        clock.set(NOW - timedelta(days=3))
        await commit(memory, "ann", "blues, told lately")
        await commit(memory, "dan", "opera, told lately")
        clock.set(NOW)
        listed = {p["user_id"] async for p in retention.all_inactive(memory, YEAR_AGO)}
        assert listed == {"bob", "cat"}
        # The pass visits ann too (kept in her turn): a progress bar's total counts her.
        assert await retention.pass_size(memory, YEAR_AGO) == 3

        # A fact the bot states of cat while the pass goes on keeps her too.
        def progress(done: int) -> None:
            if done and not told:
                told.append(
                    asyncio.get_running_loop().create_task(commit(memory, "cat", "told during the pass"))
                )

        told: list[asyncio.Task[None]] = []
        counts = await memory.forget_inactive(before=YEAR_AGO, progress=progress)
        await asyncio.gather(*told)
        assert (counts["people"], counts["spoke_since"]) == (1, 2)  # bob goes; ann and cat stay
        assert [await facts_of(memory, p) for p in ("ann", "bob", "cat", "dan")] == [2, 0, 2, 1]
        assert await texts(memory, "ann") == ["I keep bees on the roof of our building"]


async def test_the_cli_dry_run_refuses_a_silent_store_of_tools_as_the_pass_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from narrmem.doors import cli

    data = tmp_path / "data"
    now = datetime.now(UTC)
    async with open_memory(data, real_model=True, clock=ManualClock(now - timedelta(days=400))) as memory:
        await commit(memory, "ann", "jazz")
        await commit(memory, "bob", "blues")
    capsys.readouterr()
    arguments = ["retention", "--days", "365", "--dry-run", "--json", "--data", str(data)]
    assert await asyncio.to_thread(cli.main, arguments) == 1  # refused, as the pass would be
    # Someone told of lately: the clock is right, and the others go.
    async with open_memory(data, real_model=True, clock=ManualClock(now - timedelta(days=1))) as memory:
        await commit(memory, "cat", "opera")
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, arguments) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["user_id"] for p in report["inactive"]] == ["ann", "bob"]


class ScrubsOnceFailing:
    """A plugin whose service is down at the first forget it is told of (its scrub fails): the
    forget is tried again later, in the process and at the next open."""

    def __init__(self) -> None:
        self.told: list[dict[str, Any]] = []
        self.down = True

    @hookimpl
    def narrmem_after_forget(
        self, user_id: str | None, chat_id: str | None, messages: list[str] | None
    ) -> None:
        if self.down:
            self.down = False
            raise RuntimeError("the plugin's service is down")
        self.told.append({"user_id": user_id, "chat_id": chat_id, "messages": messages})


async def a_pass_fails_midway(memory: Any, clock: ManualClock) -> None:
    """Ann silent for a year, her forget by the pass failing at a plugin's scrub."""
    await told_long_ago(memory, clock)
    with pytest.raises(PluginError, match="service is down"):
        await memory.forget_inactive(before=YEAR_AGO, tenant="default")


async def fails_midway_then_she_speaks(memory: Any, clock: ManualClock) -> None:
    await a_pass_fails_midway(memory, clock)
    assert await texts(memory, "ann") == []  # the store's part was done
    await memory.ingest(said("9", "back from Lisbon, I opened a ceramics studio", "ann", 0))
    await commit(memory, "ann", "ceramics, told today")


STORY = (
    "Once upon a time a wise king ruled a small kingdom in the green valley of Aster. He loved his "
    "people and they loved him. One winter a dragon came down from the mountains. The king rode "
    "out alone to meet it, and they talked for three days. In the end the dragon stayed."
)


async def told_long_ago(memory: Any, clock: ManualClock) -> None:
    await memory.ingest_many(HISTORY)
    clock.set(YEAR_AGO - timedelta(days=30))
    await commit(memory, "ann", "old jazz, told long ago")
    clock.set(NOW)


@pytest.mark.parametrize("finished", ["tried again in the process", "resumed at the next open"])
async def test_a_silent_persons_forget_finished_after_they_spoke_keeps_what_they_said_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finished: str
) -> None:
    """A retention forget that fails midway (a plugin's service down) is finished later; when the
    person has spoken meanwhile, it took what they said since too, as a forget they asked for."""
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.3,))
    plugin = ScrubsOnceFailing()
    again = finished == "tried again in the process"
    clock = ManualClock(NOW)
    folder = tmp_path / "m"
    async with open_memory(folder, clock=clock, plugins=[plugin]) as memory:
        # Others' trees: a person's across their chats, one of the chat she spoke in.
        for person, chat in (("bob", None), ("cat", "group")):
            await memory.call_tool(
                "rtm_create_narrative_tree",
                {"text": STORY, "title": person, "user_id": person, **({"chat_id": chat} if chat else {})},
            )
        # The clock stands still: the one in the process waits until she has spoken.
        monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.3 if again else 600,))
        await fails_midway_then_she_speaks(memory, clock)
        if again:
            for _ in range(100):
                if not await memory.store.pending_forgets() and not await memory.store.state_get(*PURGE_OWED):
                    break
                await asyncio.sleep(0.05)
        sqlite = on_sqlite(memory)
    async with open_memory(folder, clock=ManualClock(NOW), plugins=[plugin]) as memory:
        assert await memory.store.pending_forgets() == []
        assert await texts(memory, "ann") == ["back from Lisbon, I opened a ceramics studio"]
        # Trees of the words of others stay: only hers could hold what was forgotten.
        trees = await store_sql(memory, "SELECT user_id, chat_id FROM rtm_trees ORDER BY user_id")
        assert [tuple(row) for row in trees] == [("bob", None), ("cat", "group")]
        # What the tools wrote of her today stays; her old words' copies were scrubbed by their ids.
        assert await facts_of(memory, "ann") >= 1
        assert {"user_id": None, "chat_id": "group", "messages": ["1", "2"]} in plugin.told
        assert all(told["user_id"] is None for told in plugin.told)
        assert await memory.store.state_items(forgetting.SILENT_NAMESPACE) == []
    if sqlite:
        # The first try deleted her old words and never got to its purge: the finish ran it.
        assert not [path for path in folder.rglob("*") if path.is_file() and b"ramen" in path.read_bytes()]


async def test_a_silent_persons_forget_finished_while_they_are_silent_still_takes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (600,))
    plugin = ScrubsOnceFailing()
    clock = ManualClock(NOW)
    async with open_memory(tmp_path / "m", clock=clock, plugins=[plugin]) as memory:
        await a_pass_fails_midway(memory, clock)
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW), plugins=[plugin]) as memory:
        assert await memory.store.pending_forgets() == []
        assert await texts(memory, "ann") == [] and await facts_of(memory, "ann") == 0
        assert plugin.told == [{"user_id": "ann", "chat_id": None, "messages": None}]
        assert await memory.store.state_items(forgetting.SILENT_NAMESPACE) == []


class ScrubsFailingTwice(ScrubsOnceFailing):
    @hookimpl
    def narrmem_after_forget(
        self, user_id: str | None, chat_id: str | None, messages: list[str] | None
    ) -> None:
        self.told.append({"user_id": user_id, "chat_id": chat_id, "messages": messages})
        if len(self.told) <= 2:
            raise RuntimeError("the plugin's service is down")


async def test_a_silent_persons_forget_failing_again_after_its_rows_went_still_names_their_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finished after she spoke, the forget deletes what she said before the time (a late write
    of an old message among it), then fails telling a plugin: the next try, which finds those
    rows gone, still names their messages."""
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (600,))
    plugin = ScrubsFailingTwice()
    clock = ManualClock(NOW)
    async with open_memory(tmp_path / "m", clock=clock, plugins=[plugin]) as memory:
        await a_pass_fails_midway(memory, clock)
        old = said("77", "I once kept a tortoise called Gerald in the garden", "ann", 450, chat="zz")
        await memory.ingest_many([old], history=True)  # a backlog of long ago, written late
        await memory.ingest(said("9", "back from Lisbon, I opened a ceramics studio", "ann", 0))
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW), plugins=[plugin]) as memory:
        assert len(await memory.store.pending_forgets()) == 1  # told "group" first, which failed
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW), plugins=[plugin]) as memory:
        assert await memory.store.pending_forgets() == []
        assert await texts(memory, "ann") == ["back from Lisbon, I opened a ceramics studio"]
    assert {"user_id": None, "chat_id": "zz", "messages": ["77"]} in plugin.told[2:]


async def test_a_silent_persons_forget_left_twice_unfinished_keeps_what_they_said_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finished while she was silent still (an old message of hers written late meanwhile), the
    forget recorded a second job naming it, which failed too and was later finished as any
    forget, after she had spoken: the second job is the pass's as the first is."""
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (600,))
    plugin = ScrubsFailingTwice()
    clock = ManualClock(NOW)
    async with open_memory(tmp_path / "m", clock=clock, plugins=[plugin]) as memory:
        await a_pass_fails_midway(memory, clock)
        old = said("77", "I once kept a tortoise called Gerald in the garden", "ann", 450, chat="zz")
        await memory.ingest_many([old], history=True)
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW), plugins=[plugin]) as memory:
        # The first, and the second naming "77", both the pass's.
        pending = await memory.store.pending_forgets()
        assert [job.sources for job in pending] == [{"group": ["1", "2"]}, {"zz": ["77"]}]
        assert len(await memory.store.state_items(forgetting.SILENT_NAMESPACE)) == 2
        await memory.ingest(said("9", "back from Lisbon, I opened a ceramics studio", "ann", 0))
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW), plugins=[plugin]) as memory:
        assert await memory.store.pending_forgets() == []
        assert await texts(memory, "ann") == ["back from Lisbon, I opened a ceramics studio"]
        assert await memory.store.state_items(forgetting.SILENT_NAMESPACE) == []
    assert {"user_id": None, "chat_id": "zz", "messages": ["77"]} in plugin.told[2:]


async def test_a_pass_run_from_hooks_keeps_what_a_person_said_after_their_forget_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from narrmem.fence import own_work

    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (600,))
    plugin = ScrubsOnceFailing()
    clock = ManualClock(NOW)
    async with open_memory(tmp_path / "m", clock=clock, plugins=[plugin]) as memory:
        await told_long_ago(memory, clock)
        with own_work(), pytest.raises(PluginError):  # as a trigger callback would run it
            await memory.forget_inactive(before=YEAR_AGO, tenant="default")
        await memory.ingest(said("9", "back from Lisbon, I opened a ceramics studio", "ann", 0))
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW), plugins=[plugin]) as memory:
        assert await memory.store.pending_forgets() == []
        assert await texts(memory, "ann") == ["back from Lisbon, I opened a ceramics studio"]


async def test_a_person_with_old_memories_and_old_facts_is_visited_once(tmp_path: Path) -> None:
    """Forgotten in their turn, they held no memory after it and were visited again among those
    only plugins keep something of: counted twice (``people`` 3 for two), forgotten twice, and
    told to a progress bar one more time than the pass's size."""
    clock = ManualClock(YEAR_AGO - timedelta(days=30))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest(said("80", "I keep bees on the roof of our building", "ann", 500))
        await commit(memory, "ann", "old jazz")
        await commit(memory, "bob", "old blues")  # bob: what the tools wrote alone
        clock.set(NOW - timedelta(days=2))
        await memory.ingest(said("81", "the bakery shifts start at five", "eve", 2))
        clock.set(NOW)
        size = await retention.pass_size(memory, YEAR_AGO)
        told: list[int] = []
        counts = await memory.forget_inactive(before=YEAR_AGO, progress=told.append)
        assert (counts["people"], counts["spoke_since"]) == (2, 0)
        assert size == len(told) == 2
        assert [await facts_of(memory, p) for p in ("ann", "bob")] == [0, 0]


async def test_a_pass_cut_short_by_a_close_is_due_again_at_the_next_start(tmp_path: Path) -> None:
    """A close (a restart) while the schedule's pass ran left its start noted: the people it had
    not reached waited a whole interval, a day by default, for the next."""
    clock = ManualClock(NOW)
    options = {"retention": {"inactive_days": 365, "interval_hours": 24}}
    async with open_memory(tmp_path / "m", clock=clock, plugin=options) as memory:
        await memory.ingest_many(HISTORY)
        plugin = memory.host.plugin(Retention)
        assert plugin is not None
        entered, held = asyncio.Event(), asyncio.Event()
        forget_inactive = memory.forget_inactive

        async def slow(**kwargs: Any) -> Any:
            entered.set()
            await held.wait()
            return await forget_inactive(**kwargs)

        memory.forget_inactive = slow  # type: ignore[method-assign]
        running = asyncio.ensure_future(plugin.pass_if_due(memory))
        await asyncio.wait_for(entered.wait(), 10)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        memory.forget_inactive = forget_inactive  # type: ignore[method-assign]
        again = await plugin.pass_if_due(memory)
        assert again is not None and again["people"] == 2
