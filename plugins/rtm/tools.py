"""The four RTM tools for ``Memory.call_tool``: handlers over :mod:`.schemas` and registration."""

from __future__ import annotations

import asyncio
from typing import Protocol

from narrmem_plugins.rtm.build import TreeRequest, get_or_build, stats_of, text_sha
from narrmem_plugins.rtm.ensemble import simulate, summarize
from narrmem_plugins.rtm.options import RTMOptions
from narrmem_plugins.rtm.schemas import (
    CreateTreeInput,
    CreateTreeOutput,
    EnsembleInput,
    EnsembleOutput,
    FindDepthInput,
    FindDepthOutput,
    RecallUnit,
    ScaleCheck,
    TextOrTree,
    TraverseInput,
    TraverseOutput,
    TreeParameters,
    TreeStats,
)
from narrmem_plugins.rtm.segment import joiner, segment_cached
from narrmem_plugins.rtm.store import StoredTree, TreeStore
from narrmem_plugins.rtm.summarize import Summarizer
from narrmem_plugins.rtm.theory import suggest_parameters
from narrmem_plugins.rtm.traverse import compression, find_optimal_depth, recall_lengths, recall_units

from narrmem.errors import InputError
from narrmem.tools import ToolSpec
from narrmem.view import MemoryView


class RTMContext(Protocol):
    options: RTMOptions
    trees: TreeStore
    summarizer: Summarizer | None


# --- handlers -------------------------------------------------------------------------------


def _tree_request(
    args: CreateTreeInput | TextOrTree, text: str, title: str, type: str = "story"
) -> TreeRequest:
    """What the call asks to build: its tree parameters, renamed from the schema's camelCase."""
    return TreeRequest(
        text=text,
        title=title,
        type=type,
        branching=args.maxBranchingFactor,
        max_depth=args.maxRecallDepth,
        **args.model_dump(
            include={"tenant", "user_id", "chat_id", "partition", "seed", "language", "segmentation"}
        ),
    )


async def _by_id(ctx: RTMContext, args: TextOrTree, tree_id: str) -> StoredTree:
    """The stored tree ``tree_id``; the call may give no tree parameters beside it."""
    given = args.tree_parameters_given()
    if given:
        raise InputError("tree parameters come from the stored tree; drop them or pass text", field=given[0])
    found = await ctx.trees.get(args.tenant, tree_id)
    if found is None:
        raise InputError(f"no tree {tree_id} in tenant '{args.tenant}'", field="treeId")
    if args.title is not None and args.title != found.title:
        raise InputError(f"tree {tree_id} is titled {found.title!r}", field="title")
    for field, asked, owner in (
        ("user_id", args.user_id, found.user_id),
        ("chat_id", args.chat_id, found.chat_id),
    ):
        if asked is not None and asked != owner:
            raise InputError(f"tree {tree_id} is not of {field} {asked!r}", field=field)
    return found


async def _resolve(memory: MemoryView, ctx: RTMContext, args: TextOrTree) -> StoredTree:
    if args.treeId is not None:
        return await _by_id(ctx, args, args.treeId)
    assert args.text is not None and args.title is not None
    request = _tree_request(args, args.text, args.title)
    if not request.pinned:
        # Same text and title, no parameters: whatever tree was built for it last.
        latest = await ctx.trees.latest(
            args.tenant, args.title, text_sha(args.text), args.user_id, args.chat_id
        )
        if latest is not None:
            return latest
    stored, _ = await get_or_build(memory, ctx.trees, request, ctx.options, ctx.summarizer)
    return stored


async def create(ctx: RTMContext, memory: MemoryView, args: CreateTreeInput) -> CreateTreeOutput:
    request = _tree_request(args, args.text, args.title, args.type)
    stored, created = await get_or_build(memory, ctx.trees, request, ctx.options, ctx.summarizer)
    stats = stats_of(stored.tree)
    p = stored.params
    return CreateTreeOutput(
        treeId=stored.tree_id,
        title=stored.title,
        created=created,
        parameters=TreeParameters(
            maxBranchingFactor=p["maxBranchingFactor"],
            maxRecallDepth=p["maxRecallDepth"],
            depthSuggested=p["depthSuggested"],
            partition=p["partition"],
            seed=p["seed"],
            language=p["detectedLanguage"],
            segmentation=p["segmentationUsed"],
            summarizer=p["summarizer"],
            type=p["type"],
        ),
        stats=TreeStats(**{k: stats[k] for k in TreeStats.model_fields}),
        compressionRatio=stats["compressionRatio"],
        scale=ScaleCheck(**stats["scale"]),
    )


async def traverse(ctx: RTMContext, memory: MemoryView, args: TraverseInput) -> TraverseOutput:
    stored = await _resolve(memory, ctx, args)
    tree, shape = stored.tree, stored.tree.shape
    units = recall_units(shape, args.traversalDepth).tolist()
    leaf = shape.is_leaf
    leaf_count = int(leaf.sum())
    texts = [tree.summaries[i] for i in units]
    return TraverseOutput(
        treeId=stored.tree_id,
        traversalDepth=args.traversalDepth,
        summaries=texts,
        recallSequence=list(texts),
        units=[
            RecallUnit(
                node=i,
                depth=int(shape.depth[i]),
                clauseStart=int(shape.start[i]),
                clauseEnd=int(shape.end[i]),
                leaf=bool(leaf[i]),
            )
            for i in units
        ],
        retelling=joiner(tree.language).join(texts),
        recallLength=len(units),
        leafCount=leaf_count,
        clauseCount=len(tree.clauses),
        clausesPerUnit=round(len(tree.clauses) / len(units), 6),
        **compression(tree, args.traversalDepth),
    )


