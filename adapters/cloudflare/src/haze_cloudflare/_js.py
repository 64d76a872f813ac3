"""Crossing the JavaScript boundary, and the Worker ``env`` haze reads bindings from.

Under Pyodide (a Python Worker) values going to JS pass through ``to_js(...,
dict_converter=Object.fromEntries)`` so dicts become plain objects (not ``Map``), and
``None`` becomes JS ``null`` where it matters (D1 parameters: ``undefined`` is not a SQL
value). Values coming back pass through ``.to_py()``; JS ``null`` may arrive as
``pyodide.ffi.jsnull`` and ``undefined`` as a JsProxy, both read as ``None``.

Outside Pyodide (CPython tests with plain Python stand-ins) every helper passes values
through unchanged, so the adapter imports and runs anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:  # Pyodide (Cloudflare Python Workers, or Pyodide under Node.js in tests)
    import js
    from pyodide.ffi import JsProxy
    from pyodide.ffi import to_js as _to_js

    IN_PYODIDE = True
except ImportError:  # CPython
    js = None
    JsProxy = None
    _to_js = None
    IN_PYODIDE = False

try:
    from pyodide.ffi import jsnull as _jsnull
except ImportError:
    _jsnull = None

import haze.driver_api as _api

from haze_cloudflare import _plugins

__all__ = [
    "IN_PYODIDE",
    "bind_env",
    "binding",
    "current_env",
    "env_vars",
    "is_nullish",
    "js_null",
    "register_plugins",
    "to_js",
    "to_py",
]

_env: Any = None
#: No env bound yet in this isolate: the next ``bind_env`` is its first request.
_first_request = True


def bind_env(env: Any) -> None:
    """Make a Worker's ``env`` (its bindings) the one haze uses (``QueueWorker`` calls it on
    every invocation; call it yourself before dispatching from a plain Worker)."""
    global _env, _first_request
    # A Worker bundle has no .dist-info to read entry points from: the table is
    # registered here, at the first request, not at import (an isolate's cold start).
    register_plugins()
    if _first_request and env is not None:
        # Every isolate of a deployed Worker starts from one memory snapshot of the
        # top-level code: an id prefix drawn there would be every isolate's.
        _api.new_id_prefix()
        _first_request = False
    _env = env


def register_plugins() -> None:
    """Register this adapter's plugins in this process (a bundle has no entry points)."""
    _plugins.register()


def current_env() -> Any:
    return _env


def binding(name: str) -> Any:
    """The binding ``name`` of the bound env, or None (no env bound, or no such binding)."""
    return _member(_env, name)


def env_vars(env: Any) -> Callable[[str], str | None]:
    """``env()``'s view of a Worker ``env``: its vars and secrets as strings (a JSON var
    that is a number or a boolean too); a binding or an object var is not a variable."""

    def lookup(name: str) -> str | None:
        value = _member(env, name)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (str, int, float)):
            return str(value)
        return None

    return lookup


def _member(env: Any, name: str) -> Any:
    if env is None or not name:
        return None
    value = None
    if isinstance(env, dict):
        value = env.get(name)
    else:
        try:
            value = getattr(env, name)
        except AttributeError:
            value = None
        if value is None:
            try:
                value = env[name]
            except Exception:
                value = None
    return None if is_nullish(value) else value


def js_null() -> Any:
    """JS ``null`` (``None`` outside Pyodide)."""
    if _jsnull is not None:
        return _jsnull
    if js is not None:
        return js.JSON.parse("null")
    return None


def is_nullish(value: Any) -> bool:
    """None (also JS ``undefined``) or JS ``null`` (``jsnull``)."""
    return value is None or (_jsnull is not None and value is _jsnull)


def to_js(value: Any) -> Any:
    """A Python value as a JS value: dicts as plain objects (``Object.fromEntries``) and
    ``None`` as ``null`` at any depth (``to_js`` alone would make it ``undefined``, which
    JSON drops: ``{"a": None}`` would arrive as ``{}``)."""
    if _to_js is None:
        return value
    if value is None:
        return js_null()
    if isinstance(value, (str, int, float, bool)):
        return value
    return _to_js(_nulls(value), dict_converter=js.Object.fromEntries)


def _nulls(value: Any) -> Any:
    if value is None:
        return js_null()
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulls(v) for v in value]
    return value


def to_py(value: Any) -> Any:
    """A JS value as plain Python data (``jsnull`` → None at any depth; ``undefined``
    already arrives as None). Python values pass through (nulls cleaned). A JS object
    with no Python form (a ``Date``, a class instance) stays a ``JsProxy``."""
    if JsProxy is not None and isinstance(value, JsProxy):
        value = value.to_py()
        if isinstance(value, JsProxy):  # no Python form (see _clean)
            return value
    return _clean(value)


def _clean(value: Any) -> Any:
    if _jsnull is not None and value is _jsnull:
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if JsProxy is not None and isinstance(value, JsProxy):
        converted = value.to_py()
        # A JS object with no Python counterpart (a Date, a class instance) converts to
        # a new proxy of itself: stop there, or this would recurse forever.
        if isinstance(converted, JsProxy):
            return converted
        return _clean(converted)
    return value
