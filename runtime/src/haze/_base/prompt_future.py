"""A future that resumes the task awaiting it at once when an I/O callback completes it.

A plain future hands the wake-up of its task to ``call_soon``: one more pass of the
event loop, with its ``epoll_wait``, per round trip, which is a few percent of a
sequential ``dispatch()``. ``deliver`` runs that wake-up right away instead, from a
protocol's ``data_received`` or a reader callback: no task is running there (checked),
so the task resumes as it would on the next pass, one pass sooner. Every other way the
future ends (``set_result``, ``set_exception``, ``cancel``) schedules it as usual.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

__all__ = ["PromptFuture"]

_current_task = asyncio.current_task


class PromptFuture(asyncio.Future[Any]):
    """See the module docstring."""

    _waker: tuple[Callable[[Any], object], contextvars.Context] | None = None

    def add_done_callback(
        self, fn: Callable[[Any], object], *, context: contextvars.Context | None = None
    ) -> None:
        # the first callback given a context: the wake-up of the task that awaits it
        if self._waker is None and context is not None and not self.done():
            self._waker = (fn, context)
            return
        super().add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        waker = self._waker
        if waker is not None and waker[0] == fn:
            self._waker = None
            return 1 + super().remove_done_callback(fn)
        return super().remove_done_callback(fn)

    def _wake_later(self) -> None:
        waker = self._waker
        if waker is not None:
            self._waker = None
            self.get_loop().call_soon(waker[0], self, context=waker[1])

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._wake_later()

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        self._wake_later()

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        self._wake_later()
        return True

    def deliver(self, reply: Any) -> None:
        if isinstance(reply, BaseException):
            super().set_exception(reply)
        else:
            super().set_result(reply)
        waker = self._waker
        if waker is not None:
            self._waker = None
            if _current_task() is None:
                waker[1].run(waker[0], self)
            else:  # pragma: no cover - data_received runs outside tasks
                self.get_loop().call_soon(waker[0], self, context=waker[1])
