"""``Configured``: the base of a plugin class that has a ``[plugin.<name>]`` table of its own."""

from __future__ import annotations

from typing import Generic

from narrmem.config import M, Settings, plugin_options
from narrmem.host import hookimpl


class Configured(Generic[M]):
    """``self.options`` holds the plugin's table, validated by ``model`` (its defaults until the
    memory is configured). ``narrmem_name`` names both the plugin and its table; a subclass that
    derives more from the settings overrides :meth:`configured`."""

    narrmem_name: str

    def __init__(self, model: type[M]) -> None:
        self._options_model = model
        self.options: M = model()

    @hookimpl
    def narrmem_configure(self, settings: Settings) -> None:
        self.options = plugin_options(settings, self.narrmem_name, self._options_model)
        self.configured(settings)

    def configured(self, settings: Settings) -> None:
        """Called once ``options`` are read from ``settings``."""
