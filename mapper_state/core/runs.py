"""A record of every leased run, kept in the store beside the history.

Where mapper-state runs (a CronJob's pod, an ECS task, a CI runner) nothing outlives the
run but the store, so each run that holds a lease leaves one small JSON object there:
``.mapper-state/runs/<state_id>/<UTC yyyymmddThhmmss.ffffffZ>-<run_id>.json``. Like the
history (:mod:`mapper_state.core.history`) it lives under the reserved prefix, out of
reach of ``meltano state clear`` and skipped by the listing of states; names sort by the
run's start, so the newest is the last name of one plain key listing.

A run creates its record when it has taken the lease (``status: running``; the listing and
the pruning to ``keep`` records happen then, before the run's work) and replaces it once
when it ends, with how it ended: one write at the end, none while the run passes data.
A run refused as busy after waiting for the lease writes one record, ``busy``. A run killed
before it could end its record leaves ``running``: when read back, such a record whose
lease is no longer held by that run is shown as ``killed`` (:func:`outcome_of`).

The record holds no secret: its command is the lease record's, secrets redacted.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from mapper_state import jsonio, log
from mapper_state.core.lease import LeaseRecord
from mapper_state.stores.base import BlobStore, PreconditionFailed, StoreError

RUNS_ROOT = ".mapper-state/runs/"
"""Where every state ID's run records live; listing states excludes it."""
_TIME_FORMAT = "%Y%m%dT%H%M%S.%fZ"
_NAME = re.compile(r"^(?P<time>\d{8}T\d{6}\.\d{6}Z)-(?P<run_id>[A-Za-z0-9_.-]{1,64})$")

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
SIGNALLED = "signalled"
LEASE_LOST = "lease-lost"
BUSY = "busy"
KILLED = "killed"
#: Every outcome a record can show, ``running`` for a run still holding its lease.
OUTCOMES = (SUCCEEDED, FAILED, SIGNALLED, LEASE_LOST, BUSY, KILLED, RUNNING)


def runs_prefix(state_id: str) -> str:
    return f"{RUNS_ROOT}{state_id}/"


def record_key(state_id: str, name: str) -> str:
    return f"{runs_prefix(state_id)}{name}.json"


