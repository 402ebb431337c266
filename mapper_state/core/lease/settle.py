"""Settling a write of the lease whose answer was lost: did it land?

A store call that gave up after a timeout or a reset may still have been applied. Such a
write is not assumed to have failed: the lease is read back within a short deadline
(:func:`check_seconds`, carried with the read by :mod:`mapper_state.stores.deadline`),
and a record carrying this run's ID is ours. Three writes meet this, each with its rule:

- a create or takeover (:meth:`Settling._settle_unknown`): found ours, the run goes on
  as the holder; not found, the error stands;
- a renewal (:meth:`Settling._renewal_landed`): found ours at our bytes, it landed;
- a release, or a lease given up because the store did not answer the heartbeat
  (:meth:`Settling._release_if_ours`): found ours, it is released.

When even the read-back cannot reach the store, the error says until when the lease may
be held by this run (:meth:`Settling._unknown_outcome`).
"""

from __future__ import annotations

from mapper_state import log, signals
from mapper_state.core.lease.claim import Claim
from mapper_state.core.lease.record import (
    LeaseRecord,
    format_time,
    read_lease,
    skew_allowance,
)
from mapper_state.stores import deadline
from mapper_state.stores.base import Blob, PreconditionFailed, StoreAccessDenied, StoreError

#: The shortest read-back: less is not worth a request.
SHORTEST_CHECK_SECONDS = 0.5


def check_seconds(ttl: float) -> float:
    """How long a write whose answer was lost may spend reading the lease back to learn its
    outcome: short, so that a renewal and its check together end well before the lease."""
    return max(SHORTEST_CHECK_SECONDS, min(5.0, ttl / 10))


def _nothing_landed(exc: StoreError) -> bool:
    """A refusal (credentials) or a definite answer (no such bucket): nothing to read back."""
    return isinstance(exc, StoreAccessDenied) or exc.definite


class Settling(Claim):
    """The read-back after a lost answer, and what each kind of write concludes from it."""

    def _read_within(self, seconds: float) -> tuple[LeaseRecord | None, Blob | None]:
        """The lease as :func:`read_lease` gives it; :class:`StoreError` if the store fails
        or does not answer within ``seconds`` (the read's deadline: it ends then)."""
        with deadline.within(seconds):
            return read_lease(self.store, self.state_id)

    def _unknown_outcome(
        self, exc: StoreError | None, expires_at: float, why: StoreError
    ) -> StoreError:
        """The error of a write whose outcome could not be checked: ``exc`` (if any), then
        how long the lease may be held by this run."""
        return StoreError(
            f"{f'{exc.message}; ' if exc else ''}the lease on {self.state_id} may be held by "
            f"this run ({self.run_id}) until {format_time(expires_at)}: the store could not "
            f"be reached to check ({why.message})"
        )

    def _settle_unknown(self, exc: StoreError, record: LeaseRecord, what: str) -> None:
        """A create or takeover of ``record`` whose answer was lost: learn whether it landed.

        Returns as the holder when the lease carries our run ID; re-raises ``exc`` when it
        does not (the write did not land); names the expiry when the store cannot be read.
        """
        if _nothing_landed(exc):
            raise exc  # refused: nothing landed
        with signals.deferred():  # a lease found to be ours is always one we remember
            try:
                found, blob = self._read_within(check_seconds(self.ttl))
            except StoreError as why:
                if why.definite:
                    raise why from None  # no bucket: no lease either
                raise self._unknown_outcome(exc, record.expires_at, why) from None
            if blob is None or found is None or not self._ours(found):
                raise exc
            log.info(f"the lease's {what} on {self.state_id} had landed: this run holds it")
            self.record, self.version = found, blob.version

    def _renewal_landed(self, exc: StoreError, record: LeaseRecord) -> None:
        """A renewal to ``record`` whose answer was lost: return if it landed, else re-raise.

        Either way the renewal's own retries are over; a lease found to carry an earlier
        renewal of ours (one that landed late) is remembered at its version. The read-back
        is also bound by the renewal's own deadline, being made within it.
        """
        if _nothing_landed(exc):
            raise exc
        try:
            found, blob = self._read_within(check_seconds(self.ttl))
        except StoreError:
            raise exc from None
        if blob is None or found is None or not self._ours(found):
            raise exc
        self.version = blob.version
        if blob.data == record.to_bytes():
            return
        self.record = found
        raise exc

    def _release_if_ours(self, record: LeaseRecord, failed: StoreError | None = None) -> None:
        """Release the lease if the store shows it is still ours, when this run cannot know.

        Two cases: a release whose answer was lost (``failed``: it may or may not have
        landed), and a lease given up because the store did not answer the heartbeat (a
        renewal may have landed unseen; released then unless it expires within the skew
        allowance anyway: a write to a store that does not answer would only keep this
        process past its lease). In the second case the read-back, and the release, get a
        quarter of the time left before ``record``'s expiry at most: the rest is the
        process's to stop its work and exit before its lease ends, which on a loaded machine
        took over a second (a lease known to have expired already gets the shortest
        check). Anyone else's lease is left alone; when even the check cannot reach the
        store, the error names how long the lease may stay ours.
        """
        if failed is not None and _nothing_landed(failed):
            raise failed
        seconds = check_seconds(self.ttl)
        if failed is None:
            left = record.expires_at - self.clock()
            # gone already: the shortest check, enough to release a renewal that landed late
            seconds = min(seconds, left / 4 if left > 0 else SHORTEST_CHECK_SECONDS)
        found: LeaseRecord | None = None
        try:
            with deadline.within(seconds):
                found, blob = read_lease(self.store, self.state_id)
                if blob is None or found is None or not self._ours(found):
                    return
                if failed or found.expires_at - self.clock() > skew_allowance(self.ttl):
                    self._release_by_swap(found, blob.version)
        except PreconditionFailed:
            return  # taken over meanwhile: no longer ours
        except StoreError as why:
            if why.definite:
                raise why from None  # no bucket: no lease either
            # after a lost heartbeat, a renewal that landed unseen holds it a TTL from now at most
            latest = (
                max(record.expires_at, found.expires_at if found and self._ours(found) else 0)
                if failed
                else max(record.expires_at, self.clock() + self.ttl)
            )
            raise self._unknown_outcome(failed, latest, why) from None
