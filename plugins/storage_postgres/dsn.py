"""A DSN as it may be shown: the password replaced, wherever it was given."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its password (URL userinfo, ``?password=``, or ``password=`` keyword) as ``***``."""
    if "://" not in dsn:
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable dsn>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = _QUERY_PASSWORD.sub(r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, dsn: str) -> str:
    """``text`` (an error message) with any copy of the DSN or its password masked."""
    text = text.replace(dsn, mask_dsn(dsn))
    password = _password(dsn)
    if password:
        text = text.replace(password, "***")
    return text


def _password(dsn: str) -> str | None:
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return None
        found = parts.password or next(
            (v.split("=", 1)[1] for v in parts.query.split("&") if v.lower().startswith("password=")), None
        )
        return found or None
    match = _KEYWORD_PASSWORD.search(dsn)
    return match.group(2).strip("'") if match else None
