"""Headers every answer carries that keep a browser from turning the server against its user.

The inspector shows strangers' chat messages: its page may run only its own script (no inline
code, nothing from elsewhere), may not be framed by another site (a click on "forget" through an
invisible frame), and no answer is taken for another type than it says it is.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Styles may be inline: the inspector colours its tags with a style attribute, and a style runs
# no code. Everything else is the page's own origin.
INSPECTOR_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"
)
EVERY_ANSWER = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """Pure ASGI middleware: the headers above on every answer, and the inspector's policy on its
    pages (the API's schema page at /docs loads its viewer from elsewhere and keeps working)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        inspector = path == "/" or path.startswith("/ui")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(EVERY_ANSWER)
                if inspector:
                    headers.append((b"content-security-policy", INSPECTOR_POLICY.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
