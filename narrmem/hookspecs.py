"""Every hook narrmem calls. Each docstring is the contract a plugin implements against.

Conventions (read once, they hold for every hook below):

* Implementations may be ``def`` or ``async def``; the host awaits what they return.
* Arguments are keyword-only and grow additively: an implementation names only the
  arguments it uses, so new arguments never break an old plugin.
* Order is pluggy's: plugins registered later run first; ``tryfirst``/``trylast`` adjust it.
  Built-ins are registered before third-party plugins, so a third-party plugin can override
  a built-in ``firstresult`` hook simply by answering.
* ``firstresult`` hooks stop at the first implementation that returns something other than
  ``None`` (the host emulates this *after* awaiting, so async implementations work).
* A plugin that raises inside a per-message or per-query hook does not take the message down:
  the host logs it with the plugin's name, calls :func:`narrmem_plugin_error`, and carries on
  with the other implementations; except a :class:`~narrmem.errors.StoreUnavailableError` (the
  store cannot be reached), which fails the call as a whole, to be tried again: an answer made
  without the store would pass for "nothing is stored" (but in the hooks that run after the
  call's own work, ``narrmem.host.AFTER_THE_WORK``, where it is isolated as any failure).
  Errors in set-up hooks (configure, register, startup) abort ``Memory.open`` instead, because a
  half-configured memory is worse than none: as a :class:`~narrmem.errors.PluginError` naming
  the plugin and the hook, the plugin's exception chained (a narrmem error it raised on purpose,
  a ``ConfigError`` naming a key, passes as it is).
* A value of another type than the hook's return annotation is the plugin failing the same way
  (a :class:`~narrmem.errors.PluginError` naming plugin, hook and type; see
  :mod:`narrmem.hook_returns`, which checks a container and its first and last items).
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    import numpy as np

    from narrmem.config import Settings
    from narrmem.models import (
        Candidate,
        ContextLine,
        Hit,
        IngestResult,
        MemoryRecord,
        Message,
        PatternCount,
        RecallRequest,
        SceneDraft,
        Scope,
        TriageDecision,
        TriggerEvent,
    )
    from narrmem.view import MemoryView

hookspec = pluggy.HookspecMarker("narrmem")


# --- set-up and lifecycle -------------------------------------------------------------------


@hookspec
def narrmem_configure(memory: MemoryView, settings: Settings) -> None:
    """Read and validate this plugin's options.

    Called once per ``Memory`` before anything else, with the loaded settings. Plugins read
    their ``[plugin.<name>]`` table with :func:`narrmem.config.plugin_options`, which raises
    :class:`~narrmem.errors.ConfigError` naming any bad key. Raising aborts ``Memory.open``.
    """


@hookspec
def narrmem_register_stores(register: Callable[[str, Callable[[MemoryView], Any]], None]) -> None:
    """Contribute store backends: ``register(name, factory)``.

    ``factory(memory)`` returns an object implementing :class:`narrmem.store.Store` (not yet
    opened). ``[storage] backend`` in the settings chooses one by name. Registering a name
    twice is an error. A store that also implements :class:`narrmem.store.RecordsModel` says
    which model's vectors it holds before it is opened, so an embedder offering several loads
    the right one.
    """


@hookspec
def narrmem_register_embedders(register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
    """Contribute embedders: ``register(name, factory)``.

    ``factory(settings)`` returns an object implementing :class:`narrmem.embed.Embedder`.
    ``[embedder] backend`` chooses one by name. The embedder must not download anything.
    One that can give several models' vectors (float32, int7 and int8 weights) also implements
    :class:`narrmem.embed.ModelChooser`: before it loads, it is told the model the store holds.
    The built-in embedders run the model on a :class:`narrmem.model_thread.ModelThread`, which
    takes a query before the rest of an import's batch, or (``[embedder] runs_in``) in a child
    process of its own, :class:`narrmem.model_process.ModelProcess`, with the same two lanes; and
    they keep the vectors of the texts they embedded last (:class:`narrmem.recent_vectors.RecentVectors`).
    All of it comes with subclassing :class:`narrmem.embed.ThreadedEmbedder`, which asks for ``dim``
    and either ``_prepare`` (a picklable :class:`narrmem.model_process.ModelSpec`, which loads the
    model here or in its process) or ``_encode`` (the model then stays on the thread).
    An embedder that keeps texts must implement :class:`narrmem.recent_vectors.ForgetsRecentTexts`,
    which every forget calls, so that no forgotten message's words stay in the process.
    """


@hookspec
def narrmem_register_tools(register: Callable[[Any], None]) -> None:
    """Contribute tools for ``Memory.call_tool``: ``register(tool)`` with a :class:`narrmem.tools.Tool`.

    A tool's input and output are pydantic models (``extra="forbid"``, with bounds); tools
    that touch someone's memory take the scope (``tenant``, ``user_id``, ``chat_id``) as arguments.
    A name another plugin registered is refused naming both plugins. A handler that raises anything
    but a narrmem error, or answers with what does not fit ``output_model``, is a
    :class:`~narrmem.errors.PluginError` naming the tool and this plugin.
    """


@hookspec
def narrmem_startup(memory: MemoryView) -> None:
    """The store and embedder are open; start background work or load state.

    Runs in registration order's reverse like every hook. Raising aborts ``Memory.open``.
    """


@hookspec
def narrmem_shutdown(memory: MemoryView) -> None:
    """``Memory`` is closing: stop background work and flush state. The store is still open.

    Errors are logged and reported; every plugin's shutdown runs.
    """


# --- ingest ------------------------------------------------------------------------------


@hookspec(firstresult=True)
def narrmem_triage(memory: MemoryView, message: Message) -> TriageDecision | None:
    """Decide what a message deserves: ``ignore``, ``accumulate`` (keep as an episode and count)
    or ``scene`` (write a narrative memory).

    firstresult: the first non-``None`` decision wins. Ignored messages must cost microseconds:
    cheap rules first, no embedding, no I/O for a message the plugin passes on (a plugin may
    write its own bookkeeping of a message it decides, as the spoiler example counts what it
    refuses). It runs for every message ingested, and for ``Memory.triage``, a dry run that
    stores nothing; not for a held message refused because its person was forgotten since. If
    every implementation returns ``None`` or raises, the host keeps the message as an episode
    (``accumulate``), so nothing is lost.
    A decision may carry a ``gist``, the message without the small talk around what it says:
    the episode's vector is made of it, while the keyword index and recall keep the whole text.
    """


@hookspec
def narrmem_before_store(
    memory: MemoryView,
    message: Message,
    decision: TriageDecision,
    records: list[MemoryRecord],
    unwritten: list[MemoryRecord],
) -> None:
    """Shape what is about to be written for a message triage did not ignore.

    ``records`` starts with the episode (the raw message with its provenance). Plugins may
    edit the records in place (``embed_text``, ``importance``, ``meta``) or append new ones
    (a scene, a fact) that are written in the same transaction. Nothing is stored yet. The
    episode's text is already being embedded while this hook runs; a text a plugin changes or
    adds is embedded after it, so every record is stored with the vector of its own text.
    ``unwritten``: the episodes of the same speaker in the same chat that came earlier in the
    same call (a batch, an import), at most the last :data:`UNWRITTEN_KEPT`, oldest first: not
    in the store yet, and what a look at the chat's recent messages must add to what it reads.
    """


UNWRITTEN_KEPT = 12  # see narrmem_before_store


@hookspec(firstresult=True)
def narrmem_episode_gist(memory: MemoryView, text: str) -> str | None:
    """The gist of a stored episode's ``text`` (its message's words), when its vector is made
    again with another model (``narrmem migrate --reembed``).

    The plugin whose ``narrmem_triage`` decisions carry a ``gist`` answers with the gist it gives
    a message of this text, so the episode's new vector is of the same words as its first was
    (and as a new episode's is). ``None``: no gist, the whole message is embedded.
    firstresult. Must not write or depend on what is stored (it runs for every episode moved).
    """


@hookspec
def narrmem_context_lines(
    memory: MemoryView, message: Message, decision: TriageDecision, records: list[MemoryRecord]
) -> list[ContextLine] | None:
    """Words of this message for the keyword context of earlier episodes of its chat, written in
    the same transaction as its records (after every ``narrmem_before_store``).

    Each :class:`~narrmem.models.ContextLine` names the earlier messages whose episodes get its
    ``text`` as a line of their ``context_text``, with this message's id in their ``meta[key]``: a
    forget of this message finds the line by that id and must take it out (the plugin that adds
    lines scrubs them in ``narrmem_after_forget``). A line goes in only if this message's episode
    is written (not a duplicate), only into episodes of the same tenant and chat, and once per
    message (a row that lists the message already keeps its context). The store must implement
    :class:`~narrmem.store.WritesContext`; with another store the lines are dropped.
    """


@hookspec(firstresult=True)
def narrmem_compose_scene(
    memory: MemoryView, message: Message, decision: TriageDecision, window: list[MemoryRecord]
) -> SceneDraft | None:
    """Write the narrative fragment for a message triage marked ``scene``.

    firstresult: an LLM plugin can answer with a richer fragment; the built-in composer needs no
    LLM. ``window`` is the speaker's own recent episodes in this chat (oldest first, this message
    excluded), for the Scene and Vibe fields. A scene belongs to its speaker: it must hold no one
    else's words, or they would be shown to the speaker and outlive their own forget. Return
    ``None`` to leave it to the next composer.
    """


@hookspec
def narrmem_after_store(
    memory: MemoryView,
    message: Message,
    decision: TriageDecision,
    records: list[MemoryRecord],
    vectors: np.ndarray,
    result: IngestResult,
) -> None:
    """The message's records are committed (they now carry their ids); ``vectors`` holds their
    embeddings, row for row.

    Update counters, link scenes, refresh summaries. Plugins may append to ``result.counts``,
    ``result.triggers`` and ``result.notes``; the host delivers triggers after every plugin has run,
    naming the message as the cause (``cause_message_id``) of those in its chat that name none.

    May run a second time for a message: a process that stops after its hooks ran and before their
    record went has them run again at the next open. Write nothing twice (the built-in plugins
    check that a scene or an Impact entry is already there, and count facts by message).

    Raising :class:`~narrmem.errors.StoreUnavailableError` (the store went away after the
    write) is isolated, noted on ``result.notes``, and owed: this plugin's hook alone runs again
    for the message once the store answers (the same process tries after 1, 2, 5, 10, 30 and 60
    seconds, then every five minutes; what is owed at close, the next open), and not at all if
    the message is forgotten meanwhile. A hook that reads what other plugins' hooks put in
    ``result`` names them in its plugin's ``narrmem_after_store_with`` (a tuple of plugin names):
    when either side is run again, both are (the proactive plugin reads the triage plugin's
    counts, and turns its raw threshold crossings into the events it lets through).
    """


@hookspec
def narrmem_on_trigger(memory: MemoryView, event: TriggerEvent) -> None:
    """A trigger event (a topic mentioned N times, a repeated emotion, a habit) was emitted.

    Called once per event when the hooks of the message that caused it have run: before ingest
    answers with ``[storage] acknowledge = "after_hooks"``, a moment after with the other modes
    (``event.cause_message_id`` names the message). A raising implementation is logged and reported
    and never breaks ingest.
    """


# --- recall -----------------------------------------------------------------------------


@hookspec
def narrmem_recall_prefetch(memory: MemoryView, request: RecallRequest) -> list[Candidate] | None:
    """Propose memories for a query without its vector (keyword search, say).

    Called while the query is being embedded, so this source's I/O overlaps the model instead of
    following it. The same contract as ``narrmem_recall_candidates``: filter by ``request.scope``
    in the query itself; ranks are per source.
    """


@hookspec
def narrmem_recall_candidates(
    memory: MemoryView, request: RecallRequest, query_vector: np.ndarray
) -> list[Candidate] | None:
    """Propose memories for a query, each with its rank in this source.

    Called as soon as the query is embedded, whether or not the early sources
    (``narrmem_recall_prefetch``) have finished: the two run side by side.
    Every implementation must filter by ``request.scope`` in its query (never by ranking):
    a candidate outside the scope is a leak. ``query_vector`` is the normalized query
    embedding. The host also re-checks the scope when it loads the records.
    """


@hookspec(firstresult=True)
def narrmem_rank(
    memory: MemoryView,
    request: RecallRequest,
    candidates: list[Candidate],
    records: dict[int, MemoryRecord],
) -> list[tuple[int, float]] | None:
    """Fuse all candidates into one ranking: return ``[(memory_id, score), ...]`` best first,
    with scores in [0, 1], higher is better (the built-in ranker's is its estimate that the memory
    answers the query): the score is what ``Hit.score`` shows a person, after importance.

    firstresult. ``records`` holds the in-scope stored records for the candidate ids (with
    importance and timestamps). If nobody answers, the host ranks by normalized reciprocal rank
    fusion. Rank only those ids: one that is not among them is skipped, and the plugin reported
    (``narrmem_plugin_error``).
    """


@hookspec
def narrmem_weigh(
    memory: MemoryView, request: RecallRequest, records: dict[int, MemoryRecord]
) -> dict[int, float] | None:
    """Multiplicative weights for ranked memories (importance after decay, say): each returned
    ``{memory_id: weight}`` multiplies that memory's fused score before the final cut to ``k``.
    Weights must be in [0, 1] (the product is capped at 1, so scores stay in [0, 1]; 0 sinks the
    memory); a memory a plugin does not mention keeps weight 1. A weight outside, or not a
    number, is reported as the plugin's error (``narrmem_plugin_error``) and left out. Each
    plugin's weight is shown in ``Why.boosts`` under its name."""


