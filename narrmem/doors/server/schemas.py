"""Request bodies of the HTTP API that the library has no model for; every one forbids unknown
fields and bounds every string and list, like the library's own models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from narrmem.models import MAX_ID_CHARS, MAX_QUERY_CHARS, IncomingMessage, RecallRequest, Scope

MAX_MESSAGE_IDS = 1000


class _Strict(BaseModel):
    # Strict as the tools' arguments are: "5" is not a number, nor 1 a boolean.
    model_config = ConfigDict(extra="forbid", strict=True)


class IngestBatch(_Strict):
    """Messages ingested in order with batched embeddings; all validated before any is stored.
    More than the server's batch limit is refused with 413."""

    messages: list[IncomingMessage] = Field(min_length=1)


class DeleteMessages(_Strict):
    """Forget what these messages of a chat left (a chat reported them deleted)."""

    chat_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    message_ids: list[str] = Field(min_length=1, max_length=MAX_MESSAGE_IDS)
    tenant: str = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)


class RecallBody(RecallRequest):
    """:class:`narrmem.models.RecallRequest`, plus ``explain`` (keep each hit's ``why``); strict,
    as the recall tool's arguments are ("k": "5" or true is refused, not read as 5 or 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    explain: bool = Field(default=False, description="include each hit's why")


class ContextBody(Scope):
    text: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="the message being answered")
    k: int = Field(default=8, ge=1, le=200)
    exclude_message_ids: list[str] = Field(default_factory=list, max_length=200)
    token_budget: int | None = Field(default=None, ge=1, le=100_000, description="cut the rendered block")
    reinforce: bool = Field(
        default=True,
        description="the hits gain importance as a recall's do; false: a look that changes nothing",
    )


class TurnContextBody(_Strict):
    text: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    user_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    chat_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    tenant: str = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)


class MarkUsedBody(Scope):
    memory_ids: list[int] = Field(min_length=1, max_length=200)
