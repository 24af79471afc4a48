"""``narrmem mcp``: the registered tools over the Model Context Protocol (the official ``mcp``
SDK's low-level ``Server``), on stdio or streamable HTTP.

Tools are listed with their descriptions, input schemas generated from their pydantic models
(``additionalProperties: false``, required fields, enums, bounds) and output schemas; results come
back as structured content matching the output schema. A bad call is a tool error whose message
names the field; it never crashes the server and writes nothing.

A client pays for every listed tool's schema on every request, so the server can list a subset:
named groups (:data:`TOOL_GROUPS`) or tool names (``--tools`` or ``[mcp] tools``). A tool that is
not served cannot be called either.

Besides tools the server offers, for its one tenant, two resources per user (their persona and the
summary of who they are, read-only) and a prompt, ``narrmem_memory_guide``, that tells a model how
to use the tools it serves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, unquote

from narrmem import __version__, logs
from narrmem.checks import has_surrogate
from narrmem.errors import ClosedError, InputError, NarrmemError, StoreUnavailableError
from narrmem.memory import Memory

log = logs.logger("narrmem.mcp")

# Built-in tools by what they are for. A tool of a third-party plugin is in no group: it is served
# by "all", by its own name, or by "other" (every tool in no group).
TOOL_GROUPS: dict[str, tuple[str, ...]] = {
    "core": ("narrmem_ingest", "narrmem_recall"),
    "graph": ("memory_commit", "memory_recall", "memory_facts", "memory_purge", "context_rewrite"),
    "tasks": ("task_create", "task_set_state", "task_query", "task_chains"),
    "persona": ("persona_set", "persona_get"),
    "narrative": ("soul_narrative",),
    "rtm": (
        "rtm_create_narrative_tree",
        "rtm_traverse_narrative",
        "rtm_generate_ensemble",
        "rtm_find_optimal_depth",
    ),
}
ALL, OTHER = "all", "other"
PROMPT = "narrmem_memory_guide"
RESOURCE_USERS = 100  # users whose resources are listed (any user's can be read by its address)
RESOURCE_KINDS = ("persona", "summary")


def select_tools(available: Sequence[str], wanted: Iterable[str], *, field: str = "--tools") -> list[str]:
    """The tools to serve, in registration order: ``wanted`` holds group names (``all``, ``other``,
    :data:`TOOL_GROUPS`) and tool names. An unknown name is an error listing the known ones."""
    grouped = {name for names in TOOL_GROUPS.values() for name in names}
    chosen: set[str] = set()
    for raw in wanted:
        item = raw.strip()
        if item == ALL:
            chosen.update(available)
        elif item == OTHER:
            chosen.update(name for name in available if name not in grouped)
        elif item in TOOL_GROUPS:
            chosen.update(name for name in TOOL_GROUPS[item] if name in available)
        elif item in available:
            chosen.add(item)
        else:
            groups = ", ".join([ALL, *TOOL_GROUPS, OTHER])
            raise InputError(
                f"no tool or group named {item!r} (groups: {groups}; tools: {', '.join(available)})",
                field=field,
            )
    if not chosen:
        raise InputError("serves no tool: name at least one group or tool", field=field)
    return [name for name in available if name in chosen]


def build_server(memory: Memory, *, tenant: str = "default", tools: Iterable[str] = (ALL,)) -> Any:
    """An MCP ``Server`` over ``memory``, serving one tenant and the ``tools`` chosen (see
    :func:`select_tools`), with the users' resources and the memory guide prompt."""
    from mcp.server.lowlevel import Server

    served = select_tools(memory.tools.names(), tools)
    resources = _Resources(memory, tenant)
    return Server(
        "narrmem",
        version=__version__,
        instructions=(
            "Long-term memory of the people this assistant talks to. Recall before answering, ingest "
            f"what users say, and read the prompt '{PROMPT}' for how to use the tools."
        ),
        on_list_tools=_tool_lister(memory, served),
        on_call_tool=_tool_caller(memory, served, tenant),
        on_list_resources=resources.list,
        on_list_resource_templates=resources.templates,
        on_read_resource=resources.read,
        on_list_prompts=_prompt_lister(),
        on_get_prompt=_prompt_getter(served, tenant),
    )


def _tool_lister(memory: Memory, served: list[str]) -> Any:
    import mcp_types as types

    async def list_tools(ctx: Any, params: Any) -> Any:
        tools = []
        for name in served:
            tool = memory.tools.get(name)
            tools.append(
                types.Tool(
                    name=name,
                    description=tool.description,
                    input_schema=tool.input_schema(),
                    output_schema=tool.output_schema(),
                )
            )
        return types.ListToolsResult(tools=tools)

    return list_tools


