"""``narrmem serve`` and ``narrmem keys``: their arguments and what they do. Nothing here imports
the web framework until ``serve`` runs."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from narrmem.config import Settings
from narrmem.doors.listening import check_port, serve
from narrmem.errors import ConfigError, InputError

if TYPE_CHECKING:
    from narrmem.doors.server.metrics import ServerMetrics

DEFAULT_PORT = 8765
DEFAULT_MAX_CONNECTIONS = 1000
# Connections uvicorn keeps at once per request the app serves at once (see --max-connections).
CONNECTIONS_PER_REQUEST = 2
DEFAULT_BODY_TIMEOUT = 30.0
# Once the server has stopped, the webhook gets this long to deliver what is queued.
WEBHOOK_DRAIN_SECONDS = 5.0
Handler = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


def add_server_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser(
        "serve", parents=[common], help="the HTTP API and the memory inspector (/ui) on 127.0.0.1"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    serve.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN", help="allow this browser origin"
    )
    serve.add_argument("--webhook", metavar="URL", help="POST every trigger event here (with retries)")
    serve.add_argument("--max-body", type=int, default=2_000_000, metavar="BYTES", help="request body limit")
    serve.add_argument("--max-batch", type=int, default=500, help="messages per batch ingest")
    serve.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"requests served at once, a request beyond gets 503; connections, idle ones included, "
        f"at most twice that (default {DEFAULT_MAX_CONNECTIONS})",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="SECONDS",
        help="a request body not whole this long after its headers gets 408 "
        f"(default {DEFAULT_BODY_TIMEOUT:g})",
    )
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on SIGTERM, go on serving this long with /readyz answering 503, so that a load "
        "balancer sends the next requests elsewhere, then stop (default 0)",
    )
    serve.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at this address (off by default; no key there: bind a "
        "private address)",
    )
    serve.add_argument(
        "--root-path",
        default="",
        metavar="PATH",
        help="the path a reverse proxy serves this server under (/memory), which it strips before "
        "passing the request on: the schema page (/docs) and the OpenAPI document name it",
    )
    serve.add_argument(
        "--read-only",
        action="store_true",
        help="serve the inspector and the read endpoints beside the process that writes the store "
        "(a running bot on the SQLite default); every write is refused with 409",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name requests may give in Host besides the bound address and loopback names "
        "(a reverse proxy's public name); others get 400",
    )

    keys = sub.add_parser("keys", help="API keys of narrmem serve (per tenant)")
    actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[common], help="create a key for a tenant (shown once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--label", default="", help="a note: who or what uses it")
    create.add_argument("--json", action="store_true")
    listing = actions.add_parser("list", parents=[common], help="list keys (never their secrets)")
    listing.add_argument("--json", action="store_true")
    revoke = actions.add_parser("revoke", parents=[common], help="revoke a key by its id")
    revoke.add_argument("id")
    revoke.add_argument("--json", action="store_true")


def checked_root_path(path: str) -> str:
    """``--root-path`` as uvicorn takes it: empty, or ``/`` and path segments without a trailing
    ``/`` (``/memory/`` is taken as ``/memory``)."""
    if path in ("", "/"):
        return ""
    stripped = path.rstrip("/")
    if (
        not stripped.startswith("/")
        or "//" in stripped
        or any(c in stripped for c in "?#\\ ")
        or not stripped.isprintable()
        or not stripped.isascii()
        or any(part in (".", "..") for part in stripped.split("/"))
    ):
        raise InputError(f"not a path like /memory: {path!r}", field="--root-path")
    return stripped


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def allowed_hosts(bound: str, extra: Sequence[str]) -> list[str]:
    """The names a request's ``Host`` may give: the loopback names, the bound address (a wildcard
    address stands for every name the machine has, so any is taken then), and ``extra``."""
    if bound in ("0.0.0.0", "::", ""):
        return ["*"]
    names = [*LOOPBACK_NAMES, f"[{bound}]" if ":" in bound else bound, *extra]
    for name in extra:
        if (
            not name
            or "/" in name
            or " " in name
            or "*" in name[1:]
            or (name.startswith("*") and not name.startswith("*."))
        ):
            raise InputError(f"not a host name: {name!r}", field="--allowed-host")
    return sorted(set(names))


async def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from narrmem.doors.server.keys import KeyRing

    check_port(args.port, "--port")
    if args.max_body < 1024 or args.max_batch < 1:
        raise InputError("limits must be positive (--max-body at least 1024)", field="--max-body")
    if args.max_connections < 1:
        raise InputError("must be at least 1", field="--max-connections")
    if not 0 < args.body_timeout <= 86_400:  # NaN too
        raise InputError("must be more than 0 and at most 86400 seconds", field="--body-timeout")
    if not 0 <= args.drain_seconds <= 3_600:  # NaN too
        raise InputError("must be 0 to 3600 seconds", field="--drain-seconds")
    root_path = checked_root_path(args.root_path)
    ring = KeyRing.in_folder(settings.data_dir)
    if not is_loopback(args.host) and ring.active_count() == 0:
        raise ConfigError(
            f"--host {args.host} is not a loopback address and no API key is configured: create one "
            "with `narrmem keys create --tenant TENANT` (or bind 127.0.0.1)"
        )
    import uvicorn

    from narrmem.doors.server.app import create_app
    from narrmem.doors.server.events import TriggerHub, WebhookOptions
    from narrmem.memory import Memory

    webhook = WebhookOptions(url=args.webhook) if args.webhook else None
    metrics = _metrics(args.metrics)
    async with Memory.open(settings=settings, read_only=args.read_only) as memory:
        app = create_app(
            memory,
            keys=ring,
            max_body_bytes=args.max_body,
            max_batch=args.max_batch,
            body_timeout=args.body_timeout,
            cors_origins=args.cors_origin or None,
            webhook=webhook,
            allowed_hosts=allowed_hosts(args.host, args.allowed_host),
            metrics=metrics,
            max_requests=args.max_connections,
        )
        exporter = None if metrics is None else _serve_metrics(metrics, args.metrics)
        mode = f"{ring.active_count()} active key(s)" if ring.required else "no keys (loopback only)"
        serving = (
            f"narrmem serving {memory.data_dir} on http://{args.host}:{args.port} "
            f"(inspector: /ui/, API: /v1, schema: /docs; {mode})"
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            lifespan="off",
            # The app's own limit answers first, in JSON; this one bounds the connections, idle
            # kept-alive ones included, and answers in uvicorn's plain text.
            limit_concurrency=CONNECTIONS_PER_REQUEST * args.max_connections,
            root_path=root_path,
        )
        hub: TriggerHub = app.state.narrmem.hub
        await hub.start()  # the other workers' events, held for streams from the start
        try:
            await serve(
                config,
                field="--host/--port",
                when_listening=lambda: print(serving, file=sys.stderr),
                when_stopping=hub.stop_streams,
                drain_seconds=args.drain_seconds,
            )
            # Stopped (SIGTERM, SIGINT): what was acknowledged is written and its hooks run, so
            # that the triggers they fire are queued for the webhook before it is drained.
            await memory.settle()
            await hub.shutdown(WEBHOOK_DRAIN_SECONDS)
        finally:
            await hub.close()
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()
    return 0


def _metrics(address: str | None) -> ServerMetrics | None:
    """The server's metrics when ``--metrics`` asks for them (the address checked first)."""
    if address is None:
        return None
    try:
        from narrmem.doors.server.metrics import ServerMetrics, parse_address
    except ImportError as exc:
        raise ConfigError(
            f"--metrics needs prometheus-client ({exc.name} is missing): pip install 'narrmem[server]'"
        ) from exc
    parse_address(address)
    return ServerMetrics()


