"""``narrmem mcp``: every registered tool over the Model Context Protocol (the official ``mcp``
SDK's low-level ``Server``), on stdio or streamable HTTP.

Tools are listed with their descriptions, input schemas generated from their pydantic models
(``additionalProperties: false``, required fields, enums, bounds) and output schemas; results come
back as structured content matching the output schema. A bad call is a tool error whose message
names the field; it never crashes the server and writes nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from narrmem import __version__
from narrmem.errors import InputError, NarrmemError
from narrmem.memory import Memory

log = logging.getLogger("narrmem.mcp")


def build_server(memory: Memory, *, tenant: str = "default") -> Any:
    """An MCP ``Server`` over ``memory``'s tools, serving one tenant."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> Any:
        tools = []
        for name in memory.tools.names():
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

    async def call_tool(ctx: Any, params: Any) -> Any:
        try:
            arguments = _in_tenant(memory, params.name, dict(params.arguments or {}), tenant)
            result = await memory.call_tool(params.name, arguments)
        except NarrmemError as exc:
            return _error(str(exc))
        except Exception as exc:
            log.exception("tool %s failed", params.name)
            return _error(f"internal error in {params.name}: {type(exc).__name__}")
        text = json.dumps(result, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=result
        )

    def _error(message: str) -> Any:
        return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)

    return Server(
        "narrmem",
        version=__version__,
        instructions=(
            "Long-term memory of the people this assistant talks to. Recall before answering, ingest "
            "what users say, and use the narrative and graph tools to keep their story."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _in_tenant(memory: Memory, name: str, arguments: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A server serves one tenant: a call may leave ``tenant`` out, but may not name another."""
    tool = memory.tools.get(name)
    if "tenant" in tool.input_model.model_fields:
        given = arguments.setdefault("tenant", tenant)
        if given != tenant:
            raise InputError(f"this server serves tenant '{tenant}', not {given!r}", field="tenant")
    return arguments


async def serve_stdio(memory: Memory, *, tenant: str) -> None:
    from mcp.server.stdio import stdio_server

    server = build_server(memory, tenant=tenant)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_http(memory: Memory, *, tenant: str, host: str, port: int) -> None:
    import uvicorn

    server = build_server(memory, tenant=tenant)
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve()
