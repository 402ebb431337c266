"""The values the lease protocol passes around: who asks for a lease, and the claim it holds.

Both are immutable. :class:`Applicant` is a run asking for the lease on one state ID (its
run ID, its owner token, its command line, its TTL); :class:`Claim` is what a holder
knows of the lease it holds: the record it last wrote and the version the store gave
that write. Each step of the protocol (:mod:`mapper_state.core.lease.protocol`) takes a
claim and returns the next one, or raises; the heartbeat's driver
(:mod:`mapper_state.core.lease.driver`) keeps the current one.
"""

from __future__ import annotations

from dataclasses import dataclass

from mapper_state import runtime
from mapper_state.core.lease.record import LeaseRecord, lease_key


@dataclass(frozen=True)
class Applicant:
    """A run asking for the lease on ``state_id``."""

    state_id: str
    run_id: str
    #: The token every process of this run recognises its lease by (``is_held_by``).
    owner: str
    command: str
    ttl: float

    @property
    def key(self) -> str:
        return lease_key(self.state_id)

    def fresh_record(self, now: float) -> LeaseRecord:
        """A new record of this run, acquired now and expiring a TTL from now."""
        return LeaseRecord(
            run_id=self.run_id,
            host=runtime.host(),
            pid=runtime.pid(),
            command=self.command,
            acquired_at=now,
            renewed_at=now,
            expires_at=now + self.ttl,
            ttl_seconds=self.ttl,
            owner=self.owner if self.owner != self.run_id else "",
        )


@dataclass(frozen=True)
class Claim:
    """The lease a run holds: the record it last wrote, at the version the store gave it."""

    applicant: Applicant
    record: LeaseRecord
    version: str
    #: The holder whose expired or broken lease this run took over: it may still be writing.
    took_over: LeaseRecord | None = None

    @property
    def state_id(self) -> str:
        return self.applicant.state_id

    @property
    def key(self) -> str:
        return self.applicant.key

    @property
    def owner(self) -> str:
        return self.applicant.owner

    @property
    def ttl(self) -> float:
        return self.applicant.ttl

    def at(self, record: LeaseRecord, version: str) -> Claim:
        """The same claim, now at ``record`` and ``version``."""
        return Claim(self.applicant, record, version, self.took_over)
