"""What a leased run leaves in the store about itself: the filter's, ``run``'s, ``exec``'s.

A mode builds a :class:`RunLog`, enters its lease through it (:meth:`RunLog.enter` for a
:class:`~mapper_state.core.session.Session`, :meth:`RunLog.acquire` for a bare lease) and
runs its body through :meth:`RunLog.recorded`, which turns the exit code (or the error
that ends the run) into the record's outcome. The record itself, and its keeping, is
:mod:`mapper_state.core.runs`. The store a session uses is opened here and closed only
after the end of the record is written, so the run's last request reuses its connection.

A run inside ``mapper-state exec`` (an inherited lease) leaves no record of its own: the
enclosing ``exec`` writes the one of the whole run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import time
from collections.abc import Callable

from mapper_state.core import runs
from mapper_state.core.inherited import InheritedLease
from mapper_state.core.lease import Lease
from mapper_state.core.session import Session
from mapper_state.errors import ExitCode, LeaseBusy, MapperStateError
from mapper_state.settings import Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import BlobStore

#: Exit statuses that say the run was stopped by one of the signals it acts on.
_STOPPING = {128 + s: s.name for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


@dataclasses.dataclass
class Counts:
    """What the run passed: records (``None`` when not counted), bytes (``None`` for
    ``exec``, which passes none itself) and the STATE messages it saw."""

    records: int | None = None
    bytes: int | None = None
    states: int = 0


def exit_code_of(exc: BaseException) -> int:
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


class RunLog:
    """One mode's run record, from taking the lease to the exit code."""

    def __init__(self, settings: Settings, mode: str, store: BlobStore | None = None) -> None:
        self.settings = settings
        self.mode = mode
        self.keep = settings.runs_keep
        self.started = time.time()
        self._store = store
        self._owns_store = store is None
        self.recording: runs.Recording | None = None
        self.session: Session | None = None
        #: The run's counts, wired in by the mode.
        self.counts: Callable[[], Counts] = Counts
        #: The run's exit status, once known (an error ending the run gives its own).
        self.code = int(ExitCode.INTERNAL)

    def store_for_session(self) -> BlobStore | None:
        """The store for the run's session (opened here), or ``None`` without a state ID
        (the session then says what is missing)."""
        if self._store is None and (self.settings.state_id or "").strip():
            self._store = open_configured_store(self.settings)
        return self._store

    def _record(self, lease: Lease, waited: float) -> runs.Recording | None:
        if isinstance(lease, InheritedLease) or self._store is None:
            return None  # the enclosing exec records the run
        held = lease.record
        record = runs.RunRecord(
            state_id=lease.state_id,
            run_id=lease.run_id,
            host=held.host if held else socket.gethostname(),
            pid=held.pid if held else os.getpid(),
            command=lease.command,
            mode=self.mode,
            started_at=held.acquired_at if held else time.time(),
            lease_wait_seconds=waited,
            lease_ttl_seconds=lease.ttl,
        )
        return runs.Recording(self._store, record, self.keep)

    def acquired(self, lease: Lease, waited: float) -> None:
        """The run holds the lease: write its ``running`` record."""
        self.recording = self._record(lease, waited)
        if self.recording is not None:
            self.recording.start()

    def refused(self, lease: Lease, waited: float) -> None:
        """Refused as busy: a run that waited for the lease leaves a ``busy`` record."""
        if self.settings.lock_wait <= 0:
            return
        recording = self._record(lease, waited)
        if recording is not None:
            recording.write_once(
                dataclasses.replace(
                    recording.record,
                    started_at=self.started,
                    status=runs.BUSY,
                    ended_at=time.time(),
                    exit_code=int(ExitCode.LEASE_BUSY),
                )
            )

    def acquire(self, lease: Lease) -> None:
        """Take ``lease`` (a bare one: ``exec``), recording the run or its refusal."""
        started = time.monotonic()
        try:
            lease.acquire()
        except LeaseBusy:
            self.refused(lease, time.monotonic() - started)
            raise
        self.acquired(lease, time.monotonic() - started)

    def enter(self, session: Session, stack: contextlib.ExitStack) -> Session:
        """Enter ``session`` on ``stack`` (it takes the lease), recording the run."""
        self.session = session
        try:
            stack.enter_context(session)
        except LeaseBusy:
            self.refused(session.lease, session.lease_wait_seconds)
            raise
        self.acquired(session.lease, session.lease_wait_seconds)
        return session

    def recorded(self, body: Callable[[], int]) -> int:
        """Run ``body``; end the record with its exit code (or its error's), close the store."""
        with self:
            self.code = body()
        return self.code

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        """End the record with :attr:`code`, or with the code of the error ending the run."""
        self.ended(exit_code_of(exc) if exc is not None else self.code)

    def ended(self, code: int) -> None:
        recording = self.recording
        if recording is None or recording.record.status != runs.RUNNING:
            self.close()
            return
        outcome, signal_name = outcome_for(code)
        counts = self.counts()
        session = self.session
        try:
            recording.end(
                status=outcome,
                ended_at=time.time(),
                exit_code=code,
                signal=signal_name,
                records=counts.records,
                bytes_passed=counts.bytes,
                states_seen=counts.states,
                states_committed=session.writes if session else 0,
            )
        finally:
            self.close()

    def close(self) -> None:
        if self._owns_store and self._store is not None:
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                store.close()
