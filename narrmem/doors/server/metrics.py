"""What a running server does, in the Prometheus text format (``narrmem serve --metrics
HOST:PORT``), for the dashboards and alerts of a bot that runs for months as several workers.

Served on an address of its own, by ``prometheus_client``'s own HTTP server (a thread): no key and
no tenant apply there, so nothing in it names a tenant, a user, a chat or a message. Labels are
the route as declared (``/v1/memories/{memory_id}/history``, never the id), the method, the status,
and an ingest's layer: their values are few whatever the traffic.

* ``narrmem_http_requests_total`` and ``narrmem_http_request_duration_seconds``: each request, to
  the end of its answer (an event stream's lasts as long as it is open);
* ``narrmem_messages_total``: each message an ingest answered, by triage layer and outcome
  (``stored``, ``duplicate``, ``not_stored``);
* ``narrmem_event_streams``, ``narrmem_events_held``, ``narrmem_webhook_queue`` and
  ``narrmem_events_voided_total``: the trigger events' hub, read when scraped;
* ``narrmem_events_relayed_total`` (``direction``: ``sent``, ``received``, ``dropped``) and
  ``narrmem_events_relay_listening``: the other workers' events, on a store that relays them
  (:mod:`narrmem.doors.server.relay`);
* ``narrmem_hooks_owed``: stored messages whose plugins' after-store hooks found the store
  unreachable and wait to run again (:mod:`narrmem.settling`);
* ``narrmem_ready``: 1 when the server would serve a request now (see
  :mod:`narrmem.doors.server.health`), read when scraped;
* the process's own (CPU, memory, open files), as ``prometheus_client`` gives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from narrmem.errors import InputError

if TYPE_CHECKING:
    from narrmem.doors.server.app import ServerState
    from narrmem.models import IngestResult

# Seconds: a recall takes milliseconds, an export or a stream minutes.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # a path no route declares: its text is the caller's, never a label


class ServerMetrics:
    """The metrics of one server (one app): a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "narrmem_http_requests",
            "HTTP requests answered, by route as declared, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.durations = Histogram(
            "narrmem_http_request_duration_seconds",
            "HTTP requests from their start to the end of their answer, by route as declared and method",
            ["route", "method"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.messages = Counter(
            "narrmem_messages",
            "messages an ingest answered, by triage layer and outcome",
            ["layer", "outcome"],
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        self._state: ServerState | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, state: ServerState) -> None:
        """Read ``state``'s hub and readiness when scraped (from the scraper's thread; readiness is
        asked of the event loop this is called on)."""
        self._state = state
        with contextlib.suppress(RuntimeError):  # no loop: readiness reads 0
            self._loop = asyncio.get_running_loop()
        self.registry.register(_StateCollector(self))

    def ingested(self, results: Iterable[IngestResult]) -> None:
        for result in results:
            outcome = "duplicate" if result.duplicate else "stored" if result.stored else "not_stored"
            self.messages.labels(layer=result.layer, outcome=outcome).inc()

    def serve(self, address: str) -> Any:
        """Serve the registry at ``address`` (``HOST:PORT``) from a thread of its own; returns the
        server (``shutdown()`` stops it)."""
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as a host and a port; an InputError names ``--metrics``."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{address!r} is not HOST:PORT (a port from 1 to 65535)", field="--metrics")
    return host, int(port)


class _StateCollector(Collector):
    """The hub's and the memory's figures, read when scraped."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self.metrics._state
        if state is None:
            return
        hub = state.hub
        yield GaugeMetricFamily("narrmem_event_streams", "event streams open", value=hub.streams)
        yield GaugeMetricFamily(
            "narrmem_events_held", "trigger events held for streams that resume", value=hub.held
        )
        yield GaugeMetricFamily(
            "narrmem_webhook_queue", "trigger events waiting for the webhook", value=hub.webhook_waiting
        )
        yield CounterMetricFamily(
            "narrmem_events_voided", "trigger events a forget took before delivery", value=hub.forgotten
        )
        webhook = CounterMetricFamily(
            "narrmem_webhook_events",
            "trigger events the webhook took (delivered) or gave up on (dropped: its queue full, "
            "every try failed, or the server closing)",
            labels=["outcome"],
        )
        webhook.add_metric(["delivered"], hub.delivered)
        webhook.add_metric(["dropped"], hub.dropped)
        yield webhook
        relay = hub.relay
        if relay is not None:
            relayed = CounterMetricFamily(
                "narrmem_events_relayed",
                "trigger events sent to the other workers, taken from them, or not relayed",
                labels=["direction"],
            )
            relayed.add_metric(["sent"], relay.sent)
            relayed.add_metric(["received"], relay.received)
            relayed.add_metric(["dropped"], relay.dropped)
            yield relayed
            yield GaugeMetricFamily(
                "narrmem_events_relay_listening",
                "1 when the other workers' events are heard (0: their streams here miss them)",
                value=1.0 if relay.listening else 0.0,
            )
        yield GaugeMetricFamily(
            "narrmem_hooks_owed",
            "stored messages whose plugins' after-store hooks wait for the store to answer",
            value=state.memory.hooks_owed,
        )
        yield GaugeMetricFamily(
            "narrmem_ready", "1 when a request would be served now", value=self._ready(state)
        )

    def _ready(self, state: ServerState) -> float:
        from narrmem.doors.server.health import READY_WITHIN_S, not_ready

        loop = self.metrics._loop
        if loop is None or loop.is_closed():
            return 0.0
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            return 0.0  # scraped on an event loop's own thread: waiting for it there would hang it
        try:
            problem = asyncio.run_coroutine_threadsafe(not_ready(state), loop).result(READY_WITHIN_S + 1)
        except Exception:  # the loop is stopping, or busy past the wait: not ready to say so
            return 0.0
        return 0.0 if problem is not None else 1.0


class RequestMetrics:
    """Pure ASGI middleware: each HTTP request's route, method, status and duration."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = "500"  # an app that raised before it answered

        async def noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            route = scope.get("route")
            # The route as declared: the path itself holds ids (a memory's, a tool's name).
            name = str(getattr(route, "path", UNMATCHED))
            method = str(scope.get("method", ""))
            method = method if method in METHODS else "other"  # the caller's text, never a label
            self.metrics.requests.labels(route=name, method=method, status=status).inc()
            self.metrics.durations.labels(route=name, method=method).observe(time.perf_counter() - start)
