"""The vector index's manifest: which user's rows lie where in the bucket files.

Format 3 lists each bucket's shards as columns (users, offsets, counts), with tenants named once:
with 50,000 users a list of one object per shard (format 2) took 6.6 MB and 0.08 s to parse and
another 0.1 s to walk, on every open. Formats 1 and 2 are still read; a save writes format 3.

A manifest names the files it uses, and a save writes every file under a name no manifest on disk
names yet (its ``generation``, one more than the previous save's, is in the name): the manifest's
atomic replacement is then the one step that makes a save live, and a process killed anywhere in
a save leaves the previous manifest with every file it names as it was. A manifest without a
generation (written before files had one) is generation 0: its files have the plain names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ShardKey = tuple[str, str]  # (tenant, user_id)
FORMAT = 3  # 1: vectors inside the rows files; 2: vectors mapped, a list of shards; 3: columns
READABLE_FORMATS = (1, 2, 3)


@dataclass
class Bucket:
    """One bucket's files and the shards whose rows they hold, ``counts[i]`` rows of ``keys[i]``
    from ``offsets[i]``; ``graphs`` names the HNSW file of a shard (by its place in ``keys``)."""

    ids_file: str
    vectors_file: str
    keys: list[ShardKey] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    graphs: dict[int, str] = field(default_factory=dict)

    def add(self, key: ShardKey, offset: int, count: int, graph: str | None = None) -> None:
        if graph:
            self.graphs[len(self.keys)] = graph
        self.keys.append(key)
        self.offsets.append(offset)
        self.counts.append(count)


@dataclass
class Listing:
    """What a manifest lists: buckets (formats 2 and 3), or shards of format 1 (their own entries)."""

    buckets: list[Bucket]
    format_1: list[tuple[ShardKey, dict[str, Any]]]
    generation: int = 0

    def files(self) -> set[str]:
        """Every file the manifest names (the manifest itself aside)."""
        named = {str(entry["rows"]) for _, entry in self.format_1}
        for bucket in self.buckets:
            named |= {bucket.ids_file, bucket.vectors_file, *bucket.graphs.values()}
        return named


def listing(manifest: dict[str, Any]) -> Listing:
    """The shards a manifest lists (a bad manifest raises; the index is then rebuilt)."""
    generation = _whole(manifest.get("generation", 0))
    if manifest["format"] == 3:
        tenants = [_text(t, "tenants") for t in manifest["tenants"]]
        buckets = []
        for raw in manifest["buckets"]:
            users = [_text(u, "user") for u in raw["user"]]
            bucket = Bucket(
                _text(raw["ids"], "ids"),
                _text(raw["vectors"], "vectors"),
                keys=[(tenants[_whole(t)], u) for t, u in zip(raw["tenant"], users, strict=True)],
                offsets=[_whole(o) for o in raw["offset"]],
                counts=[_whole(c) for c in raw["count"]],
                graphs={_whole(int(p)): _text(g, "graph") for p, g in raw["graphs"].items()},
            )
            if not len(bucket.keys) == len(bucket.offsets) == len(bucket.counts):
                raise ValueError(f"{bucket.ids_file}: columns of different lengths")
            buckets.append(bucket)
        return Listing(buckets, [], generation)
    by_files: dict[tuple[str, str], Bucket] = {}
    format_1 = []
    for entry in manifest["shards"]:
        key: ShardKey = (str(entry["tenant"]), str(entry["user_id"]))
        if "vectors" not in entry:
            format_1.append((key, entry))
            continue
        files = (str(entry["ids"]), str(entry["vectors"]))
        bucket = by_files.setdefault(files, Bucket(*files))
        bucket.add(key, int(entry["offset"]), int(entry["count"]), entry.get("graph"))
    return Listing(list(by_files.values()), format_1, generation)


def manifest(
    dim: int,
    watermark: dict[str, int] | None,
    chats: dict[str, int],
    buckets: Sequence[Bucket],
    generation: int,
) -> dict[str, Any]:
    """The manifest (format 3) of ``buckets``, written by the save of ``generation``."""
    tenant_codes: dict[str, int] = {}
    listed = []
    for bucket in buckets:
        listed.append(
            {
                "ids": bucket.ids_file,
                "vectors": bucket.vectors_file,
                "tenant": [tenant_codes.setdefault(t, len(tenant_codes)) for t, _ in bucket.keys],
                "user": [u for _, u in bucket.keys],
                "offset": bucket.offsets,
                "count": bucket.counts,
                "graphs": {str(p): g for p, g in bucket.graphs.items()},
            }
        )
    return {
        "format": FORMAT,
        "generation": generation,
        "dim": dim,
        "watermark": watermark,
        "chats": chats,
        "tenants": list(tenant_codes),
        "buckets": listed,
    }


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}: {value!r} is not text")
    return value


def _whole(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a whole number")
    return value
