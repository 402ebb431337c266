"""The lease: one holder per state ID for a whole run, on any store.

The lease is an object beside ``state.json`` holding a :class:`LeaseRecord`. Three modules,
each read top to bottom:

- ``record.py``: the record, what reads it (:func:`read_lease`, expiry, naming), and the
  one rule for "is this lease this run's?" (:func:`is_held_by`);
- ``claim.py``: the values the protocol passes: who asks (:class:`Applicant`) and the claim
  a holder has (:class:`Claim`), both immutable;
- ``protocol.py``: the steps, plain functions over those values: acquire (create-if-absent
  or a compare-and-swap takeover), renew (compare-and-swap; confirming before a write is
  renewing), settle a write whose answer was lost, release, and ``lock break``;
- ``driver.py``: :class:`Lease`, the heartbeat's driver and the only mutable state of a
  held lease: when to renew, to read, to do the run's checkpoints, and to give it up.

Everything a caller needs is importable from here.
"""

from __future__ import annotations

from mapper_state.core.lease.claim import Applicant, Claim
from mapper_state.core.lease.driver import Chore, Lease, OnLost
from mapper_state.core.lease.protocol import break_lease, check_seconds, notice_seconds
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
    winding_down_for,
)

__all__ = [
    "BROKEN",
    "HELD",
    "LEASE_FILE",
    "RELEASED",
    "Applicant",
    "Chore",
    "Claim",
    "Lease",
    "LeaseRecord",
    "LeaseTiming",
    "OnLost",
    "break_lease",
    "check_seconds",
    "current_command",
    "format_time",
    "is_held_by",
    "lease_key",
    "lost_to",
    "new_run_id",
    "notice_seconds",
    "read_lease",
    "releases_by_delete",
    "skew_allowance",
    "winding_down_for",
]
