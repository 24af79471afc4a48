"""The exported model at work: the onnxruntime session and the tokenizer, texts to unit-length rows.

Apart from the ``onnx`` embedder's plugin module because the model's own process
(``[embedder] runs_in``) loads this and nothing of narrmem's: it imports numpy here, and
onnxruntime and tokenizers when the model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length in sentence-transformers


@dataclass(frozen=True)
class OnnxModelFiles:
    """What running the exported model takes; picklable, so the model's own process
    (``embedder.process``) loads it from this."""

    model_file: str
    tokenizer_file: str
    threads: int
    batch_size: int
    dim: int

    def load(self) -> Callable[[list[str]], np.ndarray]:
        return OnnxRunner(self).encode


class OnnxRunner:
    """The loaded onnxruntime session and tokenizer: texts to unit-length rows."""

    def __init__(self, files: OnnxModelFiles) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = files.threads
        options.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(
                files.model_file, options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's own errors: a damaged file (a disk fault, a copy cut short)
            raise ValueError(
                f"the model file {files.model_file} cannot be loaded ({exc}); it is a cached copy: "
                "delete it, and the next start makes it again"
            ) from exc
        tokenizer = Tokenizer.from_file(files.tokenizer_file)
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.batch_size = files.batch_size
        self.dim = files.dim

    def encode(self, texts: list[str]) -> np.ndarray:
        # One text at a time: ``encode_batch`` lets go of the interpreter lock around its work, and
        # taking it back waits for whatever Python runs beside the model (up to the switch
        # interval, 5 ms) once per call; ``encode`` keeps it, so a text waits once, after the run.
        encoded = [self.tokenizer.encode(text) for text in texts]
        # Batches of similar length waste little on padding (sentence-transformers sorts too).
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            out[batch] = self._run([encoded[i] for i in batch])
        return out

    def _run(self, encoded: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encoded)
        feeds = {name: np.zeros((len(encoded), width), dtype=np.int64) for name in INPUTS}
        for row, item in enumerate(encoded):
            n = len(item.ids)
            feeds["input_ids"][row, :n] = item.ids
            feeds["attention_mask"][row, :n] = item.attention_mask
            feeds["token_type_ids"][row, :n] = item.type_ids
        [hidden] = self.session.run(None, feeds)
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        normed: np.ndarray = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return normed
