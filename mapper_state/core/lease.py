"""The lease: one holder per state ID for a whole run, on any store.

The lease is an object beside ``state.json`` holding a :class:`LeaseRecord`.
Acquire is a create-if-absent; taking over an expired lease, renewing it and
releasing it are compare-and-swaps on the version last seen, so two contenders
can never both win. A heartbeat thread renews every third of the TTL; a holder
that fails to renew (someone broke or took over its lease) knows it has lost it,
and every state write first confirms the lease (fencing).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from mapper_state import signals
from mapper_state.errors import LeaseBusy, LeaseLost
from mapper_state.redact import redact_known
from mapper_state.stores.base import Blob, BlobStore, PreconditionFailed, StoreError

LEASE_FILE = "mapper-state.lease.json"


class LeaseTiming(Protocol):
    """What a lease takes from the settings: its TTL, poll interval and wait time."""

    @property
    def lock_timeout(self) -> float: ...

    @property
    def lock_retry(self) -> float: ...

    @property
    def lock_wait(self) -> float: ...


def lease_key(state_id: str) -> str:
    return f"{state_id}/{LEASE_FILE}"


def skew_allowance(ttl: float) -> float:
    """Extra time before another host calls a lease expired, for clock skew between hosts."""
    return min(2.0, ttl / 5)


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds a lease and until when; written as JSON into the lease object."""

    run_id: str
    host: str
    pid: int
    command: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    ttl_seconds: float

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
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def is_expired(self, now: float) -> bool:
        return now > self.expires_at + skew_allowance(self.ttl_seconds)

    def describe(self) -> str:
        return (
            f"held by run {self.run_id} on host {self.host} (pid {self.pid}) "
            f"since {format_time(self.acquired_at)}, expires {format_time(self.expires_at)}"
        )


def read_lease(store: BlobStore, state_id: str) -> tuple[LeaseRecord | None, Blob | None]:
    blob = store.read(lease_key(state_id))
    return (LeaseRecord.from_bytes(blob.data) if blob else None), blob


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def current_command() -> str:
    """This process's command line as the lease and history records keep it: secrets hidden
    (before it is cut to length, so that no part of one survives)."""
    argv = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
    return redact_known(argv)[:200]


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
        self.command = current_command() if command is None else command
        self.record: LeaseRecord | None = None
        self.version: str | None = None
        self.lost: LeaseLost | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @classmethod
    def for_settings(
        cls, store: BlobStore, state_id: str, settings: LeaseTiming, **kwargs: Any
    ) -> Lease:
        """A lease with the TTL, poll interval and wait time the settings give."""
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
                return None
            except PreconditionFailed:
                pass
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
                return None
            except PreconditionFailed:
                continue  # someone else took it over first
        holder, _ = read_lease(self.store, self.state_id)
        return holder or record  # still contended: busy for now

    def acquire(self) -> None:
        """Take the lease, waiting up to ``wait`` seconds for a busy one; else :class:`LeaseBusy`."""
        deadline = time.monotonic() + self.wait
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() + self.retry > deadline:
                waited = f" after waiting {self.wait:g}s" if self.wait else ""
                raise LeaseBusy(f"state ID {self.state_id} is busy{waited}: {holder.describe()}")
            time.sleep(self.retry)

    # -- hold ----------------------------------------------------------------------
    def renew(self) -> None:
        """Extend the lease by a compare-and-swap; :class:`LeaseLost` if it is no longer ours."""
        with self._lock:
            if self.lost:
                raise self.lost
            if self.record is None or self.version is None:
                raise LeaseLost(f"the lease on {self.state_id} is not held")
            now = self.clock()
            record = replace(self.record, renewed_at=now, expires_at=now + self.ttl)
            try:
                self.version = self.store.replace(self.key, record.to_bytes(), self.version)
            except PreconditionFailed:
                holder, _ = read_lease(self.store, self.state_id)
                who = holder.describe() if holder else "broken or released by someone else"
                self.lost = LeaseLost(f"lost the lease on {self.state_id}: now {who}")
                raise self.lost from None
            self.record = record

    confirm = renew  # fencing: a state write is preceded by a successful renewal

    def start_heartbeat(self, on_lost: Callable[[LeaseLost], None] | None = None) -> None:
        def beat() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    self.renew()
                except LeaseLost as exc:
                    if on_lost:
                        on_lost(exc)
                    return
                except StoreError:
                    record = self.record
                    if record and self.clock() > record.expires_at:
                        self.lost = LeaseLost(
                            f"could not renew the lease on {self.state_id} before it expired"
                        )
                        if on_lost:
                            on_lost(self.lost)
                        return

        self._heartbeat = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._heartbeat and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()

    # -- release -------------------------------------------------------------------
    def release(self) -> None:
        """Give the lease up; a lease that is no longer ours is left alone."""
        self.stop_heartbeat()
        with self._lock:
            if self.version is None:
                return
            try:
                self.store.delete(self.key, if_version=self.version)
            except PreconditionFailed:
                pass
            finally:
                self.version = None
                self.record = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def break_lease(store: BlobStore, state_id: str) -> LeaseRecord | None:
    """Forcibly free a lease (``lock break``); return the record that was there."""
    holder, blob = read_lease(store, state_id)
    if blob is not None:
        try:
            store.delete(lease_key(state_id), if_version=blob.version)
        except PreconditionFailed:
            store.delete(lease_key(state_id))
    return holder
