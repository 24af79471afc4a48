"""Whose graph a call sees. Every graph belongs to one user of one tenant; each row also records
the chat it was written in.

Reads with a ``chat_id`` see that chat only; reads without one see all of the user's chats (as
narrmem's own scopes do). Writes without a ``chat_id`` go to the chat ``_direct``. Nothing ever
crosses users or tenants: every statement carries the scope in its WHERE clause.
"""

from __future__ import annotations

from dataclasses import dataclass

from narrmem_plugins.graph.vocabulary import DIRECT_CHAT


@dataclass(frozen=True)
class GraphScope:
    tenant: str
    user_id: str
    chat_id: str | None = None

    @property
    def write_chat(self) -> str:
        return self.chat_id or DIRECT_CHAT

    def writing(self) -> GraphScope:
        """This scope narrowed to the chat a write goes to."""
        return GraphScope(self.tenant, self.user_id, self.write_chat)

    def user_wide(self) -> GraphScope:
        return GraphScope(self.tenant, self.user_id, None)

    def clause(self, alias: str = "") -> tuple[str, tuple[str, ...]]:
        """``tenant = ? AND user_id = ? [AND chat_id = ?]`` for table ``alias``, with its parameters."""
        prefix = f"{alias}." if alias else ""
        sql = f"{prefix}tenant = ? AND {prefix}user_id = ?"
        if self.chat_id is None:
            return sql, (self.tenant, self.user_id)
        return f"{sql} AND {prefix}chat_id = ?", (self.tenant, self.user_id, self.chat_id)
