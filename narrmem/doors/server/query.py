"""Query strings held to UTF-8: a value whose bytes are not UTF-8 is refused with 422 naming it.

Starlette decodes a query string with ``errors="replace"``, so ``?user_id=%FF`` read the id
``"\ufffd"``, one the client never sent, and an encoded lone surrogate (``%ED%A0%80``) the same.
A JSON body with either is already refused naming its field; so is a query string now.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send


def first_undecodable(query_string: bytes) -> str | None:
    """The name of the first parameter whose name or value is not UTF-8 once percent-decoded
    (``+`` is a space, as in a form), or ``None`` when every one is."""
    for pair in query_string.split(b"&"):
        if not pair:
            continue
        raw_name, _, raw_value = pair.partition(b"=")
        name = unquote_to_bytes(raw_name.replace(b"+", b" "))
        value = unquote_to_bytes(raw_value.replace(b"+", b" "))
        try:
            # Python's UTF-8 codec refuses encoded surrogates (ED A0 80) as well as stray bytes.
            name.decode("utf-8")
            value.decode("utf-8")
        except UnicodeDecodeError:
            return name.decode("utf-8", errors="replace")
    return None


class QueryUTF8:
    """Pure ASGI middleware: refuses a request whose query string is not UTF-8 before any route
    reads it, in the shape of the app's other 422s (``loc: ["query", name]``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = first_undecodable(scope.get("query_string", b""))
            if name is not None:
                await _refuse(send, name)
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, name: str) -> None:
    error = {"loc": ["query", name], "msg": "is not valid UTF-8", "type": "query_not_utf8"}
    body = json.dumps({"detail": [error], "field": name}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 422, "headers": headers})
    await send({"type": "http.response.body", "body": body})