@hookspec
def narrmem_after_recall(
    memory: MemoryView, request: RecallRequest, hits: list[Hit], records: dict[int, MemoryRecord]
) -> None:
    """These hits are about to be returned to the caller. Every hit cleared the relevance floor;
    ``hit.why`` says how (``dense`` similarity, ``matched`` words). Reinforcement belongs here, and
    only when ``request.reinforce`` is set: a recall from inspection never changes a memory. A
    plugin may update ``hit.importance`` to what it stored. ``records`` holds the stored records
    of the hits (and of the other candidates), as read for this recall."""


@hookspec(firstresult=True)
def narrmem_importance_now(
    memory: MemoryView, records: list[MemoryRecord], now: datetime
) -> dict[int, float] | None:
    """Each record's importance after decay at ``now`` (``{memory_id: value}``), for everything a
    person or a filter sees (``Hit.importance``, tool listings, ``min_importance``).

    firstresult: the hippocampus answers; without an answer the stored importance is shown."""


@hookspec
def narrmem_used(memory: MemoryView, records: list[MemoryRecord]) -> list[int] | None:
    """The bot says it used these (in-scope) memories in its answer (``Memory.mark_used``).
    Return the ids this plugin reinforced."""


# --- maintenance ------------------------------------------------------------------------


@hookspec
def narrmem_decay(memory: MemoryView, now: datetime) -> dict[str, int] | None:
    """Run a decay pass as of ``now`` and return counts. Must be idempotent: the outcome depends
    on the stored state and ``now`` only, so a second pass at the same ``now`` changes nothing."""


