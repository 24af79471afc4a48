"""Settings: explicit arguments > NARRMEM_ environment (nested with ``__``) > TOML file > defaults.

Every model forbids unknown keys, so a misspelt key is an error that names it. Plugins keep
their own options in ``[plugin.<name>]`` tables and validate them with their own models
through :func:`plugin_options`.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from narrmem import logs
from narrmem.checks import MAX_JSON_DEPTH, folder_problem, json_text_too_deep
from narrmem.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def share(default: float, description: str) -> Any:
    """A setting that is a share, from 0 to 1."""
    return Field(default=default, ge=0.0, le=1.0, description=description)


def similarity(default: float, description: str) -> Any:
    """A setting that is a cosine similarity, from -1 to 1."""
    return Field(default=default, ge=-1.0, le=1.0, description=description)


ENV_PREFIX = "NARRMEM_"
log = logs.logger("narrmem.config")


# Every text setting is bounded: besides refusing absurd values, a bound makes pydantic check that
# the text is valid Unicode (a NARRMEM_ variable made of undecodable bytes holds lone surrogates,
# which crash pydantic's own error report when a validator quotes them).
MAX_SETTING_CHARS = 4096


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", str_max_length=MAX_SETTING_CHARS)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1: `batch_size = true` was a batch of one. A number from the
        # environment arrives as text ("5") and is still read, so strict mode is not the answer.
        annotation = cls.model_fields[info.field_name or ""].annotation
        if annotation in _NUMBERS and isinstance(value, bool):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        if annotation in _NUMBER_TABLES and isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, bool):
                    raise ValueError(f"the value of '{key}' must be a number, not {str(item).lower()}")
        return value


_NUMBERS: tuple[Any, ...] = (int, float, int | None, float | None)
_NUMBER_TABLES: tuple[Any, ...] = (dict[str, float], dict[str, int])


def folder_setting(path: str | None) -> str | None:
    """``path`` if it can name a folder (see :func:`narrmem.checks.folder_problem`)."""
    problem = None if path is None else folder_problem(path)
    if problem is not None:
        raise ValueError(problem)
    return path


# Files SQLite and narrmem keep beside the database file.
DATABASE_COMPANIONS = ("", "-wal", "-shm", "-journal", ".lock")


def data_folder_entry(name: str) -> str:
    """``name`` if it is a plain name inside the data folder: narrmem writes only where it
    created, so a setting cannot point it at a path outside the folder or at the folder itself."""
    if not name or not name.strip():
        raise ValueError("must be a file or folder name inside the data folder, not empty")
    if "\x00" in name or "/" in name or "\\" in name or name in {".", ".."}:
        raise ValueError(f"'{name}' must be a plain name inside the data folder (no path)")
    return name


# When ingest answers: after the after-store hooks, once written, or on receipt (see StorageSettings).
Acknowledge = Literal["after_hooks", "after_write", "on_receipt"]


class StorageSettings(_Section):
    backend: str = Field(default="sqlite", description="name of a registered store")
    database: str = Field(default="narrmem.sqlite3", description="file name inside the data folder")
    index: str = Field(default="vectors", description="vector index folder inside the data folder")

    @field_validator("database", "index")
    @classmethod
    def _inside_data_folder(cls, name: str) -> str:
        return data_folder_entry(name)

    @model_validator(mode="after")
    def _no_collision(self) -> StorageSettings:
        # The index folder named like the database (or its WAL, lock, ...) would put one on top of
        # the other; case-folded, since some file systems do too.
        taken = {self.database + suffix for suffix in DATABASE_COMPANIONS}
        if self.index.casefold() in {name.casefold() for name in taken}:
            raise ValueError(
                f"storage.index '{self.index}' collides with the database file '{self.database}' "
                "or its companion files: give them different names"
            )
        return self

    dsn: SecretStr | None = Field(
        default=None,
        description="postgres backend: the server to use (postgresql://user:password@host/db); "
        "secret, so a dump or repr of the settings never shows the password",
    )
    busy_timeout_ms: int = Field(default=5000, ge=0, le=600_000)
    timeout_s: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="postgres backend: how long a call waits for its turn to write, for one "
        "statement or for a connection; past it the call fails with "
        "StoreUnavailableError (503 over HTTP) rather than wait on a server that stalls. An "
        "import's index builds, VACUUM and the schema's setup at open have no such limit",
    )
    keyword_index: Literal["auto", "fts5", "tantivy"] = Field(
        default="auto",
        description="sqlite backend: what keyword search runs on. 'auto': FTS5 until a user has "
        "keyword_threshold memories, then a tantivy index kept beside it (it stops early, so a "
        "large user's search stays bounded); 'tantivy': that index from the start; 'fts5': FTS5 alone",
    )
    keyword_threshold: int = Field(
        default=10_000,
        ge=1,
        le=100_000_000,
        description="keyword_index = 'auto': one user's memories from which keyword search runs on tantivy",
    )
    batch_size: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="messages per write transaction (the first and last batches of a call are smaller)",
    )
    acknowledge: Acknowledge = Field(
        default="after_hooks",
        description="when ingest returns: once the after-store hooks (counts, facts, triggers) have "
        "run; once the message is written, the hooks running afterwards (recorded with the write, "
        "so a process that stops first has them run at the next open); or, for a call of up to 8 "
        "messages, once it is triaged and kept in the store as it came, before its embedding (it "
        "is written a moment later, by the next open if the process stops first)",
    )
    hnsw_threshold: int = Field(
        default=10_000, ge=2, le=100_000_000, description="a user's vectors searched by HNSW from this many"
    )
    hnsw_m: int = Field(default=32, ge=4, le=128, description="HNSW links per node")
    hnsw_ef_construction: int = Field(default=200, ge=8, le=2048)
    hnsw_ef_search: int = Field(default=256, ge=8, le=4096, description="HNSW candidates kept per search")
    hnsw_rebuild_ratio: float = Field(
        default=0.2, gt=0.0, le=1.0, description="rebuild a graph when this share of it is deleted"
    )
    forget_rewrites_file: bool = Field(
        default=True,
        description="sqlite backend: a user's or chat's forget ends by rewriting the database file "
        "(VACUUM), the only way to leave no stale copy of their words in the file's pages; it takes "
        "time in proportion to the store. false: faster forgets, stale copies possible",
    )
    max_ts_ahead_s: float = Field(
        default=86_400.0,
        ge=0.0,
        le=10 * 365 * 86_400.0,
        description="a message dated more than this many seconds past the clock's now is refused "
        "(an InputError naming ts): a device clock far ahead skewed counts and held triggers back",
    )
    history_kept_per_memory: int = Field(
        default=100,
        ge=0,
        le=1_000_000,
        description="importance history rows kept per memory, the newest (each reinforcement and "
        "decay step writes one; a memory used daily gained one a day for good); 0: every row",
    )
    forget_marks_kept_s: float = Field(
        default=7 * 86_400.0,
        ge=0.0,
        le=366 * 86_400.0,
        description="a forget leaves, this long, a keyed hash of what it forgot (the person, chat or "
        "message ids) and its time, so that a write of them made before it and arriving late (a "
        "bot's backlog in another process) is not stored; a backlog's write waiting longer is "
        "dropped. 0: no marks, and late writes are stored",
    )
    purge_deleted_messages_after_s: float = Field(
        default=300.0,
        ge=0.0,
        le=86_400.0,
        description="a deleted message's words (forget_messages, an edit's old text) stay in the "
        "keyword index's pages, and on SQLite a deleted memory's vector in the vector index's files, "
        "until a purge; one runs this many seconds after the first delete since the last purge "
        "(or since the end of the one running when it was made), and on close (a user's or "
        "chat's forget purges at once)",
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
    quantize: Literal["auto", "none", "int7", "int8"] = Field(
        default="auto",
        description="onnx backend: 'int7' (integer weights in 7 bits) is faster and its vectors differ "
        "slightly from float32's, the same on every CPU; 'int8' (8-bit weights, the default of stores "
        "written before int7) gives slightly different vectors on CPUs without AVX-512 VNNI; 'none' is "
        "float32 (the sentence-transformers backend's vectors); 'auto' writes a new store with int7 "
        "and keeps an existing store to the vectors it holds",
    )
    threads: int = Field(default=1, ge=1, le=256, description="CPU threads for the model")
    runs_in: Literal["auto", "process", "thread"] = Field(
        default="auto",
        description="where the built-in backends run the model: 'process', a child process of its own "
        "(it never waits on the interpreter lock the event loop holds: faster imports); 'thread', a "
        "thread of this process (one process, less memory); 'auto', a process on a POSIX system with "
        "two or more usable CPUs, else a thread (and a thread for the CLI's one-shot commands, which "
        "start faster so)",
    )
    batch_size: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="texts per model run: on a CPU one at a time is as fast as batching (no padding) "
        "and keeps int8 vectors independent of the texts beside them; raise it on a GPU",
    )
    device: Literal["cpu", "cuda", "mps"] = "cpu"

    @field_validator("model_path", "cache_dir")
    @classmethod
    def _a_folder(cls, path: str | None) -> str | None:
        return folder_setting(path)


class RecallSettings(_Section):
    min_similarity: float = similarity(
        0.2,
        "relevance floor: a hit needs this cosine similarity to the query (or a keyword match)",
    )
    min_keyword_share: float = share(
        0.5,
        "a hit containing this share of the query's content words is relevant whatever its "
        "similarity (0 turns keyword rescue off)",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="fusion weight per recall source (name -> weight >= 0); a source not named keeps "
        "its plugin's default (vector 0.45, keyword 1.0), any other source 1.0",
    )

    @field_validator("weights")
    @classmethod
    def _weights_are_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        for name, weight in weights.items():
            if not 0 <= weight <= 100:
                raise ValueError(f"the weight of '{name}' must be between 0 and 100")
        return weights


class PluginsSettings(_Section):
    disabled: list[str] = Field(default_factory=list, description="plugin names to block")
    load_entrypoints: bool = Field(default=True, description="load third-party plugins")


class McpSettings(_Section):
    tools: list[str] = Field(
        default_factory=lambda: ["all"],
        description="what `narrmem mcp` serves: tool groups (all, core, graph, tasks, persona, narrative, "
        "rtm, other) and tool names; each listed tool's schema costs the client tokens on every request",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        toml_file=None,
        str_max_length=MAX_SETTING_CHARS,
    )

    data_dir: str = Field(default="narrmem-data", description="folder of the embedded store")

    @field_validator("data_dir")
    @classmethod
    def _a_folder(cls, data_dir: str) -> str:
        folder_setting(data_dir)
        return data_dir

    storage: StorageSettings = Field(default_factory=StorageSettings)
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)
    recall: RecallSettings = Field(default_factory=RecallSettings)
    plugins: PluginsSettings = Field(default_factory=PluginsSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
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
        return (init_settings, _SettingsEnvironment(settings_cls), TomlConfigSettingsSource(settings_cls))


class _SettingsEnvironment(EnvSettingsSource):
    """The environment as pydantic-settings reads it, less every variable that is not a setting in
    the documented form (see :func:`environment_setting`): those are warned about, never read."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {
            key: value
            for key, value in super()._load_env_vars().items()
            if not key.upper().startswith(ENV_PREFIX) or environment_setting(key) is None
        }


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Read settings from ``config_file`` (TOML), the environment and ``overrides``."""
    if config_file is not None and not isinstance(config_file, str | os.PathLike):
        raise ConfigError(f"config file: must be a path, not {type(config_file).__name__}")
    if config_file is not None:
        _check_config_file(Path(config_file))

    class _FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=str(config_file) if config_file else None)

    _check_environment()
    try:
        return _FileSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, config_file)) from exc
    except SettingsError as exc:  # a NARRMEM_ variable that should hold JSON and does not
        raise ConfigError(_describe_environment(exc)) from exc


def _check_config_file(path: Path) -> None:
    """Read the file once before pydantic-settings does, so that every way it can be wrong is an
    error naming it."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    # tomllib parses arrays and inline tables recursively: a deep enough file exhausts the stack.
    if _toml_too_deep(text):
        raise ConfigError(f"config file {path} nests arrays or tables deeper than {MAX_JSON_DEPTH} levels")
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


