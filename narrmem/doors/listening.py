"""Running an HTTP door (``narrmem serve``, ``narrmem mcp --http``) on uvicorn.

uvicorn ends the process with exit code 3 when it cannot listen (an address in use, a host name
that does not resolve, an address not this machine's), after logging why. The doors turn that into
a narrmem error naming the option, so the command exits 2 as for any bad argument, and say that
they serve only once uvicorn listens.

SIGTERM and SIGINT stop the server and return from :func:`serve`, so that the door closes what it
opened (the memory, the webhook queue) and the command exits 0. uvicorn itself raises the signal
again once it has stopped: the process died (SIGTERM) or unwound with KeyboardInterrupt (SIGINT)
before the memory was closed, and what was acknowledged on receipt waited for the next open.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from narrmem.errors import InputError

# Seconds the requests under way get to end once the server stops; then they are cancelled. An
# event stream ends as soon as the server stops (``when_stopping``), so this bounds the others.
GRACEFUL_SECONDS = 10
DRAIN_TICK = 0.1  # how often a drain looks for a second signal


def check_port(port: int, field: str) -> None:
    if not 0 < port < 65536:
        raise InputError("must be 1 to 65535", field=field)


async def serve(
    config: Any,
    *,
    field: str,
    when_listening: Callable[[], None] | None = None,
    when_stopping: Callable[[], None] | None = None,
    drain_seconds: float = 0.0,
) -> None:
    """Serve ``config`` (a ``uvicorn.Config``) until it is stopped; ``when_listening`` is called
    once it listens, ``when_stopping`` once it begins to stop (before it waits for the requests
    under way: what would never end by itself, an event stream, is ended there). With
    ``drain_seconds``, it goes on serving that long after a stop is asked (``when_stopping`` has
    been called: a readiness probe says so), then stops listening: uvicorn closed its sockets at
    once, and a load balancer had no moment to send the next requests elsewhere. A second signal
    cuts it short."""
    import uvicorn
    from uvicorn.server import HANDLED_SIGNALS

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and when_listening is not None:
                when_listening()

        async def shutdown(self, sockets: Any = None) -> None:
            if when_stopping is not None:
                when_stopping()
            for _ in range(math.ceil(drain_seconds / DRAIN_TICK)):
                if self.force_exit:  # a second signal
                    break
                await asyncio.sleep(DRAIN_TICK)
            await super().shutdown(sockets=sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own, without raising the signal again once the server has stopped.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    if config.timeout_graceful_shutdown is None:
        config.timeout_graceful_shutdown = GRACEFUL_SECONDS
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
