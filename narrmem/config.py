"""Settings: explicit arguments > NARRMEM_ environment (nested with ``__``) > TOML file > defaults.

Every model forbids unknown keys, so a misspelt key is an error that names it. Plugins keep
their own options in ``[plugin.<name>]`` tables and validate them with their own models
through :func:`plugin_options`.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from narrmem.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
ENV_PREFIX = "NARRMEM_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StorageSettings(_Section):
    backend: str = Field(default="sqlite", description="name of a registered store")
    database: str = Field(default="narrmem.sqlite3", description="file name inside the data folder")
    index: str = Field(default="vectors", description="vector index folder inside the data folder")
    busy_timeout_ms: int = Field(default=5000, ge=0, le=600_000)
    batch_size: int = Field(default=256, ge=1, le=100_000, description="messages per write transaction")
    hnsw_threshold: int = Field(
        default=10_000, ge=2, le=100_000_000, description="a user's vectors searched by HNSW from this many"
    )
    hnsw_m: int = Field(default=32, ge=4, le=128, description="HNSW links per node")
    hnsw_ef_construction: int = Field(default=200, ge=8, le=2048)
    hnsw_ef_search: int = Field(default=256, ge=8, le=4096, description="HNSW candidates kept per search")
    hnsw_rebuild_ratio: float = Field(
        default=0.2, gt=0.0, le=1.0, description="rebuild a graph when this share of it is deleted"
    )


class EmbedderSettings(_Section):
    backend: str = Field(default="onnx", description="name of a registered embedder")
    model_path: str | None = Field(
        default=None, description="a local model folder; default: the packaged one"
    )
    cache_dir: str | None = Field(
        default=None,
        description="where the onnx backend keeps its exported model; default: the user cache folder",
    )
    quantize: Literal["none", "int8"] = Field(
        default="none", description="onnx backend: int8 weights (faster, vectors differ slightly)"
    )
    threads: int = Field(default=1, ge=1, le=256, description="CPU threads for the model")
    batch_size: int = Field(default=64, ge=1, le=4096)
    device: Literal["cpu", "cuda", "mps"] = "cpu"


class PluginsSettings(_Section):
    disabled: list[str] = Field(default_factory=list, description="plugin names to block")
    load_entrypoints: bool = Field(default=True, description="load third-party plugins")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        toml_file=None,
    )

    data_dir: str = Field(default="narrmem-data", description="folder of the embedded store")
    storage: StorageSettings = Field(default_factory=StorageSettings)
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)
    plugins: PluginsSettings = Field(default_factory=PluginsSettings)
    plugin: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-plugin option tables, validated by each plugin"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Read settings from ``config_file`` (TOML), the environment and ``overrides``."""
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            with path.open("rb") as fh:
                tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc

    class _FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=str(config_file) if config_file else None)

    _reject_unknown_environment()
    try:
        return _FileSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, config_file)) from exc


def _reject_unknown_environment() -> None:
    known = {name.upper() for name in Settings.model_fields}
    for key in os.environ:
        if key.startswith(ENV_PREFIX):
            top = key[len(ENV_PREFIX) :].split("__", 1)[0]
            if top not in known:
                raise ConfigError(f"environment variable {key}: unknown setting '{top.lower()}'")


def plugin_options(settings: Settings, name: str, model: type[M]) -> M:
    """Validate the ``[plugin.<name>]`` table with the plugin's own model (unknown keys are errors)."""
    try:
        return model.model_validate(settings.plugin.get(name, {}))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, None, prefix=f"plugin.{name}.")) from exc


def _describe(exc: ValidationError, config_file: str | Path | None, prefix: str = "") -> str:
    source = f" (config file {config_file})" if config_file else ""
    parts = []
    for err in exc.errors(include_url=False):
        loc = prefix + ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "invalid settings" + source + ": " + "; ".join(parts)
