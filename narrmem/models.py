"""Pydantic models shared by the core and the plugins. Every boundary model forbids unknown fields."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self, TypedDict, cast, get_args

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic._internal._model_construction import ModelMetaclass
from pydantic_core import PydanticCustomError

from narrmem.checks import JsonShapeError, check_plain_json, check_time_range
from narrmem.errors import InputError
from narrmem.text import added, token_counts, tokens_of

MAX_TEXT_CHARS = 16_000
# A record's keyword context: a few turns around it and a date line, each at most a message long.
MAX_CONTEXT_CHARS = MAX_TEXT_CHARS * 8
MAX_ID_CHARS = 200
MAX_QUERY_CHARS = 4_000
MAX_META_BYTES = 64_000
# A record keeps its message's meta with narrmem's own keys beside it (layer, moods, edits).
MAX_RECORD_META_BYTES = 2 * MAX_META_BYTES

# No NUL in an id, said in the JSON schema only, for clients generated from it: no_nul refuses
# one with its own words, which a pattern constraint would replace with pydantic's.
NO_NUL_SCHEMA: dict[str, Any] = {"pattern": "^[^\\u0000]*$"}
IdStr = Field(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA)
KIND_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
_TIME_TEXT: TypeAdapter[datetime] = TypeAdapter(datetime)
EDITED_AT = "edited_at"  # the key of meta an edit's date is in
_NUMBER = re.compile(r"[+-]?\d+(\.\d*)?([eE][+-]?\d+)?")

Layer = Literal["ignore", "accumulate", "scene"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def trusted(cls, **fields: Any) -> Self:
        """The model holding ``fields`` as they are, unvalidated: for values that are valid already
        (a row narrmem validated on its way into the store, numbers a plugin computed itself).
        Every field must be given, none is defaulted. A recall reads a hundred records:
        ``model_construct``, which fills defaults field by field, takes twice as long, validation
        four times (a small model without validators, such as a candidate, validates faster in
        pydantic's compiled core than this runs: it is for records). Raises :class:`TypeError` naming the
        fields missing or unknown."""
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = frozenset(cls.model_fields)
        if fields.keys() != names:
            missing = sorted(names - fields.keys())
            unknown = sorted(fields.keys() - names)
            raise TypeError(f"{cls.__name__}.trusted: missing fields {missing}, unknown fields {unknown}")
        model = cls.__new__(cls)
        _set(model, "__dict__", fields)
        _set(model, "__pydantic_fields_set__", set(fields))
        _set(model, "__pydantic_extra__", None)
        _set(model, "__pydantic_private__", None)
        return model


_set = object.__setattr__
_FIELD_NAMES: dict[type[BaseModel], frozenset[str]] = {}


class ClientInput(_Strict):
    """What a caller hands in (a message, a scope, a recall's request, an HTTP body): a field sent
    as ``null`` that cannot be null and has a default is taken as left out. Go encodes a nil slice
    or map as ``null``, and a client's optional field is ``null`` when unset: ``"meta": null`` or
    ``"exclude_message_ids": null`` were refused with a 422. Not ``tenant``, here: a bot whose
    tenant came out ``None`` by mistake would read, or forget, in the default tenant; the HTTP
    bodies take a ``null`` tenant as left out (the key's tenant), as they take one left out."""

    null_refused: ClassVar[frozenset[str]] = frozenset({"tenant"})

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(value is None for value in data.values()):
            defaulted = _defaulted_not_null(cls) - cls.null_refused
            return {key: value for key, value in data.items() if value is not None or key not in defaulted}
        return data


_DEFAULTED_NOT_NULL: dict[type[BaseModel], frozenset[str]] = {}


def _defaulted_not_null(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` that have a default and do not take ``None``."""
    names = _DEFAULTED_NOT_NULL.get(model)
    if names is None:
        names = _DEFAULTED_NOT_NULL[model] = frozenset(
            name
            for name, field in model.model_fields.items()
            if not field.is_required()
            and field.default is not None
            and field.annotation is not Any
            and type(None) not in get_args(field.annotation)
        )
    return names


class _Sent(_Strict):
    """A model narrmem answers with: every field is sent, a default one too, so the JSON schema
    of what is sent (``mode="serialization"``, the HTTP document's) has them all required: a
    client generated from it reads ``hit.sources`` without a check for undefined."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class _InputErrors(ModelMetaclass):
    """``Message(...)`` with a bad field (a naive ``ts``, say) raises narrmem's
    :class:`~narrmem.errors.InputError` naming it, as every other door does. Only the call is
    wrapped: validation itself (``model_validate``, a Message inside another model) is pydantic's,
    with its errors' locations intact."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc


def no_nul(value: str | None) -> str | None:
    """An id as every store can keep it: PostgreSQL text cannot hold NUL, and an id one backend
    takes and another refuses would fail a migration, or a write halfway."""
    if value is not None and "\x00" in value:
        raise ValueError("must not hold a NUL character")
    return value


class Message(ClientInput, metaclass=_InputErrors):
    """One chat message as a bot sees it. ``ts`` must carry a timezone."""

    # A Message handed in as an object is checked again: its fields may have been set after it
    # was built (assignment is not validated), and a bad value would fail later, mid-write.
    model_config = ConfigDict(extra="forbid", revalidate_instances="always")

    text: str = Field(max_length=MAX_TEXT_CHARS)
    user_id: str = IdStr
    chat_id: str = IdStr
    ts: AwareDatetime
    message_id: str = IdStr
    tenant: str = Field(
        default="default", min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA
    )
    speaker: str | None = Field(default=None, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("meta")
    @classmethod
    def _meta_is_json(cls, meta: dict[str, Any]) -> dict[str, Any]:
        return json_object(meta)

    @field_validator("ts", mode="before")
    @classmethod
    def _ts_is_a_time(cls, ts: object) -> object:
        return a_time(ts)

    @field_validator("ts")
    @classmethod
    def _ts_in_range(cls, ts: datetime) -> datetime:
        return check_time_range(ts)

    _ids_without_nul = field_validator("user_id", "chat_id", "message_id", "tenant", "speaker")(no_nul)


def edit_time(meta: dict[str, Any]) -> datetime | None:
    """``meta.edited_at``, when an edit was made (``None`` or left out: undated), held to what
    ``ts`` is; ``ValueError`` saying why not. An edit's date decides which of two edits is the
    newer, and one that could not be read (Telegram's ``edit_date`` as a number, a time without
    its offset) was taken as undated, so a late retry of an earlier edit replaced the newer text
    without a word to the client. Checked of what a caller hands in (``as_message``); what was
    stored before the check (a message held, an owed hook's) is read with :func:`edit_time_or_none`."""
    value = meta.get(EDITED_AT)
    if value is None:
        return None
    try:
        read = a_time(value)
        if not isinstance(read, datetime) or read.tzinfo is None or read.utcoffset() is None:
            raise ValueError("must carry a timezone")
        return check_time_range(read)
    except PydanticCustomError as exc:
        raise ValueError(exc.message()) from None


def edit_time_or_none(meta: dict[str, Any]) -> datetime | None:
    """:func:`edit_time`, ``None`` for a date that cannot be read (see there)."""
    try:
        return edit_time(meta)
    except ValueError:
        return None


def a_time(value: object) -> object:
    """A field's value before pydantic reads it as a time: a number (or a string of digits) is
    refused, which pydantic would read as seconds since 1970 (a client's 0 for "no time" was
    stored as 1 January 1970), and text is read as ISO 8601 with a timezone."""
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        raise PydanticCustomError(
            "datetime_type", "must be an ISO 8601 time with a timezone (2026-05-04T09:15:00+00:00)"
        )
    if isinstance(value, str):
        # Read here: after a validator of its own, a strict check (the tools') takes no text.
        try:
            return _TIME_TEXT.validate_python(value)
        except ValidationError as exc:
            raise PydanticCustomError(
                "datetime_from_date_parsing",
                "must be an ISO 8601 time with a timezone (2026-05-04T09:15:00+00:00): {reason}",
                {"reason": exc.errors()[0]["msg"]},
            ) from None
    return value


class IncomingMessage(Message):
    """A message from a tool or HTTP caller: ``ts`` may be left out, and is then the memory's
    clock's now (see :meth:`at`). The Python API keeps to :class:`Message`, where ``ts`` is required."""

    ts: AwareDatetime | None = Field(  # type: ignore[assignment]
        default=None,
        description="when it was said: ISO 8601 with a UTC offset or Z (2026-05-04T09:15:00+00:00), "
        "from 1900-01-01 up to (not including) 3000-01-01 UTC; a number is refused; left out: now, "
        "by the memory's clock",
    )

    # The same name replaces Message's validator, which would refuse a missing ts.
    @field_validator("ts")
    @classmethod
    def _ts_in_range(cls, ts: datetime | None) -> datetime | None:  # type: ignore[override]
        return None if ts is None else check_time_range(ts)

    def at(self, now: datetime) -> Message:
        """The message to ingest: its own ``ts``, else ``now``."""
        data = self.model_dump()
        if data["ts"] is None:
            data["ts"] = now
        return Message.model_validate(data)


def json_object(value: dict[str, Any], limit: int = MAX_META_BYTES) -> dict[str, Any]:
    """``value`` if it is plain JSON of a bounded size and depth (it is stored and exported as JSON)."""
    try:
        check_plain_json(value)
    except JsonShapeError as exc:
        raise ValueError(f"must be plain JSON ({exc})") from None
    encoded = json.dumps(value, ensure_ascii=False)
    if len(encoded.encode()) > limit:
        raise ValueError(f"must be at most {limit} bytes as JSON")
    return value


class Scope(ClientInput):
    """Whose memories a query may see. A user scope sees only that user; a chat scope only that chat."""

    # Strict: bytes are not taken for text (a caller's raw argument would then differ from the
    # validated one, and go on to SQL and JSON as bytes).
    model_config = ConfigDict(extra="forbid", strict=True)

    tenant: str = Field(
        default="default", min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA
    )
    user_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=NO_NUL_SCHEMA
    )
    chat_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        validate_default=True,
        json_schema_extra=NO_NUL_SCHEMA,
    )

    _ids_without_nul = field_validator("tenant", "user_id", "chat_id")(no_nul)

    @field_validator("chat_id")
    @classmethod
    def _needs_user_or_chat(cls, chat_id: str | None, info: ValidationInfo) -> str | None:
        # A field validator (not a model validator) so the error names a field.
        if chat_id is None and info.data.get("user_id") is None:
            raise ValueError("a scope needs user_id or chat_id (or both)")
        return chat_id

    def key(self) -> tuple[str, str | None, str | None]:
        return (self.tenant, self.user_id, self.chat_id)


class TriageDecision(_Strict):
    """What triage decided for one message. ``type`` names a scene signal when ``layer`` is ``scene``.
    ``gist`` is the message without the small talk around what it says, when that is shorter: the
    episode's vector is made of it (attributed to the speaker like the whole message), while the
    keyword index and recall keep the whole message. ``None``: the whole message."""

    layer: Layer
    reason: str = ""
    type: str | None = None
    importance: float = Field(default=0.3, ge=0.0, le=1.0)
    signals: dict[str, Any] = Field(default_factory=dict)
    gist: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT_CHARS)


class MemoryRecord(_Sent):
    """A stored memory. ``text`` is what recall returns; ``embed_text`` is what gets embedded and
    keyword-indexed (defaults to ``text``); ``context_text`` is what the keyword index sees beside
    it, with less weight (the date, the turns just before)."""

    id: int | None = None
    kind: str = Field(default="episode", pattern=KIND_PATTERN)
    tenant: str = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)
    user_id: str = IdStr
    chat_id: str = IdStr
    speaker: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS * 4)
    embed_text: str | None = Field(default=None, max_length=MAX_TEXT_CHARS * 4)
    context_text: str | None = Field(default=None, max_length=MAX_CONTEXT_CHARS)
    importance: float = Field(default=0.3, ge=0.0, le=1.0)
    created_at: AwareDatetime
    stored_at: AwareDatetime | None = None
    reinforced_at: AwareDatetime | None = None  # the decay clock's start; None means created_at
    message_ids: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("meta")
    @classmethod
    def _meta_is_json(cls, meta: dict[str, Any]) -> dict[str, Any]:
        return json_object(meta, MAX_RECORD_META_BYTES)

    @property
    def index_text(self) -> str:
        return self.embed_text or self.text

    @classmethod
    def from_message(cls, message: Message, **fields: Any) -> MemoryRecord:
        """A memory ``message`` leaves: the speaker's, in the message's tenant and chat, dated by
        the message; ``fields`` set the rest (``kind``, ``text``, ...)."""
        return cls(**message.model_dump(include=_WHERE), created_at=message.ts, **fields)


class ContextLine(_Strict):
    """Words of a message being written, for the keyword context of earlier episodes of its chat
    (``narrmem_context_lines``): ``text`` becomes a line of the ``context_text`` of the episodes of
    ``message_ids``, and the message's id joins the list in their ``meta[key]``, which is what a
    forget of the message scrubs the line by. The chat and tenant are the message's own: a line
    never reaches another chat."""

    message_ids: list[Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]] = Field(
        min_length=1, max_length=64
    )
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS * 4)
    key: str = Field(default="context_message_ids", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ImportanceChange(_Strict):
    """A change to a memory's stored importance, kept in its history (who, when, why)."""

    memory_id: int
    importance: float = Field(ge=0.0, le=1.0)
    reinforced_at: AwareDatetime
    old: float | None = None
    who: str
    why: str


class ForgetJob(_Strict):
    """A forget written down before anything is deleted, so that a crash midway is finished on the
    next open. ``messages`` set: forget only what those messages of ``chat_id`` left (a deleted
    message); unset: everything in the scope. ``sources`` are the message ids the forgotten memories
    came from, by chat: plugins that copied words of them elsewhere find the copies by these ids,
    even once the memories themselves are gone."""

    id: int
    tenant: str
    user_id: str | None = None
    chat_id: str | None = None
    messages: list[str] | None = None
    sources: dict[str, list[str]] = Field(default_factory=dict)

    @property
    def scope(self) -> Scope:
        return Scope(tenant=self.tenant, user_id=self.user_id, chat_id=self.chat_id)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ForgetJob:
        """A job from a store's ``(id, tenant, user_id, chat_id, messages, sources)`` row, the
        last two as JSON text (every backend keeps them so)."""
        return cls(
            id=int(row[0]),
            tenant=row[1],
            user_id=row[2],
            chat_id=row[3],
            messages=None if row[4] is None else json.loads(row[4]),
            sources=json.loads(row[5]),
        )


class TriggerEvent(_Sent):
    """Something that keeps coming back (a topic, a mood, a habit), for the bot to act on."""

    kind: str
    label: str
    count: int = Field(ge=1)
    tenant: str = "default"
    user_id: str
    chat_id: str | None = None
    message_ids: list[str] = Field(default_factory=list, description="the mentions counted")
    cause_message_id: str | None = Field(
        default=None,
        description="the message whose ingest made the event (in chat_id): with [storage] acknowledge "
        "other than 'after_hooks' the event comes a moment after that ingest answered",
    )
    suggestion: str = ""


class PatternCount(_Sent):
    """How often something came back for a user: a topic, an emotion, a value, a habit."""

    kind: str
    label: str
    count: int = Field(ge=1)
    message_ids: list[str] = Field(default_factory=list)
    times: list[AwareDatetime] = Field(default_factory=list, description="when each counted mention was")
    at_least: bool = Field(
        default=False,
        description="the count is a lower bound: the counter reads a bounded number of mentions, and "
        "there may be more than it read",
    )
    quiet_days_before: float | None = Field(
        default=None,
        description="days between the mention that made this count and the one before it, however "
        "long ago (None: no earlier mention known); what a topic's return is measured by",
    )
    memory_ids: list[int] = Field(
        default_factory=list,
        exclude=True,
        description="the ids of the memories counted, the person's across chats: what tells one "
        "pattern from another while its label's words change from mention to mention; left out of "
        "what is dumped (a chat's readers are given only that chat's message ids)",
    )

    def event(self, message: Message, *, suggestion: str, kind: str | None = None) -> TriggerEvent:
        """The trigger this count makes, in the scope of ``message`` (the one that made it);
        ``kind`` when the event is of another kind than the count (a habit from a topic)."""
        fields = self.model_dump(include={"label", "count", "message_ids"})
        where = message.model_dump(include={"tenant", "user_id", "chat_id"})
        # Its cause is named by the host, as for every event a message's hooks make in its chat.
        return TriggerEvent(kind=kind or self.kind, **fields, **where, suggestion=suggestion)


SCENE_FIELDS = "fields"  # where a scene record keeps its SceneDraft in meta


class SceneDraft(_Strict):
    """The narrative fragment of a scene: the fields and the rendered paragraph."""

    time: str
    scene: str
    vibe: str
    core: str
    impact: str = ""
    category: Literal["decision", "emotion_change", "milestone", "preference", "general"] = "general"
    tags: list[str] = Field(default_factory=list)
    language: Literal["en", "zh"] = "en"

    @classmethod
    def of(cls, record: MemoryRecord) -> SceneDraft | None:
        """The fragment a scene record holds (``None`` for any other memory, or a scene written by
        hand without fields). This and :meth:`stored` are the one way in and out of ``meta``."""
        fields = record.meta.get(SCENE_FIELDS)
        if not isinstance(fields, dict):
            return None
        try:
            return cls.model_validate(fields)
        except ValidationError:
            return None

    def stored(self) -> dict[str, Any]:
        """The fields as kept in a scene record's ``meta``."""
        return {SCENE_FIELDS: self.model_dump(mode="json")}

    def render(self) -> str:
        """The descriptive paragraph, labelled in the user's language; the Core stays verbatim."""
        if self.language == "zh":
            labels, quote = ("【场景】", "时间", "场景", "氛围", "核心", "影响", "尚无"), "「{}」"
            sep = "："
        else:
            labels, quote = ("【Scene】", "Time", "Scene", "Vibe", "Core", "Impact", "not yet known"), '"{}"'
            sep = ": "
        title, time, scene, vibe, core, impact, unknown = labels
        return "\n".join(
            [
                title,
                f"{time}{sep}{self.time}",
                f"{scene}{sep}{self.scene}",
                f"{vibe}{sep}{self.vibe}",
                f"{core}{sep}{quote.format(self.core)}",
                f"{impact}{sep}{self.impact or unknown}",
            ]
        )


def speaker_labels(hits: Sequence[Hit]) -> list[str | None]:
    """How each hit names its speaker in a prompt: by person (``user_id``), not by name. Each person
    goes by the name of their newest hit, with the one a hit was said under when it differs
    ("Robert (then Bob)"); people who share a name are each told by a tag made from their id, which
    no one chooses and which shows nothing of it (an id may be an e-mail address or a phone number):
    "Alice (#3f2a)", "Alice (#9c01)". A display name is anyone's to take: printed as given, an
    impersonator's words read as Alice's, and a renamed person as two."""
    newest: dict[str, Hit] = {}
    for hit in hits:
        person = hit.user_id or hit.speaker
        if hit.speaker and person and (person not in newest or _when(hit) > _when(newest[person])):
            newest[person] = hit
    sharing: dict[str, set[str]] = {}
    for person, hit in newest.items():
        sharing.setdefault(str(hit.speaker), set()).add(person)
    labels: list[str | None] = []
    for hit in hits:
        person = hit.user_id or hit.speaker
        if not hit.speaker or person not in newest:
            labels.append(hit.speaker)
            continue
        name = str(newest[person].speaker)
        label = name if len(sharing[name]) == 1 else f"{name} (#{_tag(person, sharing[name])})"
        labels.append(label if hit.speaker == name else f"{label} (then {hit.speaker})")
    return labels


def _when(hit: Hit) -> tuple[datetime, int]:
    return hit.created_at, hit.id or 0


def _tag(person: str, people: set[str]) -> str:
    """The shortest start (four characters at least) of ``person``'s id digest that no other of
    ``people`` shares."""
    digests = {who: hashlib.sha256(who.encode()).hexdigest() for who in people}
    mine = digests[person]
    for length in range(4, len(mine)):
        if not any(who != person and digest.startswith(mine[:length]) for who, digest in digests.items()):
            return mine[:length]
    return mine


class IngestResult(_Sent):
    message_id: str
    layer: Layer
    stored: bool
    duplicate: bool = False
    reason: str = ""
    type: str | None = None
    memory_ids: list[int] = Field(default_factory=list)
    records: list[MemoryRecord] = Field(default_factory=list)
    scene: MemoryRecord | None = None
    counts: list[PatternCount] = Field(default_factory=list)
    triggers: list[TriggerEvent] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    settled: bool = Field(
        default=True,
        description="False when the message was acknowledged once written and its after-store hooks "
        "(counts, facts, triggers) run afterwards ([storage] acknowledge = 'after_write'): counts and "
        "the hooks' notes are then not in this result, and triggers reach the trigger callbacks",
    )
    written: bool = Field(
        default=True,
        description="False when the message was acknowledged on receipt ([storage] acknowledge = "
        "'on_receipt'): it is kept in the store as it came and written a moment later, so "
        "memory_ids, records and scene are empty here; recall in this process waits for it",
    )


class Candidate(_Strict):
    """One memory proposed by one recall source, with its rank (0 = best) in that source."""

    memory_id: int
    source: str
    rank: int = Field(ge=0)
    score: float


class Why(_Sent):
    """What made a hit rank where it did, in numbers a person can check.

    ``dense`` is the cosine similarity of the query and the memory (the embedding model's notion of
    "about the same thing", -1 to 1; unrelated sentences sit near 0.1); ``keyword`` is the BM25
    score of the query's words in the memory when the keyword source found it, and ``matched`` the
    query words it contains; ``sources`` is each recall source's rank for it (0 = its best);
    ``fused`` is the ranker's score before importance (0 to 1; the built-in ranker's estimate that
    the memory answers); ``importance_now`` the importance after decay and ``importance_factor``
    what every plugin's weights multiplied the fused score by; ``boosts`` each plugin's own weight
    by its name (``{"hippocampus": 0.81}``); ``age_days`` how old the memory is.
    ``relevant`` says whether the hit cleared the relevance floor (``[recall] min_similarity`` or
    a keyword match); only relevant hits are returned, and only relevant ones can be reinforced.
    """

    dense: float | None = None
    keyword: float | None = None
    matched: list[str] = Field(default_factory=list)
    sources: dict[str, int] = Field(default_factory=dict)
    fused: float = 0.0
    importance_now: float = 0.0
    importance_factor: float = 1.0
    boosts: dict[str, float] = Field(default_factory=dict)
    age_days: float = 0.0
    relevant: bool = True


# Where a memory belongs and who said it: the same fields on a message, a record and a hit.
_WHERE = {"tenant", "user_id", "chat_id", "speaker"}


class Hit(_Sent):
    """One recalled memory. ``text`` is what a prompt pays for: for a scene its Core in the user's
    words, for a long memory its sentences most relevant to the query; ``detail`` then holds the
    whole narrative fragment or message.

    ``score`` is in [0, 1]: how strongly the recall sources agree that this memory answers the
    query (1 = ranked first by every source), times the importance-after-decay factor; hits come
    best first. ``importance`` is the importance now, after decay; ``base_importance`` the stored
    value decay starts from. ``why`` breaks the score down."""

    id: int
    kind: str
    text: str
    detail: str | None = None
    score: float = Field(ge=0.0, le=1.0)
    importance: float
    base_importance: float | None = None
    created_at: datetime
    message_ids: list[str]
    tenant: str
    user_id: str
    chat_id: str
    speaker: str | None = None
    sources: dict[str, int] = Field(default_factory=dict)
    why: Why | None = None

    @classmethod
    def from_record(cls, record: MemoryRecord, **fields: Any) -> Hit:
        """``record`` as a hit: its id, kind, date, sources and scope; ``fields`` set the rest."""
        if record.id is None:
            raise ValueError("a hit is a stored memory: the record has no id")
        return cls(**record.model_dump(include=_FROM_RECORD), **fields)


_FROM_RECORD = {"id", "kind", "created_at", "message_ids", *_WHERE}


class RecallOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`narrmem.Memory.recall` (its docstring says what each does;
    the defaults are its own)."""

    user_id: str | None
    chat_id: str | None
    tenant: str
    k: int
    kinds: list[str] | None
    snippet_tokens: int | None
    reinforce: bool
    reinforce_reason: Literal["relevance", "tool"]
    exclude_message_ids: Sequence[str]
    asked_at: datetime | None


class RecallRequest(ClientInput):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    scope: Scope
    k: int = Field(default=5, ge=1, le=200)
    kinds: list[Annotated[str, Field(pattern=KIND_PATTERN)]] | None = Field(
        default=None, max_length=32, description="only these kinds of memory"
    )
    reinforce: bool = Field(default=True, description="relevant recalled memories may gain importance")
    reason: Literal["relevance", "tool"] = Field(
        default="relevance", description="why a reinforcement from this recall happened, for the history"
    )
    snippet_tokens: int | None = Field(default=48, ge=8, le=100_000, description="longer memories are cut")
    exclude_message_ids: list[str] = Field(
        default_factory=list,
        max_length=200,
        description="leave out memories that came only from these messages (the one being answered)",
    )
    asked_at: AwareDatetime | None = Field(
        default=None,
        description="when the question was asked, with the asker's UTC offset: 'yesterday' and "
        "'last Monday' are days of the asker's calendar (default: the memory's clock)",
    )

    def options(self) -> RecallOptions:
        """This request as :meth:`narrmem.Memory.recall`'s keyword arguments."""
        fields = self.model_dump(include=set(RecallRequest.model_fields) - {"query", "scope", "reason"})
        return cast(RecallOptions, {**self.scope.model_dump(), **fields, "reinforce_reason": self.reason})


class ContextPack(_Strict):
    """What narrmem knows that fits this turn, ready to be rendered into a prompt."""

    query: str
    scope: Scope
    hits: list[Hit] = Field(default_factory=list)

    def render(self, token_budget: int | None = None) -> str:
        """A prompt block, best hits first, cut to ``token_budget`` (estimated tokens) if given."""
        lines = ["What you remember about this conversation:"]
        # Counted as the joined text would be, a line at a time (measuring the whole block again at
        # every line took 0.1 s for 100 Russian hits).
        used = token_counts(lines[0])
        labels = speaker_labels(self.hits)
        for hit, label in zip(self.hits, labels, strict=True):
            when = hit.created_at.strftime("%Y-%m-%d")
            who = f"{label}: " if label else ""
            text = " | ".join(part.strip() for part in hit.text.splitlines() if part.strip())
            line = f"- [{when}, {hit.kind}] {who}{text}"
            with_line = added(used, token_counts("\n" + line))
            if token_budget is not None and tokens_of(with_line) > token_budget:
                break
            lines.append(line)
            used = with_line
        return "\n".join(lines) if len(lines) > 1 else ""
