"""The fast read path of stored rows: ``trusted`` models, the JSON columns' parser, and the inner
products of stored vectors with a query."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from narrmem import jsonio
from narrmem.models import Candidate, MemoryRecord
from narrmem.products import inner_products


def _fields() -> dict[str, object]:
    return {
        "id": 7,
        "kind": "episode",
        "tenant": "default",
        "user_id": "ann",
        "chat_id": "dm-ann",
        "speaker": "Ann",
        "text": "I moved to Lisbon.",
        "embed_text": 'Ann said, "I moved to Lisbon."',
        "importance": 0.4,
        "created_at": datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
        "stored_at": None,
        "message_ids": ["m1"],
        "meta": {"layer": "accumulate"},
        "context_text": None,
        "reinforced_at": None,
    }


def test_trusted_record_is_the_validated_record() -> None:
    trusted = MemoryRecord.trusted(**_fields())
    validated = MemoryRecord(**_fields())
    assert trusted == validated
    assert trusted.model_dump() == validated.model_dump()
    assert trusted.model_fields_set == validated.model_fields_set
    assert trusted.index_text == 'Ann said, "I moved to Lisbon."'
    assert trusted.model_copy(update={"importance": 0.9}).importance == 0.9


def test_trusted_names_missing_and_unknown_fields() -> None:
    fields = _fields()
    del fields["meta"]
    with pytest.raises(TypeError, match=r"missing fields \['meta'\]"):
        MemoryRecord.trusted(**fields)
    with pytest.raises(TypeError, match=r"unknown fields \['colour'\]"):
        Candidate.trusted(memory_id=1, source="vector", rank=0, score=0.5, colour="red")


@pytest.mark.parametrize(
    "text",
    [
        '{"layer": "scene", "moods": ["tired"], "n": 3, "x": 1.5, "ok": true, "none": null}',
        '["m1", "m2"]',
        "{}",
        '"Zoë 摇滚"',
    ],
)
def test_json_columns_read_as_the_standard_library_reads_them(text: str) -> None:
    assert jsonio.loads(text) == json.loads(text)


def test_json_the_fast_parser_refuses_is_still_read() -> None:
    # json.dumps writes NaN and lone surrogates by default; what it wrote must stay readable.
    assert math.isnan(jsonio.loads(json.dumps({"x": float("nan")}))["x"])
    assert jsonio.loads(json.dumps("\ud800")) == "\ud800"


def test_inner_products_are_numpy_s_without_its_thread_pool(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(2_000, 384)).astype(np.float32)
    query = rng.normal(size=384).astype(np.float32)
    path = tmp_path / "rows.f32"
    rows.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=rows.shape)  # read in place
    np.testing.assert_allclose(inner_products(mapped, query), rows @ query, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(inner_products(rows[::2], query), rows[::2] @ query, rtol=1e-4, atol=1e-3)
    assert inner_products(rows[:0], query).shape == (0,)
    with pytest.raises(ValueError, match="shape"):
        inner_products(rows, query[:100])