async def find_depth(ctx: RTMContext, memory: MemoryView, args: FindDepthInput) -> FindDepthOutput:
    stored = await _resolve(memory, ctx, args)
    lengths = recall_lengths(stored.tree.shape)
    found = find_optimal_depth(lengths, int(stored.params["maxBranchingFactor"]), args.targetRecallLength)
    return FindDepthOutput(treeId=stored.tree_id, targetRecallLength=args.targetRecallLength, **found)


async def generate_ensemble(ctx: RTMContext, memory: MemoryView, args: EnsembleInput) -> EnsembleOutput:
    if args.partition is not None:
        raise InputError("every tree of an ensemble is random; drop partition", field="partition")
    stored = await _stored_for_ensemble(ctx, args)
    if stored is not None:
        clauses = len(stored.tree.clauses)
        k, depth = int(stored.params["maxBranchingFactor"]), int(stored.params["maxRecallDepth"])
        source, title = "tree", stored.title
    else:
        assert args.text is not None and args.title is not None
        # Seconds of work for a long text: off the event loop, which other users' calls share.
        sections = await asyncio.to_thread(segment_cached, args.text, args.language, args.segmentation)
        clauses = len(sections.clauses)
        if clauses == 0:
            raise InputError("the text holds no clause (no letter or digit)", field="text")
        if clauses > ctx.options.max_clauses:
            raise InputError(
                f"the text has {clauses} clauses; at most {ctx.options.max_clauses}", field="text"
            )
        k = args.maxBranchingFactor or ctx.options.branching
        depth = args.maxRecallDepth or suggest_parameters(clauses, 1 / k)[1]
        given = args.maxBranchingFactor is not None or args.maxRecallDepth is not None
        source, title = ("request" if given else "defaults"), args.title
    seed = 0 if args.seed is None else args.seed
    sim = await asyncio.to_thread(simulate, clauses, k, depth, args.ensembleSize, seed)
    figures = await asyncio.to_thread(summarize, sim, clauses, k, depth)
    return EnsembleOutput(
        title=title,
        trees=[stored.tree_id] if stored is not None else [],
        parameterSource=source,
        leafCount=clauses,
        ensembleSize=args.ensembleSize,
        maxBranchingFactor=k,
        maxRecallDepth=depth,
        seed=seed,
        **figures,
    )


async def _stored_for_ensemble(ctx: RTMContext, args: EnsembleInput) -> StoredTree | None:
    """The tree ``treeId`` names (no tree parameters beside it), or, for a text given without K, D,
    language or segmentation, the tree last built for it; ``None`` when the request's parameters or
    the defaults apply."""
    if args.treeId is not None:
        return await _by_id(ctx, args, args.treeId)
    if args.tree_parameters_given():
        return None  # the request decides K, D or how the text is cut
    assert args.text is not None and args.title is not None
    return await ctx.trees.latest(args.tenant, args.title, text_sha(args.text), args.user_id, args.chat_id)


TOOLS: list[ToolSpec[RTMContext]] = [
    ToolSpec(
        name="rtm_create_narrative_tree",
        description=(
            "Encode a narrative as a Random Tree Model tree: clauses are leaves, every node of at "
            "most maxBranchingFactor (K) children summarises its span, the root (depth 1) the whole "
            "text, down to maxRecallDepth (D). partition 'semantic' (default) cuts at topic shifts, "
            "'random' draws the paper's uniform compositions (seeded). Returns a treeId reused by the "
            "other tools, node statistics and the compression ratio at each depth. Same inputs, "
            "same treeId: a repeated call reuses the stored tree."
        ),
        input_model=CreateTreeInput,
        output_model=CreateTreeOutput,
        handler=create,
    ),
    ToolSpec(
        name="rtm_traverse_narrative",
        description=(
            "Recall a narrative at a depth: the summaries of the nodes at traversalDepth (and of "
            "leaves above it) in story order, joined as a retelling. Depth 1 is a one-line abstract; "
            "deeper is more detailed. Give treeId, or text and title (the tree built for them is "
            "reused, or built with default parameters)."
        ),
        input_model=TraverseInput,
        output_model=TraverseOutput,
        handler=traverse,
    ),
    ToolSpec(
        name="rtm_generate_ensemble",
        description=(
            "Model population-level recall: ensembleSize random trees of the same text (seeded). "
            "Give treeId (a stored tree: its clauses, K and D are used) or text and title (the tree "
            "last built for them is used when no K or D is given; trees lists the ones used). "
            "Per depth: mean, standard deviation and standard error of the recall length and the "
            "compression ratio, the exact theoretical expectation and the z-score against it; node "
            "statistics and a scale check."
        ),
        input_model=EnsembleInput,
        output_model=EnsembleOutput,
        handler=generate_ensemble,
    ),
    ToolSpec(
        name="rtm_find_optimal_depth",
        description=(
            "Find the traversal depth whose recall length is closest to targetRecallLength "
            "(estimated as 2 + log_K(target / root branches), then refined by adjacent depths). "
            "Returns optimalDepth, actualRecallLength and accuracy = 1 - |actual - target| / target."
        ),
        input_model=FindDepthInput,
        output_model=FindDepthOutput,
        handler=find_depth,
    ),
]
