"""The fleet as Prometheus sees it: every state ID's last commit, last run and lease.

One look at the store (:meth:`FleetWatch.look`) costs two listings (the states' listing,
which also shows each lease object, and the run records' listing, which names each state
ID's newest record) plus one read of each lease object and of each newest run record
that changed since the previous look. Listings page at 1,000 keys (S3, GCS, Azure), so a
store of N pipelines keeping R run records each costs about ``(2N + N·R) / 1000`` listing
requests, and reads only for what moved: the leases renewed (runs in progress) and the
runs that started or ended. A read is remembered by the key's modification time once that
time is a few seconds old (a store's clock counts whole seconds: two writes within one
second would otherwise look alike); a store that reports no modification times is read
in full each time.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mapper_state.core import runs, state
from mapper_state.core.lease import LEASE_FILE, LeaseRecord
from mapper_state.ops import runs as run_records
from mapper_state.ops.fetch import fetch_all
from mapper_state.ops.ids import is_reserved
from mapper_state.ops.reading import literal_prefix, state_keys
from mapper_state.stores.base import BlobStore, Entry

#: A read is remembered only once its object's modification time is this old (seconds).
SETTLED_SECONDS = 5.0


@dataclass(frozen=True)
class Watched:
    """One state ID as a look at the store found it."""

    state_id: str
    #: When ``state.json`` was last written (epoch seconds); ``None``: no state yet.
    last_commit: float | None
    last_run: runs.RunRecord | None
    outcome: str | None
    #: The lease record if held (expired or not), else ``None``.
    holder: LeaseRecord | None

    def lease_held(self, now: float) -> bool:
        return self.holder is not None and not self.holder.is_expired(now)


class FleetWatch:
    """Looks at the store's state IDs, remembering what it read between looks."""

    def __init__(
        self,
        store: BlobStore,
        pattern: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.pattern = pattern
        self.clock = clock
        #: ``{key: (modified, what was read)}``
        self._read: dict[str, tuple[float, object]] = {}
        #: What this look read, settled or not.
        self._latest: dict[str, object] = {}
        self._lock = threading.Lock()

    def _wanted(self, state_id: str) -> bool:
        if is_reserved(state_id):
            return False
        return not self.pattern or fnmatch.fnmatchcase(state_id, self.pattern)

    def look(self) -> list[Watched]:
        """Every state ID with a state or a run record, sorted."""
        with self._lock:
            return self._look()

    def _look(self) -> list[Watched]:
        prefix = literal_prefix(self.pattern) if self.pattern else ""
        commits: dict[str, float | None] = {}
        leases: dict[str, Entry] = {}
        state_suffix, lease_suffix = "/" + state.STATE_FILE, "/" + LEASE_FILE
        for entry in state_keys(self.store, self.pattern):
            if entry.key.endswith(state_suffix):
                commits[entry.key[: -len(state_suffix)]] = entry.modified
            elif entry.key.endswith(lease_suffix):
                leases[entry.key[: -len(lease_suffix)]] = entry
        newest = run_records.newest_entries(self.store, prefix)
        ids = sorted(i for i in {*commits, *newest} if self._wanted(i))
        now = self.clock()
        wanted = [e for i in ids for e in (leases.get(i), newest.get(i)) if e is not None]
        fresh = [e for e in wanted if not self._remembered(e, now)]
        for entry, value in fetch_all(fresh, self._fetch):
            if entry.modified is not None and entry.modified < now - SETTLED_SECONDS:
                self._read[entry.key] = (entry.modified, value)
            else:
                self._read.pop(entry.key, None)
            self._latest[entry.key] = value
        keep = {e.key for e in wanted}
        for key in [k for k in self._read if k not in keep]:
            del self._read[key]
        found = []
        for state_id in ids:
            holder = self._value(leases.get(state_id))
            record = self._value(newest.get(state_id))
            assert holder is None or isinstance(holder, LeaseRecord)
            assert record is None or isinstance(record, runs.RunRecord)
            if holder is not None and not holder.held:
                holder = None  # released or broken: a free lease, left as a record
            outcome = None if record is None else runs.outcome_of(record, holder, now)
            found.append(Watched(state_id, commits.get(state_id), record, outcome, holder))
        self._latest.clear()
        return found

    def _remembered(self, entry: Entry, now: float) -> bool:
        known = self._read.get(entry.key)
        return known is not None and entry.modified is not None and known[0] == entry.modified

    def _value(self, entry: Entry | None) -> object:
        if entry is None:
            return None
        if entry.key in self._latest:
            return self._latest[entry.key]
        known = self._read.get(entry.key)
        return None if known is None else known[1]

    def _fetch(self, entry: Entry) -> object:
        blob = self.store.read(entry.key)
        if blob is None:
            return None
        if entry.key.endswith("/" + LEASE_FILE):
            return LeaseRecord.from_bytes(blob.data)
        found = runs.split_key(entry.key)
        return None if found is None else runs.RunRecord.from_bytes(blob.data, found[1])
