"""The graph's tools for ``Memory.call_tool``: handlers over :mod:`.schemas`, and their registration.

Every handler validates beyond the schema where a rule spans fields (InputError naming the field),
does its reads and writes inside one store transaction (all or nothing), and filters by the caller's
scope in every statement.
"""

from __future__ import annotations

from typing import Protocol

from narrmem_plugins.graph.backend import GraphBackend
from narrmem_plugins.graph.edges import EdgeQuery, select_edges
from narrmem_plugins.graph.options import GraphOptions
from narrmem_plugins.graph.persona import chat_personas, persona_for, set_persona
from narrmem_plugins.graph.purge import purge
from narrmem_plugins.graph.recall import RecallParams, recall_graph
from narrmem_plugins.graph.render import persona_text, recall_text
from narrmem_plugins.graph.rewrite import rewrite
from narrmem_plugins.graph.schema import marks
from narrmem_plugins.graph.schemas import (
    CommitInput,
    CommitOutput,
    FactsInput,
    FactsOutput,
    NodeOut,
    PersonaGetInput,
    PersonaGetOutput,
    PersonaOut,
    PersonaSetInput,
    PersonaSetOutput,
    PurgeInput,
    PurgeOutput,
    RecallInput,
    RecallOutput,
    RewriteInput,
    RewriteOutput,
    ScopeArgs,
    TaskChainOut,
    TaskChainsInput,
    TaskChainsOutput,
    TaskCreateInput,
    TaskCreateOutput,
    TaskOut,
    TaskQueryInput,
    TaskQueryOutput,
    TaskSetStateInput,
    TaskSetStateOutput,
    TripletIn,
    split_keywords,
    triplet_out,
)
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.tasks import create_task, linked_task_count, load_tasks, newest_tasks, set_state
from narrmem_plugins.graph.vocabulary import STRUCTURAL
from narrmem_plugins.graph.writer import TripletDraft, write_triplet

from narrmem.errors import InputError
from narrmem.tools import ToolSpec
from narrmem.view import MemoryView


class GraphContext(Protocol):
    options: GraphOptions

    def backend(self) -> GraphBackend: ...


def _scope(args: ScopeArgs) -> GraphScope:
    return GraphScope(args.tenant, args.user_id, args.chat_id)


def _draft(triplet: TripletIn, speculative: bool, field: str) -> TripletDraft:
    if triplet.relation in STRUCTURAL:
        raise InputError(
            f"{triplet.relation} is kept by the task and persona tools (task_create, task_set_state, "
            "persona_set); commit facts with other relations",
            field=f"{field}.relation",
        )
    return TripletDraft(
        triplet.subject,
        triplet.relation,
        triplet.object,
        triplet.subject_type,
        triplet.object_type,
        triplet.confidence,
        speculative,
    )


async def commit(ctx: GraphContext, memory: MemoryView, args: CommitInput) -> CommitOutput:
    drafts = [_draft(t, args.speculative, f"triplets.{i}") for i, t in enumerate(args.triplets)]
    graph = ctx.backend()
    scope, at = _scope(args), graph.now()
    async with graph.transaction() as db:
        outcomes = [
            await write_triplet(
                db,
                scope,
                draft,
                source="tool",
                provenance=["tool"],
                at=at,
                actor="memory_commit",
                field_prefix=f"triplets.{i}.",
                functional=ctx.options.functional,
            )
            for i, draft in enumerate(drafts)
        ]
    return CommitOutput(
        triplets=[triplet_out(o.edge) for o in outcomes],
        created=sum(o.created for o in outcomes),
        confirmed=sum(not o.created for o in outcomes),
        superseded=[triplet_out(old) for o in outcomes for old in o.superseded],
    )


