"""``env()``: the app's environment, read where the app runs (``os.environ``, or a
Worker's vars and secrets through ``env_source``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar, overload

from haze._kernel.errors import ConfigError

__all__ = ["EnvValue", "env", "env_source", "origin", "read_env"]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


#: Where ``env()`` looks before ``os.environ`` in this context: a Cloudflare Worker's
#: ``env`` (vars and secrets) during one invocation (``env_source``).
_source: ContextVar[Callable[[str], str | None] | None] = ContextVar(
    "haze_env_source", default=None
)


@contextmanager
def env_source(lookup: Callable[[str], str | None]) -> Iterator[None]:
    """Make ``env()`` read ``lookup(name)`` first (``None``: not there, ``os.environ`` is
    asked) inside this block, and in the tasks started in it, only.

    A Python Worker's vars and secrets are not in ``os.environ``: they arrive with each
    invocation. ``haze_cloudflare.QueueWorker`` wraps every invocation in this, so the
    config files (read when the app boots, in the first invocation) and the jobs see
    them; two invocations running at once each see their own, and nothing is written
    to ``os.environ``.

    >>> with env_source({"QUEUE_CONNECTION": "cloudflare"}.get):
    ...     env("QUEUE_CONNECTION", "memory")
    'cloudflare'
    """
    token = _source.set(lookup)
    try:
        yield
    finally:
        _source.reset(token)


def read_env(name: str) -> str | None:
    """The raw value of variable ``name``: the context's source (``env_source``) first,
    then ``os.environ``; ``None`` when neither has it."""
    lookup = _source.get()
    if lookup is not None:
        value = lookup(name)
        if value is not None:
            return value
    return os.environ.get(name)


@overload
def env(name: str) -> str | None: ...
@overload
def env(name: str, default: T) -> str | T: ...
def env(name: str, default: object = None) -> object:
    """Read an environment variable, cast to the type of ``default`` when it is a bool/int/float.

    Inside a Cloudflare Worker it reads the Worker's vars and secrets (see ``env_source``).

    >>> env("QUEUE_CONNECTION", "memory")
    'memory'
    """
    raw = read_env(name)
    if raw is None:
        return default
    if isinstance(default, bool):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"expected a boolean (true/false), got {raw!r}", key=f"env {name}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"expected an integer, got {raw!r}", key=f"env {name}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"expected a number, got {raw!r}", key=f"env {name}") from None
    return EnvValue(raw, name)


class EnvValue(str):
    """A string read by :func:`env`: it remembers its variable, so a bad value is
    reported against the variable it came from, not only the config key."""

    variable: str

    def __new__(cls, value: str, variable: str) -> EnvValue:
        self = super().__new__(cls, value)
        self.variable = variable
        return self


def origin(value: object) -> str:
    """`` (from the environment variable X)`` for a value :func:`env` read, else ``""``."""
    return (
        f" (from the environment variable {value.variable})" if isinstance(value, EnvValue) else ""
    )
