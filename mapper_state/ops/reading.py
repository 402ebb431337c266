"""Finding and reading states and their leases, for the operator commands."""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from mapper_state.core import history, state
from mapper_state.core.lease import BROKEN, LeaseRecord, read_lease
from mapper_state.errors import StateNotFound
from mapper_state.ops.ids import is_reserved
from mapper_state.stores.base import BlobStore, Entry, listing


def literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: where a listing for it starts."""
    match = re.search(r"[*?\[]", pattern)
    return pattern[: match.start()] if match else pattern


def state_keys(store: BlobStore, pattern: str | None = None) -> Iterator[Entry]:
    """The listing that finds states: everything under the pattern's literal prefix but the
    history (:data:`history.HISTORY_ROOT`), which the store skips without paging through it."""
    prefix = literal_prefix(pattern) if pattern else ""
    return listing(store, prefix, exclude=history.HISTORY_ROOT)


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


def lock_status(store: BlobStore, state_id: str) -> tuple[str, LeaseRecord | None]:
    """``("free" | "held" | "broken" | "expired" | "unreadable", record)`` for the state
    ID's lease; ``broken``: broken by ``lock break``, its holder not yet known to have
    stopped (free from :meth:`LeaseRecord.free_from`)."""
    record, blob = read_lease(store, state_id)
    if blob is None:
        return "free", None
    if record is None:
        return "unreadable", None
    if record.status == BROKEN and not record.is_expired(time.time()):
        return "broken", record
    if not record.held:  # released, or broken and free: a free lease, left as a record
        return "free", None
    return ("expired" if record.is_expired(time.time()) else "held"), record
