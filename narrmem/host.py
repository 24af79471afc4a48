"""The plugin host: one pluggy ``PluginManager`` per ``Memory`` and an async dispatcher over it.

pluggy itself is synchronous. The host walks ``hook.get_hookimpls()`` in pluggy's call order,
passes each implementation only the arguments it names, awaits coroutine results, emulates
``firstresult`` after awaiting, and isolates a raising plugin: logged, reported to
``narrmem_plugin_error`` and left out of the answer. A :class:`~narrmem.errors.StoreUnavailableError`
is not isolated (but in the hooks of :data:`AFTER_THE_WORK`): the store cannot be reached, and
the call as a whole fails with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from narrmem import hookspecs, logs
from narrmem.errors import ConfigError, NarrmemError, PluginError, StoreUnavailableError
from narrmem.hook_returns import Check, declared_check

if TYPE_CHECKING:
    from narrmem.view import MemoryView

log = logs.logger("narrmem.host")

# Hooks that run after the call's own work is done (the message written, the hits found, the
# memory closing): a plugin that finds the store unreachable there is isolated as any failure,
# since failing the call would not undo its work and a retry would find it done ("already
# stored") and not run them. In every other hook it fails the call (see the module).
AFTER_THE_WORK = frozenset(
    {
        "narrmem_after_store",
        "narrmem_after_recall",
        "narrmem_on_trigger",
        "narrmem_shutdown",
        "narrmem_plugin_error",
    }
)

GROUP = "narrmem"
DISTRIBUTION = "narrmem"

hookimpl = pluggy.HookimplMarker(GROUP)
P = TypeVar("P")


class PluginHost:
    def __init__(self, memory: MemoryView) -> None:
        self.memory = memory
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        # (plugin, hook, the error's type name) of the last 100 failures: not the error itself,
        # whose traceback held the failing hook's locals (a forget's every removed record, a
        # batch's messages and vectors) in RAM for months, and whose words may quote a person.
        self.errors: list[tuple[str, str, str]] = []
        self._returns: dict[str, tuple[Check, str] | None] = {}

    # --- loading ---------------------------------------------------------------------------

    def load(
        self,
        *,
        builtins: bool,
        load_entrypoints: bool,
        extra: Iterable[object],
        disabled: Iterable[str],
    ) -> None:
        """Register built-ins and third-party plugins from the entry-point group, then ``extra``.

        Built-ins are the entry points declared by the narrmem distribution itself; they are
        loaded exactly as a third-party plugin's are.
        """
        disabled = list(disabled)
        for name in disabled:
            self.pm.set_blocked(name)
        known: set[str] = set()
        # Who took each name: a second claim is refused naming both, since the one left out (a
        # built-in shadowed, or one of two plugins) would otherwise be missing without a word.
        claimed: dict[str, str] = {}
        distributions = _Distributions()
        for ep in sorted(
            entry_points(group=GROUP), key=lambda ep: (0 if distributions.is_builtin(ep) else 1, ep.name)
        ):
            known.add(ep.name)
            if not (builtins if distributions.is_builtin(ep) else load_entrypoints):
                continue
            if self.pm.is_blocked(ep.name):
                continue
            claimant = f"distribution {distributions.name(ep) or 'unknown'!r} ({ep.value})"
            if ep.name in claimed:
                raise PluginError(_claimed_twice(ep.name, claimed[ep.name], claimant))
            claimed[ep.name] = claimant
            try:
                plugin = ep.load()
                if inspect.isclass(plugin):
                    plugin = plugin()  # one instance per Memory: no state shared between memories
            except Exception as exc:
                raise PluginError(f"plugin '{ep.name}' ({ep.value}) failed to import: {exc}") from exc
            self._register_named(plugin, ep.name)
        for plugin in extra:
            if isinstance(plugin, str | bytes | dict | int | float) or plugin is None:
                raise PluginError(f"{plugin!r} is not a plugin: pass modules or objects with hook methods")
            name = getattr(plugin, "narrmem_name", None) or _default_name(plugin)
            known.add(name)
            if self.pm.is_blocked(name):
                continue
            claimant = f"the object {type(plugin).__qualname__} passed in plugins="
            if name in claimed:
                raise PluginError(_claimed_twice(name, claimed[name], claimant))
            claimed[name] = claimant
            self._register_named(plugin, name)
        unknown = sorted(set(disabled) - known)
        if unknown:  # a typo would otherwise leave the plugin running while the user thinks it is off
            raise ConfigError(
                f"plugins.disabled: no plugin named {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc)) from exc
        self._refuse_wrappers()

    def _register_named(self, plugin: object, name: str) -> None:
        """``pm.register``, its refusals (an argument its hook does not have, an object already
        registered) as a :class:`PluginError` naming the plugin."""
        try:
            self.pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise PluginError(f"plugin {name!r} cannot be registered: {exc}") from exc

    def _refuse_wrappers(self) -> None:
        """The host awaits each implementation itself (pluggy is synchronous), so a wrapper's
        generator would be taken for the plugin's answer: a triage wrapper would silently break
        triage. Refused at registration, naming the plugin and the hook."""
        for name in self.pm.hook.__dict__:
            caller = getattr(self.pm.hook, name)
            for impl in caller.get_hookimpls():
                if impl.wrapper or impl.hookwrapper:
                    raise PluginError(
                        f"plugin '{impl.plugin_name}' implements {name} as a wrapper "
                        "(wrapper=True / hookwrapper=True), which narrmem cannot honour: use the "
                        "hook's before/after counterparts, or tryfirst/trylast for ordering"
                    )

    def register(self, plugin: object, *, name: str) -> None:
        """Add a plugin object to an open memory, checked as at load: a door that must hear of
        hooks (the HTTP server's trigger hub hears of forgets) attaches this way. A name already
        taken, an unknown hook or a wrapper is a :class:`PluginError`, and nothing is added."""
        if self.pm.has_plugin(name):
            raise PluginError(f"a plugin named {name!r} is already registered")
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
            self._refuse_wrappers()
        except (pluggy.PluginValidationError, PluginError, ValueError) as exc:
            if self.pm.has_plugin(name):
                self.pm.unregister(name=name)
            raise PluginError(str(exc)) from exc

    def plugin_names(self) -> list[str]:
        return [name for name, plugin in self.pm.list_name_plugin() if plugin is not None]

    def after_store_partners(self, names: Collection[str]) -> set[str]:
        """``names`` with the plugins whose after-store hooks run with theirs when a message's are
        run again: a plugin declares the ones whose results it reads (``narrmem_after_store_with``,
        a tuple of names), and the link holds both ways, closed over: a reader run alone finds
        nothing to read, and a producer run alone hands its raw results to no reader."""
        links: dict[str, set[str]] = {}
        for name, plugin in self.pm.list_name_plugin():
            for other in getattr(plugin, "narrmem_after_store_with", ()) if plugin is not None else ():
                links.setdefault(name, set()).add(other)
                links.setdefault(other, set()).add(name)
        group, todo = set(names), list(names)
        while todo:
            for other in links.get(todo.pop(), set()) - group:
                group.add(other)
                todo.append(other)
        return group

    def plugin(self, cls: type[P]) -> P:
        """The registered plugin object of class ``cls`` (a plugin's helpers use this to find
        their own per-memory instance)."""
        for plugin in self.pm.get_plugins():
            if isinstance(plugin, cls):
                return plugin
        raise PluginError(f"no plugin of type {cls.__name__} is loaded (is it disabled?)")

    # --- calling ---------------------------------------------------------------------------

    async def call(
        self,
        hook_name: str,
        *,
        isolate: bool = True,
        errors: list[str] | None = None,
        among: Collection[str] | None = None,
        away: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call every implementation (of the plugins named ``among``, when given); return the
        non-``None`` results in call order.

        A plugin's failure is described in ``errors`` when given (so it can be reported with the
        message it concerns). Not isolated, it is a :class:`PluginError` naming the plugin and the
        hook (the plugin's own error chained); a narrmem error passes unchanged. ``away``
        collects the names of the plugins that found the store unreachable in a hook of
        :data:`AFTER_THE_WORK` (isolated there), whose work the caller may have them do again."""
        answers = await self._call(hook_name, lambda _: kwargs, isolate, errors, among, away)
        return [value for _, value in answers]

    async def call_named(
        self,
        hook_name: str,
        *,
        isolate: bool = True,
        errors: list[str] | None = None,
        among: Collection[str] | None = None,
        **kwargs: Any,
    ) -> list[tuple[str, Any]]:
        """``call``, each result with the name of the plugin that returned it: for a caller that
        checks answers against each other (two plugins exporting one section) and must say whose."""
        return await self._call(hook_name, lambda _: kwargs, isolate, errors, among)

    async def call_each(self, hook_name: str, arguments: Callable[[str], dict[str, Any]]) -> list[Any]:
        """``call(hook_name, isolate=False, ...)`` with the arguments made for each plugin by its
        name: a registration hook's ``register`` that records who registered what, so that a name
        registered twice is refused naming both plugins."""
        answers = await self._call(hook_name, arguments, False, None)
        return [value for _, value in answers]

    async def _call(
        self,
        hook_name: str,
        arguments: Callable[[str], dict[str, Any]],
        isolate: bool,
        errors: list[str] | None,
        among: Collection[str] | None = None,
        away: list[str] | None = None,
    ) -> list[tuple[str, Any]]:
        results = []
        for impl in self._ordered(hook_name):
            if among is not None and impl.plugin_name not in among:
                continue
            try:
                ok, value = await self._invoke(
                    impl, hook_name, arguments(impl.plugin_name), isolate, errors, away
                )
            except NarrmemError:
                raise  # says what is wrong already (a ConfigError its key, an InputError its field)
            except Exception as exc:  # only when not isolated: the caller must hear which plugin
                raise _failed(impl.plugin_name, hook_name, exc) from exc
            if ok and value is not None:
                results.append((impl.plugin_name, value))
        return results

    def implementers(self, hook_name: str) -> list[str]:
        """The names of the plugins that implement ``hook_name``, in the order they are called."""
        return [impl.plugin_name for impl in self._ordered(hook_name)]

    async def call_every(
        self, hook_name: str, *, among: Collection[str] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call every implementation (of the plugins named ``among``, when given), even after one
        raises; then, if any raised, raise one :class:`PluginError` naming each that did (the
        first error chained). For hooks whose every implementation must run (a forget's
        scrubbing: one plugin's failure must not leave the others' copies), and whose failure
        the caller must hear of."""
        results = []
        failed: list[tuple[str, Exception]] = []
        for impl in self._ordered(hook_name):
            if among is not None and impl.plugin_name not in among:
                continue
            try:
                ok, value = await self._invoke(impl, hook_name, kwargs, False, None)
            except Exception as exc:
                await self.report(impl.plugin_name, hook_name, exc)
                failed.append((impl.plugin_name, exc))
                continue
            if ok and value is not None:
                results.append(value)
        if failed:
            unreachable = [exc for _, exc in failed if isinstance(exc, StoreUnavailableError)]
            if unreachable:
                raise unreachable[0]  # to be tried again, as a whole, once the store answers
            named = "; ".join(f"plugin '{name}': {exc!r}" for name, exc in failed)
            raise PluginError(f"{hook_name} failed in {named}") from failed[0][1]
        return results

    async def call_first(self, hook_name: str, *, errors: list[str] | None = None, **kwargs: Any) -> Any:
        """Call implementations in order until one returns something other than ``None``."""
        answer = await self.call_first_named(hook_name, errors=errors, **kwargs)
        return None if answer is None else answer[1]

    async def call_first_named(
        self, hook_name: str, *, errors: list[str] | None = None, **kwargs: Any
    ) -> tuple[str, Any] | None:
        """``call_first``, with the name of the plugin that answered: for a caller that finds the
        answer wanting and must report who gave it (:meth:`report`)."""
        for impl in self._ordered(hook_name):
            ok, value = await self._invoke(impl, hook_name, kwargs, True, errors)
            if ok and value is not None:
                return impl.plugin_name, value
        return None

    def _ordered(self, hook_name: str) -> list[Any]:
        hook = getattr(self.pm.hook, hook_name)
        # pluggy calls the last implementation in this list first.
        return list(reversed(hook.get_hookimpls()))

    async def _invoke(
        self,
        impl: Any,
        hook_name: str,
        kwargs: dict[str, Any],
        isolate: bool,
        errors: list[str] | None,
        away: list[str] | None = None,
    ) -> tuple[bool, Any]:
        args = {name: kwargs[name] for name in impl.argnames if name in kwargs}
        try:
            value = impl.function(**args)
            if inspect.isawaitable(value):
                value = await value
            if value is not None:
                self._check_return(impl.plugin_name, hook_name, value)
        except Exception as exc:
            # An unreachable store is no plugin's failure, and an answer made without it would
            # pass for "nothing is stored" (empty patterns, no decay): the caller hears of it;
            # unless the call's work is done and the hook runs for its own ends after it.
            if not isolate or (isinstance(exc, StoreUnavailableError) and hook_name not in AFTER_THE_WORK):
                raise
            if errors is not None:
                errors.append(f"plugin '{impl.plugin_name}' failed in {hook_name}: {exc!r}")
            if away is not None and isinstance(exc, StoreUnavailableError):
                away.append(impl.plugin_name)
            await self.report(impl.plugin_name, hook_name, exc)
            return False, None
        return True, value

    def _check_return(self, plugin_name: str, hook_name: str, value: Any) -> None:
        if hook_name not in self._returns:
            self._returns[hook_name] = declared_check(hook_name)
        declared = self._returns[hook_name]
        if declared is not None and not declared[0](value):
            raise PluginError(
                f"plugin '{plugin_name}' returned {type(value).__name__} from {hook_name}, "
                f"which must return {declared[1]} or None"
            )

    async def report(self, plugin_name: str, hook_name: str, error: BaseException) -> None:
        """Log a plugin's failure in ``hook_name``, keep it in ``errors`` and tell
        ``narrmem_plugin_error``: what the host does for a raising plugin, for a caller that finds
        an answer wanting after the hook returned."""
        # The error's kind at ERROR, its words and traceback at DEBUG: a plugin's error may quote
        # what a person said (a graph node's name), and a log outlives a forget of them.
        log.error("plugin %r failed in %s: %s", plugin_name, hook_name, type(error).__name__)
        log.debug("plugin %r failed in %s: %r", plugin_name, hook_name, error, exc_info=error)
        self.errors.append((plugin_name, hook_name, type(error).__name__))
        del self.errors[:-100]
        if hook_name == "narrmem_plugin_error":
            return
        for impl in self._ordered("narrmem_plugin_error"):
            args = {
                "memory": self.memory,
                "plugin_name": plugin_name,
                "hook_name": hook_name,
                "error": error,
            }
            try:
                value = impl.function(**{k: v for k, v in args.items() if k in impl.argnames})
                if inspect.isawaitable(value):
                    await value
            except Exception:
                log.exception("plugin %r failed while handling an error report", impl.plugin_name)


class _Distributions:
    """The distribution that declares an entry point, and whether it is narrmem itself. A
    distribution's name is read from its whole METADATA file (narrmem's holds the README), so each
    distribution is asked once per load, not once per entry point: the entry points of one
    distribution share its object."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def name(self, ep: Any) -> str | None:
        dist = ep.dist
        if dist is None:
            return None
        name = self._names.get(id(dist))
        if name is None:
            name = self._names[id(dist)] = dist.name
        return name

    def is_builtin(self, ep: Any) -> bool:
        return self.name(ep) == DISTRIBUTION


def _claimed_twice(name: str, first: str, second: str) -> str:
    return (
        f"plugin name {name!r} is claimed twice: by {first} and by {second}; "
        f"uninstall one, or disable the name ([plugins] disabled) to load neither"
    )


def _failed(plugin_name: str, hook_name: str, exc: Exception) -> PluginError:
    return PluginError(f"plugin {plugin_name!r} failed in {hook_name}: {exc!r}")


def _default_name(plugin: object) -> str:
    if inspect.ismodule(plugin):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"
