"""The HTTP API of ``narrmem serve`` and its inspector page, as one FastAPI app over one ``Memory``.

Only the public :class:`narrmem.Memory` API is used. Every request that names a tenant is checked
against the caller's key before anything is read or written: a key of another tenant gets 403. A
request body is one of the library's models (unknown fields are errors naming them); bad input is
4xx naming the field, never a 500.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import AfterValidator, BaseModel
from starlette.exceptions import HTTPException

from narrmem import __version__, logs
from narrmem.config import Acknowledge
from narrmem.doors.person_export import person_header, person_text
from narrmem.doors.server.commands import DEFAULT_BODY_TIMEOUT, DEFAULT_PORT
from narrmem.doors.server.events import (
    LAST_EVENT_ID_CHARS,
    TriggerHub,
    WebhookOptions,
    printable_event_id,
)
from narrmem.doors.server.forgets import ForgetsVoidEvents, StillStored
from narrmem.doors.server.headers import EVERY_ANSWER, SecurityHeaders
from narrmem.doors.server.health import health_routes
from narrmem.doors.server.hosts import TrustedHost
from narrmem.doors.server.keys import OPEN, KeyRing, Principal
from narrmem.doors.server.limits import BodyLimit, RequestsAtOnce
from narrmem.doors.server.query import QueryUTF8
from narrmem.doors.server.replies import (
    ContextReply,
    HistoryReply,
    PatternsReply,
    StoreStats,
    SummaryReply,
    TenantStats,
    ToolRow,
    TurnContextReply,
    UserRow,
)
from narrmem.doors.server.schemas import (
    ContextBody,
    DecayBody,
    DeleteMessages,
    ErrorBody,
    ForgetBody,
    IncomingMessage,
    IngestBatch,
    MarkUsedBody,
    RecallBody,
    TurnContextBody,
    needs_user_or_chat,
    without_tenant_defaults,
)
from narrmem.doors.transfer import export_header, export_text, no_forget_pending
from narrmem.errors import (
    ClosedError,
    ConfigError,
    InputError,
    NarrmemError,
    PluginError,
    StoreError,
    StoreUnavailableError,
    UnknownToolError,
)
from narrmem.forget_marks import write_held
from narrmem.ingest import check_not_ahead
from narrmem.memory import Memory
from narrmem.models import MAX_ID_CHARS, NO_NUL_SCHEMA, Hit, IngestResult, Message, Scope, no_nul
from narrmem.store import Broadcasts, shared_by_processes

if TYPE_CHECKING:
    from narrmem.doors.server.metrics import ServerMetrics

log = logs.logger("narrmem.server")

DEFAULT_MAX_BODY = 2_000_000
DEFAULT_MAX_BATCH = 500
UI_PACKAGE = "narrmem.doors.server"

# An id in a query string is held to what ids are held to in a body (no NUL: 500 on PostgreSQL).
TenantParam = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA),
    AfterValidator(no_nul),
]
AcknowledgeParam = Annotated[
    Acknowledge | None,
    Query(
        description="when the answer comes: after the hooks, once written, or on receipt (before the "
        "embedding: only this server process recalls the message before it is written, a few ms "
        "later); default [storage] acknowledge",
    ),
]
ScopeIdParam = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA),
    AfterValidator(no_nul),
]
UserParam = Annotated[
    str, Query(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA), AfterValidator(no_nul)
]
AfterParam = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="the next page: users after this id (the last user_id of the previous page)",
        json_schema_extra=NO_NUL_SCHEMA,
    ),
    AfterValidator(no_nul),
]


@dataclass
class ServerState:
    memory: Memory
    keys: KeyRing | None
    hub: TriggerHub
    max_batch: int = DEFAULT_MAX_BATCH
    extra: dict[str, Any] = field(default_factory=dict)
    metrics: ServerMetrics | None = None


def create_app(
    memory: Memory,
    *,
    keys: KeyRing | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    max_batch: int = DEFAULT_MAX_BATCH,
    body_timeout: float | None = DEFAULT_BODY_TIMEOUT,
    cors_origins: list[str] | None = None,
    webhook: WebhookOptions | None = None,
    ui: bool = True,
    allowed_hosts: Sequence[str] | None = None,
    metrics: ServerMetrics | None = None,
    max_requests: int | None = None,
) -> FastAPI:
    """The app over ``memory``. ``keys``: the key ring (``None``: no keys, every tenant open, for a
    server on a loopback address); ``cors_origins``: origins allowed to call from a browser (off
    by default); ``webhook``: where trigger events are POSTed, with retries; ``allowed_hosts``:
    the names a request's ``Host`` may give (``None``: any; ``narrmem serve`` gives its own);
    ``body_timeout``: seconds a request body has to come whole (408 after; ``None``: no limit);
    ``metrics``: where the app counts its requests and ingests (see :mod:`narrmem.doors.server.metrics`);
    ``max_requests``: requests served at once, one more answered 503 (``None``: no limit)."""
    if cors_origins and "*" in cors_origins and (keys is None or not keys.required):
        # Any site's page could read every export and forget anyone: what a server without keys
        # on an address others reach is refused for.
        raise ConfigError(
            "--cors-origin '*' lets every web page read and forget everything on a server without "
            "keys: name the origins allowed, or create a key (`narrmem keys create --tenant TENANT`)"
        )
    hub = TriggerHub(webhook, StillStored(memory))
    if shared_by_processes(memory.store) and isinstance(memory.store, Broadcasts):
        hub.relay_with(memory.store)  # every worker's streams carry every worker's events
    memory.on_trigger(hub.publish)
    # However a forget is made (a route, the Python API, a tool, a hook), its events go with it.
    memory.host.register(ForgetsVoidEvents(hub), name=_free_name(memory, "narrmem.server.forgets"))
    state = ServerState(memory=memory, keys=keys, hub=hub, max_batch=max_batch, metrics=metrics)
    app = _build(state, ui=ui)
    app.add_middleware(InternalErrors)  # innermost: the others see its answer as any other
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, timeout=body_timeout)
    app.add_middleware(QueryUTF8)
    if max_requests is not None:
        app.add_middleware(RequestsAtOnce, limit=max_requests)
    app.add_middleware(SecurityHeaders)
    if allowed_hosts is not None:
        # A page of any site whose name was made to resolve to 127.0.0.1 (DNS rebinding) is of the
        # server's own origin to the browser: without keys it read and forgot everything.
        app.add_middleware(TrustedHost, allowed_hosts=list(allowed_hosts))
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )
    if metrics is not None:
        from narrmem.doors.server.metrics import RequestMetrics

        metrics.watch(state)
        # Outermost, so that a request the others refuse (a Host not allowed, a body too big) counts.
        app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI schema (no memory needed: routes reach the memory only when called)."""
    return _build(None, ui=False).openapi()