@hookspec
def narrmem_stats(memory: MemoryView) -> dict[str, Any] | None:
    """Figures this plugin adds to ``Memory.stats()`` (merged into the result)."""


@hookspec
def narrmem_history(memory: MemoryView, record: MemoryRecord, now: datetime) -> dict[str, Any] | None:
    """What this plugin can tell about a memory's importance over time (merged into
    ``Memory.history``)."""


@hookspec
def narrmem_patterns(memory: MemoryView, user: Scope, now: datetime) -> list[PatternCount] | None:
    """The patterns this plugin counts for ``user`` (a tenant and user scope) as of ``now``: what
    keeps coming back, read from what is stored (``Memory.patterns``; the lists are joined).
    Reading only: an implementation writes nothing, and what was forgotten is not counted."""


@hookspec
def narrmem_pattern_firings(
    memory: MemoryView, user: Scope, patterns: list[PatternCount]
) -> list[dict[str, Any]] | None:
    """For ``patterns`` of ``user``, the ones that fired a trigger, as dicts with at least
    ``kind``, ``label``, ``count`` (the count it fired at) and ``fired_at`` (ISO time), read from
    the plugin's own state (``Memory.patterns``; the lists are joined). Reading only."""


# --- summaries --------------------------------------------------------------------------


@hookspec(firstresult=True)
def narrmem_summarize(memory: MemoryView, clauses: list[str], language: str) -> str | None:
    """Write an abstractive summary of one narrative span (``language`` is ``en`` or ``zh``), for
    the rtm plugin's tree nodes and anything else that summarises spans.

    firstresult: the first non-``None`` string wins; ``None`` leaves the span to the next
    implementation and finally to the built-in extractive summary. Called once per distinct span,
    so an LLM implementation should be fast or cache.
    """


