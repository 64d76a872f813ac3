"""The registered jobs, by name: a message can only name a job registered here.

>>> # get_job("send_invoice")  -> its JobDefinition, or UnknownJobError naming the close ones
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from haze._base.errors import DuplicateJobError, UnknownJobError

if TYPE_CHECKING:
    from haze._jobs.definition import JobDefinition

__all__ = ["find_job", "get_job", "registered_jobs"]


_registry: dict[str, JobDefinition[Any]] = {}


def _register(defn: JobDefinition[Any]) -> None:
    existing = _registry.get(defn.name)
    if existing is not None and existing is not defn and existing.origin != defn.origin:
        raise DuplicateJobError(
            f'Two different jobs are named "{defn.name}": one defined at {existing.origin}, '
            f"the other at {defn.origin}. Rename one of them or pass name=... to define_job."
        )
    _registry[defn.name] = defn


def get_job(name: str) -> JobDefinition[Any]:
    """The job registered under ``name``; raises ``UnknownJobError``."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownJobError(name, _registry) from None


def find_job(name: str) -> JobDefinition[Any] | None:
    """The job registered under ``name``, or None."""
    return _registry.get(name)


def registered_jobs() -> dict[str, JobDefinition[Any]]:
    """A copy of the process-wide registry (name -> definition)."""
    return dict(_registry)