def _build(state: ServerState | None, *, ui: bool) -> FastAPI:
    app = FastAPI(
        title="narrmem",
        version=__version__,
        summary="Memory middleware for chatbots, over HTTP.",
        description=(
            "Every call takes an API key (`Authorization: Bearer nmk_...` or `X-API-Key`) when the "
            "server has keys; a key reaches only its own tenant (403 otherwise). Leave `tenant` out "
            "and the key's tenant is used (`default` on a server without keys). Every error is an "
            "`ErrorBody`, whose `field` names the field at fault. A number declared integer is "
            "written without a fraction (3, not 3.0), and no string is read as a number."
        ),
        servers=[
            {"url": f"http://127.0.0.1:{DEFAULT_PORT}", "description": "narrmem serve's default address"}
        ],
        openapi_tags=TAGS,
        license_info={"name": "MIT", "identifier": "MIT"},
        # The operation's name (recall, turn_context): a generated client's method names.
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.narrmem = state
    _errors(app)
    app.include_router(_routes())
    app.include_router(health_routes())
    generated = app.openapi

    def document() -> dict[str, Any]:
        return without_tenant_defaults(generated())  # the same document each time: done once

    app.openapi = document  # type: ignore[method-assign]
    if ui:
        ui_dir = resources.files(UI_PACKAGE) / "ui"
        app.mount("/ui", StaticFiles(directory=str(ui_dir), html=True), name="ui")

        @app.get("/", include_in_schema=False)
        async def root() -> RedirectResponse:
            # Relative: behind a proxy that serves the API under a path (/memory/), the browser
            # stays under it.
            return RedirectResponse("ui/")

    return app


# --- errors ---------------------------------------------------------------------------------


class Refused(HTTPException):
    """A refusal of the HTTP door naming the field at fault, when one is (``field`` in the body):
    the tenant a key cannot reach, the batch over the limit, the memory id that names none."""

    def __init__(
        self,
        status_code: int,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status_code, detail, headers=headers)
        self.field = field


def _json_type(content_type: str | None) -> bool:
    """``content_type`` is one a body is read as JSON by (``application/json``, ``.../...+json``)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _problem(status: int, detail: Any, *, field: str | None = None, **extra: Any) -> JSONResponse:
    body = {"detail": detail, **({} if field is None else {"field": field})}
    return JSONResponse(body, status_code=status, **extra)


# A part of a field as narrmem writes fields: a list index in brackets ("message_ids[0]"), a
# quoted key in brackets ('user_map["ann"]'), or a name between dots ("triplets.0.relation").
_FIELD_PART = re.compile(r'\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]|([^.\[\]]+)')


def _location(field: str) -> list[str | int]:
    """``field`` as a pydantic location: list indexes are integers there, as pydantic writes them
    (a name of digits between dots is one too: pydantic's own errors, read by
    :meth:`InputError.from_pydantic`, write an index so)."""
    loc: list[str | int] = []
    for index, key, name in _FIELD_PART.findall(field):
        if index:
            loc.append(int(index))
        elif key:
            loc.append(key)
        else:
            loc.append(int(name) if name.isdigit() else name)
    return loc


def _field_name(path: Sequence[str | int]) -> str | None:
    """A pydantic location after its 'body', 'query' or 'path', written as narrmem's InputError
    fields are: names joined by dots, list indexes in brackets (scope.user_id, message_ids[0])."""
    name = ""
    for part in path:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name or None


TAGS = [
    {"name": "write", "description": "ingest, edits, deletions, forgetting, reinforcement, decay"},
    {
        "name": "read",
        "description": "recall, contexts, summaries, inspection, the export: they change nothing "
        "but the importance of what recall and context find",
    },
    {"name": "tools", "description": "the tool registry: the same tools as MCP and function calling"},
    {"name": "events", "description": "trigger events as they fire"},
    {"name": "health", "description": "liveness and readiness, for a supervisor or a load balancer; no key"},
]


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Without the input each error was raised on: a lone surrogate or a NaN (what a client
        # that cuts a string mid-emoji, or Python's json.dumps, sends) cannot be written back as
        # JSON, so the answer was a 500; and an answer need not echo what was sent.
        errors = jsonable_encoder([_without_input(e) for e in exc.errors()])
        sent_as = request.headers.get("content-type")
        if not _json_type(sent_as) and any(tuple(e["loc"]) == ("body",) for e in errors):
            # The body was not read as JSON (strictly: a form a web page may post without a
            # preflight is never taken for one), and the 422 said "not a valid dictionary".
            return _problem(
                415, f"the body must be JSON, sent with Content-Type: application/json (not {sent_as!r})"
            )
        if any(e.get("type") == "json_invalid" for e in errors):
            return _problem(400, errors)  # its location is an offset in the text, not a field
        # The first error's field, as narrmem's own refusals name one (InputError.from_pydantic).
        field = _field_name(errors[0]["loc"][1:]) if errors else None
        return _problem(422, errors, field=field)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return _problem(exc.status_code, exc.detail, field=exc.field, headers=exc.headers)

    @app.exception_handler(UnknownToolError)
    async def unknown_tool(request: Request, exc: UnknownToolError) -> JSONResponse:
        return _problem(404, str(exc), field=exc.field)

    @app.exception_handler(InputError)
    async def bad_input(request: Request, exc: InputError) -> JSONResponse:
        loc = ["body", *(_location(exc.field) if exc.field else [])]
        return _problem(422, [{"loc": loc, "msg": str(exc), "type": "narrmem_input"}], field=exc.field)

    @app.exception_handler(ClosedError)
    async def closed(request: Request, exc: ClosedError) -> JSONResponse:
        # A worker stopping: another worker, or this one restarted, answers the same call.
        return _problem(503, str(exc), headers={"Retry-After": str(RETRY_UNAVAILABLE_AFTER_S)})

    @app.exception_handler(StoreUnavailableError)
    async def store_unreachable(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        return _problem(503, str(exc), headers={"Retry-After": str(RETRY_UNAVAILABLE_AFTER_S)})

    @app.exception_handler(StoreError)
    async def store_refused(request: Request, exc: StoreError) -> JSONResponse:
        return _problem(409, str(exc))

    @app.exception_handler(PluginError)
    async def no_plugin(request: Request, exc: PluginError) -> JSONResponse:
        # Said in the log too: a plugin missing or failing fails every request alike, which the
        # operator, not the client, can mend (the kind only: the text may quote the request).
        log.error("%s %s answered 501: %s", request.method, _route(request), type(exc).__name__)
        return _problem(501, str(exc))

    @app.exception_handler(NarrmemError)
    async def other(request: Request, exc: NarrmemError) -> JSONResponse:
        # An embedding model's process that died, say: every request fails until it is mended.
        log.error("%s %s answered 500: %s", request.method, _route(request), type(exc).__name__)
        return _problem(500, str(exc))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # What InternalErrors cannot answer (an error in a middleware outside it).
        answer = _internal(exc, request.method, request.url.path)
        # Answered by Starlette's outermost middleware, outside SecurityHeaders: added here.
        for name, value in EVERY_ANSWER:
            answer.headers[name.decode()] = value.decode()
        return answer


def _route(request: Request) -> str:
    """The route's declared path (``/v1/recall``), not the request's, which may name a user."""
    route = request.scope.get("route")
    return str(getattr(route, "path", None) or "an unknown route")


def _internal(exc: Exception, method: object, path: object) -> JSONResponse:
    """The 500 of an error no handler answers, logged with its traceback."""
    log.exception("internal error on %s %s", method, path)
    return _problem(500, f"internal error: {type(exc).__name__}")


class InternalErrors:
    """Pure ASGI middleware: an error no handler answers becomes the 500 ``ErrorBody`` here, and
    the connection stays usable. Answered by Starlette's outermost handler, the error was raised
    again after the answer, and uvicorn closed the connection: the client's next request on it
    failed (20 of 30 while a PostgreSQL was down), and each traceback was logged twice."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def noted(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, noted)
        except Exception as exc:
            if started:
                raise  # half an answer is out: nothing can be said now but to end the connection
            await _internal(exc, scope.get("method"), scope.get("path"))(scope, receive, send)


# --- who is calling -------------------------------------------------------------------------


def _state(request: Request) -> ServerState:
    state: ServerState | None = request.app.state.narrmem
    if state is None:
        raise HTTPException(503, "this app has no memory (it was built for its schema only)")
    return state


# Read through FastAPI's security classes so that the OpenAPI document declares both ways of
# giving a key; auto_error off: a server without keys needs none, and the 401 is ours (below).
_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="nmk_...",
    description="`Authorization: Bearer nmk_...` (`narrmem keys create`); needed when the server has keys",
)
_api_key_header = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    description="the key as `X-API-Key: nmk_...`, read when no bearer key is given",
)