_TOML_NOT_NESTING = re.compile(
    r'''"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|'[^'\n]*'|#[^\n]*'''
)


def _toml_too_deep(text: str) -> bool:
    """Brackets nested deeper than the JSON limit outside strings and comments (a table header
    counts one level)."""
    return json_text_too_deep(_TOML_NOT_NESTING.sub("", text))


# narrmem's own variables that are no setting (its test suite's long variants): set, they are
# no typo, and warned of at every start they would be noise.
NOT_SETTINGS = frozenset({"NARRMEM_LONG_TESTS", "NARRMEM_RELIABILITY_LONG"})


def environment_setting(name: str) -> str | None:
    """Why ``name`` (a ``NARRMEM_`` variable) is not read as a setting, or ``None`` if it is one.

    The documented forms only: ``NARRMEM_<SETTING>`` for a top-level value (``NARRMEM_DATA_DIR``),
    ``NARRMEM_<SECTION>__<KEY>`` for a key of a section (``NARRMEM_EMBEDDER__THREADS``), and
    ``NARRMEM_PLUGIN__<NAME>__<KEY>`` for a plugin's option. A whole section as one JSON value
    (``NARRMEM_STORAGE='{...}'``) is not one of them."""
    if name in NOT_SETTINGS:
        return None
    parts = name[len(ENV_PREFIX) :].lower().split("__")
    top, fields = parts[0], Settings.model_fields
    if top not in fields:
        near = difflib.get_close_matches(top, fields, n=1)
        return f"not a setting{f' (did you mean {ENV_PREFIX}{near[0].upper()}?)' if near else ''}"
    section = fields[top].annotation
    if top == "plugin":
        ok = len(parts) == 3 and all(parts[1:])
        return None if ok else f"plugin options are set as {ENV_PREFIX}PLUGIN__<NAME>__<KEY>"
    if not (isinstance(section, type) and issubclass(section, BaseModel)):
        return None if len(parts) == 1 else f"{top} has no keys: set {ENV_PREFIX}{top.upper()}"
    if len(parts) < 2:
        return f"set one key at a time: {ENV_PREFIX}{top.upper()}__<KEY>"
    if parts[1] not in section.model_fields:
        near = difflib.get_close_matches(parts[1], section.model_fields, n=1)
        hint = f" (did you mean {ENV_PREFIX}{top.upper()}__{near[0].upper()}?)" if near else ""
        return f"{top} has no key '{parts[1]}'{hint}"
    if len(parts) > 2:
        # pydantic-settings would go on into the key (a table's entry, or a number's that failed
        # with a message naming no variable): one key is set whole.
        return f"a key is set whole: {ENV_PREFIX}{top.upper()}__{parts[1].upper()} (a table as JSON)"
    return None