async def purge_tool(ctx: GraphContext, memory: MemoryView, args: PurgeInput) -> PurgeOutput:
    new = _draft(args.new_triplet, False, "new_triplet") if args.new_triplet is not None else None
    graph = ctx.backend()
    async with graph.transaction() as db:
        result = await purge(
            db,
            _scope(args),
            args.filters.given(),
            mode=args.mode,
            new_triplet=new,
            dry_run=args.dry_run,
            max_affected=args.max_affected,
            at=graph.now(),
            whole_tasks=args.whole_tasks,
            functional=ctx.options.functional,
        )
    return PurgeOutput(
        mode=args.mode,
        dry_run=args.dry_run,
        matched=len(result.matched),
        triplets=[triplet_out(e) for e in result.matched],
        new_triplet=triplet_out(result.written.edge) if result.written else None,
        purge_id=result.purge_id,
        tasks=result.tasks,
        refused=result.refused,
    )


async def recall(ctx: GraphContext, memory: MemoryView, args: RecallInput) -> RecallOutput:
    graph = ctx.backend()
    window = args.time_range
    params = RecallParams(
        keywords=split_keywords(args.query_intent),
        depth=args.depth,
        since=window.from_ if window else None,
        until=window.to if window else None,
        include_speculative=args.include_speculative,
        limit=args.limit,
        seed_similarity=ctx.options.seed_similarity,
        seed_limit=ctx.options.seed_limit,
        functional=ctx.options.functional,
    )
    view = await recall_graph(memory, graph, _scope(args), params)
    nodes = sorted(view.nodes.items(), key=lambda item: (view.distance[item[0]], item[1].name.lower()))
    return RecallOutput(
        keywords=view.keywords,
        seeds=view.seeds,
        nodes=[
            NodeOut(
                name=node.name,
                type=node.type,
                distance=view.distance[key],
                description=node.props.get("description") if node.props else None,
            )
            for key, node in nodes
        ],
        edges=[triplet_out(e) for e in view.edges],
        past=[triplet_out(e) for e in view.past],
        rendered=recall_text(view),
        truncated=view.truncated,
    )


# The tasks' and the persona's own links (shown by task_chains and persona_get), not facts: by
# their relation, or by their subject, a persona's node (a "has_trait" of the user is a fact).
NOT_FACTS = sorted(STRUCTURAL)


async def facts_tool(ctx: GraphContext, memory: MemoryView, args: FactsInput) -> FactsOutput:
    """Every active fact of the scope, newest first, paged: what memory_recall walks to from the
    words asked, here whole (an inspector showed those within three hops of "user" alone, and
    called the list whole)."""
    q = EdgeQuery().where("e.status = 'active'")
    q.where(f"e.relation NOT IN ({marks(NOT_FACTS)})", *NOT_FACTS).where("s.type <> 'PersonaNode'")
    if args.before_id is not None:
        q.where("e.id < ?", args.before_id)
    if not args.include_speculative:
        q.where("e.speculative = 0")
    async with ctx.backend().read() as db:
        edges = await select_edges(db, _scope(args), q, order="e.id DESC", limit=args.limit + 1)
    return FactsOutput(facts=[triplet_out(e) for e in edges[: args.limit]], more=len(edges) > args.limit)


async def task_create_tool(ctx: GraphContext, memory: MemoryView, args: TaskCreateInput) -> TaskCreateOutput:
    graph = ctx.backend()
    async with graph.transaction() as db:
        task, previous = await create_task(
            db, _scope(args), args.task_id, args.description, args.info_nodes, graph.now()
        )
    return TaskCreateOutput(task=TaskOut(**task.as_dict()), previous_task=previous)


async def task_set_state_tool(
    ctx: GraphContext, memory: MemoryView, args: TaskSetStateInput
) -> TaskSetStateOutput:
    graph = ctx.backend()
    async with graph.transaction() as db:
        task, previous, changed = await set_state(db, _scope(args), args.task_id, args.state, graph.now())
    return TaskSetStateOutput(task=TaskOut(**task.as_dict()), previous_state=previous, changed=changed)


