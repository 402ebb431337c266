"""What a lease holder knows about its own claim, shared by every part of the lease.

:class:`Claim` holds the state the other modules of this package read and write: the
record this run last wrote and the version the store gave it, whether the lease is known
to be lost, and the lock and heartbeat thread that keep renewals one at a time. Taking
the lease (``acquire.py``), holding it (``hold.py``), settling an answer that was lost
(``settle.py``) and giving it up (``release.py``) each add their methods on top.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from mapper_state.core.lease.record import (
    RELEASED,
    LeaseRecord,
    current_command,
    lease_key,
    new_run_id,
)
from mapper_state.errors import LeaseLost
from mapper_state.stores.base import BlobStore


class Claim:
    """This process's claim on one state ID: the store, the record it wrote, its version."""

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
        owner: str = "",
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
        self.owner = owner
        self.record: LeaseRecord | None = None
        self.version: str | None = None
        self.lost: LeaseLost | None = None
        #: The holder whose expired or broken lease we took over: it may still be writing.
        self.took_over: LeaseRecord | None = None
        #: Held while a renewal or a release talks to the store: one at a time.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: Set to wake the heartbeat before its pause ends (its chore has work, or stop).
        self._wake = threading.Event()
        self._heartbeat: threading.Thread | None = None
        #: When the heartbeat renews next (our clock); each renewal, a confirmation too, moves it.
        self._renew_at = 0.0

    def _fresh_record(self, now: float) -> LeaseRecord:
        """A new record of this run, acquired now and expiring a TTL from now."""
        return LeaseRecord(
            run_id=self.run_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            command=self.command,
            acquired_at=now,
            renewed_at=now,
            expires_at=now + self.ttl,
            ttl_seconds=self.ttl,
            owner=self.owner,
        )

    def _ours(self, record: LeaseRecord | None) -> bool:
        """Is ``record`` a held lease of this run? Only this process writes such records."""
        return record is not None and record.held and record.run_id == self.run_id

    def _release_by_swap(self, record: LeaseRecord, version: str) -> None:
        """Replace our lease at ``version`` by a released record, which the next run takes over."""
        now = self.clock()
        released = replace(record, status=RELEASED, renewed_at=now, expires_at=now)
        self.store.replace(self.key, released.to_bytes(), version)

    def release(self) -> None:
        """Give the lease up (``release.py``); declared here for the parts that call it."""
        raise NotImplementedError

    def stop_heartbeat(self) -> None:
        """Stop renewing, and wait for the heartbeat thread (its renewal, or its chore, ends by
        its deadline)."""
        self._stop.set()
        self._wake.set()
        if self._heartbeat and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()
