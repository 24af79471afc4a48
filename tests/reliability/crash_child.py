"""The process the crash harness kills: it opens a memory on a data folder and works until it is
killed, writing to an acknowledgement file (flushed and fsync'd) what it has done.

The harness starts it as ``child_main`` in a process forked from a server that has imported narrmem
once (a fresh interpreter costs seconds per run); by hand it runs as

    python crash_child.py FOLDER ACK_FILE PLAN_FILE

``PLAN_FILE`` is JSON: ``{"kind": "ingest" | "receipt" | "bulk" | "forget", "real_model": bool,
"batches": [...], "forget": [[tenant, user], ...], "clock": ISO, "environment": {NAME: VALUE}}``. For
``ingest`` and ``receipt`` (the same, acknowledged on receipt by its environment) every batch has one
message and goes through ``Memory.ingest``; for ``bulk`` a batch goes through
one ``ingest_many``. After a call
returns, each of its messages is acknowledged as ``ack TENANT CHAT MESSAGE_ID LAYER``. For
``forget`` the child writes ``forgetting TENANT USER`` before each ``forget`` and ``forgot TENANT
USER`` after it returned. ``ready`` follows the open; ``done`` the last call. Then it waits to be
killed (it never closes the memory: the kill is the end it is meant to have). With ``"kill_at":
METHOD`` the child kills itself when it first enters that method of the store (``dying METHOD``).

The script imports only narrmem, so it runs the same from pytest and from the bench.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from narrmem import ManualClock, Message
from narrmem.testing import open_memory


def _say(ack: IO[str], line: str) -> None:
    ack.write(line + "\n")
    ack.flush()
    os.fsync(ack.fileno())


async def _run(folder: Path, ack_path: Path, plan: dict[str, Any]) -> None:
    clock = ManualClock(datetime.fromisoformat(plan["clock"]))
    with ack_path.open("a", encoding="utf-8") as ack:
        mem = await open_memory(folder, real_model=bool(plan["real_model"]), clock=clock)
        _say(ack, f"ready {os.getpid()}")
        if plan.get("kill_at"):
            _die_on_entering(mem.store, plan["kill_at"], ack)
        if plan["kind"] == "forget":
            for tenant, user in plan["forget"]:
                _say(ack, f"forgetting {tenant} {user}")
                await mem.forget(user_id=user, tenant=tenant)
                _say(ack, f"forgot {tenant} {user}")
        else:
            for batch in plan["batches"]:
                messages = [Message.model_validate(m) for m in batch]
                if plan["kind"] in ("ingest", "receipt"):
                    results = [await mem.ingest(messages[0])]
                else:
                    results = await mem.ingest_many(messages)
                lines = [
                    f"ack {m.tenant} {m.chat_id} {m.message_id} {r.layer}"
                    for m, r in zip(messages, results, strict=True)
                ]
                _say(ack, "\n".join(lines))
                clock.advance(seconds=1)
        _say(ack, "done")
        await asyncio.sleep(3600)


def _die_on_entering(store: Any, step: str, ack: IO[str]) -> None:
    """Kill this process (SIGKILL, as the harness would) when the store's method ``step`` is first
    called: a crash at a chosen step of a forget rather than at a random moment."""
    if not hasattr(store, step):
        _say(ack, f"nostep {step}")
        return

    async def die(*args: Any, **kwargs: Any) -> Any:
        _say(ack, f"dying {step}")
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(store, step, die)


def main(argv: list[str]) -> None:
    folder, ack_path, plan_path = (Path(a) for a in argv)
    plan = json.loads(plan_path.read_text(encoding="utf-8"))
    os.environ.update(plan.get("environment", {}))
    asyncio.run(_run(folder, ack_path, plan))


def child_main(folder: str, ack_path: str, plan_path: str, log_path: str) -> None:
    """The entry point in a forked process: output goes to ``log_path``."""
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    main([folder, ack_path, plan_path])


if __name__ == "__main__":
    main(sys.argv[1:])
