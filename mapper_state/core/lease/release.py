"""Giving the lease up, and breaking someone else's (``lock break``).

Two rules keep a holder that lost its lease from hurting the next one:

- it never deletes or rewrites the lease object again (unless the store shows the lease
  is still its own: ``settle.py``);
- release is a conditional delete only on a store known to enforce delete conditions
  (:func:`releases_by_delete`); elsewhere (MinIO, Ceph RGW and fake-gcs-server accept
  ``If-Match`` on a delete and ignore it) it is a compare-and-swap to a *released*
  record, which the next run takes over.
"""

from __future__ import annotations

import time
from dataclasses import replace

from mapper_state.core.lease.record import (
    BROKEN,
    LeaseRecord,
    lease_key,
    read_lease,
    releases_by_delete,
)
from mapper_state.core.lease.settle import Settling
from mapper_state.errors import LeaseBusy
from mapper_state.stores.base import BlobStore, PreconditionFailed, StoreError


class Releasing(Settling):
    """``release``."""

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
        at = time.time() if now is None else now
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
