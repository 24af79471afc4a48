"""Request bodies of the HTTP API that the library has no model for; every one forbids unknown
fields and bounds every string and list, like the library's own models. Also the body of every
error the server sends (:class:`ErrorBody`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from narrmem import models
from narrmem.checks import check_time_range
from narrmem.models import (
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    NO_NUL_SCHEMA,
    Message,
    RecallRequest,
    Scope,
)

MAX_MESSAGE_IDS = 1000
MEMORY_ID_LIMIT = 2**63  # every id is below it (SQLite's and PostgreSQL's bigint)

# Scope's validator (_needs_user_or_chat) refuses a scope with neither id; said here in the JSON
# schema, for clients generated from the document. Only on the HTTP bodies: Scope's own schema
# is also the root of tools' arguments (narrmem_recall), and function calling (OpenAI's strict
# mode among them) takes no anyOf at a schema's root; and with the reference, not in a model
# of another name, so that the document's Scope keeps its name. A null id satisfies neither branch.
# Inside an allOf: an anyOf beside a model's properties made openapi-typescript's type a union
# that took a body without its other required fields, and beside a $ref it was dropped.
_USER_OR_CHAT: dict[str, Any] = {
    "anyOf": [
        {"required": ["user_id"], "properties": {"user_id": {"type": "string"}}},
        {"required": ["chat_id"], "properties": {"chat_id": {"type": "string"}}},
    ]
}
NEEDS_USER_OR_CHAT: dict[str, Any] = {"allOf": [_USER_OR_CHAT]}


def needs_user_or_chat(schema: dict[str, Any]) -> None:
    """The schema of a :class:`Scope` field or body (a reference), with the rule added beside it."""
    reference = {"$ref": schema.pop("$ref")} if "$ref" in schema else {}
    schema["allOf"] = [*([reference] if reference else []), *schema.pop("allOf", []), _USER_OR_CHAT]


def without_tenant_defaults(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` whose bodies' ``tenant`` declares no default: it is the key's tenant when left
    out. Declared ``"default"``, a generated client filled it in (openapi-typescript made it a
    required field), and a tenant's key was refused it with 403."""
    components = document.get("components", {}).get("schemas", {})
    bodies = [
        op["requestBody"]
        for methods in document["paths"].values()
        for op in methods.values()
        if "requestBody" in op
    ]
    for name in _referenced(bodies, components):
        tenant = components[name].get("properties", {}).get("tenant")
        if isinstance(tenant, dict) and tenant.pop("default", None) is not None:
            tenant["description"] = TENANT_LEFT_OUT
    return document


def _referenced(roots: list[Any], components: dict[str, Any]) -> set[str]:
    """The names of the components ``roots`` refer to, directly or through others."""
    found: set[str] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(COMPONENTS) and ref[len(COMPONENTS) :] not in found:
                found.add(ref[len(COMPONENTS) :])
                stack.append(components.get(ref[len(COMPONENTS) :]))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


COMPONENTS = "#/components/schemas/"
TENANT_LEFT_OUT = "left out: the key's tenant ('default' on a server without keys)"

# Item bounds said in the schema only: narrmem's own checks (message_id_list, memory_id_list)
# refuse the same items, with messages naming the item (message_ids[0]) that clients may match;
# pydantic's constraints would refuse them first, with other words.
MessageIdItem = Annotated[
    str, Field(json_schema_extra={"minLength": 1, "maxLength": MAX_ID_CHARS, **NO_NUL_SCHEMA})
]
# Exclusive 2**63, not inclusive 2**63 - 1: the document writes bounds as floats (FastAPI's
# model), and 2**63 - 1 became 2.0**63, which took 2**63.
MemoryIdItem = Annotated[int, Field(json_schema_extra={"minimum": 1, "exclusiveMaximum": MEMORY_ID_LIMIT})]


class _Strict(models.ClientInput):
    # Strict as the tools' arguments are: "5" is not a number, nor 1 a boolean.
    model_config = ConfigDict(extra="forbid", strict=True)
    null_refused: ClassVar[frozenset[str]] = frozenset()  # a null tenant: the key's (_settled)


class BodyScope(Scope):
    """A scope in a body: a null ``tenant`` is left out (the key's), as in the bodies around it."""

    null_refused: ClassVar[frozenset[str]] = frozenset()


def _id(default: str | None = None) -> Any:
    """An id field of a body: its bounds, and no NUL (refused by the memory's calls, see no_nul)."""
    if default is None:
        return Field(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA)
    return Field(default=default, min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA)


def _in_range(value: datetime | None) -> datetime | None:
    return None if value is None else check_time_range(value)


# A time a client gives of its own (when it first sent a message, when a forget was asked): read as
# a message's ts is (a number refused, a timezone required, inside the range narrmem computes with).
ClientTime = Annotated[AwareDatetime | None, BeforeValidator(models.a_time), AfterValidator(_in_range)]


