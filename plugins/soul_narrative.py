"""The ``soul_narrative`` tool: add, search, list, get and forget narrative scenes by hand (or by an
LLM). ``add`` writes a scene exactly as triage would (same table, same decay), with provenance
"tool". ``search``, ``list`` and ``get`` are inspection: they reinforce nothing, and show
importance as it is now, after decay."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from narrmem import hookimpl
from narrmem.checks import SQLITE_MAX_INT
from narrmem.errors import InputError
from narrmem.models import MAX_ID_CHARS, MAX_QUERY_CHARS, MAX_TEXT_CHARS, MemoryRecord, Scope, no_nul
from narrmem.tools import Tool
from narrmem.view import MemoryView

Category = Literal["decision", "emotion_change", "milestone", "preference", "general"]
DIRECT_CHAT = "_direct"  # the chat of a scene added without one
LIST_WINDOW = 1_000  # the scenes list reads from the store at a time, before its filters

# Which optional fields each action takes; any other given field is an error naming it.
FIELDS = {
    "add": {"event", "category", "importance", "tags"},
    "search": {"query", "k"},
    "list": {"category", "min_importance", "tag", "k", "before_id"},
    "get": {"id"},
    "forget": {"id"},
}
REQUIRED = {"add": ("event",), "search": ("query",), "get": ("id",), "forget": ("id",), "list": ()}
DEFAULTS = {"k": 5, "tags": []}


class SoulNarrativeInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["add", "search", "list", "get", "forget"] = Field(description="what to do")
    user_id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="whose narrative")
    chat_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    tenant: str = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)
    event: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        description="add: the complete narrative fragment",
    )
    category: Category | None = Field(default=None, description="add: the kind of moment; list: filter")
    importance: float | None = Field(
        default=None, ge=0.0, le=1.0, description="add: 0-1, sets how fast it fades"
    )
    tags: list[str] = Field(default_factory=list, max_length=20, description="add: related tags")
    query: str | None = Field(default=None, min_length=1, max_length=MAX_QUERY_CHARS, description="search")
    k: int = Field(default=5, ge=1, le=200, description="search and list: how many")
    id: int | None = Field(
        default=None, ge=1, le=SQLITE_MAX_INT, description="get and forget: the scene's id"
    )
    min_importance: float | None = Field(default=None, ge=0.0, le=1.0, description="list: filter")
    tag: str | None = Field(default=None, min_length=1, max_length=100, description="list: filter")
    before_id: int | None = Field(
        default=None,
        ge=1,
        le=SQLITE_MAX_INT,
        description="list: the next page, the scenes that come after this one (the last id of the "
        "previous page) in the list's order, newest first",
    )

    _ids_without_nul = field_validator("user_id", "chat_id", "tenant")(no_nul)

    @field_validator("event")
    @classmethod
    def _event_said_something(cls, event: str | None) -> str | None:
        # A blank fragment was stored as a scene of its own (ingest stores nothing for one).
        if event is not None and not event.strip():
            raise ValueError("must say something (it is blank)")
        return event


class SceneOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int
    text: str
    category: str
    importance: float = Field(description="importance now, after decay")
    base_importance: float = Field(description="the stored importance decay starts from")
    tags: list[str]
    created_at: datetime
    chat_id: str = Field(description="the chat the scene was said in (its messages' chat)")
    message_ids: list[str]
    source: str


class SoulNarrativeOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str
    scenes: list[SceneOut]
    count: int
    more: bool = Field(
        default=False, description="list: more scenes match after these (read them with before_id)"
    )


def _check(args: SoulNarrativeInput) -> None:
    given = {name for name in args.model_fields_set if name not in {"action", "user_id", "chat_id", "tenant"}}
    for name in sorted(given - FIELDS[args.action]):
        if getattr(args, name) != DEFAULTS.get(name, None):
            raise InputError(f"is not used by action '{args.action}'", field=name)
    for name in REQUIRED[args.action]:
        if getattr(args, name) is None:
            raise InputError(f"is required by action '{args.action}'", field=name)
    if args.action == "add" and any(not tag.strip() or len(tag) > 50 for tag in args.tags):
        raise InputError("each tag must be 1 to 50 characters", field="tags")


def _out(record: MemoryRecord, now: dict[int, float]) -> SceneOut:
    assert record.id is not None
    return SceneOut(
        id=record.id,
        text=record.text,
        category=str(record.meta.get("category", "general")),
        importance=now.get(record.id, record.importance),
        base_importance=record.importance,
        tags=[str(t) for t in record.meta.get("tags", [])],
        created_at=record.created_at,
        chat_id=record.chat_id,
        message_ids=record.message_ids,
        source=str(record.meta.get("source", "message")),
    )


async def soul_narrative(memory: MemoryView, args: SoulNarrativeInput) -> SoulNarrativeOutput:
    _check(args)
    scope = Scope(tenant=args.tenant, user_id=args.user_id, chat_id=args.chat_id)
    scenes: list[MemoryRecord] = []
    more = False
    if args.action == "add":
        scenes = [await _add(memory, args)]
    elif args.action == "search":
        assert args.query is not None  # _check: search requires it
        # Looking scenes up is inspection, not use: nothing is reinforced.
        hits = await memory.recall(
            args.query, **scope.model_dump(), k=args.k, kinds=["scene"], reinforce=False
        )
        found = await memory.store.get([h.id for h in hits], scope)
        scenes = [found[h.id] for h in hits if h.id in found]
    elif args.action == "list":
        scenes, more = await _list(memory, scope, args)
    else:
        assert args.id is not None  # _check: get and forget require it
        found = await memory.store.get([args.id], scope)
        record = found.get(args.id)
        if record is None or record.kind != "scene":
            raise InputError("no scene with this id in this scope", field="id")
        scenes = [record]
        if args.action == "forget":
            # As any forget: the plugins told, its words out of the process and, at the next
            # purge, the files (a delete in the store alone did neither).
            await memory.forget_memories([args.id], **scope.model_dump())
    now = await memory.importance_now(scenes)
    return SoulNarrativeOutput(
        action=args.action, scenes=[_out(r, now) for r in scenes], count=len(scenes), more=more
    )


async def _list(
    memory: MemoryView, scope: Scope, args: SoulNarrativeInput
) -> tuple[list[MemoryRecord], bool]:
    """A page of the scope's scenes, newest first, that meet the filters, and whether more follow.

    Read from the store a window at a time, down the list's own order, (created_at, id), from the
    scene ``before_id`` (a keyset, so a page stays right when scenes are added meanwhile), until a
    page and one more are found or none is left: every scene can be listed, however many there are
    (reading only the newest 10,000, a heavy user's older scenes could not). A tag, or else a
    category, is matched by the store's query (``meta_has``)."""
    cursor: tuple[datetime, int] | None = None
    if args.before_id is not None:
        found = (await memory.store.get([args.before_id], scope)).get(args.before_id)
        if found is None or found.kind != "scene":
            raise InputError("no scene with this id in this scope", field="before_id")
        cursor = (found.created_at, args.before_id)
    meta_has = ("tags", args.tag) if args.tag is not None else None
    if meta_has is None and args.category is not None:
        meta_has = ("category", args.category)
    matching: list[MemoryRecord] = []
    window = LIST_WINDOW
    while len(matching) <= args.k:
        recent = await memory.store.recent(
            scope, kinds=["scene"], until=cursor[0] if cursor else None, limit=window, meta_has=meta_has
        )
        later = [r for r in recent if cursor is None or (r.created_at, r.id or 0) < cursor]
        now = await memory.importance_now(later) if args.min_importance is not None else {}
        matching += [
            r
            for r in later
            if (args.category is None or r.meta.get("category") == args.category)
            and (args.min_importance is None or now.get(r.id or 0, r.importance) >= args.min_importance)
            and (args.tag is None or args.tag in r.meta.get("tags", []))
        ]
        if len(recent) < window:
            break  # the scope's last scene was read
        if later:
            cursor = (later[-1].created_at, later[-1].id or 0)
        else:
            window *= 2  # the window held only scenes listed already, all of the cursor's instant
    return matching[: args.k], len(matching) > args.k


async def _add(memory: MemoryView, args: SoulNarrativeInput) -> MemoryRecord:
    assert args.event is not None
    now = memory.clock.now()
    record = MemoryRecord(
        kind="scene",
        tenant=args.tenant,
        user_id=args.user_id,
        chat_id=args.chat_id or DIRECT_CHAT,
        text=args.event,
        importance=0.5 if args.importance is None else args.importance,
        created_at=now,
        stored_at=now,
        message_ids=[],
        meta={"type": None, "category": args.category or "general", "tags": args.tags, "source": "tool"},
    )
    vectors = await memory.embedder.embed([record.index_text])
    await memory.store.add([record], vectors)
    return record


@hookimpl
def narrmem_register_tools(register: Callable[[Tool], None]) -> None:
    register(
        Tool(
            name="soul_narrative",
            description=(
                "Keep the user's life story as narrative scenes. action='add' stores a complete "
                "narrative fragment (event) with a category (decision, emotion_change, milestone, "
                "preference, general), importance 0-1 (how slowly it fades) and tags; 'search' finds "
                "scenes for a query (k results); 'list' shows scenes filtered by category, "
                "min_importance (importance now, after decay) or tag, k at a time (more=true: pass the last "
                "id as before_id for the next page); 'get' reads one scene by id; "
                "reading never reinforces; 'forget' deletes one scene by id. Every action needs user_id (and "
                "takes chat_id and tenant) and sees only that user's scenes."
            ),
            input_model=SoulNarrativeInput,
            output_model=SoulNarrativeOutput,
            handler=soul_narrative,
        )
    )
