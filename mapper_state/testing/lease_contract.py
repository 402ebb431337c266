"""The lease contract: what every store must let the lease guarantee.

Subclass :class:`LeaseContract` beside :class:`StoreContract` with the same
``store`` and ``second_client`` fixtures (two independent clients of one location).
"""

from __future__ import annotations

import functools
import threading
import time

import pytest

from mapper_state.core import state
from mapper_state.core.lease import (
    Lease,
    break_lease,
    read_lease,
    releases_by_delete,
    skew_allowance,
)
from mapper_state.errors import LeaseBusy, LeaseLost
from mapper_state.stores.base import BlobStore, PreconditionFailed
from mapper_state.testing.racing import race
from mapper_state.testing.store_contract import write_state


def expired_lease(store: BlobStore, state_id: str) -> Lease:
    """A lease taken on ``state_id`` and let expire, as a holder that stalled would."""
    lease = Lease(store, state_id, ttl=0.5)
    lease.acquire()
    time.sleep(0.7)
    return lease


class LeaseContract:
    def test_acquire_is_exclusive_and_names_the_holder(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        first = Lease(store, "dev:tap-a-to-target-b", ttl=30, run_id="run-one")
        first.acquire()
        second = Lease(second_client, "dev:tap-a-to-target-b", ttl=30)
        with pytest.raises(LeaseBusy, match=r"held by run run-one on host .* \(pid \d+\)"):
            second.acquire()
        first.release()
        second.acquire()
        second.release()
        record, blob = read_lease(store, "dev:tap-a-to-target-b")
        if releases_by_delete(store):
            assert blob is None
        else:  # the store ignores delete conditions, or is not known to enforce them
            assert record is not None
            assert record.status == "released"

    def test_renewal_keeps_a_lease_past_its_ttl(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        # A renewal has TTL - TTL/3 - skew allowance to answer: 2.3 s at a TTL of 5 s, room
        # for an emulator on a loaded machine (at 1.5 s it had 0.7 s, and Ceph RGW under the
        # whole suite once took longer: the lease was correctly given up).
        holder = Lease(store, "long", ttl=5)
        holder.acquire()
        holder.start_heartbeat()
        time.sleep(8)  # well past ttl + skew allowance (6 s)
        with pytest.raises(LeaseBusy):
            Lease(second_client, "long", ttl=5).acquire()
        assert holder.lost is None
        holder.release()

    def test_expired_lease_is_taken_over(self, store: BlobStore, second_client: BlobStore) -> None:
        # a TTL of 3 s: the busy check must come before the expiry on a loaded machine too
        crashed = Lease(store, "crash", ttl=3)
        crashed.acquire()  # never renewed, never released: a SIGKILLed holder
        with pytest.raises(LeaseBusy):
            Lease(second_client, "crash", ttl=3).acquire()
        time.sleep(3 + skew_allowance(3) + 0.5)  # expired, even to a clock that lags
        taker = Lease(second_client, "crash", ttl=30, run_id="taker")
        taker.acquire()
        record, _ = read_lease(store, "crash")
        assert record is not None
        assert record.run_id == "taker"
        with pytest.raises(LeaseLost):
            crashed.renew()  # the old holder learns it lost the lease
        taker.release()

    def test_waiting_for_a_busy_lease(self, store: BlobStore, second_client: BlobStore) -> None:
        first = Lease(store, "wait", ttl=30)
        first.acquire()
        threading.Timer(0.5, first.release).start()
        waiter = Lease(second_client, "wait", ttl=30, retry=0.1, wait=10)
        started = time.monotonic()
        waiter.acquire()
        assert time.monotonic() - started < 10
        waiter.release()

    def test_takeover_race_has_one_winner(self, store: BlobStore, second_client: BlobStore) -> None:
        for round_ in range(3):
            state_id = f"race-{round_}"
            expired_lease(store, state_id)
            leases = [Lease((store, second_client)[i % 2], state_id, ttl=30) for i in range(4)]

            def take(lease: Lease) -> bool:
                try:
                    lease.acquire()
                    return True
                except LeaseBusy:
                    return False

            winners = race([functools.partial(take, lease) for lease in leases])
            assert len(winners) == 1
            leases[winners[0]].release()

    def test_broken_lease_fences_the_old_holder(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        holder = Lease(store, "fenced", ttl=30)
        holder.acquire()
        version = write_state(store, "fenced", {"bookmark": 1}, None)
        break_lease(second_client, "fenced")
        with pytest.raises(LeaseLost):
            holder.confirm()
        assert state.load(store, "fenced").value == {"bookmark": 1}
        assert version

    def test_state_write_is_conditional_on_the_version_seen(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        v1 = write_state(store, "cas", {"b": 1}, None)
        write_state(second_client, "cas", {"b": "other writer"}, v1)
        with pytest.raises(PreconditionFailed):
            write_state(store, "cas", {"b": 2}, v1)
        with pytest.raises(PreconditionFailed):
            write_state(store, "cas", {"b": 3}, None)  # we saw none, someone created it
        assert state.load(store, "cas").value == {"b": "other writer"}

    def test_a_stalled_holder_cannot_renew_a_lease_created_after_its_own(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        # its lease expired, was taken over and released, then a third run created a new
        # one: a store whose versions restart after a delete would let the stalled holder's
        # version match the new lease (A-B-A)
        stalled = expired_lease(store, "aba")
        taker = Lease(second_client, "aba", ttl=30)
        taker.acquire()
        taker.release()
        newest = Lease(second_client, "aba", ttl=30, run_id="newest")
        newest.acquire()
        with pytest.raises(LeaseLost):
            stalled.renew()
        record, _ = read_lease(store, "aba")
        assert record is not None
        assert record.run_id == "newest"
        newest.release()

    def test_release_of_a_lost_lease_leaves_the_new_holder_alone(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        # also on a store that ignores delete conditions: release is by compare-and-swap there
        old = expired_lease(store, "handover")
        new = Lease(second_client, "handover", ttl=30, run_id="new")
        new.acquire()
        old.release()
        record, _ = read_lease(store, "handover")
        assert record is not None
        assert record.run_id == "new"
        new.release()
