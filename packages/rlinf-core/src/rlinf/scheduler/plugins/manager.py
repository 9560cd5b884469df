"""Discovery and selection of plugins.

Loading is defensive: every plugin is imported, registered and asked for its
descriptors on its own, so a broken plugin is recorded with the reason and
the rest keep working.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Optional

import pluggy

from ..base import config
from ..base.errors import PluginError
from . import hookspecs
from .descriptors import AcceleratorPlugin, HardwarePlugin, LauncherPlugin, TransportPlugin

CORE_DISTRIBUTION = "rlinf-core"
_KINDS = {
    "launcher": ("rlinf_register_launchers", LauncherPlugin),
    "transport": ("rlinf_register_transports", TransportPlugin),
    "accelerator": ("rlinf_register_accelerators", AcceleratorPlugin),
    "hardware": ("rlinf_register_hardware", HardwarePlugin),
}


@dataclass
class PluginSource:
    """Where a plugin came from: its entry point and distribution."""

    entry_point: str
    module: str
    distribution: str
    version: str
    error: Optional[str] = None  # set when the plugin could not be loaded


@dataclass
class Provided:
    """One descriptor together with the plugin that provided it."""

    kind: str
    descriptor: object
    source: PluginSource
    conflicts: list = field(default_factory=list)  # other sources claiming the same name
    _usable: Optional[tuple] = None

    @property
    def name(self) -> str:
        return self.descriptor.name

    def unusable_reason(self) -> Optional[str]:
        if self.conflicts:
            dists = ", ".join(f"{s.distribution} ({s.entry_point})" for s in [self.source, *self.conflicts])
            return f"{self.kind} name {self.name!r} is registered by more than one plugin: {dists}"
        if self._usable is None:
            try:
                self._usable = (self.descriptor.check(),)
            except Exception as exc:  # a check must not raise; report it as unusable
                self._usable = (f"usability check raised {type(exc).__name__}: {exc}",)
        return self._usable[0]


def _entry_points() -> list:
    return list(md.entry_points(group=hookspecs.PROJECT))


def _explicit_modules() -> list[tuple[str, str]]:
    raw = os.environ.get(config.PLUGINS_ENV, "")
    out = []
    for item in filter(None, (x.strip() for x in raw.split(","))):
        name, _, module = item.rpartition("=")
        out.append((name or module, module))
    return out


class PluginRegistry:
    """All plugins this process knows about, loaded once.

    Building one imports every plugin advertised under the ``rlinf`` entry-point
    group (only rlinf-core's own when autoload is off), then those named in
    ``RLINF_PLUGINS`` (``name=module`` or ``module``, comma-separated), asks each
    for its descriptors and files them by kind.  A plugin that fails to import,
    does not meet the hook specs or whose hook raises is recorded in
    ``failures()`` with the reason (and a ``RuntimeWarning``); the rest load.
    A worker process loads exactly the plugins its driver loaded
    (``RLINF_PLUGIN_SOURCES``), without scanning package metadata.

    Use ``get_registry()`` for the process-wide instance; build one directly
    to look at the plugins with other settings.

    Args:
        autoload: load third-party plugins from entry points (None: ``RLINF_PLUGINS_AUTOLOAD``, on unless
            ``0``/``false``/``no``/``off``).

    Example:
        ```python
        registry = get_registry()
        launcher = registry.launcher().descriptor.factory()  # the default launcher
        cuda = registry.transport(device="cuda")  # the default transport for CUDA tensors
        for source in registry.failures():
            print(source.entry_point, source.error)
        ```
    """

    def __init__(self, autoload: Optional[bool] = None):
        self.autoload = config.autoload_enabled() if autoload is None else autoload
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.sources: list[PluginSource] = []
        self.provided: dict[str, dict[str, Provided]] = {kind: {} for kind in _KINDS}
        self._load()

    # -- loading ----------------------------------------------------------
    def _load(self) -> None:
        pinned = os.environ.get(config.PLUGIN_SOURCES_ENV)
        if pinned:  # a worker process: load what the driver loaded, without scanning metadata
            for entry_point, module, dist, version in json.loads(pinned):
                self._load_one(PluginSource(entry_point, module, dist, version))
            return
        candidates = []
        for ep in _entry_points():
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else "?"
            version = dist.version if dist is not None else "?"
            if not self.autoload and dist_name != CORE_DISTRIBUTION:
                continue
            candidates.append(PluginSource(ep.name, ep.value, dist_name, version))
        known = {c.module for c in candidates}
        for name, module in _explicit_modules():
            if module not in known:
                candidates.append(PluginSource(name, module, self._dist_of(module), "?"))
        for source in candidates:
            self._load_one(source)

    @staticmethod
    def _dist_of(module: str) -> str:
        top = module.split(".")[0]
        dists = md.packages_distributions().get(top, [])
        return dists[0] if len(dists) == 1 else f"module {module}"

    def _fail(self, source: PluginSource, what: str) -> None:
        source.error = what
        warnings.warn(
            f"rlinf plugin {source.entry_point!r} ({source.module}) from distribution "
            f"{source.distribution} {source.version} is disabled: {what.splitlines()[0]}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _load_one(self, source: PluginSource) -> None:
        self.sources.append(source)
        try:
            module = importlib.import_module(source.module)
        except BaseException as exc:  # SystemExit from a plugin must not end the program
            self._fail(source, f"import failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return
        plugin_name = f"{source.distribution}:{source.entry_point}"
        if self.pm.is_registered(module):
            return  # the same module advertised twice: load once
        try:
            self.pm.register(module, name=plugin_name)
            self.pm.check_pending()
        except Exception as exc:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            self._fail(source, f"does not meet the hook specs: {exc}")
            return
        hooks_found = False
        for kind, (hook_name, cls) in _KINDS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                if impl.plugin is not module:
                    continue
                hooks_found = True
                try:
                    result = impl.function()
                except Exception as exc:
                    self._fail(source, f"hook {hook_name} raised {type(exc).__name__}: {exc}")
                    continue
                for descriptor in result or []:
                    if not isinstance(descriptor, cls) or not isinstance(getattr(descriptor, "name", None), str):
                        self._fail(source, f"hook {hook_name} returned {descriptor!r}, not a {cls.__name__}")
                        continue
                    self._add(kind, descriptor, source)
        if not hooks_found:
            self._fail(source, "it implements no rlinf hook")

    def _add(self, kind: str, descriptor, source: PluginSource) -> None:
        table = self.provided[kind]
        existing = table.get(descriptor.name)
        if existing is not None:
            existing.conflicts.append(source)
            return
        table[descriptor.name] = Provided(kind, descriptor, source)

    def sources_json(self) -> str:
        """The plugins that loaded here, for ``RLINF_PLUGIN_SOURCES`` in worker processes."""
        return json.dumps([[s.entry_point, s.module, s.distribution, s.version] for s in self.sources if not s.error])

    # -- queries ----------------------------------------------------------
    def failures(self) -> list[PluginSource]:
        """The plugins that could not be loaded, each with its ``error`` (the reason), in load order."""
        return [s for s in self.sources if s.error]

    def all_provided(self) -> list[Provided]:
        """Every descriptor of every kind the loaded plugins provide, usable here or not, with its source."""
        return [p for table in self.provided.values() for p in table.values()]

    def _pick(self, kind: str, name: Optional[str], env: str, candidates: list[Provided], what: str) -> Provided:
        table = self.provided[kind]
        chosen_by = "argument"
        if name is None:
            name = os.environ.get(env) or None
            chosen_by = f"environment variable {env}"
        if name is not None:
            entry = table.get(name)
            if entry is None:
                broken = [s for s in self.failures() if s.entry_point == name]
                hint = f" (plugin {name!r} failed to load: {broken[0].error.splitlines()[0]})" if broken else ""
                raise PluginError(
                    f"no {kind} named {name!r} (from {chosen_by}); installed {kind}s: "
                    f"{sorted(table) or 'none'}{hint}"
                )
            reason = entry.unusable_reason()
            if reason:
                raise PluginError(f"{kind} {name!r} from {entry.source.distribution} is not usable here: {reason}")
            return entry
        usable = [p for p in candidates if not p.unusable_reason()]
        if not usable:
            details = "; ".join(f"{p.name}: {p.unusable_reason()}" for p in candidates) or f"no {kind} plugin is installed"
            raise PluginError(f"no usable {kind} {what}({details})")
        return max(usable, key=lambda p: p.descriptor.priority)

    def launcher(self, name: Optional[str] = None) -> Provided:
        """The launcher to use: the one named, else ``RLINF_LAUNCHER``'s, else the usable one of highest
        priority.

        Args:
            name: a launcher's name (``"ray"``, ``"mpi"``), or None to choose as above.

        Returns:
            The ``Provided`` entry; ``.descriptor.factory()`` builds the launcher.

        Raises:
            PluginError: no launcher of that name (the message lists the installed ones and why a plugin of
                that name failed to load), the named one is unusable here (a failed ``check``, two plugins
                claiming the name), or none is usable (each one's reason).
        """
        return self._pick("launcher", name, config.LAUNCHER_ENV, list(self.provided["launcher"].values()), "")

    def transport(self, name: Optional[str] = None, device: str = "cpu") -> Provided:
        """The transport for ``device`` tensors: the one named, else ``RLINF_TRANSPORT``'s, else the usable
        one of highest priority among those serving ``device``.

        Args:
            name: a transport's name, or None to choose as above.
            device: the tensor device it must serve (``"cpu"``, ``"cuda"``).

        Returns:
            The ``Provided`` entry; ``.descriptor.factory()`` builds the transport.

        Raises:
            PluginError: no transport of that name, the named one is unusable here or does not serve
                ``device``, or no usable transport serves ``device``.
        """
        entry = self._pick(
            "transport",
            name,
            config.TRANSPORT_ENV,
            [p for p in self.provided["transport"].values() if device in p.descriptor.devices],
            f"for {device} tensors ",
        )
        if device not in entry.descriptor.devices:
            raise PluginError(
                f"transport {entry.name!r} serves {list(entry.descriptor.devices)} tensors, not {device!r}"
            )
        return entry


_registry: Optional[PluginRegistry] = None
_lock = threading.Lock()


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = PluginRegistry()
        return _registry


def reset_registry() -> None:
    """Forget loaded plugins so the next use reads entry points again."""
    global _registry
    with _lock:
        _registry = None
