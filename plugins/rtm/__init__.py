"""RTM narrative trees (Random Tree Model of narrative memory): encode a text as a tree of clause
spans and recall it at any depth of abstraction.

* :mod:`.segment` cuts text into clauses (pysbd sentences, then clause rules; English, Chinese).
* :mod:`.tree` and :mod:`.partition` shape the tree (``semantic`` or the paper's ``random`` model).
* :mod:`.summarize` writes node summaries (extractive, or a pluggable / hooked summarizer).
* :mod:`.traverse` reads it: recall sequences, statistics, optimal depth, token budgets.
* :mod:`.ensemble` and :mod:`.theory` model population variance and its exact expectation.
* :mod:`.store` keeps trees in the plugin's ``rtm_trees`` table (each with whose words it holds,
  gone with their forget, the newest ``trees_kept`` kept); :mod:`.tools` exposes four tools.
* :mod:`.user` retells one user's memories (``user_summary``).

Options live in ``[plugin.rtm]`` (:class:`~narrmem_plugins.rtm.options.RTMOptions`).
"""

from __future__ import annotations

from typing import Any

from narrmem_plugins.rtm.build import TreeRequest, build_tree, get_or_build
from narrmem_plugins.rtm.options import RTMOptions
from narrmem_plugins.rtm.segment import segment
from narrmem_plugins.rtm.store import MemoryTreeStore, TreeStore, open_tree_store
from narrmem_plugins.rtm.summarize import Summarizer
from narrmem_plugins.rtm.theory import expected_recall_lengths, suggest_parameters
from narrmem_plugins.rtm.tools import TOOLS
from narrmem_plugins.rtm.transfer import RTMTransfer
from narrmem_plugins.rtm.traverse import depth_for_budget, find_optimal_depth, recall_lengths, retelling
from narrmem_plugins.rtm.tree import Tree
from narrmem_plugins.rtm.user import UserSummaries

from narrmem import hookimpl
from narrmem.configured import Configured
from narrmem.models import MemoryRecord
from narrmem.tools import ToolTable
from narrmem.view import MemoryView

NAME = "rtm"

__all__ = [
    "RTMOptions",
    "RTMPlugin",
    "Summarizer",
    "Tree",
    "TreeRequest",
    "build_tree",
    "depth_for_budget",
    "expected_recall_lengths",
    "find_optimal_depth",
    "get_or_build",
    "plugin_of",
    "recall_lengths",
    "retelling",
    "segment",
    "suggest_parameters",
    "user_summary",
]


class RTMPlugin(Configured[RTMOptions], RTMTransfer, ToolTable, name=NAME, options=RTMOptions):
    """One instance per ``Memory``. ``summarizer(clauses, language)`` (sync or async), if given,
    writes internal-node summaries before the ``narrmem_summarize`` hook and the built-in
    extractive summary are asked."""

    tool_specs = TOOLS

    def __init__(self, summarizer: Summarizer | None = None) -> None:
        super().__init__()
        self.summarizer = summarizer
        # Until startup knows the store, trees live in memory (tools only run on an open memory).
        self.trees: TreeStore = MemoryTreeStore()
        self.users = UserSummaries()

    @hookimpl
    async def narrmem_startup(self, memory: MemoryView) -> None:
        self.trees = open_tree_store(memory, self.options.trees_kept)
        await self.trees.setup()

    @hookimpl
    async def narrmem_user_summary(
        self, memory: MemoryView, tenant: str, user_id: str, depth: int | None, token_budget: int | None
    ) -> dict[str, Any]:
        return await user_summary(
            memory, user_id=user_id, depth=depth, token_budget=token_budget, tenant=tenant
        )

    @hookimpl
    async def narrmem_after_forget(
        self,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        messages: list[str] | None,
        removed: list[MemoryRecord],
        resumed: bool,
        said_by: str | None,
    ) -> None:
        # The tools' trees that may hold the words forgotten, and the cached retellings of the
        # person. A person's or a chat's forget takes any tree that names no one too; a message's
        # (an edit, a delete: every few seconds in a busy chat) only the trees of whose words it
        # deleted, in that chat or across their chats.
        self.users.forget(tenant, user_id)
        if messages is None:
            await self.trees.forget(tenant, user_id, chat_id)
            return
        if not removed and resumed and chat_id is not None:
            # Finished after a crash or tried again, the records gone before it: whose words they
            # were is not known unless told, and every tree that may hold them goes (the chat's,
            # and every person's across their chats). A live one that deleted nothing takes none.
            if said_by is not None:
                await self.trees.forget_owned(tenant, said_by, chat_id)
            else:
                await self.trees.forget_chat(tenant, chat_id)
        for person, chat in sorted({(r.user_id, r.chat_id) for r in removed}):
            await self.trees.forget_owned(tenant, person, chat)

    @hookimpl
    def narrmem_forgotten_elsewhere(
        self, tenant: str | None, user_id: str | None, chat_id: str | None
    ) -> None:
        # Another worker's forget: the retellings cached here of whom it may have touched (of a
        # chat's deleted messages, only those telling that chat: an edit is one, every few seconds),
        # and the trees held parsed (it deleted the rows).
        self.trees.forget_cached(tenant)
        if tenant is None:
            self.users.clear()
        elif user_id is None and chat_id is not None:
            self.users.forget_chat(tenant, chat_id)
        else:
            self.users.forget(tenant, user_id)

    @hookimpl
    async def narrmem_after_delete(self, tenant: str, removed: list[MemoryRecord]) -> None:
        # A retelling cached in this process told the deleted memories (a scene forgotten by id);
        # a tree of their person in their chat may hold their words.
        for user_id in {r.user_id for r in removed if r.user_id is not None}:
            self.users.forget(tenant, user_id)
        for user_id, chat_id in sorted({(r.user_id, r.chat_id) for r in removed}):
            await self.trees.forget_owned(tenant, user_id, chat_id)


def plugin_of(memory: MemoryView) -> RTMPlugin:
    """The :class:`RTMPlugin` registered with ``memory``."""
    return memory.host.plugin(RTMPlugin)


async def user_summary(
    memory: MemoryView,
    *,
    user_id: str,
    depth: int | None = None,
    token_budget: int | None = None,
    tenant: str = "default",
) -> dict[str, Any]:
    """A retelling of ``user_id``'s memories (oldest first) at ``depth`` (1 = one line) or at the
    deepest depth that fits ``token_budget`` estimated tokens; both: the shallower; neither: the
    deepest that fits ``[plugin.rtm] user_token_budget``. Returns the retelling, its depth, the
    tree's depth, the units with the periods they cover, the memory count, and the compression
    (``compressionRatio``: units / memories; ``tokenCompressionRatio``: tokens of the retelling /
    of every memory's line; the same definition as ``rtm_traverse_narrative``'s)."""
    plugin = plugin_of(memory)
    return await plugin.users.summary(
        memory,
        plugin.options,
        plugin.summarizer,
        user_id=user_id,
        depth=depth,
        token_budget=token_budget,
        tenant=tenant,
    )