async def _principal(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key_header)],
) -> Principal:
    state = _state(request)
    if state.keys is None:
        return OPEN
    found = await state.keys.verify(_token(bearer, api_key))
    if found is None:
        raise HTTPException(401, "a valid API key is required", headers={"WWW-Authenticate": "Bearer"})
    return found


def _token(bearer: HTTPAuthorizationCredentials | None, api_key: str | None) -> str | None:
    return bearer.credentials.strip() if bearer is not None else api_key


Caller = Annotated[Principal, Depends(_principal)]
State = Annotated[ServerState, Depends(_state)]


def _tenant(caller: Principal, given: str | None) -> str:
    """The tenant a request acts on: as given (if the key reaches it), else the key's own."""
    if given is None:
        return caller.tenant or "default"
    if not caller.allows(given):
        raise Refused(403, f"this key cannot reach tenant {given!r}", field="tenant")
    return given


M = TypeVar("M", bound=BaseModel)


def _settled(caller: Principal, model: M) -> M:
    """``model`` with its tenant checked; a tenant left out becomes the key's."""
    given = model.tenant if "tenant" in model.model_fields_set else None  # type: ignore[attr-defined]
    tenant = _tenant(caller, given)
    if getattr(model, "tenant", None) == tenant:
        return model
    return model.model_copy(update={"tenant": tenant})


