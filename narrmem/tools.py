"""The tools registry behind ``Memory.call_tool``: named, validated, typed operations an LLM
(or an MCP client, or a bot) can call with JSON arguments."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from narrmem.checks import JsonShapeError, check_plain_json, loads_json
from narrmem.errors import InputError, PluginError, UnknownToolError

if TYPE_CHECKING:
    from narrmem.view import MemoryView

MAX_ARGUMENT_BYTES = 1_000_000


@dataclass(frozen=True)
class Tool:
    """``handler(memory, arguments)`` gets a validated ``input_model`` instance and returns an
    ``output_model`` instance (or a dict that validates as one)."""

    name: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    handler: Callable[[MemoryView, Any], Awaitable[Any]]

    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema()

    def output_schema(self) -> dict[str, Any]:
        return self.output_model.model_json_schema()


C = TypeVar("C")


@dataclass(frozen=True)
class ToolSpec(Generic[C]):
    """A tool written as a module-level handler that also takes its plugin's context
    (``handler(context, memory, arguments)``): a plugin keeps a table of these next to their
    schemas and binds them to its per-memory state with :func:`bind_tools`."""

    name: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    handler: Callable[[C, MemoryView, Any], Awaitable[Any]]


def bind_tools(specs: Iterable[ToolSpec[C]], context: C) -> list[Tool]:
    """The :class:`Tool` objects to register, each handler bound to ``context``."""
    return [
        Tool(
            name=spec.name,
            description=spec.description,
            input_model=spec.input_model,
            output_model=spec.output_model,
            handler=functools.partial(spec.handler, context),
        )
        for spec in specs
    ]


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise PluginError(f"register() takes a narrmem.tools.Tool, not {type(tool).__name__}")
        if tool.name in self._tools:
            raise PluginError(f"tool '{tool.name}' is registered twice")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return sorted(self._tools)

    def get(self, name: str) -> Tool:
        if not isinstance(name, str):
            raise UnknownToolError(f"a tool name is a string, not {type(name).__name__}", field="name")
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise UnknownToolError(f"unknown tool '{name}' (known: {known})", field="name") from None

    def validate(self, name: str, arguments: dict[str, Any] | str | None) -> tuple[Tool, BaseModel]:
        tool = self.get(name)
        if isinstance(arguments, str | bytes):
            if len(arguments) > MAX_ARGUMENT_BYTES:
                raise InputError(f"arguments exceed {MAX_ARGUMENT_BYTES} bytes", field="arguments")
            try:
                arguments = loads_json(arguments or "{}")
            except JsonShapeError as exc:
                raise _not_plain(exc) from exc
            except ValueError as exc:  # bad syntax, or bytes that are not UTF-8
                raise InputError(f"arguments are not valid JSON: {exc}", field="arguments") from exc
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise InputError("arguments must be a JSON object", field="arguments")
        try:
            # Before pydantic: a free-form field (a dict of anything) would let any depth through.
            check_plain_json(arguments)
        except JsonShapeError as exc:
            raise _not_plain(exc) from exc
        try:
            return tool, tool.input_model.model_validate(arguments)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc


def _not_plain(exc: JsonShapeError) -> InputError:
    return InputError(f"not plain JSON: {exc.reason}", field=exc.path or "arguments")


SchemaFormat = Literal["openai", "anthropic", "mcp"]


def tool_schemas(registry: ToolRegistry, format: SchemaFormat = "openai") -> list[dict[str, Any]]:
    """Every tool's schema for an LLM's function calling (``openai``, ``anthropic``) or MCP."""
    out: list[dict[str, Any]] = []
    for name in registry.names():
        tool = registry.get(name)
        schema = tool.input_schema()
        if format == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {"name": name, "description": tool.description, "parameters": schema},
                }
            )
        elif format == "anthropic":
            out.append({"name": name, "description": tool.description, "input_schema": schema})
        else:
            out.append(
                {
                    "name": name,
                    "description": tool.description,
                    "inputSchema": schema,
                    "outputSchema": tool.output_schema(),
                }
            )
    return out
