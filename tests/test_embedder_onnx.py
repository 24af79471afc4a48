"""The ``onnx`` embedder gives the default backend's vectors, caches its export, and serves a Memory."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import msg, variants
from narrmem_plugins.embedder_onnx import OnnxEmbedder, default_cache_dir, weights_digest

from narrmem.config import load_settings
from narrmem.doors.importing import export_model, import_jsonl
from narrmem.doors.migrate import migrate
from narrmem.doors.transfer import export_jsonl
from narrmem.errors import ConfigError, InputError, StoreError
from narrmem.testing import open_memory

pytestmark = pytest.mark.slow

TEXTS = [
    "I decided to quit my job at the bank",
    "我喜欢摇滚乐，尤其是崔健的老歌。",
    "ok",
    "A much longer message about hiking in the mountains with friends on a sunny weekend in May, "
    "with a picnic at the top and a thunderstorm on the way down that soaked everyone to the bone.",
    "",
]


async def test_the_export_is_cached_and_gives_the_same_vectors_again(tmp_path: Path) -> None:
    """(That they are sentence-transformers' vectors is ``test_embedder_export.py``'s first test.)"""
    onnx = OnnxEmbedder(None, tmp_path, batch_size=2)
    try:
        first_vectors = await onnx.embed(TEXTS)
    finally:
        await onnx.close()
    exported = onnx.model_file()
    assert exported.exists()
    first = exported.stat().st_mtime_ns
    again = OnnxEmbedder(None, tmp_path)
    await again.start()  # loads the cached file, exports nothing
    try:
        assert np.allclose(await again.embed(TEXTS), first_vectors, atol=1e-6)
    finally:
        await again.close()
    assert exported.stat().st_mtime_ns == first and not list(exported.parent.glob("*.partial"))


def test_the_weights_digest_is_kept_while_the_file_is_unchanged(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights, first version")
    cache = tmp_path / "cache"
    first = weights_digest(weights, cache)
    [stamp] = (cache / "digests").iterdir()
    assert first == hashlib.sha256(b"weights, first version").hexdigest()[:16]
    # The kept digest is what a later start reads: it is not computed again.
    kept = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**kept, "sha256": "0123456789abcdef"}))
    assert weights_digest(weights, cache) == "0123456789abcdef"
    # Another size or modification time: hashed again and kept anew.
    weights.write_bytes(b"weights, second version, longer")
    second = weights_digest(weights, cache)
    assert second == hashlib.sha256(b"weights, second version, longer").hexdigest()[:16]
    assert json.loads(stamp.read_text())["sha256"] == second
    # A stamp that is not JSON, or a cache folder that cannot be written, costs only the hash.
    stamp.write_text("{not json")
    assert weights_digest(weights, cache) == second
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    assert weights_digest(weights, blocked) == second


async def test_a_memory_on_the_default_backend_shares_one_export(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for folder in ("m1", "m2"):
        async with open_memory(
            tmp_path / folder, real_model=True, embedder={"cache_dir": str(cache)}
        ) as memory:
            await memory.ingest(msg("p1", "I adopted a greyhound named Pixel from the shelter"))
            await memory.ingest(msg("p2", "my favourite food is spicy ramen with extra egg"))
            hits = await memory.recall("what kind of dog do I have?", user_id="u1", k=1)
            assert hits[0].message_ids == ["p1"]
            stats = await memory.stats()
            assert stats["embedder"] == {"backend": "onnx", "model": "all-MiniLM-L6-v2-int7"}
    # One float32 export and its int7 copy, made by the first memory, used by the second.
    exports = {p.name for p in (cache / "onnx").iterdir()}
    [full] = [name for name in exports if not name.endswith("-int7.onnx")]
    assert exports == {full, full.replace(".onnx", "-int7.onnx")}
    assert not (tmp_path / "m1" / "onnx").exists()


@pytest.mark.parametrize("variant", variants("int7", "int8"))
async def test_quantized_weights_are_close_to_fp32_and_kept_apart_in_a_store(
    tmp_path: Path, variant: str
) -> None:
    full = OnnxEmbedder(None, tmp_path)
    quantized_model = OnnxEmbedder(None, tmp_path, quantize=variant)
    try:
        reference = await full.embed(TEXTS[:4])
        quantized = await quantized_model.embed(TEXTS[:4])
    finally:
        await full.close()
        await quantized_model.close()
    cosines = np.sum(reference * quantized, axis=1)
    assert 0.95 <= float(np.min(cosines)) < 0.99999  # close, but not the same vectors
    assert quantized_model.name == f"all-MiniLM-L6-v2-{variant}"
    assert quantized_model.model_file().name.endswith(f"-{variant}.onnx")
    cache = {"cache_dir": str(tmp_path)}
    async with open_memory(tmp_path / "m", real_model=True, embedder={**cache, "quantize": "none"}) as memory:
        await memory.ingest(msg("p1", "I adopted a greyhound named Pixel from the shelter"))
    with pytest.raises(StoreError, match="all-MiniLM-L6-v2"):
        async with open_memory(tmp_path / "m", real_model=True, embedder={**cache, "quantize": variant}):
            pass


async def test_int7_weights_are_seven_bits_and_int8_weights_eight(tmp_path: Path) -> None:
    """7-bit weights keep onnxruntime's int8 products from saturating on CPUs without VNNI, so
    int7 vectors are the same on every CPU; 8-bit weights reach beyond 63."""
    import onnx
    from onnx import numpy_helper

    largest: dict[str, int] = {}
    for variant in ("int7", "int8"):
        model = OnnxEmbedder(None, tmp_path, quantize=variant)
        try:
            await model.embed(["load"])
        finally:
            await model.close()
        weights = [
            numpy_helper.to_array(t)
            for t in onnx.load(str(model.model_file())).graph.initializer
            if t.data_type == onnx.TensorProto.INT8
        ]
        assert weights, variant
        largest[variant] = max(int(np.abs(w.astype(np.int16)).max()) for w in weights)
    assert largest["int7"] <= 64 < largest["int8"]


async def test_auto_writes_new_stores_with_int7_and_keeps_older_stores_to_their_model(tmp_path: Path) -> None:
    cache = {"cache_dir": str(tmp_path / "cache")}
    async with open_memory(tmp_path / "new", real_model=True, embedder=cache) as memory:
        await memory.ingest(msg("p1", "I adopted a greyhound named Pixel from the shelter"))
        assert (await memory.stats())["embedder"]["model"] == "all-MiniLM-L6-v2-int7"
    # Stores written with float32 vectors (every store before int8 became the default) and with
    # 8-bit int8 vectors (every store before int7).
    for quantize, model in (("none", "all-MiniLM-L6-v2"), ("int8", "all-MiniLM-L6-v2-int8")):
        older = tmp_path / f"older-{quantize}"
        async with open_memory(older, real_model=True, embedder={**cache, "quantize": quantize}) as memory:
            await memory.ingest(msg("p1", "I adopted a greyhound named Pixel from the shelter"))
            await memory.ingest(msg("p2", "my favourite food is spicy ramen with extra egg"))
        for read_only in (False, True):
            async with open_memory(older, real_model=True, embedder=cache, read_only=read_only) as memory:
                assert (await memory.stats())["embedder"]["model"] == model
                hits = await memory.recall("what kind of dog do I have?", user_id="u1", k=1)
                assert hits[0].message_ids == ["p1"]
    # Naming a variant is a promise: the other one is refused, not silently switched.
    with pytest.raises(StoreError, match="all-MiniLM-L6-v2-int7"):
        async with open_memory(tmp_path / "new", real_model=True, embedder={**cache, "quantize": "none"}):
            pass


async def test_an_import_or_a_migration_into_a_new_store_keeps_the_source_vectors(tmp_path: Path) -> None:
    cache = {"cache_dir": str(tmp_path / "cache")}
    older, export = tmp_path / "older", tmp_path / "older.jsonl"
    async with open_memory(older, real_model=True, embedder={**cache, "quantize": "none"}) as memory:
        await memory.ingest(msg("p1", "I adopted a greyhound named Pixel from the shelter"))
        await memory.ingest(msg("p2", "my favourite food is spicy ramen with extra egg"))
        await export_jsonl(memory, export)
    assert export_model(export) == "all-MiniLM-L6-v2"
    env = {**os.environ, "NARRMEM_EMBEDDER__CACHE_DIR": cache["cache_dir"]}
    imported = tmp_path / "imported"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "narrmem.doors.cli", "import", str(export), "--data", str(imported)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    settings = load_settings(None, data_dir=str(tmp_path / "migrated"), embedder=cache)
    report = await migrate(
        str(older), str(tmp_path / "migrated"), settings=settings, queries=2, progress=False
    )
    assert report["verified"]
    for folder in (imported, tmp_path / "migrated"):
        async with open_memory(folder, real_model=True, embedder=cache) as memory:
            assert (await memory.stats())["embedder"]["model"] == "all-MiniLM-L6-v2"
            hits = await memory.recall("what kind of dog do I have?", user_id="u1", k=1)
            assert hits[0].message_ids == ["p1"]
    # Into a store that already holds int7 vectors, the import is refused with the setting to use.
    async with open_memory(tmp_path / "new", real_model=True, embedder=cache) as memory:
        with pytest.raises(InputError, match='quantize = "none"'):
            await import_jsonl(memory, export)


async def test_auto_is_float32_on_the_sentence_transformers_backend(tmp_path: Path) -> None:
    async with open_memory(
        tmp_path / "m", real_model=True, embedder={"backend": "sentence-transformers"}
    ) as m:
        assert (await m.stats())["embedder"]["model"] == "all-MiniLM-L6-v2"


async def test_quantize_needs_the_onnx_backend(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"embedder\.quantize"):
        async with open_memory(
            tmp_path / "m", real_model=True, embedder={"backend": "sentence-transformers", "quantize": "int8"}
        ):
            pass


CHILD = """
import asyncio, json, sys
from narrmem import Memory