def _tool_caller(memory: Memory, served: list[str], tenant: str) -> Any:
    import mcp_types as types

    def error(message: str) -> Any:
        return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)

    async def call_tool(ctx: Any, params: Any) -> Any:
        try:
            if params.name not in served and params.name in memory.tools.names():
                raise InputError(
                    f"tool {params.name!r} is not served here (narrmem mcp --tools)", field="name"
                )
            arguments = _in_tenant(memory, params.name, dict(params.arguments or {}), tenant)
            result = await memory.call_tool(params.name, arguments)
        except StoreUnavailableError as exc:
            return error(f"{exc} (try again later)")  # an agent may retry this one, not the others
        except NarrmemError as exc:
            return error(str(exc))
        except Exception as exc:
            log.exception("tool %s failed", params.name)
            return error(f"internal error in {params.name}: {type(exc).__name__}")
        text = json.dumps(result, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=result
        )

    return call_tool


def _in_tenant(memory: Memory, name: str, arguments: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A server serves one tenant: a call may leave ``tenant`` out, but may not name another."""
    tool = memory.tools.get(name)
    if "tenant" in tool.input_model.model_fields:
        given = arguments.setdefault("tenant", tenant)
        if given != tenant:
            raise InputError(f"this server serves tenant '{tenant}', not {given!r}", field="tenant")
    return arguments


# --- resources ---------------------------------------------------------------------------------


def resource_uri(user_id: str, kind: str) -> str:
    """``narrmem://users/<user id, percent-encoded>/<persona|summary>``."""
    return f"narrmem://users/{quote(user_id, safe='')}/{kind}"


class _Resources:
    """A user's persona (the graph plugin's ``persona_get``) and summary (``Memory.summary``), as
    plain text. Reading them changes nothing."""

    def __init__(self, memory: Memory, tenant: str) -> None:
        self.memory = memory
        self.tenant = tenant

    def kinds(self) -> list[str]:
        return [k for k in RESOURCE_KINDS if k != "persona" or "persona_get" in self.memory.tools.names()]

    async def list(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        users = await self.memory.users(self.tenant, limit=RESOURCE_USERS)
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=f"{kind} of {user['user_id']}",
                    uri=resource_uri(user["user_id"], kind),
                    description=_RESOURCE_TEXT[kind],
                    mime_type="text/plain",
                )
                for user in users
                for kind in self.kinds()
            ]
        )

    async def templates(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name=f"a user's {kind}",
                    uri_template=f"narrmem://users/{{user_id}}/{kind}",
                    description=_RESOURCE_TEXT[kind],
                    mime_type="text/plain",
                )
                for kind in self.kinds()
            ]
        )

    async def read(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        prefix, _, rest = uri.partition("narrmem://users/")
        user, _, kind = rest.rpartition("/")
        if prefix or not user or kind not in self.kinds():
            known = ", ".join(f"narrmem://users/{{user_id}}/{k}" for k in self.kinds())
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {uri!r} (known: {known})")
        try:
            text = await self._text(unquote(user), kind)
        except ClosedError as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc  # the request was fine
        except NarrmemError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)]
        )

    async def _text(self, user_id: str, kind: str) -> str:
        if kind == "persona":
            persona = await self.memory.call_tool("persona_get", {"user_id": user_id, "tenant": self.tenant})
            # Each chat's own too: a persona set for one chat alone read "(no persona set)".
            parts = [str(persona["rendered"]) or "(no default persona set)"] if persona["chats"] else []
            for chat in persona["chats"]:
                parts.append(f"In chat {chat['chat_id']}: {chat['description']}")
            return "\n".join(parts) if parts else str(persona["rendered"]) or "(no persona set)"
        summary = await self.memory.summary(user_id=user_id, tenant=self.tenant)
        return str(summary.get("retelling") or "") or "(nothing remembered yet)"


_RESOURCE_TEXT = {
    "persona": "The persona the bot keeps with this user (description, traits, tone).",
    "summary": "Who this user is, retold from their memories (oldest first), within a token budget.",
}


# --- the prompt --------------------------------------------------------------------------------