@hookspec(firstresult=True)
def narrmem_user_summary(
    memory: MemoryView, tenant: str, user_id: str, depth: int | None, token_budget: int | None
) -> dict[str, Any] | None:
    """Who this user is, told at an abstraction level: at ``depth`` or, given a ``token_budget``,
    the most detailed telling that fits. Returns at least ``{"depth", "retelling"}``."""


# --- the graph and the per-turn flow ------------------------------------------------------


@hookspec(firstresult=True)
def narrmem_extract_facts(
    memory: MemoryView, message: Message, decision: TriageDecision
) -> list[dict[str, Any]] | None:
    """The facts a stored message states about its author, for the graph plugin: a list of
    ``{"subject", "relation", "object", "speculative"?, "confidence"?, "subject_type"?, "object_type"?}``
    (subject ``"user"`` is the message's author; ``subject`` defaults to it).

    firstresult: an LLM plugin can answer with richer facts; an empty list means "no facts", ``None``
    leaves the message to the next implementation and finally to the graph plugin's built-in rules.
    Anything the message implies but does not say must come back with ``speculative: True``. Invalid
    items are skipped with a note in ``IngestResult.notes``.
    """


@hookspec(firstresult=True)
def narrmem_turn_context(
    memory: MemoryView, tenant: str, user_id: str, chat_id: str, text: str, private: bool
) -> dict[str, Any] | None:
    """What the bot must know before it answers ``text`` in this chat: the per-turn flow as one dict,
    ``{"persona", "refers_back", "tasks", "task_facts", "facts", "memories", "rendered"}``: 1 the
    persona, 2 the working memory chain (every task in progress, in chain order, or the chain when the
    message refers back: "just now", "last time", 刚才, 上次…), 3 the user's facts and recalled memories
    (for a recap question, "What did we talk about?", 我们聊过什么: the chat's recent memories, oldest
    first); ``rendered`` is the prompt block.

    The user's facts and memories are those said in ``chat_id`` (everyone in it may read the
    answer), unless ``private``: ``chat_id`` is a direct chat with the bot, and they come from every
    chat of the user's. An implementation that does not take ``private`` must answer as for
    ``False``.

    firstresult: the first non-``None`` answer wins (the graph plugin answers).
    """


