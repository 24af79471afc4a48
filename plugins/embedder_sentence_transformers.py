"""Registers the default embedder: all-MiniLM-L6-v2 through sentence-transformers, offline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narrmem import hookimpl
from narrmem.config import Settings
from narrmem.embed import SentenceTransformerEmbedder
from narrmem.errors import ConfigError


@hookimpl
def narrmem_register_embedders(register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
    def factory(settings: Settings) -> SentenceTransformerEmbedder:
        options = settings.embedder
        # "auto" is float32 here: these weights are the only ones this backend runs.
        if options.quantize in ("int7", "int8"):
            raise ConfigError(f'embedder.quantize: {options.quantize} needs backend = "onnx"')
        return SentenceTransformerEmbedder(
            options.model_path,
            threads=options.threads,
            batch_size=options.batch_size,
            device=options.device,
            runs_in=options.runs_in,
        )

    register("sentence-transformers", factory)
