"""Named plugins: what an installed distribution adds to haze, found by name.

A queue driver, a cache store, a database backend or a platform's bindings that haze
does not ship (``haze_cloudflare`` adds the ``kv`` store and the Worker bindings) is
declared as an entry point in the distribution's ``pyproject.toml``::

    [project.entry-points."haze.stores"]
    kv = "haze_cloudflare.kv:KVStore"

======================  ==================================  ==================================
group                   name                                the object
======================  ==================================  ==================================
``haze.drivers``        a queue connection's ``driver``     a class ``(name, options, app)``
``haze.stores``         a store's ``driver``                a class ``(name, options, app)``
``haze.connectors``     a database URL's dialect (scheme)   a class ``(name, options, root=)``
``haze.bindings``       ``cloudflare``, ``d1``              the Worker-binding lookup the
                                                            built-in backend of that name
                                                            uses when a binding is bound
``haze.offload``        an offload URL's scheme (``r2``)    an ``ObjectStore`` class ``(url)``
======================  ==================================  ==================================

One :class:`Registry` per group (``haze.drivers``, ``haze.stores``, ``haze.connectors``
each hold one) checks its built-in table first, then asks here: names registered in
this process (``register``, for a bundle that vendors a package without its
``.dist-info``, where no entry point is found), then the group's entry points. The
entry points are read once per group, and only when a name is not found otherwise:
``importlib.metadata`` costs a cold start.

A target is ``"module:attribute"`` (imported on first use) or the object itself.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from haze._base.deps import load_by_name
from haze._base.errors import ConfigError

__all__ = [
    "BINDINGS",
    "CONNECTORS",
    "DRIVERS",
    "GROUPS",
    "OFFLOAD",
    "STORES",
    "Registry",
    "find",
    "names",
    "register",
]

DRIVERS = "haze.drivers"
STORES = "haze.stores"
CONNECTORS = "haze.connectors"
BINDINGS = "haze.bindings"
OFFLOAD = "haze.offload"
GROUPS = (DRIVERS, STORES, CONNECTORS, BINDINGS, OFFLOAD)

_registered: dict[str, dict[str, object]] = {}
_published: dict[str, dict[str, str]] = {}
_loaded: dict[tuple[str, str], object] = {}

# "module:attr.path", optionally followed by "[extras]" (ignored, as pip does at run time)
_TARGET = re.compile(r"^\s*([\w.]+)\s*(?::\s*([\w.]+))?\s*(?:\[.*\])?\s*$")


def register(group: str, name: str, target: object) -> None:
    """Make ``name`` in ``group`` resolve to ``target`` in this process (before any entry
    point of that name). ``target`` is an object or a lazy ``"module:attribute"``."""
    _registered.setdefault(group, {})[name] = target
    _loaded.pop((group, name), None)


def unregister(group: str, name: str) -> None:
    """Forget what :func:`register` made ``name`` in ``group`` stand for (tests, reloads)."""
    _registered.get(group, {}).pop(name, None)
    _loaded.pop((group, name), None)


def find(group: str, name: str) -> Any:
    """The object ``name`` stands for in ``group``, or None when nothing provides it.

    A target that fails to import raises its own error, with a note naming the plugin.
    """
    key = (group, name)
    if key in _loaded:
        return _loaded[key]
    target = _registered.get(group, {}).get(name)
    if target is None:
        target = _entry_points(group).get(name)
    if target is None:
        return None
    value = _resolve(group, name, target) if isinstance(target, str) else target
    _loaded[key] = value
    return value


def names(group: str) -> list[str]:
    """Every name ``group`` provides here (registered or published), sorted."""
    return sorted({*_registered.get(group, {}), *_entry_points(group)})


def _entry_points(group: str) -> dict[str, str]:
    if group not in _published:
        # stdlib, but costly to import: only reached when a name is not found otherwise
        from importlib.metadata import entry_points

        found: dict[str, str] = {}
        for ep in entry_points(group=group):
            found.setdefault(ep.name, ep.value)  # the first distribution wins
        _published[group] = found
    return _published[group]


def _resolve(group: str, name: str, target: str) -> object:
    match = _TARGET.match(target)
    if match is None:
        raise ValueError(f"{group} plugin {name!r}: {target!r} is not 'module:attribute'")
    module, attrs = match.group(1), match.group(2) or ""
    try:
        value: object = importlib.import_module(module)
        for attr in filter(None, attrs.split(".")):
            value = getattr(value, attr)
    except (ImportError, AttributeError) as e:
        e.add_note(f"while loading the {group} plugin {name!r} ({target})")
        raise
    return value


@dataclass(frozen=True)
class Registry:
    """The classes one kind of backend is looked up by name in: a built-in table of
    ``name -> (module, attribute)`` (imported only when a config names it), then the
    plugins of ``group``. The wordings are the kind's own; each is a ``str.format``
    template:

    - ``taken``: ``register`` of a built-in name (``{name}``);
    - ``what``: the backend a built-in module that this install lacks was (``{name}``);
    - ``unknown``: a name nothing provides (``{name}``, ``{subject}``: what the user
      wrote, by default the name; ``{known}``: every name, comma-separated; ``{group}``).

    >>> REGISTRY = Registry("haze.drivers", {"memory": ("haze.drivers.memory", "MemoryDriver")},
    ...     taken="{name!r} is built in", what="the {name!r} driver",
    ...     unknown="no queue driver is named {subject!r} (known: {known})")
    """

    group: str
    built_in: Mapping[str, tuple[str, str]]
    taken: str
    what: str
    unknown: str

    def register(self, name: str, target: object) -> None:
        """Make ``name`` stand for ``target`` (an object or ``"module:attribute"``) in this
        process; a built-in name is not taken over (``ValueError``)."""
        if name in self.built_in:
            raise ValueError(self.taken.format(name=name))
        register(self.group, name, target)

    def names(self) -> list[str]:
        """Every name this registry resolves here: built in, registered or published."""
        return sorted({*self.built_in, *names(self.group)})

    def load(self, name: str, *, source: str = "", key: str = "", subject: str = "") -> Any:
        """The object ``name`` stands for, or ``ConfigError`` at ``source``/``key`` saying
        what is known and how a package adds one."""
        if name in self.built_in:
            module, attr = self.built_in[name]
            what = self.what.format(name=name)
            return load_by_name(module, attr, what=what, source=source, key=key)
        found = find(self.group, name)
        if found is None:
            known = ", ".join(self.names())
            message = self.unknown.format(
                name=name, subject=subject or name, known=known, group=self.group
            )
            raise ConfigError(message, source=source, key=key)
        return found
