"""The marks of edits under way (narrmem.edit_marks): put and deleted as an edit runs, left
nowhere once it ends; a stopped process's marks deleted by the next open, and its edits left
between their two steps made again."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_python

from narrmem import Message, Scope
from narrmem.edit_marks import NAMESPACE
from narrmem.testing import open_memory

NOW = datetime(2026, 7, 1, 9, tzinfo=UTC)


async def test_a_stopped_processs_marks_are_deleted_by_the_next_open(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as memory:
        ids = {"tenant": "t", "user_id": "ann", "chat_id": "c", "message_id": "1"}
        await memory.store.state_put(NAMESPACE, "0123456789abcdef0123456789abcdef:e1", ids)
        await memory.store.state_put(NAMESPACE, "fedcba9876543210fedcba9876543210:e2", ids)
        assert len(await memory.store.state_items(NAMESPACE)) == 2
    async with open_memory(tmp_path) as memory:
        assert await memory.store.state_items(NAMESPACE) == []


KILLED_BETWEEN_THE_STEPS = textwrap.dedent(
    """
    import asyncio, os, sys
    from narrmem.ingest import IngestPipeline
    from narrmem.testing import open_memory

    original = IngestPipeline.run

    async def run(self, messages, *args, **kwargs):
        if any("Porto" in str(getattr(m, "text", "")) for m in messages):
            os._exit(0)  # the old text is forgotten; the new one never written
        return await original(self, messages, *args, **kwargs)

    async def main():
        memory = await open_memory(sys.argv[1]).__aenter__()
        said = {"user_id": "ann", "chat_id": "c", "ts": "2026-07-01T09:00:00+00:00", "message_id": "m1"}
        await memory.ingest({**said, "text": "I live in Lisbon"})
        IngestPipeline.run = run
        await memory.edit({**said, "text": "I live in Porto now"})

    asyncio.run(main())
    """
)


async def test_an_edit_killed_between_its_two_steps_is_made_again_by_the_next_open(tmp_path: Path) -> None:
    """Killed after the edit forgot the old text and before it wrote the new one, a process left
    neither; the new message is kept with the edit's mark, and the next open makes the edit."""
    await run_python(KILLED_BETWEEN_THE_STEPS, str(tmp_path))
    async with open_memory(tmp_path) as memory:
        [episode] = await memory.store.recent(Scope(chat_id="c"), limit=10)
        assert episode.text == "I live in Porto now" and episode.message_ids == ["m1"]
        assert [e["text"] for e in episode.meta["edits"]] == ["I live in Lisbon"]
        assert await memory.store.state_items(NAMESPACE) == []


KILLED_INSIDE_ITS_FORGET = textwrap.dedent(
    """
    import asyncio, os, sys
    from narrmem.testing import open_memory

    async def main():
        memory = await open_memory(sys.argv[1]).__aenter__()
        said = {"user_id": "ann", "chat_id": "c", "ts": "2026-07-01T09:00:00+00:00", "message_id": "m1"}
        await memory.ingest({**said, "text": "I live in Lisbon"})

        async def finish_forget(job, **kwargs):
            os._exit(0)  # the old text is deleted; the forget's record not yet

        memory.store.finish_forget = finish_forget
        await memory.edit({**said, "text": "I live in Porto now"})

    asyncio.run(main())
    """
)


async def test_an_edit_killed_inside_its_own_forget_is_made_again_by_the_next_open(tmp_path: Path) -> None:
    """Killed after the edit's forget deleted the old text and before its record went, a process
    left that forget for the next open to finish, which finished it as any forget of the message:
    it deleted the edit's mark, which held the new text, and neither text was left."""
    await run_python(KILLED_INSIDE_ITS_FORGET, str(tmp_path))
    async with open_memory(tmp_path) as memory:
        [episode] = await memory.store.recent(Scope(chat_id="c"), limit=10)
        assert episode.text == "I live in Porto now" and episode.message_ids == ["m1"]
        assert await memory.store.pending_forgets() == []
        assert await memory.store.state_items(NAMESPACE) == []


async def test_a_delete_of_the_message_begun_before_a_stopped_edits_forget_still_takes_the_edit(
    tmp_path: Path,
) -> None:
    """Only the edit's own forget leaves its mark: a delete of the message recorded before the edit
    began its forget is finished as ever, deleting the mark, and the new text is not written."""
    async with open_memory(tmp_path) as memory:
        said = {"user_id": "ann", "chat_id": "c", "ts": NOW, "message_id": "m1"}
        await memory.ingest(Message(text="I live in Lisbon", **said))
        job = await memory.store.begin_forget(tenant="default", user_id=None, chat_id="c", messages=["m1"])
        replacement = Message(text="I live in Porto now", **said)
        ids = {"tenant": "default", "user_id": "ann", "chat_id": "c", "message_id": "m1"}
        value = {**ids, "message": replacement.model_dump(mode="json"), "forgetting_after": job.id}
        await memory.store.state_put(NAMESPACE, "0123456789abcdef0123456789abcdef:e1", value)
    async with open_memory(tmp_path) as memory:
        assert await memory.store.recent(Scope(chat_id="c"), limit=10) == []
        assert await memory.store.state_items(NAMESPACE) == []


