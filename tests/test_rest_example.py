"""examples/rest_client.sh as a user runs it: the real ``narrmem serve`` command in its own process,
then the script's curl calls (ingest, a duplicate, recall with why, forget) against it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

SCRIPT = Path(__file__).parent.parent / "examples" / "rest_client.sh"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_up(base: str, server: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"narrmem serve exited with {server.returncode}")
        try:
            if httpx.get(f"{base}/v1/stats", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError("narrmem serve did not answer in time")


def test_rest_client_script_round_trip_against_a_live_server(tmp_path: Path) -> None:
    assert shutil.which("curl"), "curl is not installed (apt-get install curl)"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "narrmem.doors.cli",
        "serve",
        "--data",
        str(tmp_path),
        "--port",
        str(port),
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_up(base, server)
        run = subprocess.run(
            ["bash", str(SCRIPT)],
            env={**os.environ, "NM_URL": base},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        replies = [json.loads(line) for line in run.stdout.splitlines() if line.startswith(("{", "["))]
        first, again, hits, forgotten = replies
        assert first["stored"] is True and first["layer"] == "scene"
        # Sent again (a client's retry), it names the memories the first call wrote.
        assert again["duplicate"] is True and again["memory_ids"] == first["memory_ids"]
        assert hits and "quit my job" in hits[0]["text"] and hits[0]["why"]["relevant"] is True
        assert forgotten["memories"] == len(first["memory_ids"])
        after = httpx.post(f"{base}/v1/recall", json={"query": "quit my job", "scope": {"user_id": "u1"}})
        assert after.status_code == 200 and after.json() == []
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            pytest.fail("narrmem serve did not stop on SIGTERM")
