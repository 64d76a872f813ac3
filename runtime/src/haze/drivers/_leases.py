"""The starting worker's check that one heartbeat round can renew all its leases in time
(``LeaseBudget``), shared by the drivers whose leases a heartbeat renews."""

from __future__ import annotations

import math

__all__ = ["lease_warning"]


def lease_warning(
    connection: str,
    backend: str,
    concurrency: int,
    *,
    rate: float,
    interval: float,
    retry_after: float,
) -> str | None:
    """A line when renewing ``concurrency`` leases at about ``rate`` a second (what one
    heartbeat round renews on a typical server of ``backend``) takes longer than the
    heartbeat ``interval``; else None.

    A round that long ends behind the next one, and a job renewed early in one round
    and late in the next goes longer than ``retry_after`` without a renewal: its lease
    runs out and the job runs again elsewhere, or on this worker."""
    took = concurrency / rate
    if took <= interval:
        return None
    needed = math.ceil(retry_after * took / interval)
    return (
        f"connection {connection!r}: --concurrency {concurrency} is more leases than one "
        f"heartbeat renews in time on {backend} (about {rate:,.0f} a second: {took:.1f}s "
        f"a round, due every {interval:.1f}s for retry_after {retry_after:g}s), so jobs "
        f"may run twice; lower --concurrency to {int(rate * interval):,} or raise "
        f"retry_after to {needed}s or more"
    )