_GUIDE = {
    "core": (
        "Before you answer, call narrmem_recall with the user's message as the query; use what comes "
        "back, and say so when nothing does. After each user message, call narrmem_ingest with its "
        "text, user_id, chat_id and a message_id unique in the chat (leave ts out: the memory's clock "
        "gives now). Triage decides what is worth keeping; you need not judge it."
    ),
    "graph": (
        "When the user states a fact about themselves, call memory_commit with a triplet "
        "(subject 'user', a lower_snake relation, the object); mark what you only infer as speculative. "
        "memory_recall reads the graph by keywords; memory_purge corrects or removes facts (dry_run "
        "first)."
    ),
    "tasks": (
        "For work that spans turns, task_create records the task in the chat's chain, task_set_state "
        "moves it (in_progress, paused, done, cancelled) and task_query lists the chain (task_chains: "
        "every chat's)."
    ),
    "persona": "persona_get tells who you are for this user; persona_set changes it only when asked.",
    "narrative": "soul_narrative keeps the user's life events (decisions, turning points) as a story.",
    "rtm": "The rtm_ tools build and retell long texts at any level of detail.",
}


def _prompt_lister() -> Any:
    import mcp_types as types

    async def list_prompts(ctx: Any, params: Any) -> Any:
        return types.ListPromptsResult(
            prompts=[
                types.Prompt(
                    name=PROMPT,
                    description="How to use this memory's tools in a conversation.",
                    arguments=[
                        types.PromptArgument(name="user_id", description="whom you talk to", required=False),
                        types.PromptArgument(name="chat_id", description="the chat", required=False),
                    ],
                )
            ]
        )

    return list_prompts


def memory_guide(served: Sequence[str], tenant: str, user_id: str | None, chat_id: str | None) -> str:
    """What a model should do with the tools served, group by group (only those served)."""
    lines = [f"You have a long-term memory of the people you talk to (tenant '{tenant}')."]
    if user_id or chat_id:
        lines.append(f"Use user_id '{user_id or '?'}' and chat_id '{chat_id or '?'}' in every call.")
    for group, text in _GUIDE.items():
        if any(name in served for name in TOOL_GROUPS[group]):
            lines.append(text)
    lines.append(
        "Resources narrmem://users/{user_id}/persona and narrmem://users/{user_id}/summary hold who "
        "the user is; read them at the start of a conversation. Never tell one user another's memories."
    )
    return "\n\n".join(lines)


def _prompt_getter(served: list[str], tenant: str) -> Any:
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    async def get_prompt(ctx: Any, params: Any) -> Any:
        if params.name != PROMPT:
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name!r} (known: {PROMPT})")
        arguments = params.arguments or {}
        text = memory_guide(served, tenant, arguments.get("user_id"), arguments.get("chat_id"))
        return types.GetPromptResult(
            description="How to use this memory's tools",
            messages=[types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))],
        )

    return get_prompt


# --- serving -----------------------------------------------------------------------------------


async def serve_stdio(memory: Memory, *, tenant: str, tools: Iterable[str] = (ALL,)) -> None:
    import anyio
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    server = build_server(memory, tenant=tenant, tools=tools)
    try:
        async with stdio_server() as (lines, write_stream):
            # The transport hands a line its JSON-RPC parser refuses to the session as an exception,
            # which answers nothing: the client waited for ever. Such a line is answered here.
            checked_send, checked = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def answer_refused_lines() -> None:
                async with checked_send:
                    async for item in lines:
                        reply = refused_line_reply(item) if isinstance(item, Exception) else None
                        if reply is None:
                            await checked_send.send(item)
                        else:
                            await write_stream.send(SessionMessage(reply))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(answer_refused_lines)
                await server.run(checked, write_stream, server.create_initialization_options())
                tasks.cancel_scope.cancel()
    except* (BrokenPipeError, ConnectionResetError):
        # The client went away while an answer was on its way to it: as normal an end as its
        # closing stdin while the server is idle. The calls in flight were cancelled with the
        # transport, as a call the client cancels is.
        log.info("the client left before its answer was written")


# The request id of a line the JSON-RPC parser refused (a number or a string, near the start).
_REQUEST_ID = re.compile(r'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')
# Where the transport's parser stopped, as its message ends: the column counts bytes of UTF-8.
_STOPPED_AT = re.compile(r" at line (\d+) column (\d+)$")
# The tokens that move a JSON path: strings (the last one possibly cut short) and punctuation.
_PATH_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{},]', re.DOTALL)


