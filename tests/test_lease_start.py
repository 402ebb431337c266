"""A lease whose taking was slow starts renewed, with the heartbeat's whole window ahead.

The record a run writes to take the lease is made before the write; when the write is
slow (the store retried it, or its answer was lost and read back), the lease it leaves
may be due for renewal by the time the run holds it. The heartbeat used to get only
what was left before the renewal deadline, and under load on a busy store a run gave
its lease up a fraction of a second after it began (the mutual-exclusion chaos test
caught it: a round held for 0.27 s, lost for "the store did not answer in time").
The clock is the lease's own (``clock=``), moved by the store's slow answer: no sleeps.
"""

from __future__ import annotations

from mapper_state.core.lease import Lease
from mapper_state.core.lease.protocol import renewal_interval
from mapper_state.core.lease.record import read_lease, skew_allowance
from mapper_state.stores.memory import MemoryStore

TTL = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class SlowCreate(MemoryStore):
    """A store whose create is answered ``late`` seconds after the lease's record was made."""

    def __init__(self, clock: Clock, late: float) -> None:
        super().__init__()
        self.clock, self.late = clock, late

    def create(self, key: str, data: bytes) -> str:
        version = super().create(key, data)
        self.clock.now += self.late
        return version


def test_a_lease_taken_slowly_is_renewed_before_the_run_starts() -> None:
    clock = Clock()
    store = SlowCreate(clock, late=renewal_interval(TTL) + 1)
    lease = Lease(store, "dev:slow-create", ttl=TTL, clock=clock)
    lease.acquire()
    assert lease.record is not None
    # the heartbeat starts with its whole window: its first renewal not yet due ...
    assert lease.record.renewed_at == clock.now
    assert lease.record.renewed_at + renewal_interval(TTL) > clock.now
    assert lease.record.expires_at - skew_allowance(TTL) - clock.now == TTL - skew_allowance(TTL)
    # ... and the store holds that renewed lease, at the version the run knows
    held, blob = read_lease(store, "dev:slow-create")
    assert held == lease.record
    assert blob is not None
    assert blob.version == lease.version
    lease.release()


def test_a_lease_taken_in_time_costs_no_renewal() -> None:
    clock = Clock()
    store = SlowCreate(clock, late=renewal_interval(TTL) - 1)
    lease = Lease(store, "dev:timely-create", ttl=TTL, clock=clock)
    lease.acquire()
    assert lease.record is not None
    assert lease.record.renewed_at == lease.record.acquired_at == clock.now - store.late
    lease.release()