def _serve_metrics(metrics: ServerMetrics, address: str) -> Any:
    try:
        return metrics.serve(address)
    except OSError as exc:
        raise InputError(f"cannot listen on {address}: {exc.strerror}", field="--metrics") from exc


async def cmd_keys(args: argparse.Namespace, settings: Settings) -> int:
    from narrmem.doors.server.keys import KeyFile

    source = KeyFile(settings.data_dir)
    if args.keys_action == "create":
        entry, token = source.create(args.tenant, args.label)
        if args.json:
            print(json.dumps({**entry.public(), "key": token}, indent=2))
        else:
            print(f"key {entry.id} for tenant {entry.tenant!r} (shown once, keep it secret):")
            print(token)
    elif args.keys_action == "list":
        entries = [e.public() for e in source.read()]
        if args.json:
            print(json.dumps(entries, indent=2))
        elif not entries:
            print("no keys")
        for e in [] if args.json else entries:
            state = f"revoked {e['revoked_at']}" if e["revoked_at"] else "active"
            print(f"{e['id']}  tenant {e['tenant']!r}  {state}  created {e['created_at']}  {e['label']}")
    else:
        entry = source.revoke(args.id)
        if args.json:
            print(json.dumps(entry.public(), indent=2))
        else:
            print(f"key {entry.id} of tenant {entry.tenant!r} revoked")
    return 0


SERVER_COMMANDS: dict[str, Handler] = {"serve": cmd_serve, "keys": cmd_keys}
