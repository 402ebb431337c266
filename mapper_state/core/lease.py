"""The lease: one holder per state ID for a whole run, on any store.

The lease is an object beside ``state.json`` holding a :class:`LeaseRecord`.
Acquire is a create-if-absent; taking over an expired or released lease, renewing
it and releasing it are compare-and-swaps on the version last seen, so two
contenders can never both win. A heartbeat thread renews every third of the TTL;
a holder that fails to renew (someone broke or took over its lease) knows it has
lost it, and every state write first confirms the lease (fencing).

Two rules keep a holder that lost its lease from hurting the next one:

- it never deletes or rewrites the lease object again;
- release is a conditional delete only on a store known to enforce delete
  conditions (:func:`releases_by_delete`); elsewhere (MinIO, Ceph RGW and
  fake-gcs-server accept ``If-Match`` on a delete and ignore it) it is a
  compare-and-swap to a *released* record, which the next run takes over.

The heartbeat does not trust a renewal to come back: when none has succeeded by
the lease's expiry minus a margin, the lease is declared lost at that moment,
whatever the request is still doing.

A write whose answer never came (the store call gave up after a timeout or a reset,
when the request may have landed) is not assumed to have failed: the lease is read
back within :func:`check_seconds`, and a record carrying this run's ID is ours
(an acquire goes on as the holder; a release releases it). When even that read
fails, the error says the lease may be held by this run until its expiry.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from mapper_state import log, signals
from mapper_state.errors import ExitCode, LeaseBusy, LeaseLost, MapperStateError
from mapper_state.redact import redact, redact_known, uri_secrets
from mapper_state.stores.base import (
    Blob,
    BlobStore,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
)

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


def check_seconds(ttl: float) -> float:
    """How long a write whose answer was lost may spend reading the lease back to learn its
    outcome: short, so that a renewal and its check together end well before the lease."""
    return max(0.5, min(5.0, ttl / 10))


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

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

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
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    @property
    def held(self) -> bool:
        return self.status == HELD

    def is_expired(self, now: float) -> bool:
        """Free for another run: released, broken, or past its expiry and the skew allowance."""
        return not self.held or now > self.expires_at + skew_allowance(self.ttl_seconds)

    def describe(self) -> str:
        if not self.held:
            return f"{self.status} by run {self.run_id} on host {self.host} (pid {self.pid})"
        return (
            f"held by run {self.run_id} on host {self.host} (pid {self.pid}) "
            f"since {format_time(self.acquired_at)}, expires {format_time(self.expires_at)}"
        )


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
    return traits.enforces_delete_conditions and not traits.refuses_delete_conditions


class Lease:
    """This process's claim on one state ID."""

    def __init__(
        self,
        store: BlobStore,
        state_id: str,
        *,
        ttl: float,
        retry: float = 1.0,
        wait: float = 0.0,
        run_id: str | None = None,
        command: str | None = None,
        secrets: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.state_id = state_id
        self.key = lease_key(state_id)
        self.ttl = ttl
        self.retry = retry
        self.wait = wait
        self.clock = clock
        self.run_id = run_id or new_run_id()
        self.command = current_command(secrets) if command is None else command
        self.record: LeaseRecord | None = None
        self.version: str | None = None
        self.lost: LeaseLost | None = None
        #: The holder whose expired or broken lease we took over: it may still be writing.
        self.took_over: LeaseRecord | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

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

    # -- acquire -------------------------------------------------------------------
    def _fresh_record(self, now: float) -> LeaseRecord:
        return LeaseRecord(
            run_id=self.run_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            command=self.command,
            acquired_at=now,
            renewed_at=now,
            expires_at=now + self.ttl,
            ttl_seconds=self.ttl,
        )

    def try_acquire(self) -> LeaseRecord | None:
        """Take the lease if free or expired; return the current holder's record if busy.

        A free lease costs one request: the create is tried before anything is read.
        """
        holder: LeaseRecord | None = None
        for _ in range(3):  # the lease may change hands between our requests
            record = self._fresh_record(self.clock())
            try:
                with signals.deferred():  # a lease we created is always one we remember
                    self.version = self.store.create(self.key, record.to_bytes())
                    self.record = record
                self._prove_exclusive()
                return None
            except PreconditionFailed:
                pass
            except StoreError as exc:
                self._settle_unknown(exc, record, "create")
                self._prove_exclusive()
                return None
            holder, blob = read_lease(self.store, self.state_id)
            if blob is None:
                continue  # released in between: try to create it again
            if holder is not None and not holder.is_expired(self.clock()):
                return holder
            record = self._fresh_record(self.clock())
            try:
                with signals.deferred():
                    self.version = self.store.replace(self.key, record.to_bytes(), blob.version)
                    self.record = record
            except PreconditionFailed:
                continue  # someone else took it over first
            except StoreError as exc:
                self._settle_unknown(exc, record, "takeover")
            # a released lease's holder is gone; an expired or broken one may not be
            self.took_over = None if holder and holder.status == RELEASED else holder
            if holder is None:  # unreadable: assume the worst
                self.took_over = replace(record, run_id="unknown", status=BROKEN)
            self._prove_exclusive()
            return None
        holder, _ = read_lease(self.store, self.state_id)
        return holder or record  # still contended: busy for now

    def _prove_exclusive(self) -> None:
        """On a store not known to refuse a second create-if-absent, try one: it must be
        refused (one request). If it is accepted, runs could share the lease: give it up
        and refuse, exit 11."""
        if not self.store.traits.proves_create_condition or self.record is None:
            return
        # other bytes than the lease's, so that a retried attempt never passes for ours
        try:
            self.store.create(self.key, self.record.to_bytes() + b" ")
        except PreconditionFailed:
            return
        except StoreError:
            with contextlib.suppress(StoreError):
                self.release()  # unproven: not a lease to keep
            raise
        self.record = self.version = None
        with contextlib.suppress(StoreError):
            self.store.delete(self.key)  # the store keeps no condition: nothing to spare
        raise MapperStateError(
            f"{self.store.display_uri} ignores create-if-absent (a second If-None-Match: * "
            "create of the lease was accepted), so two runs could hold the lease at once: "
            "run `mapper-state doctor` on it (state_backend.s3.conditional_writes_checked "
            "skips this check on a store known to be safe)",
            exit_code=ExitCode.UNSAFE_STORE,
        )

    # -- writes whose answer was lost ----------------------------------------------
    def _ours(self, record: LeaseRecord | None) -> bool:
        """Is ``record`` a held lease of this run? Only this process writes such records."""
        return record is not None and record.held and record.run_id == self.run_id

    def _read_within(self, seconds: float) -> tuple[LeaseRecord | None, Blob | None]:
        """The lease as :func:`read_lease` gives it, or :class:`StoreError` if that takes
        longer than ``seconds`` (the read is left to end on its own) or fails."""
        found: list[tuple[LeaseRecord | None, Blob | None]] = []
        failed: list[BaseException] = []
        done = threading.Event()

        def read() -> None:
            try:
                found.append(read_lease(self.store, self.state_id))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=read, name="lease-check", daemon=True).start()
        if not done.wait(seconds):
            raise StoreError(f"no answer within {seconds:g} s")
        if failed:
            error = failed[0]
            raise error if isinstance(error, StoreError) else StoreError(repr(error))
        return found[0]

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
        if isinstance(exc, StoreAccessDenied):
            raise exc  # refused: nothing landed
        with signals.deferred():  # a lease found to be ours is always one we remember
            try:
                found, blob = self._read_within(check_seconds(self.ttl))
            except StoreError as why:
                raise self._unknown_outcome(exc, record.expires_at, why) from None
            if blob is None or found is None or not self._ours(found):
                raise exc
            log.info(f"the lease's {what} on {self.state_id} had landed: this run holds it")
            self.record, self.version = found, blob.version

    def acquire(self) -> None:
        """Take the lease, waiting up to ``wait`` seconds for a busy one; else :class:`LeaseBusy`."""
        deadline = time.monotonic() + self.wait
        said = False
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() + self.retry > deadline:
                waited = f" after waiting {self.wait:g}s" if self.wait else ""
                raise LeaseBusy(f"state ID {self.state_id} is busy{waited}: {holder.describe()}")
            if not said:
                log.info(
                    f"state ID {self.state_id} is busy, waiting up to {self.wait:g}s: "
                    f"{holder.describe()}"
                )
                said = True
            time.sleep(self.retry)

    # -- hold ----------------------------------------------------------------------
    def renew(self) -> None:
        """Extend the lease by a compare-and-swap; :class:`LeaseLost` if it is no longer ours."""
        record = self.record
        wait = max(0.0, record.expires_at - self.clock()) if record else 0.0
        if not self._lock.acquire(timeout=wait):  # a renewal still waiting on the store
            raise LeaseLost(
                f"lost the lease on {self.state_id}: could not renew it before it expired"
            )
        try:
            if self.lost:
                raise self.lost
            if self.record is None or self.version is None:
                raise LeaseLost(f"the lease on {self.state_id} is not held")
            now = self.clock()
            record = replace(self.record, renewed_at=now, expires_at=now + self.ttl)
            try:
                self.version = self.store.replace(self.key, record.to_bytes(), self.version)
            except PreconditionFailed:
                holder, blob = read_lease(self.store, self.state_id)
                if blob is not None and self._ours(holder) and blob.data == record.to_bytes():
                    self.version = blob.version  # an earlier attempt of this renewal landed
                else:
                    self.lost = LeaseLost(
                        f"lost the lease on {self.state_id}: now {lost_to(holder, self.run_id)}"
                    )
                    raise self.lost from None
            except StoreError as exc:
                self._renewal_landed(exc, record)
            self.record = record
        finally:
            self._lock.release()

    def _renewal_landed(self, exc: StoreError, record: LeaseRecord) -> None:
        """A renewal to ``record`` whose answer was lost: return if it landed, else re-raise.

        Either way the renewal's own retries are over; a lease found to carry an earlier
        renewal of ours (one that landed late) is remembered at its version.
        """
        if isinstance(exc, StoreAccessDenied):
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

    confirm = renew  # fencing: a state write is preceded by a successful renewal

    def adopt(self, record: LeaseRecord, version: str) -> None:
        """Hold the lease another process acquired and handed over: its record at ``version``."""
        self.record, self.version = record, version

    def disown(self) -> None:
        """Forget the lease, handed over to another process, so that nothing here releases it."""
        self.record, self.version = None, None

    def start_heartbeat(self, on_lost: Callable[[LeaseLost], None] | None = None) -> None:
        """Renew every third of the TTL in a thread; call ``on_lost`` once if the lease is lost.

        Each renewal runs in a thread of its own, and the heartbeat waits for it only
        until the lease's expiry minus :func:`skew_allowance`: a renewal stuck in a request
        that never returns cannot keep a run working past its lease.
        """

        def lose(error: LeaseLost) -> None:
            self.lost = self.lost or error
            if on_lost:
                on_lost(self.lost)

        def beat() -> None:
            # a lease adopted after its create's answer was lost is already some seconds old
            first = self.record.renewed_at + self.ttl / 3 - self.clock() if self.record else 0
            pause = max(0.0, min(self.ttl / 3, first))
            while not self._stop.wait(pause):
                record = self.record
                if record is None:
                    return
                deadline = record.expires_at - skew_allowance(self.ttl)
                finished, error = self._renew_by(deadline)
                if self._stop.is_set():
                    return
                if not finished or (isinstance(error, StoreError) and self.clock() >= deadline):
                    lose(
                        LeaseLost(
                            f"lost the lease on {self.state_id}: could not renew it before it "
                            "expired "
                            "(the store did not answer in time)"
                        )
                    )
                    return
                if isinstance(error, LeaseLost):
                    lose(error)
                    return
                if isinstance(error, StoreError):  # transient: try again soon, within the lease
                    pause = min(self.ttl / 3, max(0.05, (deadline - self.clock()) / 3))
                    continue
                if error is not None:
                    lose(
                        LeaseLost(
                            f"lost the lease on {self.state_id}: renewing it failed: {error!r}"
                        )
                    )
                    return
                pause = self.ttl / 3

        self._heartbeat = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
        self._heartbeat.start()

    def _renew_by(self, deadline: float) -> tuple[bool, BaseException | None]:
        """Renew in a thread of its own, waiting until it ends or ``deadline`` (our clock) passes.

        Returns whether it ended, and its error if it failed. A renewal still running
        at the deadline is left to finish or fail on its own; the lease is lost anyway.
        """
        outcome: list[BaseException] = []
        done = threading.Event()

        def attempt() -> None:
            try:
                self.renew()
            except BaseException as exc:  # noqa: BLE001 - handed to the heartbeat's thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=attempt, name="lease-renewal", daemon=True).start()
        while not done.wait(min(0.1, max(0.0, deadline - self.clock()))):
            if self._stop.is_set() or self.clock() >= deadline:
                break
        return done.is_set(), (outcome[0] if outcome else None)

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._heartbeat and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()

    # -- release -------------------------------------------------------------------
    def release(self) -> None:
        """Give the lease up; a lease that is no longer ours is left alone.

        A holder that knows it lost its lease touches nothing. Otherwise: a conditional
        delete where the store enforces one and the lease has not expired by our own
        clock, else a compare-and-swap to a released record.
        """
        self.stop_heartbeat()
        if self.lost is not None or not self._lock.acquire(timeout=self.ttl):
            record, self.version, self.record = self.record, None, None
            if record is not None:
                self._release_if_ours(record)
            return
        try:
            if self.version is None or self.record is None:
                return
            expired = self.clock() >= self.record.expires_at
            if releases_by_delete(self.store) and not expired:
                self.store.delete(self.key, if_version=self.version)
            else:
                self._release_by_swap(self.record, self.version)
        except PreconditionFailed:
            pass  # someone else holds it now: leave their lease alone
        except StoreError as exc:
            if self.record is not None:
                self._release_if_ours(self.record, failed=exc)
        finally:
            self.version = None
            self.record = None
            self._lock.release()

    def _release_by_swap(self, record: LeaseRecord, version: str) -> None:
        now = self.clock()
        released = replace(record, status=RELEASED, renewed_at=now, expires_at=now)
        self.store.replace(self.key, released.to_bytes(), version)

    def _release_if_ours(self, record: LeaseRecord, failed: StoreError | None = None) -> None:
        """Release the lease if the store shows it is still ours, when this run cannot know.

        Two cases: a release whose answer was lost (``failed``: it may or may not have
        landed), and a lease given up because the store did not answer the heartbeat (a
        renewal may have landed unseen; released then unless it expires within the skew
        allowance anyway: a write to a store that does not answer would only keep this
        process past its lease). Anyone else's lease is left alone; when even the check
        cannot reach the store, the error names how long the lease may stay ours.
        """
        if isinstance(failed, StoreAccessDenied):
            raise failed
        found: LeaseRecord | None = None
        try:
            found, blob = self._read_within(check_seconds(self.ttl))
            if blob is None or found is None or not self._ours(found):
                return
            if failed or found.expires_at - self.clock() > skew_allowance(self.ttl):
                self._release_by_swap(found, blob.version)
        except PreconditionFailed:
            return  # taken over meanwhile: no longer ours
        except StoreError as why:
            # after a lost heartbeat, a renewal that landed unseen holds it a TTL from now at most
            latest = (
                max(record.expires_at, found.expires_at if found and self._ours(found) else 0)
                if failed
                else max(record.expires_at, self.clock() + self.ttl)
            )
            raise self._unknown_outcome(failed, latest, why) from None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def break_lease(store: BlobStore, state_id: str) -> LeaseRecord | None:
    """Forcibly free a lease (``lock break``); return the record that was there.

    The lease becomes a *broken* record by compare-and-swap rather than being deleted,
    so that it is safe on stores that ignore delete conditions, and so that the next
    holder knows the broken one may still be writing (and fences it out).
    """
    for _ in range(5):
        holder, blob = read_lease(store, state_id)
        if blob is None:
            return None
        now = time.time()
        base = holder or LeaseRecord("unknown", "unknown", 0, "", now, now, now, 0.0)
        broken = replace(base, status=BROKEN, renewed_at=now, expires_at=now)
        try:
            store.replace(lease_key(state_id), broken.to_bytes(), blob.version)
            return holder
        except PreconditionFailed:
            continue  # renewed in between: break the newer record
    raise LeaseBusy(f"could not break the lease on {state_id}: it keeps changing")
