"""The ``options`` of a SQL connection, checked against what its client takes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from haze._base.errors import ConfigError
from haze._base.hints import did_you_mean

__all__ = ["check_client_options"]


def check_client_options(
    options: Mapping[str, Any], known: Iterable[str], *, key: str, client: str
) -> None:
    """Refuse an option the database client's connect() does not take, in one line, at
    start (the client's own TypeError came at the first statement, as a traceback)."""
    names = set(known)
    for option in options:
        if option not in names:
            raise ConfigError(
                f"{client} takes no connection option {option!r}"
                f"{did_you_mean(str(option), names)}; these keys are passed to it as they are",
                key=f"{key}.{option}",
            )
