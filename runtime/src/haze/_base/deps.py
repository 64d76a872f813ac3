"""Optional dependencies: import one, or say which ``haze-jobs[extra]`` installs it."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from haze._base.errors import ConfigError, MissingDependencyError
from haze._base.hints import install_hint

__all__ = ["import_if_present", "load_by_name", "require"]


def _absent(error: ImportError, module: str) -> bool:
    """Whether ``error`` says ``module`` itself (or a package above it) does not exist."""
    name = error.name if isinstance(error, ModuleNotFoundError) else None
    return bool(name) and (module == name or module.startswith(f"{name}."))


def import_if_present(module: str) -> ModuleType | None:
    """``module`` imported, or None when it does not exist (an optional part of haze).

    A module that exists but fails to import raises as usual.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if _absent(e, module):
            return None
        raise


def load_by_name(module: str, attr: str, *, what: str, source: str, key: str) -> Any:
    """``module.attr`` (a driver, store or backend class named by config), or
    ``ConfigError`` at ``key`` when this install of haze has no such module."""
    found = import_if_present(module)
    if found is None:
        raise ConfigError(
            f"{what} is not available in this version of haze", source=source, key=key
        )
    return getattr(found, attr)


def require(module: str, *, what: str, extra: str, package: str | None = None) -> ModuleType:
    """``module`` imported, or ``MissingDependencyError`` naming ``haze-jobs[extra]``.

    ``what`` names the feature that needs it ("the sqs driver"), ``package`` the
    distribution to name in the message (default: ``module``'s top-level package).
    Only the module itself (or a package above it) being absent counts as missing: an
    installed package that fails to import (one of *its* dependencies is absent, a
    native library will not load) raises its own error, which says what is really
    wrong, with a note on the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        name = package or module.partition(".")[0]
        if _absent(e, module):
            raise MissingDependencyError(what, extra, name) from None
        e.add_note(f"{what} needs '{name}': {install_hint(extra)}")
        raise
