"""The ``Host`` check against DNS rebinding: Starlette's, answering a refusal as every other error
of the API is answered (JSON ``{"detail", "field"}``), not with Starlette's text/plain 400, which a
client generated from the OpenAPI document could not read."""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HOST_REFUSED = json.dumps({"detail": "Invalid host header", "field": "host"}).encode()


class _CheckersSend:
    """The ``send`` the check is given: what the check answers itself (its refusal) becomes the
    JSON refusal; the app behind the check is handed ``real`` and answers unchanged."""

    def __init__(self, real: Send) -> None:
        self.real = real

    async def __call__(self, message: Message) -> None:
        # The check answers nothing but its refusal: www redirects are off.
        if message["type"] == "http.response.start":
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(HOST_REFUSED)).encode()),
            ]
            await self.real({"type": "http.response.start", "status": message["status"], "headers": headers})
        elif message["type"] == "http.response.body":
            await self.real({"type": "http.response.body", "body": HOST_REFUSED})
        else:
            await self.real(message)


class TrustedHost:
    """Starlette's :class:`TrustedHostMiddleware` (only these ``allowed_hosts``, no www redirect),
    its refusal as JSON."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.check = TrustedHostMiddleware(
            self._passed, allowed_hosts=list(allowed_hosts), www_redirect=False
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.check(scope, receive, _CheckersSend(send))

    async def _passed(self, scope: Scope, receive: Receive, send: Send) -> None:
        real = send.real if isinstance(send, _CheckersSend) else send
        await self.app(scope, receive, real)
