"""Prometheus metrics of a running server: requests by declared route, ingests by layer and
outcome, the event hub's figures and readiness; nothing that names a tenant, a user or a message,
and no label whose values a caller can multiply (a path's ids, an invented method)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from _helpers import free_port, msg, narrmem_serve
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from narrmem.doors.server import create_app
from narrmem.doors.server.metrics import ServerMetrics
from narrmem.testing import open_memory

SERVE = [sys.executable, "-m", "narrmem.doors.cli", "serve"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_requests_and_ingests_are_counted_by_route_and_layer_and_name_no_one(tmp_path: Path) -> None:
    metrics = ServerMetrics()
    async with open_memory(tmp_path / "m") as memory:
        app = create_app(memory, metrics=metrics)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            said = {**msg("m1", "I adopted a greyhound named Pixel", user="alice-secret"), "ts": None}
            del said["ts"]
            assert (await client.post("/v1/ingest", json=said)).status_code == 200
            assert (await client.post("/v1/ingest", json=said)).json()["duplicate"]
            ok = {**said, "message_id": "m2", "text": "ok"}
            assert (await client.post("/v1/ingest", json=ok)).status_code == 200
            assert (await client.post("/v1/ingest", json={"text": 3})).status_code == 422
            hits = await client.post(
                "/v1/recall", json={"query": "greyhound", "scope": {"user_id": "alice-secret"}}
            )
            assert hits.status_code == 200, hits.text
            memory_id = hits.json()[0]["id"]
            assert (await client.get(f"/v1/memories/{memory_id}/history")).status_code == 200
            assert (await client.get("/v1/no-such-route-9f3e")).status_code == 404
            assert (await client.request("BREW", "/v1/stats")).status_code == 405
        text = (await asyncio.to_thread(generate_latest, metrics.registry)).decode()
    samples = _samples(text)
    total = "narrmem_http_requests_total"
    assert _value(samples, total, route="/v1/ingest", method="POST", status="200") == 3
    assert _value(samples, total, route="/v1/ingest", method="POST", status="422") == 1
    history = "/v1/memories/{memory_id}/history"
    assert _value(samples, total, route=history, method="GET", status="200") == 1
    assert _value(samples, total, route="unmatched", method="GET", status="404") == 1
    assert _value(samples, total, route="/v1/stats", method="other", status="405") == 1
    count = "narrmem_http_request_duration_seconds_count"
    assert _value(samples, count, route="/v1/recall", method="POST") == 1
    messages = "narrmem_messages_total"
    assert _value(samples, messages, layer="accumulate", outcome="stored") == 1
    assert _value(samples, messages, layer="accumulate", outcome="duplicate") == 1
    assert _value(samples, messages, layer="ignore", outcome="not_stored") == 1
    assert _value(samples, "narrmem_ready") == 1.0
    assert _value(samples, "process_resident_memory_bytes") > 0
    for private in ("alice", "greyhound", "Pixel", "m1", "no-such-route", "BREW", f"/{memory_id}/history"):
        assert private not in text


async def test_the_event_hub_and_readiness_are_read_when_scraped(tmp_path: Path) -> None:
    metrics = ServerMetrics()
    async with open_memory(tmp_path / "m") as memory:
        app = create_app(memory, metrics=metrics)
        hub = app.state.narrmem.hub
        hub.delivered, hub.dropped = 7, 2  # a webhook's figures, as it counts them
        stream = hub.stream(tenant=None, max_events=None, idle_timeout=None, keepalive=60)
        await anext(stream)  # subscribed
        open_stream = _samples((await asyncio.to_thread(generate_latest, metrics.registry)).decode())
        await stream.aclose()
        hub.stop_streams()
        stopping = _samples((await asyncio.to_thread(generate_latest, metrics.registry)).decode())
    assert _value(open_stream, "narrmem_event_streams") == 1
    assert _value(open_stream, "narrmem_webhook_events_total", outcome="delivered") == 7
    assert _value(open_stream, "narrmem_webhook_events_total", outcome="dropped") == 2
    assert _value(open_stream, "narrmem_ready") == 1.0
    assert _value(stopping, "narrmem_event_streams") == 0
    assert _value(stopping, "narrmem_ready") == 0.0


async def test_hooks_owed_while_the_store_is_away_are_counted(tmp_path: Path, monkeypatch: Any) -> None:
    """An operator sees how many stored messages wait for their plugins' hooks (the store went
    away after the write) and sees it fall to 0 once they ran."""
    from narrmem import StoreUnavailableError, hookimpl, trying_again

    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.3,))

    class AwayOnce:
        narrmem_name = "away_once"

        def __init__(self) -> None:
            self.away = 2

        @hookimpl
        def narrmem_after_store(self) -> None:
            if self.away:
                self.away -= 1
                raise StoreUnavailableError("the database went away after the write")

    metrics = ServerMetrics()
    async with open_memory(tmp_path / "m", plugins=[AwayOnce()]) as memory:
        create_app(memory, metrics=metrics)
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="ann"))
        owed = _samples((await asyncio.to_thread(generate_latest, metrics.registry)).decode())
        for _ in range(200):
            if not memory.hooks_owed:
                break
            await asyncio.sleep(0.02)
        paid = _samples((await asyncio.to_thread(generate_latest, metrics.registry)).decode())
    assert _value(owed, "narrmem_hooks_owed") == 2
    assert _value(paid, "narrmem_hooks_owed") == 0


def test_narrmem_serve_serves_its_metrics_on_their_own_address(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    with narrmem_serve(tmp_path / "m", port, "--metrics", f"127.0.0.1:{metrics_port}") as server:
        said = {
            "text": "I adopted a greyhound named Pixel",
            "user_id": "u1",
            "chat_id": "c1",
            "message_id": "1",
        }
        assert httpx.post(f"http://127.0.0.1:{port}/v1/ingest", json=said, timeout=30).status_code == 200
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404  # not on the API
    samples = _samples(scraped.text)
    ingests = _value(samples, "narrmem_http_requests_total", route="/v1/ingest", method="POST", status="200")
    assert ingests == 1 and _value(samples, "narrmem_ready") == 1.0
    assert server.returncode == 0


def test_a_metrics_address_that_is_not_host_port_exits_2_naming_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SERVE, "--data", str(tmp_path / "m"), "--metrics", "localhost"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--metrics" in done.stderr
    assert not (tmp_path / "m").exists()
