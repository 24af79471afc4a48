"""Liveness and readiness, for what runs the server: a supervisor, a container orchestrator, a load
balancer in front of several workers.

``GET /healthz`` answers 200 as long as the process serves requests (restart it when it does not).
``GET /readyz`` answers 200 only when a request would be served now: the server is not stopping
(a worker that has begun to stop answers 503 at once, so a load balancer sends the next requests
elsewhere while this one finishes its own), the memory is open, and its store answers a read
within :data:`READY_WITHIN_S` (a PostgreSQL that went away, a database locked by another
process). Neither needs a key and neither says anything of what is stored; reading the store's
state writes nothing.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from narrmem.doors.server.schemas import ErrorBody

if TYPE_CHECKING:
    from narrmem.doors.server.app import ServerState

READY_WITHIN_S = 2.0
NOT_READY = "not ready: stopping, closed, or the store does not answer"
# A key no plugin writes: reading it reaches the store's database and finds nothing.
PROBE = ("narrmem.health", "ready")
PROBING = "narrmem.health.probe"  # ServerState.extra: a probe that outlived its answer


class Health(BaseModel):
    status: Literal["ok", "ready"]


def health_routes() -> APIRouter:
    # No key (an empty security list says so to a generated client); a Host the server does not
    # answer to is refused as on every route.
    router = APIRouter(
        tags=["health"],
        responses={400: {"model": ErrorBody, "description": "the Host header is not one of the server's"}},
    )
    open_to_all: dict[str, Any] = {"security": []}

    @router.get("/healthz", response_model=Health, openapi_extra=open_to_all)
    async def healthz() -> Health:
        """The process serves requests."""
        return Health(status="ok")

    @router.get(
        "/readyz",
        response_model=Health,
        responses={503: {"model": ErrorBody, "description": NOT_READY}},
        openapi_extra=open_to_all,
    )
    async def readyz(request: Request) -> Health | JSONResponse:
        """A request would be served now: not stopping, the memory open, its store answering."""
        problem = await not_ready(request.app.state.narrmem)
        if problem is not None:
            return JSONResponse({"detail": problem}, status_code=503, headers={"Retry-After": "1"})
        return Health(status="ready")

    return router


async def not_ready(state: ServerState | None) -> str | None:
    """Why the server would not serve a request now, or ``None``."""
    if state is None:
        return "this app has no memory (it was built for its schema only)"
    if state.hub.stopping:
        return "the server is stopping"
    memory = state.memory
    if memory.closed:
        return "the memory is closed"
    slow = f"the store did not answer within {READY_WITHIN_S:g} s"
    earlier: asyncio.Future[Any] | None = state.extra.get(PROBING)
    if earlier is not None and not earlier.done():
        return slow  # the last probe has not come back: no second one piles up behind it
    probe: asyncio.Future[Any] = asyncio.ensure_future(memory.store.state_get(*PROBE))
    # Not wait_for: it waits for the cancelled read to end, and a read of a PostgreSQL that has
    # stalled does not end (the first probe hung for as long as the stall). The read is left to
    # end by itself, kept until then; the answer does not wait for it.
    done, _ = await asyncio.wait({probe}, timeout=READY_WITHIN_S)
    if not done:
        state.extra[PROBING] = probe
        probe.add_done_callback(_ended)
        return slow
    error = probe.exception()
    if error is not None:  # whatever its driver raises: the answer says the store cannot be read
        return f"the store cannot be read ({type(error).__name__})"
    return None


def _ended(probe: asyncio.Future[Any]) -> None:
    if not probe.cancelled():
        probe.exception()  # read, so that its failure is not reported as never retrieved
