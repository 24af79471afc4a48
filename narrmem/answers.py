"""Public calls that a plugin answers: the per-turn context (the graph by default), the user
summary (RTM), store-wide figures and the list of users. Arguments are checked here, before any
plugin runs: a plugin's own refusal would be isolated by the host and read as no answer at all."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from narrmem.checks import int_argument, optional_int_argument, text_argument
from narrmem.errors import InputError, NarrmemError, PluginError
from narrmem.models import MAX_ID_CHARS, MAX_QUERY_CHARS, Scope
from narrmem.store import IMPORT_UNDER_WAY, STORE_NOTES
from narrmem.tools import ToolRegistry
from narrmem.view import MemoryView


async def turn_context(
    memory: MemoryView, scope: Scope, text: str, *, private: bool = False
) -> dict[str, Any]:
    text = text_argument(text, "text", max_chars=MAX_QUERY_CHARS)
    errors: list[str] = []
    answer = await memory.host.call_first(
        "narrmem_turn_context",
        errors=errors,
        memory=memory,
        tenant=scope.tenant,
        user_id=scope.user_id,
        chat_id=scope.chat_id,
        text=text,
        private=private,
    )
    if answer is None:
        raise PluginError(
            _unanswered("no plugin builds turn contexts (is the graph plugin disabled?)", errors)
        )
    return dict(answer)


async def summary(
    memory: MemoryView, scope: Scope, depth: int | None, token_budget: int | None
) -> dict[str, Any]:
    errors: list[str] = []
    answer = await memory.host.call_first(
        "narrmem_user_summary",
        errors=errors,
        memory=memory,
        tenant=scope.tenant,
        user_id=scope.user_id,
        depth=optional_int_argument(depth, "depth"),
        token_budget=optional_int_argument(token_budget, "token_budget"),
    )
    if answer is None:
        raise PluginError(_unanswered("no plugin tells user summaries (is the rtm plugin disabled?)", errors))
    return dict(answer)


def _unanswered(none_loaded: str, errors: list[str]) -> str:
    # A plugin that failed is the reason, not a missing one: its error says what to fix.
    return "; ".join(errors) if errors else none_loaded


async def stats(memory: MemoryView, tools: ToolRegistry) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for part in await memory.host.call("narrmem_stats", memory=memory):
        extra.update(part)
    cut = await memory.store.state_get(STORE_NOTES, IMPORT_UNDER_WAY)
    return {
        **(await memory.store.stats()),
        **extra,
        **({"import_cut_short": cut} if cut is not None else {}),
        "data_dir": str(memory.data_dir),
        "embedder": {"backend": memory.settings.embedder.backend, "model": memory.embedder.name},
        "plugins": memory.host.plugin_names(),
        "tools": tools.names(),
    }


async def users(
    memory: MemoryView, tenant: str | None, limit: int, after: str | None = None
) -> list[dict[str, Any]]:
    if tenant is not None:
        tenant = id_argument(tenant, "tenant")
    limit = int_argument(limit, "limit", high=100_000)
    if after is not None:
        after = id_argument(after, "after")
        if tenant is None:
            raise InputError("pages through one tenant's users: give a tenant", field="after")
    rows = await memory.store.users(tenant, limit=limit, after=after)
    # The plugins asked of this page's range alone (with a tenant): asked whole, a graph of 50,000
    # people was read whole for every page (0.7 s against 3 ms).
    through = rows[-1]["user_id"] if tenant is not None and len(rows) >= limit else None
    held = await _plugin_people(memory, tenant, after=after, through=through, limit=limit)
    return _with_plugins_only(rows, held, tenant, limit, after)


async def _plugin_people(
    memory: MemoryView,
    tenant: str | None,
    *,
    after: str | None = None,
    through: str | None = None,
    limit: int | None = None,
) -> dict[tuple[str, str], datetime]:
    # Imported here: retention reads the ids of its arguments with this module's checks.
    from narrmem.retention import plugins_latest

    # The first `limit` of each plugin's are enough: the page holds `limit` rows in all.
    found = await plugins_latest(memory, tenant, after=after, through=through, limit=limit)
    # Of the tenant asked alone, whatever a plugin answered (a tenant's key lists its own).
    return found if tenant is None else {key: at for key, at in found.items() if key[0] == tenant}


def _with_plugins_only(
    rows: list[dict[str, Any]],
    held: dict[tuple[str, str], datetime],
    tenant: str | None,
    limit: int,
    after: str | None,
) -> list[dict[str, Any]]:
    """The store's page of users with, in their place, the people plugins alone keep something
    of (a persona, facts and tasks a bot wrote with tools; no memory): they were listed nowhere,
    though the bot was given all of it. A page the store filled ends at its last user: a person
    before it and not in it holds no memory (the store's page has every one who does); past it,
    they wait for the next page. ``first_at`` and ``last_at`` are then their plugins' latest write."""
    listed = {(r["tenant"], r["user_id"]) for r in rows}
    end = (rows[-1]["tenant"], rows[-1]["user_id"]) if len(rows) >= limit else None
    start = (tenant, after) if after is not None and tenant is not None else None
    extra = [
        {
            "tenant": key[0],
            "user_id": key[1],
            "memories": 0,
            "scenes": 0,
            "chats": 0,
            "first_at": last.isoformat(),
            "last_at": last.isoformat(),
            "plugins_only": True,
        }
        for key, last in held.items()
        if key not in listed and (start is None or key > start) and (end is None or key < end)
    ]
    if not extra:
        return rows
    merged = sorted([*rows, *extra], key=lambda r: (r["tenant"], r["user_id"]))
    return merged[:limit]


def id_argument(value: Any, field: str) -> str:
    text = text_argument(value, field, max_chars=MAX_ID_CHARS)
    if not text:
        raise InputError("must not be empty", field=field)
    if "\x00" in text:  # no id holds one; PostgreSQL's driver refused it, naming nothing
        raise InputError("must not hold a NUL character", field=field)
    return text


# A store written before tenants() was part of the protocol lists them from its users instead.
TENANTS_FROM_USERS = 100_000


async def tenants(memory: MemoryView) -> list[str]:
    distinct = getattr(memory.store, "tenants", None)
    if distinct is not None:
        found = set(await distinct())
    else:
        found = {u["tenant"] for u in await memory.store.users(None, limit=TENANTS_FROM_USERS)}
    # A tenant whose people plugins alone keep something of (a bot of tools alone) is one too.
    return sorted(found | {tenant for tenant, _ in await _plugin_people(memory, None)})


async def call_tool(
    memory: MemoryView,
    tools: ToolRegistry,
    name: str,
    arguments: dict[str, Any] | str | None,
    scope: Scope | None = None,
) -> dict[str, Any]:
    bound = None if scope is None else scope.model_dump(exclude_none=True)
    tool, args = tools.validate(name, arguments, bound=bound)
    # Past validation, a failure is the tool's, not the caller's: it is a PluginError naming the
    # tool and its plugin (a raw exception named neither, and read as a bug of narrmem's).
    plugin = tools.plugin_of(tool.name)
    named = f"tool {tool.name!r}" + (f" (plugin {plugin!r})" if plugin is not None else "")
    try:
        output = await tool.handler(memory, args)
    except NarrmemError:
        raise  # the tool's own refusal (an InputError naming a field, a StoreError) as it said it
    except Exception as exc:
        raise PluginError(f"{named} failed: {exc!r}") from exc
    if isinstance(output, dict):
        try:
            output = tool.output_model.model_validate(output)
        except ValidationError as exc:
            raise PluginError(
                f"{named} returned a dict that is not a {tool.output_model.__name__}: {exc}"
            ) from exc
    if not isinstance(output, BaseModel):
        raise PluginError(
            f"{named} returned {type(output).__name__}, not a {tool.output_model.__name__} or a dict"
        )
    return dict(output.model_dump(mode="json"))


async def patterns(memory: MemoryView, user: Scope) -> dict[str, Any]:
    now = memory.clock.now()
    found = [
        p
        for part in await memory.host.call("narrmem_patterns", memory=memory, user=user, now=now)
        for p in part
    ]
    parts = await memory.host.call("narrmem_pattern_firings", memory=memory, user=user, patterns=found)
    return {
        "counts": [p.model_dump(mode="json") for p in found],
        "triggers": [fired for part in parts for fired in part],
    }