# --- routes ---------------------------------------------------------------------------------


async def _write(
    memory: Memory,
    sent: list[tuple[Message, datetime | None]],
    write: Callable[[list[Message]], Awaitable[list[IngestResult]]],
) -> list[IngestResult]:
    """``write(messages)``; the messages a client held checked against the forgets made since."""
    if all(held_since is None for _, held_since in sent):
        return await write([message for message, _ in sent])
    return await write_held(memory, sent, write)


def _free_name(memory: Memory, name: str) -> str:
    """``name``, or ``name`` and a number when another app over the same memory took it (a name
    of its own that ``stats`` shows the same after a restart, not an object's address)."""
    taken = set(memory.host.plugin_names())
    if name not in taken:
        return name
    return next(f"{name}.{n}" for n in itertools.count(2) if f"{name}.{n}" not in taken)


def _without_input(error: dict[str, Any]) -> dict[str, Any]:
    """A validation error without the input it was raised on (see invalid), and with the text of
    an exception in its ``ctx`` (JSON made it ``{}``: the reason was lost)."""
    plain = {k: v for k, v in error.items() if k != "input"}
    if isinstance(plain.get("ctx"), dict):
        plain["ctx"] = {k: str(v) if isinstance(v, BaseException) else v for k, v in plain["ctx"].items()}
    return plain


# Seconds a client is asked to wait before trying a call again whose store could not be reached.
RETRY_UNAVAILABLE_AFTER_S = 5


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# What any call may answer besides its own. 422 is declared here, as every other error, in the
# one shape sent: left to FastAPI, it was its HTTPValidationError, without ``field`` (a client
# generated from the document could not read it), and undeclared on calls without parameters,
# where a query string that is not UTF-8 is refused all the same.
SHARED_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("the body is not JSON, or the Host header is not one of the server's"),
    401: _error("no valid API key, on a server with keys"),
    403: _error("the key cannot reach this tenant (field: tenant), or the call needs a server without keys"),
    409: _error("the store refused: it is read-only, or a forget is unfinished"),
    413: _error("the body is over the server's --max-body, or the batch over --max-batch (field: messages)"),
    415: _error("the body was not sent as JSON (Content-Type: application/json)"),
    422: _error("the request is not valid: detail lists the problems, field names the first one's field"),
    501: _error("no plugin this call needs is loaded (graph, rtm)"),
    503: {
        **_error(
            "the memory is closed, or its store cannot be reached now (a database down or not "
            "answering within storage.timeout_s): try again after Retry-After seconds; an ingest "
            "tried again with the same message id stores the message once"
        ),
        "headers": {
            "Retry-After": {
                "description": "seconds to wait before trying again (when the store cannot be reached)",
                "schema": {"type": "integer"},
            }
        },
    },
}


