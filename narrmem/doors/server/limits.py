"""Bounded request bodies: a body over the limit is refused with 413 before it is read whole, and
one that has not come whole within the deadline with 408 (a client that sends a byte now and then
held its connection, and a file descriptor, for ever). Bounded requests at once: one beyond the
limit is refused with 503, JSON and ``Retry-After`` as every other 503 of the server (uvicorn's
own limit answered in plain text, without ``Retry-After``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """An HTTP error itself: the framework re-raises those from its body parser as they are (any
    other error there becomes a 400)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=f"the request body exceeds {max_bytes} bytes")


class BodyTooSlow(HTTPException):
    """The connection is closed with the answer: the rest of the body is not waited for."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            status_code=408,
            detail=f"the request body did not come whole within {seconds:g} s",
            headers={"Connection": "close"},
        )


class BodyLimit:
    """Pure ASGI middleware: checks ``Content-Length`` first, then counts the bytes as they come
    (a chunked body has no length to check). The body must have come whole ``timeout`` seconds
    after the request began (``None``: no deadline)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _refuse(send, 400, "Content-Length is not a number")
                    return
                if declared > self.max_bytes:
                    await _refuse(send, 413, BodyTooLarge(self.max_bytes).detail)
                    return
        seen = 0
        started = False
        whole = False
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout

        async def counting_receive() -> Message:
            nonlocal seen, whole
            if whole or deadline is None:
                message = await receive()  # once the body is in, only a disconnect comes: no deadline
            else:
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
                except TimeoutError:
                    raise BodyTooSlow(self.timeout or 0) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except (BodyTooLarge, BodyTooSlow) as refusal:
            if not started:
                await _refuse(send, refusal.status_code, refusal.detail, refusal.headers)


# Answered however many requests run: a supervisor's liveness probe that met the limit took a
# busy process for a hung one and restarted it. (/readyz is limited: busy is not ready.)
UNLIMITED_PATHS = frozenset({"/healthz"})
RETRY_AFTER_S = 1


class RequestsAtOnce:
    """Pure ASGI middleware: at most ``limit`` HTTP requests are served at once (an event stream
    counts for as long as it is open); one more is answered 503 at once."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.serving = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _route_path(scope) in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.serving >= self.limit:
            detail = f"the server serves {self.limit} requests at once (--max-connections): try again"
            await _refuse(send, 503, detail, {"Retry-After": str(RETRY_AFTER_S)})
            return
        self.serving += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.serving -= 1


def _route_path(scope: Scope) -> str:
    """The request's path within the app (a root path a proxy serves it under taken off)."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


async def _refuse(send: Send, status: int, detail: str, extra: Mapping[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((name.lower().encode(), value.encode()) for name, value in (extra or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