async def task_query_tool(ctx: GraphContext, memory: MemoryView, args: TaskQueryInput) -> TaskQueryOutput:
    async with ctx.backend().read() as db:
        tasks = await load_tasks(db, _scope(args), state=args.state, limit=args.limit)
    return TaskQueryOutput(tasks=[TaskOut(**t.as_dict()) for t in tasks])


async def task_chains_tool(ctx: GraphContext, memory: MemoryView, args: TaskChainsInput) -> TaskChainsOutput:
    scope = _scope(args)
    chains: list[TaskChainOut] = []
    async with ctx.backend().read() as db:
        # A chat's chain is found from its task nodes, not from the user's facts or memories: a
        # task may be all the user has in a chat.
        where, params = scope.clause()
        rows = await db.fetchall(
            f"SELECT DISTINCT chat_id FROM graph_nodes WHERE {where} AND type = 'TaskNode'", params
        )
        for chat in sorted(str(r[0]) for r in rows):
            # The newest of each chain, and its length, not the chain read whole.
            chain = GraphScope(scope.tenant, scope.user_id, chat)
            tasks = await newest_tasks(db, chain, limit=args.limit)
            if tasks:
                out = [TaskOut(**t.as_dict()) for t in tasks]
                chains.append(TaskChainOut(chat_id=chat, tasks=out, total=await linked_task_count(db, chain)))
    chains.sort(key=lambda c: c.tasks[0].created_at, reverse=True)
    return TaskChainsOutput(chains=chains)


async def persona_set_tool(ctx: GraphContext, memory: MemoryView, args: PersonaSetInput) -> PersonaSetOutput:
    graph = ctx.backend()
    async with graph.transaction() as db:
        current, old, superseded = await set_persona(
            db, _scope(args), args.description, args.traits, args.tone, graph.now()
        )
    return PersonaSetOutput(
        persona=PersonaOut(**current.as_dict()),
        replaced=PersonaOut(**old.as_dict()) if old else None,
        superseded_edges=superseded,
    )


async def persona_get_tool(ctx: GraphContext, memory: MemoryView, args: PersonaGetInput) -> PersonaGetOutput:
    async with ctx.backend().read() as db:
        found = await persona_for(db, _scope(args))
        chats = [] if args.chat_id is not None else await chat_personas(db, _scope(args))
    return PersonaGetOutput(
        persona=PersonaOut(**found.as_dict()) if found else None,
        rendered=persona_text(found),
        chats=[PersonaOut(**persona.as_dict()) for persona in chats],
    )


async def context_rewrite_tool(ctx: GraphContext, memory: MemoryView, args: RewriteInput) -> RewriteOutput:
    messages, turn = rewrite(args.messages, args.summary)
    return RewriteOutput(
        messages=messages,
        tool_calls=len(turn.calls),
        tools=sorted({name for _, name in turn.calls}),
        replaced=turn.replaced,
    )


SCOPE_NOTE = (
    " Takes user_id (whose graph), chat_id (reads: only that chat, default all of the user's chats; "
    "writes: that chat, default '_direct') and tenant."
)