def message(mid, text):
    return {"text": text, "user_id": "u", "chat_id": "c", "message_id": mid, "ts": "2026-05-04T09:00:00Z"}


async def main(folder):
    async with await Memory.open(folder) as memory:
        decision = await memory.triage(message("1", "ok"))
        ignored = await memory.ingest(message("2", "thanks!"))
        stored = await memory.ingest(message("3", "I adopted a greyhound named Pixel"))
        hits = await memory.recall("what dog do I have?", user_id="u")
    heavy = sorted({"torch", "sentence_transformers", "transformers"} & set(sys.modules))
    print(json.dumps([decision.layer, ignored.layer, stored.stored, hits[0].message_ids, heavy]))


asyncio.run(main(sys.argv[1]))
"""


def test_help_and_a_working_memory_never_import_torch(tmp_path: Path) -> None:
    """Once the export is cached, neither the CLI's help nor a Memory that triages, stores and
    recalls imports torch, sentence-transformers or transformers (seconds and hundreds of MB)."""
    asyncio.run(_export_once())
    code = "import sys; from narrmem.doors.cli import main\n"
    code += "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    code += "print(sorted({'torch', 'sentence_transformers', 'transformers'} & set(sys.modules)))"
    helped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert helped.stdout.strip().splitlines()[-1] == "[]"
    ran = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "m")], capture_output=True, text=True, check=True
    )
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == ["ignore", "ignore", True, ["3"], []]


async def _export_once() -> None:
    embedder = OnnxEmbedder(None, default_cache_dir())
    await embedder.start()
    await embedder.close()
