"""A DSN as it may be shown: its secrets replaced, wherever they were given.

The secrets are the password and the client key's passphrase (``sslpassword``), in the URL's
userinfo, as query parameters (``?password=``, the first parameter or any later one), or as
``key=value`` keywords."""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

_SECRET_KEYS = ("password", "sslpassword")
_KEYWORD_SECRET = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its secrets (URL userinfo's password, ``password`` and ``sslpassword`` as
    query parameters or keywords) as ``***``."""
    if "://" not in dsn:
        return _KEYWORD_SECRET.sub(r"\1***", dsn)
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
    query = "&".join(_masked_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _masked_pair(pair: str) -> str:
    key, equals, _ = pair.partition("=")
    return f"{key}=***" if equals and _is_secret_key(key) else pair


def _is_secret_key(key: str) -> bool:
    # A key may be percent-encoded (pass%77ord) and still be read as the password.
    return unquote_plus(key).strip().lower() in _SECRET_KEYS


def scrub(text: str, dsn: str) -> str:
    """``text`` (an error message) with any copy of the DSN or its secrets masked."""
    text = text.replace(dsn, mask_dsn(dsn))
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(dsn: str) -> set[str]:
    found: list[str] = []
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return set()
        if parts.password:
            found.append(parts.password)
        for pair in parts.query.split("&"):
            key, _, value = pair.partition("=")
            if _is_secret_key(key):
                found.append(value)
    else:
        found += [match.group(2).strip("'") for match in _KEYWORD_SECRET.finditer(dsn)]
    # A message may show a secret as given or decoded (%40 as @, + as a space in a query).
    return {form for secret in found for form in (secret, unquote(secret), unquote_plus(secret)) if form}
