"""The lease record and what reads it: who holds a lease, until when, and how it is named.

The record is the JSON in the lease object beside ``state.json``; everything here is a
plain function of a record or of one read of the store. The :class:`~mapper_state.core.lease.Lease`
that writes records is built from the other modules of this package.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Protocol

import orjson

from mapper_state.redact import redact, redact_known, uri_secrets
from mapper_state.stores.base import Blob, BlobStore

LEASE_FILE = "mapper-state.lease.json"


class LeaseTiming(Protocol):
    """What a lease takes from the settings: its TTL, poll interval and wait time."""

    @property
    def lock_timeout(self) -> float: ...

    @property
    def lock_retry(self) -> float: ...

    @property
    def lock_wait(self) -> float: ...

    def secrets(self) -> list[str]: ...


def lease_key(state_id: str) -> str:
    return f"{state_id}/{LEASE_FILE}"


def skew_allowance(ttl: float) -> float:
    """The lease's safety margin for clock skew between hosts, used on both sides: another
    host calls a lease expired only this long after its expiry, and a holder that could not
    renew calls it lost this long before."""
    return min(2.0, ttl / 5)


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


HELD = "held"
RELEASED = "released"
BROKEN = "broken"


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds a lease and until when; written as JSON into the lease object.

    ``status`` is ``held``, or ``released`` / ``broken`` for a record left in place of
    a deleted lease on a store that ignores delete conditions (and by ``lock break``):
    such a lease is free.
    """

    run_id: str
    host: str
    pid: int
    command: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    ttl_seconds: float
    status: str = HELD
    #: The token that names the run holding the lease, for every process of that run (an
    #: ``exec``'s command, a Meltano run's mapper and keeper) to recognise it
    #: (:func:`is_held_by`); empty in records written before it existed: the run ID then.
    owner: str = ""
    #: A broken lease (``lock break``): when it becomes free for another run although its
    #: holder has not said it stopped (the moment by which the holder must have noticed).
    #: ``None``: at once (a forced break, or a record written before it existed).
    free_at: float | None = None

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @property
    def owner_token(self) -> str:
        """The token :func:`is_held_by` recognises the holder by (the run ID when unset)."""
        return self.owner or self.run_id

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord | None:
        """The record, or ``None`` when the object is unreadable (treated as expired)."""
        try:
            raw = orjson.loads(data)
            return cls(
                run_id=str(raw["run_id"]),
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                command=str(raw.get("command", "")),
                acquired_at=float(raw["acquired_at"]),
                renewed_at=float(raw["renewed_at"]),
                expires_at=float(raw["expires_at"]),
                ttl_seconds=float(raw["ttl_seconds"]),
                status=str(raw.get("status", HELD)),
                owner=str(raw.get("owner") or ""),
                free_at=None if raw.get("free_at") is None else float(raw["free_at"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    @property
    def held(self) -> bool:
        return self.status == HELD

    def is_expired(self, now: float) -> bool:
        """Free for another run: released; broken, once its holder must have noticed
        (:attr:`free_at`); or past its expiry and the skew allowance."""
        if self.status == BROKEN and self.free_at is not None:
            return now > self.free_at + skew_allowance(self.ttl_seconds)
        return not self.held or now > self.expires_at + skew_allowance(self.ttl_seconds)

    def free_from(self) -> float:
        """When another run may take this lease over (by the clock of whoever reads it)."""
        if self.status == BROKEN and self.free_at is not None:
            return self.free_at + skew_allowance(self.ttl_seconds)
        if not self.held:
            return self.renewed_at
        return self.expires_at + skew_allowance(self.ttl_seconds)

    def describe(self) -> str:
        if self.status == BROKEN and self.free_at is not None:
            return (
                f"broken by an operator; run {self.run_id} on host {self.host} (pid {self.pid}) "
                f"may run until it has stopped, at the latest {format_time(self.free_from())}"
            )
        if not self.held:
            return f"{self.status} by run {self.run_id} on host {self.host} (pid {self.pid})"
        return (
            f"held by run {self.run_id} on host {self.host} (pid {self.pid}) "
            f"since {format_time(self.acquired_at)}, expires {format_time(self.expires_at)}"
        )


def is_held_by(record: LeaseRecord | None, owner: str, now: float | None = None) -> bool:
    """The one rule for "is this lease still this run's?", for every process of a run.

    ``record`` is the lease as read from the store; ``owner`` the token of the run asking
    (:attr:`LeaseRecord.owner_token`, which an enclosing run passes to the processes it
    starts). The record must name that owner and be held. With ``now`` (the asker's
    clock), it must also not be within the skew allowance of its expiry, where the holder
    itself would call it lost: the check made before a state write. Without ``now``: the
    check of a write whose answer was lost (did *our* record land?).
    """
    if record is None or not record.held or record.owner_token != owner:
        return False
    return now is None or now < record.expires_at - skew_allowance(record.ttl_seconds)


def winding_down_for(record: LeaseRecord | None, owner: str, now: float) -> float | None:
    """The seconds ``owner``'s run may still write under its lease an operator broke, by
    the asker's clock ``now``; ``None`` when the lease is not that.

    ``lock break`` (not ``--force``) leaves the record naming its holder, marked broken,
    free for another run only from :attr:`LeaseRecord.free_at` plus the skew allowance:
    until the allowance before ``free_at`` the broken run may still write the state its
    target confirmed while it winds down (its extractor stopped), as its own heartbeat's
    :meth:`~mapper_state.core.lease.driver.Lease.confirm` lets it.
    """
    if record is None or record.status != BROKEN or record.free_at is None:
        return None
    if record.owner_token != owner:
        return None
    left = record.free_at - skew_allowance(record.ttl_seconds) - now
    return left if left > 0 else None


def lost_to(holder: LeaseRecord | None, run_id: str) -> str:
    """Who has the lease a run lost: another run, or an operator who broke this run's.

    ``lock break`` leaves the broken holder's own record in place, marked broken: a
    broken record naming this run means an operator broke it, not that this run did.
    """
    if holder is None:
        return "broken or released by someone else"
    if holder.status == BROKEN and holder.run_id == run_id:
        return "broken by an operator (`mapper-state lock break`)"
    return holder.describe()


def read_lease(store: BlobStore, state_id: str) -> tuple[LeaseRecord | None, Blob | None]:
    blob = store.read(lease_key(state_id))
    return (LeaseRecord.from_bytes(blob.data) if blob else None), blob


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def current_command(secrets: Iterable[str] = ()) -> str:
    """This process's command line, secrets hidden, as the lease record and history keep it.

    Besides the configured ``secrets``, the value of every ``--set`` of a setting whose
    name says it is a secret, and user-info in URIs, are hidden too.
    """
    args = [os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)]
    hidden = list(secrets)
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and value and _SECRET_NAME.search(name):
            hidden.append(value)
        hidden.extend(uri_secrets(arg.partition("=")[2] or arg))
    return redact(redact_known(" ".join(args)), [h for h in hidden if len(h) >= 4])[:200]


_SECRET_NAME = re.compile(
    r"(secret|password|token|key_id|access_key|connection_string|credential)", re.I
)


def releases_by_delete(store: BlobStore) -> bool:
    """Does the store enforce a conditional delete, so that release may delete the lease?

    Stores say so in ``traits.enforces_delete_conditions``; an unknown store (an S3-compatible
    endpoint, a GCS emulator) is released by compare-and-swap instead, which every store
    that can hold a lease at all enforces.
    """
    traits = store.traits
    return traits.enforces_delete_conditions and not traits.learned.refuses_delete_conditions.known
