"""The tools registry behind ``Memory.call_tool``: named, validated, typed operations an LLM
(or an MCP client, or a bot) can call with JSON arguments.

Arguments are strict JSON: a value of the wrong JSON type (``"5"`` for a number, ``"true"`` for a
boolean, ``1`` for a string) is an :class:`~narrmem.errors.InputError` naming the field, for every
tool and every door (``Memory.call_tool``, MCP, HTTP)."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from narrmem.checks import JsonShapeError, check_plain_json, loads_json
from narrmem.errors import InputError, PluginError, UnknownToolError
from narrmem.host import hookimpl
from narrmem.models import NO_NUL_SCHEMA

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
        schema: dict[str, Any] = without_nul_patterns(self.input_model.model_json_schema())
        return schema

    def output_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = without_nul_patterns(self.output_model.model_json_schema())
        return schema


def without_nul_patterns(schema: Any) -> Any:
    """``schema`` without the ids' "no NUL" pattern: said for clients generated from the HTTP
    document, it cost a model's prompt about twenty tokens per id field and tells a model nothing
    (the arguments are checked all the same)."""
    if isinstance(schema, dict):
        return {
            key: without_nul_patterns(value)
            for key, value in schema.items()
            if not (key == "pattern" and value == NO_NUL_SCHEMA["pattern"])
        }
    if isinstance(schema, list):
        return [without_nul_patterns(item) for item in schema]
    return schema


C = TypeVar("C")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class ToolSpec(Generic[C]):
    """A tool written as a module-level handler that also takes its plugin's context
    (``handler(context, memory, arguments)``): a plugin keeps a table of these next to their
    schemas and binds them to its per-memory state with :func:`bind_tools` (or :class:`ToolTable`)."""

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


class ToolTable:
    """A plugin whose tools are a table of :class:`ToolSpec` bound to the plugin object itself:
    subclass it, set ``tool_specs``, and ``narrmem_register_tools`` registers them."""

    tool_specs: ClassVar[Sequence[ToolSpec[Any]]] = ()

    @hookimpl
    def narrmem_register_tools(self, register: Callable[[Tool], None]) -> None:
        for tool in bind_tools(self.tool_specs, self):
            register(tool)


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._plugins: dict[str, str] = {}

    def register(self, tool: Tool, *, plugin: str | None = None) -> None:
        """Add ``tool``; ``plugin`` is the name of the plugin registering it (the host passes it
        from ``narrmem_register_tools``), so that a clash or a failing tool names its plugin."""
        if not isinstance(tool, Tool):
            raise PluginError(f"register() takes a narrmem.tools.Tool, not {type(tool).__name__}")
        if tool.name in self._tools:
            raise PluginError(
                f"tool '{tool.name}' is registered twice: by {self._owner(tool.name)} "
                f"and by {_plugin_phrase(plugin)}"
            )
        self._tools[tool.name] = tool
        if plugin is not None:
            self._plugins[tool.name] = plugin

    def plugin_of(self, name: str) -> str | None:
        """The name of the plugin that registered tool ``name``, if it was registered through it."""
        return self._plugins.get(name)

    def _owner(self, name: str) -> str:
        return _plugin_phrase(self._plugins.get(name))

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

    def validate(
        self, name: str, arguments: dict[str, Any] | str | None, *, bound: Mapping[str, str] | None = None
    ) -> tuple[Tool, BaseModel]:
        """The tool and its arguments, checked. ``bound``: the ids (``tenant``, ``user_id``,
        ``chat_id``) the call acts for, given to the tool in those of its fields it has; a call that
        names another is refused, naming the field (one that gives none, or null, gets them)."""
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
        if bound:
            arguments = _bound(tool, arguments, bound)
        return tool, strict_input(tool.input_model, arguments)


def _bound(tool: Tool, arguments: dict[str, Any], bound: Mapping[str, str]) -> dict[str, Any]:
    # A model's arguments follow whatever words it read (another person's message in a group
    # included): the ids it acts for are the caller's to say, not the model's.
    fields = tool.input_model.model_fields
    arguments = dict(arguments)
    for field, value in bound.items():
        if field not in fields:
            continue
        given = arguments.get(field)
        if given is not None and given != value:
            raise InputError(f"this call acts for {field} {value!r}, not {given!r}", field=field)
        arguments[field] = value
    return arguments


def _plugin_phrase(plugin: str | None) -> str:
    return f"plugin {plugin!r}" if plugin is not None else "a caller outside any plugin"


def strict_input(model: type[M], arguments: dict[str, Any]) -> M:
    """``arguments`` (plain JSON) as ``model``, validated the way JSON is read: types are strict, so
    ``"5"`` is not a number and ``"true"`` not a boolean (a caller that sends them has a bug the
    error should show); ISO-8601 text is still a datetime, as JSON has no other way to write one."""
    try:
        return model.model_validate_json(json.dumps(arguments, ensure_ascii=False), strict=True)
    except ValidationError as exc:
        raise _strict_error(exc) from exc


def _strict_error(exc: ValidationError) -> InputError:
    """Every failing field in the message, a type error saying which JSON type came instead, so
    that ``"5"`` against ``5`` is visible; ``field`` names the first."""
    parts, fields = [], []
    for err in exc.errors(include_url=False):
        path = ".".join(str(p) for p in err["loc"]) or "arguments"
        hint = f", not {_json_kind(err.get('input'))}" if _is_type_error(err["type"]) else ""
        parts.append(f"{path}: {err['msg']}{hint}")
        fields.append(path)
    return InputError("; ".join(parts), field=fields[0] if fields else "arguments")


_TYPE_ERRORS = frozenset({"literal_error", "enum"})  # besides every "*_type" error


def _is_type_error(kind: str) -> bool:
    return kind.endswith("_type") or kind in _TYPE_ERRORS


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40], ensure_ascii=False)}"
    if value is None:
        return "null"
    return "an array" if isinstance(value, list) else "an object"


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
