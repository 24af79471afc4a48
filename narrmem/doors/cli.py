"""The ``narrmem`` command. Exit codes: 0 success, 2 bad usage or bad input, 1 internal error."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from narrmem import __version__
from narrmem.checks import folder_problem
from narrmem.config import Settings, load_settings
from narrmem.doors.server.commands import SERVER_COMMANDS, add_server_commands
from narrmem.errors import ConfigError, InputError, NarrmemError, StoreError, StoreUnavailableError

Handler = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", metavar="DIR", help="data folder (default: settings' data_dir)")
    common.add_argument("--config", metavar="FILE", help="TOML config file")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    parser = argparse.ArgumentParser(prog="narrmem", description="Memory middleware for chatbots.")
    parser.add_argument("--version", action="version", version=f"narrmem {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what plugins do")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_input_commands(sub, common, as_json)
    _add_read_commands(sub, common, as_json)
    _add_store_commands(sub, common, as_json)
    _add_rtm_command(sub, common, as_json)
    _add_serving_commands(sub, common)
    return parser


Parents = argparse.ArgumentParser
Subparsers = Any  # argparse's _SubParsersAction is private


def _add_input_commands(sub: Subparsers, common: Parents, as_json: Parents) -> None:
    """What puts messages into memory: the demo, JSONL ingest, chat exports, dry-run triage."""
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="what narrmem does with a sample chat: scenes, graph facts, triggers, recall, fading "
        "(in a temporary folder, or a new --data folder)",
    )
    demo.add_argument("--k", type=int, default=2, help="hits per question")

    ingest = sub.add_parser("ingest", parents=[common, as_json], help="ingest a JSONL file of messages")
    ingest.add_argument("file", help="JSONL: text, user_id, chat_id, ts, message_id[, tenant, speaker, meta]")

    chat = sub.add_parser(
        "import-chat", parents=[common, as_json], help="ingest a Telegram or Discord chat export"
    )
    chat.add_argument("file", help="Telegram Desktop result.json, DiscordChatExporter JSON, or narrmem JSONL")
    chat.add_argument("--format", required=True, choices=["telegram", "discord", "jsonl"])
    chat.add_argument("--user-map", metavar="FILE", help="JSON object: platform user id -> narrmem user id")
    chat.add_argument(
        "--tenant", help="default: 'default' for telegram, 'discord:<guild id>' for discord (not for jsonl)"
    )
    chat.add_argument(
        "--keep-bots", action="store_true", help="keep bots' messages (skipped by default, as live bots do)"
    )
    chat.add_argument(
        "--as-bot",
        action="store_true",
        help="the ids the bot integrations use (Telegram: Bot API chat and user ids; Discord: the "
        "server as the tenant, the channel as the chat), so the live bot recalls the history",
    )
    chat.add_argument(
        "--keep-forwards",
        action="store_true",
        help="keep forwarded messages, stored as the forwarder's (skipped by default, as live bots do)",
    )

    triage = sub.add_parser(
        "triage", parents=[common, as_json], help="classify messages without storing anything (dry run)"
    )
    triage.add_argument("text", nargs="?", help="one message")
    triage.add_argument("--file", help="JSONL with a 'text' on each line (other message fields optional)")


def _add_read_commands(sub: Subparsers, common: Parents, as_json: Parents) -> None:
    """Inspection: it reads beside a running bot and changes nothing."""
    recall = sub.add_parser("recall", parents=[common, as_json], help="recall memories for a query")
    recall.add_argument("query")
    recall.add_argument("--user", help="user id (user scope)")
    recall.add_argument("--chat", help="chat id (chat scope)")
    recall.add_argument(
        "--tenant",
        default="default",
        help="the person's tenant (default: 'default'; the bot libraries use a Discord server's id, "
        "'telegram' for Telegram)",
    )
    recall.add_argument("--k", type=int, default=5)
    recall.add_argument("--explain", action="store_true", help="print why each hit ranked")
    recall.add_argument(
        "--reinforce", action="store_true", help="reinforce what is used, as the bot's recall does"
    )

    sub.add_parser("stats", parents=[common, as_json], help="what is stored")
    history = sub.add_parser("history", parents=[common, as_json], help="a memory's importance over time")
    history.add_argument("memory_id", type=int)
    export = sub.add_parser(
        "export",
        parents=[common, as_json],
        help="export the whole store to JSONL (graph, trees, history too), or with --user one person's",
    )
    export.add_argument("file", help="the file to write ('-' writes standard output)")
    export.add_argument(
        "--user", help="one person's own export: everything narrmem holds of them (not for import)"
    )
    export.add_argument("--tenant", help="the person's tenant (with --user; default: 'default')")


def _add_store_commands(sub: Subparsers, common: Parents, as_json: Parents) -> None:
    """What changes the store as a whole: decay, import, forget, migration."""
    decay = sub.add_parser("decay", parents=[common, as_json], help="run the decay pass and report counts")
    decay.add_argument("--now", help="ISO-8601 time with timezone (default: now)")

    keep = sub.add_parser(
        "retention",
        parents=[common, as_json],
        help="forget the people who have said nothing for a while (--dry-run lists them)",
    )
    keep.add_argument(
        "--days",
        type=float,
        help="nothing said for this many days (default: [plugin.retention] inactive_days)",
    )
    keep.add_argument("--before", help="or nothing said since this ISO-8601 time with timezone")
    keep.add_argument("--tenant", help="only this tenant's people (default: every tenant)")
    keep.add_argument("--dry-run", action="store_true", help="list who would be forgotten; change nothing")
    keep.add_argument(
        "--force", action="store_true", help="forget even when no one at all has spoken since (see the docs)"
    )

    imp = sub.add_parser("import", parents=[common, as_json], help="import a JSONL export")
    imp.add_argument("file")
    forget = sub.add_parser("forget", parents=[common, as_json], help="delete every trace of a user or chat")
    forget.add_argument("--user")
    forget.add_argument("--chat")
    forget.add_argument("--tenant", default="default")
    owed = sub.add_parser(
        "owed-forgets",
        parents=[common, as_json],
        help="forgets waiting for plugins not loaded; --drop one gone for good",
    )
    owed.add_argument(
        "--drop", metavar="PLUGIN", help="a plugin removed for good: forgets wait for it no more"
    )
    move = sub.add_parser(
        "migrate", parents=[common, as_json], help="copy a memory between a data folder and PostgreSQL"
    )
    move.add_argument("--from", dest="source", required=True, metavar="DATA_DIR|DSN")
    move.add_argument("--to", dest="target", required=True, metavar="DATA_DIR|DSN")
    move.add_argument("--queries", type=int, default=20, help="recalls compared at the end (0: none)")
    move.add_argument(
        "--reembed",
        action="store_true",
        help="make every vector again with the target's model (move a memory to another model)",
    )
    move.add_argument(
        "--to-config",
        metavar="FILE",
        help="TOML config file the target is opened with (its [embedder]: the model re-embedded to)",
    )


def _add_rtm_command(sub: Subparsers, common: Parents, as_json: Parents) -> None:
    rtm = sub.add_parser(
        "rtm", parents=[common, as_json], help="RTM narrative trees: build, traverse, ensemble, depth"
    )
    rtm.add_argument("action", choices=["build", "traverse", "ensemble", "depth"])
    rtm.add_argument("file", help="the narrative, UTF-8 text ('-' reads standard input)")
    rtm.add_argument("--title", help="the narrative's title (default: the file name without extension)")
    rtm.add_argument("--tenant", default="default")
    rtm.add_argument("--k", type=int, help="maxBranchingFactor K, 2..10 (default 4)")
    rtm.add_argument("--max-depth", type=int, help="maxRecallDepth D, 1..12 (default: suggested)")
    rtm.add_argument("--partition", choices=["semantic", "random"], help="build, traverse, depth")
    rtm.add_argument("--seed", type=int, help="seed of the random partition / ensemble")
    rtm.add_argument("--type", default="story", help="build: story, conversation, essay, ...")
    rtm.add_argument("--level", type=int, default=1, help="traverse: traversalDepth (1 = most abstract)")
    rtm.add_argument("--target", type=int, help="depth: targetRecallLength")
    rtm.add_argument("--trees", type=int, default=200, help="ensemble: ensembleSize")


def _add_serving_commands(sub: Subparsers, common: Parents) -> None:
    """Memory for other programs: MCP, and tool schemas for function calling."""
    tool_choice = argparse.ArgumentParser(add_help=False)
    tool_choice.add_argument(
        "--tools",
        metavar="GROUP|TOOL,...",
        help="serve only these tool groups (all, core, graph, tasks, persona, narrative, rtm, other) or "
        "tools, comma-separated (default: [mcp] tools, else all)",
    )
    serve = sub.add_parser(
        "mcp", parents=[common, tool_choice], help="serve the tools over MCP (stdio, or HTTP)"
    )
    serve.add_argument(
        "--http", metavar="[HOST:]PORT", help="streamable HTTP instead of stdio (host 127.0.0.1)"
    )
    serve.add_argument("--tenant", default="default", help="the one tenant this server serves")
    serve.add_argument(
        "--read-only",
        action="store_true",
        help="open the store read-only, beside the process that writes it (a running bot on the "
        "SQLite default): reads answer, with what it writes meanwhile; every write is a tool error",
    )

    tools = sub.add_parser(
        "tools", parents=[common, tool_choice], help="print the tool schemas for function calling"
    )
    tools.add_argument("--format", choices=["openai", "anthropic", "mcp"], default="openai")
    add_server_commands(sub, common)  # serve (HTTP API and inspector), keys


def one_line(text: str) -> str:
    """An error message as one line: a value it quotes (a backend's name from a config file, say)
    may hold line breaks or other control characters, shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# The store could not be reached (its server down or not answering): sysexits' EX_TEMPFAIL, which
# a script or a job scheduler reads as "try again later", unlike 2 (a refusal that will not change).
EXIT_TRY_AGAIN = 75


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    if args.command == "forget" and not (args.user or args.chat):
        parser.error("forget needs --user or --chat")
    if args.command == "recall" and not (args.user or args.chat):
        parser.error("recall needs --user or --chat")
    if args.command == "rtm" and args.action == "depth" and args.target is None:
        parser.error("rtm depth needs --target")
    if args.command == "triage" and (args.text is None) == (args.file is None):
        parser.error("triage needs TEXT or --file (one of them)")
    try:
        settings = load_settings(args.config)
        if args.data is not None:
            # Checked as the setting is ("" or " " silently meant the default folder, or a folder
            # named " ").
            problem = folder_problem(args.data)
            if problem is not None:
                raise ConfigError(f"--data: {problem}")
            settings = settings.model_copy(update={"data_dir": args.data})
        return asyncio.run(
            COMMANDS[args.command](args, settings.model_copy(update=_where_model_runs(args, settings)))
        )
    except StoreUnavailableError as exc:
        print(f"narrmem: error: {one_line(str(exc))} (try again later)", file=sys.stderr)
        return EXIT_TRY_AGAIN
    except NarrmemError as exc:
        print(f"narrmem: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])
        if extra is not None:
            print(
                f"narrmem: error: `narrmem {args.command}` needs {exc.name}, which this install does not "
                f"have: pip install 'narrmem[{extra}]'",
                file=sys.stderr,
            )
            return 2
        if exc.name not in MODEL_EXPORT_MODULES:
            raise
        print(
            f"narrmem: error: the sentence-transformers embedder needs {exc.name}: pip install "
            "'narrmem[torch]' (the CPU build: add --extra-index-url "
            "https://download.pytorch.org/whl/cpu), or use the default onnx backend, which needs no torch",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:
        # The reader of the output has gone (`narrmem history 1 | head -1`): not narrmem's error.
        # Standard output goes nowhere from here, or its flush at exit says the same again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        logging.getLogger("narrmem").debug("internal error", exc_info=exc)
        print(f"narrmem: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


# Commands that embed in bulk or serve for long: worth the model's own process. The others answer
# once and exit, and start faster with the model on a thread.
LONG_COMMANDS = frozenset({"ingest", "import-chat", "import", "migrate", "mcp", "serve"})


def _where_model_runs(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """``runs_in = "auto"`` keeps a one-shot command's model on a thread (see ``LONG_COMMANDS``)."""
    if settings.embedder.runs_in != "auto" or args.command in LONG_COMMANDS:
        return {}
    return {"embedder": settings.embedder.model_copy(update={"runs_in": "thread"})}


# What the sentence-transformers embedder imports (``narrmem[torch]`` installs them).
MODEL_EXPORT_MODULES = frozenset({"torch", "transformers", "sentence_transformers"})
# The optional extras' packages (pyproject.toml): a command that needs one names the extra.
EXTRA_OF_MODULE = {
    "fastapi": "server",
    "uvicorn": "server",
    "starlette": "server",
    "httpx": "server",
    "mcp": "mcp",
    "asyncpg": "postgres",
    "pgvector": "postgres",
}


def _existing_store(settings: Settings) -> Settings:
    """A read command (and a forget or a decay pass) never creates a store: a data folder without
    one is an error, found before the model loads."""
    from narrmem.errors import StoreError

    if not _store_exists(settings):
        raise StoreError(f"no narrmem store at {settings.data_dir}")
    return settings


def _store_exists(settings: Settings) -> bool:
    """Whether the embedded store is there (a PostgreSQL store is taken to be). Anything at the
    database's name counts: the store's own checks name what is wrong with it."""
    import os
    from pathlib import Path

    database = Path(settings.data_dir) / settings.storage.database
    return settings.storage.backend != "sqlite" or os.path.lexists(database)


def _open(
    settings: Settings, *, warm: bool = True, read_only: bool = False, new_store_model: str | None = None
) -> Any:
    """``read_only``: inspection commands read beside a running bot (which holds the folder's lock)
    and change nothing, not even importance."""
    from narrmem.memory import Memory  # keeps `narrmem --help` light

    return Memory.open(settings=settings, warm=warm, read_only=read_only, new_store_model=new_store_model)


def _print_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from narrmem.doors.demo import demo

    await demo(settings, sys.stdout, k=args.k, folder=args.data)
    return 0


async def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    from tqdm import tqdm

    from narrmem.doors.chat_import import ChatImport

    # Read through and checked before the store is touched, then stored part by part as it is
    # read again: a file of millions of lines is never held whole.
    lines = ChatImport(args.file, "jsonl", keep_bots=True)
    lines.check()
    async with _open(settings) as memory:
        # The whole file, before its first part is written (each part checks only itself).
        lines.check_not_ahead(memory.clock.now(), settings.storage.max_ts_ahead_s)
        with tqdm(total=lines.messages, unit="msg", desc="ingest", file=sys.stderr, disable=None) as bar:
            parts = ([message for message, _ in part] for part in lines.parts(IMPORT_PART))
            counts = await _ingest_in_parts(memory, parts, bar.update)
    summary = {
        key: counts[key] for key in ("messages", "stored", "ignored", "duplicates", "said_before_a_forget")
    }
    if args.json:
        _print_json(summary)
    else:
        print(", ".join(f"{k} {v}" for k, v in summary.items()))
    return 0


async def cmd_import_chat(args: argparse.Namespace, settings: Settings) -> int:
    """``narrmem import-chat FILE --format telegram|discord|jsonl``: a chat export, read through
    and checked first, then stored part by part as it is read again (never held whole)."""
    from tqdm import tqdm

    from narrmem.doors.chat_import import ChatImport, read_user_map

    # Checked whole before the store is touched (or the model loaded): nothing is half-imported.
    user_map = read_user_map(args.user_map) if args.user_map else None
    chat = ChatImport(
        args.file,
        args.format,
        tenant=args.tenant,
        user_map=user_map,
        keep_bots=args.keep_bots,
        keep_forwards=args.keep_forwards,
        as_bot=args.as_bot,
    )
    chat.check()
    counts = dict.fromkeys(("messages", "stored", "ignored", "duplicates", "said_before_a_forget"), 0)
    if chat.messages:
        async with _open(settings) as memory:
            chat.check_not_ahead(memory.clock.now(), settings.storage.max_ts_ahead_s)
            with tqdm(total=chat.messages, unit="msg", desc="import", file=sys.stderr, disable=None) as bar:
                parts = ([message for message, _ in part] for part in chat.parts(IMPORT_PART))
                counts = await _ingest_in_parts(memory, parts, bar.update)
    said_before_a_forget = counts.pop("said_before_a_forget")
    _report(
        args,
        {
            **counts,
            "skipped_service": chat.skipped["service"],
            "skipped_bots": chat.skipped["bots"],
            "skipped_forwards": chat.skipped["forwards"],
            "skipped_unsupported": chat.skipped["unsupported"],
            "said_before_a_forget": said_before_a_forget,
            **chat.scopes(),
        },
    )
    return 0


# Messages per ingest_many call of an import: each call's results are counted and let go (a call
# of a whole export held one result per message to its end, and its memory grew with the file).
IMPORT_PART = 5000


async def _ingest_in_parts(
    memory: Any, parts: Iterable[Sequence[Any]], progress: Callable[[int], Any]
) -> dict[str, int]:
    from narrmem.ingest import SAID_BEFORE_A_FORGET

    counts = dict.fromkeys(("messages", "stored", "ignored", "duplicates", "said_before_a_forget"), 0)
    for part in parts:
        # History: each part asked whether a forget took its messages since, a short one too.
        for result in await memory.ingest_many(part, progress=progress, history=True):
            counts["messages"] += 1
            counts["stored"] += result.stored
            counts["ignored"] += result.layer == "ignore" and result.reason != SAID_BEFORE_A_FORGET
            counts["duplicates"] += result.duplicate
            counts["said_before_a_forget"] += result.reason == SAID_BEFORE_A_FORGET
    return counts


async def _tenants_elsewhere(memory: Any, args: argparse.Namespace) -> list[str]:
    """The other tenants than the one asked that hold memories of ``--user``."""
    from narrmem.store import FindsUserTenants

    if args.user is None or not isinstance(memory.store, FindsUserTenants):
        return []
    return [t for t in await memory.store.user_tenants([args.user]) if t != args.tenant][:10]


def _scope_args(args: argparse.Namespace) -> dict[str, Any]:
    """The scope a command's ``--user``, ``--chat`` and ``--tenant`` name, as keyword arguments."""
    return {"user_id": args.user, "chat_id": args.chat, "tenant": args.tenant}


async def cmd_recall(args: argparse.Namespace, settings: Settings) -> int:
    # Inspection reads beside a running bot and changes nothing; --reinforce asks for the bot's
    # path instead (it needs the folder for writing).
    async with _open(_existing_store(settings), read_only=not args.reinforce) as memory:
        hits = await memory.recall(args.query, **_scope_args(args), k=args.k, reinforce=args.reinforce)
        elsewhere = await _tenants_elsewhere(memory, args) if not hits else []
    if args.json:
        _print_json([h.model_dump(mode="json") for h in hits])
        return 0
    if not hits:
        print("nothing remembered for that")
        if elsewhere:
            # The bot libraries keep a person under a tenant of their own (a Discord server's id,
            # "telegram"): asked in "default", a person with memories was answered "nothing".
            print(f"{args.user} has memories in tenant {', '.join(map(repr, elsewhere))}: ask with --tenant")
    for hit in hits:
        print(
            f"{hit.score:.4f}  {hit.created_at:%Y-%m-%d %H:%M}  [{hit.kind}] {hit.text}  <- {hit.message_ids}"
        )
    if args.explain and hits:
        print()
        print(explain_table(hits))
    return 0


def explain_table(hits: list[Any]) -> str:
    """Why each hit ranked: the score and what made it."""
    header = (
        "#",
        "id",
        "score",
        "dense",
        "keyword",
        "matched",
        "sources",
        "fused",
        "imp. now",
        "factor",
        "age d",
    )
    rows = [header]
    for n, hit in enumerate(hits, 1):
        why = hit.why
        sources = " ".join(f"{name}:{rank}" for name, rank in sorted(why.sources.items()))
        rows.append(
            (
                str(n),
                str(hit.id),
                f"{hit.score:.3f}",
                "-" if why.dense is None else f"{why.dense:.3f}",
                "-" if why.keyword is None else f"{why.keyword:.2f}",
                ",".join(why.matched) or "-",
                sources or "-",
                f"{why.fused:.3f}",
                f"{why.importance_now:.3f}",
                f"{why.importance_factor:.3f}",
                f"{why.age_days:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows
    )


async def cmd_triage(args: argparse.Namespace, settings: Settings) -> int:
    """Each message as if it were the first message of a new user, in a throwaway folder."""
    import tempfile

    from narrmem.doors.transfer import read_dry_run_messages

    messages = read_dry_run_messages(args.file) if args.file else read_dry_run_messages(None, text=args.text)
    with tempfile.TemporaryDirectory(prefix="narrmem-triage-") as folder:
        async with _open(settings.model_copy(update={"data_dir": folder})) as memory:
            for message in messages:
                decision = await memory.triage(message)
                line = {
                    "text": message.text,
                    "layer": decision.layer,
                    "type": decision.type,
                    "importance": decision.importance,
                    "reason": decision.reason,
                    "category": decision.signals.get("category"),
                }
                if args.json:
                    print(json.dumps(line, ensure_ascii=False))
                else:
                    kind = f"/{decision.type}" if decision.type else ""
                    print(f"{decision.layer}{kind}\t{decision.importance:.2f}\t{message.text}")
    return 0


async def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(_existing_store(settings), warm=False, read_only=True) as memory:
        stats = await memory.stats()
    if args.json:
        _print_json(stats)
    else:
        for key, value in stats.items():
            print(f"{key}: {value}")
    return 0


def _time_option(value: str, option: str) -> datetime:
    try:
        at = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InputError(f"not an ISO-8601 time: {value!r}", field=option) from exc
    if at.tzinfo is None:
        raise InputError("needs a timezone, e.g. 2026-05-01T12:00:00+00:00", field=option)
    return at


async def cmd_decay(args: argparse.Namespace, settings: Settings) -> int:
    now = _time_option(args.now, "--now") if args.now else None
    async with _open(_existing_store(settings), warm=False) as memory:
        counts = await memory.decay(now)
    _report(args, counts)
    return 0


async def cmd_retention(args: argparse.Namespace, settings: Settings) -> int:
    """``narrmem retention``: forget (or, ``--dry-run``, list) the people with nothing said for
    ``--days`` (default ``[plugin.retention] inactive_days``) or since ``--before``."""
    from narrmem import retention

    if args.days is not None and args.before is not None:
        raise InputError("give --days or --before, not both", field="--before")
    given = _time_option(args.before, "--before") if args.before is not None else None
    days = 0.0
    if given is None:
        days = float(args.days) if args.days is not None else _configured_inactive_days(settings)
        if not 1 <= days <= 36_500:
            raise InputError(
                "a number of days from 1 to 36500 (or [plugin.retention] inactive_days set)", field="--days"
            )
    tenant = args.tenant

    def cutoff(now: datetime) -> datetime:
        if given is None:
            return now - timedelta(days=days)
        if given > now - timedelta(days=1):
            # As --days: a time typed for a date long past (today's) would forget whoever was
            # quiet since the morning.
            raise InputError("must be at least a day before now", field="--before")
        return given

    if args.dry_run:
        # Reads only, beside a running bot: who would go, and nothing changed.
        async with _open(_existing_store(settings), warm=False, read_only=True) as memory:
            before = cutoff(memory.clock.now())
            held = await retention.plugins_latest(memory)
            refused = await retention.refused(
                retention.finder(memory.store), before, held, now=memory.clock.now()
            )
            people = [person async for person in retention.all_inactive(memory, before, tenant=tenant)]
        summary = {
            "before": before.isoformat(),
            "people": len(people),
            "memories": sum(p["memories"] for p in people),
            "refused": int(refused),
        }
        if args.json:
            _print_json({**summary, "inactive": people})
        else:
            for person in people:
                print(f"{person['tenant']}\t{person['user_id']}\t{person['memories']}\t{person['last_said']}")
            print(
                f"would forget {_count(len(people), 'person', 'people')}, "
                f"{_count(summary['memories'], 'memory', 'memories')} "
                f"(nothing said since {before.isoformat()})"
            )
        return _retention_refused(before) if refused and not args.force else 0
    from tqdm import tqdm

    async with _open(_existing_store(settings), warm=False) as memory:
        before = cutoff(memory.clock.now())
        # Counted first (a read of the scope index), so the bar says how far the pass has gone.
        total = await retention.pass_size(memory, before, tenant=tenant)
        with tqdm(total=total, unit="person", desc="retention", file=sys.stderr, disable=None) as bar:
            counts = await memory.forget_inactive(
                before=before, tenant=tenant, force=args.force, progress=bar.update
            )
    _report(args, {"before": before.isoformat(), **counts})
    if counts["refused"]:
        return _retention_refused(before)
    if counts["busy"]:
        print("another retention pass is under way on this store; nothing was done", file=sys.stderr)
        return 1
    return 0


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _retention_refused(before: datetime) -> int:
    print(
        f"refused: no one in the store said anything between {before.isoformat()} and a day ago "
        "(what was written since may be dated by a wrong clock); is the clock right? (--force "
        "forgets them all)",
        file=sys.stderr,
    )
    return 1


def _configured_inactive_days(settings: Settings) -> float:
    from narrmem_plugins.retention import NAME, RetentionOptions

    from narrmem.config import plugin_options

    return plugin_options(settings, NAME, RetentionOptions).inactive_days


async def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(_existing_store(settings), warm=False, read_only=True) as memory:
        history = await memory.history(args.memory_id)
    if args.json:
        _print_json(history)
        return 0
    record = history["memory"]
    print(f"memory {record['id']} ({record['kind']}): {record['text'][:80]}")
    print(f"stored importance {record['importance']}, now {history.get('importance_now', '?')}")
    for event in history["events"]:
        print(f"  {event['at']}  {event['who']}: {event['old']} -> {event['new']}  ({event['why']})")
    for point in history.get("projection", []):
        print(f"  in {point['days']:>3} days: {point['importance']}")
    return 0


async def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    from pydantic import ValidationError

    from narrmem.doors.person_export import export_person
    from narrmem.doors.transfer import export_store
    from narrmem.models import Scope

    if args.tenant is not None and args.user is None:
        raise InputError("--tenant names the person's tenant: give --user too", field="tenant")
    tenant = "default" if args.tenant is None else args.tenant
    if args.user is not None:
        # Before the store opens: an empty id, or one with a NUL, names no one. Each checked as
        # its option (a scope's own error named a chat_id no one gave).
        for option, value, field in (("--user", args.user, "user_id"), ("--tenant", tenant, "tenant")):
            try:
                Scope.model_validate({field: value, **({"user_id": "x"} if field == "tenant" else {})})
            except ValidationError as exc:
                reason = exc.errors(include_url=False)[0]["msg"]
                raise InputError(f"{option}: {reason}", field=option.removeprefix("--")) from exc
    # "-" is standard output (a pipe to gzip, ssh or another store's import): the report goes to
    # standard error, out of the export's way. UTF-8 and "\n" whatever the console's encoding (a
    # Windows pipe's cp1252 failed on the first name it could not write, and wrote "\r\n").
    target: str | TextIO = args.file
    if args.file == "-":
        sys.stdout.flush()
        target = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    try:
        async with _open(_existing_store(settings), warm=False, read_only=True) as memory:
            if args.user is None:
                counts = await export_store(memory, target)
            else:
                counts = await export_person(memory, target, tenant=tenant, user_id=args.user)
    finally:
        if isinstance(target, io.TextIOWrapper):
            target.flush()
            target.detach()  # standard output stays open for what follows
    report = {"exported": counts.pop("memories", 0), **counts, "file": args.file}
    if args.file == "-":
        with contextlib.redirect_stdout(sys.stderr):
            _report(args, report)
    else:
        _report(args, report)
    return 0


async def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    from narrmem.doors.importing import check_export_file, export_model, import_jsonl

    if args.file == "-":
        # An import reads its file twice (checked whole before a memory is written, so that a
        # refused file leaves the store as it was): a pipe can be read once.
        raise InputError(
            "an import reads a file, not standard input: save the export to a file first", field="file"
        )
    new_store = not _store_exists(settings)
    if new_store:
        # A file the import refuses must not leave a new, empty store behind.
        check_export_file(args.file)
    made = _NewStore(settings) if new_store and settings.storage.backend == "sqlite" else None
    try:
        async with _open(settings, warm=False, new_store_model=export_model(args.file)) as memory:
            counts = await import_jsonl(memory, args.file)
    except NarrmemError:
        # Refused once the store was made (a model or a plugin section the file cannot be
        # imported with): what this command made goes, and nothing else. Left, the empty store
        # was tied to the refused settings, and the import tried again with the right ones was
        # refused for it.
        if made is not None:
            made.remove()
        raise
    _report(args, counts)
    return 0


class _NewStore:
    """The files a new embedded store is made of (its database and SQLite's files beside it, its
    vector and keyword index folders), those of them not there before the command began: what a
    refused import removes, and nothing else of the folder (its lock file stays)."""

    def __init__(self, settings: Settings) -> None:
        self.folder = Path(settings.data_dir)
        database = settings.storage.database
        self.lock = self.folder / f"{database}.lock"
        names = [database, *(database + s for s in ("-wal", "-shm", "-journal")), settings.storage.index]
        names.append("keywords")
        self.new = [self.folder / name for name in names if not os.path.lexists(self.folder / name)]

    def remove(self) -> None:
        from narrmem_plugins.storage_sqlite.folder_lock import FolderLock

        # Taken first: a refusal because another process opened the store (a bot started on the
        # same new folder a moment before) must leave it its files.
        lock = FolderLock(self.lock)
        try:
            lock.acquire(self.folder)
        except (StoreError, OSError):
            return
        try:
            for path in self.new:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    path.unlink()
        finally:
            # The lock file stays (see folder_lock): a process waiting on it would lock a file
            # no longer in the folder while a third locked a new one.
            lock.release()


async def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    # A folder without a store holds nothing to forget: an error, and no store made for it.
    async with _open(_existing_store(settings), warm=False) as memory:
        counts = await memory.forget(**_scope_args(args))
    _report(args, counts)
    return 0


async def cmd_owed_forgets(args: argparse.Namespace, settings: Settings) -> int:
    from narrmem import owed_forgets

    # The listing reads beside a running bot and changes nothing: a writable open would have the
    # plugins loaded scrub what they are owed, and delete expired forget marks, first.
    listing = args.drop is None
    async with _open(_existing_store(settings), warm=False, read_only=listing) as memory:
        if listing:
            _report(args, await owed_forgets.awaited(memory))
        else:
            _report(args, {"dropped": await owed_forgets.drop(memory, args.drop)})
    return 0


async def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    from narrmem.doors.listening import check_port
    from narrmem.doors.mcp_server import serve_http, serve_stdio

    # Checked before the store is opened (a bad address made a new store's files first).
    if args.http:
        host, _, port = args.http.rpartition(":")
        if not port.isdigit():
            raise InputError(f"expected [HOST:]PORT, got {args.http!r}", field="--http")
        check_port(int(port), "--http")
    import mcp  # noqa: F401 - missing, it is named before a store is made (see EXTRA_OF_MODULE)

    # stdout is the protocol on stdio: logs go to stderr only. Read-only, an existing store alone
    # (nothing is made for it) and no reinforcement by what the tools read.
    opened = _open(_existing_store(settings), read_only=True) if args.read_only else _open(settings)
    async with opened as memory:
        tools = _served_tools(args, settings, memory)
        if args.http:
            await serve_http(
                memory, tenant=args.tenant, host=host or "127.0.0.1", port=int(port), tools=tools
            )
        else:
            await serve_stdio(memory, tenant=args.tenant, tools=tools)
    return 0


def _served_tools(args: argparse.Namespace, settings: Settings, memory: Any) -> list[str]:
    """``--tools`` (comma-separated), else ``[mcp] tools``; checked against the registered tools."""
    from narrmem.doors.mcp_server import select_tools

    if args.tools is not None:
        return select_tools(memory.tools.names(), args.tools.split(","), field="--tools")
    return select_tools(memory.tools.names(), settings.mcp.tools, field="mcp.tools")


async def cmd_tools(args: argparse.Namespace, settings: Settings) -> int:
    """The tools' schemas: they come from the plugins and their settings, not from a store, so
    they are read from a temporary SQLite store of the same settings: nothing is written where the
    data lives, beside a running bot or on a PostgreSQL database not set up yet alike."""
    import tempfile

    from narrmem.tools import tool_schemas

    with tempfile.TemporaryDirectory(prefix="narrmem-tools-") as folder:
        storage = settings.storage.model_copy(update={"backend": "sqlite"})
        alone = settings.model_copy(update={"data_dir": folder, "storage": storage})
        async with _open(alone, warm=False) as memory:
            served = set(_served_tools(args, settings, memory))
            schemas = tool_schemas(memory.tools, args.format)
            _print_json([s for s in schemas if _schema_name(s) in served])
    return 0


async def _check_tool_arguments(settings: Settings, name: str, arguments: dict[str, Any]) -> None:
    """Validate a tool call as the tool will, on a temporary store of the same settings (see
    :func:`cmd_tools`): nothing is written where the data lives."""
    import tempfile

    from narrmem.errors import InputError

    with tempfile.TemporaryDirectory(prefix="narrmem-check-") as folder:
        storage = settings.storage.model_copy(update={"backend": "sqlite"})
        alone = settings.model_copy(update={"data_dir": folder, "storage": storage})
        async with _open(alone, warm=False) as memory:
            if name not in memory.tools.names():
                raise InputError("the rtm plugin is not loaded (is it in plugins.disabled?)", field="command")
            memory.tools.validate(name, arguments)


def _schema_name(schema: dict[str, Any]) -> str:
    return str(schema["function"]["name"] if "function" in schema else schema["name"])


RTM_TOOLS = {
    "build": "rtm_create_narrative_tree",
    "traverse": "rtm_traverse_narrative",
    "ensemble": "rtm_generate_ensemble",
    "depth": "rtm_find_optimal_depth",
}


async def cmd_rtm(args: argparse.Namespace, settings: Settings) -> int:
    """``narrmem rtm build|traverse|ensemble|depth FILE``: the rtm plugin's tools on a text file."""
    from narrmem.errors import InputError

    name, arguments = _rtm_arguments(args)
    if not _store_exists(settings):
        # Arguments the tool refuses must not leave a new, empty store behind.
        await _check_tool_arguments(settings, name, arguments)
    # The ensemble never embeds: no need to load the model for it.
    async with _open(settings, warm=args.action != "ensemble") as memory:
        if name not in memory.tools.names():
            raise InputError("the rtm plugin is not loaded (is it in plugins.disabled?)", field="command")
        result = await memory.call_tool(name, arguments)
    if args.json:
        _print_json(result)
    else:
        _print_rtm(args.action, result)
    return 0


def _rtm_arguments(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The tool and its JSON arguments; options left unset fall to the tool's defaults."""
    from pathlib import Path

    from narrmem.errors import InputError

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {args.file}: {exc}", field="file") from exc
    title = args.title or ("stdin" if args.file == "-" else Path(args.file).stem) or "untitled"
    arguments: dict[str, Any] = {
        "text": text,
        "title": title,
        "maxBranchingFactor": args.k,
        "maxRecallDepth": args.max_depth,
        "seed": args.seed,
    }
    if args.action == "ensemble":
        arguments["ensembleSize"] = args.trees
    else:
        arguments.update(tenant=args.tenant, partition=args.partition)
    if args.action == "build":
        arguments["type"] = args.type
    elif args.action == "traverse":
        arguments["traversalDepth"] = args.level
    elif args.action == "depth":
        arguments["targetRecallLength"] = args.target
    return RTM_TOOLS[args.action], {k: v for k, v in arguments.items() if v is not None}


def _print_rtm(action: str, result: dict[str, Any]) -> None:
    if action == "build":
        stats = result["stats"]
        state = "built" if result["created"] else "stored"
        print(
            f"{result['treeId']} ({state}): {stats['clauseCount']} clauses, {stats['totalNodes']} nodes, "
            f"{stats['leafCount']} leaves, depth {stats['depth']}, avg branching {stats['avgBranching']:.2f}"
        )
        for depth, ratio in result["compressionRatio"].items():
            print(f"  {depth}: {stats['recallLength'][depth]} units, compression {ratio:.4f}")
        print(f"  scale: {result['scale']['note']}")
    elif action == "traverse":
        print(
            f"{result['treeId']} depth {result['traversalDepth']}: {result['recallLength']} units, "
            f"{result['clausesPerUnit']:.2f} clauses per unit"
        )
        print(result["retelling"])
    elif action == "depth":
        print(
            f"{result['treeId']} optimal depth {result['optimalDepth']}: {result['actualRecallLength']} "
            f"units for a target of {result['targetRecallLength']} (accuracy {result['accuracy']:.3f})"
        )
    else:
        print(
            f"{result['ensembleSize']} random trees, K={result['maxBranchingFactor']}, "
            f"D={result['maxRecallDepth']}, {result['leafCount']} clauses, seed {result['seed']}"
        )
        print("depth  mean recall    std    sem  theory       z")
        for row in result["depths"]:
            z = "-" if row["zScore"] is None else f"{row['zScore']:+.2f}"
            print(
                f"{row['depth']:>5}  {row['recallLengthMean']:>11.3f}  {row['recallLengthStd']:>5.2f}  "
                f"{row['recallLengthSem']:>5.3f}  {row['theoryRecallLength']:>6.2f}  {z:>6}"
            )
        print(f"scale: {result['scale']['note']}")


def _report(args: argparse.Namespace, data: dict[str, Any]) -> None:
    if args.json:
        _print_json(data)
        return
    counts = {k: v for k, v in data.items() if not isinstance(v, list)}
    print(", ".join(f"{k} {v}" for k, v in counts.items()))
    for key, values in data.items():
        if isinstance(values, list):
            print(f"{key}: {', '.join(values) or '-'}")


async def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """``narrmem migrate --from DATA_DIR|DSN --to DATA_DIR|DSN``: see :mod:`narrmem.doors.migrate`."""
    from narrmem.doors.migrate import migrate

    if args.queries < 0:
        raise InputError("must be 0 or more (0: no recall compared)", field="--queries")
    target_settings = load_settings(args.to_config) if args.to_config is not None else None
    report = await migrate(
        args.source,
        args.target,
        settings=settings,
        queries=args.queries,
        reembed=args.reembed,
        target_settings=target_settings,
    )
    if args.json:
        _print_json(report)
    else:
        for table, counts in report["counts"].items():
            print(f"{table}: {counts['source']} -> {counts['target']}")
        if report["reembedded"]:
            print(f"re-embedded: {report['models']['source']} -> {report['models']['target']}")
        if report["recall"]:
            recall = report["recall"]
            print(f"recall, {recall['measure']} (top {recall['k']}): {recall['agreement']}")
        for table, rows in report["not_migrated"].items():
            print(f"not migrated: {table} ({rows} rows; no plugin of the target holds them)")
        if report["verified"]:
            print("verified")
        elif report["not_migrated"]:
            print("NOT verified: plugin data was left behind (load its plugin on the target and run again)")
        else:
            print("NOT verified: counts or recall differ")
    return 0 if report["verified"] else 1


COMMANDS: dict[str, Handler] = {
    "demo": cmd_demo,
    "ingest": cmd_ingest,
    "import-chat": cmd_import_chat,
    "recall": cmd_recall,
    "triage": cmd_triage,
    "stats": cmd_stats,
    "decay": cmd_decay,
    "retention": cmd_retention,
    "rtm": cmd_rtm,
    "mcp": cmd_mcp,
    "tools": cmd_tools,
    "history": cmd_history,
    "export": cmd_export,
    "import": cmd_import,
    "forget": cmd_forget,
    "owed-forgets": cmd_owed_forgets,
    "migrate": cmd_migrate,
    **SERVER_COMMANDS,
}

if __name__ == "__main__":
    sys.exit(main())