class IncomingMessage(models.IncomingMessage):
    """A message as a client sends it over HTTP (the document's name kept): ``ts`` may be left
    out (now, by the memory's clock), and it may be sent again after being held (``held_since``)."""

    null_refused: ClassVar[frozenset[str]] = frozenset()  # a null tenant: the key's (_settled)

    held_since: ClientTime = Field(
        default=None,
        description="when the client first sent this message (or edit), if it held it and sends it "
        "again (after a 503, a timeout, its own restart): a message whose user, chat or itself was "
        "forgotten after then, by any worker, is not stored (stored false, reason 'forgotten "
        "since ...'), as the forget would have deleted it; left out: sent as it comes",
    )

    def sent(self, now: datetime) -> tuple[Message, datetime | None]:
        """The message to write (``ts`` left out: ``now``), and since when it was held."""
        data = self.model_dump(exclude={"held_since"})
        if data["ts"] is None:
            data["ts"] = now
        return Message.model_validate(data), self.held_since

    def at(self, now: datetime) -> Message:
        return self.sent(now)[0]


class ForgetBody(BodyScope):
    """A forget of a user and/or a chat, perhaps sent late (see ``asked_at``)."""

    asked_at: ClientTime = Field(
        default=None,
        description="when the forget was asked, if the client held it and sends it late (a 'forget "
        "me' kept through a 503): what the person said after then, held and sent with held_since, "
        "is not taken for what the forget deleted; left out: now",
    )


class IngestBatch(_Strict):
    """Messages ingested in order with batched embeddings; all validated before any is stored.
    More than the server's batch limit is refused with 413."""

    messages: list[IncomingMessage] = Field(min_length=1)


class DeleteMessages(_Strict):
    """Forget what these messages of a chat left (a chat reported them deleted)."""

    chat_id: str = _id()
    message_ids: list[MessageIdItem] = Field(min_length=1, max_length=MAX_MESSAGE_IDS)
    tenant: str = _id("default")


class RecallBody(RecallRequest):
    """:class:`narrmem.models.RecallRequest`, plus ``explain`` (keep each hit's ``why``); strict,
    as the recall tool's arguments are ("k": "5" or true is refused, not read as 5 or 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    null_refused: ClassVar[frozenset[str]] = frozenset()
    scope: Annotated[Scope, Field(json_schema_extra=needs_user_or_chat)]
    explain: bool = Field(default=False, description="include each hit's why")

    @model_validator(mode="before")
    @classmethod
    def _scope_tenant_null_is_left_out(cls, data: Any) -> Any:
        # The scope is narrmem's own Scope (its name in the document kept), where a null tenant
        # is refused; in a body it is left out, the key's, as in every other body.
        scope = data.get("scope") if isinstance(data, dict) else None
        if isinstance(scope, dict) and "tenant" in scope and scope["tenant"] is None:
            return {**data, "scope": {k: v for k, v in scope.items() if k != "tenant"}}
        return data

    # Strict bodies are checked as Python objects, where a datetime must already be one: the JSON
    # string a client sends is read here as a message's ts is.
    asked_at: ClientTime = Field(
        default=None,
        description="when the question was asked, with the asker's UTC offset: 'yesterday' and "
        "'last Monday' are days of the asker's calendar (default: the memory's clock)",
    )


class ContextBody(BodyScope):
    model_config = ConfigDict(json_schema_extra=NEEDS_USER_OR_CHAT)

    text: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="the message being answered")
    k: int = Field(default=8, ge=1, le=200)
    exclude_message_ids: list[MessageIdItem] = Field(default_factory=list, max_length=200)
    token_budget: int | None = Field(default=None, ge=1, le=100_000, description="cut the rendered block")
    reinforce: bool = Field(
        default=True,
        description="the hits gain importance as a recall's do; false: a look that changes nothing",
    )
    asked_at: ClientTime = Field(
        default=None,
        description="when the message was sent, with the sender's UTC offset (its ts): 'yesterday' "
        "and 'last Monday' in it are days of the sender's calendar (default: the memory's clock)",
    )


class TurnContextBody(_Strict):
    text: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    user_id: str = _id()
    chat_id: str = _id()
    tenant: str = _id("default")
    private: bool = Field(
        default=False,
        description="chat_id is a direct chat with the bot: the person's facts and memories from every "
        "chat of theirs; otherwise only those said in chat_id (everyone in it may read the answer)",
    )


class DecayBody(_Strict):
    """``{}``: the pass takes nothing. A JSON body is asked for all the same: a page of any site
    may post a form, or nothing, without the browser asking first, and with no body to check
    the store-wide pass ran for it on a server without keys."""


class MarkUsedBody(BodyScope):
    model_config = ConfigDict(json_schema_extra=NEEDS_USER_OR_CHAT)

    memory_ids: list[MemoryIdItem] = Field(min_length=1, max_length=200)


class ValidationErrorItem(BaseModel):
    """One problem with a request, as pydantic reports it (narrmem's own checks report theirs the
    same way, with ``type`` ``narrmem_input``)."""

    loc: list[str | int] = Field(description="where: 'body', 'query' or 'path', then the field's path")
    msg: str
    type: str
    ctx: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """The body of every error the server sends: ``detail`` says what is wrong (a list of problems
    for a request that is not valid), ``field`` names the field at fault when one is."""

    detail: str | list[ValidationErrorItem]
    field: str | None = Field(
        default=None,
        description="the field at fault, as narrmem writes fields: scope.user_id, message_ids[0]",
    )