# --- forgetting ------------------------------------------------------------------------


@hookspec
def narrmem_after_delete(memory: MemoryView, tenant: str, removed: list[MemoryRecord]) -> None:
    """Memories were deleted by id (``Memory.forget_memories``, as the ``soul_narrative`` tool's
    ``forget`` of a scene does), not as a forget of their messages or scope: the messages they
    came from, and what else was made of them, stay. A plugin that keeps anything keyed by these
    memories' ids, or copied from their text, drops it here. Called once the store has deleted
    them; a plugin that raises is reported (``narrmem_plugin_error``) and the others still run
    (the deletion stands, and is not tried again: keep nothing a failed call would leave).
    """


@hookspec
def narrmem_forgotten_elsewhere(
    memory: MemoryView, tenant: str | None, user_id: str | None, chat_id: str | None
) -> None:
    """Another process sharing the store (a worker of the same PostgreSQL) forgot a user, a chat,
    or messages or memories of a chat (``chat_id``): drop what this process keeps in RAM of that
    scope (cached texts, summaries, label vectors). The store holds none of it any more, and
    ``narrmem_after_forget`` (``narrmem_after_delete``, for memories deleted by id) ran in the
    process that forgot. ``tenant`` ``None``: notices may have been missed (the connection that
    listens was lost), so drop every cache.

    Told a moment after the forget, as the store carries it (``narrmem.store.Broadcasts``), and
    not at all on a store that does not: a plugin never answers from a cache unchecked against
    the store, and this only ends what a cache would keep until evicted. Called in a task of its
    own for each notice (two may run at once); a plugin that raises is reported and the others are
    still told.
    """


