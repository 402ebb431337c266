"""The fleet view: ``state list --long`` and ``state list --stale DURATION``.

For every state ID: when its state was last written (and how long ago), the run that
wrote it, who holds its lease and until when, and how many snapshots its history
keeps. Two listings find all of that but the writer and the lease holder: the states'
listing (whose entries carry each ``state.json``'s modification time and show which
IDs have a lease object) and the history's listing (snapshot names carry their time
and run ID). Then, concurrently and only where needed, one read of each state (for
the writer's run ID it records), of each lease that exists, and of the newest
snapshot when the state does not record its writer. ``--stale`` needs only the
listings to know which pipelines have not moved, and reads the rest for those alone.
A third listing, of the run records (:mod:`mapper_state.core.runs`), names each state
ID's last run; its record is read with the rest (``--failed`` reads it for every state).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from mapper_state import jsonio
from mapper_state.core import history, runs, state
from mapper_state.core.lease import LEASE_FILE, LeaseRecord, lease_key
from mapper_state.errors import ConfigError
from mapper_state.ops import runs as run_records
from mapper_state.ops.fetch import fetch_all
from mapper_state.ops.ids import is_reserved
from mapper_state.ops.reading import (
    LeaseStatus,
    lease_status,
    literal_prefix,
    state_entries,
    state_keys,
)
from mapper_state.stores.base import BlobStore, listing

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``15m``, ``36h``, ``2d``, ``1w``, ``1h30m`` or a bare number of seconds."""
    cleaned = text.strip().lower()
    parts = _DURATION.findall(cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned.replace(" ", ""):
        raise ConfigError(f"{text!r} is not a duration: give e.g. 90s, 15m, 36h, 2d, 1w or 1h30m")
    return sum(float(n) * _UNITS[u or "s"] for n, u in parts)


@dataclass(frozen=True)
class Pipeline:
    """What the fleet view shows of one state ID."""

    state_id: str
    #: When ``state.json`` was last written (epoch seconds), if anything says.
    last_written: float | None
    snapshots: int
    newest_snapshot: str | None = None
    has_lease: bool = False
    writer_run_id: str | None = None
    lease_status: LeaseStatus = LeaseStatus.FREE
    holder: LeaseRecord | None = None
    #: The name of the newest run record, if any (from the listing).
    newest_run: str | None = None
    #: ``False`` for a state ID known only by its run records (no state written yet).
    has_state: bool = True
    #: That record, and the outcome it shows (read with the details).
    last_run: runs.RunRecord | None = None
    last_outcome: str | None = None

    def age(self, now: float) -> float | None:
        return None if self.last_written is None else now - self.last_written


def _history_names(store: BlobStore, prefix: str) -> dict[str, list[tuple[str, str]]]:
    """``{state ID: [(snapshot name, key)]}`` from one listing of the history's new place."""
    found: dict[str, list[tuple[str, str]]] = {}
    root = history.HISTORY_ROOT
    for entry in listing(store, root + prefix):
        state_id, _, file = entry.key[len(root) :].rpartition("/")
        for name in history.names_in([file], ""):
            found.setdefault(state_id, []).append((name, entry.key))
    return found


def survey(store: BlobStore, pattern: str | None = None) -> list[Pipeline]:
    """Every state matching ``pattern``, from the listings alone (no object is read)."""
    prefix = literal_prefix(pattern) if pattern else ""
    entries = list(state_keys(store, pattern))
    states = state_entries(store, pattern, entries)
    legacy: dict[str, list[tuple[str, str]]] = {}
    leases: set[str] = set()
    lease_suffix = "/" + LEASE_FILE
    for entry in entries:  # the same listing shows the leases and the old place's history
        key = entry.key
        if key.endswith(lease_suffix):
            leases.add(key[: -len(lease_suffix)])
            continue
        head, _, file = key.rpartition("/")
        if head.endswith("/" + history.LEGACY_DIR):
            for name in history.names_in([file], ""):
                state_id = head[: -len(history.LEGACY_DIR) - 1]
                legacy.setdefault(state_id, []).append((name, key))
    snapshots = _history_names(store, prefix)
    last_runs = run_records.newest_entries(store, prefix)
    pipelines = []
    for state_id, entry in states.items():
        names = {name for name, _ in [*legacy.get(state_id, []), *snapshots.get(state_id, [])]}
        newest = max(names) if names else None
        written = entry.modified
        if written is None and newest is not None:
            when = history.snapshot_time(newest)
            written = when.timestamp() if when else None
        pipelines.append(
            Pipeline(
                state_id=state_id,
                last_written=written,
                snapshots=len(names),
                newest_snapshot=newest,
                has_lease=state_id in leases,
                newest_run=run_records.name_of(last_runs[state_id])
                if state_id in last_runs
                else None,
            )
        )
    for state_id in sorted(set(last_runs) - set(states)):  # runs that never wrote a state
        if not (is_reserved(state_id) or (pattern and not fnmatchcase(state_id, pattern))):
            pipelines.append(
                Pipeline(
                    state_id,
                    None,
                    0,
                    has_lease=state_id in leases,
                    newest_run=run_records.name_of(last_runs[state_id]),
                    has_state=False,
                )
            )
    return sorted(pipelines, key=lambda p: p.state_id)


def _written_at(raw: Any) -> float | None:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        try:
            return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _details(store: BlobStore, pipeline: Pipeline, now: float) -> Pipeline:
    """Read what the listings cannot tell: the writer's run ID and the lease's holder."""
    writer: str | None = None
    written = pipeline.last_written
    blob = store.read(state.state_key(pipeline.state_id))
    value: Any = None
    if blob is not None:
        try:
            doc = jsonio.loads(blob.data)
            value = state.singer_state(doc)
            ours = doc.get("mapper_state") if isinstance(doc, dict) else None
            if isinstance(ours, dict):
                writer = str(ours["run_id"]) if ours.get("run_id") else None
                if written is None:
                    written = _written_at(ours.get("written_at"))
        except (jsonio.DecodeError, ValueError):
            pass
    if writer is None and pipeline.newest_snapshot is not None:
        newest = history.read_snapshot(store, pipeline.state_id, pipeline.newest_snapshot)
        if newest is not None and newest.value == value:
            writer = newest.run_id  # its snapshot holds the state as it is
    status, holder = LeaseStatus.FREE, None
    if pipeline.has_lease:
        status, holder = lease_status(store.read(lease_key(pipeline.state_id)), now)
    last_run, outcome = _last_run(store, pipeline, holder, now)
    return replace(
        pipeline,
        writer_run_id=writer,
        last_written=written,
        lease_status=status,
        holder=holder,
        last_run=last_run,
        last_outcome=outcome,
    )


def _last_run(
    store: BlobStore, pipeline: Pipeline, holder: LeaseRecord | None, now: float
) -> tuple[runs.RunRecord | None, str | None]:
    """The newest run record and the outcome it shows (one read), if there is one."""
    if pipeline.newest_run is None:
        return None, None
    record = runs.read_record(store, pipeline.state_id, pipeline.newest_run)
    return record, None if record is None else runs.outcome_of(record, holder, now)


def details(store: BlobStore, pipelines: list[Pipeline]) -> list[Pipeline]:
    """Each pipeline with its writer and lease holder, read concurrently, in order."""
    now = time.time()
    return [p for _, p in fetch_all(pipelines, lambda p: _details(store, p, now))]


def stale(pipelines: list[Pipeline], seconds: float, now: float | None = None) -> list[Pipeline]:
    """The pipelines whose state has not moved for ``seconds`` (or whose age is unknown).

    A state ID with run records but no state (``exec`` around a command that keeps none, a
    first run that failed) has no state to move: ``--failed`` reports its runs instead."""
    now = time.time() if now is None else now
    return [p for p in pipelines if p.has_state and ((age := p.age(now)) is None or age >= seconds)]


def failed(pipelines: list[Pipeline]) -> list[Pipeline]:
    """The pipelines (read with :func:`details`) whose last run did not end well."""
    return [p for p in pipelines if p.last_outcome in run_records.FAILING]
