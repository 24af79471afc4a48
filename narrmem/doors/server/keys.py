"""Per-tenant API keys for ``narrmem serve``: created, listed and revoked with ``narrmem keys``.

A key is shown once, when it is created; the file keeps only a salted SHA-256 of its secret (the
secret is 32 random bytes, so a fast hash is enough: there is nothing to guess a password from).
The file lives in the data folder and is narrmem's own: one that is not a narrmem key file is never
overwritten. Revoking keeps the entry (marked revoked), so a server that once required keys never
falls back to serving without them.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import UTC
from pathlib import Path
from typing import Any

from narrmem import logs
from narrmem.clock import Clock, SystemClock
from narrmem.errors import InputError, StoreError
from narrmem.models import MAX_ID_CHARS

KEYS_FILE = "server-keys.json"
KEYS_FORMAT = "narrmem-server-keys"
KEYS_VERSION = 1
PREFIX = "nmk"
# nmk_<id>_<secret>: the id finds the entry without trying every hash.
TOKEN = re.compile(r"^nmk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
RELOAD_SECONDS = 1.0

log = logs.logger(__name__)


@dataclass(frozen=True)
class KeyEntry:
    id: str
    tenant: str
    label: str
    created_at: str
    revoked_at: str | None
    salt: str
    digest: str

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def public(self) -> dict[str, Any]:
        """What ``keys list`` shows: never the digest or the salt."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in {"salt", "digest"}}


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode("ascii")).hexdigest()


class KeyFile:
    """The key file of a data folder. Reads and writes are blocking file I/O: the CLI calls them
    directly, the server through :class:`KeyRing` (off the event loop)."""

    def __init__(self, data_dir: str | Path, clock: Clock | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / KEYS_FILE
        self.clock: Clock = clock or SystemClock()  # when a key was created or revoked

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> list[KeyEntry]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise StoreError(f"{self.path}: not a readable narrmem key file ({exc})") from exc
        if not isinstance(data, dict) or data.get("format") != KEYS_FORMAT:
            raise StoreError(f"{self.path} exists and is not a narrmem key file: narrmem leaves it alone")
        if data.get("version") != KEYS_VERSION or not isinstance(data.get("keys"), list):
            raise StoreError(f"{self.path}: unknown key file version {data.get('version')!r}")
        try:
            return [KeyEntry(**entry) for entry in data["keys"]]
        except TypeError as exc:
            raise StoreError(f"{self.path}: a key entry is malformed ({exc})") from exc

    def create(self, tenant: str, label: str = "") -> tuple[KeyEntry, str]:
        """A new key for ``tenant``; returns its entry and the token (shown once, stored hashed)."""
        if not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_ID_CHARS:
            raise InputError(f"must be 1 to {MAX_ID_CHARS} characters", field="tenant")
        if len(label) > 200:
            raise InputError("must be at most 200 characters", field="label")
        with self._locked():
            entries = self.read()
            key_id = secrets.token_hex(6)
            secret = secrets.token_urlsafe(32)
            salt = secrets.token_hex(16)
            entry = KeyEntry(
                id=key_id,
                tenant=tenant,
                label=label,
                created_at=self.clock.now().astimezone(UTC).isoformat(timespec="seconds"),
                revoked_at=None,
                salt=salt,
                digest=_digest(salt, secret),
            )
            self._write([*entries, entry])
        return entry, f"{PREFIX}_{key_id}_{secret}"

    def revoke(self, key_id: str) -> KeyEntry:
        with self._locked():
            entries = self.read()
            found = [e for e in entries if e.id == key_id]
            if not found:
                raise InputError(f"no key with id {key_id!r}", field="id")
            when = self.clock.now().astimezone(UTC).isoformat(timespec="seconds")
            updated = [
                KeyEntry(**{**e.__dict__, "revoked_at": e.revoked_at or when}) if e.id == key_id else e
                for e in entries
            ]
            self._write(updated)
        return next(e for e in updated if e.id == key_id)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Two ``narrmem keys`` commands at once must not lose each other's key."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            handle = (self.data_dir / f".{KEYS_FILE}.lock").open("a")
        except OSError as exc:
            raise StoreError(f"data folder {self.data_dir}: cannot write there ({exc.strerror})") from exc
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _write(self, entries: list[KeyEntry]) -> None:
        document = {
            "format": KEYS_FORMAT,
            "version": KEYS_VERSION,
            "keys": [e.__dict__ for e in entries],
        }
        fd, tmp = tempfile.mkstemp(dir=self.data_dir, prefix=f".{KEYS_FILE}.", suffix=".partial")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(document, out, indent=1)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)  # ours: made by mkstemp above
            raise


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key bound to one tenant, or (``tenant is None``) any caller of a server
    that has no keys, which binds only a loopback address."""

    tenant: str | None
    key_id: str | None = None

    def allows(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


OPEN = Principal(tenant=None)


class KeyRing:
    """The server's view of the key file, re-read when it changes (a key revoked with ``narrmem
    keys revoke`` stops working within a second, without a restart)."""

    def __init__(self, source: KeyFile, *, reload_seconds: float = RELOAD_SECONDS) -> None:
        self.source = source
        self.reload_seconds = reload_seconds
        self._entries: dict[str, KeyEntry] = {}
        self._required = False
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        self._lock = asyncio.Lock()

    @classmethod
    def in_folder(cls, data_dir: str | Path, *, reload_seconds: float = RELOAD_SECONDS) -> KeyRing:
        ring = cls(KeyFile(data_dir), reload_seconds=reload_seconds)
        ring.load()
        return ring

    def load(self) -> None:
        """Read the file now (blocking; at start-up). Once keys are required they stay required:
        a key file that goes away (moved, deleted, a volume unmounted) leaves no key valid rather
        than the server open to anyone."""
        stamp = self._file_stamp()
        entries = self.source.read()
        if stamp is None and self._required:
            log.error("%s is gone: every request is refused until it is back", self.source.path)
        self._entries = {e.id: e for e in entries}
        self._required = self._required or stamp is not None
        self._stamp = stamp

    @property
    def required(self) -> bool:
        """A key file exists, or did since the server started: every request needs an active key,
        even if all are revoked or the file is gone."""
        return self._required

    def active_count(self) -> int:
        return sum(e.active for e in self._entries.values())

    def _file_stamp(self) -> tuple[float, int] | None:
        try:
            st = self.source.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime, st.st_size)

    async def refresh(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._checked < self.reload_seconds:
            return
        async with self._lock:
            if loop.time() - self._checked < self.reload_seconds:
                return
            self._checked = loop.time()
            stamp = await asyncio.to_thread(self._file_stamp)
            if stamp != self._stamp:
                await asyncio.to_thread(self.load)

    async def verify(self, token: str | None) -> Principal | None:
        """The caller behind ``token``; ``OPEN`` when no key is required; ``None`` if refused."""
        await self.refresh()
        if not self._required:
            return OPEN
        if token is None:
            return None
        match = TOKEN.match(token)
        if match is None:
            return None
        entry = self._entries.get(match.group(1))
        if entry is None or not entry.active:
            return None
        if not hmac.compare_digest(entry.digest, _digest(entry.salt, match.group(2))):
            return None
        return Principal(tenant=entry.tenant, key_id=entry.id)
