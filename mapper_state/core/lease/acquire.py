"""Taking the lease: create it if absent, else take over an expired or released one.

Acquire is a create-if-absent, so a free lease costs one request; taking over an expired,
released or broken lease is a compare-and-swap on the version just read, so two
contenders can never both win. On a store not known to refuse a second create-if-absent,
the new holder proves the store does (one more create, which must be refused). A write
whose answer was lost is settled by reading the lease back (``settle.py``). A busy lease
is polled every ``retry`` seconds for up to ``wait`` seconds.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

from mapper_state import log, signals
from mapper_state.core.lease.record import BROKEN, RELEASED, LeaseRecord, read_lease
from mapper_state.core.lease.settle import Settling
from mapper_state.errors import ExitCode, LeaseBusy, MapperStateError
from mapper_state.stores.base import Blob, PreconditionFailed, StoreError


class Acquiring(Settling):
    """``acquire`` and ``try_acquire``."""

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

    def try_acquire(self) -> LeaseRecord | None:
        """Take the lease if free or expired; return the current holder's record if busy.

        A free lease costs one request: the create is tried before anything is read.
        """
        record: LeaseRecord | None = None
        for _ in range(3):  # the lease may change hands between our requests
            record = self._fresh_record(self.clock())
            if self._create(record):
                self._prove_exclusive()
                return None
            holder, blob = read_lease(self.store, self.state_id)
            if blob is None:
                continue  # released in between: try to create it again
            if holder is not None and not holder.is_expired(self.clock()):
                return holder
            if self._take_over(holder, blob):
                self._prove_exclusive()
                return None
        holder, _ = read_lease(self.store, self.state_id)
        return holder or record  # still contended: busy for now

    def _create(self, record: LeaseRecord) -> bool:
        """Create the lease as ``record``: whether this run now holds it."""
        try:
            with signals.deferred():  # a lease we created is always one we remember
                self.version = self.store.create(self.key, record.to_bytes())
                self.record = record
        except PreconditionFailed:
            return False
        except StoreError as exc:
            self._settle_unknown(exc, record, "create")
        return True

    def _take_over(self, holder: LeaseRecord | None, blob: Blob) -> bool:
        """Replace the free lease ``holder`` read at ``blob``: whether this run now holds it."""
        record = self._fresh_record(self.clock())
        try:
            with signals.deferred():
                self.version = self.store.replace(self.key, record.to_bytes(), blob.version)
                self.record = record
        except PreconditionFailed:
            return False  # someone else took it over first
        except StoreError as exc:
            self._settle_unknown(exc, record, "takeover")
        # a released lease's holder is gone; an expired or broken one may not be
        self.took_over = None if holder and holder.status == RELEASED else holder
        if holder is None:  # unreadable: assume the worst
            self.took_over = replace(record, run_id="unknown", status=BROKEN)
        return True

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
