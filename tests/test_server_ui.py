"""The inspector page in real headless Chromium, against the real server (uvicorn on 127.0.0.1)
over a seeded store: pick a user, see the timeline, open a memory's importance plot, run a recall
and read its explanation, forget a scene and then a user, each after a confirmation."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from _helpers import msg

from narrmem.clock import ManualClock
from narrmem.doors.server import create_app
from narrmem.memory import Memory
from narrmem.models import MemoryRecord
from narrmem.testing import open_memory

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CHROMIUM_ARGS = (
    "--no-sandbox --disable-gpu --disable-background-networking --disable-component-update "
    "--no-first-run --disable-sync"
).split()
# What ann said, and how many days before NOW.
SEED = {
    "I decided to quit my job at the bank": 120,
    "I finally finished my first marathon!": 90,
    "I love hiking in the mountains with my sister": 60,
    "I regret not calling my grandfather more often": 30,
    "so tired today after the night shift": 3,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """The app over a seeded memory, served by uvicorn in a thread with its own event loop."""

    def __init__(self, folder: Path, more: Callable[[Memory], Awaitable[None]] | None = None) -> None:
        self.folder = folder
        self.more = more  # what a test adds to the seed
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | None = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start()
            self.failure = exc

    async def _serve(self) -> None:
        clock = ManualClock(NOW)
        async with open_memory(self.folder, clock=clock, plugin={"hippocampus": {"reinforce": True}}) as mem:
            for n, (text, days_ago) in enumerate(SEED.items(), start=1):
                when = (NOW - timedelta(days=days_ago)).isoformat()
                await mem.ingest(msg(f"a{n}", text, user="ann", chat="dm-ann", ts=when))
            await mem.ingest(msg("b1", "I adopted a greyhound named Pixel", user="bob", chat="dm-bob"))
            scenes = [r for r in await mem.users("default") if r["user_id"] == "ann"]
            assert scenes and scenes[0]["scenes"] >= 3
            # A reinforcement in the first scene's history, for the plot to show.
            hits = await mem.recall("quit my job at the bank", user_id="ann", reinforce=False)
            await mem.mark_used([h.id for h in hits[:1]], user_id="ann")
            if self.more is not None:
                await self.more(mem)
            app = create_app(mem)
            config = uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
            self.server = uvicorn.Server(config)
            await self.server.serve()

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not (self.server is not None and self.server.started):
            if self.failure is not None:
                raise self.failure
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "memory")
    server.start()
    yield server
    server.stop()


def test_inspector_in_chromium(live: LiveServer, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed (apt-get install chromium)"
    shots: list[Path] = []

    def shot(page: Any, name: str) -> None:
        path = tmp_path / f"inspector-{len(shots) + 1}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        shots.append(path)
        print(f"screenshot: {path}")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(live.url + "/ui/")

        # Pick a user: the timeline shows their scenes with type, Core and source messages.
        page.click('#users button[data-user="ann"]')
        scenes = page.locator("#scenes li")
        expect(scenes.first).to_be_visible()
        count = scenes.count()
        assert count >= 3
        expect(page.locator("#timeline-plot circle")).to_have_count(count)
        expect(page.locator("#scenes")).to_contain_text("I decided to quit my job at the bank")
        expect(page.locator("#scenes")).to_contain_text("from messages a1")
        expect(page.locator("#scenes .tag").first).to_have_text("decision")
        expect(page.locator("#facts")).to_contain_text("quit their job at the bank")
        expect(page.locator("#summary")).not_to_be_empty()
        shot(page, "timeline")

        # Open a memory: its importance over time, with the reinforcement and its reason.
        page.locator("#scenes li", has_text="quit my job").locator(".show-importance").click()
        expect(page.locator("#importance-svg .decay-curve")).to_be_visible()
        expect(page.locator("#importance-svg .reinforcement")).to_have_count(1)
        expect(page.locator("#importance-events")).to_contain_text("used")
        shot(page, "importance")

        # The recall playground explains each hit, and reinforces nothing.
        before = httpx.get(live.url + "/v1/memories/2/history").json()["events"]
        page.fill("#recall-query", "what did ann decide about the bank?")
        page.click('#recall-form button[type="submit"]')
        expect(page.locator("#recall-results .hit").first).to_be_visible()
        expect(page.locator("#recall-results .why").first).to_contain_text("dense")
        expect(page.locator("#recall-results .why").first).to_contain_text("bank")
        assert httpx.get(live.url + "/v1/memories/2/history").json()["events"] == before
        shot(page, "recall")

        # Forget a scene: nothing happens before the confirmation; then it is gone.
        target = page.locator("#scenes li", has_text="marathon")
        scene_id = target.get_attribute("data-scene")
        target.locator(".forget-scene").click()
        expect(page.locator("#confirm")).to_be_visible()
        shot(page, "confirm")
        page.click("#confirm-cancel")
        expect(page.locator(f'#scenes li[data-scene="{scene_id}"]')).to_have_count(1)
        target.locator(".forget-scene").click()
        page.click("#confirm-ok")
        expect(page.locator(f'#scenes li[data-scene="{scene_id}"]')).to_have_count(0)
        expect(page.locator("#scenes li")).to_have_count(count - 1)
        assert httpx.get(f"{live.url}/v1/memories/{scene_id}/history").status_code == 404

        # Forget the user: the button stays disabled until their id is typed.
        page.click("#forget-user")
        expect(page.locator("#confirm-ok")).to_be_disabled()
        page.fill("#confirm-typed", "ann")
        expect(page.locator("#confirm-ok")).to_be_enabled()
        page.click("#confirm-ok")
        expect(page.locator('#users button[data-user="ann"]')).to_have_count(0)
        expect(page.locator('#users button[data-user="bob"]')).to_have_count(1)
        shot(page, "after-forget")
        assert errors == []
        browser.close()
    users = httpx.get(live.url + "/v1/users").json()
    assert [u["user_id"] for u in users] == ["bob"]
    assert all(path.stat().st_size > 10_000 for path in shots)


# --- what the audit of 2026-12 found --------------------------------------------------------

MANY_USERS = 1000  # with ann, bob and carl: more than the server's page of 1000
ALL_USERS = MANY_USERS + 3
MANY_SCENES = 230  # more than the soul_narrative tool lists at once (200)
MANY_FACTS = 520  # more than the facts table shows (500)


async def crowd(mem: Memory) -> None:
    """Many users, a user with many scenes, a task chain in a chat without facts, and another
    tenant with a user named ann too."""
    when = NOW - timedelta(days=1)

    def row(user: str, n: int, kind: str = "episode", **meta: Any) -> MemoryRecord:
        at = when + timedelta(minutes=n)
        text = f"Core: carl's moment {n}" if kind == "scene" else f"hello {n}"
        return MemoryRecord(
            kind=kind, user_id=user, chat_id="c", text=text, created_at=at, stored_at=at,
            message_ids=[f"{user}-{n}"], meta=meta,
        )  # fmt: skip

    rows = [row(f"x{n:04d}", n) for n in range(MANY_USERS)]
    rows += [row("carl", n, "scene", category="general", source="message") for n in range(MANY_SCENES)]
    await mem.store.add(rows, await mem.embedder.embed([r.text for r in rows]))
    for start in range(0, MANY_FACTS, 50):
        triplets = [
            {"subject": "user", "relation": "likes", "object": f"zqthing {n}"}
            for n in range(start, min(start + 50, MANY_FACTS))
        ]
        await mem.call_tool("memory_commit", {"user_id": "carl", "chat_id": "c", "triplets": triplets})
    task = {"user_id": "ann", "chat_id": "work", "task_id": "draft_cv", "description": "write the CV"}
    await mem.call_tool("task_create", task)
    await mem.ingest(msg("o1", "I adopted a greyhound named Pixel", user="ann", chat="dm", tenant="other"))
    # ann: a fact linked to nothing of hers, which a walk from "user" never reached.
    owes = {"subject": "bob", "relation": "owes_money_to", "object": "mallory"}
    await mem.call_tool("memory_commit", {"user_id": "ann", "chat_id": "dm-ann", "triplets": [owes]})
    # bob: a persona of one chat's own, and a stranger's word of 3,000 letters.
    await mem.call_tool(
        "persona_set", {"user_id": "bob", "chat_id": "pc", "description": "a pirate who rhymes"}
    )
    await mem.ingest(msg("b2", "I decided to name my boat " + "A" * 3000, user="bob", chat="dm-bob"))
    await mem.ingest(msg("b3", "I decided to call my shop \u202egnp.exe, really", user="bob", chat="dm-bob"))


@pytest.fixture
def crowded(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "memory", crowd)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def browser_page(crowded: LiveServer) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed (apt-get install chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(crowded.url + "/ui/")
        yield page
        assert errors == []
        browser.close()


def test_every_user_is_reached_a_page_at_a_time(browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    buttons = page.locator("#users button[data-user]")
    expect(buttons).to_have_count(1000)
    expect(page.locator("#users-count")).to_contain_text("more exist")
    page.click("#users-more")
    expect(buttons).to_have_count(ALL_USERS)
    expect(page.locator('#users button[data-user="x0999"]')).to_have_count(1)
    expect(page.locator("#users-more")).to_be_hidden()
    expect(page.locator("#users-count")).to_have_text(f"{ALL_USERS} users in default")


def test_every_scene_is_reached_and_a_cut_timeline_says_so(browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.click('#users button[data-user="carl"]')
    expect(page.locator("#scenes li")).to_have_count(200)
    expect(page.locator("#scenes-count")).to_contain_text(f"200 of {MANY_SCENES} scenes")
    page.click("#scenes-more")
    expect(page.locator("#scenes li")).to_have_count(MANY_SCENES)
    expect(page.locator("#timeline-plot circle")).to_have_count(MANY_SCENES)
    expect(page.locator("#scenes-more")).to_be_hidden()
    expect(page.locator("#scenes-count")).to_have_text(f"{MANY_SCENES} scenes.")
    expect(page.locator("#scenes li").first).to_contain_text("carl's moment 0")


def test_switching_tenant_or_key_leaves_nothing_of_the_user_before(
    crowded: LiveServer, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.click('#users button[data-user="ann"]')
    expect(page.locator("#scenes li").first).to_be_visible()
    page.fill("#recall-query", "the bank")
    page.click('#recall-form button[type="submit"]')
    expect(page.locator("#recall-results .hit").first).to_be_visible()

    page.select_option("#tenant", "other")
    expect(page.locator('#users button[data-user="ann"]')).to_have_count(1)  # other's ann
    expect(page.locator("#user-view")).to_be_hidden()
    expect(page.locator("#empty-view")).to_be_visible()
    expect(page.locator("#recall-results")).to_be_empty()
    expect(page.locator("#scenes li")).to_have_count(0)
    expect(page.locator("#users button.selected")).to_have_count(0)
    # The old view's buttons, pressed anyway (as a script could), do nothing to other's ann.
    page.evaluate("document.getElementById('forget-user').click()")
    page.evaluate("document.querySelector('#recall-form button[type=submit]').click()")
    expect(page.locator("#confirm")).to_be_hidden()
    expect(page.locator("#recall-results")).to_be_empty()
    others = httpx.get(crowded.url + "/v1/users", params={"tenant": "other"}).json()
    assert [u["user_id"] for u in others] == ["ann"]

    # Another key (a server without keys takes any) resets the view too.
    page.select_option("#tenant", "default")
    page.click('#users button[data-user="ann"]')
    expect(page.locator("#user-view")).to_be_visible()
    page.evaluate(
        "const key = document.getElementById('key'); key.value = 'nmk_other';"
        "key.dispatchEvent(new Event('change'))"
    )
    expect(page.locator("#user-view")).to_be_hidden()
    expect(page.locator("#empty-view")).to_be_visible()


def test_forgetting_a_scene_refreshes_the_users_counts(browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    ann = page.locator('#users button[data-user="ann"]')
    ann.click()
    scenes = page.locator("#scenes li")
    expect(scenes.first).to_be_visible()
    count = scenes.count()
    before = httpx.get(page.url.split("/ui/")[0] + "/v1/users", params={"limit": 1}).json()[0]
    assert before["user_id"] == "ann" and before["scenes"] == count
    expect(page.locator("#user-meta")).to_contain_text(f"{before['memories']} memories, {count} scenes")
    page.locator("#scenes li", has_text="marathon").locator(".forget-scene").click()
    page.uncheck("#confirm-also")  # the scene alone: its message stays
    page.click("#confirm-ok")
    expect(scenes).to_have_count(count - 1)
    fresh = f"{before['memories'] - 1} memories, {count - 1} scenes"
    expect(page.locator("#user-meta")).to_contain_text(fresh)
    expect(ann).to_contain_text(f"{before['memories'] - 1} memories · {count - 1} scenes")
    expect(ann).to_have_class("selected")  # the selection is kept
    expect(page.locator("#scenes-count")).to_have_text(f"{count - 1} scenes.")


def test_task_chains_of_chats_without_facts_are_shown(browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.click('#users button[data-user="ann"]')
    expect(page.locator("#facts")).to_contain_text("quit their job at the bank")  # in dm-ann
    expect(page.locator("#tasks")).to_contain_text("Task chain in work: draft_cv [in_progress] write the CV")


def test_a_cut_facts_table_says_more_are_stored(browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.click('#users button[data-user="carl"]')
    expect(page.locator("#facts-cut")).to_contain_text("The first 500 facts about the user are shown")
    expect(page.locator("#facts tbody tr")).to_have_count(501)
    page.click('#users button[data-user="ann"]')
    expect(page.locator("#facts")).to_contain_text("quit their job at the bank")
    expect(page.locator("#facts")).to_contain_text("owes_money_to")  # linked to nothing of hers
    expect(page.locator("#facts-cut")).to_have_count(0)


def test_the_patterns_caption_says_where_the_counts_come_from(browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.click('#users button[data-user="ann"]')
    expect(page.locator("#patterns-panel")).to_contain_text("Read from the store")
    expect(page.locator("#patterns-panel")).not_to_contain_text("since it started")


def test_forgetting_a_scene_with_its_messages_leaves_the_bot_nothing_of_it(
    crowded: LiveServer, browser_page: Any
) -> None:
    """The dialog said the scene would be "deleted for good"; the message it came from, and the
    fact drawn from it, stayed, and the bot was still given them."""
    from playwright.sync_api import expect

    def context() -> str:
        ask = {"text": "what about my job at the bank?", "user_id": "ann", "reinforce": False}
        return str(httpx.post(crowded.url + "/v1/context", json=ask).json()["rendered"])

    page = browser_page
    assert "quit my job at the bank" in context()
    page.click('#users button[data-user="ann"]')
    expect(page.locator("#facts")).to_contain_text("quit their job at the bank")
    page.locator("#scenes li", has_text="quit my job").locator(".forget-scene").click()
    expect(page.locator("#confirm-also-text")).to_contain_text("Also forget the message of chat dm-ann")
    expect(page.locator("#confirm-also")).to_be_checked()
    page.click("#confirm-ok")
    expect(page.locator("#scenes li", has_text="quit my job")).to_have_count(0)
    expect(page.locator("#facts")).not_to_contain_text("quit their job at the bank")
    assert "bank" not in context()
    # Unticked, the scene alone goes, as before.
    page.locator("#scenes li", has_text="marathon").locator(".forget-scene").click()
    page.uncheck("#confirm-also")
    page.click("#confirm-ok")
    expect(page.locator("#scenes li", has_text="marathon")).to_have_count(0)
    ask = {"text": "did I run a marathon?", "user_id": "ann", "reinforce": False}
    assert "marathon" in httpx.post(crowded.url + "/v1/context", json=ask).json()["rendered"]


def test_a_chats_own_persona_is_shown_and_a_long_word_keeps_the_page_in_its_window(
    browser_page: Any,
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.click('#users button[data-user="bob"]')
    expect(page.locator("#persona")).to_contain_text("Persona in pc: a pirate who rhymes")
    expect(page.locator("#persona")).to_contain_text("Persona (default): none set")
    # A direction override in a stranger's words is shown as what it is, not obeyed.
    expect(page.locator("#scenes li", has_text="call my shop").first).to_contain_text("shop ⟦U+202E⟧gnp")
    expect(page.locator("#scenes li", has_text="AAAA")).to_have_count(1)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1400, width  # the window's width: it was about 31,000 px
    buttons = page.locator("#scenes li", has_text="AAAA").locator(".forget-scene").bounding_box()
    assert buttons is not None and buttons["x"] < 1400