def refused_line_reply(error: Exception) -> Any:
    """The JSON-RPC error answering a line the transport's parser refused, or ``None`` when it is
    not such a line or asks no answer (a notification). What JSON itself allows but the parser
    does not (a lone UTF-16 surrogate, which a JavaScript client sends for half an emoji, a
    number of thousands of digits, nesting past 200 levels) is named with the field that holds it:
    the path to where the parser stopped (for deep nesting, the first value nested too deep)."""
    import mcp_types as types
    from pydantic import ValidationError

    if not isinstance(error, ValidationError):
        return None
    details = error.errors()
    if not details or details[0]["type"] != "json_invalid" or not isinstance(details[0]["input"], str):
        return None
    line = details[0]["input"]
    reason = details[0]["msg"].removeprefix("Invalid JSON: ")
    too_deep_to_read = False
    try:
        data: Any = json.loads(line, parse_int=_whole_number)
    except RecursionError:
        # Python's own parser gives up a few hundred levels below the transport's limit: the
        # request is read no further than the path to where the transport stopped.
        data, too_deep_to_read = None, True
    except ValueError:
        data = None
    if isinstance(data, dict) and "id" not in data:
        return None  # a notification: nothing is answered
    if isinstance(data, dict) or too_deep_to_read:
        request_id = data.get("id") if isinstance(data, dict) else _request_id_near_start(line)
        if not isinstance(request_id, int | str):
            request_id = None
        where = _path_where_stopped(line, reason) or "the request"
        code, message = types.INVALID_PARAMS, f"field '{where}': {reason}"
    else:
        request_id = _request_id_near_start(line)
        code, message = types.PARSE_ERROR, f"not a JSON-RPC message: {reason}"
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))


def _whole_number(digits: str) -> int | None:
    """An integer of the line, or ``None`` past Python's limit on digits (``int()`` refuses it),
    so that a number the transport finds too long still leaves the request readable."""
    try:
        return int(digits)
    except ValueError:
        return None


def _request_id_near_start(line: str) -> int | str | None:
    found = _REQUEST_ID.search(line)
    request_id: int | str | None = json.loads(found.group(1)) if found else None
    return request_id


def _path_where_stopped(line: str, reason: str) -> str:
    """The path (``params.arguments.k``, as :func:`narrmem.checks.check_plain_json` writes it) of
    the value the transport's parser was reading when it stopped, read from the start of ``line``
    up to there without parsing it: the rest may be too deep for any parser here. ``""`` when the
    parser said not where it stopped, or stopped outside every object and array."""
    stopped = _STOPPED_AT.search(reason)
    rows = line.encode("utf-8", "surrogatepass").split(b"\n")
    if stopped is None or not 1 <= int(stopped[1]) <= len(rows):
        return ""
    row, column = int(stopped[1]), int(stopped[2])
    read = b"\n".join([*rows[: row - 1], rows[row - 1][: column - 1]]).decode("utf-8", "ignore")
    steps: list[str | int | None] = []  # per open object or array: its key (None before one) or index
    for token in _PATH_TOKEN.findall(read):
        if token in ("{", "["):
            steps.append(None if token == "{" else 0)
        elif token in ("}", "]"):
            del steps[-1:]
        elif token == ",":
            if steps:
                last = steps[-1]
                steps[-1] = last + 1 if isinstance(last, int) else None
        elif steps and steps[-1] is None:  # a string where an object expects its next key
            steps[-1] = _key_text(token)
    path = ""
    for step in steps:
        if isinstance(step, int):
            path = f"{path}[{step}]"
        elif step is not None:
            path = f"{path}.{step}" if path else step
    return path


def _key_text(token: str) -> str:
    """A key as its string token spells it, unescaped when that gives text that can be written back
    (a lone surrogate cannot: it is shown escaped, as sent)."""
    try:
        key = json.loads(token)
    except ValueError:
        key = None
    if isinstance(key, str) and not has_surrogate(key):
        return key
    return token[1:-1] if len(token) > 1 and token.endswith('"') else token[1:]


async def serve_http(
    memory: Memory, *, tenant: str, host: str, port: int, tools: Iterable[str] = (ALL,)
) -> None:
    import uvicorn

    from narrmem.doors.listening import check_port, serve

    check_port(port, "--http")
    server = build_server(memory, tenant=tenant, tools=tools)
    # Stateless: narrmem keeps nothing per MCP session, and a session kept per client that never
    # ends it (a bot that connects per message) held 2 tasks and about 40 KB for 30 minutes, and
    # past 10,000 of them every new client was refused.
    app = server.streamable_http_app(host=host, stateless_http=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    await serve(config, field="--http")
