"""The ``onnx`` embedder: all-MiniLM-L6-v2 exported once to ONNX and run with onnxruntime and the
fast ``tokenizers`` tokenizer; same pooling (attention-masked mean) and normalization as
sentence-transformers, so its vectors equal the default backend's (tested: cosine >= 0.9999) and a
store can switch between them.

The export needs torch once; the file is cached in the data folder under the model's hash, and
later opens load only onnxruntime and tokenizers (no torch import). Install with
``pip install "narrmem[onnx]"`` and set ``[embedder] backend = "onnx"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from narrmem import hookimpl
from narrmem.config import Settings
from narrmem.embed import resolve_model

MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length in sentence-transformers
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class OnnxEmbedder:
    dim = 384

    def __init__(
        self, model_path: str | None, cache_dir: Path, *, threads: int = 1, batch_size: int = 64
    ) -> None:
        # The same name as the sentence-transformers backend: the vectors are the same.
        self.model_path, self.name = resolve_model(model_path)
        self.cache_dir = cache_dir
        self.threads = threads
        self.batch_size = batch_size
        self._session: Any = None
        self._tokenizer: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-onnx")

    def model_file(self) -> Path:
        weights = Path(self.model_path) / "model.safetensors"
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.exists() else "unknown"
        return self.cache_dir / "onnx" / f"{self.name}-{digest}.onnx"

    async def start(self) -> None:
        if self._session is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        path = self.model_file()
        if not path.exists():
            export(self.model_path, path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(Path(self.model_path) / "tokenizer.json"))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding()
        self._tokenizer = tokenizer

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self._session is None:
            self._load()
        parts = []
        for start in range(0, len(texts), self.batch_size):
            encoded = self._tokenizer.encode_batch(texts[start : start + self.batch_size])
            feeds = {
                "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
            }
            [hidden] = self._session.run(None, feeds)
            mask = feeds["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
            parts.append(pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None))
        return np.ascontiguousarray(np.vstack(parts), dtype=np.float32)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._encode, list(texts))

    async def close(self) -> None:
        self._executor.shutdown(wait=True)


def export(model_path: str, target: Path) -> None:
    """Export the transformer to ONNX (torch, once); written beside and renamed, so a crash never
    leaves half a file under the cached name."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_path, local_files_only=True).eval()

    class LastHiddenState(torch.nn.Module):
        """Keyword arguments in, one tensor out: what the exporter can trace."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    sample = tuple(torch.ones((2, 8), dtype=torch.long) for _ in INPUTS)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with torch.no_grad():
        torch.onnx.export(
            LastHiddenState(model),
            sample,
            str(partial),
            input_names=list(INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes={name: {0: "batch", 1: "tokens"} for name in (*INPUTS, "last_hidden_state")},
            opset_version=17,
            dynamo=False,
        )
    os.replace(partial, target)


@hookimpl
def narrmem_register_embedders(register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
    def factory(settings: Settings) -> OnnxEmbedder:
        options = settings.embedder
        return OnnxEmbedder(
            options.model_path,
            Path(settings.data_dir),
            threads=options.threads,
            batch_size=options.batch_size,
        )

    register("onnx", factory)
