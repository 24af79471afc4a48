"""Plugin state from a file being imported, checked before anything of the file is written.

narrmem's own namespaces are checked by the modules that write them; a plugin's by its
``narrmem_check_state`` hook. An entry that its writer could not read back would fail each of
its reads later (a forget's, an open's), so it is refused with its line instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from narrmem import edit_marks, forget_marks, inbox, owed_forgets, settling
from narrmem.errors import InputError
from narrmem.forgetting import AGAIN_NAMESPACE, PURGE_OWED, SILENT_NAMESPACE
from narrmem.store import STORE_NOTES

if TYPE_CHECKING:
    from narrmem.memory import Memory

CORE: dict[str, Callable[[str, dict[str, Any]], None]] = {
    settling.NAMESPACE: settling.check_entry,
    inbox.NAMESPACE: inbox.check_entry,
    edit_marks.NAMESPACE: edit_marks.check_entry,
}
# A forget's own bookkeeping, about a forget job of the store it was written in (jobs are not
# exported): in another store it would name what that store's job of the same number deletes.
# The forgets owed to absent plugins likewise, and they hold the ids of forgotten people: a
# backup would carry them out of the store. The marks forgets leave, too: keyed hashes of the
# forgotten, under the key of the store they were made in.
# And a store's notes of its own tables (a plugin's schema version): the target's are its own.
NOT_IMPORTED = frozenset(
    {
        AGAIN_NAMESPACE,
        SILENT_NAMESPACE,
        owed_forgets.NAMESPACE,
        forget_marks.NAMESPACE,
        PURGE_OWED[0],
        STORE_NOTES,
    }
)


async def check_state(memory: Memory, namespace: str, key: str, value: dict[str, Any]) -> None:
    """Raise :class:`InputError` (field ``key`` or ``value.…``) for an entry not as its writer
    writes it."""
    if namespace in NOT_IMPORTED:
        raise InputError(f"{namespace!r} is a store's own record and is not imported", field="namespace")
    check = CORE.get(namespace)
    if check is not None:
        check(key, value)
        return
    await memory.host.call(
        "narrmem_check_state", isolate=False, memory=memory, namespace=namespace, key=key, value=value
    )