@hookspec
def narrmem_after_forget(
    memory: MemoryView,
    tenant: str,
    user_id: str | None,
    chat_id: str | None,
    removed: list[MemoryRecord],
    sources: dict[str, list[str]],
    messages: list[str] | None,
    resumed: bool,
    said_by: str | None,
) -> None:
    """A forget deleted memories: everything of a user and/or chat (``user_id``/``chat_id``;
    ``messages`` is ``None``), or only what the messages ``messages`` of ``chat_id`` left (a
    deleted or edited message; ``user_id`` is ``None``, and the rest of the chat stays).
    A plugin that copied any of their content elsewhere (a summary, another memory's keyword
    context, a counter, a graph) must scrub it here: forgetting a user removes every trace.

    ``sources`` are the message ids the forgotten memories came from, by chat id. ``removed`` are
    the records deleted in this call; it is empty when a forget interrupted by a crash is finished
    on the next open (the records went before the crash), so find copies by scope and ``sources``,
    not by ``removed`` alone. ``resumed``: the forget is finished after a crash or tried again
    (``removed`` may then be empty though memories went); a live forget with ``removed`` empty
    deleted nothing (an edit of a message that made no memory). ``said_by``: of a forget of
    messages, the person who said them when the forget knows it and ``removed`` may not say it
    (a retention pass's forget of a person, finished after they spoke again, is told as a forget
    of their old messages chat by chat: copies of those messages go, and what the person said
    since stays); ``None`` otherwise.

    Implementations must be idempotent (a finished step may run again after a crash) and must
    raise rather than give up: the forget is reported done, and its job deleted, only once every
    implementation has returned. A user's or chat's forget run from hooks or a trigger callback
    calls it twice: at once, and when the messages under way have ended and it is finished (see
    ``Memory.forget``), ``sources`` then naming what the scope wrote meanwhile too.

    State a plugin keeps per user (``Store.state_put``) goes with ``Store.state_delete``, which
    deletes every key that *starts with* the one given: key it so that no user's key begins
    another's, each id ended by a NUL, which no id holds (``f"{tenant}\\0{user_id}\\0"``), or
    forgetting ``ann`` also deletes ``anna``'s.
    """


# --- export and import -------------------------------------------------------------------


@hookspec
def narrmem_export_records(
    memory: MemoryView,
) -> dict[str, list[dict[str, Any]] | AsyncIterable[dict[str, Any]]] | None:
    """This plugin's part of a full export (``narrmem export``): ``{section: records}``, where
    ``records`` is a list, or an async iterable that reads them as the export writes them (a page
    at a time: a plugin holding millions of rows is exported without holding them in memory).
    Sections are written, and iterated, in the order of the dict: one whose records name another's
    comes first, so that the records it names are all there when the other is read.

    * Section names start with the plugin's name and a dot (``graph.nodes``); the store's own data
      (memories with their vectors, importance history, plugin state) is exported by narrmem itself.
    * A record is a JSON object of plain JSON values (bytes as base64 text) with no key named
      ``section``, and the records of a section come in a stable order (by id, say): exporting a
      store, importing the file into a fresh store and exporting that must give the same file.
    * Everything the plugin keeps goes in, ids included, so that an import restores it as it was;
      what the plugin can derive again (caches, indexes) may stay out.
    * Reading only: the memory may be open read-only, and an export never changes it.

    Return ``None`` when the plugin has nothing to export (idle on this store, say). Errors are not
    isolated: a plugin that cannot export fails the export rather than leave a file that lacks it.
    :mod:`narrmem.table_transfer` exports a table of the store's database in this shape.
    """


@hookspec
def narrmem_person_records(
    memory: MemoryView, tenant: str, user_id: str
) -> dict[str, list[dict[str, Any]] | AsyncIterable[dict[str, Any]]] | None:
    """This plugin's records of one person, for their own export (what narrmem holds of them:
    :mod:`narrmem.doors.person_export`, ``narrmem export --user``): ``{section: records}`` as
    :func:`narrmem_export_records` gives them, of the person only, read by queries on the person
    (never a whole table filtered here).

    * Everything the plugin keeps that a forget of the person (:func:`narrmem_after_forget` with
      ``user_id``) deletes or changes is in it: the person's facts, summaries, counters, copies of
      their words kept elsewhere. State under the person's key (``f"{tenant}\\0{user_id}\\0"``)
      is exported by narrmem itself.
    * Reading only: the memory may be open read-only, and nothing changes.

    Return ``None`` when the plugin holds nothing of anyone (idle on this store, say).
    """


