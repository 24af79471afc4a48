"""Running an HTTP door (``narrmem serve``, ``narrmem mcp --http``) on uvicorn.

uvicorn ends the process with exit code 3 when it cannot listen (an address in use, a host name
that does not resolve, an address not this machine's), after logging why. The doors turn that into
a narrmem error naming the option, so the command exits 2 as for any bad argument, and say that
they serve only once uvicorn listens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narrmem.errors import InputError


def check_port(port: int, field: str) -> None:
    if not 0 < port < 65536:
        raise InputError("must be 1 to 65535", field=field)


async def serve(config: Any, *, field: str, when_listening: Callable[[], None] | None = None) -> None:
    """Serve ``config`` (a ``uvicorn.Config``) until it is stopped; ``when_listening`` is called
    once it listens."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and when_listening is not None:
                when_listening()

    try:
        # Awaited in this task: uvicorn's SystemExit comes up through here (raised in a task of
        # its own, it would leave the event loop itself).
        await Server(config).serve()
    except SystemExit:
        raise InputError(
            f"cannot listen on {config.host}:{config.port}: the address is in use or is not this "
            "machine's (uvicorn's reason is above)",
            field=field,
        ) from None