def iso(epoch: float | None) -> str | None:
    """``2026-01-02T03:04:05.678Z`` (UTC), or ``None``."""
    if epoch is None:
        return None
    when = datetime.fromtimestamp(epoch, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class RunRecord:
    """One run as its record keeps it (times are epoch seconds, UTC)."""

    state_id: str
    run_id: str
    host: str
    pid: int
    command: str
    mode: str
    started_at: float
    status: str = RUNNING
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    #: RECORD messages passed, when counted (``--metrics-file``, or ``run`` on a terminal):
    #: counting them scans every chunk, which the filter otherwise never does.
    records: int | None = None
    #: Bytes passed through mapper-state (``None`` for ``exec``: its command's own I/O).
    bytes_passed: int | None = None
    states_seen: int = 0
    states_committed: int = 0
    lease_wait_seconds: float = 0.0
    lease_ttl_seconds: float = 0.0
    #: The key's file name without ``.json`` (set when read back).
    name: str = ""

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        del doc["name"]
        doc["bytes"] = doc.pop("bytes_passed")
        doc["started_at"] = iso(self.started_at)
        doc["ended_at"] = iso(self.ended_at)
        doc["lease_wait_seconds"] = round(self.lease_wait_seconds, 3)
        return jsonio.dumps(doc)

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> RunRecord | None:
        """The record, or ``None`` when the object is unreadable."""
        try:
            raw = jsonio.loads(data)
            started = _epoch(raw["started_at"])
            if started is None:
                return None
            return cls(
                state_id=str(raw["state_id"]),
                run_id=str(raw["run_id"]),
                host=str(raw.get("host") or ""),
                pid=int(raw.get("pid") or 0),
                command=str(raw.get("command") or ""),
                mode=str(raw.get("mode") or ""),
                started_at=started,
                status=str(raw.get("status") or RUNNING),
                ended_at=_epoch(raw.get("ended_at")),
                exit_code=None if raw.get("exit_code") is None else int(raw["exit_code"]),
                signal=None if raw.get("signal") is None else str(raw["signal"]),
                records=None if raw.get("records") is None else int(raw["records"]),
                bytes_passed=None if raw.get("bytes") is None else int(raw["bytes"]),
                states_seen=int(raw.get("states_seen") or 0),
                states_committed=int(raw.get("states_committed") or 0),
                lease_wait_seconds=float(raw.get("lease_wait_seconds") or 0.0),
                lease_ttl_seconds=float(raw.get("lease_ttl_seconds") or 0.0),
                name=name,
            )
        except (jsonio.DecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None

    @property
    def duration(self) -> float | None:
        return None if self.ended_at is None else max(0.0, self.ended_at - self.started_at)


def outcome_of(record: RunRecord, lease: LeaseRecord | None, now: float) -> str:
    """How the run ended: its recorded status, or for a record never ended, ``running``
    while its run still holds the lease and ``killed`` once it does not (expired, released
    without an end, taken over or broken)."""
    if record.status != RUNNING:
        return record.status
    ours = lease is not None and lease.held and lease.run_id == record.run_id
    if ours and lease is not None and not lease.is_expired(now):
        return RUNNING
    return KILLED


def names_in(keys: Iterable[str], prefix: str) -> list[str]:
    """The record names among ``keys`` directly under ``prefix`` (not a nested state ID's)."""
    names = []
    for key in keys:
        rest = key[len(prefix) :]
        if key.startswith(prefix) and rest.endswith(".json") and _NAME.match(rest[:-5]):
            names.append(rest[:-5])
    return names


def split_key(key: str) -> tuple[str, str] | None:
    """``(state_id, name)`` of a record's key under :data:`RUNS_ROOT`, or ``None``."""
    if not key.startswith(RUNS_ROOT) or not key.endswith(".json"):
        return None
    state_id, _, file = key[len(RUNS_ROOT) :].rpartition("/")
    name = file[:-5]
    return (state_id, name) if state_id and _NAME.match(name) else None


def _safe_run_id(run_id: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:64].strip(".")
    return cleaned or "run"


def _name(started: float, run_id: str) -> str:
    return f"{datetime.fromtimestamp(started, UTC).strftime(_TIME_FORMAT)}-{_safe_run_id(run_id)}"


def read_record(store: BlobStore, state_id: str, name: str) -> RunRecord | None:
    blob = store.read(record_key(state_id, name))
    return None if blob is None else RunRecord.from_bytes(blob.data, name)


def list_records(store: BlobStore, state_id: str) -> list[RunRecord]:
    """Every readable record of the state ID, newest first: one listing, one read each."""
    prefix = runs_prefix(state_id)
    names = sorted(names_in(store.list(prefix), prefix), reverse=True)
    found = (read_record(store, state_id, name) for name in names)
    return [r for r in found if r is not None]


class Recording:
    """One run's record: created when the run holds the lease, replaced once at its end.

    A failure to write is a warning, never the run's end.
    """

    def __init__(self, store: BlobStore, record: RunRecord, keep: int) -> None:
        self.store = store
        self.record = replace(record, name=_name(record.started_at, record.run_id))
        self.keep = keep
        self.key = record_key(record.state_id, self.record.name)
        self.version: str | None = None

    def start(self) -> None:
        """Create the ``running`` record and prune the oldest beyond ``keep`` (one listing,
        one create, a delete per record too many)."""
        if self.keep <= 0:
            return
        prefix = runs_prefix(self.record.state_id)
        try:
            names = sorted(names_in(self.store.list(prefix), prefix))
            self._create(self.record)
            names = sorted({*names, self.record.name})
            for name in names[: max(0, len(names) - self.keep)]:
                self.store.delete(record_key(self.record.state_id, name))
        except StoreError as exc:
            self._warn(exc)

    def _create(self, record: RunRecord) -> None:
        for _ in range(5):
            try:
                self.version = self.store.create(self.key, record.to_bytes())
                return
            except PreconditionFailed:  # same microsecond, same run ID: the next one
                started = record.started_at + 1e-6
                record = replace(record, started_at=started, name=_name(started, record.run_id))
                self.record, self.key = record, record_key(record.state_id, record.name)
        raise StoreError(f"could not create the run record {self.key}")

    def write_once(self, record: RunRecord) -> None:
        """A record written in one request, at the end (a run refused as busy)."""
        if self.keep <= 0:
            return
        self.record = replace(record, name=self.record.name)
        try:
            self._create(self.record)
        except StoreError as exc:
            self._warn(exc)

    def end(self, **ended: Any) -> None:
        """Replace the record by the ended one (one request; a create if the start failed)."""
        if self.keep <= 0:
            return
        self.record = replace(self.record, **ended)
        try:
            if self.version is None:
                self._create(self.record)
                return
            try:
                self.version = self.store.replace(self.key, self.record.to_bytes(), self.version)
            except PreconditionFailed:  # pruned meanwhile by a later run: keep it anyway
                with contextlib.suppress(PreconditionFailed):
                    self.store.create(self.key, self.record.to_bytes())
        except StoreError as exc:
            self._warn(exc)

    def _warn(self, exc: StoreError) -> None:
        log.warning(f"could not write the run record of {self.record.state_id}: {exc.message}")
