"""``auto_tasks`` over a chain of many tasks: a message reads the task in progress, and only when
it leaves that topic the newest ``resume_window`` paused tasks, not the whole chain (a chat of
2,000 tasks cost each message 106 ms against 5 with none); an older paused topic that comes back
starts a new task; a tool-made task's topic, worked out from its description, is stored once.
Runs on either store (``TESTS_STORE``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from narrmem_plugins.graph.backend import GraphSQL

from narrmem.testing import open_memory

TOPICS = [f"zq{n}alpha zq{n}beta zq{n}gamma zq{n}delta zq{n}epsilon" for n in range(40)]


def _config(window: int = 200) -> dict[str, Any]:
    # The tests' hash embedder puts unrelated texts closer than the model does.
    return {
        "graph": {
            "auto_tasks": True,
            "extract_facts": False,
            "topic_similarity": 0.9,
            "resume_window": window,
        }
    }


@pytest.fixture
def nodes_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    read = {"counting": 0, "rows": 0}
    fetchall = GraphSQL.fetchall

    async def counted(self: GraphSQL, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows = await fetchall(self, sql, params)
        if read["counting"] and "FROM graph_nodes" in sql.split("WHERE")[0]:
            read["rows"] += len(rows)
        return rows

    monkeypatch.setattr(GraphSQL, "fetchall", counted)
    yield read


async def _say(mem: Any, mid: str, text: str) -> list[str]:
    notes = (await mem.ingest(msg(mid, text, user="ann", chat="c"))).notes
    return [note for note in notes if note.startswith("task ")]


async def test_a_message_on_the_current_topic_reads_the_task_not_the_chain(
    tmp_path: Path, nodes_read: dict[str, int]
) -> None:
    async with open_memory(tmp_path / "store", plugin=_config()) as mem:
        for n, text in enumerate(TOPICS):
            assert any("task started" in note for note in await _say(mem, f"t{n}", text))
        nodes_read["counting"] = 1
        assert await _say(mem, "again", TOPICS[-1]) == []  # the same topic: continued
        nodes_read["counting"] = 0
        [(tasks,)] = await store_sql(mem, "SELECT COUNT(*) FROM graph_nodes WHERE type = 'TaskNode'")
    assert tasks == len(TOPICS)
    assert nodes_read["rows"] <= 4, nodes_read


async def test_a_paused_topic_past_the_window_starts_a_new_task(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=_config(window=2)) as mem:
        for n in range(4):
            await _say(mem, f"t{n}", TOPICS[n])
        # Paused: topics 0, 1, 2 (newest last); topic 3 in progress. Topic 1 is within the two
        # newest paused, topic 0 is not.
        assert await _say(mem, "back1", TOPICS[1]) == [
            "task paused: Task_auto_4",
            "task resumed: Task_auto_2",
        ]
        notes = await _say(mem, "back0", TOPICS[0])
    assert notes == ["task paused: Task_auto_2", "task started: Task_auto_5"]


async def test_a_tool_made_tasks_topic_is_worked_out_once(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store", plugin=_config()) as mem:
        await mem.call_tool(
            "task_create",
            {
                "user_id": "ann",
                "chat_id": "c",
                "task_id": "Plan_trip",
                "description": "plan the fjord kayak trip",
            },
        )
        await mem.call_tool(
            "task_set_state", {"user_id": "ann", "chat_id": "c", "task_id": "Plan_trip", "state": "paused"}
        )
        await _say(mem, "t0", TOPICS[0])
        [(topic,)] = await store_sql(mem, "SELECT topic_vector FROM graph_nodes WHERE name = 'Plan_trip'")
    assert topic is not None and len(topic) == 384 * 4


async def test_task_chains_and_the_turn_context_read_the_newest_tasks_not_the_chain(
    tmp_path: Path, nodes_read: dict[str, int]
) -> None:
    async with open_memory(tmp_path / "store", plugin=_config()) as mem:
        for n, text in enumerate(TOPICS):
            await _say(mem, f"t{n}", text)
        nodes_read["counting"] = 1
        out = await mem.call_tool("task_chains", {"user_id": "ann", "limit": 3})
        listed = nodes_read["rows"]
        context = await mem.turn_context("what was I doing just now?", user_id="ann", chat_id="c")
        nodes_read["counting"] = 0
    [chain] = out["chains"]
    assert [t["task_id"] for t in chain["tasks"]] == ["Task_auto_40", "Task_auto_39", "Task_auto_38"]
    assert chain["total"] == len(TOPICS)
    assert context["refers_back"] and len(context["tasks"]) == 10  # the chain_limit newest
    assert listed <= 6, listed
    assert nodes_read["rows"] <= listed + 16, nodes_read
