"""Finding and reading states and their leases, for the operator commands."""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

from mapper_state.core import state
from mapper_state.core.lease import BROKEN, LeaseRecord, lease_key
from mapper_state.errors import StateNotFound
from mapper_state.ops.ids import is_reserved
from mapper_state.stores.base import Blob, BlobStore, Entry, listing


def literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: where a listing for it starts."""
    match = re.search(r"[*?\[]", pattern)
    return pattern[: match.start()] if match else pattern


#: What mapper-state keeps for itself (the history, the run records): not states.
RESERVED_ROOT = ".mapper-state/"


def state_keys(store: BlobStore, pattern: str | None = None) -> Iterator[Entry]:
    """The listing that finds states: everything under the pattern's literal prefix but what
    mapper-state keeps for itself (:data:`RESERVED_ROOT`: the history, the run records), which
    the store skips without paging through it."""
    prefix = literal_prefix(pattern) if pattern else ""
    return listing(store, prefix, exclude=RESERVED_ROOT)


def list_state_ids(store: BlobStore, pattern: str | None = None) -> list[str]:
    """State IDs in the store (keys ending in ``/state.json``), sorted, matching ``pattern``."""
    return sorted(state_entries(store, pattern))


def state_entries(
    store: BlobStore, pattern: str | None = None, entries: Iterable[Entry] | None = None
) -> dict[str, Entry]:
    """``{state ID: its state.json's listing entry}`` for the states matching ``pattern``.

    ``entries`` is :func:`state_keys`'s listing when the caller has it already.
    """
    suffix = "/" + state.STATE_FILE
    found = {}
    for entry in state_keys(store, pattern) if entries is None else entries:
        key = entry.key
        if not key.endswith(suffix):
            continue
        state_id = key[: -len(suffix)]
        if is_reserved(state_id) or (pattern and not fnmatch.fnmatchcase(state_id, pattern)):
            continue
        found[state_id] = entry
    return found


def not_found(store: BlobStore, state_id: str) -> StateNotFound:
    return StateNotFound(
        f"state ID {state_id} not found in {store.display_uri} (`mapper-state state list` shows them)"
    )


def get_state(store: BlobStore, state_id: str) -> Any:
    """The Singer state of ``state_id`` (``{}`` for a document without one)."""
    snapshot = state.load(store, state_id)
    if not snapshot.exists:
        raise not_found(store, state_id)
    return {} if snapshot.value is None else snapshot.value


class LeaseStatus(StrEnum):
    """What an operator is told of a state ID's lease."""

    #: No lease, or one released or broken (left as a record).
    FREE = "free"
    #: Held, and not expired.
    HELD = "held"
    #: Broken by ``lock break``, its holder not yet known to have stopped (free from
    #: :meth:`LeaseRecord.free_from`).
    BROKEN = "broken"
    #: Held, but not renewed in time: the next run takes it over.
    EXPIRED = "expired"
    #: The lease object is not a lease record: it counts as expired.
    UNREADABLE = "unreadable"


def lease_status(blob: Blob | None, now: float) -> tuple[LeaseStatus, LeaseRecord | None]:
    """The status of the lease object ``blob`` (``None``: there is none) at ``now``, and its
    holder's record while it is held (expired or not)."""
    if blob is None:
        return LeaseStatus.FREE, None
    record = LeaseRecord.from_bytes(blob.data)
    if record is None:
        return LeaseStatus.UNREADABLE, None
    if record.status == BROKEN and not record.is_expired(now):
        return LeaseStatus.BROKEN, record
    if not record.held:  # released, or broken and free: a free lease, left as a record
        return LeaseStatus.FREE, None
    return (LeaseStatus.EXPIRED if record.is_expired(now) else LeaseStatus.HELD), record


def lock_status(store: BlobStore, state_id: str) -> tuple[LeaseStatus, LeaseRecord | None]:
    """The state ID's lease: its :class:`LeaseStatus`, and the holder's record."""
    return lease_status(store.read(lease_key(state_id)), time.time())