def _check_environment() -> None:
    """Warn about ``NARRMEM_`` variables that are not settings (they are not read: a variable of
    someone's own script with our prefix must not stop narrmem), and refuse a hostile value."""
    for key, value in os.environ.items():
        if not key.upper().startswith(ENV_PREFIX):
            continue
        why = environment_setting(key)
        if why is not None:
            log.warning("environment variable %s is not read: %s", key, why)
        # pydantic-settings decodes JSON values recursively: refuse a hostile one first.
        elif json_text_too_deep(value):
            raise ConfigError(f"environment variable {key}: nested deeper than {MAX_JSON_DEPTH} levels")


def _describe_environment(exc: SettingsError) -> str:
    found = re.search(r'field "([^"]+)"', str(exc))
    name = found.group(1) if found else ""
    keys = sorted(k for k in os.environ if name and k.startswith(f"{ENV_PREFIX}{name.upper()}"))
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    where = ", ".join(keys) or ENV_PREFIX + "*"
    return f"environment variable {where}: not valid JSON for setting '{name}'{cause}"


def plugin_options(settings: Settings, name: str, model: type[M]) -> M:
    """Validate the ``[plugin.<name>]`` table with the plugin's own model (unknown keys are errors;
    a boolean is not a number, as in narrmem's own sections)."""
    table = settings.plugin.get(name, {})
    boolean = _boolean_for_a_number(model, table, f"plugin.{name}.")
    if boolean is not None:
        raise ConfigError(f"invalid settings: {boolean}: must be a number, not a boolean")
    try:
        return model.model_validate(table)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, None, prefix=f"plugin.{name}.")) from exc


def _boolean_for_a_number(model: type[BaseModel], table: object, prefix: str) -> str | None:
    """The first setting of ``table`` that gives a boolean where ``model`` wants a number (pydantic
    reads true as 1), looking into the tables of nested models."""
    if not isinstance(table, dict):
        return None
    for key, value in table.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        annotation = field.annotation
        if annotation in _NUMBERS and isinstance(value, bool):
            return f"{prefix}{key}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found = _boolean_for_a_number(annotation, value, f"{prefix}{key}.")
            if found is not None:
                return found
    return None


def _describe(exc: ValidationError, config_file: str | Path | None, prefix: str = "") -> str:
    source = f" (config file {config_file})" if config_file else ""
    parts = []
    for err in exc.errors(include_url=False):
        loc = prefix + ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "invalid settings" + source + ": " + "; ".join(parts)