TOOLS: list[ToolSpec[GraphContext]] = [
    ToolSpec(
        name="memory_commit",
        description=(
            "Write facts to the memory graph as triplets {subject, relation, object, subject_type?, "
            "object_type?, confidence?}. 'user' is the user. Relations are lower_snake (likes, works_on, "
            "plans, located_at) or RELATES_TO. Set speculative=true for anything inferred rather than "
            "said. Writing a triplet again confirms it (count + 1); a contradicting one (dislikes after "
            "likes) supersedes the old." + SCOPE_NOTE
        ),
        input_model=CommitInput,
        output_model=CommitOutput,
        handler=commit,
    ),
    ToolSpec(
        name="memory_purge",
        description=(
            "Delete or correct triplets. filters: subject, relation, object (exact) or subject_contains, "
            "relation_contains, object_contains (substring), speculative; all must hold; at least one. "
            "mode: soft (mark deleted), hard (erase), supersede (mark superseded by new_triplet). "
            "dry_run shows what would be affected. A purge that would leave a task without its state "
            "is refused unless whole_tasks=true, which purges those tasks whole." + SCOPE_NOTE
        ),
        input_model=PurgeInput,
        output_model=PurgeOutput,
        handler=purge_tool,
    ),
    ToolSpec(
        name="memory_recall",
        description=(
            "Read the memory graph: query_intent is comma-separated keywords ('persona,tone' or "
            "'TaskNode,working_memory'); nodes matching them by name, type or meaning are walked "
            "depth hops (1-5) along active triplets; time_range {from, to} keeps triplets stated then. "
            "Returns nodes, edges and a rendered text block." + SCOPE_NOTE
        ),
        input_model=RecallInput,
        output_model=RecallOutput,
        handler=recall,
    ),
    ToolSpec(
        name="memory_facts",
        description=(
            "Every active fact (triplet) of the memory graph, newest first: at most limit, and more "
            "says older ones follow (before_id: the last id given). The persona's and the tasks' own "
            "links are left out (persona_get, task_chains). Reads only." + SCOPE_NOTE
        ),
        input_model=FactsInput,
        output_model=FactsOutput,
        handler=facts_tool,
    ),
    ToolSpec(
        name="task_create",
        description=(
            "Record this turn's task in the chat's working memory chain: task_id (unique in the chat, "
            "ignoring case), "
            "description, info_nodes (names of nodes it is about). It follows the chat's previous task "
            "(NEXT_TASK) and starts in_progress. Needs user_id and chat_id."
        ),
        input_model=TaskCreateInput,
        output_model=TaskCreateOutput,
        handler=task_create_tool,
    ),
    ToolSpec(
        name="task_set_state",
        description=(
            "Set exactly one task's state (in_progress, paused, done, cancelled) by its task_id "
            "(case-insensitive: Task_A and task_a are one task; otherwise exact). "
            "Needs user_id and chat_id."
        ),
        input_model=TaskSetStateInput,
        output_model=TaskSetStateOutput,
        handler=task_set_state_tool,
    ),
    ToolSpec(
        name="task_query",
        description=(
            "The chat's working memory chain, newest first: task_id, description, state, created_at, "
            "info_nodes; filter by state, at most limit. Needs user_id and chat_id."
        ),
        input_model=TaskQueryInput,
        output_model=TaskQueryOutput,
        handler=task_query_tool,
    ),
    ToolSpec(
        name="task_chains",
        description=(
            "Every chat's working memory chain of the user (or of chat_id only), newest task first: "
            "chat_id, its tasks (as task_query gives them, at most limit) and total. Reads only." + SCOPE_NOTE
        ),
        input_model=TaskChainsInput,
        output_model=TaskChainsOutput,
        handler=task_chains_tool,
    ),
    ToolSpec(
        name="persona_set",
        description=(
            "Set the bot's persona: description, traits, tone. Replaces the previous persona (kept as "
            "history) and touches nothing else. Without chat_id it is the user's default persona."
            + SCOPE_NOTE
        ),
        input_model=PersonaSetInput,
        output_model=PersonaSetOutput,
        handler=persona_set_tool,
    ),
    ToolSpec(
        name="persona_get",
        description="The current persona: the chat's own, else the user's default." + SCOPE_NOTE,
        input_model=PersonaGetInput,
        output_model=PersonaGetOutput,
        handler=persona_get_tool,
    ),
    ToolSpec(
        name="context_rewrite",
        description=(
            "Compress this turn's tool-call messages (OpenAI format: user, assistant with tool_calls, "
            "tool with tool_call_id) into [user message, summary]. The summary must name every tool "
            "called and say how many calls it summarizes as a number, or it is refused."
        ),
        input_model=RewriteInput,
        output_model=RewriteOutput,
        handler=context_rewrite_tool,
    ),
]