def _declared(reply: Any, more: dict[int | str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A route's arguments that declare its answer as ``reply`` without checking it: what plugins
    make (see :mod:`narrmem.doors.server.replies`), passed on as they made it."""
    return {"response_model": None, "responses": {200: {"model": reply}, **(more or {})}}


def _routes() -> APIRouter:
    r = APIRouter(prefix="/v1", responses=SHARED_ERRORS)
    for add in (_write_routes, _read_routes, _inspect_routes, _tool_and_event_routes):
        add(r)
    return r


def _write_routes(r: APIRouter) -> None:
    """Ingest, edits, deletions, forgetting, reinforcement and decay."""

    @r.post("/ingest", response_model=IngestResult, tags=["write"])
    async def ingest(
        body: IncomingMessage, caller: Caller, state: State, acknowledge: AcknowledgeParam = None
    ) -> IngestResult:
        """Ingest one message (idempotent by ``message_id`` in its chat: a repeat is a duplicate).
        ``ts`` left out is now, by the memory's clock. ``held_since``: see the field."""
        sent = [_settled(caller, body).sent(state.memory.clock.now())]
        [result] = await _write(
            state.memory, sent, lambda ms: state.memory.ingest_many(ms, acknowledge=acknowledge)
        )
        if state.metrics is not None:
            state.metrics.ingested([result])
        return result

    @r.post("/ingest/batch", response_model=list[IngestResult], tags=["write"])
    async def ingest_batch(
        body: IngestBatch, caller: Caller, state: State, acknowledge: AcknowledgeParam = None
    ) -> list[IngestResult]:
        """Ingest messages in order; all are validated first, and one bad message stores nothing.
        On receipt applies to a batch of up to 8 messages; a larger one answers once written."""
        if len(body.messages) > state.max_batch:
            raise Refused(413, f"a batch holds at most {state.max_batch} messages", field="messages")
        now = state.memory.clock.now()
        sent = [_settled(caller, m).sent(now) for m in body.messages]
        if any(held_since is not None for _, held_since in sent):
            # Every message checked before any held one is left out (whose index the rest's
            # errors would then miss), so one bad message still stores nothing.
            check_not_ahead([m for m, _ in sent], now, state.memory.settings.storage.max_ts_ahead_s)
        results = await _write(
            state.memory, sent, lambda ms: state.memory.ingest_many(ms, acknowledge=acknowledge)
        )
        if state.metrics is not None:
            state.metrics.ingested(results)
        return results

    @r.post("/edit", response_model=IngestResult, tags=["write"])
    async def edit(body: IncomingMessage, caller: Caller, state: State) -> IngestResult:
        """A message was edited: what it left is replaced (earlier texts kept in ``meta.edits``).
        ``held_since``: as for ``ingest``."""
        sent = [_settled(caller, body).sent(state.memory.clock.now())]

        async def edit_one(messages: list[Message]) -> list[IngestResult]:
            return [await state.memory.edit(message) for message in messages]

        [result] = await _write(state.memory, sent, edit_one)
        return result

    @r.post("/messages/delete", tags=["write"])
    async def delete_messages(body: DeleteMessages, caller: Caller, state: State) -> dict[str, int]:
        """Forget what these messages left (episodes and the scenes built from them)."""
        body = _settled(caller, body)
        counts = await state.memory.forget_messages(
            chat_id=body.chat_id, message_ids=body.message_ids, tenant=body.tenant
        )
        return counts

    @r.post("/forget", tags=["write"])
    async def forget(
        body: Annotated[ForgetBody, Body(json_schema_extra=needs_user_or_chat)], caller: Caller, state: State
    ) -> dict[str, int]:
        """Delete every trace of a user and/or a chat. ``asked_at``: see the field."""
        body = _settled(caller, body)
        counts = await state.memory.forget(
            user_id=body.user_id, chat_id=body.chat_id, tenant=body.tenant, asked_at=body.asked_at
        )
        return counts

    @r.post("/mark-used", tags=["write"])
    async def mark_used(body: MarkUsedBody, caller: Caller, state: State) -> dict[str, list[int]]:
        """The bot used these memories in its answer: they are reinforced (spaced in time)."""
        body = _settled(caller, body)
        ids = await state.memory.mark_used(
            body.memory_ids, user_id=body.user_id, chat_id=body.chat_id, tenant=body.tenant
        )
        return {"reinforced": ids}

    @r.post("/decay", tags=["write"])
    async def decay(body: DecayBody, caller: Caller, state: State) -> dict[str, int]:
        """Run the decay pass now (every tenant: needs a server without keys). The body is ``{}``,
        sent as JSON: a form or an empty body, which any web page may post, is refused."""
        if caller.tenant is not None:
            raise HTTPException(403, "decay runs over every tenant: not with a tenant's key")
        return await state.memory.decay()


def _read_routes(r: APIRouter) -> None:
    """Recall, contexts, the user summary and a memory's history."""

    @r.post("/recall", response_model=list[Hit], tags=["read"])
    async def recall(body: RecallBody, caller: Caller, state: State) -> list[Hit]:
        """At most ``k`` memories answering ``query`` in the scope; ``explain`` keeps each hit's
        ``why``. ``reinforce: false`` makes a read-only probe (the inspector's)."""
        settled = body.model_copy(update={"scope": _settled(caller, body.scope)})
        hits = await state.memory.recall(body.query, **settled.options())
        if not body.explain:
            hits = [h.model_copy(update={"why": None}) for h in hits]
        return hits

    @r.post("/context", response_model=ContextReply, tags=["read"])
    async def context(body: ContextBody, caller: Caller, state: State) -> dict[str, Any]:
        """What to put before the bot's answer to ``text``: the hits and the rendered block. The
        hits are reinforced, as the bot's own recall's are; ``reinforce: false`` changes nothing."""
        body = _settled(caller, body)
        pack = await state.memory.context(
            body.text,
            user_id=body.user_id,
            chat_id=body.chat_id,
            tenant=body.tenant,
            k=body.k,
            exclude_message_ids=body.exclude_message_ids,
            reinforce=body.reinforce,
            asked_at=body.asked_at,
        )
        return {**pack.model_dump(mode="json"), "rendered": pack.render(body.token_budget)}

    @r.post("/turn-context", tags=["read"], **_declared(TurnContextReply))
    async def turn_context(body: TurnContextBody, caller: Caller, state: State) -> dict[str, Any]:
        """Persona, task chain, facts and memories for this turn (``rendered`` is the block)."""
        body = _settled(caller, body)
        return await state.memory.turn_context(
            body.text, user_id=body.user_id, chat_id=body.chat_id, tenant=body.tenant, private=body.private
        )

    @r.get("/summary", tags=["read"], **_declared(SummaryReply))
    async def summary(
        caller: Caller,
        state: State,
        user_id: UserParam,
        tenant: TenantParam = None,
        depth: Annotated[int | None, Query(ge=1, le=64)] = None,
        token_budget: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> dict[str, Any]:
        """Who this person is, at an abstraction level (1 = most abstract) or within a budget."""
        return await state.memory.summary(
            user_id=user_id, tenant=_tenant(caller, tenant), depth=depth, token_budget=token_budget
        )

    @r.get(
        "/memories/{memory_id}/history",
        tags=["read"],
        **_declared(HistoryReply, {404: _error("no such memory in the tenant (field: memory_id)")}),
    )
    async def history(
        memory_id: int, caller: Caller, state: State, tenant: TenantParam = None
    ) -> dict[str, Any]:
        """A memory's importance over time: stored state, recorded changes, decay's projection."""
        tenant = _tenant(caller, tenant)
        unknown = Refused(404, f"no memory {memory_id} in tenant {tenant!r}", field="memory_id")
        if not 0 < memory_id < 2**63:
            raise unknown
        try:
            found = await state.memory.history(memory_id)
        except InputError as exc:
            if exc.field == "memory_id":
                raise unknown from exc
            raise
        if found["memory"]["tenant"] != tenant:  # the same answer as for an id never used
            raise unknown
        return {**found, "now": state.memory.clock.now().isoformat()}


def _inspect_routes(r: APIRouter) -> None:
    """Who is remembered, their patterns, figures and the export."""

    @r.get("/tenants", tags=["read"])
    async def tenants(caller: Caller, state: State) -> list[str]:
        """The tenants this caller reaches (with memories, for a server without keys)."""
        if caller.tenant is not None:
            return [caller.tenant]
        return await state.memory.tenants()

    @r.get("/users", response_model=list[UserRow], tags=["read"])
    async def users(
        caller: Caller,
        state: State,
        tenant: TenantParam = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
        after: AfterParam = None,
    ) -> list[dict[str, Any]]:
        """The tenant's users with memory counts (no memory's text), in user id order, at most
        ``limit``: a full page may have more after it, read with ``after`` = its last user_id."""
        return await state.memory.users(_tenant(caller, tenant), limit=limit, after=after)

    @r.get("/patterns", tags=["read"], **_declared(PatternsReply))
    async def patterns(
        caller: Caller, state: State, user_id: UserParam, tenant: TenantParam = None
    ) -> dict[str, Any]:
        """What keeps coming back for this user (topics, moods, with counts and message ids) and the
        triggers that fired for them, read from the store (the same in every worker, after a
        restart too)."""
        return await state.memory.patterns(user_id=user_id, tenant=_tenant(caller, tenant))

    @r.get("/stats", tags=["read"], **_declared(StoreStats | TenantStats))
    async def stats(caller: Caller, state: State) -> dict[str, Any]:
        """What is stored. A tenant's key sees its tenant's counts only."""
        if caller.tenant is None:
            return await state.memory.stats()
        return {"tenant": caller.tenant, **await _tenant_counts(state.memory, caller.tenant)}


def _tool_and_event_routes(r: APIRouter) -> None:
    """The tool registry and the trigger event stream."""

    @r.get("/tools", response_model=list[ToolRow], tags=["tools"])
    async def list_tools(caller: Caller, state: State) -> list[dict[str, Any]]:
        """Every registered tool with its input and output schema."""
        registry = state.memory.tools
        return [
            {
                "name": name,
                "description": registry.get(name).description,
                "input_schema": registry.get(name).input_schema(),
                "output_schema": registry.get(name).output_schema(),
            }
            for name in registry.names()
        ]

    @r.post("/tools/{name}", tags=["tools"], responses={404: _error("no tool of this name (field: name)")})
    async def call_tool(
        name: str,
        caller: Caller,
        state: State,
        arguments: Annotated[dict[str, Any], Body()],
        user_id: ScopeIdParam = None,
        chat_id: ScopeIdParam = None,
        tenant: TenantParam = None,
    ) -> dict[str, Any]:
        """Run a registered tool with JSON arguments (the same registry and validation as
        ``Memory.call_tool``). A tool that takes ``tenant`` gets the key's when it is left out.
        ``user_id`` / ``chat_id`` (and ``tenant``) in the query: whom the call acts for, when a
        model wrote the arguments (``Memory.call_tool(..., scope=)``): the tool's ids are set to
        them (the tenant to the query's, else the key's, never the arguments'), and a call naming
        another is refused (422, naming the field)."""
        tool = state.memory.tools.get(name)
        if user_id is not None or chat_id is not None:
            scope = Scope(tenant=_tenant(caller, tenant), user_id=user_id, chat_id=chat_id)
            return await state.memory.call_tool(name, arguments, scope=scope)
        if tenant is not None:
            raise InputError(
                "a tenant in the query binds a call: give user_id or chat_id too", field="tenant"
            )
        if "tenant" in tool.input_model.model_fields:
            given = arguments.get("tenant")
            if given is not None and not isinstance(given, str):
                raise InputError("must be a string", field="tenant")
            arguments = {**arguments, "tenant": _tenant(caller, given)}
        return await state.memory.call_tool(name, arguments)

    @r.get(
        "/export",
        tags=["read"],
        response_class=NDJSONStream,
        responses=_stream_answers(NDJSONStream, "the export, one JSON object a line (JSON Lines)"),
    )
    async def export(caller: Caller, state: State, tenant: TenantParam = None) -> NDJSONStream:
        """narrmem's JSONL export (``narrmem import`` reads it). A server without keys asked for no
        ``tenant`` streams the whole store, lossless (graph, RTM trees, importance history, plugin
        state); a tenant's export holds that tenant's memories with their vectors and importance
        history, and its header names the tenant and what it leaves out (``tenant``,
        ``left_out``)."""
        only = _tenant(caller, tenant) if (tenant is not None or caller.tenant is not None) else None
        # Checked before the answer starts: inside the stream, its refusal cut a 200 short.
        await state.memory.settle()
        await no_forget_pending(state.memory, tenant=only)
        return NDJSONStream(_export_lines(state.memory, only))

    @r.get(
        "/export/person",
        tags=["read"],
        response_class=NDJSONStream,
        responses=_stream_answers(NDJSONStream, "what narrmem holds of the person, one JSON object a line"),
    )
    async def export_person(
        caller: Caller, state: State, user_id: UserParam, tenant: TenantParam = None
    ) -> NDJSONStream:
        """Everything narrmem holds of one person (their right to see it): their memories in every
        chat of the tenant, with importance history, the plugins' state under their id and each
        plugin's records of them (graph facts, RTM trees, quotes), read by queries on the person.
        What a forget of the person deletes is what this holds. Its header's ``format`` is
        ``narrmem-person``; ``narrmem import`` refuses it."""
        only = _tenant(caller, tenant)
        # Checked before the answer starts: inside the stream, its refusal cut a 200 short.
        await state.memory.settle()
        await no_forget_pending(state.memory, tenant=only)
        return NDJSONStream(_person_lines(state.memory, only, user_id))

    @r.get(
        "/events",
        tags=["events"],
        response_class=EventStream,
        responses=_stream_answers(
            EventStream,
            "server-sent events: `event: trigger`, `id:` the event's id, `data:` the event; first "
            "`event: reset` when the Last-Event-ID sent is not held",
        ),
    )
    async def events(
        caller: Caller,
        state: State,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        api_key: Annotated[str | None, Depends(_api_key_header)],
        tenant: TenantParam = None,
        max_events: Annotated[int | None, Query(ge=1, le=100_000)] = None,
        idle_seconds: Annotated[
            float | None, Query(gt=0, le=86_400, description="end when quiet this long")
        ] = None,
        keepalive: Annotated[float, Query(ge=0.05, le=300)] = 15.0,
        last_event_id: Annotated[
            str | None,
            Header(
                alias="Last-Event-ID",
                max_length=LAST_EVENT_ID_CHARS,
                json_schema_extra={"pattern": "^[ -~]*$"},  # printable ASCII, as checked below
                description="the last `id:` a reconnecting client saw: the events published since, "
                "still held by this server process, come first; an id not held begins the stream "
                "with `event: reset` (events may have been missed)",
            ),
            AfterValidator(printable_event_id),
        ] = None,
    ) -> EventStream:
        """Trigger events as server-sent events (``event: trigger``, the event as JSON). A client
        that reconnects with ``Last-Event-ID`` is sent the events it missed first, as far as this
        server process holds them (the latest events of each tenant that published lately)."""
        only = _tenant(caller, tenant) if (tenant is not None or caller.tenant is not None) else None
        keys, token = state.keys, _token(bearer, api_key)

        async def key_still_valid() -> bool:
            # Checked again as the stream goes on: a key revoked meanwhile ends its stream.
            return keys is not None and await keys.verify(token) == caller

        stream = state.hub.stream(
            only,
            max_events=max_events,
            idle_timeout=idle_seconds,
            keepalive=keepalive,
            still_allowed=None if keys is None else key_still_valid,
            last_event_id=last_event_id,
        )
        return EventStream(stream, headers={"Cache-Control": "no-store"})


class NDJSONStream(StreamingResponse):
    """A streamed answer of JSON Lines."""

    media_type = "application/x-ndjson"


class EventStream(StreamingResponse):
    """A streamed answer of server-sent events."""

    media_type = "text/event-stream"


def _stream_answers(response: type[StreamingResponse], description: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answers of a stream route: a 200 of the stream's media type, as text, and the
    shared errors as JSON. A "model" answer would be declared of the route's media type (FastAPI
    takes its response class's), where the errors are JSON all the same: declared by reference."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    return {
        200: {
            "description": description,
            "content": {str(response.media_type): {"schema": {"type": "string"}}},
        },
        **{
            status: {"description": answer["description"], "content": error}
            for status, answer in SHARED_ERRORS.items()
        },
    }


# Users counted a page at a time (the most Memory.users gives at once): one call undercounted a
# tenant of more users than a page holds.
USERS_PAGE = 100_000


async def _tenant_counts(memory: Memory, tenant: str) -> dict[str, int]:
    users = memories = scenes = 0
    after: str | None = None
    while True:
        page = await memory.users(tenant, limit=USERS_PAGE, after=after)
        users += len(page)
        memories += sum(row["memories"] for row in page)
        scenes += sum(row["scenes"] for row in page)
        if len(page) < USERS_PAGE:
            return {"users": users, "memories": memories, "scenes": scenes}
        after = page[-1]["user_id"]


# The export is sent in pieces of about this many characters, the loop given a turn after each:
# sent a line at a time without one, a page of lines went on to a client that had gone (the server
# hears of it only when the loop turns), with a warning logged for each line.
EXPORT_CHUNK_CHARS = 64 * 1024


async def _export_lines(memory: Memory, tenant: str | None) -> AsyncIterator[str]:
    async for chunk in _chunked(export_header(memory, tenant=tenant), export_text(memory, tenant=tenant)):
        yield chunk


async def _person_lines(memory: Memory, tenant: str, user_id: str) -> AsyncIterator[str]:
    header = person_header(memory, tenant, user_id)
    async for chunk in _chunked(header, person_text(memory, tenant, user_id)):
        yield chunk


async def _chunked(header: str, texts: AsyncIterator[tuple[str, str]]) -> AsyncIterator[str]:
    lines = [header]
    size = len(lines[0])
    async for _, text in texts:
        lines.append(text)
        size += len(text)
        if size >= EXPORT_CHUNK_CHARS:
            yield "".join(lines)
            lines, size = [], 0
            await asyncio.sleep(0)  # a client gone meanwhile is heard of: the next send fails
    if lines:
        yield "".join(lines)
