"""Job routes: the ``routes`` table of ``config/queue.py``, job-name glob -> queue and/or
connection.

Resolution, field by field (queue and connection each on their own), first set wins::

    call site (.on_queue / .on_connection, a chain's or batch's own)
      > the job definition (define_job(queue=..., connection=...))
      > the route of the job's name
      > the config's default connection / the "default" queue

Which route a name takes: a pattern that equals the name wins (a job named with glob
characters, ``report[eu]``, is routed by its exact name too); else the first glob, in
table order, that matches it (``fnmatch``: ``*`` also matches dots, case-sensitive).

>>> routes = JobRoutes((JobRoute("mail.*", queue="mail"),
...                     JobRoute("reports.Nightly", connection="sqs")))
>>> routes.match("mail.welcome").queue
'mail'
>>> routes.queue_for("mail.welcome", None), routes.queue_for("mail.welcome", "vip")
('mail', 'vip')
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["GLOB_CHARACTERS", "JobRoute", "JobRoutes", "is_glob"]

#: The characters that make a pattern a glob (``fnmatch``'s).
GLOB_CHARACTERS = frozenset("*?[")


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` has a glob character (else it names one job exactly)."""
    return any(c in GLOB_CHARACTERS for c in pattern)


@dataclass(frozen=True)
class JobRoute:
    """One row of the table: the jobs whose name matches ``pattern`` go to ``queue``
    and/or ``connection`` unless the call site or the definition says otherwise."""

    pattern: str
    queue: str | None = None
    connection: str | None = None

    def matches(self, name: str) -> bool:
        return name == self.pattern or (is_glob(self.pattern) and fnmatchcase(name, self.pattern))


class JobRoutes:
    """The checked ``routes`` table, in its config order (empty: no routing)."""

    __slots__ = ("_exact", "_globs", "_matched", "_routes")

    def __init__(self, routes: tuple[JobRoute, ...] = ()) -> None:
        self._routes = routes
        # Every pattern, globs too: a name with glob characters in it (report[eu]) is
        # reached by its exact name, which a glob read of it would not match.
        self._exact: dict[str, JobRoute] = {}
        for r in routes:
            self._exact.setdefault(r.pattern, r)
        self._globs = tuple(r for r in routes if is_glob(r.pattern))
        #: name -> its route: dispatch asks once per job name, not once per message
        self._matched: dict[str, JobRoute | None] = {}

    def __iter__(self) -> Iterator[JobRoute]:
        return iter(self._routes)

    def __len__(self) -> int:
        return len(self._routes)

    def __bool__(self) -> bool:
        return bool(self._routes)

    def __repr__(self) -> str:
        return f"JobRoutes({list(self._routes)!r})"

    def match(self, name: str) -> JobRoute | None:
        """The route job ``name`` takes (None: no route matches it)."""
        if not self._routes:
            return None
        try:
            return self._matched[name]
        except KeyError:
            pass
        route = self._exact.get(name) or next((r for r in self._globs if r.matches(name)), None)
        self._matched[name] = route
        return route

    def queue_for(self, name: str, own: str | None) -> str | None:
        """The queue of job ``name`` before the call site: its definition's ``own``,
        else its route's (None: neither says; the caller's default applies)."""
        if own is not None:
            return own
        route = self.match(name)
        return None if route is None else route.queue

    def connection_for(self, name: str, own: str | None) -> str | None:
        """The connection of job ``name`` before the call site, as :meth:`queue_for`."""
        if own is not None:
            return own
        route = self.match(name)
        return None if route is None else route.connection
