"""``Configured``: the base of a plugin class that has a ``[plugin.<name>]`` table of its own."""

from __future__ import annotations

from typing import Any, Generic, cast

from pydantic import BaseModel

from narrmem.config import M, Settings, plugin_options
from narrmem.host import hookimpl


class Configured(Generic[M]):
    """A plugin class names itself and its options model where it is declared::

        class SpoilerGuard(Configured[SpoilerOptions], name="spoiler_guard", options=SpoilerOptions):

    ``self.options`` then holds its ``[plugin.<name>]`` table, validated by the model (the
    model's defaults until the memory is configured), and ``narrmem_name`` is ``name``. A subclass
    that derives more from the settings overrides :meth:`configured`."""

    narrmem_name: str
    _options_model: type[BaseModel]

    def __init_subclass__(cls, *, name: str, options: type[BaseModel], **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.narrmem_name = name
        cls._options_model = options

    def __init__(self) -> None:
        self.options: M = cast(M, self._options_model())

    @hookimpl
    def narrmem_configure(self, settings: Settings) -> None:
        self.options = cast(M, plugin_options(settings, self.narrmem_name, self._options_model))
        self.configured(settings)

    def configured(self, settings: Settings) -> None:
        """Called once ``options`` are read from ``settings``."""
