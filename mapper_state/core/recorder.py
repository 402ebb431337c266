"""A leased run's own record in the store: started when it takes the lease, ended with its exit.

:class:`RunRecorder` is what every holder of a whole run's lease uses (the filter, ``run``
and ``exec`` through :mod:`mapper_state.modes.runlog`; a Meltano run under the add-on's
whole-run lease): take the lease through :meth:`RunRecorder.acquire` (or report it taken
with :meth:`RunRecorder.acquired`), then :meth:`RunRecorder.end` with the exit status,
which says the outcome (:func:`outcome_for`). The record and its keeping are
:mod:`mapper_state.core.runs`. A lease held by an enclosing run (``mapper-state exec``)
records nothing here: the enclosing run writes the one record of the whole run.
"""

from __future__ import annotations

import dataclasses
import signal
import time

from mapper_state import runtime
from mapper_state.core import runs
from mapper_state.core.inherited import AnyLease, InheritedLease
from mapper_state.errors import ExitCode, LeaseBusy, MapperStateError
from mapper_state.stores.base import BlobStore

#: Exit statuses that say the run was stopped by one of the signals it acts on.
_STOPPING = {128 + s: s.name for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


@dataclasses.dataclass
class Counts:
    """What the run passed: records (``None`` when not counted), bytes (``None`` for a run
    whose data does not pass through mapper-state: ``exec``, Meltano) and the STATE
    messages it saw."""

    records: int | None = None
    bytes: int | None = None
    states: int = 0


def exit_code_of(exc: BaseException) -> int:
    """The exit status an error ending the run gives."""
    if isinstance(exc, MapperStateError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.INTERRUPTED)
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    return int(ExitCode.INTERNAL)


def outcome_for(code: int) -> tuple[str, str | None]:
    """``(outcome, signal name)`` of a run that ended with exit status ``code``."""
    if code == ExitCode.OK:
        return runs.SUCCEEDED, None
    if code == ExitCode.LEASE_LOST:
        return runs.LEASE_LOST, None
    if code in _STOPPING:
        return runs.SIGNALLED, _STOPPING[code]
    return runs.FAILED, None


class RunRecorder:
    """One run's record, from taking the lease to the exit status."""

    def __init__(self, store: BlobStore | None, *, keep: int, mode: str, waits: bool) -> None:
        """``waits``: the run waits for a busy lease, so a refusal is recorded (``busy``)."""
        self.keep = keep
        self.mode = mode
        self.waits = waits
        self.started = time.time()
        self._store = store
        self.recording: runs.Recording | None = None

    def _record(self, lease: AnyLease, waited: float) -> runs.Recording | None:
        if isinstance(lease, InheritedLease) or self._store is None:
            return None  # the enclosing run records it
        held = lease.record
        record = runs.RunRecord(
            state_id=lease.state_id,
            run_id=lease.run_id,
            host=held.host if held else runtime.host(),
            pid=held.pid if held else runtime.pid(),
            command=lease.command,
            mode=self.mode,
            started_at=held.acquired_at if held else self.started,
            lease_wait_seconds=waited,
            lease_ttl_seconds=lease.ttl,
        )
        return runs.Recording(self._store, record, self.keep)

    def acquired(self, lease: AnyLease, waited: float) -> None:
        """The run holds the lease: write its ``running`` record."""
        self.recording = self._record(lease, waited)
        if self.recording is not None:
            self.recording.start()

    def refused(self, lease: AnyLease, waited: float) -> None:
        """Refused as busy: a run that waited for the lease leaves a ``busy`` record."""
        if not self.waits:
            return
        recording = self._record(lease, waited)
        if recording is not None:
            recording.write_once(
                dataclasses.replace(
                    recording.record,
                    status=runs.BUSY,
                    ended_at=time.time(),
                    exit_code=int(ExitCode.LEASE_BUSY),
                )
            )

    def acquire(self, lease: AnyLease) -> None:
        """Take ``lease``, recording the run or its refusal."""
        started = time.monotonic()
        try:
            lease.acquire()
        except LeaseBusy:
            self.refused(lease, time.monotonic() - started)
            raise
        self.acquired(lease, time.monotonic() - started)

    def end(self, code: int, counts: Counts | None = None, committed: int = 0) -> None:
        """End the record with exit status ``code`` (once; a warning if the store fails)."""
        recording = self.recording
        if recording is None or recording.record.status != runs.RUNNING:
            return
        outcome, signal_name = outcome_for(code)
        counts = counts or Counts()
        recording.end(
            status=outcome,
            ended_at=time.time(),
            exit_code=code,
            signal=signal_name,
            records=counts.records,
            bytes_passed=counts.bytes,
            states_seen=counts.states,
            states_committed=committed,
        )