async def test_a_delete_recorded_after_a_stopped_edits_own_forget_ended_still_takes_the_edit(
    tmp_path: Path,
) -> None:
    """The edit's own forget had finished (its job gone) when its process stopped; another worker
    then began a delete of the message and stopped too. The delete was taken for the edit's own
    forget (the first job of the message after the one the mark noted), and the edit was made
    again: the deleted message came back."""
    async with open_memory(tmp_path) as memory:
        said = {"user_id": "ann", "chat_id": "c", "ts": NOW, "message_id": "m1"}
        await memory.ingest(Message(text="I live in Lisbon", **said))
        replacement = Message(text="I live in Porto now", **said)
        ids = {"tenant": "default", "user_id": "ann", "chat_id": "c", "message_id": "m1"}
        noted = {"forgetting_after": 0, "forgetting_job": 7}  # job 7 finished and went
        value = {**ids, "message": replacement.model_dump(mode="json"), **noted}
        await memory.store.state_put(NAMESPACE, "0123456789abcdef0123456789abcdef:e1", value)
        await memory.store.begin_forget(tenant="default", user_id=None, chat_id="c", messages=["m1"])
    async with open_memory(tmp_path) as memory:
        assert await memory.store.recent(Scope(chat_id="c"), limit=10) == []
        assert await memory.store.state_items(NAMESPACE) == []


async def test_an_edit_left_halfway_whose_person_a_finished_forget_took_is_not_made_again(
    tmp_path: Path,
) -> None:
    """The stopped process also had a forget of the person under way: the next open finishes it
    first, which deletes the edit's mark, and the new text is not written after it."""
    async with open_memory(tmp_path) as memory:
        replacement = Message(text="I live in Porto now", user_id="ann", chat_id="c", ts=NOW, message_id="m1")
        ids = {"tenant": "default", "user_id": "ann", "chat_id": "c", "message_id": "m1"}
        value = {**ids, "message": replacement.model_dump(mode="json")}
        await memory.store.state_put(NAMESPACE, "0123456789abcdef0123456789abcdef:e1", value)
        await memory.store.begin_forget(tenant="default", user_id="ann", chat_id=None)
    async with open_memory(tmp_path) as memory:
        assert await memory.store.recent(Scope(chat_id="c"), limit=10) == []
        assert await memory.store.state_items(NAMESPACE) == []


async def test_edits_of_one_message_at_once_in_one_process_each_replace_the_text_in_turn(
    tmp_path: Path,
) -> None:
    """Two edits at once each forgot the old text, and each one's forget took the other's new
    text on its way: both answered "forgotten meanwhile" and the message was gone. A platform
    that retries its edit webhook sends exactly that."""
    import asyncio

    when = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
    said = {"user_id": "u", "chat_id": "c", "message_id": "e1", "ts": when}
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest(Message(text="I decided to move to Lisbon next spring", **said))
        results = await asyncio.gather(
            memory.edit(Message(text="I decided to move to Porto next spring", **said)),
            memory.edit(Message(text="I decided to move to Madrid next spring", **said)),
            memory.edit(Message(text="I decided to move to Madrid next spring", **said)),  # a retry
        )
        assert [r.stored for r in results] == [True, True, False]
        assert results[2].duplicate  # the same text again: nothing to edit
        ids = await memory.store.from_messages("default", "c", ["e1"])
        episodes = [
            r for r in (await memory.store.get(ids, Scope(chat_id="c"))).values() if r.kind == "episode"
        ]
        [episode] = episodes
        assert episode.text == "I decided to move to Madrid next spring"
        assert [e["text"] for e in episode.meta["edits"]] == [
            "I decided to move to Lisbon next spring",
            "I decided to move to Porto next spring",
        ]


async def test_an_edit_whose_new_text_cannot_be_written_after_its_forget_is_made_at_the_next_open(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The old text forgotten, the new one's write fails (the store unreachable, no turn to write):
    the mark, the only copy of the new text, stays, and the next open makes the edit. Before, the
    mark was deleted as the edit ended: neither text was left."""
    from narrmem.errors import StoreUnavailableError
    from narrmem.ingest import IngestPipeline

    write = IngestPipeline._write
    failing = {"on": False}

    async def write_or_fail(self: Any, *args: Any, **kwargs: Any) -> Any:
        if failing["on"]:
            raise StoreUnavailableError("no turn to write within 30 s (storage.timeout_s)")
        return await write(self, *args, **kwargs)

    monkeypatch.setattr(IngestPipeline, "_write", write_or_fail)

    def said(text: str) -> Message:
        return Message(
            tenant="t",
            user_id="u",
            chat_id="c",
            message_id="m1",
            text=text,
            ts=datetime(2024, 1, 1, tzinfo=UTC),
        )

    folder = tmp_path / "m"
    scope = Scope(tenant="t", chat_id="c")
    async with open_memory(folder) as memory:
        await memory.ingest(said("I live in Lisbon and love sardines"))
        failing["on"] = True
        with pytest.raises(StoreUnavailableError):
            await memory.edit(said("I live in Porto and love francesinhas"))
        failing["on"] = False
        assert len(await memory.store.state_items(NAMESPACE)) == 1  # kept, with the new text
    async with open_memory(folder) as memory:
        ids = await memory.store.from_messages("t", "c", ["m1"])
        texts = [r.text for r in (await memory.store.get(ids, scope)).values()]
        assert texts == ["I live in Porto and love francesinhas"]
        assert await memory.store.state_items(NAMESPACE) == []
