"""The inspector page in real headless Chromium, against the real server (uvicorn on 127.0.0.1)
over a seeded store: pick a user, see the timeline, open a memory's importance plot, run a recall
and read its explanation, forget a scene and then a user, each after a confirmation."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from _helpers import msg

from narrmem.clock import ManualClock
from narrmem.doors.server import create_app
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

    def __init__(self, folder: Path) -> None:
        self.folder = folder
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
