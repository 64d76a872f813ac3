"""The haze pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:

``queue_fake``
    ``Queue.fake()`` for the test, ``Queue.restore()`` after it::

        async def test_invoice(queue_fake):
            await send_invoice.dispatch({"invoice_id": 1})
            queue_fake.assert_dispatched(send_invoice)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from haze.api.facade import Queue
from haze.testing import FakeQueue


@pytest.fixture
def queue_fake() -> Iterator[FakeQueue]:
    """A fresh ``Queue.fake()``, restored when the test ends."""
    fake = Queue.fake()
    try:
        yield fake
    finally:
        Queue.restore()
