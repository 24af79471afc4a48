"""``narrmem serve`` behind a real nginx (Debian's ``nginx``) that serves it under a path, with
the settings a bot author writes first (``location /memory/ { proxy_pass http://...:PORT/; }``):
the inspector works under the path in a real Chromium, the schema page finds its document with
``--root-path``, and the event stream's events come through as they happen (nginx's default
buffering passes them at once: this test holds that).

Before: the inspector's page asked ``/v1/...`` at the proxy's root (404: it showed no user),
``/memory/`` redirected to ``/ui/`` outside the path, and ``/memory/docs`` asked for
``/openapi.json`` at the root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from _helpers import free_port, msg, narrmem_serve

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
CHROMIUM_ARGS = (
    "--no-sandbox --disable-gpu --disable-background-networking --no-first-run --disable-sync".split()
)
TIRED = ["so tired today", "so tired again today", "still so tired today", "tired today again"]


@contextlib.contextmanager
def _nginx(upstream: int) -> Iterator[str]:
    """nginx on a free port, passing ``/memory/`` to ``upstream``'s root; yields its base URL."""
    if not os.path.exists(NGINX):
        pytest.fail("these tests need nginx: apt-get install nginx (the README's test command does)")
    folder = Path(tempfile.mkdtemp(prefix="narrmem-nginx-"))
    port = free_port()
    temp = " ".join(
        f"{kind}_temp_path {folder / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (folder / "nginx.conf").write_text(
        f"""daemon off;
master_process off;
pid {folder / "nginx.pid"};
error_log {folder / "error.log"} warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
  {temp}
  server {{
    listen 127.0.0.1:{port};
    location /memory/ {{
      proxy_pass http://127.0.0.1:{upstream}/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""
    )
    process = subprocess.Popen(
        [NGINX, "-p", str(folder), "-c", str(folder / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with httpx.Client() as client:
                    client.get(f"http://127.0.0.1:{port}/")
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"nginx did not start: {process.stderr.read().decode() if process.stderr else ''}"
                    ) from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/memory"
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[str]:
    upstream = free_port()
    with narrmem_serve(tmp_path / "memory", upstream, "--root-path", "/memory"), _nginx(upstream) as base:
        yield base


def _tired(i: int) -> dict[str, object]:
    when = datetime.now(UTC) - timedelta(days=6 - i)
    return msg(f"t{i}", TIRED[i], user="ann", chat="dm-ann", ts=when.isoformat())


def test_events_come_through_the_proxy_as_they_happen(proxied: str) -> None:
    heard: list[str] = []
    with httpx.Client(base_url=proxied, timeout=30) as client:
        with client.stream("GET", "/v1/events", params={"tenant": "default"}) as stream:
            assert stream.status_code == 200
            fired = []
            for i in range(len(TIRED)):
                answer = client.post("/v1/ingest", json=_tired(i))
                assert answer.status_code == 200, answer.text
                fired += answer.json()["triggers"]
            assert fired, "the messages made no trigger event"
            started = time.monotonic()
            for line in stream.iter_lines():
                heard.append(line)
                if line.startswith("event:") and "keepalive" not in line:
                    break
            waited = time.monotonic() - started
    assert any(line.startswith("data:") or line.startswith("event:") for line in heard)
    assert waited < 5, f"the event waited {waited:.1f} s in the proxy"


def test_the_inspector_and_the_schema_page_work_under_the_proxys_path(proxied: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with httpx.Client(base_url=proxied, timeout=30) as client:
        for i in range(2):
            assert client.post("/v1/ingest", json=_tired(i)).status_code == 200
        assert (
            client.post(
                "/v1/ingest", json=msg("p1", "I adopted a greyhound named Pixel", user="bob")
            ).status_code
            == 200
        )
        root = client.get("/", follow_redirects=False)
        assert root.status_code in (302, 307) and root.headers["location"] == "ui/"
        docs = client.get("/docs")
        assert docs.status_code == 200 and "'/memory/openapi.json'" in docs.text
        document = client.get("/openapi.json")
        assert document.status_code == 200 and document.json()["servers"][0]["url"] == "/memory"

    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed (apt-get install chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(proxied + "/")
        assert page.url == proxied + "/ui/"
        expect(page.locator('#users button[data-user="bob"]')).to_be_visible()
        page.click('#users button[data-user="bob"]')
        expect(page.locator("#user-title")).to_contain_text("bob")
        browser.close()
    assert errors == []


@pytest.mark.parametrize("path", ["memory", "/a//b", "/a/../b", "/a b", "/a?b"])
def test_a_root_path_that_is_not_one_is_refused(tmp_path: Path, path: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "narrmem.doors.cli",
            "serve",
            "--data",
            str(tmp_path / "m"),
            "--root-path",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--root-path" in done.stderr
    assert not (tmp_path / "m").exists()
