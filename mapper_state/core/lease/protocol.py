"""The lease protocol, step by step: plain functions over the values of ``claim.py``.

Each step takes the store, the claim it acts on (or the applicant asking) and a clock, and
returns the next claim or raises; none keeps state. The heartbeat's driver
(``driver.py``) calls them and keeps the claim they return; the deterministic simulation
calls them through the same driver. Read top to bottom:

- **acquire**: a create-if-absent (a free lease costs one request); else, for an expired,
  released or broken lease, a compare-and-swap takeover on the version just read, so two
  contenders can never both win. On a store not known to refuse a second
  create-if-absent, the new holder proves it does (one more create, which must be refused);
- **renew**: a compare-and-swap of our record at the version the store last gave it, to one
  expiring a TTL from now; a refusal means the lease was broken or taken over (lost),
  unless the read-back shows our renewal had landed. Confirming before a state write *is*
  renewing (fencing): a plain read could not tell a lease that is ours from one that was;
- **settle**: a write whose answer was lost (a timeout, a reset) may have been applied, so
  it is settled by reading the lease back within a short deadline (:func:`check_seconds`):
  a record carrying this run's owner token is ours;
- **release**: a conditional delete where the store enforces one (:func:`releases_by_delete`),
  else a compare-and-swap to a *released* record the next run takes over; a holder that
  lost its lease touches the object only if the store shows it is still its own (a renewal
  that landed unseen) or shows its own lease broken by an operator (it then says it has
  stopped, freeing the lease at once: ``lock break``);
- **break**: ``lock break`` rewrites the lease as *broken*; a live holder's broken lease is
  free once it says it stopped or at its renewal deadline (``LeaseRecord.free_at``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

from mapper_state import log, runtime
from mapper_state.core.lease.claim import Applicant, Claim
from mapper_state.core.lease.record import (
    BROKEN,
    RELEASED,
    LeaseRecord,
    format_time,
    is_held_by,
    lease_key,
    lost_to,
    read_lease,
    releases_by_delete,
    skew_allowance,
)
from mapper_state.errors import ExitCode, LeaseBroken, LeaseBusy, LeaseLost, MapperStateError
from mapper_state.stores import deadline
from mapper_state.stores.base import (
    Blob,
    BlobStore,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
)

Clock = Callable[[], float]

#: The shortest read-back: less is not worth a request.
SHORTEST_CHECK_SECONDS = 0.5


def check_seconds(ttl: float) -> float:
    """How long a write whose answer was lost may spend reading the lease back to learn its
    outcome: short, so that a renewal and its check together end well before the lease."""
    return max(SHORTEST_CHECK_SECONDS, min(5.0, ttl / 10))


def renewal_interval(ttl: float) -> float:
    """How often a holder renews its lease: every third of the TTL, so that a renewal
    that fails has time to be tried again before the renewal deadline."""
    return ttl / 3


def notice_seconds(ttl: float) -> float:
    """How often a holder reads its lease between renewals, to notice a ``lock break`` (or a
    takeover) sooner than its next renewal: one read, a few seconds apart."""
    return max(0.5, min(5.0, ttl / 10))


class NotRenewed(StoreError):
    """A renewal whose answer was lost and which did not land; :attr:`claim` is the lease as
    the store shows it now, still ours (an earlier renewal may have landed late)."""

    def __init__(self, error: StoreError, claim: Claim) -> None:
        super().__init__(error.message, definite=error.definite)
        self.claim = claim


# -- acquire ---------------------------------------------------------------------------
def try_acquire(store: BlobStore, me: Applicant, clock: Clock) -> Claim | LeaseRecord:
    """Take the lease if free or expired: the claim; else the current holder's record.

    A free lease costs one request: the create is tried before anything is read.
    """
    record: LeaseRecord | None = None
    for _ in range(3):  # the lease may change hands between our requests
        record = me.fresh_record(clock())
        claim = _create(store, me, record, clock)
        if claim is not None:
            return _fresh(store, _prove_exclusive(store, claim, clock), clock)
        holder, blob = read_lease(store, me.state_id)
        if blob is None:
            continue  # released in between: try to create it again
        if holder is not None and not holder.is_expired(clock()):
            return holder
        claim = _take_over(store, me, holder, blob, clock)
        if claim is not None:
            return _fresh(store, _prove_exclusive(store, claim, clock), clock)
    holder, _ = read_lease(store, me.state_id)
    return holder or record or me.fresh_record(clock())  # still contended: busy for now


def _fresh(store: BlobStore, claim: Claim, clock: Clock) -> Claim | LeaseRecord:
    """The claim just taken, unless its first renewal is already due: its record was made
    before the write, and a slow write (retries, a lost answer read back) or a process
    frozen in between (a stop, a pause) leaves a claim whose renewal deadline is near or
    past, one that others may even call expired. Handed to the heartbeat as it is, such a
    claim could be given up a moment after the run began. It is renewed at once instead,
    so that the heartbeat starts with its whole window to renew; if that is refused,
    someone took it meanwhile: busy. If the renewal fails (the store did not answer), the
    run cannot start: the claim is given up if the store shows it is still ours, and
    when even that cannot be checked the error says until when it may be held."""
    if clock() < claim.record.renewed_at + renewal_interval(claim.ttl):
        return claim
    try:
        return renew(store, claim, clock)
    except LeaseLost:
        holder, _ = read_lease(store, claim.state_id)
        return holder or claim.record
    except StoreError as exc:
        # a renewal that landed unseen holds it a TTL from now at most: release it if ours
        current = exc.claim if isinstance(exc, NotRenewed) else claim
        release_if_ours(store, current, clock, failed=exc)
        raise


def _create(store: BlobStore, me: Applicant, record: LeaseRecord, clock: Clock) -> Claim | None:
    """Create the lease as ``record``: the claim, or ``None`` when it exists."""
    try:
        return Claim(me, record, store.create(me.key, record.to_bytes()))
    except PreconditionFailed:
        return None
    except StoreError as exc:
        return _settle_unknown(store, me, exc, record, "create", clock)


def _take_over(
    store: BlobStore, me: Applicant, holder: LeaseRecord | None, blob: Blob, clock: Clock
) -> Claim | None:
    """Replace the free lease ``holder`` read at ``blob``: the claim, or ``None`` when
    someone else took it over first."""
    record = me.fresh_record(clock())
    try:
        claim = Claim(me, record, store.replace(me.key, record.to_bytes(), blob.version))
    except PreconditionFailed:
        return None
    except StoreError as exc:
        claim = _settle_unknown(store, me, exc, record, "takeover", clock)
    # a released lease's holder is gone; an expired or broken one may not be
    took_over = None if holder and holder.status == RELEASED else holder
    if holder is None:  # unreadable: assume the worst
        took_over = replace(record, run_id="unknown", status=BROKEN)
    return Claim(me, claim.record, claim.version, took_over)


def _prove_exclusive(store: BlobStore, claim: Claim, clock: Clock) -> Claim:
    """On a store not known to refuse a second create-if-absent, try one: it must be refused
    (one request). If it is accepted, runs could share the lease: give it up and refuse,
    exit 11."""
    if not store.traits.proves_create_condition:
        return claim
    # other bytes than the lease's, so that a retried attempt never passes for ours
    try:
        store.create(claim.key, claim.record.to_bytes() + b" ")
    except PreconditionFailed:
        return claim
    except StoreError:
        with contextlib.suppress(StoreError):
            release(store, claim, clock)  # unproven: not a lease to keep
        raise
    with contextlib.suppress(StoreError):
        store.delete(claim.key)  # the store keeps no condition: nothing to spare
    raise MapperStateError(
        f"{store.display_uri} ignores create-if-absent (a second If-None-Match: * "
        "create of the lease was accepted), so two runs could hold the lease at once: "
        "run `mapper-state doctor` on it (state_backend.s3.conditional_writes_checked "
        "skips this check on a store known to be safe)",
        exit_code=ExitCode.UNSAFE_STORE,
    )


# -- renew -----------------------------------------------------------------------------
def renew(store: BlobStore, claim: Claim, clock: Clock) -> Claim:
    """Extend the lease by a compare-and-swap: the renewed claim; :class:`LeaseLost` if it is
    no longer ours; :class:`NotRenewed` (a ``StoreError``) if the answer was lost and it did
    not land; another ``StoreError`` if the store failed."""
    now = clock()
    record = replace(claim.record, renewed_at=now, expires_at=now + claim.ttl)
    try:
        return claim.at(record, store.replace(claim.key, record.to_bytes(), claim.version))
    except PreconditionFailed:
        return _refused(store, claim, record)
    except StoreError as exc:
        return _renewal_landed(store, claim, record, exc)


def _refused(store: BlobStore, claim: Claim, record: LeaseRecord) -> Claim:
    """A renewal to ``record`` was refused: an earlier attempt of it landed (the claim at
    that version), or the lease is lost (:class:`LeaseLost`, naming who has it now)."""
    holder, blob = read_lease(store, claim.state_id)
    if blob is not None and holder is not None and is_held_by(holder, claim.owner):
        if blob.data == record.to_bytes():
            return claim.at(record, blob.version)  # an earlier attempt of this renewal landed
        if holder.acquired_at == claim.record.acquired_at:
            # an earlier renewal of ours landed unseen (its answer and its read-back were
            # lost): still ours, at a version we did not know; renew on that one
            try:
                return claim.at(record, store.replace(claim.key, record.to_bytes(), blob.version))
            except PreconditionFailed:
                holder, _ = read_lease(store, claim.state_id)
    if holder is not None and _broken_from(holder, claim):
        raise LeaseBroken(
            f"lost the lease on {claim.state_id}: now {lost_to(holder, claim.record.run_id)}",
            holder.free_at,
        )
    raise LeaseLost(
        f"lost the lease on {claim.state_id}: now {lost_to(holder, claim.record.run_id)}"
    )


def _renewal_landed(store: BlobStore, claim: Claim, record: LeaseRecord, exc: StoreError) -> Claim:
    """A renewal to ``record`` whose answer was lost: the claim if it landed; else
    :class:`NotRenewed` carrying the lease as the store shows it (still ours), or ``exc``.

    The read-back is bound by the renewal's own deadline, being made within it.
    """
    if _nothing_landed(exc):
        raise exc
    try:
        found, blob = _read_within(store, claim.state_id, check_seconds(claim.ttl))
    except StoreError:
        raise exc from None
    if blob is None or found is None or not is_held_by(found, claim.owner):
        raise exc
    if blob.data == record.to_bytes():
        return claim.at(record, blob.version)
    raise NotRenewed(exc, claim.at(found, blob.version))  # an earlier renewal landed late


# -- settle ----------------------------------------------------------------------------
def _nothing_landed(exc: StoreError) -> bool:
    """A refusal (credentials) or a definite answer (no such bucket): nothing to read back."""
    return isinstance(exc, StoreAccessDenied) or exc.definite


def _read_within(
    store: BlobStore, state_id: str, seconds: float
) -> tuple[LeaseRecord | None, Blob | None]:
    """The lease as :func:`read_lease` gives it, the read ending within ``seconds``."""
    with deadline.within(seconds):
        return read_lease(store, state_id)


def _unknown_outcome(
    state_id: str, run_id: str, exc: StoreError | None, expires_at: float, why: StoreError
) -> StoreError:
    """The error of a write whose outcome could not be checked: ``exc`` (if any), then how
    long the lease may be held by this run."""
    return StoreError(
        f"{f'{exc.message}; ' if exc else ''}the lease on {state_id} may be held by "
        f"this run ({run_id}) until {format_time(expires_at)}: the store could not "
        f"be reached to check ({why.message})"
    )


def _settle_unknown(
    store: BlobStore, me: Applicant, exc: StoreError, record: LeaseRecord, what: str, clock: Clock
) -> Claim:
    """A create or takeover of ``record`` whose answer was lost: the claim when the lease
    carries our owner token (it landed); ``exc`` re-raised when it does not; an error
    naming the expiry when the store cannot be read."""
    if _nothing_landed(exc):
        raise exc  # refused: nothing landed
    try:
        found, blob = _read_within(store, me.state_id, check_seconds(me.ttl))
    except StoreError as why:
        if why.definite:
            raise why from None  # no bucket: no lease either
        raise _unknown_outcome(me.state_id, me.run_id, exc, record.expires_at, why) from None
    if blob is None or found is None or not is_held_by(found, me.owner):
        raise exc
    log.info(f"the lease's {what} on {me.state_id} had landed: this run holds it")
    return Claim(me, found, blob.version)


# -- release ---------------------------------------------------------------------------
def release(store: BlobStore, claim: Claim, clock: Clock) -> None:
    """Give the lease up; a lease that is no longer ours is left alone.

    A conditional delete where the store enforces one and the lease has not expired by our
    own clock, else a compare-and-swap to a released record. A release whose answer was
    lost is settled by :func:`release_if_ours`.
    """
    try:
        if releases_by_delete(store) and clock() < claim.record.expires_at:
            store.delete(claim.key, if_version=claim.version)
        else:
            _release_by_swap(store, claim, claim.record, claim.version, clock)
    except PreconditionFailed:
        # changed since our last renewal: someone else's now (left alone), or ours broken
        # by an operator, which we say we have stopped (the next run may take it at once)
        release_if_ours(store, claim, clock)
    except StoreError as exc:
        release_if_ours(store, claim, clock, failed=exc)


def _release_by_swap(
    store: BlobStore, claim: Claim, record: LeaseRecord, version: str, clock: Clock
) -> None:
    """Replace our lease ``record`` at ``version`` by a released record, which the next run
    takes over."""
    now = clock()
    released = replace(record, status=RELEASED, renewed_at=now, expires_at=now, free_at=None)
    store.replace(claim.key, released.to_bytes(), version)


def release_if_ours(
    store: BlobStore, claim: Claim, clock: Clock, failed: StoreError | None = None
) -> None:
    """Release the lease if the store shows it is still ours, when this run cannot know.

    Two cases: a release whose answer was lost (``failed``: it may or may not have landed),
    and a lease this run gave up or lost (a renewal may have landed unseen: released then
    unless it expires within the skew allowance anyway; or an operator broke it: this run
    has stopped, so it says so and the next run may take it at once). In the second case
    the read-back, and the release, get a quarter of the time left before the claim's
    expiry at most: the rest is the process's to stop its work and exit before its lease
    ends (a lease known to have expired already gets the shortest check). Anyone else's
    lease is left alone; when even the check cannot reach the store, the error names how
    long the lease may stay ours.
    """
    if failed is not None and _nothing_landed(failed):
        raise failed
    record = claim.record
    seconds = check_seconds(claim.ttl)
    if failed is None:
        left = record.expires_at - clock()
        # gone already: the shortest check, enough to release a renewal that landed late
        seconds = min(seconds, left / 4 if left > 0 else SHORTEST_CHECK_SECONDS)
    found: LeaseRecord | None = None
    try:
        with deadline.within(seconds):
            found, blob = read_lease(store, claim.state_id)
            if blob is None or found is None:
                return
            if _broken_from(found, claim):
                _release_by_swap(store, claim, found, blob.version, clock)  # we have stopped
                return
            if not is_held_by(found, claim.owner):
                return
            if failed or found.expires_at - clock() > skew_allowance(claim.ttl):
                _release_by_swap(store, claim, found, blob.version, clock)
    except PreconditionFailed:
        return  # taken over meanwhile: no longer ours
    except StoreError as why:
        if why.definite:
            raise why from None  # no bucket: no lease either
        # after a lost heartbeat, a renewal that landed unseen holds it a TTL from now at most
        ours = found is not None and is_held_by(found, claim.owner)
        latest = (
            max(record.expires_at, found.expires_at if found is not None and ours else 0)
            if failed
            else max(record.expires_at, clock() + claim.ttl)
        )
        raise _unknown_outcome(claim.state_id, record.run_id, failed, latest, why) from None


def _broken_from(found: LeaseRecord, claim: Claim) -> bool:
    """Is ``found`` this run's own lease, broken by an operator and not yet free?"""
    return (
        found.status == BROKEN
        and found.free_at is not None
        and found.owner_token == claim.owner
        and found.acquired_at == claim.record.acquired_at
    )


