"""``narrmem serve``: the HTTP API for bots in any language, and the memory inspector at ``/ui``.

The names are loaded on first use: the ``narrmem`` command registers ``serve`` and ``keys``
without importing the web framework (an optional extra, ``narrmem[server]``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from narrmem.doors.server.app import create_app, openapi_document
    from narrmem.doors.server.events import WebhookOptions
    from narrmem.doors.server.keys import KeyFile, KeyRing

__all__ = ["KeyFile", "KeyRing", "WebhookOptions", "create_app", "openapi_document"]

_WHERE = {
    "create_app": "app",
    "openapi_document": "app",
    "WebhookOptions": "events",
    "KeyFile": "keys",
    "KeyRing": "keys",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
