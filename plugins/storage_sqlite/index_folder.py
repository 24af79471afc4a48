"""The vector index folder is narrmem's own, and provably so: it carries a marker file, and only
files of narrmem's own naming inside a marked folder are ever replaced or removed. A setting that
points the index at a folder or a file of someone else's is refused, never emptied."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

from narrmem import logs
from narrmem.errors import StoreError

MARKER = ".narrmem-index"
# What narrmem writes in its index folder (and the temporary names it writes them under first).
# A bucket's and a graph's files carry the generation of the save that wrote them (see
# index_manifest); those of generation 0, written before, have none.
OWN_FILE = re.compile(
    r"^(manifest\.json|rows-\d{2}\.npz|(ids|vectors)-\d{2}(\.gen\d+)?\.npy|graph-[0-9a-f]{20}(\.gen\d+)?\.faiss)"
    r"(\.tmp(\.json|\.npz|\.npy|\.faiss))?$"
)
BUCKET_IDS_FILE = re.compile(r"^ids-(\d{2})(\.gen\d+)?\.npy$")
# The single FAISS file of an older narrmem (an IndexIDMap2 over a flat index).
OLD_INDEX_MAGIC = (b"IxM2", b"IxMp")
OLDEST_FOLDER_SCHEMA = 2  # the last database schema version written beside a single-file index
OLDER_DEFAULT_FILE = "vectors.faiss"  # the index's default name while it was a single file
log = logs.logger("narrmem")


def check(path: Path, index_format: int, *, older_index_file: bool = False) -> None:
    """Refuse an index path that is not provably narrmem's, writing nothing. ``older_index_file``:
    the store's database was last written by a narrmem that kept its index in one FAISS file (see
    :func:`wrote_index_file`), so a FAISS file at ``path`` is that index."""
    if path.is_file():
        with path.open("rb") as fh:
            magic = fh.read(4)
        if magic not in OLD_INDEX_MAGIC:
            raise StoreError(
                f"{path} is a file narrmem did not write: set [storage] index to a name of its own"
            )
        if not older_index_file:
            raise StoreError(
                f"{path} is a FAISS file this store's database does not record as its index: narrmem "
                "does not delete it; move it away or set [storage] index to a name of its own"
            )
    elif path.exists() and not path.is_dir():
        raise StoreError(f"{path} is not a folder: set [storage] index to a name of its own")
    if path.is_dir() and not (path / MARKER).exists():
        entries = [p.name for p in path.iterdir()]
        if entries and not _older_narrmem_folder(path, index_format):
            raise StoreError(
                f"{path} holds files narrmem did not write ({', '.join(sorted(entries)[:3])}): "
                "set [storage] index to a folder of its own"
            )


def claim(path: Path, index_format: int, *, older_index_file: bool = False) -> None:
    """Make sure ``path`` is narrmem's index folder, creating and marking it if it is new."""
    check(path, index_format, older_index_file=older_index_file)
    if path.is_file():
        path.unlink()  # an older narrmem's index: derived from SQLite, rebuilt as a folder
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"narrmem": "vector index", "format": index_format}) + "\n")


def stamp(path: Path, database: str) -> None:
    """Name in the index folder's marker the database whose index it is, if none is named yet (a
    folder two stores of one data folder share by mistake keeps the first's name)."""
    marked = _marker(path)
    if marked is not None and "database" not in marked:
        (path / MARKER).write_text(json.dumps({**marked, "database": database}) + "\n")


def remove_own(path: Path, database: str) -> bool:
    """Delete the index folder ``path`` if narrmem marked it as the index of ``database``; whether
    it did. Another database's (a store beside this one, or the one this was copied from) stays."""
    marked = _marker(path)
    if marked is None or marked.get("database") != database:
        return False
    shutil.rmtree(path)
    return True


def _marker(path: Path) -> dict[str, object] | None:
    try:
        marked = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marked if isinstance(marked, dict) else None


def remove_older_default_file(folder: Path, dim: int) -> bool:
    """Remove the index file an older narrmem kept by default (``vectors.faiss``) beside its
    default database, for a store of that database whose index is the default folder now: the
    index moved to the folder with the default's change, and the file stayed, holding the vectors
    of every person forgotten since, for good. Only a FAISS index of ``dim`` dimensions goes (read
    from its header: the file may hold millions of vectors); any other file of that name is left
    be. Whether it went."""
    old = folder / OLDER_DEFAULT_FILE
    if not old.is_file():
        return False
    with old.open("rb") as fh:
        header = fh.read(8)
    # An IndexIDMap's header: its four letters, then the dimension (a little-endian int32).
    if len(header) < 8 or header[:4] not in OLD_INDEX_MAGIC or struct.unpack("<i", header[4:])[0] != dim:
        return False
    old.unlink()
    log.info("removed %s, the vector index an older narrmem kept: the index is a folder now", old)
    return True


def wrote_index_file(schema_version: int) -> bool:
    """Whether a narrmem database at ``schema_version`` (before this open migrates it) was last
    written by a narrmem that kept the vector index in a single FAISS file: those wrote schema 1
    and 2 only (the index became a folder during schema 2)."""
    return 1 <= schema_version <= OLDEST_FOLDER_SCHEMA


def is_own_file(name: str) -> bool:
    return OWN_FILE.match(name) is not None


def bucket_files(bucket: int, generation: int) -> tuple[str, str]:
    """The names of a bucket's ids file and vectors file as the save of ``generation`` writes them."""
    return _named(f"ids-{bucket:02d}", generation, "npy"), _named(f"vectors-{bucket:02d}", generation, "npy")


def bucket_of(ids_file: str) -> int | None:
    """The bucket whose ids ``ids_file`` holds, by its name (``None``: not a name of a bucket's)."""
    named = BUCKET_IDS_FILE.match(ids_file)
    return int(named.group(1)) if named else None


def graph_file(digest: str, generation: int) -> str:
    """The name of a shard's graph file as the save of ``generation`` writes it."""
    return _named(f"graph-{digest}", generation, "faiss")


def leftovers(path: Path, named: set[str]) -> list[Path]:
    """The files of narrmem's own naming in the index folder that ``named`` (what a manifest uses,
    and the manifest) leaves out: a save's files from before its manifest, or after the next one."""
    return [p for p in path.iterdir() if p.name not in named and is_own_file(p.name)]


def _named(stem: str, generation: int, ext: str) -> str:
    return f"{stem}.gen{generation}.{ext}" if generation else f"{stem}.{ext}"


def _older_narrmem_folder(path: Path, index_format: int) -> bool:
    """A folder written before the marker existed: its manifest has every key such a narrmem
    wrote (format, dim, chats, shards naming rows files in the folder), and every file in it has
    one of narrmem's own names."""
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict):
        return False
    written, shards = manifest.get("format"), manifest.get("shards")
    if not (
        isinstance(written, int)
        and 1 <= written <= index_format
        and isinstance(manifest.get("dim"), int)
        and isinstance(manifest.get("chats"), dict)
        and isinstance(shards, list)
    ):
        return False
    for entry in shards:
        if not isinstance(entry, dict) or not {"tenant", "user_id", "rows"} <= entry.keys():
            return False
        if not isinstance(entry["rows"], str) or not (path / entry["rows"]).is_file():
            return False
    return all(is_own_file(p.name) for p in path.iterdir())