# -- break -----------------------------------------------------------------------------
def break_lease(
    store: BlobStore, state_id: str, *, force: bool = False, now: float | None = None
) -> LeaseRecord | None:
    """Break a lease (``lock break``); return the record that was there.

    The lease becomes a *broken* record by compare-and-swap rather than being deleted,
    so that it is safe on stores that ignore delete conditions, and so that the next
    holder knows the broken one may still be writing (and fences it out). A held lease's
    holder may still be passing data and writing, so the broken record is free for
    another run only once that holder says it stopped (it rewrites the record as
    released) or once its renewal deadline has passed (:attr:`LeaseRecord.free_at`, the
    expiry it had: by then it must have noticed), whichever comes first. ``force`` frees
    it at once, for a holder known to be dead.
    """
    for _ in range(5):
        holder, blob = read_lease(store, state_id)
        if blob is None:
            return None
        at = runtime.now() if now is None else now
        base = holder or LeaseRecord("unknown", "unknown", 0, "", at, at, at, 0.0)
        live = holder is not None and holder.held and not holder.is_expired(at)
        free_at = None if force or not live else base.expires_at
        broken = replace(base, status=BROKEN, renewed_at=at, free_at=free_at)
        try:
            store.replace(lease_key(state_id), broken.to_bytes(), blob.version)
            return holder
        except PreconditionFailed:
            continue  # renewed in between: break the newer record
    raise LeaseBusy(f"could not break the lease on {state_id}: it keeps changing")
