"""The lease: one holder per state ID for a whole run, on any store.

The lease is an object beside ``state.json`` holding a :class:`LeaseRecord`. Each
concern has its module, to be read top to bottom:

- ``record.py``: the record, and what reads it (:func:`read_lease`, expiry, naming);
- ``claim.py``: what a holder knows of its claim (record, version, lost or not);
- ``acquire.py``: taking it, a create-if-absent or a compare-and-swap takeover;
- ``hold.py``: holding it, renewals by compare-and-swap from a heartbeat thread, each
  bound by a deadline before the lease expires; confirming is renewing (fencing); the
  run's checkpoints are the heartbeat's chore between renewals;
- ``settle.py``: a write whose answer was lost, settled by reading the lease back;
- ``release.py``: giving it up, and ``lock break``.

:class:`Lease` puts the parts together; everything a caller needs is importable from here.
"""

from __future__ import annotations

from typing import Any

from mapper_state.core.lease.acquire import Acquiring
from mapper_state.core.lease.hold import Chore, Holding
from mapper_state.core.lease.record import (
    BROKEN,
    HELD,
    LEASE_FILE,
    RELEASED,
    LeaseRecord,
    LeaseTiming,
    current_command,
    format_time,
    is_held_by,
    lease_key,
    lost_to,
    new_run_id,
    read_lease,
    releases_by_delete,
    skew_allowance,
)
from mapper_state.core.lease.release import Releasing, break_lease
from mapper_state.core.lease.settle import check_seconds
from mapper_state.stores.base import BlobStore

__all__ = [
    "BROKEN",
    "HELD",
    "LEASE_FILE",
    "RELEASED",
    "Chore",
    "Lease",
    "LeaseRecord",
    "LeaseTiming",
    "break_lease",
    "check_seconds",
    "current_command",
    "format_time",
    "is_held_by",
    "lease_key",
    "lost_to",
    "new_run_id",
    "read_lease",
    "releases_by_delete",
    "skew_allowance",
]


class Lease(Acquiring, Holding, Releasing):
    """This process's claim on one state ID: ``with Lease(store, state_id, ttl=...):``."""

    @classmethod
    def for_settings(
        cls, store: BlobStore, state_id: str, settings: LeaseTiming, **kwargs: Any
    ) -> Lease:
        """A lease with the TTL, poll interval and wait time the settings give."""
        kwargs.setdefault("secrets", settings.secrets())
        return cls(
            store,
            state_id,
            ttl=settings.lock_timeout,
            retry=settings.lock_retry,
            wait=settings.lock_wait,
            **kwargs,
        )

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
