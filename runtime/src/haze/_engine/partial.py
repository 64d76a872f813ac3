"""How far a ``Queue.bulk`` got when one of its connections' sends failed."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from haze._base.describe import error_line
from haze._base.errors import DispatchIncompleteError, DispatchOutcomeUnknownError

if TYPE_CHECKING:
    from haze._base.message import Message

__all__ = ["Sent"]

#: connection -> its (body, message, delay) items
Groups = dict[str, list[tuple[str, "Message", float]]]


class Sent:
    """How far ``bulk`` got: a group that fails after others were queued is raised as
    ``DispatchIncompleteError`` naming every message not queued (its own and the later
    groups'; the singles, which have no id yet, are counted in ``unsent``), so no caller
    counts a queued message as lost."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.queued = 0

    def failed(self, error: BaseException, ids: list[str], groups: Groups, conn: str) -> NoReturn:
        partial = error if isinstance(error, DispatchIncompleteError) else None
        if not isinstance(error, Exception) or (not self.queued and partial is None):
            raise error  # nothing was queued, or it may have been (or the process is stopping)
        why = error_line(error)
        if partial is not None:
            failed, unknown = dict(partial.failed), list(partial.unknown)
        elif isinstance(error, DispatchOutcomeUnknownError):
            # the group's send lost its reply: those it names may be queued, the group's
            # others were not sent after them
            maybe = set(error.job_ids)
            unknown = [i for i in ids if i in maybe]
            failed = {i: why for i in ids if i not in maybe}
        else:
            failed, unknown = dict.fromkeys(ids, why), []
        later = list(groups)[list(groups).index(conn) + 1 :]
        failed |= {m.id: f"not sent: {why}" for c in later for _, m, _ in groups[c]}
        singles = self.total - sum(len(items) for items in groups.values())
        queued = self.total - len(failed) - len(unknown) - singles
        maybe_queued = (
            f"; {len(unknown)} may be queued (their send lost its reply): look those up by "
            "id (Queue.status) before dispatching them again, or they may run twice"
            if unknown
            else ""
        )
        raise DispatchIncompleteError(
            f"{queued} of {self.total} messages were queued, "
            f"{self.total - queued - len(unknown)} not{maybe_queued}: {why}",
            failed=failed,
            unsent=self.total - queued - len(unknown),
            unknown=unknown,
        ) from error
