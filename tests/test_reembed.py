"""``narrmem migrate --reembed``: a memory moved to another model holds, for every message, the
vector a store of that model writes for it (the gist's, attributed, as ingest made it); the graph's
vectors of the old model stay behind; a second run embeds nothing again; a copy to another model
without re-embedding is refused before anything is copied."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import DB_NAME, run_narrmem

from narrmem.config import load_settings
from narrmem.doors import migrate as migration
from narrmem.doors.migrate import migrate
from narrmem.embed import packaged_model_path
from narrmem.errors import ConfigError
from narrmem.store import SQLCapable
from narrmem.testing import open_memory

T0 = datetime(2025, 1, 6, 20, 0, tzinfo=UTC)
TEXTS = [
    "Hey! I decided to quit my job at the bank. Thanks a lot!",  # its vector is of its gist
    "so tired today after the long shift",
    "我决定下个月去云南旅行",
    "Haha. We adopted a puppy called Biscuit last weekend.",
    "I'm training for the Berlin marathon in April, wish me luck",
    "my sister finally got her driving licence",
]
FLOAT32, INT8 = {"quantize": "none"}, {"quantize": "int8"}
AUTO_TASKS = {"graph": {"auto_tasks": True}}


async def move(
    source: Path,
    target: Path,
    old: dict[str, str] = FLOAT32,
    new: dict[str, str] = INT8,
    **options: Any,
) -> dict[str, Any]:
    """``migrate`` from a store of model ``old`` to one of model ``new`` (re-embedding unless told)."""
    options = {"reembed": True, "progress": False, **options}
    return await migrate(
        str(source),
        str(target),
        settings=load_settings(embedder=old),
        target_settings=load_settings(embedder=new),
        **options,
    )


async def fill(folder: Path, embedder: dict[str, str]) -> str:
    async with open_memory(folder, real_model=True, embedder=embedder, plugin=AUTO_TASKS) as mem:
        # A task the messages then follow: its topic is stored, a vector of this model.
        await mem.call_tool(
            "task_create",
            {"user_id": "ann", "chat_id": "c1", "task_id": "Trip", "description": "plan the trip to Yunnan"},
        )
        for n, text in enumerate(TEXTS * 2):
            await mem.ingest(
                {
                    "text": f"{text} ({n})",
                    "user_id": ["ann", "bo"][n % 2],
                    "chat_id": "c1",
                    "message_id": f"m{n}",
                    "ts": (T0 + timedelta(hours=n)).isoformat(),
                    "speaker": ["Ann", "Bo"][n % 2],
                }
            )
        name: str = mem.embedder.name
    return name


async def vectors_by_record(folder: Path, embedder: dict[str, str]) -> tuple[str, dict[Any, np.ndarray]]:
    async with open_memory(folder, real_model=True, embedder=embedder, read_only=True) as mem:
        held = {
            (record.kind, tuple(record.message_ids), record.text): vector
            async for record, vector in mem.store.export()
        }
        return mem.embedder.name, held


async def node_vectors(folder: Path, embedder: dict[str, str] = FLOAT32) -> list[tuple[Any, ...]]:
    async with open_memory(folder, real_model=True, embedder=embedder, read_only=True) as mem:
        assert isinstance(mem.store, SQLCapable)
        async with mem.store.sql() as db:
            rows = await db.fetchall("SELECT name, vector, topic_vector FROM graph_nodes ORDER BY id")
        return [tuple(row) for row in rows]


def topics(rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
    return {name: np.frombuffer(topic, dtype=np.float32) for name, _, topic in rows if topic is not None}


async def test_a_memory_moved_to_another_model_holds_the_vectors_that_model_writes(tmp_path: Path) -> None:
    source, target, fresh = tmp_path / "float32", tmp_path / "int8", tmp_path / "fresh-int8"
    assert await fill(source, FLOAT32) == "all-MiniLM-L6-v2"
    assert await fill(fresh, INT8) == "all-MiniLM-L6-v2-int8"
    assert topics(await node_vectors(source))  # the tasks' topics, float32's

    report = await move(source, target)
    assert report["verified"] and report["counts_match"], json.dumps(report, default=str)
    assert report["models"] == {"source": "all-MiniLM-L6-v2", "target": "all-MiniLM-L6-v2-int8"}
    assert report["recall"]["measure"] == "vectors made again agree"
    assert report["recall"]["agreement"] == 1.0

    model, moved = await vectors_by_record(target, INT8)
    _, written = await vectors_by_record(fresh, INT8)
    _, old = await vectors_by_record(source, FLOAT32)
    assert model == "all-MiniLM-L6-v2-int8"
    assert moved.keys() == written.keys() and any(kind == "scene" for kind, _, _ in moved)
    for key, vector in moved.items():
        # The vector a store of the new model wrote for the same message: the gist's for the
        # first text (the whole message's gave 0.93 against it), the record's own for a scene.
        assert float(vector @ written[key]) > 0.9999, key
    # And not the old model's vectors copied (int8 and float32 differ by up to 0.03 in cosine).
    assert min(float(moved[key] @ old[key]) for key in moved) < 0.999
    # The graph's nodes keep no vector of the old model: a task's topic is replayed from its
    # messages' new vectors, the one a store of the new model holds.
    moved_nodes, fresh_topics = await node_vectors(target, INT8), topics(await node_vectors(fresh, INT8))
    assert not any(vector for _, vector, _ in moved_nodes)
    moved_topics = topics(moved_nodes)
    assert moved_topics.keys() == fresh_topics.keys() and len(moved_topics) >= 2, moved_topics.keys()
    for name, topic in moved_topics.items():
        assert float(topic @ fresh_topics[name]) > 0.999, name

    again = await move(source, target, queries=0)
    assert again["memories"] == {"imported": 0, "skipped": len(moved)} and again["verified"]
    assert (await vectors_by_record(target, INT8))[1].keys() == moved.keys()


async def test_another_model_without_reembedding_is_refused_and_copies_nothing(tmp_path: Path) -> None:
    source, target = tmp_path / "float32", tmp_path / "int8"
    await fill(source, FLOAT32)
    with pytest.raises(ConfigError, match="--reembed"):
        await move(source, target, reembed=False)
    async with open_memory(target, real_model=True, embedder=INT8, read_only=True) as mem:
        assert [item async for item in mem.store.export()] == []


def test_the_command_moves_a_data_folder_to_the_model_of_another_config(tmp_path: Path) -> None:
    source, target = tmp_path / "old", tmp_path / "new"
    (tmp_path / "old.toml").write_text(f'data_dir = "{source}"\n[embedder]\nquantize = "none"\n')
    (tmp_path / "new.toml").write_text('[embedder]\nquantize = "int8"\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    lines = [
        {"text": text, "user_id": "ann", "chat_id": "c1", "message_id": f"m{n}", "ts": T0.isoformat()}
        for n, text in enumerate(TEXTS)
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_narrmem("ingest", str(tmp_path / "in.jsonl"), "--config", "old.toml", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    move = ["migrate", "--config", "old.toml", "--from", str(source), "--to", str(target)]
    refused = run_narrmem(*move, "--to-config", "new.toml", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "--reembed" in refused.stderr, refused.stderr
    done = run_narrmem(*move, "--to-config", "new.toml", "--reembed", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified"] and report["models"]["target"] == "all-MiniLM-L6-v2-int8"
    vectors = report["counts"]["vectors"]
    assert vectors["source"] == vectors["target"] > len(TEXTS)  # the messages' and the scenes'


async def test_vectors_that_are_not_the_target_models_are_not_a_verified_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check recalled each sampled memory's own text, which found it by its words whatever its
    vector was: random vectors, or another model's, were verified."""
    source = tmp_path / "float32"
    await fill(source, FLOAT32)

    async def random_vectors(dst: Any, batch: Any) -> list[tuple[Any, np.ndarray]]:
        rows = np.random.default_rng(0).standard_normal((len(batch), dst.embedder.dim)).astype(np.float32)
        return [(record, row / np.linalg.norm(row)) for (record, _), row in zip(batch, rows, strict=True)]

    monkeypatch.setattr(migration, "_made_again", random_vectors)
    report = await move(source, tmp_path / "int8")
    assert not report["verified"] and report["recall"]["agreement"] == 0.0