@hookspec
def narrmem_people_held(
    memory: MemoryView,
    tenant: str | None,
    user_id: str | None,
    after: str | None,
    through: str | None,
    limit: int | None,
) -> list[tuple[str, str, datetime]] | None:
    """Every person this plugin keeps something of, as ``(tenant, user_id, last)``: ``last`` the
    latest time it wrote of them (a fact stated, a tree built; aware), of ``tenant`` (every tenant
    when ``None``), of ``user_id`` alone when given, of the user ids after ``after`` and up to
    ``through`` when given (each ``None``: unbounded; a page of the users list asks its own
    range), the first ``limit`` of them in (tenant, user id) order when given, read by a query
    over the plugin's own rows (an aggregate where it can). Those outside the range or past the
    limit may be answered too: the caller keeps its own. Retention
    (``Memory.forget_inactive``) forgets, besides the people whose every memory is old, those who
    have no memory at all and nothing here newer than its time (a bot that writes what it learns
    with tools alone, ``memory_commit`` over MCP, had no one found), and keeps anyone written of
    here since (asked again, for the one person, inside their forget's turn). The users list
    (``Memory.users``, ``GET /v1/users``) shows those of no memory in their place. Reading only.
    """


@hookspec
def narrmem_import_records(
    memory: MemoryView, sections: Mapping[str, Sequence[dict[str, Any]]], dry_run: bool, vectors_of: str
) -> dict[str, int] | None:
    """Take this plugin's sections of a file being imported (``narrmem import``).

    ``sections`` holds every plugin section of the file (``{section: records}``, each record
    without its ``section`` key). ``records`` is a sequence that may read its records from the
    file when they are asked for (a section of millions of rows): iterate it, or take slices of
    it, rather than copy it whole; each record is read anew each time, so a change made to one
    is not kept (change a copy). An implementation takes those it exported and returns
    ``{section: records imported}`` for each of them (``None`` if none is its own). The host calls
    every implementation twice:

    1. ``dry_run=True`` before anything of the file is written: check every record and raise
       :class:`~narrmem.errors.InputError` naming the section, the record's index and the field
       (``graph.edges[3].status``), and any conflict with what is stored. Write nothing.
    2. ``dry_run=False``, after the memories are written: write the records in one transaction,
       keeping their ids. A record already stored with identical content is skipped (importing a
       file twice changes nothing); one stored with other content is a conflict.

    ``vectors_of``: the name of the model the sections' vectors (if a plugin keeps any) were made
    with. It is ``memory.embedder.name`` but for ``narrmem migrate --reembed``, which moves a store
    to another model: a plugin then drops or remakes the vectors it exported rather than mix two
    models' vectors.

    A section no loaded plugin takes is an error naming it, so an import never drops data silently.
    Errors are not isolated. :mod:`narrmem.table_transfer` checks and writes a table's records.
    """


@hookspec
def narrmem_check_state(memory: MemoryView, namespace: str, key: str, value: dict[str, Any]) -> bool | None:
    """Check one entry of plugin state (``Store.state_put``) from a file being imported, before
    anything of the file is written.

    For a ``namespace`` this plugin writes, raise :class:`~narrmem.errors.InputError` naming the
    field (``key``, ``value.count``) when the entry is not as the plugin writes it, and return
    ``True`` when it is; return ``None`` for a namespace not its own. The plugin reads such entries
    back in its hooks (a forget's, an open's): one it could not read would fail each of them, so
    it is refused here, with the line, and nothing of the file is written. An entry of a namespace
    no plugin claims is imported as it is. Reading only; errors are not isolated.
    """


# --- errors -----------------------------------------------------------------------------


@hookspec
def narrmem_plugin_error(memory: MemoryView, plugin_name: str, hook_name: str, error: BaseException) -> None:
    """A plugin raised inside ``hook_name``. Errors raised here are only logged."""