async def test_an_episode_stored_before_attribution_is_embedded_as_a_new_one(tmp_path: Path) -> None:
    """Episodes written before 2026-11-29 have no embed_text: re-embedded from their bare text,
    their vectors were 0.77 (median) of a new store's."""
    source, target, fresh = tmp_path / "float32", tmp_path / "int8", tmp_path / "fresh-int8"
    await fill(source, FLOAT32)
    await fill(fresh, INT8)
    with sqlite3.connect(source / DB_NAME) as db:
        assert db.execute("UPDATE memories SET embed_text = NULL WHERE kind = 'episode'").rowcount > 0
    report = await move(source, target)
    assert report["verified"], report["recall"]
    _, moved = await vectors_by_record(target, INT8)
    _, written = await vectors_by_record(fresh, INT8)
    assert min(float(vector @ written[key]) for key, vector in moved.items()) > 0.9999


def other_weights(model: Path, seed: int) -> None:
    """Change the weights of a model folder (another model under the same name)."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    rng = np.random.default_rng(seed)
    changed = {}
    for key, array in weights.items():
        noise = rng.normal(0, 0.05, array.shape).astype(array.dtype) if array.dtype.kind == "f" else 0
        changed[key] = array + noise
    save_file(changed, str(model / "model.safetensors"))


async def test_two_model_folders_of_one_name_are_two_models(tmp_path: Path) -> None:
    """A store keeps its model folder's last name: a copy into a store of another folder of the
    same name (other weights) was taken for the same model, its old vectors copied as they were,
    and re-embedded, the graph's task topics of the old model were kept; the source's note of its
    weights was copied too, and refused the target's own model at its next open."""
    old_model, new_model = tmp_path / "a" / "mymodel", tmp_path / "b" / "mymodel"
    shutil.copytree(packaged_model_path(), old_model)
    shutil.copytree(packaged_model_path(), new_model)
    other_weights(new_model, seed=3)
    old = {"backend": "sentence-transformers", "model_path": str(old_model), "runs_in": "thread"}
    new = {**old, "model_path": str(new_model)}
    source, target = tmp_path / "old", tmp_path / "new"
    await fill(source, old)
    with pytest.raises(ConfigError, match="--reembed"):
        await move(source, tmp_path / "refused", old, new, reembed=False)
    report = await move(source, target, old, new)
    assert report["verified"], report["recall"]
    old_topics, new_topics = topics(await node_vectors(source, old)), topics(await node_vectors(target, new))
    assert new_topics.keys() == old_topics.keys()
    assert all(float(new_topics[name] @ old_topics[name]) < 0.99 for name in new_topics)
    # Its own model opens it (the source's note of its weights, copied, refused it).
    async with open_memory(target, real_model=True, embedder=new) as memory:
        assert await memory.recall("Berlin marathon", user_id="ann", k=1)
